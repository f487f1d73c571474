"""Rows of a fine bin that no sample row of their group lies in, where the box's share of the bin differs from the
share its pair-grid cell gives it, count in the interval (``Synopsis._unseen_bins``)."""

from __future__ import annotations

import numpy as np
import pandas as pd

ROWS = 300_000


def _dates(rng) -> pd.DataFrame:
    """lineitem's dates in small: an order day ``o``, a ship day ``s = o + 1..30`` and a commit day
    ``c = o + 10..40``, each value its own fine bin at this budget; the commit days' last values hold a few rows
    (a triangular tail), few enough that a group's 7% sample mostly holds none of them."""
    o = rng.integers(0, 400, ROWS)
    return pd.DataFrame({"g": np.where(rng.random(ROWS) < 0.5, "a", "b"), "s": o + rng.integers(1, 31, ROWS),
                         "c": o + rng.integers(10, 41, ROWS), "x": rng.random(ROWS)})


def test_a_dropped_tail_bin_no_sample_row_lies_in_widens_the_interval(rng, frame_engine):
    # s >= lo AND c < max(c) - k drops c's last k + 1 values (~22 rows for k = 0, ~70 for k = 1). The (s, c) pair
    # grid's cells hold ~4 values of c each, and the fit's term from s's fine bins gives the dropped rows' cell
    # mates a share just under 1; with none of the dropped rows sampled, the fit took that shortfall for missing
    # rows and answered a count near the undropped one inside an interval of ±25 (k = 0: 23 of 40 covered, rms z
    # 7.9; k = 1: rms z 4.0, 10 builds). lineitem's `l_shipdate >= '1996-08-31' AND l_commitdate < '1998-10-29'`:
    # 1,907,270 ± 25 against 1,907,025.
    z, covered = [], []
    for _ in range(6):
        df = _dates(rng)
        eng = frame_engine(df)
        eng.build("t", columns=["s", "c", "x"], group_by=["g"], budget_bytes=300_000,
                  seed=int(rng.integers(2**31)))
        syn = eng._load("t")
        assert [info.discrete for info in syn.infos[:2]] == [True, True]  # each day its own fine bin
        top = int(df.c.max())
        for k in (0, 1):
            for lo in (100, 250):
                sql = f"SELECT g, COUNT(*) AS v FROM t WHERE s >= {lo} AND c < {top - k} GROUP BY g ORDER BY g"
                got = eng.query(sql).set_index("g")
                truth = df[(df.s >= lo) & (df.c < top - k)].groupby("g").size()
                covered.extend(((got.v_ci_low <= truth) & (truth <= got.v_ci_high)).tolist())
                z.extend(((got.v - truth) / ((got.v_ci_high - got.v_ci_low) / 3.92)).tolist())
    z = np.asarray(z)
    rms = float(np.sqrt(np.mean(z**2)))
    # 48 answers: 85-96% covered, rms z 0.87-1.42 over 12 seeds (before the term: 71-83%, rms z 4.8-7.1)
    assert np.mean(covered) >= 0.75, (np.mean(covered), rms)
    assert 0.4 <= rms <= 2.5, rms  # from both sides: not the narrow interval, nor one far too wide
