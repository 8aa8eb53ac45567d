"""Block formats, one module per family; importing this package registers them all."""

from llama_quant.formats import floats, iq4, iquants, kquants, legacy, mxfp4, ternary  # noqa: F401
