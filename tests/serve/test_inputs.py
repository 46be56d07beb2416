"""Inputs users have (issue 14 item 5): JPEG/PNG, uint8 pixels, .npy as octet-stream and batches
give the same answer as the float tensor; bad images get a 4xx; class names come back."""

from __future__ import annotations

import io
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from serve_bundles import FAST_SWITCH, linear_bundle, npy_bytes

from hmt.artifacts import ArtifactWriter
from hmt.bundle import BundleSpec, Preprocess, TensorSpec, load_bundle
from hmt.errors import ArtifactError
from hmt.runtime.settings import ServeSettings
from hmt.serve.controller import Controller
from hmt.serve.http.api import ApiOptions, create_app
from hmt.serve.http.inputs import ApiError, InputSpec, decode

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

H = W = 8
CLASS_NAMES = ["cat", "dog", "ship", "frog"]
MEAN, STD = (0.5, 0.4, 0.3), (0.25, 0.2, 0.3)


def make_image_bundle(out: Path) -> Path:
    """One variant, one stage: flatten [1, 3, 8, 8] -> fixed random [192, 4] matmul -> identity head."""
    return linear_bundle(out, [1, 3, H, W], {"class_names": CLASS_NAMES,
                                             "preprocess": {"mean": list(MEAN), "std": list(STD), "layout": "NCHW"}})


@pytest.fixture(scope="module")
def image_client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    bundle = load_bundle(make_image_bundle(tmp_path_factory.mktemp("img") / "bundle"))
    controller = Controller(bundle, ServeSettings.from_mapping({**FAST_SWITCH, "early_exit": {"enabled": False}}),
                            warmup_runs=1)
    controller.start(background=False)
    with TestClient(create_app(controller, ApiOptions(max_image_pixels=1_000_000, max_batch=8))) as cl:
        yield cl


def pixels(seed: int, h: int = H, w: int = W) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def as_tensor(px: np.ndarray) -> np.ndarray:
    """What the bundle's preprocessing should make of pixels, written out independently."""
    x = (px.astype(np.float64) / 255.0 - np.array(MEAN)) / np.array(STD)
    return x.transpose(2, 0, 1)[None].astype(np.float32)


def encoded(px: np.ndarray, fmt: str, **kwargs: object) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(px).save(buf, format=fmt, **kwargs)
    return buf.getvalue()


def answer(client: TestClient, body: bytes, media: str) -> dict:  # type: ignore[type-arg]
    r = client.post("/v1/predict", content=body, headers={"content-type": media})
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def same(a: dict, b: dict) -> None:  # type: ignore[type-arg]
    assert a["class"] == b["class"] and a["class_name"] == b["class_name"]
    assert a["confidence"] == pytest.approx(b["confidence"], rel=1e-5)


def test_png_uint8_octet_stream_and_float_tensor_agree(image_client: TestClient) -> None:
    classes = set()
    for seed in range(6):
        px = pixels(seed)
        reference = answer(image_client, npy_bytes(as_tensor(px)), "application/x-npy")
        assert reference["class_name"] == CLASS_NAMES[reference["class"]]
        classes.add(reference["class"])
        same(answer(image_client, npy_bytes(px), "application/x-npy"), reference)  # uint8 HWC
        same(answer(image_client, npy_bytes(as_tensor(px)), "application/octet-stream"), reference)
        same(answer(image_client, encoded(px, "PNG"), "image/png"), reference)
    assert len(classes) > 1  # the answers depend on the image (the test could not pass by accident)


def test_jpeg_gives_the_answer_of_its_decoded_pixels(image_client: TestClient) -> None:
    px = pixels(7)
    data = encoded(px, "JPEG", quality=90)
    decoded = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    same(answer(image_client, data, "image/jpeg"), answer(image_client, npy_bytes(as_tensor(decoded)),
                                                           "application/x-npy"))


def test_a_larger_image_is_resized_to_the_input(image_client: TestClient) -> None:
    big = np.repeat(np.repeat(pixels(3), 4, axis=0), 4, axis=1)  # 32 x 32, each pixel a 4 x 4 block
    small = np.asarray(Image.fromarray(big).resize((W, H), Image.Resampling.BILINEAR))
    same(answer(image_client, encoded(big, "PNG"), "image/png"),
         answer(image_client, npy_bytes(small), "application/x-npy"))


def test_batches_answer_per_item_like_single_requests(image_client: TestClient) -> None:
    batch_px = np.stack([pixels(s) for s in range(3)])
    singles = [answer(image_client, npy_bytes(as_tensor(px)), "application/x-npy") for px in batch_px]
    for body in (npy_bytes(np.concatenate([as_tensor(px) for px in batch_px])), npy_bytes(batch_px)):
        doc = answer(image_client, body, "application/x-npy")
        assert doc["batch"] == 3 and len(doc["predictions"]) == 3
        for got, want in zip(doc["predictions"], singles, strict=True):
            same(got, want)
    doc = answer(image_client, b'{"inputs": ' + str(np.concatenate([as_tensor(px) for px in batch_px]).tolist())
                 .encode() + b"}", "application/json")
    for got, want in zip(doc["predictions"], singles, strict=True):
        same(got, want)
    r = image_client.post("/v1/predict", content=npy_bytes(np.zeros((9, H, W, 3), np.uint8)),
                          headers={"content-type": "application/x-npy"})
    assert r.status_code == 413 and r.json()["error"]["code"] == "batch_too_large"


@pytest.mark.parametrize(("body", "media", "status", "code"), [
    (encoded(pixels(1), "PNG")[:60], "image/png", 400, "bad_image"),  # truncated
    (b"\xff\xd8\xff" + b"\x00" * 200, "image/jpeg", 400, "bad_image"),
    (encoded(pixels(1), "PNG"), "image/jpeg", 400, "bad_image"),  # a PNG labelled JPEG: only the named decoder runs
    (encoded(np.zeros((1100, 1100, 3), np.uint8), "PNG"), "image/png", 413, "image_too_large"),  # 1.2 MP > 1 MP
    (npy_bytes(np.zeros((H, W, 4), np.uint8)), "application/x-npy", 422, "bad_shape"),
    (npy_bytes(np.zeros((1, 3, H, W), np.float64)), "application/x-npy", 422, "bad_dtype"),
    (b"PK\x03\x04 an npz", "application/octet-stream", 400, "bad_npy"),
])
def test_malformed_inputs_get_4xx(image_client: TestClient, body: bytes, media: str, status: int, code: str) -> None:
    r = image_client.post("/v1/predict", content=body, headers={"content-type": media})
    assert r.status_code == status and r.json()["error"]["code"] == code, r.text


def test_decompression_bomb_is_refused_before_decoding() -> None:
    # A 20000 x 20000 PNG of zeros is ~1 MB compressed and 1.2 GB decoded: the header alone refuses it.
    spec = InputSpec(TensorSpec("input", (1, 3, H, W), "float32"), Preprocess(), max_pixels=4096 * 4096)
    header = encoded(np.zeros((1, 1, 3), np.uint8), "PNG")
    ihdr = header.index(b"IHDR")
    bomb = bytearray(header)
    bomb[ihdr + 4:ihdr + 12] = (20000).to_bytes(4, "big") * 2  # width, height (CRC now wrong: never read)
    with pytest.raises(ApiError) as err:
        decode(bytes(bomb), "image/png", spec)
    assert err.value.status in (400, 413)


def test_preprocess_defaults_and_non_image_bundles() -> None:
    cifar = InputSpec.of_bundle(_spec((1, 3, 32, 32)))  # an older bundle: no preprocess field
    assert cifar.preprocess == Preprocess() and cifar.preprocess.mean == (0.485, 0.456, 0.406)
    flat = InputSpec.of_bundle(_spec((1, 4)))
    assert flat.preprocess is None
    with pytest.raises(ApiError) as err:
        decode(npy_bytes(np.zeros((2, 2, 3), np.uint8)), "application/x-npy", flat)
    assert err.value.status == 422  # uint8 into a float tensor that is not an image: a dtype error
    with pytest.raises(ArtifactError, match="class_names"):
        BundleSpec.from_mapping({**_spec_doc((1, 4)), "class_names": ["a"]})
    with pytest.raises(ArtifactError, match="layout"):
        BundleSpec.from_mapping({**_spec_doc((1, 4)), "preprocess": {"layout": "CHWN"}})


def _spec_doc(shape: tuple[int, ...]) -> dict:  # type: ignore[type-arg]
    graph = {"index": 0, "onnx": "a.onnx", "input": {"name": "x", "shape": list(shape), "dtype": "float32"},
             "output": {"name": "f", "shape": [1, 4], "dtype": "float32"}}
    return {"version": 1, "target": {}, "classes": 4,
            "input": {"name": "x", "shape": list(shape), "dtype": "float32"},
            "variants": [{"arch_id": "v", "exit_stage": 0, "accuracy": 0.9, "accuracy_per_exit": [0.9],
                          "latency_ms": 1.0, "energy": 1.0, "memory_mb": 1.0, "segments": [graph],
                          "exits": [{**graph, "consumes_segment": 0}], "preferred_engine": "onnxruntime",
                          "engines": ["onnxruntime"]}]}


def _spec(shape: tuple[int, ...]) -> BundleSpec:
    return BundleSpec.from_mapping(_spec_doc(shape))


def test_deploy_takes_preprocessing_and_class_names_from_the_supernet(tmp_path: Path) -> None:
    from hmt.deploy.sources import input_meta

    dataset = {"name": "cifar10", "modality": "image", "input_shape": [3, 32, 32], "num_classes": 3,
               "class_names": ["a", "b", "c"], "mean": [0.1, 0.2, 0.3], "std": [0.4, 0.5, 0.6]}
    with ArtifactWriter(tmp_path / "supernet", kind="supernet", config={}) as writer:
        writer.write_json("supernet.json", {"dataset": dataset})
    from types import SimpleNamespace

    from hmt.artifacts import ParentRecord, load_artifact

    supernet = load_artifact(tmp_path / "supernet", kind="supernet")

    def front(name: str, parents: list[ParentRecord], doc: dict) -> SimpleNamespace:  # type: ignore[type-arg]
        with ArtifactWriter(tmp_path / name, kind="pareto", config={}, parents=parents) as writer:
            writer.write_json("front.json", doc)
        return SimpleNamespace(doc=doc, artifact=load_artifact(tmp_path / name, kind="pareto"))

    expected = Preprocess(mean=(0.1, 0.2, 0.3), std=(0.4, 0.5, 0.6))
    # The front's own dataset record (what pareto writes), else the supernet it names, by sha256.
    assert input_meta(front("carried", [], {"dataset": dataset})) == (expected, ("a", "b", "c"), None, True)
    assert input_meta(front("named", [supernet.as_parent()], {})) == (expected, ("a", "b", "c"), None, True)
    rebuilt = ParentRecord(kind="supernet", path=str(tmp_path / "supernet"), manifest_sha256="0" * 64)
    pre, names, note, known = input_meta(front("rebuilt", [rebuilt], {}))
    assert pre is None and names is None and not known and note and "was not found" in note
    assert input_meta(front("none", [], {}))[2:] == (
        "no supernet recorded: the bundle carries no preprocessing or class names", False)


def test_grey_pixels_may_come_without_their_channel_axis() -> None:
    """A one-channel (MNIST-like) bundle takes uint8 [H, W] and [N, H, W], as image libraries give grey
    pixels, with the answer of [H, W, 1]; another shape is refused naming all the accepted ones."""
    spec = InputSpec(TensorSpec("input", (1, 1, 28, 28), "float32"), Preprocess(mean=(0.13,), std=(0.31,)))
    rng = np.random.default_rng(0)
    grey = rng.integers(0, 256, (2, 28, 28), dtype=np.uint8)
    with_axis = decode(npy_bytes(grey[..., None]), "application/x-npy", spec)
    assert with_axis.shape == (2, 1, 28, 28)
    np.testing.assert_array_equal(decode(npy_bytes(grey), "application/x-npy", spec), with_axis)
    np.testing.assert_array_equal(decode(npy_bytes(grey[0]), "application/x-npy", spec), with_axis[:1])
    with pytest.raises(ApiError) as err:
        decode(npy_bytes(grey[:, :27]), "application/x-npy", spec)
    assert err.value.status == 422 and "[28, 28] or [N, 28, 28]" in err.value.message


def test_a_malformed_npy_header_is_explained() -> None:
    """The message says what is wrong with the header, not only numpy's exception class."""
    spec = InputSpec(TensorSpec("input", (1, 3, H, W), "float32"), Preprocess())
    with pytest.raises(ApiError) as err:
        decode(b"\x93NUMPY\x01\x00\x10\x00{'descr': '<f4'}\n", "application/x-npy", spec)
    assert err.value.status == 400 and "header is malformed" in err.value.message
    assert "correct keys" in err.value.message


def test_scenario_data_takes_uint8_pixels_and_refuses_labels_outside_the_classes(tmp_path: Path) -> None:
    """serve --scenario --data: uint8 pixels [N, H, W, C] (what /v1/predict and --canary take, and how
    image sets are stored) were refused as a shape mismatch; they are normalised as the bundle says. A
    label outside 0..classes-1 (or not a number) made every such answer silently wrong; it is refused."""
    from hmt.errors import InputError
    from hmt.serve.running.session import load_inputs

    bundle = load_bundle(make_image_bundle(tmp_path / "bundle"))
    px = np.stack([pixels(1), pixels(2)])
    path = tmp_path / "d.npz"
    np.savez(path, x=px, y=np.array([0, 3]))
    inputs = load_inputs(bundle, path, np.random.default_rng(0))
    assert inputs.y is not None
    second = int(np.flatnonzero(inputs.y == 3)[0])  # the order is shuffled; x and y stay paired
    np.testing.assert_allclose(inputs.x[second], as_tensor(px[1]), rtol=1e-5, atol=1e-5)
    for bad in (np.array([0, 4]), np.array([0, -1]), np.array(["cat", "dog"]), np.array([0.0, np.nan])):
        np.savez(path, x=px, y=bad)
        with pytest.raises(InputError, match=r"y must hold class indices 0\.\.3"):
            load_inputs(bundle, path, np.random.default_rng(0))


def test_scenario_data_saved_class_by_class_is_sent_in_a_seeded_shuffled_order(tmp_path: Path) -> None:
    """The clients cycle through --data: the embedded CIFAR-10 test images, saved class by class, sent
    one class per phase (serve --adapt's drift monitor scored up to 0.42 of its 0.5 on clean images,
    and a phase's accuracy was a class's). Shuffled with the replay's seed: the same order in every run
    of a --compare, x and y paired."""
    from hmt.serve.running.session import load_inputs

    bundle = load_bundle(make_image_bundle(tmp_path / "bundle"))
    labels = np.repeat(np.arange(4), 50)  # class by class
    x = np.stack([np.full((8, 8, 3), 10 * c, np.uint8) for c in labels])
    path = tmp_path / "sorted.npz"
    np.savez(path, x=x, y=labels)
    first = load_inputs(bundle, path, np.random.default_rng(7))
    again = load_inputs(bundle, path, np.random.default_rng(7))
    assert first.y is not None and again.y is not None
    assert len(set(first.y[:20].tolist())) > 1  # not one class for the first 20 requests
    assert np.array_equal(first.y, again.y) and np.array_equal(first.x, again.x)  # the seed fixes the order
    assert sorted(first.y.tolist()) == labels.tolist()
    for xi, yi in zip(first.x, first.y, strict=True):  # each input keeps its label
        np.testing.assert_allclose(xi, load_inputs(bundle, _one(tmp_path, x[labels == yi][0], yi),
                                                   np.random.default_rng(0)).x[0])


def _one(tmp_path: Path, pixels: np.ndarray, label: int) -> Path:
    path = tmp_path / f"one-{label}.npz"
    np.savez(path, x=pixels[None], y=np.array([label]))
    return path
