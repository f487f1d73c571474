"""The rows at a bin's smallest and largest value: counted by the build, kept by the model where they are."""

from __future__ import annotations

import duckdb
import numpy as np
import pandas as pd

from densitas.aqp import Engine, store
from densitas.aqp import build as build_mod


def _lab(con, rng, n=40_000, groups=1):
    """x: a lab value (DOUBLE, one decimal) with three rows at an outlying largest value 9,999.5; y: uniform."""
    x = np.round(rng.gamma(4.0, 12.0, n), 1)
    x[rng.choice(n, 3, replace=False)] = 9_999.5
    df = pd.DataFrame({"x": x, "y": rng.uniform(0, 100, n), "g": rng.integers(0, groups, n)})
    con.register("df", df)
    con.execute("CREATE TABLE t AS SELECT x::DOUBLE AS x, y, g FROM df")


def test_the_build_counts_the_rows_at_each_bins_ends(rng):
    """Each bin's stored counts at its smallest and largest value are the table's (fails if either is dropped or
    counted over the wrong rows)."""
    con = duckdb.connect()
    _lab(con, rng)
    eng = Engine(con)
    eng.build("t", columns=["x", "y"], sample_size=2_000, outliers=False)
    info = store.read(eng.con, "t").infos[0]
    ok = np.isfinite(info.occupied_min)
    assert ok.sum() > 5
    for b in np.flatnonzero(ok):
        lo, hi = info.occupied_min[b], info.occupied_max[b]
        got = con.execute("SELECT COUNT(*) FILTER (WHERE x = ?), COUNT(*) FILTER (WHERE x = ?) FROM t",
                          [lo, hi]).fetchone()
        assert (info.count_at_min[b], info.count_at_max[b]) == got, b
    con.close()


def test_a_strict_bound_at_the_largest_value_drops_its_rows(rng):
    """COUNT(*) WHERE x < max(x) drops the three rows at the maximum, exactly. A spread over the last bin's range
    counted a point as holding no rows and kept them with an interval a thousandth of a row wide (nafld2's
    ``value < 13682``)."""
    con = duckdb.connect()
    _lab(con, rng)
    eng = Engine(con)
    eng.build("t", columns=["x", "y"], sample_size=2_000, outliers=False)  # the end rows, not rows stored whole
    got = eng.query("SELECT COUNT(*) AS v FROM t WHERE x < 9999.5")
    want = con.execute("SELECT COUNT(*) FROM t WHERE x < 9999.5").fetchone()[0]
    assert got["v"].iloc[0] == want and got["v_ci_low"].iloc[0] <= want <= got["v_ci_high"].iloc[0]
    con.close()


def test_grouped_answers_at_the_largest_value_are_not_falsely_exact(rng):
    """With groups, the rows at an end are apportioned to the groups by their rows in the bin (the build counts
    them in the whole table): each group's count is within the three rows (and its interval's width) of the truth, and
    its interval is not
    the zero width of an exact answer."""
    con = duckdb.connect()
    _lab(con, rng, groups=4)
    eng = Engine(con)
    eng.build("t", columns=["x", "y"], group_by=["g"], sample_size=4_000, outliers=False)
    sql = "SELECT g, COUNT(*) AS v FROM t WHERE x < 9999.5 GROUP BY g ORDER BY g"
    got = eng.query(sql)
    want = con.execute(sql).df()
    err = np.abs(got["v"] - want["v"])
    assert (err <= 3 + (got["v_ci_high"] - got["v_ci_low"])).all(), (got.to_dict("records"), want["v"].tolist())
    assert ((err < 0.5) | (got["v_ci_high"] - got["v_ci_low"] > 0.1)).all(), got.to_dict("records")
    con.close()


def test_over_groups_a_bound_at_the_largest_value_drops_its_rows_in_total(rng):
    """With groups, the sample rarely holds one of the three rows at the maximum: the fit took every sampled row's
    place in the box for the whole bin's and put the three rows back (nafld2: ``COUNT(*) WHERE id < 17566``, the
    largest id, answered 400,122 ± 12 against 400,089). The sampled rows of a bin cut at an end now enter by their
    own place, so the groups' shares of the end rows add up to the table's: the total is exact."""
    con = duckdb.connect()
    _lab(con, rng, groups=4)
    eng = Engine(con)
    eng.build("t", columns=["x", "y"], group_by=["g"], sample_size=4_000, outliers=False)
    sql = "SELECT COUNT(*) AS v FROM t WHERE x < 9999.5"
    got, want = eng.query(sql), con.execute(sql).fetchone()[0]
    assert abs(got["v"].iloc[0] - want) < 0.5 and got["v_ci_low"].iloc[0] <= want <= got["v_ci_high"].iloc[0], \
        (got.to_dict("records"), want)
    con.close()


def test_merged_ends_count_the_rows_of_the_parts_at_the_least_and_greatest_value():
    """A refresh or a partitioned build merges parts: the ends' rows add where a part shares the end."""
    a = pd.DataFrame({"col": [0, 0], "bin": [1, 2], "vmin": [1.0, 5.0], "vmax": [3.0, 8.0], "nmin": [2, 1],
                      "nmax": [4, 1]})
    b = pd.DataFrame({"col": [0, 0], "bin": [1, 2], "vmin": [1.0, 4.0], "vmax": [3.0, 8.0], "nmin": [5, 7],
                      "nmax": [1, 2]})
    got = build_mod.merge_occupied([a, b]).set_index("bin")
    assert got.loc[1, ["vmin", "vmax", "nmin", "nmax"]].tolist() == [1.0, 3.0, 7.0, 5.0]
    assert got.loc[2, ["vmin", "vmax", "nmin", "nmax"]].tolist() == [4.0, 8.0, 7.0, 3.0]


def test_a_whole_sample_answers_a_bound_at_a_bins_end_exactly(rng):
    """With the whole table as the sample every answer is exact, so each auxiliary's stated total must be the sum
    of its rows: a SUM under one bound inside a bin and one at another bin's largest value (a row's own place at
    the end, the interior bin's share) was 0.005% off inside an interval 1e-9 wide when the own-value term's
    total took the ends' values where its rows did not."""
    con = duckdb.connect()
    n = 3_000
    df = pd.DataFrame({"x": rng.gamma(2.0, 10.0, n), "y": rng.normal(50, 10, n)})
    con.register("df", df)
    con.execute("CREATE TABLE t AS SELECT x, y FROM df")
    eng = Engine(con)
    eng.build("t", sample_size=n, max_sample_rows=n, max_bins=32)
    info = store.read(eng.con, "t").infos[0]
    end, inside = float(info.occupied_max[10]), float((info.occupied_min[3] + info.occupied_max[3]) / 2)
    for where in (f"x > {inside} AND x < {end}", f"x < {end}", f"x > {inside}"):
        sql = f"SELECT SUM(x) AS s, AVG(x) AS a, COUNT(*) AS n FROM t WHERE {where}"
        got = eng.query(sql).iloc[0]
        want = con.execute(sql).fetchone()
        assert np.allclose([got["s"], got["a"], got["n"]], want, rtol=1e-9), (where, got.to_dict(), want)
    con.close()
