"""Precision as a choice: a variant's numeric precision (fp32, int8, fp16) and its id.

A quantised variant is another variant: its id is the arch id with the precision as a
suffix (``cifar_resnet20-e38933.e1.BB7BKlxxx.int8``); fp32 keeps the plain arch id, so
every artifact written before precision existed still reads the same. The suffix travels
pareto -> convert -> fuse -> deploy -> serve untouched: serve sees one more variant.

This module imports nothing heavy (serve may read ids); ``hmt.precision.quantize`` holds
the ONNX Runtime quantisation and ``hmt.precision.accuracy`` the held-out measurement.
"""

from __future__ import annotations

from hmt.errors import UsageError

FP32 = "fp32"
INT8 = "int8"
FP16 = "fp16"
PRECISIONS: tuple[str, ...] = (FP32, INT8, FP16)
# Bytes a weight takes in a variant of each precision (memory objective of pareto).
BYTES_PER_PARAM = {FP32: 4, INT8: 1, FP16: 2}


def check_precision(precision: str) -> str:
    if precision not in PRECISIONS:
        raise UsageError(f"unknown precision {precision!r}; choose from {', '.join(PRECISIONS)}")
    return precision


def variant_id(arch_id: str, precision: str = FP32) -> str:
    """The id of ``arch_id`` run at ``precision`` (fp32: the arch id itself)."""
    check_precision(precision)
    return arch_id if precision == FP32 else f"{arch_id}.{precision}"


def split_variant_id(vid: str) -> tuple[str, str]:
    """``(arch_id, precision)`` of a variant id; an id without a precision suffix is fp32 (and an explicit
    ``.fp32`` is the same variant)."""
    head, dot, tail = vid.rpartition(".")
    if dot and head and tail in PRECISIONS:
        return head, tail
    return vid, FP32


__all__ = ["BYTES_PER_PARAM", "FP16", "FP32", "INT8", "PRECISIONS", "check_precision", "split_variant_id",
           "variant_id"]
