"""gguf-io: read and write GGUF model files.

    import gguf_io

    with gguf_io.open("model.gguf") as f:
        print(f.header.architecture, len(f.tensors))
        raw = f.tensor_bytes("token_embd.weight")   # zero-copy uint8 view

Malformed input raises `GGUFError`, and nothing else.
"""

from .constants import GGMLQuantizationType, GGUFValueType
from .errors import GGUFError
from .file import GGUFFile, open, split_path
from .header import ModelHeader, TokenizerData
from .reader import Field, TensorInfo, tensor_nbytes
from .writer import GGUFWriter

__version__ = "0.1.0"

__all__ = [
    "Field",
    "GGMLQuantizationType",
    "GGUFError",
    "GGUFFile",
    "GGUFValueType",
    "GGUFWriter",
    "ModelHeader",
    "TensorInfo",
    "TokenizerData",
    "__version__",
    "open",
    "split_path",
    "tensor_nbytes",
]
