from __future__ import annotations

import os
import uuid

import duckdb
import pytest

from densitas.aqp import Engine
from densitas.aqp.connector import DuckDBConnector
from densitas.aqp.datasets import synthetic

#: set to 1 to skip the PostgreSQL tests on a machine without a server (CI never sets it: there they must run)
SKIP_POSTGRES = os.environ.get("DENSITAS_SKIP_POSTGRES") == "1"


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


@pytest.fixture
def frame_engine():
    """``frame_engine(df)``: an :class:`Engine` over an in-memory DuckDB database holding the DataFrame ``df`` as
    table ``t`` (its connection closed after the test)."""
    cons = []

    def load(df):
        con = duckdb.connect()
        cons.append(con)
        con.register("frame", df)
        con.execute("CREATE TABLE t AS SELECT * FROM frame")
        con.unregister("frame")
        return Engine(con)

    yield load
    for con in cons:
        con.close()


@pytest.fixture(scope="session")
def pg_server():
    """A real PostgreSQL server in a temporary directory for the whole session (one per xdist worker).

    It fails loudly when no server can be started; ``DENSITAS_SKIP_POSTGRES=1`` skips the PostgreSQL tests
    instead (for developers without the binaries; ``make test`` installs them)."""
    if SKIP_POSTGRES:
        pytest.skip("DENSITAS_SKIP_POSTGRES=1")
    from densitas.aqp.pgtemp import TempPostgres

    server = TempPostgres().start()
    yield server
    server.stop()


@pytest.fixture
def pg_url(pg_server):
    """The URL of a fresh, empty database of the session's server (dropped after the test)."""
    import psycopg

    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server.url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    yield pg_server.url_for(name)
    with psycopg.connect(pg_server.url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=["duckdb", "postgres"])
def any_engine(request):
    """An empty database of each engine: an in-memory DuckDB, a fresh PostgreSQL database."""
    if request.param == "duckdb":
        eng = Engine(duckdb.connect())
    else:
        eng = Engine(request.getfixturevalue("pg_url"))
    yield eng
    eng.close()
