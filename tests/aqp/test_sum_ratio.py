"""The model's mean of an aggregated value per fine bin of a predicate column: each group's coarse sum-grid cell
means, shaped within the cells by the whole sample (many groups leave a sum grid few cells)."""

from __future__ import annotations

import duckdb
import numpy as np
import pandas as pd
import pytest

from densitas.aqp import Engine


def _synopsis(rng, g: np.ndarray, x: np.ndarray, y: np.ndarray, sql: str):
    """The loaded synopsis of a table (g, x, y and three noise columns that take sum-grid room) grouped by g,
    built at a budget that leaves its sum grids coarse, after one query ``sql``; and the connection."""
    df = pd.DataFrame({"g": g.astype(np.int32), "x": x, "y": y, **{f"z{i}": rng.normal(size=len(g)) for i in range(3)}})
    con = duckdb.connect()
    con.register("df", df)
    con.execute("CREATE TABLE t AS SELECT * FROM df")
    eng = Engine(con)
    eng.build("t", columns=["x", "y", "z0", "z1", "z2"], group_by=["g"], budget_bytes=120_000)
    eng.query(sql)
    return eng._cache["t"][0], con


def _cell_means(syn, u: int, key: tuple) -> np.ndarray:
    """(G, B_u + 1): each group's mean of ``key`` over the sum-grid cell of each fine bin of ``u`` (no shape)."""
    cmap, tot = syn.sums[u]
    return (tot[key] / np.maximum(tot[("n", None)], 1))[:, cmap]


def _fine_bins_and_groups(syn, u: int, x: np.ndarray, g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every table row's fine bin of column ``u`` and its synopsis group."""
    info = syn.infos[u]
    b = np.clip(np.searchsorted(info.edges, x, side="right"), 1, info.bins)
    gid = syn.groups.reset_index(drop=True).reset_index().set_index("g")["index"].loc[g].to_numpy()
    return b, gid


@pytest.fixture
def many_groups(rng):
    n, G = 120_000, 40
    g = rng.integers(0, G, n)
    x = rng.uniform(0, 100, n)
    y = 3 * x + 50 * np.sin(x / 8) + 40 * g + rng.normal(0, 5, n)  # the groups share the shape, not the level
    syn, con = _synopsis(rng, g, x, y, "SELECT SUM(y) AS s FROM t WHERE x < 50 GROUP BY g")
    yield syn, g, x, y
    con.close()


def test_sum_ratio_keeps_each_groups_sum_grid_cell_totals(many_groups):
    syn = many_groups[0]
    u, key = syn.index["x"], ("s", syn.index["y"])
    cmap, tot = syn.sums[u]
    assert cmap.max() * 2 < len(cmap)  # the budget leaves the sum grid coarse: the case the pooled shape is for
    ratio = syn._sum_ratio(u, key)
    cells = np.zeros_like(tot[key])
    for c in range(cells.shape[1]):
        cells[:, c] = (syn.fine[u] * ratio)[:, cmap == c].sum(axis=1)
    np.testing.assert_allclose(cells, tot[key], rtol=1e-9, atol=1e-6 * np.abs(tot[key]).max())


def test_sum_ratio_follows_the_shape_within_coarse_cells(many_groups):
    syn, g, x, y = many_groups
    u, key = syn.index["x"], ("s", syn.index["y"])
    b, gid = _fine_bins_and_groups(syn, u, x, g)
    G, B = syn.fine[u].shape
    num = np.bincount(gid * B + b, y, minlength=G * B).reshape(G, B)
    cnt = np.bincount(gid * B + b, minlength=G * B).reshape(G, B)
    truth = num / np.maximum(cnt, 1)
    flat = _cell_means(syn, u, key)  # each group's cell mean alone
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
    syn, con = _synopsis(rng, g, x, y, "SELECT SUM(y) AS s FROM t WHERE x < 50")
    u, key = syn.index["x"], ("s", syn.index["y"])
    cmap = syn.sums[u][0]
    assert cmap.max() * 2 < len(cmap)
    flat = _cell_means(syn, u, key)
    shape = syn._pooled_shape(u, key, flat)
    # the table's own departures per fine bin, every row counted once
    b, gid = _fine_bins_and_groups(syn, u, x, g)
    B = len(cmap)
    rows = np.bincount(b, minlength=B)
    truth = np.bincount(b, y - flat[gid, b], minlength=B) / np.maximum(rows, 1)
    err = np.average(np.abs(shape - truth)[1:], weights=rows[1:])
    spread = np.average(np.abs(truth)[1:], weights=rows[1:])  # what the flat cell means miss
    assert err < 0.3 * spread, (err, spread)
    con.close()


def test_non_null_shares_keep_their_cells(rng):
    n = 60_000
    x = rng.uniform(0, 100, n)
    y = np.where(rng.uniform(size=n) < x / 200, np.nan, x)  # NULLs grow with x
    syn, con = _synopsis(rng, rng.integers(0, 40, n), x, y, "SELECT COUNT(y) AS c FROM t WHERE x < 50")
    u, key = syn.index["x"], ("nn", syn.index["y"])
    share = syn._sum_ratio(u, key)
    np.testing.assert_array_equal(share, _cell_means(syn, u, key))
    assert share.min() >= 0 and share.max() <= 1
    con.close()


def test_an_avgs_key_is_the_sum_key_less_the_centre(many_groups):
    """An AVG's key ("d", j) sums each value less the column's mean in the table: its per-fine-bin model mean is
    the SUM key's less that centre wherever the bin holds rows, its unboxed total the SUM's less centre × rows."""
    syn, _, _, y = many_groups
    u, j = syn.index["x"], syn.index["y"]
    c = syn.centre[j]
    aside = syn.o_vals[:, j]  # rows stored whole: the grids, and so the centre, describe the others
    assert c == pytest.approx((y.sum() - aside.sum()) / (len(y) - len(aside)), rel=1e-9)
    rows = syn.fine[u] > 0
    np.testing.assert_allclose(syn._sum_ratio(u, ("d", j))[rows], syn._sum_ratio(u, ("s", j))[rows] - c,
                               rtol=1e-9, atol=1e-9 * abs(c))
    np.testing.assert_allclose(syn._unboxed_total(("d", j)), syn._unboxed_total(("s", j)) - c * syn.N, rtol=1e-9)
