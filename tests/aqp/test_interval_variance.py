"""How the interval's variance combines the residuals' with the placement term of the fine bins a box cuts."""

from __future__ import annotations

import duckdb
import numpy as np
import pandas as pd
import pytest

from densitas.aqp import Engine
from densitas.aqp import synopsis as syn_mod
from densitas.aqp.estimator import GroupTotals


def _half_width(eng: Engine, sql: str) -> float:
    eng._cache.clear()  # a fresh synopsis: nothing cached from another variant
    df = eng.query(sql)
    return float(df["n_ci_high"].iloc[0] - df["n_ci_low"].iloc[0]) / 2


def _parts(eng: Engine, sql: str, monkeypatch) -> tuple[float, float, float]:
    """The half-widths of the interval as built, of the placement terms alone (the rows' places within the cut
    bins, and the split of a cut end's rows among the groups) and of the residuals alone (with what the fit's
    dropped directions add, which stays in both). Without the fine bins no sample row of the group lies in
    (``Synopsis._unseen_bins``), which is neither term and is added after they are combined (DENSITAS_SEED=
    3767460937: a bin of the steep x's sparse end), and without the regression's bias (``GroupTotals.bias_shift``),
    likewise (DENSITAS_SEED=2476250467)."""
    with monkeypatch.context() as outer:
        outer.setattr(syn_mod.Synopsis, "_unseen_bins", lambda self, *args: None)
        # nor the regression's first-order bias (estimator._regression_bias), added after them as well
        outer.setattr(GroupTotals, "bias_shift", lambda self, gids, W: None)
        both = _half_width(eng, sql)
        with monkeypatch.context() as m:
            m.setattr(GroupTotals, "residual_variance", lambda self, gids, ss, ks: np.zeros(len(gids)))
            # nor what a direction the fit left out would add (DENSITAS_SEED=2008414378: one at x < 0.0135), which
            # is neither the placement's nor the residuals' term
            m.setattr(GroupTotals, "extrapolation_noise", lambda self, gids, W: np.zeros(len(gids)))
            m.setattr(GroupTotals, "extrapolation_variance", lambda self, gids, W: np.zeros(len(gids)))
            placement = _half_width(eng, sql)
        with monkeypatch.context() as m:
            m.setattr(syn_mod.Synopsis, "_placement",
                      lambda self, S, phis, box, ends=None, rows=None, split=None, grouping=None: {})
            m.setattr(syn_mod.Synopsis, "_end_splits", lambda self, *args: [])  # the ends' split among the groups
            residual = _half_width(eng, sql)
    return both, placement, residual


def _engine(rng, sample_size: int, max_bins: int) -> Engine:
    con = duckdb.connect()
    x = rng.uniform(0, 1, 60_000) ** 3  # a steep density: the slope part of the placement term is not 0
    con.register("df", pd.DataFrame({"x": x, "y": rng.normal(size=len(x))}))
    con.execute("CREATE TABLE t AS SELECT * FROM df")
    eng = Engine(con)
    # the sample's values as they are: rounded, rows within a rounding step of a cut widen the interval by their
    # doubt, which the parts compared here do not hold (DENSITAS_SEED=270607933: ±10 rows at x < 0.0132)
    eng.build("t", columns=["x", "y"], budget_bytes=200_000, sample_size=sample_size, max_bins=max_bins,
              compact_sample=False)
    return eng


def test_a_cut_bin_the_sample_sees_adds_no_placement_variance(rng, monkeypatch):
    # ~90 sample rows per fine bin (>= SEEN_ROWS, and cuts inside the bins with rows on both sides): the residuals
    # hold the cut bins' error, the model's term is out. Each cut bin needs SEEN_SIDE sample rows inside the whole
    # box, so the other column keeps most rows: x < 0.0123 with y > 0.1 left a cut y bin one sampled row inside
    # (DENSITAS_SEED=2008414378), y > 0.1 with x < 0.777 an x bin four (DENSITAS_SEED=5), and the model's term
    # rightly counted there. Both bounds in the middle of a full bin: y > -1.0 kept two sampled rows of its bin out
    # (DENSITAS_SEED=104), the middle of y's bin at -1.0 held 26 sampled rows (DENSITAS_SEED=201)
    eng = _engine(rng, 6000, 64)
    table = eng.con.fetch_numpy("SELECT x, y FROM t")

    def middle(column, lo, hi):  # of the bin between lo and hi holding the most rows (their widths vary 100-fold)
        edges = np.asarray(eng._load("t").infos[["x", "y"].index(column)].edges)
        inner = [i for i in range(len(edges) - 1) if lo <= edges[i] and edges[i + 1] <= hi]
        rows = [np.count_nonzero((table[column] >= edges[i]) & (table[column] < edges[i + 1])) for i in inner]
        best = inner[int(np.argmax(rows))]
        return (edges[best] + edges[best + 1]) / 2

    y_cut = middle("y", -1.3, -0.7)  # y keeps about 84% of the rows
    for lo, hi in ((0.2, 0.4), (0.45, 0.6), (0.7, 0.85)):  # x keeps 2/3 of the rows or more
        cut = middle("x", lo, hi)
        sql = f"SELECT COUNT(*) AS n FROM t WHERE x < {cut} AND y > {y_cut}"
        both, placement, residual = _parts(eng, sql, monkeypatch)
        assert 0 <= placement <= 1e-6 * residual, cut  # (round-off)
        assert both == pytest.approx(residual, rel=1e-9), cut
        with monkeypatch.context() as m:  # a threshold no bin reaches: the term counts again
            m.setattr(syn_mod, "SEEN_ROWS", 10**9)
            both, placement, residual = _parts(eng, sql, monkeypatch)
        assert 0 < placement and 0 < residual, cut
        # the larger, not the sum (which would count the cut bins' error twice); usually the residuals', but the
        # model's term may be larger in a sample (DENSITAS_SEED=2970063824: 214 against 163)
        assert both == pytest.approx(max(placement, residual), rel=1e-9), cut
        assert both < np.hypot(placement, residual) * (1 - 1e-6), cut
    eng.con.close()


def test_a_bin_cut_at_an_end_keeps_the_placement_variance_in_each_group(rng, monkeypatch):
    # years every 5 in bins of a few values each: `yr < cut` at a bin's largest value keeps the rest of its rows.
    # Each row's own place is known, so every residual there is 0; the group's total takes the table's share of
    # the bin's rows at each end, which the residuals cannot check: the split's term stays, seen or not
    n = 80_000
    con = duckdb.connect()
    con.register("df", pd.DataFrame({"g": rng.integers(0, 2, n), "yr": 1950 + 5 * rng.integers(0, 31, n)}))
    con.execute("CREATE TABLE t AS SELECT * FROM df")
    eng = Engine(con)
    eng.build("t", columns=["yr"], group_by=["g"], budget_bytes=100_000, sample_size=8000, max_bins=16)
    syn = eng._load("t")
    info = syn.infos[syn.index["yr"]]
    several = [b for b in range(info.bins) if info.occupied_max[b] > info.occupied_min[b]]
    assert several, info.edges  # bins holding more than one year
    cut = info.occupied_max[several[len(several) // 2]]
    sql = f"SELECT g, COUNT(*) AS n FROM t WHERE yr < {cut:.0f} GROUP BY g"
    _, placement, residual = _parts(eng, sql, monkeypatch)
    assert placement > 0, cut
    # the rows' own places fit the sample exactly (round-off: DENSITAS_SEED=4272568553 gave 2.3e-5 rows against 11.5)
    assert residual <= 1e-6 * placement + 1e-3, cut
    exact = con.execute(sql).df().sort_values("g")["n"].to_numpy()
    got = eng.query(sql).sort_values("g")
    assert np.all(np.abs(got["n"].to_numpy() - exact) < got["n_ci_high"].to_numpy() - got["n"].to_numpy())
    con.close()


def test_a_cut_bin_the_sample_misses_keeps_the_placement_variance(rng, monkeypatch):
    # ~0.3 sample rows per fine bin: most cut bins hold none, and a one-column COUNT's residuals are then ~0
    eng = _engine(rng, 300, 1024)
    missed = 0
    for cut in np.linspace(0.05, 0.95, 19):
        both, placement, residual = _parts(eng, f"SELECT COUNT(*) AS n FROM t WHERE x < {cut:.4f}", monkeypatch)
        assert placement > 0, cut
        assert both == pytest.approx(max(placement, residual), rel=1e-9), cut
        missed += placement > 100 * residual  # (the residuals: round-off)
    assert missed >= 5  # cuts where the interval is the placement term's alone (~0 without it)
    eng.con.close()


def test_a_sums_placement_term_weighs_the_cut_bins_values(rng, monkeypatch):
    # a heavy-tailed column cut among its small values: the rows a cut moves are worth at most the cut bin's largest
    # value, not a typical row of the whole table (which put population's SUMs 5-10 times too wide)
    con = duckdb.connect()
    con.register("df", pd.DataFrame({"x": rng.lognormal(0.0, 2.0, 60_000)}))
    con.execute("CREATE TABLE t AS SELECT * FROM df")
    eng = Engine(con)
    eng.build("t", columns=["x"], budget_bytes=200_000, sample_size=600, max_bins=256)  # ~2 sample rows a bin
    edges = eng._load("t").infos[0].edges
    seen = []
    weigh = syn_mod.Synopsis._placement_moments
    monkeypatch.setattr(syn_mod.Synopsis, "_placement_moments",
                        lambda self, parts, keys, split=None: seen.append((keys, weigh(self, parts, keys, split)))
                        or seen[-1][1])
    typical = np.sqrt(np.mean(con.execute("SELECT x FROM t").df()["x"].to_numpy() ** 2))
    for q in (0.05, 0.1, 0.2):
        i = int(np.searchsorted(edges, np.quantile(edges, q))) - 1
        cut, top = (edges[i] + edges[i + 1]) / 2, edges[i + 1]
        eng._cache.clear()
        eng.query(f"SELECT SUM(x) AS n FROM t WHERE x < {cut}")
        keys, moments = seen[-1]
        count, total = moments[0, keys.index(("n", None)), keys.index(("n", None))], \
            moments[0, keys.index(("s", 0)), keys.index(("s", 0))]
        assert count > 0, cut  # the cut bin's rows are placed
        # a row of the bin: its value below the bin's top, or (no sample row there) its mean and an even spread
        assert 0 < total <= count * top ** 2 * 13 / 12, (cut, total, count * top ** 2)
        assert top < 0.2 * typical  # (what the group's rows anywhere would weigh them by is far larger)
    con.close()


def test_a_group_sampled_whole_has_an_exact_answer_and_no_interval(rng):
    # group 1 has fewer rows than the per-group floor of 200 sample rows: it is in the sample whole
    n_big = 50_000
    g = np.r_[np.zeros(n_big, dtype=np.int32), np.ones(150, dtype=np.int32)]
    x = rng.uniform(0, 1, len(g)) ** 3
    con = duckdb.connect()
    con.register("df", pd.DataFrame({"g": g, "x": x}))
    con.execute("CREATE TABLE t AS SELECT * FROM df")
    eng = Engine(con)
    eng.build("t", columns=["x"], group_by=["g"], budget_bytes=60_000, sample_size=1000, max_bins=32)
    for cut in (0.0123, 0.3, 0.777):  # edges inside fine bins: the placement term is not 0 there
        sql = f"SELECT g, COUNT(*) AS n FROM t WHERE x < {cut} GROUP BY g"
        got = eng.query(sql).set_index("g")
        exact = con.execute(sql).df().set_index("g")["n"]
        assert got.loc[1, "n"] == pytest.approx(exact.loc[1], abs=1e-6), cut
        assert got.loc[1, "n_ci_high"] - got.loc[1, "n_ci_low"] <= 1e-6 * max(exact.loc[1], 1), cut
        assert got.loc[0, "n_ci_high"] - got.loc[0, "n_ci_low"] > 0, cut  # the sampled group keeps its interval
    con.close()


@pytest.mark.parametrize(("seed", "sql"), [
    (20261322, 'SELECT g, COUNT(*) AS n FROM t WHERE x >= 8.64823 AND x < 26.8936 GROUP BY g'),
    (20261422, 'SELECT g, SUM(y) AS n FROM t WHERE x >= 42.3417 AND x < 54.0544 GROUP BY g'),
])
def test_a_cut_the_sample_sees_on_one_side_only_keeps_the_placement_variance(seed, sql):
    # 60 groups, x = g + 20u² (the coverage tests' small_groups table): in some groups the bound keeps (or drops)
    # one row of a fine bin the sample holds 100 rows of, none of them on that row's side. Their residuals are all
    # 0; taking the bin as seen gave answers one row off inside zero-width intervals (491 ± 0 against 490)
    from tests.aqp.test_coverage import TABLES

    con = duckdb.connect()
    con.execute(f"CREATE TABLE t AS SELECT * EXCLUDE (i) FROM ({TABLES['small_groups']}) ORDER BY i")
    eng = Engine(con)
    eng.build("t", group_by=["g"], budget_bytes=120_000, seed=seed)
    got = eng.query(sql).set_index("g")
    exact = con.execute(sql).df().set_index("g")["n"]
    err = (got["n"] - exact.reindex(got.index).fillna(0)).abs()
    half = (got["n_ci_high"] - got["n_ci_low"]) / 2
    off = err > 3 * half + 1e-6 * exact.abs().max()  # no answer more than 3 half-widths (~6 sd) off
    assert not off.any(), got[off]
    con.close()


def _three_groups(rng) -> tuple[Engine, str]:
    """A table of three groups and a COUNT over two predicate columns whose answer adds up the three."""
    con = duckdb.connect()
    x = rng.uniform(0, 1, 60_000) ** 3
    con.register("df", pd.DataFrame({"x": x, "y": rng.normal(size=len(x)), "g": rng.choice(["a", "b", "c"], len(x))}))
    con.execute("CREATE TABLE t AS SELECT * FROM df")
    eng = Engine(con)
    eng.build("t", columns=["x", "y"], group_by=["g"], budget_bytes=200_000, sample_size=6000, max_bins=64,
              compact_sample=False)  # no rounding doubt added to the half-width (DENSITAS_SEED=2174484696)
    return eng, "SELECT COUNT(*) AS n FROM t WHERE x < 0.4 AND y > 0.1"


def test_what_a_dropped_fit_direction_would_add_widens_the_answers_interval(rng, monkeypatch):
    """The estimator's extrapolation term (GroupTotals.extrapolation: what the fit directions it leaves out would
    add) reaches the interval an answer reports, at its full size; an answer over several groups takes their
    shifts' sum squared (one fit's choice in every group, not independent errors), not the sum of their squares."""
    from densitas.aqp.estimator import regression_totals

    eng, sql = _three_groups(rng)
    before = _half_width(eng, sql)
    shift = 2.0 * before  # past the residuals' own width (far past it, the interval meets the count's bounds)

    def with_extrapolation(*args, **kwargs):
        t = regression_totals(*args, **kwargs)
        t.extrapolation = np.full_like(t.value, shift)
        return t

    monkeypatch.setattr(syn_mod, "regression_totals", with_extrapolation)
    after = _half_width(eng, sql)
    groups = len(eng._load("t").N)
    assert groups == 3
    z = 1.959963984540054
    assert after == pytest.approx(z * np.sqrt((before / z) ** 2 + (groups * shift) ** 2), rel=1e-6)


def test_the_shifts_own_noise_widens_the_answers_interval(rng, monkeypatch):
    """The noise of that shift (GroupTotals.extrapolation_noise, from its scatter ``shift_scatter``) reaches the
    reported interval too, summed over the groups an answer adds up (their samples are independent)."""
    from densitas.aqp.estimator import regression_totals

    eng, sql = _three_groups(rng)
    before = _half_width(eng, sql)
    noise = (2.0 * before) ** 2  # a variance per group, past the residuals' own

    def with_noise(*args, **kwargs):
        t = regression_totals(*args, **kwargs)
        K = t.value.shape[1]
        t.shift_scatter = np.zeros((len(t.N), K, K))
        t.shift_scatter[:, 0, 0] = noise  # the count's key is the first
        return t

    monkeypatch.setattr(syn_mod, "regression_totals", with_noise)
    after = _half_width(eng, sql)
    z = 1.959963984540054
    assert after == pytest.approx(z * np.sqrt((before / z) ** 2 + 3 * noise), rel=1e-6)


@pytest.mark.parametrize(("shape", "lo", "hi"), [
    ("distinct", 1.0, 1.0),  # floats, no two rows alike: rows are placed one by one
    ("repeated", 6.0, 10.0),  # every integer on 1 or 19 rows at random: counts of mean 10, variance 81, φ = 8.1
    # (the estimate is moved towards 1 by its standard error: about 7.3)
    ("regular", 0.0, 1.0),  # every integer on 10 rows: an even spread is right, φ = 0 (moved towards 1: about 0.45)
    ("spike", 0.5, 1.5),  # 60% of the rows at 0, in a bin of its own, the rest scattered: φ = 1, not the spike's
])
def test_the_dispersion_of_the_values_counts_is_the_tables(rng, monkeypatch, shape, lo, hi):
    n_values = 3000
    if shape == "distinct":
        x = rng.uniform(0, 1000, 30_000)
    elif shape == "repeated":
        x = np.repeat(np.arange(n_values), np.where(rng.random(n_values) < 0.5, 1, 19))
    elif shape == "spike":
        x = np.where(rng.random(30_000) < 0.6, 0, rng.integers(1, 1_000_000, 30_000))
    else:
        x = np.repeat(np.arange(n_values), 10)
    con = duckdb.connect()
    con.register("df", pd.DataFrame({"x": x}))
    con.execute("CREATE TABLE t AS SELECT * FROM df")
    eng = Engine(con)
    eng.build("t", columns=["x"], budget_bytes=200_000, sample_size=3000, max_bins=32)
    syn = eng._load("t")
    phi = syn._dispersion(0)
    assert lo <= phi <= hi, phi
    # the placement term of a bin cut inside (not at an end) is the values' Bernoulli variance: φ times the rows'
    monkeypatch.setattr(syn_mod.Synopsis, "_slope_var", lambda self, j, ivals, unseen=None: 0.0)
    monkeypatch.setattr(syn_mod.Synopsis, "_unseen", lambda self, u, rows: np.ones(self.fine[u].shape))
    # nor the rows' measured shape within the bins (κ, not a Bernoulli part: DENSITAS_SEED=714945104 measured one
    # on the repeated values)
    monkeypatch.setattr(syn_mod.Synopsis, "_shape_error", lambda self, u, grouping: 0.0)
    e = syn.infos[0].edges
    # a bound inside an interior bin spanning several values (a bin of one or two values may be cut at an end,
    # where the build counted the rows: DENSITAS_SEED=86547506 had bin 11 so)
    k = next(k for k in range(10, len(e) - 1) if e[k + 1] - e[k] >= 4)
    box = {0: [(-np.inf, False, float(np.floor((e[k] + e[k + 1]) / 2)) + 0.5, False)]}
    share = syn._fractions(0, box[0])
    as_is = syn._placement([0], {0: share}, box)[0]
    monkeypatch.setattr(syn_mod.Synopsis, "_dispersion", lambda self, u: 1.0)
    by_rows = syn._placement([0], {0: share}, box)[0]
    assert by_rows[0, k + 1] > 0
    assert as_is[0, k + 1] == pytest.approx(phi * by_rows[0, k + 1], rel=1e-9)
    con.close()
