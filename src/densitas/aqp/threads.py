"""One BLAS thread while a query is answered.

A query's matrix products are small (a few terms by at most the sample's rows, about 10⁶ multiply-adds): a
second BLAS thread saves little on an idle machine, and on a loaded one every threaded product waits for a
descheduled thread. On this project's 2-core machine with one core busy, three-column queries took 12.7 ms with
OpenBLAS's two threads and 5.3 ms with one (mean per query; benchmarks/RESULTS.md, "Query latency, third
pass"). This is the
AQP counterpart of the CPU thread policy of :mod:`densitas._backend.policy` (one thread below 2²⁵ elements of
work), applied to the BLAS that NumPy loads, through threadpoolctl (a dependency of scikit-learn).

``DENSITAS_THREADS`` overrides as there: an int ≥ 1 fixes the BLAS thread count during a query, ``"torch"``
keeps the BLAS library's own setting.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator

from densitas.exceptions import InputError

__all__ = ["query_blas_threads"]


class _State:
    """The BLAS libraries' controllers (found once), the blocks open now in the main thread and the thread
    counts before the first of them."""

    def __init__(self) -> None:
        self.depth = 0
        self.controllers: list | None = None
        self.saved: list[int] = []


_STATE = _State()


def _wanted() -> int | None:
    """The BLAS thread count a query runs with (None: leave the library's setting)."""
    env = os.environ.get("DENSITAS_THREADS", "auto").strip().lower() or "auto"
    if env == "auto":
        return 1
    if env == "torch":
        return None
    if not env.isdigit() or int(env) < 1:
        raise InputError(f"DENSITAS_THREADS must be 'auto', 'torch' or an int ≥ 1. Got {env!r} instead.")
    return int(env)


def _controllers() -> list:
    if _STATE.controllers is None:
        from threadpoolctl import ThreadpoolController

        _STATE.controllers = ThreadpoolController().select(user_api="blas").lib_controllers
    return _STATE.controllers


@contextlib.contextmanager
def query_blas_threads() -> Iterator[None]:
    """Run the block with one BLAS thread (or ``DENSITAS_THREADS``), restoring the previous counts afterwards.

    Only in the main thread: a count set from another thread did not take effect (NumPy 2.4's OpenBLAS 0.3.31),
    so blocks in other threads run with the library's setting. Nested blocks share the outermost one's.

    Examples
    --------
    >>> import numpy as np
    >>> with query_blas_threads():
    ...     float((np.ones((3, 3)) @ np.ones(3))[0])
    3.0
    """
    wanted = _wanted()
    if wanted is None or threading.current_thread() is not threading.main_thread():
        yield
        return
    if _STATE.depth == 0:
        libs = _controllers()
        _STATE.saved = [lib.get_num_threads() for lib in libs]
        for lib, had in zip(libs, _STATE.saved, strict=True):
            if had != wanted:
                lib.set_num_threads(wanted)
    _STATE.depth += 1
    try:
        yield
    finally:
        _STATE.depth -= 1
        if _STATE.depth == 0:
            for lib, had in zip(_controllers(), _STATE.saved, strict=True):
                if had != wanted:
                    lib.set_num_threads(had)
