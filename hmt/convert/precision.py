"""convert's quantised variants: an ``<arch id>.int8`` / ``.fp16`` id becomes a quantised chain.

The fp32 chain is exported and verified against torch first (as every variant is); then
``hmt.precision.quantize`` rewrites each segment and exit head (INT8: QDQ, calibrated on
the supernet's stored calibration images; FP16: fp32 inputs and outputs kept), both
chains classify the supernet's held-out images (its validation split) and the variant is
refused (VerificationError, nothing written) when it loses more than
``ConvertOptions.max_accuracy_drop`` at its last exit. The measured accuracies go in the
convert report under the variant's ``quantisation``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hmt.convert.graph import check_model, load_onnx, save_onnx

if TYPE_CHECKING:
    import numpy as np

    from hmt.artifacts import ArtifactWriter
    from hmt.convert.result import ConvertedVariant, ConvertOptions


@dataclass(frozen=True)
class QuantContext:
    """What every quantised variant of one supernet needs: calibration and held-out images."""

    calibration: np.ndarray
    x: np.ndarray
    y: np.ndarray
    source: str

    @classmethod
    def load(cls, supernet: Path, options: ConvertOptions) -> QuantContext:
        from hmt.errors import ArtifactError, InputError
        from hmt.pareto.data import held_out_data
        from hmt.precision.calibration import calibration_array, held_out_arrays
        from hmt.supernet import load_supernet

        loaded = load_supernet(supernet)
        try:
            data = held_out_data(loaded, data_path=options.data_path, max_samples=options.accuracy_samples,
                                 seed=options.seed)
        except (InputError, ArtifactError):
            # The supernet's own data is not on this machine (a shipped or moved supernet): the
            # embedded CIFAR-10 test images were never trained on, so they check a CIFAR-10
            # supernet's quantised copies as well. Other data still needs --data.
            embedded = _embedded_held_out(loaded, options) if options.data_path is None else None
            if embedded is None:
                raise
            data = embedded
        x, y = held_out_arrays(data)
        return cls(calibration_array(loaded), x, y, data.source)


def _embedded_held_out(loaded: Any, options: ConvertOptions) -> Any:
    """The embedded CIFAR-10 test images as held-out data, where they fit the supernet; else None."""
    from dataclasses import replace

    from hmt.data import DatasetInfo
    from hmt.data.cifar import EMBEDDED_DIR
    from hmt.pareto.data import held_out_data

    info = DatasetInfo.from_json_dict(loaded.dataset_info)
    if info.name != "cifar10" or not (EMBEDDED_DIR / "test.zip").is_file():
        return None
    data = held_out_data(loaded, data_path=EMBEDDED_DIR, split="test", max_samples=options.accuracy_samples,
                         seed=options.seed)
    # held_out_data names given data by its sha256; say which images these are instead
    _, _, sampled = data.source.partition("), ")
    return replace(data, source="test split of the embedded CIFAR-10 subset" + (f", {sampled}" if sampled else ""))


def quantise_variant(writer: ArtifactWriter, variant: ConvertedVariant, context: QuantContext, *,
                     options: ConvertOptions) -> None:
    """Replace ``variant``'s saved fp32 graphs by their quantised copies, after measuring them."""
    from hmt.precision import split_variant_id
    from hmt.precision.accuracy import check_accuracy, require_within
    from hmt.precision.quantize import QuantOptions, quantize_chain

    assert variant.arch_id is not None
    _, precision = split_variant_id(variant.arch_id)
    segments = sorted((g for g in variant.graphs if g.role == "segment"), key=lambda g: g.index)
    exits = sorted((g for g in variant.graphs if g.role == "exit"), key=lambda g: g.index)
    float_chain = ([load_onnx(writer.path(g.file)) for g in segments], [load_onnx(writer.path(g.file)) for g in exits])
    quant = QuantOptions()
    q_segments, q_exits = quantize_chain(*float_chain, context.calibration, precision, options=quant)
    check = check_accuracy(precision, float_chain, (q_segments, q_exits), context.x, context.y,
                           max_drop=options.max_accuracy_drop)
    require_within(check, what=f"variant {variant.arch_id}")
    for graph, model in zip([*segments, *exits], [*q_segments, *q_exits], strict=True):
        check_model(model, what=f"{variant.name}: {precision} {graph.file}")
        save_onnx(model, writer.path(graph.file))
    variant.precision = precision
    record: dict[str, Any] = {
        "tool": "onnxruntime.quantization" if precision == "int8" else "onnxruntime.transformers.float16",
        **(quant.to_json() if precision == "int8" else {"io": "fp32 (cast at each graph's ends)"}),
        "held_out": context.source,
        "accuracy": check.to_json(),
        "verification": "the torch comparisons above are of the fp32 export; the quantised chain is checked "
                        "by its accuracy on the held-out images",
    }
    variant.quantisation = record


__all__ = ["QuantContext", "quantise_variant"]
