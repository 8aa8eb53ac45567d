"""release_worker_threads: the calling thread's OpenMP workers end, and kernels still run afterwards."""

from __future__ import annotations

import os
import threading

import numba
import numpy as np
from gguf import GGMLQuantizationType as T

from llama_quant import quantize
from llama_quant.kernels import ExactMatrix, release_worker_threads


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _product() -> np.ndarray:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((256, 256)).astype(np.float32)
    m = ExactMatrix(quantize(w, T.Q8_0), T.Q8_0, 256, 256)
    return m.matvec(np.ones(256, np.float32))


def test_release_ends_the_callers_workers_and_kernels_still_run() -> None:
    results: dict[str, object] = {}

    def on_fresh_thread() -> None:  # a thread of its own: its team is not shared with other tests
        first = _product()  # a parallel kernel: this thread now has a team of workers
        before = _threads()
        results["released"] = release_worker_threads()
        results["fewer"] = _threads() < before
        results["same"] = np.array_equal(_product(), first)

    t = threading.Thread(target=on_fresh_thread)
    t.start()
    t.join()
    assert results["same"]
    if numba.threading_layer() == "omp" and numba.get_num_threads() > 1:
        assert results["released"] and results["fewer"]
    else:
        assert results["released"] is False
