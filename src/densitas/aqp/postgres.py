"""The PostgreSQL connector: synopses built and stored inside a PostgreSQL server (psycopg 3).

Everything the build does runs as SQL in the server, written by the same sqlglot builders as for DuckDB and
rendered in PostgreSQL's dialect; only the sample and small aggregates (histogram bins, quantile edges, pair
cells) come back to Python. What has no portable SQL is answered here:

* row ids: ``ctid`` (the tuple's physical position, as text): stable while the build runs, so the seeded sample
  is a function of the table's layout and the seed;
* hashes: ``hashtextextended`` of the values' text, its sign bit cleared (a 63-bit non-negative BIGINT, so that
  its order and :meth:`PostgresConnector.hash_unit`'s order agree);
* binning a continuous column: ``width_bucket(value, edges)`` against the sorted lower edges (DuckDB's ASOF JOIN);
* distinct values and quantiles: ``array_agg(DISTINCT ...)`` and ``percentile_disc(ARRAY[...]) WITHIN GROUP``;
* the data fingerprint: ``bit_xor`` of the rows' hashes (PostgreSQL 14 and later);
* types are reported in DuckDB's spelling (``DOUBLE``, ``DECIMAL(15,2)``, ``VARCHAR``, ``TIMESTAMP``), the
  vocabulary :mod:`densitas.aqp.columns` classifies.

Errors of the server become :class:`~densitas.InputError` (unknown table, column or function, SQL that does not
parse) or :class:`~densitas.DatabaseError` (everything else, a failed connection included).
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import numpy as np
import pandas as pd
import sqlglot
from sqlglot import exp
from sqlglot.dialects.postgres import Postgres

from densitas.aqp.connector import SQL, table_expr, table_ref
from densitas.exceptions import DatabaseError, InputError

__all__ = ["DensitasPostgres", "PostgresConnector", "is_postgres"]

_HASH_MASK = 9223372036854775807  # 2^63 - 1: a hash with its sign bit cleared


class DensitasPostgres(Postgres):
    """PostgreSQL's sqlglot dialect, with integer division as ``/`` (sqlglot's ``DIV()`` returns NUMERIC) and
    ``%`` written as ``MOD()`` (a bare ``%`` would read as a parameter marker to psycopg).

    Examples
    --------
    >>> e = exp.IntDiv(this=exp.column("a"), expression=exp.Literal.number(3))
    >>> e.sql(DensitasPostgres), exp.Mod(this=exp.column("a"), expression=exp.column("b")).sql(DensitasPostgres)
    ('a / 3', 'MOD(a, b)')
    """

    class Generator(Postgres.Generator):
        TRANSFORMS = {**Postgres.Generator.TRANSFORMS,  # noqa: RUF012 (sqlglot's own convention)
                      exp.IntDiv: lambda self, e: self.binary(e, "/"),
                      exp.Mod: lambda self, e: self.func("MOD", e.this, e.expression)}


def is_postgres(database: Any) -> bool:
    """Whether ``database`` is a PostgreSQL URL or an open psycopg connection.

    Examples
    --------
    >>> is_postgres("postgresql://user@host/db"), is_postgres("file.duckdb")
    (True, False)
    """
    if isinstance(database, str):
        return database.startswith(("postgresql://", "postgres://"))
    return type(database).__module__.split(".")[0] == "psycopg"


_TYPES = {"double precision": "DOUBLE", "real": "REAL", "integer": "INTEGER", "bigint": "BIGINT",
          "smallint": "SMALLINT", "numeric": "DOUBLE", "date": "DATE", "timestamp without time zone": "TIMESTAMP",
          "text": "VARCHAR", "boolean": "BOOLEAN", "uuid": "UUID"}


def duckdb_type(pg_type: str) -> str:
    """A PostgreSQL type (as ``format_type`` writes it) in DuckDB's spelling; others upper-cased as they are.

    Examples
    --------
    >>> duckdb_type("numeric(15,2)"), duckdb_type("character varying(25)"), duckdb_type("double precision")
    ('DECIMAL(15,2)', 'VARCHAR', 'DOUBLE')
    """
    t = pg_type.lower()
    if t in _TYPES:
        return _TYPES[t]
    m = re.fullmatch(r"numeric\((\d+),(\d+)\)", t)
    if m:
        return f"DECIMAL({m.group(1)},{m.group(2)})"
    if t.startswith(("character varying", "character", "varchar", "char")):
        return "VARCHAR"
    return pg_type.upper()


def _translate(exc: Exception, what: str = "the database could not run the statement") -> Exception:
    import psycopg

    text = " ".join(str(exc).split())
    errors = psycopg.errors
    if isinstance(exc, (errors.UndefinedTable, errors.UndefinedColumn, errors.UndefinedFunction,
                        errors.SyntaxError, errors.InvalidSchemaName, errors.UndefinedObject)):
        return InputError(f"{what}: {text}")
    return DatabaseError(f"{what}: {text}")


def _plain(v: Any) -> Any:
    """A fetched value as a plain Python number where it is a Decimal (NUMERIC sums, averages)."""
    return float(v) if isinstance(v, Decimal) else v


class PostgresConnector:
    """A PostgreSQL database: a connection URL (``postgresql://user@host:port/db``) or an open psycopg 3
    connection (used as is; it is put in autocommit mode, transactions are explicit).

    Examples
    --------
    >>> from densitas.aqp.pgtemp import TempPostgres
    >>> with TempPostgres() as pg:
    ...     con = PostgresConnector(pg.url)
    ...     con.execute("CREATE TABLE t AS SELECT i::float8 AS x FROM generate_series(0, 4) i")
    ...     print(con.fetch_rows(sqlglot.select(exp.Max(this=exp.column("x"))).from_("t")), con.columns("t"))
    ...     con.close()
    [(4.0,)] [('x', 'DOUBLE')]
    """

    dialect = DensitasPostgres
    ordered_row_ids = False  # a ctid says where a row lies, not when it came: refresh needs an append_key

    def __init__(self, database: Any, *, read_only: bool = False) -> None:
        try:
            import psycopg
        except ImportError:
            raise InputError("PostgreSQL needs psycopg 3: pip install 'densitas[postgres]' "
                             "(or pip install 'psycopg[binary]').") from None
        self._lock = threading.RLock()
        self._owned = isinstance(database, str)
        if self._owned:
            try:
                self._con = psycopg.connect(database, autocommit=True)
            except psycopg.Error as exc:
                raise DatabaseError(f"cannot connect to {database!r}: {' '.join(str(exc).split())}") from None
        else:
            self._con = database
            if self._con.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
                self._con.autocommit = True
        self.path = None
        self.read_only = read_only
        if read_only:
            self.execute("SET default_transaction_read_only = on")

    # ---- running statements -------------------------------------------------------------------------------------
    def _text(self, sql: SQL) -> str:
        return sql.sql(dialect=self.dialect) if isinstance(sql, exp.Expression) else sql

    def _run(self, sql: SQL, params: list | None, fetch: bool) -> tuple[list[str], list[tuple]]:
        import psycopg

        text = self._text(sql)
        with self._lock:
            try:
                cur = self._con.execute(text, params or None)
                if not fetch:
                    return [], []
                names = [d.name for d in cur.description] if cur.description else []
                return names, cur.fetchall()
            except psycopg.Error as exc:
                raise _translate(exc) from None

    def execute(self, sql: SQL, params: list | None = None) -> None:
        """Run ``sql`` (with ``%s`` parameters ``params``; expressions' placeholders render as ``%s``)."""
        self._run(sql, params, fetch=False)

    def fetch_rows(self, sql: SQL, params: list | None = None) -> list[tuple]:
        """The result of ``sql`` as a list of tuples (NUMERIC values as floats)."""
        _, rows = self._run(sql, params, fetch=True)
        return [tuple(_plain(v) for v in r) for r in rows]

    def fetch_df(self, sql: SQL, params: list | None = None) -> pd.DataFrame:
        """The result of ``sql`` as a DataFrame (NUMERIC values as floats)."""
        names, rows = self._run(sql, params, fetch=True)
        df = pd.DataFrame.from_records([tuple(_plain(v) for v in r) for r in rows], columns=names)
        for c in df.columns:  # an all-NULL or integer column with NULLs: floats with NaN, as DuckDB gives
            if df[c].dtype == object and df[c].map(lambda v: v is None or isinstance(v, (int, float))).all():
                df[c] = pd.to_numeric(df[c], errors="coerce")
        return df

    def fetch_numpy(self, sql: SQL, params: list | None = None) -> dict[str, np.ndarray]:
        """The result of ``sql`` as one NumPy array per column; a column with NULLs is a masked array."""
        names, rows = self._run(sql, params, fetch=True)
        out: dict[str, np.ndarray] = {}
        for i, name in enumerate(names):
            vals = [_plain(r[i]) for r in rows]
            mask = np.array([v is None for v in vals], dtype=bool)
            if mask.any():
                out[name] = np.ma.masked_array([0.0 if v is None else float(v) for v in vals], mask=mask)
            elif vals and all(isinstance(v, int) for v in vals):
                out[name] = np.asarray(vals, dtype=np.int64)
            elif vals and all(isinstance(v, (int, float)) for v in vals):
                out[name] = np.asarray(vals, dtype=np.float64)
            else:
                out[name] = np.asarray(vals, dtype=object) if vals else np.zeros(0)
        return out

    def insert_frame(self, table: str | exp.Table, frame: pd.DataFrame) -> None:
        """Append the rows of ``frame`` (columns in the table's order) to ``table`` with ``COPY``."""
        import psycopg

        target = self._text(table) if isinstance(table, exp.Expression) else table
        cols = [[None if pd.isna(v) else v for v in frame[c].tolist()] for c in frame.columns]
        with self._lock:
            try:
                with self._con.cursor() as cur, cur.copy(f"COPY {target} FROM STDIN") as copy:
                    for row in zip(*cols, strict=True):
                        copy.write_row(row)
            except psycopg.Error as exc:
                raise _translate(exc) from None

    # ---- the catalog of the database ----------------------------------------------------------------------------
    def tables(self) -> list[str]:
        rows = self.fetch_rows("SELECT table_schema, table_name FROM information_schema.tables WHERE table_type = "
                               "'BASE TABLE' AND table_schema NOT IN ('pg_catalog', 'information_schema', 'densitas') "
                               "AND table_schema NOT LIKE 'pg_temp%' ORDER BY 1, 2")
        return [t if s == "public" else f"{s}.{t}" for s, t in rows]

    def _oid(self, table: str) -> tuple[int | None, str | None]:
        """The table's oid and relkind (None where it does not exist)."""
        rows = self.fetch_rows("SELECT c.oid::bigint, c.relkind::text FROM pg_class c WHERE c.oid = "
                               "to_regclass(%s)", [table_ref(table)])
        return (int(rows[0][0]), rows[0][1]) if rows else (None, None)

    def columns(self, table: str) -> list[tuple[str, str]]:
        """``(name, type)`` of each column, types in DuckDB's spelling (see :func:`duckdb_type`)."""
        oid, kind = self._oid(table)
        if oid is None:
            raise InputError(f"table {table!r} does not exist; the database holds {self.tables()}.")
        if kind in ("v", "m"):
            raise InputError(f"table {table!r} is a view; build synopses on a table.")
        rows = self.fetch_rows("SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = "
                               "%s AND attnum > 0 AND NOT attisdropped ORDER BY attnum", [oid])
        return [(r[0], duckdb_type(r[1])) for r in rows]

    def table_bytes(self, table: str) -> int:
        """``pg_table_size``: the table's heap, TOAST and free-space map (not its indexes)."""
        return int(self.fetch_rows("SELECT pg_table_size(to_regclass(%s))", [table_ref(table)])[0][0] or 0)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """Run the block as one transaction (committed when it ends, rolled back when it raises); DDL included."""
        import psycopg

        with self._lock:
            try:
                with self._con.transaction():
                    yield
            except psycopg.Error as exc:
                raise _translate(exc) from None

    # ---- what the build needs that has no portable SQL ----------------------------------------------------------
    def create_temp_table(self, name: str, rows: exp.Query | pd.DataFrame, params: list | None = None) -> None:
        """``CREATE TEMPORARY TABLE name AS`` the query, or the frame's rows (created, then copied in)."""
        target = exp.to_identifier(name, quoted=True)
        temp = exp.Properties(expressions=[exp.TemporaryProperty()])
        if isinstance(rows, pd.DataFrame):
            kinds = {"i": "BIGINT", "u": "BIGINT", "f": "DOUBLE", "b": "BOOLEAN"}
            defs = []
            for c in rows.columns:
                dt = rows[c].dtype
                t = "INTEGER" if dt == np.int32 else kinds.get(getattr(dt, "kind", "O"), "VARCHAR")
                defs.append(exp.ColumnDef(this=exp.to_identifier(str(c), quoted=True),
                                          kind=exp.DataType.build(t, dialect="duckdb")))
            self.execute(exp.Create(this=exp.Schema(this=exp.table_(name, quoted=True), expressions=defs),
                                    kind="TABLE", properties=temp))
            self.insert_frame(exp.table_(name, quoted=True), rows)
            return
        self._run(exp.Create(this=target, kind="TABLE", expression=rows, properties=temp), params, fetch=False)

    def to_line(self, column: exp.Expression, kind: str) -> exp.Expression:
        """``CAST(c - DATE '1970-01-01' AS DOUBLE PRECISION)`` (days), ``CAST(EXTRACT(EPOCH FROM c) * 1000000 AS
        DOUBLE PRECISION)`` (microseconds) or ``CAST(c AS DOUBLE PRECISION)``."""
        if kind == "date":
            column = exp.paren(exp.Sub(this=column, expression=exp.cast(exp.Literal.string("1970-01-01"), "DATE")))
        elif kind == "timestamp":
            column = exp.Mul(this=exp.Extract(this=exp.var("EPOCH"), expression=column),
                             expression=exp.Literal.number(1000000))
        return exp.cast(column, "DOUBLE")

    def fingerprint_query(self, table: str, columns: list[str]) -> exp.Select:
        """``SELECT count(*), bit_xor(hash of the row's text) FROM table``."""
        row = exp.cast(exp.Anonymous(this="ROW", expressions=[exp.column(c, quoted=True) for c in columns]), "TEXT")
        return sqlglot.select(exp.Count(this=exp.Star()),
                              exp.Anonymous(this="bit_xor", expressions=[self._hash(row)])).from_(table_expr(table))

    def distinct_values(self, value: exp.Expression, column: str) -> exp.Expression:
        """``array_agg(DISTINCT value ORDER BY value) FILTER (WHERE column IS NOT NULL)``."""
        agg = exp.ArrayAgg(this=exp.Distinct(expressions=[exp.Order(this=value.copy(),
                                                                    expressions=[exp.Ordered(this=value.copy())])]))
        return exp.Filter(this=agg, expression=exp.Where(this=exp.column(column, quoted=True).is_(exp.null()).not_()))

    def quantiles(self, value: exp.Expression, probabilities: list[float]) -> exp.Expression:
        """``percentile_disc(ARRAY[p0, p1, ...]) WITHIN GROUP (ORDER BY value)`` (NULLs ignored)."""
        probs = exp.Array(expressions=[exp.Literal.number(repr(float(p))) for p in probabilities])
        return exp.WithinGroup(this=exp.Anonymous(this="percentile_disc", expressions=[probs]),
                               expression=exp.Order(expressions=[exp.Ordered(this=value)]))

    def row_id(self, table: str, qualifier: str | None = None) -> exp.Expression | None:
        """``CAST(ctid AS TEXT)``: every table row has one (views are refused before)."""
        return exp.cast(exp.column("ctid", table=qualifier), "TEXT")

    @staticmethod
    def _hash(text: exp.Expression) -> exp.Expression:
        """``hashtextextended(text, 0) & (2^63 - 1)``."""
        h = exp.Anonymous(this="hashtextextended", expressions=[text, exp.Literal.number(0)])
        return exp.paren(exp.BitwiseAnd(this=h, expression=exp.Literal.number(_HASH_MASK)))

    def row_hash(self, *values: exp.Expression) -> exp.Expression:
        """A 63-bit non-negative BIGINT hash of the values' text (``|``-joined)."""
        parts = [exp.cast(v, "TEXT") for v in values]
        text = parts[0] if len(parts) == 1 else exp.Anonymous(this="concat_ws",
                                                             expressions=[exp.Literal.string("|"), *parts])
        return self._hash(text)

    def salt_param(self) -> exp.Expression:
        """A parameter typed as :meth:`row_hash`'s hashes (BIGINT), to XOR a seed into them."""
        return exp.cast(exp.Placeholder(), "BIGINT")

    def hash_unit(self, h: exp.Expression) -> exp.Expression:
        """``(h >> 10)::DOUBLE / 2^53``: the top 53 of the hash's 63 bits, in [0, 1)."""
        top = exp.cast(exp.paren(exp.BitwiseRightShift(this=h, expression=exp.Literal.number(10))), "DOUBLE")
        return exp.Div(this=top, expression=exp.Literal.number("9007199254740992.0"))

    def bin_join(self, query: exp.Select, edges: exp.Expression, alias: str, value: exp.Expression
                 ) -> tuple[exp.Select, exp.Expression]:
        """``query CROSS JOIN (SELECT array_agg(lo ORDER BY lo) AS lo FROM edges) AS alias`` and the bin
        ``width_bucket(value, alias.lo)``: the number of lower edges at most ``value`` (0 below the first)."""
        lo = exp.column("lo", quoted=True)
        arr = sqlglot.select(exp.alias_(exp.ArrayAgg(this=exp.Order(this=lo, expressions=[exp.Ordered(
            this=lo.copy())])), "lo", quoted=True)).from_(exp.alias_(edges, "_e", table=True, quoted=True))
        joined = query.join(exp.alias_(arr.subquery(), alias, table=True, quoted=True), join_type="CROSS")
        return joined, exp.Anonymous(this="width_bucket", expressions=[value, exp.column("lo", table=alias,
                                                                                         quoted=True)])

    def close(self) -> None:
        if self._owned:
            self._con.close()
