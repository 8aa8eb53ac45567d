"""ExpertMatrix: the experts of a mixture-of-experts weight in one ``ExactMatrix``, multiplied by groups of
tokens as ggml's ``mul_mat_id`` does.

A GGUF stores an MoE weight as one 3-D tensor ([n_expert] x rows x cols). Here every expert's rows (several
tensors stacked by rows per expert, as ``ExactMatrix.stacked``: gate and up) are padded with zero rows to
whole tiles and laid end to end, so expert e owns tiles ``[e * te, (e + 1) * te)``. ``matmul`` takes the
step's grouping (the pairs of each expert, as ``llama_engine``'s router groups them) and multiplies each
expert's tiles with its own tokens' rows only. Where the kernel set has a grouped kernel (Q4_K and Q6_K from
AVX2 on: ``klanes.mm_k*_experts``) that is one parallel launch over every active expert's tiles, the input
converted once for all experts; other types run one product per active expert on its tiles. Every output
row is the number the expert's own 2-D ``ExactMatrix`` gives.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as T

from ..cpu import KernelSet
from ._tiles import TILE_ROWS, n_tiles
from .matrix import Activations, ExactMatrix

__all__ = ["ExpertMatrix"]


class ExpertMatrix:
    """``n_expert`` matrices of ``rows`` x ``cols`` (per expert the ``parts`` stacked by rows), multiplied
    by groups of activation rows."""

    def __init__(self, matrix: ExactMatrix, n_expert: int, rows: int) -> None:
        self.matrix = matrix
        self.n_expert = n_expert
        self.rows = rows  # per expert, without the padding
        self.cols = matrix.cols
        self.qtype = matrix.qtype
        self._tiles = n_tiles(rows)

    @classmethod
    def stacked(
        cls,
        parts: Sequence[tuple[np.ndarray, T | int, int]],
        n_expert: int,
        cols: int,
        kernels: KernelSet | None = None,
    ) -> ExpertMatrix | None:
        """``parts``: ``(raw, qtype, rows)`` per tensor, ``raw`` holding all experts' bytes (the 3-D tensor,
        any shape); each expert's rows are the parts' slices in order. None where the parts' types do not
        stack (``ExactMatrix.stacked``)."""
        raws = [np.asarray(raw).reshape(n_expert, -1) for raw, _, _ in parts]
        rows = sum(r for _, _, r in parts)
        pad = n_tiles(rows) * TILE_ROWS - rows
        zero = None
        if pad:
            qtype = T(parts[-1][1])
            block, block_bytes = GGML_QUANT_SIZES[qtype]
            zero = (np.zeros(pad * (cols // block) * block_bytes, np.uint8), qtype, pad)
        flat: list[tuple[np.ndarray, T | int, int]] = []
        for e in range(n_expert):
            flat += [(raw[e], q, r) for raw, (_, q, r) in zip(raws, parts, strict=True)]
            if zero is not None:
                flat.append(zero)
        m = ExactMatrix.stacked(flat, cols, kernels)
        return None if m is None else cls(m, n_expert, rows)

    @property
    def nbytes(self) -> int:
        return self.matrix.nbytes

    @property
    def activation_format(self) -> str:
        return self.matrix.activation_format

    def matmul(
        self,
        acts: Activations,
        out: np.ndarray,
        pairs: np.ndarray,
        offsets: np.ndarray,
        active: np.ndarray,
        m: int,
        div: int,
        scratch: tuple[Activations, np.ndarray] | None = None,
    ) -> None:
        """For each active expert e = active[s] (s < m) and each p in pairs[offsets[e]:offsets[e + 1]]:
        out[p, :rows] = expert e @ acts row p // div. ``pairs``, ``offsets``, ``active``: int64; ``out``
        float32 with ``rows`` columns (and a row for every p). ``scratch``: an ``Activations`` of ``cols``
        and a float32 [., rows] array, each with a row per token of the largest group, for the types
        without a grouped kernel (``grouped``); None: allocated when needed."""
        mat = self.matrix
        if acts.cols != self.cols or out.shape[1] != self.rows or out.dtype != np.float32:
            raise ValueError(
                f"activations of {acts.cols} columns, out {out.dtype} {out.shape[1:]}: expected {self.cols} "
                f"and float32 [., {self.rows}]"
            )
        if m == 0:
            return
        # the kernels do not bounds-check: the grouping's sizes are checked here (its entries are the
        # caller's: pairs index rows of out, and pair // div rows of acts)
        n_pairs = int(offsets[self.n_expert]) if offsets.shape[0] > self.n_expert else -1
        if not 0 < m <= self.n_expert or not 0 <= n_pairs <= min(len(pairs), out.shape[0]) or div < 1:
            raise ValueError(
                f"a grouping of {m} experts and {n_pairs} pairs (div {div}) for {self.n_expert} experts, "
                f"{len(pairs)} pair slots and {out.shape[0]} output rows"
            )
        spec, arrays = mat._spec, mat._arrays
        if spec.run_experts is not None:
            x = acts.converted(spec.fmt)
            spec.run_experts(arrays, out, x, acts.n, self.rows, mat._nb, pairs, offsets, active, m, div)
            return
        te, total = self._tiles, self._tiles * self.n_expert
        most = int(np.diff(offsets[: self.n_expert + 1]).max())
        if scratch is None or scratch[0].max_tokens < most or scratch[1].shape[0] < most:
            scratch = Activations(self.cols, most), np.zeros((most, self.rows), np.float32)
        inp, ys = scratch
        for s in range(m):  # no grouped kernel for this type: one product per expert, on its tiles
            e = int(active[s])
            group = pairs[offsets[e] : offsets[e + 1]]
            cnt = len(group)
            np.take(acts.x, group // div if div > 1 else group, axis=0, out=inp.rows(cnt))
            y = ys[:cnt]
            tiles = tuple(a[e * te : (e + 1) * te] if a.size and a.shape[0] == total else a for a in arrays)
            spec.run(tiles, y, inp.converted(spec.fmt), cnt, self.rows, mat._nb)
            out[group] = y

    @property
    def grouped(self) -> bool:
        """Whether the type has a grouped kernel in this kernel set (one launch for all experts)."""
        return self.matrix._spec.run_experts is not None
