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
    """The half-widths of the interval as built, of the placement term alone and of the residuals alone."""
    both = _half_width(eng, sql)
    with monkeypatch.context() as m:
        m.setattr(GroupTotals, "residual_variance", lambda self, gids, ss, ks: np.zeros(len(gids)))
        placement = _half_width(eng, sql)
    with monkeypatch.context() as m:
        m.setattr(syn_mod.Synopsis, "_placement", lambda self, S, phis, box, ends=None: np.zeros(len(self.N)))
        residual = _half_width(eng, sql)
    return both, placement, residual


def _engine(rng, sample_size: int, max_bins: int) -> Engine:
    con = duckdb.connect()
    x = rng.uniform(0, 1, 60_000) ** 3  # a steep density: the slope part of the placement term is not 0
    con.register("df", pd.DataFrame({"x": x, "y": rng.normal(size=len(x))}))
    con.execute("CREATE TABLE t AS SELECT * FROM df")
    eng = Engine(con)
    eng.build("t", columns=["x", "y"], budget_bytes=200_000, sample_size=sample_size, max_bins=max_bins)
    return eng


def test_the_interval_takes_the_larger_of_the_residual_and_placement_variances(rng, monkeypatch):
    # the sample sees the cut bins: the residuals hold their error and the larger part is the residuals'
    eng = _engine(rng, 3000, 64)
    for cut in (0.0123, 0.3, 0.777):
        both, placement, residual = _parts(eng, f"SELECT COUNT(*) AS n FROM t WHERE x < {cut} AND y > 0.1",
                                           monkeypatch)
        assert 0 < placement < residual, cut
        # the larger, not the sum (which would count the cut bins' error twice)
        assert both == pytest.approx(residual, rel=1e-9), cut
        assert both < np.hypot(placement, residual) * (1 - 1e-6), cut
    eng.con.close()


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
