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
import threading
from collections.abc import Iterator

from densitas._blas import blas_threads, threads_override

__all__ = ["query_blas_threads"]


def _wanted() -> int | None:
    """The BLAS thread count a query runs with (None: leave the library's setting)."""
    setting = threads_override()
    return 1 if setting == "auto" else None if setting == "torch" else setting


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
    with blas_threads(wanted):
        yield
