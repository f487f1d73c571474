"""densitas: fast big-table exploration on GPUs and multicore CPUs.

The parallel primitives live in :mod:`densitas.primitives`; the backend layer (device resolution, array
conversion, dispatch, chunk planning) in :mod:`densitas._backend`.
"""

from __future__ import annotations

from densitas.exceptions import (
    DensitasError,
    DeviceError,
    InputError,
    NotFittedError,
    UnsupportedQueryError,
)

__version__ = "0.1.0"

__all__ = [
    "DensitasError",
    "DeviceError",
    "InputError",
    "NotFittedError",
    "UnsupportedQueryError",
    "__version__",
]
