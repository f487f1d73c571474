"""Shared timing helpers for the benchmark scripts (median of repeats; CUDA events via triton.testing)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


def bench(fn: Callable[[], object], device: torch.device, reps: int = 10) -> float:
    """Median seconds of ``fn``: ``triton.testing.do_bench`` on CUDA, perf_counter medians on the CPU."""
    if device.type == "cuda":
        from triton.testing import do_bench

        return do_bench(fn, warmup=50, rep=300, return_mode="median") / 1e3
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)
