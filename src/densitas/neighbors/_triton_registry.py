"""Registers the fused Triton kernel for ``knn_tile_topk`` without importing Triton until it is called.

(Triton reads ``TRITON_INTERPRET`` when kernels are defined, so the import must stay lazy.)
"""

from __future__ import annotations

from densitas._backend.dispatch import lazy, register

register("knn_tile_topk", "triton")(lazy("densitas.neighbors._triton", "tile_topk"))
