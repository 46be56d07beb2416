"""convert: any model -> verified, simplified static ONNX graphs (CrowdHMTware III-B2)."""

import hmt.offline_python  # noqa: F401 - refuses Python < 3.10 with a message saying what runs there
from hmt.convert.export import EXPORTERS
from hmt.convert.passes import FOLDERS
from hmt.convert.pipeline import CONVERTED_KIND, convert_model, load_converted
from hmt.convert.result import ConvertedVariant, ConvertOptions, ConvertResult
from hmt.convert.sources import ModelSource, OnnxSource, SupernetSource, TorchSource, parse_shape

__all__ = [
    "CONVERTED_KIND",
    "EXPORTERS",
    "FOLDERS",
    "ConvertOptions",
    "ConvertResult",
    "ConvertedVariant",
    "ModelSource",
    "OnnxSource",
    "SupernetSource",
    "TorchSource",
    "convert_model",
    "load_converted",
    "parse_shape",
]
