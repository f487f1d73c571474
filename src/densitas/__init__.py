"""densitas: fast big-table exploration on GPUs and multicore CPUs.

The parallel primitives live in :mod:`densitas.primitives`; the backend layer (device resolution, array
conversion, dispatch, chunk planning) in :mod:`densitas._backend`.
"""

from __future__ import annotations

import os as _os

# PyTorch's CPU allocator madvises transparent huge pages for large tensors only when asked (NumPy always
# does). Without it every large temporary costs a storm of page faults: 3x slower elementwise work on
# machines like CI's. Read lazily by PyTorch at its first large allocation; an explicit setting wins.
_os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

from densitas.exceptions import (
    DatabaseError,
    DensitasError,
    DeviceError,
    InputError,
    NoSynopsisError,
    NotFittedError,
    ResultTooLargeError,
    StaleSynopsisError,
    UnsupportedQueryError,
)

__version__ = "0.1.0"

__all__ = [
    "DatabaseError",
    "DensitasError",
    "DeviceError",
    "InputError",
    "NoSynopsisError",
    "NotFittedError",
    "ResultTooLargeError",
    "StaleSynopsisError",
    "UnsupportedQueryError",
    "__version__",
]
