"""The model's mean of an aggregated value per fine bin of a predicate column: each group's coarse sum-grid cell
means, shaped within the cells by the whole sample (many groups leave a sum grid few cells)."""

from __future__ import annotations

import duckdb
import numpy as np
import pandas as pd
import pytest

from densitas.aqp import Engine


@pytest.fixture
def many_groups(rng):
    n, G = 120_000, 40
    g = rng.integers(0, G, n)
    x = rng.uniform(0, 100, n)
    y = 3 * x + 50 * np.sin(x / 8) + 40 * g + rng.normal(0, 5, n)  # the groups share the shape, not the level
    df = pd.DataFrame({"g": g.astype(np.int32), "x": x, "y": y,  # and three columns that take sum-grid room
                       **{f"z{i}": rng.normal(size=n) for i in range(3)}})
    con = duckdb.connect()
    con.register("df", df)
    con.execute("CREATE TABLE t AS SELECT * FROM df")
    eng = Engine(con)
    eng.build("t", columns=["x", "y", "z0", "z1", "z2"], group_by=["g"], budget_bytes=120_000)
    eng.query("SELECT SUM(y) AS s FROM t WHERE x < 50 GROUP BY g")
    syn = eng._cache["t"][0]
    yield syn, df
    con.close()


def test_sum_ratio_keeps_each_groups_sum_grid_cell_totals(many_groups):
    syn, _ = many_groups
    u, key = syn.index["x"], ("s", syn.index["y"])
    cmap, tot = syn.sums[u]
    assert cmap.max() * 2 < len(cmap)  # the budget leaves the sum grid coarse: the case the pooled shape is for
    ratio = syn._sum_ratio(u, key)
    cells = np.zeros_like(tot[key])
    for c in range(cells.shape[1]):
        cells[:, c] = (syn.fine[u] * ratio)[:, cmap == c].sum(axis=1)
    np.testing.assert_allclose(cells, tot[key], rtol=1e-9, atol=1e-6 * np.abs(tot[key]).max())


def test_sum_ratio_follows_the_shape_within_coarse_cells(many_groups):
    syn, df = many_groups
    u, key = syn.index["x"], ("s", syn.index["y"])
    info = syn.infos[u]
    b = np.clip(np.searchsorted(info.edges, df["x"].to_numpy(), side="right"), 1, info.bins)
    gid = syn.groups.reset_index(drop=True).reset_index().set_index("g")["index"].loc[df["g"]].to_numpy()
    G, B = syn.fine[u].shape
    num = np.bincount(gid * B + b, df["y"].to_numpy(), minlength=G * B).reshape(G, B)
    cnt = np.bincount(gid * B + b, minlength=G * B).reshape(G, B)
    truth = num / np.maximum(cnt, 1)
    cmap, tot = syn.sums[u]
    flat = (tot[key] / np.maximum(tot[("n", None)], 1))[:, cmap]  # each group's cell mean alone
    ratio = syn._sum_ratio(u, key)
    w = cnt[:, 1:]
    err_flat = (w * np.abs(flat - truth)[:, 1:]).sum() / w.sum()
    err = (w * np.abs(ratio - truth)[:, 1:]).sum() / w.sum()
    assert err < 0.25 * err_flat, (err, err_flat)
