"""A group's few rows in a fine bin its sample holds none of: their values still count in the interval
(``Synopsis._unseen_values``)."""

from __future__ import annotations

import numpy as np
import pandas as pd

YEARS = 12
GROUPS = 30


def _births_like(rng) -> pd.DataFrame:
    """Births per state and day: each state its level, a slow trend, and in the states of 30 or more births a day
    two to five glitch days of 1-5 births in the first years (as births' states, some with days under 32)."""
    days = np.arange(YEARS * 365)
    year = 1969 + days // 365
    parts = []
    for g in range(GROUPS):
        level = [15, 25, 30, 35, 120][g % 5]
        births = np.round(level * (1 + 0.01 * (year - 1969)) * (1 + 0.1 * rng.standard_normal(len(days))))
        births = np.maximum(births, 1).astype(int)
        if level >= 30:
            glitch = rng.choice(np.flatnonzero(year < 1975), 2 + g % 4, replace=False)
            births[glitch] = rng.integers(1, 6, len(glitch))
        parts.append(pd.DataFrame({"state": f"s{g:02d}", "births": births, "year": year,
                                   "month": 1 + (days % 365) // 31, "day": 1 + (days % 365) % 31}))
    return pd.concat(parts, ignore_index=True)


def test_a_groups_unsampled_rows_in_a_cut_cell_count_in_its_interval(rng, frame_engine):
    # The box drops the lowest fine bins of births whole (the counts are exact) and keeps the rest of their sum
    # grid cell, whose year totals hold the glitch days. A state of 30-35 births a day has rows in that cell besides
    # its glitch days, and its sample (about 200 of 4,380 rows) holds none of those: the model takes their years
    # from the cell and the other states' rows of the bin, with no sample row to correct it or show its error.
    # The fit reproduced the group's exact totals with no residual: intervals of ±0.0004 years around answers a
    # few glitch days off (births' UT, NE, WV).
    df = _births_like(rng)
    eng = frame_engine(df)
    eng.build("t", columns=["births", "year", "month", "day"], group_by=["state"], budget_bytes=60_000)
    syn = eng._load("t")
    u = syn.index["births"]
    edges, cells = syn.infos[u].edges, syn.sums[u][0]
    # a bound at the start of a fine bin past the glitch values (1-5) sharing its sum grid cell with the bin before
    k = next((k for k in range(1, 8) if edges[k] > 5 and cells[k] == cells[k + 1]), None)
    assert k is not None, (edges[:9], cells[:9])
    bound = float(edges[k])
    sql = f"SELECT state, AVG(year) AS v FROM t WHERE births >= {bound} GROUP BY state ORDER BY state"
    got = eng.query(sql).set_index("state")
    truth = df[df.births >= bound].groupby("state").year.mean()
    dropped = df[df.births < bound].groupby("state").size().reindex(truth.index, fill_value=0)
    # the states of 30-35 a day: the box drops their glitch days only (others' cuts are the placement's matter)
    glitchy = [f"s{g:02d}" for g in range(GROUPS) if g % 5 in (2, 3)]
    got, truth, dropped = got.loc[glitchy], truth[glitchy], dropped[glitchy]
    assert dropped.between(2, 5).all(), dropped
    # 95% intervals over 12 states: at least 9 (all 12 in seeds 1-10; 1-9 before the term, which passed at 2 of
    # 40 seeds, DENSITAS_SEED=10 and 35: the test does not tell N_gb from N_gb², whose glitch bins hold 2-5 rows)
    covered = (got.v_ci_low <= truth) & (truth <= got.v_ci_high)
    assert covered.sum() >= 9, got[~covered].assign(truth=truth[~covered], dropped=dropped[~covered])
    # and not many times wider than the worst the dropped rows can do, each moving the answer by the whole span of
    # years (the interval holds the other terms too, and the rows' error at 1.96 standard deviations; 1.0-3.5
    # times in 10 seeds; the rows' count squared where they were many, or the span unbounded, would exceed it)
    half = (got.v_ci_high - got.v_ci_low) / 2
    worst = dropped * (YEARS - 1) / df.groupby("state").size()[glitchy]
    wide = half > 5 * worst
    assert not wide.any(), pd.DataFrame({"half": half, "worst": worst})[wide]
