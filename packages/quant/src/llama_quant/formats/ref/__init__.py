"""Plain-numpy references of every block-format kernel, one module per family.

Each function has the same signature and result as its numba kernel in ``llama_quant.formats``;
they are vectorized over blocks and loop in Python over the positions inside a block, so that
float32 sums accumulate in the same order as the C code. Quantize references are specified for finite
weights (the numba kernels also follow the C code on NaN and infinity).
"""
