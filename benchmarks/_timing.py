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


class StepClock:
    """A build's ``progress`` callback that prints each step's time since the start and since the previous step.

    >>> clock = StepClock()
    >>> clock("binned", 0.5)  # doctest: +ELLIPSIS
        0.0 s (+  0.0) binned
    """

    def __init__(self, indent: str = "") -> None:
        self.indent = indent
        self.start = self.last = time.perf_counter()

    def __call__(self, step: str, frac: float) -> None:
        now = time.perf_counter()
        print(f"{self.indent}{now - self.start:7.1f} s (+{now - self.last:5.1f}) {step}", flush=True)
        self.last = now
