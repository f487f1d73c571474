"""Registers the Triton counting-sort scatter without importing Triton until it is called.

(Triton reads ``TRITON_INTERPRET`` when kernels are defined, so the import must stay lazy.)
"""

from __future__ import annotations

from densitas._backend.dispatch import lazy, register

register("cluster_counting_scatter", "triton")(lazy("densitas.cluster._triton", "counting_scatter"))
