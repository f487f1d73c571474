from __future__ import annotations

import datetime as dt

import pytest

from densitas.aqp.sql import parse
from densitas.exceptions import InputError, UnsupportedQueryError


def test_parse_aggregates_conditions_groups():
    q = parse("SELECT g, COUNT(*), SUM(x) AS s, AVG(y) FROM t WHERE x BETWEEN 1 AND 2 AND 3 < y "
              "AND d >= DATE '2020-01-02' AND g IN ('a', 'b') AND z = -1.5 GROUP BY g ORDER BY s DESC")
    assert q.table == "t"
    assert [(a.func, a.column, a.alias) for a in q.aggregates] == [
        ("count", None, "count"), ("sum", "x", "s"), ("avg", "y", "avg_y")]
    ops = [(c.column, c.op, c.value) for c in q.conditions]
    assert ("x", ">=", 1) in ops and ("x", "<=", 2) in ops
    assert ("y", ">", 3) in ops  # 3 < y flipped
    assert ("d", ">=", dt.date(2020, 1, 2)) in ops
    assert ("g", "in", ("a", "b")) in ops and ("z", "=", -1.5) in ops
    assert q.group_by == ("g",) and q.order_by == (("s", True),)


@pytest.mark.parametrize("sql, construct", [
    ("SELECT COUNT(*) FROM t WHERE a < 1 OR b > 2", "OR"),
    ("SELECT MIN(a) FROM t", "MIN"),
    ("SELECT COUNT(*) FROM t JOIN u ON t.a = u.a", "JOIN"),
    ("SELECT COUNT(*) FROM (SELECT * FROM t)", "FROM"),
    ("SELECT COUNT(*) FROM t WHERE a < b", "comparison"),
    ("SELECT COUNT(*) FROM t WHERE s LIKE 'x%'", "LIKE"),
    ("SELECT SUM(a + b) FROM t", "expression"),
    ("SELECT COUNT(DISTINCT a) FROM t", "DISTINCT"),
    ("SELECT COUNT(*) FROM t WHERE NOT a < 1", "NOT"),
    ("SELECT COUNT(*) FROM t HAVING COUNT(*) > 1", "HAVING"),
    ("SELECT COUNT(*) FROM t LIMIT 3", "LIMIT"),
    ("SELECT a, COUNT(*) FROM t", "not in GROUP BY"),
    ("DELETE FROM t", "DELETE"),
    ("SELECT COUNT(*) FROM t WHERE a <> 1", "<>"),
    ("SELECT COUNT(*) FROM t WHERE a = NULL", "NULL"),
])
def test_unsupported_constructs_are_named(sql, construct):
    with pytest.raises(UnsupportedQueryError, match=construct):
        parse(sql)


def test_bad_sql_and_duplicate_names():
    with pytest.raises(InputError, match="sql"):
        parse("SELEC COUNT(*) FRM t WHERE")
    with pytest.raises(InputError, match="appears twice"):
        parse("SELECT SUM(a) AS x, AVG(b) AS x FROM t")
