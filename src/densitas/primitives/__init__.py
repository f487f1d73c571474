"""Parallel primitives (source document 002, plus what the capabilities need).

Each operation has a PyTorch implementation (the CPU path and the test oracle) and, where it beats the
library on a GPU, a Triton kernel; :mod:`densitas._backend.dispatch` chooses.
"""

from __future__ import annotations

from densitas.primitives import (
    _torch,  # noqa: F401  (registers the PyTorch implementations)
    _triton_registry,  # noqa: F401  (registers the Triton implementations, lazily)
)
from densitas.primitives.api import (
    box_sum,
    compact,
    histogram,
    radix_sort,
    reduce,
    reduce_by_key,
    scan,
    segmented_scan,
    summed_area_table,
)

__all__ = [
    "box_sum",
    "compact",
    "histogram",
    "radix_sort",
    "reduce",
    "reduce_by_key",
    "scan",
    "segmented_scan",
    "summed_area_table",
]
