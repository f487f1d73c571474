"""Device policy in one place: the choices that depend on where the data live (which engine, which routine),
so that capabilities never branch on ``device.type`` themselves.

Each figure here comes from a measurement recorded in ``benchmarks/RESULTS.md``; change it there and here.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
import torch

from densitas._blas import threads_override

__all__ = ["PARALLEL_MIN_WORK", "DevicePolicy", "cpu_threads", "device_policy", "quantile", "single_threaded",
           "thread_policy"]


@dataclass(frozen=True)
class DevicePolicy:
    """What a capability should do on one kind of device.

    Attributes
    ----------
    kind : str
        ``"cpu"`` or ``"cuda"``.
    exact_max_rows : int
        ``engine="auto"`` of the KDE selectors runs the exact O(n²) pair sums up to this many (weighted) rows
        and the binned engine beyond (the exact engine's time reaches the binned one's near these sizes:
        benchmarks/RESULTS.md, ``bench_kde.py``).
    numpy_quantile_above : int
        Quantiles of a tensor with more elements than this go through NumPy (introselect, O(n), after one copy
        to the host) instead of :func:`torch.quantile` (a full sort on the device). On the CPU NumPy always
        wins (0: always); on CUDA the device sort wins until the sort's memory and time exceed one transfer.

    Examples
    --------
    >>> device_policy(torch.device("cpu")).exact_max_rows
    20000
    """

    kind: str
    exact_max_rows: int
    numpy_quantile_above: int


_POLICIES = {
    "cpu": DevicePolicy("cpu", exact_max_rows=20_000, numpy_quantile_above=0),
    "cuda": DevicePolicy("cuda", exact_max_rows=1_000_000, numpy_quantile_above=16_000_000),
}


def device_policy(device: torch.device | str) -> DevicePolicy:
    """The :class:`DevicePolicy` of ``device`` (devices other than CUDA follow the CPU's).

    Examples
    --------
    >>> device_policy("cuda:0").kind
    'cuda'
    """
    kind = torch.device(device).type
    return _POLICIES["cuda" if kind == "cuda" else "cpu"]


def quantile(x: torch.Tensor, q: float) -> float:
    """The ``q`` quantile of the 1-D tensor ``x`` with NumPy's default (linear) rule, computed where it is
    cheapest for ``x``'s device (:attr:`DevicePolicy.numpy_quantile_above`).

    Examples
    --------
    >>> quantile(torch.tensor([4.0, 1.0, 3.0, 2.0]), 0.5)
    2.5
    """
    if x.numel() > device_policy(x.device).numpy_quantile_above:
        return float(np.quantile(x.detach().cpu().numpy(), q))
    return float(torch.quantile(x, q))


# ------------------------------------------------------------------------------------------ CPU threads

#: Work (elements a call touches: pair evaluations for the exact pair sums) below which a CPU call runs on one
#: thread. Such a call takes well under a second on one core, so a second thread could save little, while on a
#: loaded machine every parallel region waits for a descheduled thread: 5,000 rows took 18.6 s with two threads
#: and 0.14 s with one on a busy 2-core machine (benchmarks/bench_kde_load.py, RESULTS.md).
PARALLEL_MIN_WORK = 1 << 25


def _free_cores(cores: int) -> float:
    """Cores the other processes leave free: the core count minus the 1-minute load average, plus one for
    this process's own running thread (which the load counts). The core count when the load is unknown."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return float(cores)
    return cores - load + 1.0


def cpu_threads(work: float, *, default: int | None = None) -> int:
    """Threads a CPU call touching ``work`` elements should use: one below :data:`PARALLEL_MIN_WORK`;
    otherwise PyTorch's setting, capped by the cores other processes leave free (so that a loaded machine
    degrades gracefully instead of stalling every parallel region on a descheduled thread).

    ``DENSITAS_THREADS`` overrides: an int ≥ 1 fixes the count, ``"torch"`` keeps PyTorch's own setting.

    Examples
    --------
    >>> cpu_threads(1000)
    1
    """
    default = torch.get_num_threads() if default is None else default
    setting = threads_override()
    if setting == "torch":
        return default
    if setting != "auto":
        return setting
    if work < PARALLEL_MIN_WORK:
        return 1
    cores = os.cpu_count() or 1
    return max(1, min(default, math.floor(_free_cores(cores))))


@contextlib.contextmanager
def thread_policy(device: torch.device | str, work: float) -> Iterator[int]:
    """Run the block with :func:`cpu_threads` PyTorch threads when ``device`` is the CPU, restoring the
    previous count afterwards. Yields the thread count in force.

    ``torch.set_num_threads`` is process-wide, so blocks that overlap (nested calls, or calls from several
    Python threads at once) share one setting: the first to enter chooses it, the last to leave restores it.

    Examples
    --------
    >>> with thread_policy("cpu", 10) as threads:
    ...     threads == torch.get_num_threads() == 1
    True
    """
    if torch.device(device).type != "cpu":
        yield torch.get_num_threads()
        return
    with _shared_threads(lambda saved: cpu_threads(work, default=saved)) as current:
        yield current


@contextlib.contextmanager
def single_threaded() -> Iterator[int]:
    """Run the block with one PyTorch thread, restoring the previous count afterwards; overlapping blocks share
    one setting with :func:`thread_policy`'s (the first to enter chooses, the last to leave restores). For code
    that runs its own threads: the classic CPU fuzzy c-means fit, whose pass threads PyTorch's OpenMP threads
    would otherwise spin against. Yields the thread count in force.

    Examples
    --------
    >>> with single_threaded() as threads:
    ...     threads == torch.get_num_threads() == 1
    True
    """
    with _shared_threads(lambda saved: 1) as current:
        yield current


@contextlib.contextmanager
def _shared_threads(choose: Callable[[int], int]) -> Iterator[int]:
    """The first of the overlapping blocks sets PyTorch's thread count to ``choose(count before)``; the last to
    leave puts it back."""
    with _THREADS.lock:
        if _THREADS.depth == 0:
            _THREADS.saved = torch.get_num_threads()
            threads = choose(_THREADS.saved)
            if threads != _THREADS.saved:
                torch.set_num_threads(threads)
        _THREADS.depth += 1
        current = torch.get_num_threads()
    try:
        yield current
    finally:
        with _THREADS.lock:
            _THREADS.depth -= 1
            if _THREADS.depth == 0 and torch.get_num_threads() != _THREADS.saved:
                torch.set_num_threads(_THREADS.saved)


@dataclass
class _ThreadState:
    lock: threading.Lock = field(default_factory=threading.Lock)
    depth: int = 0  # policy blocks open now, in any Python thread
    saved: int = 1  # the count before the first of them


_THREADS = _ThreadState()
