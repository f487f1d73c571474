from __future__ import annotations

import duckdb
import pytest

from densitas.aqp import Engine
from densitas.aqp.connector import DuckDBConnector
from densitas.aqp.datasets import synthetic


@pytest.fixture(scope="module")
def syn_db(tmp_path_factory):
    """A 30,000-row synthetic table in a DuckDB file with a synopsis (grouped by region)."""
    path = tmp_path_factory.mktemp("aqp") / "syn.duckdb"
    con = DuckDBConnector(str(path))
    synthetic(con, 30_000, seed=3)
    con.close()
    eng = Engine(str(path))
    eng.build("synthetic", group_by=["region"], budget_bytes=400_000)
    yield eng
    eng.close()


@pytest.fixture
def mem_engine():
    con = duckdb.connect()
    yield Engine(con)
    con.close()
