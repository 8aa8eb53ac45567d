"""The row-tile layout shared by the exact kernels.

Weights are repacked at load into tiles of ``TILE_ROWS`` consecutive rows; inside a tile every per-row array
is stored element-major, row-minor (``[..., element, row]``). The innermost loop of every kernel then runs
over the rows of a tile with one broadcast activation value: contiguous and branch-free, so LLVM vectorizes
it, and each row's float operations still happen one after the other in ggml's order (the vector lanes are
rows, never parts of one row's sum). Rows past ``rows`` in the last tile are zero padding.
"""

from __future__ import annotations

# One layout for both kernel families: the approximate kernels' tile helpers serve the exact ones too.
from .._common import N_CHUNKS, TILE_ROWS, f16_field, n_tiles, row_minor, tile_rows

__all__ = ["N_CHUNKS", "TILE_ROWS", "f16_field", "n_tiles", "row_minor", "tile_rows"]
