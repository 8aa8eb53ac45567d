"""Progress of a ``llama-quant`` run: llama-quantize's per-tensor lines, plus a bar on a terminal.

``run_quantize`` logs one ``[   i/   N] name ...`` line per tensor as it is written. Those lines always go
to stdout, as llama-quantize prints them (so a log file or a pipe gets plain lines, tensor i of N). When
stderr is a terminal, a bar below them shows the tensors done, the share of the input bytes done and the
elapsed time; it is redrawn after every line and erased at the end.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable
from typing import TextIO

__all__ = ["TensorProgress"]

# "[  12/ 272] blk.0.attn_q.weight - [...], type = f16, ... size = 0.63 MiB" (the source size comes first)
_LINE = re.compile(r"^\[\s*(\d+)/\s*(\d+)\].*?size =\s*([0-9.]+) MiB")
_WIDTH = 30


class TensorProgress:
    """A ``log`` callable for ``run_quantize``: echoes each line, keeps a bar on a terminal's stderr."""

    def __init__(
        self,
        echo: Callable[[str], None],
        total_mib: float,
        stream: TextIO | None = None,
        tty: bool | None = None,
    ) -> None:
        self._echo = echo
        self._stream = stream if stream is not None else sys.stderr
        self._tty = self._stream.isatty() if tty is None else tty
        self._total = max(total_mib, 1e-9)
        self._done = 0.0
        self._t0 = time.monotonic()
        self._drawn = False

    def __call__(self, line: str) -> None:
        self._erase()
        self._echo(line)
        m = _LINE.match(line)
        if m is None or not self._tty:
            return
        self._done += float(m.group(3))
        self._draw(int(m.group(1)), int(m.group(2)))

    def bar(self, i: int, n: int) -> str:
        """The bar text after tensor i of n."""
        frac = 1.0 if i >= n else min(1.0, self._done / self._total)  # the lines' sizes are rounded
        fill = int(frac * _WIDTH)
        secs = int(time.monotonic() - self._t0)
        return f"[{'#' * fill}{'.' * (_WIDTH - fill)}] {frac * 100:5.1f}%  tensor {i}/{n}  {secs // 60:02d}:{secs % 60:02d}"

    def close(self) -> None:
        """Erase the bar (call when the run ends, also on error)."""
        self._erase()

    def _draw(self, i: int, n: int) -> None:
        self._stream.write("\r" + self.bar(i, n))
        self._stream.flush()
        self._drawn = True

    def _erase(self) -> None:
        if self._drawn:
            self._stream.write("\r\033[K")
            self._stream.flush()
            self._drawn = False
