"""Registers the Triton pair sums without importing Triton until one is called (Triton reads
``TRITON_INTERPRET`` when kernels are defined, so the import must stay lazy)."""

from __future__ import annotations

from functools import partial

from densitas._backend.dispatch import lazy, register

_lazy = partial(lazy, "densitas.kde._triton")

register("kde_hermite_pairsum", "triton")(_lazy("hermite_pairsum"))
register("kde_gauss_pairsum", "triton")(_lazy("gauss_pairsum"))
register("kde_gauss_pairsum_grad", "triton")(_lazy("gauss_pairsum_grad"))
register("kde_pair_histogram", "triton")(_lazy("pair_histogram"))
register("kde_lscv_grid_search", "triton")(_lazy("lscv_grid_search"))
