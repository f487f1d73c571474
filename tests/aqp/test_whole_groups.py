"""Conditions that cut no group's rows in part are no predicates for the model (``Synopsis._predicate_columns``).

A column the group determines (``band`` under a group ``level``), or a bound beyond every row the grids describe
(only rows set aside whole lie past it), keeps each group's rows whole or drops them all. The answer is then the
one the other conditions give, exactly where they are held exactly (a discrete column), checked against DuckDB;
the rows set aside still meet the whole box row by row. Random tables print their seed on failure; replay with
``DENSITAS_TEST_SEED``.
"""

from __future__ import annotations

import json
import os

import duckdb
import numpy as np
import pandas as pd
import pytest

from densitas.aqp import Engine

SEED = int(os.environ.get("DENSITAS_TEST_SEED", "20261124"))
ROWS = 40_000


def _table(seed: int) -> pd.DataFrame:
    """``level`` (a group, 6 values) determines ``band`` (its lower edge, 0, 10, ..., 50); ``year`` is discrete (21
    values); ``y`` is heavy-tailed (log-normal, times a few huge values that the build sets aside whole)."""
    rng = np.random.default_rng(seed)
    level = rng.integers(0, 6, ROWS)
    y = np.exp(rng.normal(8.0, 2.0, ROWS)).round()
    y[rng.random(ROWS) < 0.002] *= 1_000.0
    return pd.DataFrame({"level": np.array(list("abcdef"))[level], "band": level * 10,
                         "year": 2000 + rng.integers(0, 21, ROWS), "y": y})


@pytest.fixture(scope="module")
def engine():
    con = duckdb.connect()
    con.register("frame", _table(SEED))
    con.execute("CREATE TABLE t AS SELECT * FROM frame")
    con.unregister("frame")
    eng = Engine(con)
    meta = eng.build("t", columns=["band", "year", "y"], group_by=["level"], sample_size=2_000, seed=SEED % 10_000)
    eng.synopsis_id = meta["id"]
    eng.y_bound = json.loads(meta["options"])["outliers"][2][1]  # y's upper bound: rows above are set aside
    yield eng, con
    con.close()


def _compare(engine, sql: str, by: str | None):
    eng, con = engine
    got = eng.query(sql)
    truth = con.execute(sql).df()
    if by is not None:
        got, truth = got.sort_values(by).reset_index(drop=True), truth.sort_values(by).reset_index(drop=True)
        assert got[by].tolist() == truth[by].tolist(), f"seed {SEED}: groups {got[by].tolist()}"
    return got, truth


@pytest.mark.parametrize("where, by", [
    ("band >= 20 AND year < 2020", "level"),   # band: the group's own value; year: one discrete cut
    ("band >= 20 AND year < 2020", None),
    ("band IN (10, 30) AND year BETWEEN 2005 AND 2010", "level"),
])
def test_a_condition_the_group_determines_leaves_the_answer_exact(engine, where, by):
    sel = f"{by}, " if by else ""
    sql = f"SELECT {sel}COUNT(*) AS n, SUM(y) AS s, AVG(y) AS a FROM t WHERE {where}"
    sql += f" GROUP BY {by}" if by else ""
    got, truth = _compare(engine, sql, by)
    for c in ("n", "s", "a"):
        np.testing.assert_allclose(got[c], truth[c], rtol=1e-9, err_msg=f"seed {SEED}: {c} of {sql}")
        # an interval of the engine's rounding allowance only: the grids hold the answer
        np.testing.assert_allclose(got[f"{c}_ci_high"] - got[f"{c}_ci_low"], 0.0,
                                   atol=1e-7 * np.abs(truth[c]).max(), err_msg=f"seed {SEED}: {c} of {sql}")


def test_a_bound_past_the_grids_rows_keeps_the_rows_set_aside_in_the_box(engine):
    """``y`` below its largest value keeps every row but the far ones set aside whole; ``y`` at or above a bound
    only rows set aside reach keeps no row of the grids: both answers are exact, the rows set aside counted row by
    row."""
    eng, con = engine
    sid = eng.synopsis_id
    aside = con.execute(f"SELECT COUNT(*) FROM densitas.outliers_{sid}").fetchone()[0]
    assert aside > 0, f"seed {SEED}: the table was meant to have rows set aside whole"
    top = con.execute("SELECT MAX(y) FROM t").fetchone()[0]
    # the least value set aside above the rule's upper bound for y (the synopsis' third column, v2): every row
    # the grids describe lies below it
    bound = con.execute(f"SELECT MIN(v2) FROM densitas.outliers_{sid} WHERE v2 > ?", [eng.y_bound]).fetchone()[0]
    for where in (f"y < {top} AND year < 2020", f"y >= {bound} AND year >= 2003"):
        sql = f"SELECT level, COUNT(*) AS n, SUM(y) AS s FROM t WHERE {where} GROUP BY level"
        got, truth = _compare(engine, sql, "level")
        np.testing.assert_allclose(got["s"], truth["s"], rtol=1e-9, err_msg=f"seed {SEED}: {sql}")
        np.testing.assert_allclose(got["n"], truth["n"], rtol=1e-9, err_msg=f"seed {SEED}: {sql}")


def test_a_partial_cut_stays_a_predicate(engine):
    """``band`` cut between groups' values keeps whole groups; ``year`` cuts each group in part and ``y`` cuts its
    bins: such an answer still rests on the fit, with an interval wider than rounding."""
    sql = "SELECT COUNT(*) AS n FROM t WHERE y < 3000 AND year < 2020"
    got, truth = _compare(engine, sql, None)
    assert float(got["n_ci_high"].iloc[0] - got["n_ci_low"].iloc[0]) > 1.0, f"seed {SEED}"
    assert abs(float(got["n"].iloc[0]) - float(truth["n"].iloc[0])) < 0.05 * float(truth["n"].iloc[0])
