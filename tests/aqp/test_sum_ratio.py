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


def test_pooled_shape_weights_each_groups_rows_by_its_sampling_rate(rng):
    # one large group rising within the cells, 30 small ones falling: the small groups are sampled at the
    # 200-row floor (2/3 of their rows), the large one at a small rate, so unweighted sample rows would mostly
    # follow the small groups while the table mostly follows the large one
    big, small, k = 100_000, 300, 30
    g = np.r_[np.zeros(big, dtype=np.int32), np.repeat(np.arange(1, k + 1, dtype=np.int32), small)]
    x = rng.uniform(0, 100, len(g))
    y = np.where(g == 0, 3 * x, -3 * x) + rng.normal(0, 1, len(g))
    df = pd.DataFrame({"g": g, "x": x, "y": y, **{f"z{i}": rng.normal(size=len(g)) for i in range(3)}})
    con = duckdb.connect()
    con.register("df", df)
    con.execute("CREATE TABLE t AS SELECT * FROM df")
    eng = Engine(con)
    eng.build("t", columns=["x", "y", "z0", "z1", "z2"], group_by=["g"], budget_bytes=120_000)
    eng.query("SELECT SUM(y) AS s FROM t WHERE x < 50")
    syn = eng._cache["t"][0]
    u, key = syn.index["x"], ("s", syn.index["y"])
    cmap, tot = syn.sums[u]
    assert cmap.max() * 2 < len(cmap)
    flat = (tot[key] / np.maximum(tot[("n", None)], 1))[:, cmap]
    shape = syn._pooled_shape(u, key, flat)
    # the table's own departures per fine bin, every row counted once
    info = syn.infos[u]
    b = np.clip(np.searchsorted(info.edges, x, side="right"), 1, info.bins)
    gid = syn.groups.reset_index(drop=True).reset_index().set_index("g")["index"].loc[g].to_numpy()
    dep = y - flat[gid, b]
    B = len(cmap)
    truth = np.bincount(b, dep, minlength=B) / np.maximum(np.bincount(b, minlength=B), 1)
    rows = np.bincount(b, minlength=B)[1:]
    err = np.average(np.abs(shape - truth)[1:], weights=rows)
    spread = np.average(np.abs(truth)[1:], weights=rows)  # what the flat cell means miss
    assert err < 0.3 * spread, (err, spread)
    con.close()


def test_non_null_shares_keep_their_cells(rng):
    n = 60_000
    x = rng.uniform(0, 100, n)
    y = np.where(rng.uniform(size=n) < x / 200, np.nan, x)  # NULLs grow with x
    df = pd.DataFrame({"g": rng.integers(0, 40, n).astype(np.int32), "x": x, "y": y,
                       **{f"z{i}": rng.normal(size=n) for i in range(3)}})
    con = duckdb.connect()
    con.register("df", df)
    con.execute("CREATE TABLE t AS SELECT * FROM df")
    eng = Engine(con)
    eng.build("t", columns=["x", "y", "z0", "z1", "z2"], group_by=["g"], budget_bytes=120_000)
    eng.query("SELECT COUNT(y) AS c FROM t WHERE x < 50")
    syn = eng._cache["t"][0]
    u, key = syn.index["x"], ("nn", syn.index["y"])
    cmap, tot = syn.sums[u]
    share = syn._sum_ratio(u, key)
    np.testing.assert_array_equal(share, (tot[key] / np.maximum(tot[("n", None)], 1))[:, cmap])
    assert share.min() >= 0 and share.max() <= 1
    con.close()
