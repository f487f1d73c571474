"""Registers the Triton pair sums without importing Triton until one is called (Triton reads
``TRITON_INTERPRET`` when kernels are defined, so the import must stay lazy)."""

from __future__ import annotations

import importlib
from collections.abc import Callable

from densitas._backend.dispatch import register


def _lazy(name: str) -> Callable:
    def call(*args, **kwargs):
        mod = importlib.import_module("densitas.kde._triton")
        return getattr(mod, name)(*args, **kwargs)

    call.__name__ = name
    return call


register("kde_hermite_pairsum", "triton")(_lazy("hermite_pairsum"))
register("kde_gauss_pairsum", "triton")(_lazy("gauss_pairsum"))
