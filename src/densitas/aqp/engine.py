"""``Engine``: approximate COUNT/SUM/AVG with confidence intervals from synopses stored in the database."""

from __future__ import annotations

import functools
import json
import os
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
from sqlglot import exp

from densitas.aqp import build as build_mod
from densitas.aqp import synopsis as syn_mod
from densitas.aqp.connector import Connector, connect, table_ref
from densitas.aqp.sql import Query, exact_select, named_as, parse, read_only_select, resolve_columns, table_key
from densitas.aqp.threads import query_blas_threads
from densitas.exceptions import (
    InputError,
    NoSynopsisError,
    ResultTooLargeError,
    StaleSynopsisError,
    UnsupportedQueryError,
)

__all__ = ["Engine"]

FALLBACKS = ("error", "exact")
METHODS = ("grid", "kde")
MAX_ROWS = 100_000  # default bound on the rows of an exact answer
#: each interval is widened by this share of its estimate on either side: the float rounding of the stored sums
#: (the database sums decimals exactly), so that an answer the grids hold exactly still holds the database's
ROUNDING = 1e-9
SYNOPSES_COLUMNS = ["table_name", "rows", "size_bytes", "table_bytes", "build_seconds", "created_at", "columns",
                    "group_by"]


def size_note(meta: dict, options: build_mod.BuildOptions) -> str | None:
    """Why a synopsis is larger than ``budget_fraction`` of its table, or None when it is not.

    Two floors can exceed the fraction on small tables: the minimum budget (``min_budget_bytes``, 256 kB by
    default) and the sample's floor of ``min(N_g, 200)`` rows per group, which many groups multiply.

    Examples
    --------
    >>> from densitas.aqp.build import BuildOptions
    >>> meta = {"size_bytes": 262_000, "table_bytes": 2_000_000, "options": '{"budget_bytes": 262144}',
    ...         "groups": 4}
    >>> print(size_note(meta, BuildOptions()))  # doctest: +NORMALIZE_WHITESPACE
    the synopsis is 13.1% of the table's 2.0 MB, above the 1.0% budget: the table is small and every synopsis
    gets at least min_budget_bytes = 262,144 bytes
    """
    size, table_bytes = int(meta["size_bytes"]), max(int(meta["table_bytes"]), 1)
    if options.budget_bytes is not None or size <= options.budget_fraction * table_bytes * 1.001:
        return None
    budget = int(json.loads(meta.get("options") or "{}").get("budget_bytes", 0))
    head = (f"the synopsis is {100 * size / table_bytes:.1f}% of the table's {table_bytes / 1e6:.1f} MB, above "
            f"the {100 * options.budget_fraction:.1f}% budget: ")
    if size > budget * 1.001:
        return head + (f"the sample keeps at least min(rows, 200) rows in each of the {meta.get('groups', '?')} "
                       f"groups, {size / 1e6:.2f} MB against a budget of {budget / 1e6:.2f} MB (fewer group_by "
                       "columns keep it within)")
    return head + f"the table is small and every synopsis gets at least min_budget_bytes = {budget:,} bytes"


def within_bounds(val: np.ndarray, low: np.ndarray, high: np.ndarray, lo: np.ndarray | float,
                  hi: np.ndarray | float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """An estimate and its interval projected onto ``[lo, hi]`` (one pair, or one per answer), where the true value
    surely lies: an AVG of the values in a box lies in the box, a SUM of values in ``[a, b]`` over at most ``N``
    rows in ``[min(0, N·a), max(0, N·b)]``. Neither moves away from the truth: the estimate's error can only
    shrink, and the interval loses only values that cannot be the truth, so it keeps its coverage. An interval
    wholly outside (the estimator sure of a value that cannot be) becomes ``[lo, hi]``. Where no bound is known
    (``lo`` or ``hi`` NaN, or ``lo > hi``) nothing moves.

    Examples
    --------
    >>> v, lo, hi = within_bounds(np.array([6973.0, 1100.0, 1400.0]), np.array([-1e19, 1050.0, 1390.0]),
    ...                           np.array([1e19, 1150.0, 1410.0]), 998.0, 1341.0)
    >>> v.tolist(), lo.tolist(), hi.tolist()
    ([1341.0, 1100.0, 1341.0], [998.0, 1050.0, 998.0], [1341.0, 1150.0, 1341.0])
    >>> v, lo, hi = within_bounds(np.array([-5.0, 3.0]), np.array([-9.0, -1.0]), np.array([-2.0, 8.0]),
    ...                           np.array([0.0, 0.0]), np.array([40.0, np.nan]))
    >>> v.tolist(), lo.tolist(), hi.tolist()
    ([0.0, 3.0], [0.0, -1.0], [40.0, 8.0])
    """
    lo, hi = np.broadcast_to(lo, np.shape(val)), np.broadcast_to(hi, np.shape(val))
    with np.errstate(invalid="ignore"):
        known = lo <= hi  # False where a bound is NaN (none known) or the box is empty
        if not known.any():
            return val, low, high
        outside = (low > hi) | (high < lo)
        new_low = np.where(outside, lo, np.clip(low, lo, hi))
        new_high = np.where(outside, hi, np.clip(high, lo, hi))
        new_val = np.where(np.isnan(val), 0.5 * (lo + hi), np.clip(val, lo, hi))
    return (np.where(known, new_val, val), np.where(known, new_low, low), np.where(known, new_high, high))


def _names(value: str | Sequence[str] | None) -> Sequence[str] | None:
    """A column list as given, or parsed from ``"a, b"``."""
    return [c.strip() for c in value.split(",") if c.strip()] if isinstance(value, str) else value


def _build_request(options: dict[str, Any], columns: str | Sequence[str] | None,
                   group_by: str | Sequence[str] | None) -> tuple[Any, Sequence[str] | None, Sequence[str] | None]:
    """The build options checked (an unknown name is an :class:`InputError`) and the column lists parsed."""
    fields = build_mod.BuildOptions.__dataclass_fields__
    bad = [k for k in options if k not in fields]
    if bad:
        raise InputError(f"unknown build option {bad[0]!r}; options are {sorted(fields)}.")
    return build_mod.BuildOptions(**options), _names(columns), _names(group_by)


class Engine:
    """Approximate query engine over a database.

    Parameters
    ----------
    database : str, pathlib.Path, duckdb.DuckDBPyConnection, psycopg.Connection or Connector
        A DuckDB file (created if missing), an open DuckDB connection, a PostgreSQL URL (``postgresql://...``)
        or open psycopg 3 connection (:mod:`densitas.aqp.postgres`), or any :class:`Connector`.
    read_only : bool
        Open a DuckDB file read-only, or a PostgreSQL session with read-only transactions (queries only;
        ``build`` then fails).
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
        ``max_sample_rows`` (default 20,480: a query reads the sample rows its box can touch), ``max_groups``,
        ``shares``, ``seed``, ``bandwidth``.
        """
        opts, columns, group_by = _build_request(options, columns, group_by)
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
        note = size_note(meta, opts)
        if note:
            meta["size_note"] = note
        return meta

    def build_parquet(self, name: str, files: str | Sequence[str], columns: Sequence[str] | None = None,
                      group_by: Sequence[str] | None = None, *, client: Any = None, **options: Any) -> dict:
        """Build (or atomically replace) the synopsis ``name`` of a table partitioned into Parquet files, one
        partition per Dask task, merged and stored in this engine's database (see :mod:`densitas.aqp.partitioned`);
        returns its metadata. Queries then say ``FROM name``; staleness is checked against the files.

        ``files`` is a glob (matches sorted by name) or the files in order; ``client`` a ``distributed.Client``
        (default: Dask's current scheduler, a client made current or the local one); ``options`` as :meth:`build`.
        The histograms, grids and sample are those a normal build of the files' concatenation (in this order)
        gives, up to the dependence probe of tables over ``PROBE_SAMPLE_ROWS`` rows (a hash sample here).

        Examples
        --------
        >>> import duckdb, tempfile
        >>> d = tempfile.mkdtemp()
        >>> for i in range(2):
        ...     _ = duckdb.execute(f"COPY (SELECT (r % 7)::DOUBLE AS a, r * 0.5 AS b FROM range({5000 * i}, "
        ...                        f"{5000 * (i + 1)}) t(r)) TO '{d}/p{i}.parquet'")
        >>> eng = Engine(duckdb.connect())
        >>> meta = eng.build_parquet("t", d + "/p*.parquet")      # one machine: Dask's local scheduler
        >>> # on a cluster: eng.build_parquet("t", "s3-or-shared/p*.parquet", client=distributed.Client(...))
        >>> round(float(eng.query("SELECT COUNT(*) AS n FROM t WHERE a BETWEEN 2 AND 4")["n"].iloc[0]))
        4286
        """
        from densitas.aqp import partitioned

        opts, columns, group_by = _build_request(options, columns, group_by)
        with self._lock:
            meta = partitioned.build_parquet(self.con, name, files, columns, group_by, opts, client=client)
            self._cache.pop(name, None)
        note = size_note(meta, opts)
        if note:
            meta["size_note"] = note
        return meta

    def refresh(self, table: str, *, verify: bool = False) -> dict:
        """Bring ``table``'s synopsis up to date after rows were appended: the appended rows' synopsis is built
        alone and merged (time proportional to the new rows), or the synopsis is rebuilt where a merge cannot be
        exact (see :mod:`densitas.aqp.refresh`). Returns its metadata, with ``refresh``: ``"merged"``,
        ``"current"`` or ``"rebuilt"``, ``appended`` (rows) and, for a rebuild, ``refresh_reason``.

        Examples
        --------
        >>> import duckdb
        >>> eng = Engine(duckdb.connect())
        >>> eng.con.execute("CREATE TABLE t AS SELECT i % 7 AS a, i * 0.5 AS b FROM range(10000) r(i)")
        >>> _ = eng.build("t")
        >>> eng.con.execute("INSERT INTO t SELECT i % 7, i * 0.5 FROM range(500) r(i)")
        >>> meta = eng.refresh("t")
        >>> meta["refresh"], meta["appended"], meta["rows"]
        ('merged', 500, 10500)
        """
        from densitas.aqp import refresh as refresh_mod

        with self._lock:
            name = self._resolve(table)
            res = refresh_mod.refresh(self.con, name, verify=verify)
            self._cache.pop(name, None)
        meta = dict(res.meta)
        meta.update({"refresh": res.action, "appended": res.appended})
        if res.reason is not None:
            meta["refresh_reason"] = res.reason
        return meta

    def synopses(self) -> pd.DataFrame:
        """One row per synopsis: table, rows, size, build time, columns, group_by, created_at.

        An empty frame when the database holds no synopses; a failing database raises
        :class:`~densitas.DatabaseError`.
        """
        if not self._has_catalog():
            return pd.DataFrame(columns=SYNOPSES_COLUMNS)
        return self.con.fetch_df(f"SELECT {', '.join(SYNOPSES_COLUMNS)} FROM {build_mod.SCHEMA}.synopses "
                                 "ORDER BY table_name")

    def _has_catalog(self) -> bool:
        """Whether the database holds the synopses catalog (``densitas.synopses``)."""
        try:
            self.con.columns(f"{build_mod.SCHEMA}.synopses")
        except InputError:  # the connector's answer for a table that does not exist
            return False
        return True

    def _resolve(self, table: str) -> str:
        """The name ``table``'s synopsis is stored under, matched as the database matches identifiers: exactly,
        else case-insensitively and with or without the default schema (``FROM main.LINEITEM`` finds ``lineitem``:
        :func:`~densitas.aqp.sql.table_key`). Raises NoSynopsisError when none."""
        names: list[str] = []
        if self._has_catalog():
            names = [r[0] for r in self.con.fetch_rows(f"SELECT table_name FROM {build_mod.SCHEMA}.synopses")]
        folded = named_as(table, names, key=table_key)
        if len(folded) == 1:
            return folded[0]
        if len(folded) > 1:
            raise InputError(f"table {table!r} matches the synopses of {sorted(folded)} up to case or schema; name it "
                             "exactly.")
        try:  # a table that does not exist at all is an input error, not a missing synopsis
            self.con.fetch_rows(f"SELECT 1 FROM {table_ref(table)} LIMIT 0")
        except InputError:
            raise InputError(f"table {table!r} does not exist in the database.") from None
        raise NoSynopsisError(f"table {table!r} has no synopsis; build one first (densitas build / Engine.build)"
                              + (f"; synopses exist for {sorted(names)}." if names else "."))

    def validate(self, table: str) -> None:
        """Raise :class:`StaleSynopsisError` when ``table`` changed since its synopsis was built."""
        syn = self._load(table, force=True)
        self._check_fingerprint(syn)

    @staticmethod
    def _parquet(syn: syn_mod.Synopsis) -> dict | None:
        """The Parquet source of a synopsis built by :meth:`build_parquet` (None for a table's)."""
        return json.loads(syn.meta.get("options") or "{}").get("parquet")

    def _check_fingerprint(self, syn: syn_mod.Synopsis) -> None:
        cols = [i.name for i in syn.infos] + syn.group_by
        if self._parquet(syn) is not None:
            from densitas.aqp import partitioned

            partitioned.check_fingerprint(syn.meta, cols)
            return
        try:
            n, h = self.con.fetch_rows(self.con.fingerprint_query(syn.table, cols))[0]
        except InputError as exc:  # the table or one of its columns is gone
            raise StaleSynopsisError(f"synopsis of {syn.table!r} no longer matches its table: {exc}") from None
        if f"{int(n)}:{h}" != syn.meta["fingerprint"]:
            built_rows = syn.meta["rows"]
            what = (f"it has {int(n)} rows, the synopsis was built on {built_rows}" if int(n) != built_rows
                    else "its content changed (same row count)")
            raise StaleSynopsisError(f"synopsis of {syn.table!r} is stale: {what}; rebuild it "
                                     f"(densitas build / Engine.build) or query with fallback='exact'.")

    def _row_count(self, syn: syn_mod.Synopsis) -> int:
        """The rows of the synopsis' table now: ``count(*)``, or the Parquet files' metadata."""
        source = self._parquet(syn)
        if source is not None:
            from densitas.aqp import partitioned

            files = source["files"]
            if not all(os.path.isfile(f) for f in files):
                raise InputError(f"a Parquet file of {syn.table!r} is gone")
            return sum(partitioned.file_rows(files))
        return int(self.con.fetch_rows(f"SELECT count(*) FROM {table_ref(syn.table)}")[0][0])

    def _load(self, table: str, force: bool = False) -> syn_mod.Synopsis:
        with self._lock:
            hit = None if force else self._cache.get(table)
            if hit is None and not force:  # the table named in another case ("FROM LINEITEM") or schema ("main.")
                name = next((t for t in self._cache if table_key(t) == table_key(table)), None)
                if name is not None:
                    table, hit = name, self._cache[name]
            now = time.monotonic()
            if hit is not None:
                syn, checked = hit
                if now - checked > self.recheck_seconds:
                    try:
                        n = self._row_count(syn)
                    except InputError as exc:  # the table is gone
                        self._cache.pop(table, None)
                        raise StaleSynopsisError(f"synopsis of {table!r} no longer matches its table: {exc}") \
                            from None
                    if int(n) != int(syn.meta["rows"]):
                        self._cache.pop(table, None)
                        raise StaleSynopsisError(f"synopsis of {table!r} is stale: the table has {int(n)} rows, "
                                                 f"the synopsis was built on {syn.meta['rows']}; rebuild it or "
                                                 "query with fallback='exact'.")
                    self._cache[table] = (syn, now)
                return syn
            table = self._resolve(table)
            syn = syn_mod.load(self.con, table)
            self._check_fingerprint(syn)
            self._cache[table] = (syn, now)
            return syn

    # ---- queries ----------------------------------------------------------------------------------------------
    def query(self, sql: str, *, confidence: float = 0.95, fallback: str = "error",
              method: str = "grid", max_rows: int = MAX_ROWS) -> pd.DataFrame:
        """Answer ``sql`` from the table's synopsis.

        Returns a DataFrame: the GROUP BY columns, then for each aggregate (named by its alias, or ``count``,
        ``count_<col>``, ``sum_<col>``, ``avg_<col>``) the estimate, ``<alias>_ci_low`` and ``<alias>_ci_high``.
        ``df.attrs`` says how it was answered (``method``: grid, kde or exact; ``reason`` when it fell back;
        ``warnings``, a list of strings, when an answer's interval rests on too few sample rows to be trusted).
        ``fallback="exact"`` runs in the database what the synopsis cannot answer (unsupported SQL, columns not
        in the synopsis, a stale synopsis, a table without a synopsis) instead of raising, through :meth:`exact`
        with at most ``max_rows`` rows.
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
            # columns named as DuckDB matches them: "Distance" is the synopsis' "distance"
            q = resolve_columns(q, [*syn.index, *syn.group_by])
            self._check_group_by(q, syn)
            with query_blas_threads():  # small products: a second thread only waits on a loaded machine
                out, results = syn.estimate(q, method=method)
        except (UnsupportedQueryError, StaleSynopsisError, NoSynopsisError) as exc:
            if fallback == "error":
                raise
            df = self.exact(sql, max_rows=max_rows)
            df.attrs["reason"] = str(exc)
            return df
        z = syn_mod.z_value(confidence)
        data: dict[str, np.ndarray] = {}
        for r in results:
            val, var = np.asarray(r["value"], dtype=np.float64), np.asarray(r["var"], dtype=np.float64)
            sd = np.sqrt(np.where(np.isnan(var), np.inf, np.maximum(var, 0.0)))
            with np.errstate(invalid="ignore"):
                # plus float rounding of the stored sums (the database sums decimals exactly), and the rounding
                # of the sample's values where the answer reads them (Synopsis.estimate's slack)
                magnitude = np.maximum(np.abs(np.nan_to_num(val)), r.get("magnitude", 0.0))
                half = z * sd + ROUNDING * magnitude + np.asarray(r.get("slack", 0.0))
                low, high = val - half, val + half
            if r["func"] == "count":  # within [0, the output group's rows]; an interval wholly outside at the bound
                val, low, high = (np.clip(a, *r["bounds"]) for a in (val, low, high))
            else:  # SUM/AVG over no rows is NULL: only where the group is surely empty (no sampling error)
                empty = ~(np.asarray(r["count"]) >= 0.5) & ~(sd > 0)
                unknown = ~np.isfinite(val) & ~empty  # an AVG over an estimated count of 0: any value
                low, high = np.where(unknown, -np.inf, low), np.where(unknown, np.inf, high)
                if "bounds" in r:
                    val, low, high = within_bounds(val, low, high, *r["bounds"])
                val, low, high = (np.where(empty, np.nan, a) for a in (val, low, high))
            data[r["alias"]] = val
            data[f"{r['alias']}_ci_low"] = low
            data[f"{r['alias']}_ci_high"] = high
        df = _answer_frame(out, data)
        thin = np.asarray(results[0]["thin"], dtype=bool) if results else np.zeros(len(df), dtype=bool)
        if q.order_by:
            order = self._order(df.assign(_thin=thin), q)
            df, thin = order.drop(columns="_thin"), order["_thin"].to_numpy()
        if thin.any():
            # the residual variance behind these intervals comes from fewer than MIN_SUPPORT sample rows
            df.attrs["warnings"] = [
                f"{int(thin.sum())} of {len(df)} answer row(s) (rows {np.flatnonzero(thin).tolist()[:20]}) rest on "
                f"fewer than {syn_mod.MIN_SUPPORT} sample rows inside the predicate box: their intervals are "
                "themselves uncertain; use fallback='exact' or Engine.exact for them"]
        df.attrs.update({"method": method, "table": q.table, "synopsis_id": syn.meta["id"],
                         "built_at": str(syn.meta["created_at"]), "confidence": confidence,
                         "elapsed_ms": (time.perf_counter() - t0) * 1e3})
        return df

    @staticmethod
    def _check_group_by(q: Query, syn: syn_mod.Synopsis) -> None:
        """A GROUP BY column must be one of the synopsis's group_by columns; a synopsis column that is not is
        named as such (rather than as a column missing from the synopsis)."""
        columns = {info.name for info in syn.infos}
        for g in q.group_by:
            if g not in syn.group_by and g in columns:
                raise UnsupportedQueryError(
                    f"GROUP BY {g!r}: the column is in the synopsis of {syn.table!r} but is not one of its GROUP BY "
                    f"columns, which are {syn.group_by}; rebuild with group_by including {g!r} or use "
                    "fallback='exact'")

    @staticmethod
    def _order(df: pd.DataFrame, q: Query) -> pd.DataFrame:
        if q.order_by:
            df = df.sort_values([c for c, _ in q.order_by], ascending=[not d for _, d in q.order_by])
        return df.reset_index(drop=True)

    def exact_sql(self, sql: str, max_rows: int | None = None) -> str:
        """The SQL that :meth:`exact` runs for ``sql``.

        Parameters
        ----------
        sql : str
            Exactly one read-only SELECT (see :func:`~densitas.aqp.sql.read_only_select`).
        max_rows : int or None
            When given, the statement returns at most ``max_rows + 1`` rows.

        Returns
        -------
        str
            For a query the engine parses, the SELECT rebuilt with the engine's output names (groups in order);
            for any other SELECT, the parsed statement rendered again. Never ``sql`` itself.

        Raises
        ------
        UnsupportedQueryError
            ``sql`` is not one read-only SELECT (several statements, DDL, DML, ``SELECT ... INTO``, ...).
        InputError
            ``sql`` does not parse.
        """
        tree = read_only_select(sql)
        try:
            q = parse(sql)
        except UnsupportedQueryError:
            q = None
        if q is not None:
            return exact_select(q, max_rows).sql(dialect=self.con.dialect)
        if max_rows is not None:
            if tree.args.get("limit") is None and tree.args.get("offset") is None:
                tree = tree.limit(max_rows + 1)
            else:
                tree = exp.select("*").from_(tree.subquery("_densitas_exact")).limit(max_rows + 1)
        return tree.sql(dialect=self.con.dialect)

    def exact(self, sql: str, *, max_rows: int | None = MAX_ROWS) -> pd.DataFrame:
        """Run ``sql`` exactly in the database (same column names as :meth:`query`; CIs equal the answer).

        Parameters
        ----------
        sql : str
            Exactly one read-only SELECT; anything else (a second statement, DDL, DML, ``SELECT ... INTO``) is
            refused before the database sees it, and what runs is the parsed statement, rebuilt.
        max_rows : int or None
            The most rows the answer may have (at most ``max_rows + 1`` are fetched); None: no bound.

        Returns
        -------
        pandas.DataFrame
            The answer; ``df.attrs["method"]`` is ``"exact"``.

        Raises
        ------
        UnsupportedQueryError
            ``sql`` is not one read-only SELECT.
        ResultTooLargeError
            The answer has more than ``max_rows`` rows.
        InputError
            ``sql`` does not parse, or names a table or column the database does not hold.
        DatabaseError
            The database failed to run the query.
        """
        if max_rows is not None and (isinstance(max_rows, bool) or not isinstance(max_rows, int) or max_rows < 1):
            raise InputError(f"The 'max_rows' parameter of Engine.exact must be a positive integer or None. "
                             f"Got {max_rows!r} instead.")
        t0 = time.perf_counter()
        text = self.exact_sql(sql, max_rows)
        df = self.con.fetch_df(text)
        if max_rows is not None and len(df) > max_rows:
            raise ResultTooLargeError(f"the exact answer has more than max_rows={max_rows:,} rows; narrow the query "
                                      "(WHERE, fewer GROUP BY columns) or raise max_rows.")
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


def _answer_frame(labels: dict, values: dict[str, np.ndarray]) -> pd.DataFrame:
    """The answer: the GROUP BY label columns, then the float columns ``values`` (estimates and bounds), under a
    column index made once per list of names. Built from the columns by pandas' ``DataFrame._from_arrays``
    (which the public constructors call): 19-30 µs against 100-150 µs through a dict or ``insert`` for a few
    rows (a tenth of a grouped one-column query); the dict constructor where pandas lacks it."""
    if not values or any(name in values for name in labels):
        return pd.DataFrame({**labels, **values})
    columns = [*labels.values(), *values.values()]
    from_arrays = getattr(pd.DataFrame, "_from_arrays", None)
    if from_arrays is None:  # pragma: no cover - pandas without the internal constructor
        return pd.DataFrame({**labels, **values})
    return from_arrays(columns, columns=_column_index((*labels, *values)), index=_row_index(len(columns[0])))


@functools.lru_cache(maxsize=64)
def _row_index(rows: int) -> pd.RangeIndex:
    """The (immutable) row index of an answer of ``rows`` rows."""
    return pd.RangeIndex(rows)


@functools.lru_cache(maxsize=1024)
def _column_index(names: tuple[str, ...]) -> pd.Index:
    """The (immutable) column index of an answer's float columns."""
    return pd.Index(list(names))
