"""bandwidth() routes Dask input to densitas.kde.distributed."""

from __future__ import annotations

import dask.array as da
import numpy as np

from densitas.kde import bandwidth
from densitas.kde import distributed as kd


def test_bandwidth_routes_dask_input_to_the_cluster_path(monkeypatch):
    """``bandwidth`` hands a Dask array to ``bandwidth_dask`` (never computing it on the client) and answers as
    on the in-memory array."""
    x = np.random.default_rng(7).normal(size=3000)
    calls = []
    real = kd.bandwidth_dask
    monkeypatch.setattr(kd, "bandwidth_dask", lambda *a, **k: calls.append(1) or real(*a, **k))
    got = bandwidth(da.from_array(x, chunks=700), "plugin", device="cpu")
    assert calls == [1]
    assert got == bandwidth(x, "plugin", device="cpu")
