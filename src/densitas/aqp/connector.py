"""The small database interface the engine needs, and its DuckDB implementation.

Another engine fits by implementing :class:`Connector` (:mod:`densitas.aqp.postgres` is PostgreSQL's): run SQL
(a string, or a sqlglot expression it renders in its own dialect), fetch results as NumPy or pandas, describe a
table, report its storage size, and run a block of statements as one transaction. The build writes its SQL with
sqlglot's builders once; what has no portable form (the data fingerprint's hash, a column's distinct values and
quantiles as lists, stable row ids and seeded row hashes, binning a value against sorted edges, temporary tables
built from a query or a frame, the numeric line of dates and timestamps) it asks of the connector, so that a port
implements those methods.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pandas as pd
import sqlglot
from sqlglot import exp

from densitas.exceptions import DatabaseError, InputError

__all__ = ["SQL", "Connector", "DuckDBConnector", "connect", "quote", "table_expr"]

#: A statement: SQL text, or a sqlglot expression the connector renders in its dialect.
SQL = str | exp.Expression


def quote(name: str) -> str:
    """A double-quoted SQL identifier."""
    return '"' + name.replace('"', '""') + '"'


def table_ref(name: str) -> str:
    """``schema.table`` or ``table``, each part quoted."""
    return ".".join(quote(p) for p in name.split(".", 1))


def table_expr(name: str) -> exp.Table:
    """``schema.table`` or ``table`` as a sqlglot table, each part quoted.

    Examples
    --------
    >>> table_expr("main.t").sql("duckdb")
    '"main"."t"'
    """
    schema, tbl = name.split(".", 1) if "." in name else (None, name)
    return exp.table_(tbl, db=schema, quoted=True)


class Connector(Protocol):
    """What :class:`~densitas.aqp.Engine` asks of a database.

    Every method raises :class:`~densitas.DensitasError` subclasses only: :class:`~densitas.InputError` when
    the SQL names a table or column the database does not hold, :class:`~densitas.DatabaseError` for any other
    failure of the database (a locked file, I/O, a read-only database, ...).
    """

    dialect: str  # the sqlglot dialect expressions are rendered in
    ordered_row_ids: bool  # whether rows appended later get larger row ids (DuckDB yes, PostgreSQL's ctid no)

    def execute(self, sql: SQL, params: list | None = None) -> None: ...

    def fetch_df(self, sql: SQL, params: list | None = None) -> pd.DataFrame: ...

    def fetch_rows(self, sql: SQL, params: list | None = None) -> list[tuple]: ...

    def fetch_numpy(self, sql: SQL, params: list | None = None) -> dict[str, np.ndarray]: ...

    def insert_frame(self, table: str | exp.Table, frame: pd.DataFrame) -> None:
        """Append the rows of ``frame`` (columns in the table's order) to ``table``."""
        ...

    def columns(self, table: str) -> list[tuple[str, str]]:
        """``(name, SQL type)`` of each column, or raise InputError naming the table."""
        ...

    def table_bytes(self, table: str) -> int:
        """Bytes the table occupies in the database."""
        ...

    def transaction(self) -> contextlib.AbstractContextManager: ...

    # ---- what the build needs that has no portable SQL ----------------------------------------------------------
    def create_temp_table(self, name: str, rows: exp.Query | pd.DataFrame, params: list | None = None) -> None:
        """Create the temporary table ``name`` holding the rows of a query (``params`` its parameters) or a frame
        (columns keep the frame's dtypes: int32 -> INTEGER, int64 -> BIGINT, float64 -> DOUBLE)."""
        ...

    def to_line(self, column: exp.Expression, kind: str) -> exp.Expression:
        """``column`` as DOUBLE on its numeric line: days since 1970-01-01 for ``kind`` ``"date"``, microseconds
        since the epoch for ``"timestamp"``, the value itself otherwise."""
        ...

    def fingerprint_query(self, table: str, columns: list[str]) -> exp.Select:
        """One row: the table's row count and an order-independent hash of ``columns``."""
        ...

    def distinct_values(self, value: exp.Expression, column: str) -> exp.Expression:
        """Aggregate: the sorted distinct values of ``value`` over the rows where ``column`` is not NULL, as a
        list."""
        ...

    def quantiles(self, value: exp.Expression, probabilities: list[float]) -> exp.Expression:
        """Aggregate: the discrete quantiles of ``value`` (values of the table) at ``probabilities``, as a
        list."""
        ...

    def row_id(self, table: str, qualifier: str | None = None) -> exp.Expression | None:
        """A stable id of each row of ``table`` (``qualifier.`` before it when given), or None when the table has
        none."""
        ...

    def row_hash(self, *values: exp.Expression) -> exp.Expression:
        """A 64-bit unsigned hash of ``values`` (the same values of the same types hash the same)."""
        ...

    def salt_param(self) -> exp.Expression:
        """A parameter typed as :meth:`row_hash`'s hashes, to XOR a seed into them."""
        ...

    def hash_unit(self, h: exp.Expression) -> exp.Expression:
        """A hash ``h`` of :meth:`row_hash` mapped to a DOUBLE in [0, 1) (its top 53 bits), in the hashes' order."""
        ...

    def bin_join(self, query: exp.Select, edges: exp.Expression, alias: str, value: exp.Expression
                 ) -> tuple[exp.Select, exp.Expression]:
        """``query`` joined to what bins ``value`` (as ``alias``), and the bin number: of the rows of ``edges``
        (columns ``bin``, numbered 1, 2, ... in increasing ``lo``, and ``lo``), the ``bin`` of the one with the
        largest ``lo`` at most ``value``; 0 or NULL below the first and for NULL."""
        ...


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

    Examples
    --------
    >>> con = DuckDBConnector(":memory:")
    >>> con.execute("CREATE TABLE t AS SELECT range AS x FROM range(5)")
    >>> con.fetch_rows(sqlglot.select(exp.Max(this=exp.column("x"))).from_("t"))
    [(4,)]
    """

    dialect = "duckdb"
    ordered_row_ids = True  # rows appended later get larger row ids (Engine.refresh finds them by it)

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

    def _run(self, sql: SQL, params: list | None, fetch: Callable[[Any], Any] | None = None) -> Any:
        """Run ``sql`` on this thread's cursor, then ``fetch`` its result; DuckDB's errors become DensitasErrors."""
        import duckdb

        if isinstance(sql, exp.Expression):
            sql = sql.sql(self.dialect)
        try:
            res = self.cursor.execute(sql, params)
            return fetch(res) if fetch is not None else None
        except duckdb.InterruptException:
            raise
        except duckdb.Error as exc:
            raise _translate(exc) from None

    def execute(self, sql: SQL, params: list | None = None) -> None:
        """Run ``sql`` (with ``?`` parameters ``params``)."""
        self._run(sql, params)

    def fetch_df(self, sql: SQL, params: list | None = None) -> pd.DataFrame:
        """The result of ``sql`` as a DataFrame."""
        return self._run(sql, params, lambda r: r.df())

    def fetch_rows(self, sql: SQL, params: list | None = None) -> list[tuple]:
        """The result of ``sql`` as a list of tuples."""
        return self._run(sql, params, lambda r: r.fetchall())

    def fetch_numpy(self, sql: SQL, params: list | None = None) -> dict[str, np.ndarray]:
        """The result of ``sql`` as one NumPy array per column."""
        return self._run(sql, params, lambda r: r.fetchnumpy())

    def insert_frame(self, table: str | exp.Table, frame: pd.DataFrame) -> None:
        """Append the rows of ``frame`` (columns in the table's order) to ``table`` (SQL text or a sqlglot
        table)."""
        if isinstance(table, exp.Expression):
            table = table.sql(self.dialect)
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

    # ---- what the build needs that has no portable SQL ----------------------------------------------------------
    def create_temp_table(self, name: str, rows: exp.Query | pd.DataFrame, params: list | None = None) -> None:
        """``CREATE TEMP TABLE name AS`` the query, or the frame's rows."""
        target = exp.to_identifier(name, quoted=True)
        if isinstance(rows, pd.DataFrame):
            cur = self.cursor
            cur.register("_densitas_frame", rows)
            try:
                self._run(exp.Create(this=target, kind="TABLE", expression=sqlglot.select("*").from_("_densitas_frame"),
                                     properties=exp.Properties(expressions=[exp.TemporaryProperty()])), None)
            finally:
                cur.unregister("_densitas_frame")
            return
        self._run(exp.Create(this=target, kind="TABLE", expression=rows,
                             properties=exp.Properties(expressions=[exp.TemporaryProperty()])), params)

    def to_line(self, column: exp.Expression, kind: str) -> exp.Expression:
        """``CAST(datediff('day', DATE '1970-01-01', c) AS DOUBLE)``, ``CAST(epoch_us(c) AS DOUBLE)`` or
        ``CAST(c AS DOUBLE)``."""
        return line_expr(column, kind)

    def fingerprint_query(self, table: str, columns: list[str]) -> exp.Select:
        """``SELECT count(*), bit_xor(hash(columns...)) FROM table``."""
        return duckdb_fingerprint(table, columns)

    def distinct_values(self, value: exp.Expression, column: str) -> exp.Expression:
        """``list(DISTINCT value ORDER BY value) FILTER (WHERE column IS NOT NULL)``."""
        agg = exp.ArrayAgg(this=exp.Distinct(expressions=[exp.Order(this=value.copy(),
                                                                    expressions=[exp.Ordered(this=value.copy())])]))
        return exp.Filter(this=agg, expression=exp.Where(this=exp.column(column, quoted=True).is_(exp.null()).not_()))

    def quantiles(self, value: exp.Expression, probabilities: list[float]) -> exp.Expression:
        """``quantile_disc(value, [p0, p1, ...])``.

        The probabilities are written as a list literal of their shortest decimal forms, not passed as a
        DOUBLE[] parameter: DuckDB types such a list as DECIMAL, and the quantile it picks at a probability
        like 89/164 differs from the one at the nearest double, so the literal keeps the edges of every
        synopsis built so far.
        """
        probs = exp.Array(expressions=[exp.Literal.number(repr(float(p))) for p in probabilities])
        return exp.Anonymous(this="quantile_disc", expressions=[value, probs])

    def row_id(self, table: str, qualifier: str | None = None) -> exp.Expression | None:
        """DuckDB's ``rowid`` where ``table`` has one (a base table), else None."""
        probe = sqlglot.select(exp.column("rowid")).from_(table_expr(table)).limit(0)
        try:
            self.fetch_rows(probe)
        except (InputError, DatabaseError):
            return None
        return exp.column("rowid", table=qualifier)

    def row_hash(self, *values: exp.Expression) -> exp.Expression:
        """``hash(values...)``."""
        return exp.Anonymous(this="hash", expressions=list(values))

    def salt_param(self) -> exp.Expression:
        """``CAST(? AS UBIGINT)``."""
        return exp.cast(exp.Placeholder(), exp.DataType.build("UBIGINT", dialect="duckdb"))

    def hash_unit(self, h: exp.Expression) -> exp.Expression:
        """``(h >> 11)::DOUBLE / 2^53``."""
        top = exp.cast(exp.paren(exp.BitwiseRightShift(this=h, expression=exp.Literal.number(11))), "DOUBLE")
        return exp.Div(this=top, expression=exp.Literal.number("9007199254740992.0"))

    def bin_join(self, query: exp.Select, edges: exp.Expression, alias: str, value: exp.Expression
                 ) -> tuple[exp.Select, exp.Expression]:
        """``query ASOF LEFT JOIN edges AS alias ON value >= alias.lo``, and the bin ``alias.bin``."""
        return self.asof_left_join(query, edges, alias, value, "lo"), exp.column("bin", table=alias, quoted=True)

    def asof_left_join(self, query: exp.Select, right: exp.Expression, alias: str, left_value: exp.Expression,
                       right_value: str) -> exp.Select:
        """``query ASOF LEFT JOIN right AS alias ON left_value >= alias.right_value``."""
        on = left_value >= exp.column(right_value, table=alias, quoted=True)
        return query.join(exp.Join(this=exp.alias_(right, alias, table=True, quoted=True), method="ASOF",
                                   side="LEFT", on=on))

    def close(self) -> None:
        self._con.close()


def duckdb_fingerprint(table: str, columns: list[str]) -> exp.Select:
    """DuckDB: the table's row count and an order-independent hash of ``columns``.

    Examples
    --------
    >>> print(duckdb_fingerprint("t", ["a"]).sql("duckdb"))
    SELECT COUNT(*), BIT_XOR(HASH("a")) FROM "t"
    """
    h = exp.Anonymous(this="hash", expressions=[exp.column(c, quoted=True) for c in columns])
    return sqlglot.select(exp.Count(this=exp.Star()), exp.Anonymous(this="bit_xor", expressions=[h])
                          ).from_(table_expr(table))


def line_expr(column: exp.Expression, kind: str) -> exp.Expression:
    """DuckDB: ``column`` as DOUBLE on its numeric line (days since 1970-01-01 for dates, microseconds since the
    epoch for timestamps).

    Examples
    --------
    >>> print(line_expr(exp.column("d", quoted=True), "date").sql("duckdb"))
    CAST(DATEDIFF('day', CAST('1970-01-01' AS DATE), "d") AS DOUBLE)
    """
    if kind == "date":
        column = exp.Anonymous(this="datediff", expressions=[exp.Literal.string("day"),
                                                             exp.cast(exp.Literal.string("1970-01-01"), "DATE"),
                                                             column])
    elif kind == "timestamp":
        column = exp.Anonymous(this="epoch_us", expressions=[column])
    return exp.cast(column, "DOUBLE")


def connect(database: Any, *, read_only: bool = False) -> Connector:
    """A connector for ``database``: a Connector is returned as is; a PostgreSQL URL (``postgresql://...``) or
    psycopg connection becomes a :class:`~densitas.aqp.postgres.PostgresConnector`; a path or DuckDB connection a
    :class:`DuckDBConnector`.

    Examples
    --------
    >>> import duckdb
    >>> con = connect(duckdb.connect())
    >>> con.fetch_rows("SELECT 40 + 2")
    [(42,)]
    >>> connect(con) is con
    True
    """
    if hasattr(database, "fetch_df") and hasattr(database, "transaction"):
        return database
    from densitas.aqp.postgres import PostgresConnector, is_postgres

    if is_postgres(database):
        return PostgresConnector(database, read_only=read_only)
    return DuckDBConnector(database, read_only=read_only)
