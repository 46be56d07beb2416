"""hmt.runtime: verified loads, ORT providers with a recorded fallback, options round trips, runners."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from serve_bundles import make_bundle

from hmt.bundle import load_bundle
from hmt.errors import ArtifactError, UsageError
from hmt.runtime.chain import ChainRunner
from hmt.runtime.ort import CPU_PROVIDER, OrtOptions, ort_session, resolve_providers
from hmt.runtime.variant import load_variant
from hmt.runtime.verified import read_verified, verified_path


def _flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-5] ^= 0x01
    path.write_bytes(bytes(data))


def test_a_graph_changed_after_the_bundle_was_opened_is_refused(tmp_path: Path) -> None:
    bundle = load_bundle(make_bundle(tmp_path / "b"))
    runner = load_variant(bundle, "big")  # loads while the files match
    assert isinstance(runner, ChainRunner)
    _flip_a_byte(bundle.root / "variants/big/exit_1.onnx")
    with pytest.raises(ArtifactError, match=r"exit_1\.onnx: sha256 .* does not match"):
        load_variant(bundle, "big")
    with pytest.raises(ArtifactError, match="sha256"):
        verified_path(bundle.artifact, "variants/big/exit_1.onnx")
    # Other variants' files are untouched and still load.
    assert load_variant(bundle, "small").arch_id == "small"


def test_a_truncated_graph_is_refused_by_size(tmp_path: Path) -> None:
    bundle = load_bundle(make_bundle(tmp_path / "b"))
    path = bundle.root / "variants/mid/segment_0.onnx"
    path.write_bytes(path.read_bytes()[:-1])
    with pytest.raises(ArtifactError, match="size"):
        read_verified(bundle.artifact, "variants/mid/segment_0.onnx")
    with pytest.raises(ArtifactError, match="lists no file"):
        read_verified(bundle.artifact, "variants/mid/other.onnx")


def test_missing_providers_fall_back_to_the_cpu_with_a_note(monkeypatch: pytest.MonkeyPatch) -> None:
    import hmt.runtime.ort as runtime_ort

    monkeypatch.setattr(runtime_ort, "available_providers", lambda: [CPU_PROVIDER])
    chosen, notes = resolve_providers(("tensorrt", "cuda", "cpu"))
    assert chosen == [CPU_PROVIDER]
    assert len(notes) == 2 and "TensorrtExecutionProvider" in notes[0] and "falling back" in notes[1]
    monkeypatch.setattr(runtime_ort, "available_providers", lambda: ["CUDAExecutionProvider", CPU_PROVIDER])
    assert resolve_providers(("cuda",)) == (["CUDAExecutionProvider", CPU_PROVIDER], [])
    with pytest.raises(UsageError, match="unknown ORT provider 'npu'"):
        resolve_providers(("npu",))


def test_sessions_record_the_fallback_and_run(tmp_path: Path) -> None:
    bundle = load_bundle(make_bundle(tmp_path / "b"))
    data = read_verified(bundle.artifact, "variants/big/exit_0.onnx")
    session = ort_session(data, OrtOptions(intra_op_threads=1, allow_spinning=False), providers=("cuda", "cpu"))
    assert session.providers[-1] == CPU_PROVIDER and session.device == "cpu"
    if "CUDAExecutionProvider" not in resolve_providers(("cuda",))[0]:
        assert session.notes and "CUDAExecutionProvider" in session.notes[0]
    out = session.graph_fn()(np.array([[0, 5, 0, 0]], dtype=np.float32))
    assert out.shape == (1, 4) and int(np.argmax(out)) == 1


def test_ort_options_round_trip_and_refuse_typos() -> None:
    options = OrtOptions(level="basic", intra_op_threads=2, allow_spinning=False)
    assert OrtOptions.from_mapping(options.to_json()) == options
    # fuse's older reports have exactly these three keys: to_json keeps them unchanged.
    assert options.to_json() == {"level": "basic", "intra_op_threads": 2, "allow_spinning": False}
    assert OrtOptions(execution_mode="parallel").name == "ort[all,threads=default,parallel]"
    parallel = OrtOptions(execution_mode="parallel", inter_op_threads=2, cpu_arena=False)
    assert parallel.name == "ort[all,threads=default,parallel,inter=2,noarena]"
    assert OrtOptions.from_mapping(parallel.to_json()) == parallel
    with pytest.raises(UsageError, match="unknown ORT option"):
        OrtOptions.from_mapping({"intra_op_thread": 1})
    with pytest.raises(UsageError, match="level"):
        OrtOptions(level="max")


def test_threads_override_and_serve_defaults(tmp_path: Path) -> None:
    bundle = load_bundle(make_bundle(tmp_path / "b"))
    runner = load_variant(bundle, "mid", threads=0)
    runner.warm_up(np.zeros((1, 4), dtype=np.float32), runs=1)
    result = runner.run(np.array([[9, 0, 0, 0]], dtype=np.float32), 0.9)
    assert result.exit == 0 and result.class_index == 0
    with pytest.raises(UsageError, match="threads"):
        load_variant(bundle, "mid", threads=-1)


def test_serve_runner_keeps_its_old_names(tmp_path: Path) -> None:
    """Callers of hmt.serve.running.runner (offload's parts) keep working on the runtime layer."""
    from hmt.serve.running.runner import ort_graph, softmax_confidence

    bundle = load_bundle(make_bundle(tmp_path / "b"))
    logits = ort_graph(bundle.path("variants/big/exit_0.onnx"), 1)(np.array([[0, 0, 6, 0]], dtype=np.float32))
    assert softmax_confidence(logits)[0] == 2
