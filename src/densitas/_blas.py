"""The BLAS libraries NumPy loaded, on a chosen number of threads for a block (torch-free: the AQP engine uses it
without importing PyTorch; the CPU fuzzy c-means pass too)."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

from densitas.exceptions import InputError

__all__ = ["blas_threads", "threads_override"]


def threads_override() -> str | int:
    """The ``DENSITAS_THREADS`` setting: ``"auto"`` (unset or empty), ``"torch"`` (the libraries' own setting) or
    an int ≥ 1 (a fixed thread count); anything else is an :class:`~densitas.exceptions.InputError`.

    Examples
    --------
    >>> setting = threads_override()          # 'auto' unless DENSITAS_THREADS is set
    >>> setting in ("auto", "torch") or setting >= 1
    True
    """
    env = os.environ.get("DENSITAS_THREADS", "auto").strip().lower() or "auto"
    if env in ("auto", "torch"):
        return env
    if not env.isdigit() or int(env) < 1:
        raise InputError(f"DENSITAS_THREADS must be 'auto', 'torch' or an int ≥ 1. Got {env!r} instead.")
    return int(env)


@dataclass
class _BlasState:
    """The BLAS libraries NumPy loaded (found once through threadpoolctl, a dependency of scikit-learn) and
    the :func:`blas_threads` blocks open now."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    depth: int = 0  # blocks open now, in any Python thread
    saved_counts: list[int] = field(default_factory=list)  # the counts before the first of them
    libs: list | None = None

    def controllers(self) -> list:
        if self.libs is None:
            from threadpoolctl import ThreadpoolController

            self.libs = ThreadpoolController().select(user_api="blas").lib_controllers
        return self.libs


_BLAS = _BlasState()


@contextlib.contextmanager
def blas_threads(n: int) -> Iterator[None]:
    """Run the block with the BLAS libraries NumPy loaded (OpenBLAS, MKL) on ``n`` threads, restoring their
    previous counts afterwards: for small products run from several Python threads or on a loaded machine, where
    the library's own pool only waits. Overlapping blocks share the first one's count; the last to leave restores.
    A count set from a thread other than the main one may not take effect (OpenBLAS keeps it per thread).

    Examples
    --------
    >>> import numpy as np
    >>> with blas_threads(1):
    ...     float((np.ones((3, 3)) @ np.ones(3))[0])
    3.0
    """
    with _BLAS.lock:
        if _BLAS.depth == 0:
            libs = _BLAS.controllers()
            _BLAS.saved_counts = [lib.get_num_threads() for lib in libs]
            for lib, had in zip(libs, _BLAS.saved_counts, strict=True):
                if had != n:
                    lib.set_num_threads(n)
        _BLAS.depth += 1
    try:
        yield
    finally:
        with _BLAS.lock:
            _BLAS.depth -= 1
            if _BLAS.depth == 0:
                for lib, had in zip(_BLAS.controllers(), _BLAS.saved_counts, strict=True):
                    if lib.get_num_threads() != had:
                        lib.set_num_threads(had)

