"""The small database interface the engine needs, and its DuckDB implementation.

Another engine (PostgreSQL, ...) fits by implementing :class:`Connector`: run SQL, fetch results as NumPy or
pandas, describe a table, report its storage size, and run a block of statements as one transaction. The SQL
the engine sends is plain ANSI plus ``ASOF JOIN`` and ``quantile_disc``, which a port rewrites through sqlglot.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pandas as pd

from densitas.exceptions import DatabaseError, InputError

__all__ = ["Connector", "DuckDBConnector", "connect", "quote"]


def quote(name: str) -> str:
    """A double-quoted SQL identifier."""
    return '"' + name.replace('"', '""') + '"'


def table_ref(name: str) -> str:
    """``schema.table`` or ``table``, each part quoted."""
    return ".".join(quote(p) for p in name.split(".", 1))


class Connector(Protocol):
    """What :class:`~densitas.aqp.Engine` asks of a database.

    Every method raises :class:`~densitas.DensitasError` subclasses only: :class:`~densitas.InputError` when
    the SQL names a table or column the database does not hold, :class:`~densitas.DatabaseError` for any other
    failure of the database (a locked file, I/O, a read-only database, ...).
    """

    def execute(self, sql: str, params: list | None = None) -> None: ...

    def fetch_df(self, sql: str, params: list | None = None) -> pd.DataFrame: ...

    def fetch_rows(self, sql: str, params: list | None = None) -> list[tuple]: ...

    def fetch_numpy(self, sql: str, params: list | None = None) -> dict[str, np.ndarray]: ...

    def insert_frame(self, table: str, frame: pd.DataFrame) -> None:
        """Append the rows of ``frame`` (columns in the table's order) to ``table``."""
        ...

    def columns(self, table: str) -> list[tuple[str, str]]:
        """``(name, SQL type)`` of each column, or raise InputError naming the table."""
        ...

    def table_bytes(self, table: str) -> int:
        """Bytes the table occupies in the database."""
        ...

    def transaction(self) -> contextlib.AbstractContextManager: ...


def _one_line(exc: BaseException) -> str:
    """DuckDB's message up to its first blank line (the ``LINE 1: ...`` pointer follows it), on one line."""
    text = str(exc).strip().split("\n\n", 1)[0]
    return " ".join(part.strip() for part in text.splitlines() if part.strip())


def _translate(exc: Exception, what: str = "the database could not run the statement") -> Exception:
    """The DensitasError for a DuckDB exception: unknown tables, columns and bad SQL are InputErrors (DuckDB's
    message names the table or column), everything else a DatabaseError."""
    import duckdb

    if isinstance(exc, (duckdb.CatalogException, duckdb.BinderException, duckdb.ParserException)):
        return InputError(f"{what}: {_one_line(exc)}")
    return DatabaseError(f"{what}: {_one_line(exc)}")


class DuckDBConnector:
    """A DuckDB database (file path or open connection). One cursor per thread: DuckDB connections are not
    safe to share between threads, cursors of one connection are.

    DuckDB's own exceptions are raised as :class:`~densitas.InputError` (unknown table or column, SQL that does
    not parse) or :class:`~densitas.DatabaseError` (everything else), with DuckDB's message on one line.
    """

    def __init__(self, database: Any, *, read_only: bool = False) -> None:
        import duckdb

        if isinstance(database, duckdb.DuckDBPyConnection):
            self._con = database
            self.path = None
        elif isinstance(database, (str, Path)):
            p = str(database)
            if p != ":memory:" and not read_only and not Path(p).parent.exists():
                raise InputError(f"database {p!r}: the folder {str(Path(p).parent)!r} does not exist.")
            if read_only and p != ":memory:" and not Path(p).is_file():
                raise InputError(f"database {p!r} does not exist (it is opened read-only, so it is not created).")
            try:
                self._con = duckdb.connect(p, read_only=read_only)
            except duckdb.IOException as exc:
                if "lock" in str(exc).lower():
                    why = ("another process is writing to it (a build in progress?); retry when it has finished"
                           if read_only else "another process has it open; it can be written only when no other "
                           "process holds it")
                    raise DatabaseError(f"database {p!r} is locked: {why}. ({_one_line(exc)})") from None
                raise _translate(exc, f"cannot open database {p!r}") from None
            except duckdb.Error as exc:
                raise _translate(exc, f"cannot open database {p!r}") from None
            self.path = p
        else:
            raise InputError(f"database must be a DuckDB file path or connection, got {type(database).__name__}.")
        self._local = threading.local()
        self._lock = threading.Lock()

    @property
    def cursor(self):
        cur = getattr(self._local, "cur", None)
        if cur is None:
            with self._lock:
                cur = self._con.cursor()
            self._local.cur = cur
        return cur

    def _run(self, sql: str, params: list | None, fetch: Callable[[Any], Any] | None = None) -> Any:
        """Run ``sql`` on this thread's cursor, then ``fetch`` its result; DuckDB's errors become DensitasErrors."""
        import duckdb

        try:
            res = self.cursor.execute(sql, params)
            return fetch(res) if fetch is not None else None
        except duckdb.InterruptException:
            raise
        except duckdb.Error as exc:
            raise _translate(exc) from None

    def execute(self, sql: str, params: list | None = None) -> None:
        """Run ``sql`` (with ``?`` parameters ``params``)."""
        self._run(sql, params)

    def fetch_df(self, sql: str, params: list | None = None) -> pd.DataFrame:
        """The result of ``sql`` as a DataFrame."""
        return self._run(sql, params, lambda r: r.df())

    def fetch_rows(self, sql: str, params: list | None = None) -> list[tuple]:
        """The result of ``sql`` as a list of tuples."""
        return self._run(sql, params, lambda r: r.fetchall())

    def fetch_numpy(self, sql: str, params: list | None = None) -> dict[str, np.ndarray]:
        """The result of ``sql`` as one NumPy array per column."""
        return self._run(sql, params, lambda r: r.fetchnumpy())

    def insert_frame(self, table: str, frame: pd.DataFrame) -> None:
        """Append the rows of ``frame`` (columns in the table's order) to ``table``."""
        cur = self.cursor
        cur.register("_densitas_frame", frame)
        try:
            self._run(f"INSERT INTO {table} SELECT * FROM _densitas_frame", None)
        finally:
            cur.unregister("_densitas_frame")

    def tables(self) -> list[str]:
        rows = self.fetch_rows("SELECT schema_name, table_name FROM duckdb_tables() WHERE NOT temporary "
                               "AND schema_name <> 'densitas' ORDER BY 1, 2")
        return [t if s == "main" else f"{s}.{t}" for s, t in rows]

    def columns(self, table: str) -> list[tuple[str, str]]:
        schema, name = table.split(".", 1) if "." in table else ("main", table)
        rows = self.fetch_rows("SELECT column_name, data_type FROM duckdb_columns() WHERE schema_name = ? AND "
                               "table_name = ? ORDER BY column_index", [schema, name])
        if not rows:
            views = self.fetch_rows("SELECT 1 FROM duckdb_views() WHERE schema_name = ? AND view_name = ?",
                                    [schema, name])
            if views:
                raise InputError(f"table {table!r} is a view; build synopses on a table.")
            raise InputError(f"table {table!r} does not exist; the database holds {self.tables()}.")
        return [(r[0], r[1]) for r in rows]

    def table_bytes(self, table: str) -> int:
        """Distinct storage blocks of the table times the block size; the uncompressed width estimate for
        tables that have not reached storage (in-memory databases, uncheckpointed data)."""
        ref = table_ref(table).replace("'", "''")
        block = self.fetch_rows("SELECT block_size FROM pragma_database_size()")[0][0] or 262144
        rows = self.fetch_rows(f"SELECT count(DISTINCT block_id) FROM pragma_storage_info('{ref}') "
                               "WHERE block_id >= 0")
        blocks = int(rows[0][0] or 0)
        if blocks:
            return blocks * int(block)
        n = self.fetch_rows(f"SELECT count(*) FROM {table_ref(table)}")[0][0]
        return int(n) * 8 * len(self.columns(table))

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """Run the block as one transaction: committed when it ends, rolled back when it raises."""
        self.execute("BEGIN TRANSACTION")
        try:
            yield
        except BaseException:
            self.execute("ROLLBACK")
            raise
        self.execute("COMMIT")

    def close(self) -> None:
        self._con.close()


def connect(database: Any, *, read_only: bool = False) -> Connector:
    """A connector for ``database``: a Connector is returned as is; a path or DuckDB connection is wrapped."""
    if hasattr(database, "fetch_df") and hasattr(database, "transaction"):
        return database
    return DuckDBConnector(database, read_only=read_only)
