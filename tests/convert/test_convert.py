"""convert on tiny models: numeric match, reports, segments, and every bad input refused cleanly."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from hmt.artifacts import load_artifact
from hmt.convert import ConvertOptions, OnnxSource, TorchSource, convert_model
from hmt.errors import InputError, ModelError, UnsafePathError, UsageError, VerificationError
from hmt.graph.model import load_onnx


def _no_output(out: Path) -> None:
    assert not out.exists()
    assert not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")], "temporary dir left behind"


def test_torch_model_converts_and_matches(model_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "converted"
    result = convert_model(TorchSource(f"{model_file}:tiny", ((2, 3, 16, 16),)), out)
    artifact = load_artifact(out, kind="converted")
    assert artifact.manifest.metrics["max_abs_error"] < 1e-5
    report = json.loads((out / "report.json").read_text())
    (variant,) = report["variants"]
    graph = variant["graphs"][0]
    assert [p["name"] for p in graph["passes"]] == ["pass1-fusion-redundancy", "pass2-constant-folding[onnxslim]"]
    assert graph["passes"][0]["op_counts_before"] and graph["op_counts"]
    assert "Dropout" not in graph["op_counts"] and "BatchNormalization" not in graph["op_counts"]
    # The saved file reproduces torch on fresh inputs too.
    import importlib.util

    spec = importlib.util.spec_from_file_location("tiny_ref", model_file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    x = np.random.default_rng(7).standard_normal((2, 3, 16, 16)).astype(np.float32)
    with torch.inference_mode():
        expected = module.tiny().eval()(torch.from_numpy(x)).numpy()
    session = ort.InferenceSession(str(out / graph["file"]), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(session.run(None, {"input": x})[0], expected, atol=1e-5, rtol=1e-4)
    assert result.variants[0].max_rel_error < 1e-4


def test_safetensors_and_state_dict_weights(model_file: Path, tmp_path: Path) -> None:
    import importlib.util

    from safetensors.torch import save_file

    spec = importlib.util.spec_from_file_location("tiny_w", model_file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    net = module.tiny()
    with torch.no_grad():
        net.fc.bias.fill_(3.0)
    save_file({k: v.contiguous() for k, v in net.state_dict().items()}, str(tmp_path / "w.safetensors"))
    torch.save({"state_dict": net.state_dict()}, tmp_path / "w.pt")
    for weights in ("w.safetensors", "w.pt"):
        out = tmp_path / f"out-{weights}"
        convert_model(TorchSource(f"{model_file}:tiny", ((1, 3, 8, 8),), tmp_path / weights), out)
        model = onnx.load(str(out / "model" / "model.onnx"))
        biases = [numpy_helper.to_array(i) for i in model.graph.initializer if i.dims == [5]]
        assert any(np.allclose(b, 3.0) for b in biases)


def test_segmented_variant_exports_a_chain(model_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "seg"
    convert_model(TorchSource(f"{model_file}:segmented", ((1, 3, 16, 16),)), out)
    report = json.loads((out / "report.json").read_text())
    chain = report["variants"][0]["chain"]
    assert [s["file"] for s in chain["segments"]] == ["model/segment_0.onnx", "model/segment_1.onnx"]
    assert [e["consumes_segment"] for e in chain["exits"]] == [0, 1]
    assert chain["segments"][1]["input"]["shape"] == chain["segments"][0]["output"]["shape"] == [1, 8, 16, 16]
    assert chain["exits"][1]["input"]["name"] == chain["segments"][1]["output"]["name"]
    assert len(report["variants"][0]["verification"]) == 3  # two exits + the whole variant
    for f in ("segment_0", "segment_1", "exit_0", "exit_1"):
        assert (out / "model" / f"{f}.onnx").is_file()


def test_onnx_input_with_external_data_and_a_symbolic_batch(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    w = np.random.default_rng(0).standard_normal((4, 6)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["m"]), helper.make_node("Identity", ["m"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 6])],
        [numpy_helper.from_array(w, "W")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save_model(model, str(src / "m.onnx"), save_as_external_data=True, location="m.bin", size_threshold=0)
    out = tmp_path / "conv"
    convert_model(OnnxSource(src / "m.onnx"), out, onnx_input_shapes=((3, 4),))
    saved = onnx.load(str(out / "model" / "model.onnx"))
    assert [d.dim_value for d in saved.graph.input[0].type.tensor_type.shape.dim] == [3, 4]
    assert "Identity" not in {n.op_type for n in saved.graph.node}


def _external_model(tmp_path: Path, location: str) -> Path:
    folder = tmp_path / "model_dir"
    folder.mkdir(exist_ok=True)
    tensor = onnx.TensorProto(name="W", data_type=TensorProto.FLOAT, dims=[2, 2])
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", "0"), ("length", "16")):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])], [tensor])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = folder / "m.onnx"
    path.write_bytes(model.SerializeToString())
    return path


@pytest.mark.parametrize("kind", ["dotdot", "absolute", "symlink"])
def test_external_data_outside_the_folder_is_refused(tmp_path: Path, kind: str) -> None:
    secret = tmp_path / "secret.bin"
    secret.write_bytes(np.arange(4, dtype=np.float32).tobytes())
    if kind == "dotdot":
        path = _external_model(tmp_path, "../secret.bin")
    elif kind == "absolute":
        path = _external_model(tmp_path, str(secret))
    else:
        path = _external_model(tmp_path, "link.bin")
        os.symlink(secret, path.parent / "link.bin")
    out = tmp_path / "out"
    with pytest.raises(UnsafePathError, match=r"outside|absolute|'\.\.'"):
        convert_model(OnnxSource(path), out)
    _no_output(out)


def test_symlink_inside_the_folder_is_fine(tmp_path: Path) -> None:
    path = _external_model(tmp_path, "link.bin")
    (path.parent / "real.bin").write_bytes(np.arange(4, dtype=np.float32).tobytes())
    os.symlink(path.parent / "real.bin", path.parent / "link.bin")
    model = load_onnx(path)
    assert numpy_helper.to_array(model.graph.initializer[0]).tolist() == [[0, 1], [2, 3]]


@pytest.mark.parametrize("content", [b"", b"\x08\x07\xff\xfe garbage " * 40, b"random"])
def test_random_and_truncated_onnx_are_refused(tmp_path: Path, model_file: Path, content: bytes) -> None:
    path = tmp_path / "bad.onnx"
    path.write_bytes(content)
    out = tmp_path / "out"
    with pytest.raises(InputError, match=r"bad\.onnx"):
        convert_model(OnnxSource(path), out)
    _no_output(out)


def test_truncated_real_onnx_is_refused(tmp_path: Path, model_file: Path) -> None:
    good = tmp_path / "good"
    convert_model(TorchSource(f"{model_file}:tiny", ((1, 3, 8, 8),)), good)
    data = (good / "model" / "model.onnx").read_bytes()
    path = tmp_path / "cut.onnx"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError, match=r"cut\.onnx"):
        convert_model(OnnxSource(path), tmp_path / "out")
    _no_output(tmp_path / "out")


class _Payload:
    def __reduce__(self):  # runs os.system when unpickled by a full pickle load
        return (os.system, (f"touch {_Payload.marker}",))


def test_malicious_pickle_weights_are_refused_and_not_run(tmp_path: Path, model_file: Path) -> None:
    marker = tmp_path / "pwned"
    _Payload.marker = marker  # type: ignore[attr-defined]
    bad = tmp_path / "evil.pt"
    torch.save({"fc.weight": _Payload()}, bad, _use_new_zipfile_serialization=True)
    raw = tmp_path / "evil_raw.pt"
    raw.write_bytes(pickle.dumps({"fc.weight": _Payload()}))
    for path in (bad, raw):
        out = tmp_path / f"out-{path.stem}"
        with pytest.raises(InputError, match="refused"):
            convert_model(TorchSource(f"{model_file}:tiny", ((1, 3, 8, 8),), path), out)
        _no_output(out)
    assert not marker.exists(), "the pickle payload ran"


def test_factory_that_raises(model_file: Path, tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="broken\\(\\) raised RuntimeError: factory exploded"):
        convert_model(TorchSource(f"{model_file}:broken", ((1, 3, 8, 8),)), tmp_path / "out")
    _no_output(tmp_path / "out")


def test_wrong_input_shape(model_file: Path, tmp_path: Path) -> None:
    with pytest.raises(ModelError, match=r"input shape \(1, 4, 8, 8\).*wrong --input-shape"):
        convert_model(TorchSource(f"{model_file}:tiny", ((1, 4, 8, 8),)), tmp_path / "out")
    _no_output(tmp_path / "out")


def test_missing_factory_and_bad_spec(model_file: Path, tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no function 'nope'"):
        convert_model(TorchSource(f"{model_file}:nope", ((1, 3, 8, 8),)), tmp_path / "out")
    with pytest.raises(UsageError):
        convert_model(TorchSource(str(model_file), ((1, 3, 8, 8),)), tmp_path / "out")


def test_unsupported_operator_is_named(tmp_path: Path) -> None:
    graph = helper.make_graph(
        [helper.make_node("FrobnicateTensor", ["x"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])])
    path = tmp_path / "odd.onnx"
    path.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    with pytest.raises(ModelError, match=r"unsupported operator.*FrobnicateTensor"):
        convert_model(OnnxSource(path), tmp_path / "out")
    _no_output(tmp_path / "out")


def test_verification_failure_writes_nothing(model_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    with pytest.raises(VerificationError, match=r"exceeds tolerance.*nothing was written"):
        convert_model(TorchSource(f"{model_file}:liar", ((1, 4),)), out,
                      options=ConvertOptions(exporter="torchscript"))
    _no_output(out)


def test_failed_rerun_keeps_the_previous_artifact(model_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    convert_model(TorchSource(f"{model_file}:tiny", ((1, 3, 8, 8),)), out)
    before = (out / "manifest.json").read_bytes()
    with pytest.raises(ModelError):
        convert_model(TorchSource(f"{model_file}:broken", ((1, 3, 8, 8),)), out)
    assert (out / "manifest.json").read_bytes() == before


@pytest.mark.slow  # the dynamo exporter takes 3-15 s on this machine
def test_dynamo_exporter_folds_its_data_file(model_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "dyn"
    result = convert_model(TorchSource(f"{model_file}:tiny", ((1, 3, 8, 8),)), out,
                           options=ConvertOptions(exporter="dynamo"))
    assert result.variants[0].graphs[0].exporter == "dynamo"
    assert sorted(p.name for p in (out / "model").iterdir()) == ["model.onnx"]
    assert result.variants[0].max_abs_error < 1e-5
