"""Registers the Triton implementations without importing Triton until one is called.

(Triton reads ``TRITON_INTERPRET`` when kernels are defined, so the import must stay lazy.)
"""

from __future__ import annotations

from functools import partial

from densitas._backend.dispatch import lazy, register

_lazy = partial(lazy, "densitas.primitives._triton")

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
