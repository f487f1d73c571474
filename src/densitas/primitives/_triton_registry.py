"""Registers the Triton implementations without importing Triton until one is called.

(Triton reads ``TRITON_INTERPRET`` when kernels are defined, so the import must stay lazy.)
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from densitas._backend.dispatch import register


def _lazy(name: str) -> Callable:
    def call(*args, **kwargs):
        mod = importlib.import_module("densitas.primitives._triton")
        return getattr(mod, name)(*args, **kwargs)

    call.__name__ = name
    return call


register("reduce", "triton")(_lazy("reduce"))
register("scan", "triton")(_lazy("scan"))
register("segmented_scan", "triton")(_lazy("segmented_scan"))
register("reduce_by_key", "triton")(_lazy("reduce_by_key"))
register("compact", "triton")(_lazy("compact"))
# The split radix sort of document 002 runs on Triton scans, but CUB's radix sort behind torch.sort is faster
# on the H200 (benchmarks/RESULTS.md): "auto" keeps the library sort.
register("argsort", "triton", auto=False)(_lazy("argsort"))
register("histogram", "triton")(_lazy("histogram"))
register("summed_area_table", "triton")(_lazy("summed_area_table"))
