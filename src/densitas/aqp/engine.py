"""``Engine``: approximate COUNT/SUM/AVG with confidence intervals from synopses stored in the database."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from densitas.aqp import build as build_mod
from densitas.aqp import synopsis as syn_mod
from densitas.aqp.connector import Connector, connect, quote, table_ref
from densitas.aqp.sql import Query, parse
from densitas.exceptions import DensitasError, InputError, StaleSynopsisError, UnsupportedQueryError

__all__ = ["Engine"]

FALLBACKS = ("error", "exact")
METHODS = ("grid", "kde")


class Engine:
    """Approximate query engine over a database.

    Parameters
    ----------
    database : str, pathlib.Path, duckdb.DuckDBPyConnection or Connector
        A DuckDB file (created if missing), an open DuckDB connection, or any :class:`Connector`.
    read_only : bool
        Open a DuckDB file read-only (queries only; ``build`` then fails).
    recheck_seconds : float
        A loaded synopsis is checked against its table's full fingerprint when it is loaded and against the
        table's row count at most this often afterwards; ``validate`` re-checks the full fingerprint.

    Examples
    --------
    >>> import duckdb
    >>> con = duckdb.connect()
    >>> _ = con.execute("CREATE TABLE t AS SELECT i % 7 AS a, i * 0.5 AS b FROM range(10000) r(i)")
    >>> eng = Engine(con)
    >>> _ = eng.build("t")
    >>> df = eng.query("SELECT COUNT(*) AS n FROM t WHERE a BETWEEN 2 AND 4")
    >>> round(float(df["n"].iloc[0]))  # the exact answer is 4286
    4286
    """

    def __init__(self, database: Any, *, read_only: bool = False, recheck_seconds: float = 1.0) -> None:
        self.con: Connector = connect(database, read_only=read_only)
        self.recheck_seconds = float(recheck_seconds)
        self._cache: dict[str, tuple[syn_mod.Synopsis, float]] = {}
        self._lock = threading.RLock()

    # ---- synopses ---------------------------------------------------------------------------------------------
    def build(self, table: str, columns: Sequence[str] | None = None, group_by: Sequence[str] | None = None, *,
              progress: bool = False, **options: Any) -> dict:
        """Build the synopsis of ``table`` (replacing any previous one atomically); returns its metadata.

        ``options`` are :class:`~densitas.aqp.build.BuildOptions` fields: ``budget_bytes``, ``budget_fraction``
        (default 0.01 of the table's storage), ``max_bins``, ``max_pair_res``, ``min_dependence``, ``sample_size``,
        ``max_groups``, ``shares``,
        ``seed``, ``bandwidth``.
        """
        fields = build_mod.BuildOptions.__dataclass_fields__
        bad = [k for k in options if k not in fields]
        if bad:
            raise InputError(f"unknown build option {bad[0]!r}; options are {sorted(fields)}.")
        opts = build_mod.BuildOptions(**options)
        if isinstance(columns, str):
            columns = [c.strip() for c in columns.split(",") if c.strip()]
        if isinstance(group_by, str):
            group_by = [c.strip() for c in group_by.split(",") if c.strip()]
        with self._lock:
            if progress:
                from rich.progress import Progress

                with Progress(transient=True) as bar:
                    task = bar.add_task(f"building {table}", total=1.0)
                    meta = build_mod.build(self.con, table, columns, group_by, opts,
                                           lambda step, frac: bar.update(task, completed=frac,
                                                                         description=f"{table}: {step}"))
            else:
                meta = build_mod.build(self.con, table, columns, group_by, opts)
            self._cache.pop(table, None)
        return meta

    def synopses(self) -> pd.DataFrame:
        """One row per synopsis: table, rows, size, build time, columns, group_by, created_at."""
        try:
            return self.con.fetch_df(f"SELECT table_name, rows, size_bytes, table_bytes, build_seconds, created_at, "
                                     f"columns, group_by FROM {build_mod.SCHEMA}.synopses ORDER BY table_name")
        except Exception:
            return pd.DataFrame(columns=["table_name", "rows", "size_bytes", "table_bytes", "build_seconds",
                                         "created_at", "columns", "group_by"])

    def validate(self, table: str) -> None:
        """Raise :class:`StaleSynopsisError` when ``table`` changed since its synopsis was built."""
        syn = self._load(table, force=True)
        self._check_fingerprint(syn)

    def _check_fingerprint(self, syn: syn_mod.Synopsis) -> None:
        cols = [i.name for i in syn.infos] + syn.group_by
        try:
            n, h = self.con.fetch_rows(build_mod.fingerprint_sql(syn.table, cols))[0]
        except Exception as exc:
            raise StaleSynopsisError(f"synopsis of {syn.table!r} no longer matches its table: {exc}") from None
        if f"{int(n)}:{h}" != syn.meta["fingerprint"]:
            built_rows = syn.meta["rows"]
            what = (f"it has {int(n)} rows, the synopsis was built on {built_rows}" if int(n) != built_rows
                    else "its content changed (same row count)")
            raise StaleSynopsisError(f"synopsis of {syn.table!r} is stale: {what}; rebuild it "
                                     f"(densitas build / Engine.build) or query with fallback='exact'.")

    def _load(self, table: str, force: bool = False) -> syn_mod.Synopsis:
        with self._lock:
            hit = self._cache.get(table)
            now = time.monotonic()
            if hit is not None and not force:
                syn, checked = hit
                if now - checked > self.recheck_seconds:
                    n = self.con.fetch_rows(f"SELECT count(*) FROM {table_ref(table)}")[0][0]
                    if int(n) != int(syn.meta["rows"]):
                        self._cache.pop(table, None)
                        raise StaleSynopsisError(f"synopsis of {table!r} is stale: the table has {int(n)} rows, "
                                                 f"the synopsis was built on {syn.meta['rows']}; rebuild it or "
                                                 "query with fallback='exact'.")
                    self._cache[table] = (syn, now)
                return syn
            syn = syn_mod.load(self.con, table)
            self._check_fingerprint(syn)
            self._cache[table] = (syn, now)
            return syn

    # ---- queries ----------------------------------------------------------------------------------------------
    def query(self, sql: str, *, confidence: float = 0.95, fallback: str = "error",
              method: str = "grid") -> pd.DataFrame:
        """Answer ``sql`` from the table's synopsis.

        Returns a DataFrame: the GROUP BY columns, then for each aggregate (named by its alias, or ``count``,
        ``count_<col>``, ``sum_<col>``, ``avg_<col>``) the estimate, ``<alias>_ci_low`` and ``<alias>_ci_high``.
        ``df.attrs`` says how it was answered (``method``: grid, kde or exact; ``reason`` when it fell back).
        ``fallback="exact"`` runs in the database what the synopsis cannot answer (unsupported SQL, columns not
        in the synopsis, a stale synopsis) instead of raising.
        """
        if fallback not in FALLBACKS:
            raise InputError(f"fallback must be one of {FALLBACKS}, got {fallback!r}.")
        if method not in METHODS:
            raise InputError(f"method must be one of {METHODS}, got {method!r}.")
        if isinstance(confidence, bool) or not isinstance(confidence, (int, float)) or not 0 < confidence < 1:
            raise InputError(f"confidence must be in (0, 1), got {confidence!r}.")
        t0 = time.perf_counter()
        try:
            q = parse(sql)
            syn = self._load(q.table)
            out, results = syn.estimate(q, method=method)
        except (UnsupportedQueryError, StaleSynopsisError) as exc:
            if fallback == "error":
                raise
            df = self.exact(sql)
            df.attrs["reason"] = str(exc)
            return df
        except InputError as exc:
            if fallback == "exact" and "has no synopsis" in str(exc):
                df = self.exact(sql)
                df.attrs["reason"] = str(exc)
                return df
            raise
        z = syn_mod.z_value(confidence)
        data = dict(out)
        for r in results:
            val, sd = np.asarray(r["value"], dtype=np.float64), np.sqrt(np.maximum(r["var"], 0.0))
            # plus float rounding of the stored sums (the database sums decimals exactly)
            half = z * sd + 1e-9 * np.abs(val)
            low, high = val - half, val + half
            if r["func"] == "count":
                val, low, high = np.maximum(val, 0.0), np.maximum(low, 0.0), np.maximum(high, 0.0)
            else:  # SUM/AVG over no rows is NULL
                empty = ~(np.asarray(r["count"]) >= 0.5)
                val, low, high = (np.where(empty, np.nan, a) for a in (val, low, high))
            data[r["alias"]] = val
            data[f"{r['alias']}_ci_low"] = low
            data[f"{r['alias']}_ci_high"] = high
        df = pd.DataFrame(data)
        if q.order_by:
            df = self._order(df, q)
        df.attrs.update({"method": method, "table": q.table, "synopsis_id": syn.meta["id"],
                         "built_at": str(syn.meta["created_at"]), "confidence": confidence,
                         "elapsed_ms": (time.perf_counter() - t0) * 1e3})
        return df

    @staticmethod
    def _order(df: pd.DataFrame, q: Query) -> pd.DataFrame:
        if q.order_by:
            df = df.sort_values([c for c, _ in q.order_by], ascending=[not d for _, d in q.order_by])
        return df.reset_index(drop=True)

    def exact_sql(self, sql: str) -> str:
        """The SQL run by :meth:`exact`: the query with the engine's output names, groups in order."""
        try:
            q = parse(sql)
        except UnsupportedQueryError:
            return sql
        sel = [quote(g) for g in q.group_by]
        for a in q.aggregates:
            arg = "*" if a.column is None else quote(a.column)
            sel.append(f"{a.func.upper()}({arg}) AS {quote(a.alias)}")
        where = list(dict.fromkeys(c.sql for c in q.conditions))
        text = f"SELECT {', '.join(sel)} FROM {table_ref(q.table)}"
        if where:
            text += " WHERE " + " AND ".join(f"({w})" for w in where)
        if q.group_by:
            text += " GROUP BY " + ", ".join(quote(g) for g in q.group_by)
        order = [f"{quote(c)} {'DESC' if d else 'ASC'}" for c, d in q.order_by] or [quote(g) for g in q.group_by]
        if order:
            text += " ORDER BY " + ", ".join(order)
        return text

    def exact(self, sql: str) -> pd.DataFrame:
        """Run ``sql`` exactly in the database (same column names as :meth:`query`; CIs equal the answer)."""
        t0 = time.perf_counter()
        text = self.exact_sql(sql)
        try:
            df = self.con.fetch_df(text)
        except Exception as exc:
            raise DensitasError(f"the database could not run the query: {exc}") from None
        try:
            q = parse(sql)
            for a in q.aggregates:
                df[a.alias] = df[a.alias].astype(np.float64)
                df[f"{a.alias}_ci_low"] = df[a.alias]
                df[f"{a.alias}_ci_high"] = df[a.alias]
            if not q.group_by and len(df) == 0:
                df = pd.DataFrame([{c: np.nan for c in df.columns}])
        except UnsupportedQueryError:
            pass
        df.attrs.update({"method": "exact", "elapsed_ms": (time.perf_counter() - t0) * 1e3})
        return df

    def close(self) -> None:
        close = getattr(self.con, "close", None)
        if close is not None:
            close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
