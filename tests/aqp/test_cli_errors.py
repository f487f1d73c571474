"""The AQP commands open databases as they need them and fail with one line, never a traceback."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator

import duckdb
import pytest
from typer.testing import CliRunner

from densitas.aqp import Engine
from densitas.cli.main import app
from densitas.exceptions import DatabaseError, InputError


@pytest.fixture
def db(tmp_path):
    """A DuckDB file with a table ``t`` and its synopsis."""
    path = str(tmp_path / "t.duckdb")
    with Engine(path) as eng:
        eng.con.execute("CREATE TABLE t AS SELECT (i % 100)::DOUBLE AS x, (i % 7)::INTEGER AS k FROM range(5000) r(i)")
        eng.build("t", ["x", "k"])
    return path


@contextlib.contextmanager
def _held(path: str, read_only: bool) -> Iterator[None]:
    """Another process keeps ``path`` open for the block."""
    code = ("import duckdb, sys, time; c = duckdb.connect(sys.argv[1], read_only=sys.argv[2] == '1'); "
            "print('ready', flush=True); time.sleep(120)")
    with subprocess.Popen([sys.executable, "-c", code, path, "1" if read_only else "0"], stdout=subprocess.PIPE,
                          text=True) as proc:
        try:
            assert proc.stdout.readline().strip() == "ready"
            yield
        finally:
            proc.kill()


def test_query_on_a_missing_database_fails_and_creates_nothing(tmp_path):
    typo = tmp_path / "typo.duckdb"
    for args in (["query", "--db", str(typo), "SELECT COUNT(*) FROM t"],
                 ["query", "--db", str(typo), "--exact", "SELECT COUNT(*) FROM t"],
                 ["build", "--db", str(typo), "--table", "t"]):
        r = CliRunner().invoke(app, args)
        assert r.exit_code == 2, r.output
        assert r.exception is None or isinstance(r.exception, SystemExit)
        assert not typo.exists()
    with pytest.raises(InputError):
        Engine(str(typo), read_only=True)
    assert not typo.exists()


def test_queries_run_beside_another_reader(db):
    with _held(db, read_only=True):
        r = CliRunner().invoke(app, ["query", "--db", db, "SELECT COUNT(*) AS n FROM t WHERE x < 10"])
        assert r.exit_code == 0, r.output
        r = CliRunner().invoke(app, ["query", "--db", db, "--exact", "SELECT COUNT(*) AS n FROM t WHERE x < 10"])
        assert r.exit_code == 0, r.output
        assert "500" in r.output


def test_a_locked_database_is_a_one_line_error(db):
    with _held(db, read_only=False):
        with pytest.raises(DatabaseError):
            Engine(db, read_only=True)
        r = CliRunner().invoke(app, ["query", "--db", db, "SELECT COUNT(*) AS n FROM t"])
        assert r.exit_code == 2
        assert isinstance(r.exception, SystemExit)  # handled: no traceback
        assert len(r.output.strip().splitlines()) == 1


def test_exact_from_the_command_line_cannot_write(db):
    for sql in ["SELECT COUNT(*) FROM t; DROP TABLE t", "DROP TABLE t"]:
        for extra in (["--exact"], ["--fallback", "exact"]):
            r = CliRunner().invoke(app, ["query", "--db", db, *extra, sql])
            assert r.exit_code == 2, r.output
    con = duckdb.connect(db, read_only=True)
    assert con.execute("SELECT count(*) FROM t").fetchone()[0] == 5000
    con.close()


def test_query_prints_a_bounded_answer(db, monkeypatch):
    from densitas.cli import aqp as cli_aqp

    monkeypatch.setattr(cli_aqp, "PRINT_ROWS", 10)
    r = CliRunner().invoke(app, ["query", "--db", db, "--exact", "SELECT x, COUNT(*) AS n FROM t GROUP BY x "
                                                                 "ORDER BY x"])
    assert r.exit_code == 0, r.output
    rows = [line for line in r.output.splitlines() if line.lstrip().startswith("│")]
    assert len(rows) == 10  # ten of the hundred groups
