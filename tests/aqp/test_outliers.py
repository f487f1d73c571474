"""Rows set aside whole (outlier indexing): which rows, and that every answer counts them exactly once.

The reference is a NumPy re-derivation of the build's rule (:func:`densitas.aqp.build.find_outliers`) on the
table's values and exact DuckDB answers. Random tables print their seed on failure; replay with
``DENSITAS_TEST_SEED``.
"""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pandas as pd
import pytest

from densitas.aqp import build as build_mod
from densitas.aqp import store

SEED = int(os.environ.get("DENSITAS_TEST_SEED", "20261123"))
ROWS = 30_000
SAMPLE = 1_500  # N/n = 20: c = sqrt(20), about 4.5 deviations


def heavy_table(seed: int, rows: int = ROWS) -> pd.DataFrame:
    """A Zipf-like count ``y`` (P(y >= k) ~ k^-1.2: no finite variance below its cap; few distinct values, so a
    discrete column), a light-tailed ``x`` (uniform), a normal ``z`` with a few NULLs, a Pareto ``w`` (continuous)
    and a group ``g``."""
    rng = np.random.default_rng(seed)
    y = np.minimum(np.floor(rng.random(rows) ** (-1 / 1.2)), 5_000).astype(np.int64)
    z = rng.normal(50, 5, rows)
    z[rng.random(rows) < 0.02] = np.nan
    return pd.DataFrame({"x": rng.random(rows) * 100, "y": y, "z": pd.Series(z).astype("Float64"),
                         "w": (1 - rng.random(rows)) ** (-1 / 1.5),
                         "g": np.array(["a", "b", "c"])[rng.integers(0, 3, rows)]})


def reference_rule(frame: pd.DataFrame, cols: list[str], n_sample: int) -> list[tuple[float, float] | None]:
    """The build's rule in NumPy: bounds at mean ± c·sd of the rows within them (a fixed point), c = sqrt(N/n),
    widened alike on every column (in units of c·sd) where more than a tenth of the sample's rows lie outside:
    to the distance of the row that would be one too many (a hair beyond, so that it and its ties stay)."""
    n_rows = len(frame)
    c = math.sqrt(n_rows / n_sample)
    vals = {k: frame[k].to_numpy(dtype=np.float64, na_value=np.nan) for k in cols}
    centre: dict = {}
    for _ in range(build_mod.OUTLIER_ROUNDS):
        moved = False
        for k in cols:
            v = vals[k][~np.isnan(vals[k])]  # SQL's AVG and STDDEV_POP skip NULLs
            if k in centre:
                v = v[np.abs(v - centre[k][0]) <= c * centre[k][1]]
            m, sd = v.mean(), v.std()
            if len(v) and v.min() != v.max() and centre.get(k) != (m, sd):
                centre[k], moved = (m, sd), True
        if not moved:
            break
    dist = np.max([np.nan_to_num(np.abs(vals[k] - centre[k][0]) / (c * centre[k][1])) for k in cols], axis=0)
    cap = int(build_mod.OUTLIER_SHARE * n_sample)
    t = 1.0 if (dist > 1).sum() <= cap else max(1.0, float(np.sort(dist)[::-1][cap])) * (1 + 1e-9)  # ties stay
    return [(centre[k][0] - t * c * centre[k][1], centre[k][0] + t * c * centre[k][1]) for k in cols]


def _load(eng, frame: pd.DataFrame) -> None:
    eng.con.execute("CREATE TABLE t (x FLOAT8, y BIGINT, z FLOAT8, w FLOAT8, g VARCHAR)")
    eng.con.insert_frame(build_mod.table_expr("t"), frame)


def test_the_rows_set_aside_are_those_of_the_rule(any_engine):
    """DuckDB and PostgreSQL: the stored bounds are NumPy's fixed point, the outliers table holds exactly the rows
    outside them, and each group's row count no longer counts them."""
    frame = heavy_table(SEED)
    _load(any_engine, frame)
    meta = any_engine.build("t", ["x", "y", "z"], ["g"], sample_size=SAMPLE, seed=5)
    want = reference_rule(frame, ["x", "y", "z"], SAMPLE)
    got = json.loads(meta["options"])["outliers"]
    msg = f"seed {SEED}: stored {got}, NumPy {want}"
    for k in range(3):  # with the cap binding, every column's bounds widen alike
        assert got[k] == pytest.approx(list(want[k]), rel=1e-9), msg
    assert want[0][0] < 0 and want[0][1] > 100 and want[2][1] > frame["z"].max(), msg  # light tails: none outside
    st = store.read(any_engine.con, "t")
    lo, hi = got[1]
    y = frame["y"].to_numpy()
    outside = (y < lo) | (y > hi)
    assert 0 < outside.sum() <= build_mod.OUTLIER_SHARE * SAMPLE, msg
    assert np.array_equal(np.sort(st.outlier_vals[:, 1]), np.sort(y[outside].astype(float))), msg
    per_group = frame.groupby("g").size().to_numpy()
    aside = np.bincount(st.outlier_gid, minlength=3)
    assert np.array_equal(st.groups["n"].to_numpy() + aside, per_group), msg


@pytest.mark.parametrize("seed", [SEED, SEED + 7])
def test_every_answer_counts_the_rows_set_aside_once(mem_engine, seed):
    """Whole-table answers (the histograms' exact totals plus the rows set aside) are exact, and so is a box
    that holds the set-aside rows only; a mutation that drops them, or counts them twice, fails."""
    frame = heavy_table(seed)
    _load(mem_engine, frame)
    meta = mem_engine.build("t", ["x", "y", "z"], ["g"], sample_size=SAMPLE, seed=seed % 1000)
    hi = json.loads(meta["options"])["outliers"][1][1]
    for sql in ("SELECT g, COUNT(*) AS v FROM t GROUP BY g", "SELECT g, SUM(y) AS v FROM t GROUP BY g",
                "SELECT AVG(y) AS v FROM t", "SELECT AVG(z) AS v FROM t",
                f"SELECT g, COUNT(*) AS v FROM t WHERE y > {hi} GROUP BY g",
                f"SELECT g, SUM(y) AS v FROM t WHERE y > {hi} AND x < 50 GROUP BY g",  # the box cuts them
                f"SELECT COUNT(*) AS v FROM t WHERE y > {hi} AND z >= 50",
                f"SELECT SUM(y) AS v FROM t WHERE y > {hi}", f"SELECT AVG(y) AS v FROM t WHERE y > {hi}"):
        apx, ex = mem_engine.query(sql), mem_engine.exact(sql)
        if "g" in ex.columns:
            ex, apx = ex.sort_values("g"), apx.sort_values("g")
        assert apx["v"].to_numpy(dtype=float) == pytest.approx(ex["v"].to_numpy(dtype=float), rel=1e-9), \
            f"seed {seed}: {sql}"


def test_light_tails_set_nothing_aside(mem_engine):
    mem_engine.con.execute("CREATE TABLE t AS SELECT (i % 1000)::DOUBLE AS x, ((i * 7) % 997)::DOUBLE AS y "
                           "FROM range(40000) r(i)")
    mem_engine.build("t", sample_size=1_000)
    assert len(store.read(mem_engine.con, "t").outlier_gid) == 0


def test_outliers_can_be_switched_off(mem_engine):
    _load(mem_engine, heavy_table(SEED))
    meta = mem_engine.build("t", ["x", "y"], sample_size=SAMPLE, outliers=False)
    assert json.loads(meta["options"])["outliers"] == [None, None]
    assert len(store.read(mem_engine.con, "t").outlier_gid) == 0


def test_a_refresh_sets_appended_rows_aside_by_the_build_rule(mem_engine):
    """Appended rows beyond the stored bounds join the outliers, the others the grids: whole-table answers stay
    exact and the bounds stay those of the build."""
    frame = heavy_table(SEED)
    _load(mem_engine, frame.iloc[:20_000])
    meta = mem_engine.build("t", ["x", "w", "z"], ["g"], sample_size=1_000, seed=3)
    bounds = json.loads(meta["options"])["outliers"]
    before = len(store.read(mem_engine.con, "t").outlier_gid)
    mem_engine.con.insert_frame(build_mod.table_expr("t"), frame.iloc[20_000:])
    res = mem_engine.refresh("t")
    assert res["refresh"] == "merged", res.get("refresh_reason")
    assert json.loads(res["options"])["outliers"] == bounds
    st = store.read(mem_engine.con, "t")
    w = frame["w"].to_numpy()
    lo, hi = bounds[1]
    assert len(st.outlier_gid) == int(((w < lo) | (w > hi)).sum()) > before
    for sql in ("SELECT g, SUM(w) AS v FROM t GROUP BY g ORDER BY g", "SELECT COUNT(*) AS v FROM t",
                f"SELECT g, AVG(w) AS v FROM t WHERE w > {hi} GROUP BY g ORDER BY g"):
        assert mem_engine.query(sql)["v"].to_numpy(dtype=float) == pytest.approx(
            mem_engine.exact(sql)["v"].to_numpy(dtype=float), rel=1e-9), sql


def test_a_refresh_whose_rows_lie_beyond_the_bounds_rebuilds(mem_engine):
    """Appended rows far beyond the bounds in numbers (the distribution moved) are not stored whole without
    limit: the refresh rebuilds, and the rebuilt synopsis keeps to the cap."""
    frame = heavy_table(SEED)
    _load(mem_engine, frame.iloc[:20_000])
    mem_engine.build("t", ["x", "w"], sample_size=1_000, seed=3)
    moved = frame.iloc[20_000:].assign(w=lambda d: d["w"] + 1e4)
    mem_engine.con.insert_frame(build_mod.table_expr("t"), moved)
    res = mem_engine.refresh("t")
    assert res["refresh"] == "rebuilt" and "beyond the build's bounds" in res["refresh_reason"]
    assert len(store.read(mem_engine.con, "t").outlier_gid) <= build_mod.OUTLIER_SHARE * 1_000


@pytest.mark.parametrize("shape", ["flag", "constant"])
def test_the_cap_holds_where_the_rest_has_no_spread(any_engine, shape):
    """A rare 0/1 flag, or a constant with a few far values: once those are out, the rest has no spread (or, in
    PostgreSQL, a round-off one). The set-aside rows stay within the cap, the sample is drawn, and whole-table
    answers are exact. Before, the bounds collapsed to the constant and every other row (all 100,000 on
    PostgreSQL) was set aside."""
    rng = np.random.default_rng(SEED)
    rows = 40_000
    rare = rng.random(rows) < (0.03 if shape == "flag" else 0.005)
    v = np.where(rare, 1.0 if shape == "flag" else 1e6, 0.0 if shape == "flag" else 0.1)
    frame = pd.DataFrame({"x": rng.random(rows), "v": v})
    any_engine.con.execute("CREATE TABLE t (x FLOAT8, v FLOAT8)")
    any_engine.con.insert_frame(build_mod.table_expr("t"), frame)
    any_engine.build("t", sample_size=2_000, seed=1)
    st = store.read(any_engine.con, "t")
    assert len(st.outlier_gid) <= build_mod.OUTLIER_SHARE * 2_000
    assert len(st.sample_gid) >= 1_900
    for sql in ("SELECT SUM(v) AS v FROM t", "SELECT COUNT(*) AS v FROM t", "SELECT AVG(v) AS v FROM t"):
        assert float(any_engine.query(sql)["v"].iloc[0]) == pytest.approx(
            float(any_engine.exact(sql)["v"].iloc[0]), rel=1e-9), sql


def test_a_group_of_rows_all_set_aside(mem_engine):
    """A group whose every row is stored whole has no rows left for the model (N = 0): its answers are exact, by
    either method, and nothing warns (a 0/0 in the fit's g-weights did; warnings are errors here)."""
    mem_engine.con.execute("CREATE TABLE t AS SELECT (i % 100)::DOUBLE AS x, CASE WHEN i % 1000 = 0 THEN 'z' ELSE "
                           "'a' END AS g, CASE WHEN i % 1000 = 0 THEN 1e6 + i ELSE (i % 7)::DOUBLE END AS y "
                           "FROM range(100000) r(i)")
    mem_engine.build("t", group_by=["g"], sample_size=3000)
    st = store.read(mem_engine.con, "t")
    assert st.groups.set_index("g").loc["z", "n"] == 0 and len(st.outlier_gid) == 100
    for method in ("grid", "kde"):
        for sql in ("SELECT g, SUM(y) AS v FROM t WHERE x < 40 GROUP BY g ORDER BY g",
                    "SELECT g, AVG(y) AS v FROM t WHERE y > 100 GROUP BY g ORDER BY g"):
            got = mem_engine.query(sql, method=method).set_index("g")["v"]
            want = mem_engine.exact(sql).set_index("g")["v"]
            assert got["z"] == pytest.approx(want["z"], rel=1e-12), (method, sql)
