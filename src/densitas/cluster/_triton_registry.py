"""Registers the Triton kernels of :mod:`densitas.cluster` (the counting-sort scatter, the fused pass and the
fused iterations) without importing Triton until one is called.

(Triton reads ``TRITON_INTERPRET`` when kernels are defined, so the import must stay lazy.)
"""

from __future__ import annotations

from densitas._backend.dispatch import lazy, register

register("cluster_counting_scatter", "triton")(lazy("densitas.cluster._triton", "counting_scatter"))
register("cluster_fused_pass", "triton")(lazy("densitas.cluster._triton", "fused_pass"))
register("cluster_fused_iterations", "triton")(lazy("densitas.cluster._triton", "fused_iterations"))
