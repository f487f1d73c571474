"""The split of a cut bin end's rows among the synopsis' groups: measured at build (``build.end_dispersion``) and
its own term of an answer's variance (``synopsis.SplitTerm``)."""

from __future__ import annotations

import itertools
import json

import duckdb
import numpy as np
import pandas as pd
import pytest

from densitas.aqp import Engine


def _engine(df: pd.DataFrame, columns: list[str], group_by: list[str], **kw) -> tuple[duckdb.DuckDBPyConnection,
                                                                                       Engine]:
    con = duckdb.connect()
    con.register("df", df)
    con.execute("CREATE TABLE t AS SELECT * FROM df")
    eng = Engine(con)
    eng.build("t", columns=columns, group_by=group_by, outliers=False, **kw)
    return con, eng


def _brute_dispersion(df: pd.DataFrame, x: str, group_by: list[str], lower: np.ndarray) -> dict:
    """Σ (c_O − c·P_O)² / Σ c·P_O(1 − P_O) per set of group columns, bin and end, straight from the rows."""
    d = df.assign(bin=np.searchsorted(lower, df[x].to_numpy(), side="right"))
    ends = d.groupby("bin")[x].agg(["min", "max"])
    d = d.join(ends, on="bin")
    out = {}
    for r in range(1, len(group_by) + 1):
        for cols in itertools.combinations(group_by, r):
            per_end = []
            for end in ("min", "max"):
                got = []
                for b in range(1, len(lower) + 1):
                    rows = d.loc[d["bin"] == b]
                    if rows.empty or rows["min"].iloc[0] == rows["max"].iloc[0]:
                        got.append(None)
                        continue
                    n_O = rows.groupby(list(cols)).size()
                    c_O = rows.loc[rows[x] == rows[end]].groupby(list(cols)).size().reindex(n_O.index, fill_value=0)
                    P = n_O / n_O.sum()
                    c = c_O.sum()
                    den = float((c * P * (1 - P)).sum())
                    got.append(float(((c_O - c * P) ** 2).sum()) / den if den > 0 else None)
                per_end.append(got)
            out[json.dumps(sorted(cols))] = per_end
    return out


def test_the_ends_dispersion_is_the_tables_own(rng):
    # two group columns, an integer column of few values a bin: every set of group columns, bin and end against a
    # count straight from the rows (a mutation of the classes, the shares or the ends changes these numbers)
    n = 30_000
    df = pd.DataFrame({"a": rng.integers(0, 3, n), "b": rng.integers(0, 4, n),
                       "x": rng.integers(0, 40, n)})
    df.loc[df["a"] == 0, "x"] = df.loc[df["a"] == 0, "x"] // 2 * 2  # a = 0 holds even values only
    con, eng = _engine(df, ["x"], ["a", "b"], max_bins=12)
    info = eng._load("t").infos[0]
    assert not info.discrete and (info.occupied_max > info.occupied_min).any()
    want = _brute_dispersion(df, "x", ["a", "b"], info.edges)
    assert set(info.end_dispersion) == set(want)
    for key, per_end in want.items():
        for got_end, want_end in zip(info.end_dispersion[key], per_end, strict=True):
            assert [g is None for g in got_end] == [w is None for w in want_end], key
            np.testing.assert_allclose([g for g in got_end if g is not None],
                                       [w for w in want_end if w is not None], rtol=1e-3, err_msg=key)
    # a = 0 holds no odd value: by a, an odd end is far from its share (dispersion well above 1)
    assert max(v for v in info.end_dispersion['["a"]'][1] if v is not None) > 2
    con.close()


def _grid_table(groups: int, years: int, per: int) -> pd.DataFrame:
    """Every group holds ``per`` rows of every year: each group's share of any year is exact."""
    g, y = np.meshgrid(np.arange(groups), np.arange(years), indexing="ij")
    return pd.DataFrame({"g": np.repeat(g.ravel(), per), "yr": 1950 + np.repeat(y.ravel(), per)})


def test_a_count_over_every_group_cut_at_an_end_is_exact_and_narrow(rng):
    # a bound at a bin's largest year: the groups' rows there add up to the table's count, so the answer over every
    # group is exact, and so is each group's (each holds its share): intervals of a fraction of a row, where the
    # rows placed one by one gave each group ±sqrt(p(1 − p)n) and the total the sum of those
    df = _grid_table(groups=12, years=60, per=int(rng.integers(20, 40)))
    con, eng = _engine(df, ["yr"], ["g"], max_bins=16, sample_size=4000)
    info = eng._load("t").infos[0]
    several = [b for b in range(info.bins) if info.occupied_max[b] > info.occupied_min[b]]
    cut = info.occupied_max[several[len(several) // 2]]
    assert all(v is None or v < 1e-9 for v in info.end_dispersion['["g"]'][1])
    for sql in (f"SELECT COUNT(*) AS n FROM t WHERE yr < {cut:.0f}",
                f"SELECT g, COUNT(*) AS n FROM t WHERE yr < {cut:.0f} GROUP BY g ORDER BY g"):
        got, want = eng.query(sql), con.execute(sql).df()
        half = (got["n_ci_high"] - got["n_ci_low"]).to_numpy() / 2
        assert np.all(np.abs(got["n"].to_numpy() - want["n"].to_numpy()) <= half + 1e-6), sql
        assert np.all(half < 0.5), (sql, half)
    con.close()


def test_an_end_one_group_holds_widens_its_interval(rng):
    # group 0 holds a hundred extra rows at every multiple of 25, group 1 none: a bound just above a bin's least
    # value, one of those, drops them from group 0, where the model takes each group's share of the bin. Rows split
    # at random would leave that off by ±sqrt(c·p(1 − p)); the measured dispersion takes it as it is, and the
    # interval covers it without being many times wider than the error
    n = 40_000
    heavy = np.repeat(np.arange(0, 1000, 25), 100)
    df = pd.DataFrame({"g": np.r_[rng.integers(0, 2, n), np.zeros(len(heavy), dtype=np.int64)],
                       "x": np.r_[rng.integers(0, 1000, n), heavy]})
    con, eng = _engine(df, ["x"], ["g"], max_bins=32, sample_size=4000)
    info = eng._load("t").infos[0]
    lows = [k for k in range(info.bins)
            if info.occupied_min[k] % 25 == 0 and info.occupied_max[k] > info.occupied_min[k]]
    assert lows, info.occupied_min
    checked = 0
    for k in lows:
        assert info.end_dispersion['["g"]'][0][k] > 2  # against 1 for rows split at random
        sql = f"SELECT g, COUNT(*) AS n FROM t WHERE x > {info.occupied_min[k]:.0f} GROUP BY g ORDER BY g"
        got, want = eng.query(sql), con.execute(sql).df()
        err = np.abs(got["n"].to_numpy() - want["n"].to_numpy())
        half = (got["n_ci_high"] - got["n_ci_low"]).to_numpy() / 2
        assert np.all(err <= half), (k, err, half)
        assert np.all(half < 10 * np.maximum(err, 1)), (k, err, half)
        checked += err.max() > 20
    assert checked, lows  # bounds whose split is tens of rows off
    con.close()


@pytest.mark.parametrize("grouping", [[], ["a"], ["b"], ["a", "b"]])
def test_end_cut_answers_cover_by_any_grouping(rng, grouping):
    # every (a, year) holds the same rows, split among b at random: answers over every group or by a are exact
    # (each a holds its share of every year), by b or by both carry the split's error. Over the bounds at each
    # bin's largest year, the intervals must cover about as often as they promise, from both sides: by b, at least
    # 85% covered and not by intervals several times too wide (median |z| at least 0.25; 0.67 when honest); by a
    # or over all, exact answers inside intervals under a row wide
    years, groups_a, per = 40, 4, int(rng.integers(60, 120))
    counts = rng.multinomial(per, [0.2, 0.3, 0.5], size=(groups_a, years))  # rows per (a, year, b)
    a, y, b = np.nonzero(counts)
    n = counts[a, y, b]
    df = pd.DataFrame({"a": np.repeat(a, n), "yr": 1950 + np.repeat(y, n), "b": np.repeat(b, n)})
    con, eng = _engine(df, ["yr"], ["a", "b"], max_bins=10, sample_size=600)
    info = eng._load("t").infos[0]
    ends = [info.occupied_max[k] for k in range(info.bins - 1) if info.occupied_max[k] > info.occupied_min[k]]
    assert len(ends) >= 4, info.edges
    by = ", ".join(grouping)
    err, half = [], []
    for cut in ends:
        sql = (f"SELECT {by + ', ' if by else ''}COUNT(*) AS n FROM t WHERE yr < {cut:.0f}"
               + (f" GROUP BY {by} ORDER BY {by}" if by else ""))
        got, want = eng.query(sql), con.execute(sql).df()
        err += list(np.abs(got["n"].to_numpy() - want["n"].to_numpy()))
        half += list((got["n_ci_high"] - got["n_ci_low"]).to_numpy() / 2)
    err, half = np.array(err), np.array(half)
    if "b" in grouping:
        assert np.mean(err <= half + 1e-6) >= 0.85, (grouping, err, half)
        assert np.median(err / half * 1.96) >= 0.25, (grouping, err, half)
    else:
        assert np.all(err <= half + 1e-6) and np.all(half < 1.0), (grouping, err, half)
    con.close()


def test_a_sum_over_every_group_cut_at_an_end_covers(rng):
    # groups of different means hold a year's rows in random amounts: over every group the rows at a bin's end add
    # up to the table's count exactly, but their sum of y moves with which groups hold them. That part takes the
    # dispersion among all the groups (a term at the grouping's, 0 over every group, left these intervals at 0%
    # coverage in review): over the bounds at each bin's largest year, most intervals cover, none absurdly wide
    years, groups = 40, 6
    counts = rng.multinomial(600, np.full(groups, 1 / groups), size=years)  # rows per (year, group)
    y_idx, g = np.nonzero(counts)
    n = counts[y_idx, g]
    gg = np.repeat(g, n)
    df = pd.DataFrame({"g": gg, "yr": 1950 + np.repeat(y_idx, n), "y": 100.0 * gg + rng.normal(0, 1, n.sum())})
    con, eng = _engine(df, ["yr", "y"], ["g"], max_bins=10, sample_size=3000)
    info = eng._load("t").infos[0]
    ends = [info.occupied_max[k] for k in range(info.bins - 1) if info.occupied_max[k] > info.occupied_min[k]]
    assert len(ends) >= 4, info.edges
    err, half = [], []
    for cut in ends:
        sql = f"SELECT SUM(y) AS s FROM t WHERE yr < {cut:.0f}"
        got, want = eng.query(sql), con.execute(sql).df()
        err.append(abs(float(got["s"].iloc[0] - want["s"].iloc[0])))
        half.append(float(got["s_ci_high"].iloc[0] - got["s_ci_low"].iloc[0]) / 2)
    err, half = np.array(err), np.array(half)
    assert np.mean(err <= half) >= 0.75, (err, half)
    assert np.median(err / half * 1.96) >= 0.1, (err, half)
    con.close()
