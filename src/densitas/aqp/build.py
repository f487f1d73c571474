"""Building a synopsis: all heavy work runs as SQL inside the database.

A synopsis of a table over numeric/date columns ``C`` and categorical GROUP BY columns ``G`` holds, for each
combination of ``G`` values present (a *group*):

* the exact row count;
* per column, a fine one-dimensional histogram: exact row count and sum per bin (bin 0 holds the NULLs; the
  bins are the distinct values of a discrete column, quantile bins otherwise);
* for every *dependent* pair of columns, a two-dimensional grid of exact cell counts. Dependence is measured
  at build time on a 16 × 16 probe grid of every pair (the total-variation distance between the pair's joint
  histogram and the product of its marginals, less what sampling noise alone gives); the pairs that carry it
  get grids, the most dependent ones the finest, sparse, within the byte budget (by default 1% of the table's
  storage). Independent pairs keep their probe grid where the budget has room (the regression estimator's
  interaction term: :func:`choose_pair_resolutions`);
* a seeded, stratified random sample of rows, which checks the model for bias on every query and feeds the
  KDE estimator (see :mod:`densitas.aqp.synopsis`).

The sample's and the grids' rows count against the budget at their compact cost (:class:`RowCosts`: the sample's
at :func:`sample_row_bytes`, the grids' at the bits of their fields), as the table's storage is counted
compressed (a bin-edge row at the bits of its bin and three values); the small group table at its nominal
widths.

Everything is written to the ``densitas`` schema of the same database inside one transaction: a build that
fails leaves the previous synopsis of the table untouched and usable. The tables and their columns are those of
:mod:`densitas.aqp.store`.

:func:`build` runs these steps in order, each a function of its own:

1. :func:`resolve_columns`: the synopsis columns and GROUP BY columns, checked against the table;
2. :func:`read_statistics`: row count, per-column NULLs, range and distinct count, the data fingerprint;
3. :func:`count_groups` and :func:`plan_bins`: the groups, the byte budget, what each stored row counts for
   (:func:`row_costs`) and the bins per column;
4. :func:`find_bin_edges`: distinct values (discrete columns) or quantile edges (the others);
   then, inside the transaction,
5. :func:`write_groups`: the group table (group id, GROUP BY values, rows);
6. :func:`bin_rows`: every row's group id and fine bin per column, in a temporary table;
7. :func:`write_histograms`: the fine 1-D histograms, and each bin's occupied range with the edges;
8. :func:`write_sum_grids`: per column, per cell, the counts and every numeric column's sums;
9. :func:`probe_dependence` and :func:`write_pair_grids`: the dependence of every pair, grids for the
   dependent ones;
10. :func:`draw_sample`: the stratified sample, and :func:`_bandwidths` for the KDE estimator;
11. :func:`swap_catalog`: the catalog row replaced, the previous synopsis' tables dropped.

SQL is built with sqlglot (identifiers quoted, values as parameters) once and rendered in the connector's dialect
(DuckDB, PostgreSQL); what has no portable form (binning by the ASOF JOIN or ``width_bucket``, list aggregates,
hashes, temporary tables, row ids) comes from the :class:`~densitas.aqp.connector.Connector`.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import sqlglot
from sqlglot import exp

from densitas.aqp.columns import ColumnInfo, classify, slope_error, subset_key
from densitas.aqp.connector import Connector, table_expr
from densitas.aqp.store import (
    FORMAT_VERSION,
    INDEX_MAX,
    KINDS,
    SCHEMA,
    SynopsisTables,
    TableLayout,
    catalog_ids,
    cell_map,
    count_rows,
    decode_sample,
    drop_synopsis,
    edges_layout,
    ensure_schema,
    marg_layout,
    pairs_layout,
    sample_layout,
    set_build_seconds,
    sums_layout,
    write_catalog,
)
from densitas.exceptions import InputError

__all__ = ["BuildOptions", "build", "ensure_schema", "fingerprint_sql"]
# the stored format's names, kept importable from here
__all__ += ["FORMAT_VERSION", "INDEX_MAX", "KINDS", "SCHEMA", "cell_map"]


# the largest seed: its sample salt seed * 7919 + 1 (sample_salt) must fit the hashes' parameter, UBIGINT in DuckDB
# and BIGINT in PostgreSQL, so 0 <= salt <= 2**63 - 1 (the quantile sample's seed + 7919 then fits a BIGINT too)
SEED_MAX = (2**63 - 2) // 7919


@dataclass
class BuildOptions:
    """The build's options (``Engine.build(table, ..., **options)`` takes them by name; :meth:`check` validates
    them and names a bad one with the value it got).

    Examples
    --------
    >>> opts = BuildOptions(budget_fraction=0.02, max_sample_rows=10_000)
    >>> opts.check(); opts.shares
    (0.65, 0.15, 0.1, 0.1)
    >>> from densitas.exceptions import InputError
    >>> try:
    ...     BuildOptions(max_sample_rows=5).check()
    ... except InputError as err:
    ...     print(err)
    The 'max_sample_rows' parameter of BuildOptions must be an integer >= 10. Got 5 instead.
    """

    budget_bytes: int | None = None  # None: budget_fraction of the table's storage
    budget_fraction: float = 0.01
    min_budget_bytes: int = 256 * 1024
    max_bins: int = 4096  # most bins of a column (its distinct values when it has no more)
    max_pair_res: int = 256  # finest resolution of a pair grid, per dimension
    min_dependence: float = 0.002  # pairs whose probe dependence score is lower get no grid
    sample_size: int | None = None  # None: from the budget, at most max_sample_rows
    # a query reads the sample rows its box can touch (most of them under several predicate columns), so its
    # latency grows with the sample: beyond this many rows the budget's sample share goes to the pair grids and a
    # query costs what it costs at TPC-H SF1. 20,480 rather than 32,768 since compact sample accounting lets
    # lineitem SF1 fill the cap: three-column queries 4.7 against 6.5 ms median in the same minute, mean error
    # 0.77% against 0.58% on that workload (benchmarks/RESULTS.md, "Latency after the accuracy work")
    max_sample_rows: int = 20_480
    max_groups: int = 1000
    seed: int = 0  # 0 to SEED_MAX
    bandwidth: str = "plugin"  # densitas.kde method (densitas.kde.METHODS) for the KDE estimator's bandwidths
    # budget shares: sample, 1-D histograms, sum grids, pair grids (what the others leave goes to the sample);
    # chosen on the tuning tables (lineitem, synthetic, fertility) among (.15,.3,.2,.35), (.5,.15,.1,.25) and
    # (.7,.1,.05,.15) with nominal sample rows; with compact rows (compact_sample) among (.7,.1,.05,.15), these,
    # (.4,.15,.25,.2) and (.3,.2,.25,.25) (benchmarks/RESULTS.md, "Accuracy, continued"); with rows stored whole
    # and a capped sample's bytes handed on (Plan.share_bytes), again among (.5,.15,.15,.2), (.6,.1,.15,.15),
    # (.7,.1,.1,.1), (.8,.05,.1,.05) and (.65,.15,.1,.1): the 1-D share stays 0.15, which keeps columns of few
    # values exact (benchmarks/RESULTS.md, "Budget shares again")
    shares: tuple[float, float, float, float] = (0.65, 0.15, 0.10, 0.10)
    # a column whose values only grow as rows are appended (an id, a load date): Engine.refresh merges the rows
    # above its maximum at build time. None: DuckDB's row ids (PostgreSQL has no ordered row id: refresh rebuilds)
    append_key: str | None = None
    # pairs below min_dependence get a coarse (probe resolution) grid where the pair budget has room: the
    # regression's auxiliary for the interaction of two predicates (see choose_pair_resolutions)
    independent_pairs: bool = True
    # sample rows count at their compact cost (sample_row_bytes), not their nominal width, against the budget
    compact_sample: bool = True
    # so do the histograms', sum grids' and pair grids' rows (RowCosts.compact): finer grids in the same bytes
    compact_grids: bool = True
    # rows with a value far out in a heavy tail are stored whole and the rest is summarized (find_outliers)
    outliers: bool = True

    def __post_init__(self) -> None:
        # NumPy scalars (a seed from a Generator, a budget from an array) become the Python numbers they equal, so
        # that check() takes them and the catalog stores them as JSON; anything else is left for check() to judge
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, (tuple, list)):
                setattr(self, f.name, type(value)(_python_number(v) for v in value))
            else:
                setattr(self, f.name, _python_number(value))

    def check(self) -> None:
        """Raise :class:`~densitas.InputError` naming the first bad option and the value it got."""
        from densitas.kde import METHODS

        def bad(name: str, what: str) -> InputError:
            return InputError(f"The {name!r} parameter of BuildOptions must be {what}. "
                              f"Got {getattr(self, name)!r} instead.")

        if self.budget_bytes is not None and (not _is_int(self.budget_bytes) or self.budget_bytes <= 0):
            raise bad("budget_bytes", "a positive integer or None")
        if not _is_float(self.budget_fraction) or not 0 < self.budget_fraction <= 1:
            raise bad("budget_fraction", "a number in (0, 1]")
        if not _is_int(self.min_budget_bytes) or self.min_budget_bytes <= 0:
            raise bad("min_budget_bytes", "a positive integer")
        if not _is_int(self.max_bins) or not 2 <= self.max_bins <= INDEX_MAX:
            raise bad("max_bins", f"an integer in [2, {INDEX_MAX}] (bin numbers are stored as SMALLINT)")
        if not _is_int(self.max_pair_res) or not 2 <= self.max_pair_res <= 4096:
            raise bad("max_pair_res", "an integer in [2, 4096]")
        if not _is_float(self.min_dependence) or not 0 <= self.min_dependence < 1:
            raise bad("min_dependence", "a number in [0, 1)")
        if (not isinstance(self.shares, (tuple, list)) or len(self.shares) != 4
                or any(not _is_float(x) or not 0 <= x <= 1 for x in self.shares)
                or not 0.99 <= sum(self.shares) <= 1.01):
            raise bad("shares", "four fractions summing to 1")
        if not _is_int(self.max_sample_rows) or self.max_sample_rows < 10:
            raise bad("max_sample_rows", "an integer >= 10")
        if self.sample_size is not None and (not _is_int(self.sample_size) or self.sample_size < 10):
            raise bad("sample_size", "an integer >= 10 or None")
        if self.append_key is not None and (not isinstance(self.append_key, str) or not self.append_key):
            raise bad("append_key", "a column name or None")
        if not _is_int(self.max_groups) or not 1 <= self.max_groups <= INDEX_MAX:
            raise bad("max_groups", f"an integer in [1, {INDEX_MAX}] (group ids are stored as SMALLINT)")
        if not _is_int(self.seed) or not 0 <= self.seed <= SEED_MAX:
            raise bad("seed", f"an integer in [0, {SEED_MAX}] (the sample's hash salt, seed * 7919 + 1, is a "
                              "non-negative 64-bit integer: sample_salt)")
        if not isinstance(self.bandwidth, str) or self.bandwidth not in METHODS:
            raise bad("bandwidth", f"one of the densitas.kde methods {METHODS}")
        for name in ("independent_pairs", "compact_sample", "compact_grids", "outliers"):
            if not isinstance(getattr(self, name), bool):
                raise bad(name, "True or False")


def _python_number(value: object) -> object:
    """A NumPy bool, integer or float as the Python one it equals; anything else as it is.

    Examples
    --------
    >>> _python_number(np.int64(7)), _python_number(np.float32(0.5)), _python_number(np.True_), _python_number("x")
    (7, 0.5, True, 'x')
    """
    return value.item() if isinstance(value, (np.bool_, np.integer, np.floating)) else value


def _is_int(value: object) -> bool:
    """Whether ``value`` is a Python integer (not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _is_float(value: object) -> bool:
    """Whether ``value`` is a Python int or float (not a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_table_name(table: object) -> None:
    """Raise :class:`~densitas.InputError` unless ``table`` is a table name (a non-empty string).

    Examples
    --------
    >>> check_table_name("lineitem")
    >>> try:
    ...     check_table_name(" ")
    ... except InputError as err:
    ...     print(err)
    The 'table' parameter must be a table name (a non-empty string). Got ' ' instead.
    """
    if not isinstance(table, str) or not table.strip():
        raise InputError(f"The 'table' parameter must be a table name (a non-empty string). Got {table!r} instead.")


def fingerprint_sql(table: str, columns: Sequence[str]) -> str:
    """DuckDB SQL of the data fingerprint: row count and an order-independent hash of the synopsis columns.

    Examples
    --------
    >>> print(fingerprint_sql("t", ["x", "y"]))
    SELECT COUNT(*), BIT_XOR(HASH("x", "y")) FROM "t"
    """
    from densitas.aqp.connector import duckdb_fingerprint

    return duckdb_fingerprint(table, list(columns)).sql("duckdb")


MARG_CELL_BYTES = marg_layout().row_bytes  # col, gid, bin, n, s
EDGE_BYTES = edges_layout().row_bytes  # col, bin, lo, vmin, vmax
#: the sample is stored in group order: its group column is one run a group (a SMALLINT value and a run length;
#: DuckDB's RLE segments measured 4.3 bytes a run on flights, 4.9 on a generated table of 12 groups)
GROUP_RUN_BYTES = 8
PAIR_CELL_BYTES = pairs_layout().row_bytes  # pair, gid, c0, c1, n
# tables with more rows take their quantile edges from a seeded hash sample of about this many rows
QUANTILE_SAMPLE_ROWS = 2_000_000
PROBE_RES = 16
BINNED = "_densitas_binned"  # temporary: every row's group id, fine bins and values
EDGES_TMP = "_densitas_edges"  # temporary: the bins' lower edges, for binning
QUOTA = "_densitas_quota"  # temporary: each group's sample quota
PROBES_TMP = "_densitas_probes"  # temporary: the points each continuous column's fine bins are probed at


def _col(name: str, qualifier: str | None = None) -> exp.Column:
    """A quoted column, optionally qualified."""
    return exp.column(name, table=qualifier, quoted=True)


def _num(v: int) -> exp.Literal:
    """An integer the build computes (a column index, a resolution) as a SQL literal."""
    return exp.Literal.number(int(v))


def _count() -> exp.Count:
    return exp.Count(this=exp.Star())


def _int_param(value: int) -> exp.Expression:
    """A parameter typed as DuckDB types an integer literal (the hash of a value depends on its type)."""
    return exp.cast(exp.Placeholder(), "INTEGER" if -2**31 <= value < 2**31 else "BIGINT")


# ---- the steps ------------------------------------------------------------------------------------------------


@dataclass
class Columns:
    """The synopsis columns (kinds known, statistics filled by :func:`read_statistics`) and GROUP BY columns."""

    infos: list[ColumnInfo]
    group_by: list[str]
    group_types: list[tuple[str, str]]  # (name, SQL type) of each GROUP BY column

    @property
    def names(self) -> list[str]:
        return [info.name for info in self.infos]


def resolve_columns(con: Connector, table: str, columns: Sequence[str] | None, group_by: Sequence[str] | None
                    ) -> Columns:
    """Check ``columns`` and ``group_by`` against ``table``; ``columns=None``: every numeric/date column not in
    ``group_by``.

    Raises
    ------
    InputError
        A column is missing, listed twice, of a type a synopsis cannot hold, or both kinds of column.
    """
    schema_cols = con.columns(table)
    types = dict(schema_cols)
    group_by = list(group_by or [])
    for g in group_by:
        if g not in types:
            raise InputError(f"group_by column {g!r} is not in table {table!r}; its columns are {list(types)}.")
    if len(set(group_by)) != len(group_by):
        raise InputError(f"group_by lists a column twice: {group_by}.")
    if columns is None:
        columns = [c for c, t in schema_cols if classify(t) is not None and c not in group_by]
        if not columns:
            raise InputError(f"table {table!r} has no numeric or date columns to build a synopsis over.")
    else:
        columns = list(columns)
        if not columns:
            raise InputError("columns must name at least one column.")
        for c in columns:
            if c not in types:
                raise InputError(f"column {c!r} is not in table {table!r}; its columns are {list(types)}.")
            if classify(types[c]) is None:
                raise InputError(f"column {c!r} has type {types[c]}; synopsis columns must be numeric, dates or "
                                 "timestamps (use categorical columns in group_by).")
            if c in group_by:
                raise InputError(f"column {c!r} is both a synopsis column and a group_by column.")
        if len(set(columns)) != len(columns):
            raise InputError(f"columns lists a column twice: {columns}.")
    infos = [ColumnInfo(c, types[c], *classify(types[c])) for c in columns]
    return Columns(infos, group_by, [(g, types[g]) for g in group_by])


@dataclass
class TableStats:
    """What one scan of the table says: its rows, data fingerprint and storage size."""

    rows: int
    fingerprint: str  # "<rows>:<hash>" (see :func:`fingerprint_sql`)
    table_bytes: int


def read_statistics(con: Connector, table: str, cols: Columns, fingerprint: bool = True) -> TableStats:
    """Row count and, per column, non-NULL count, range and distinct count (filled into ``cols.infos``); the
    fingerprint and storage size of the table.

    Raises
    ------
    InputError
        The table has fewer than 2 rows, or a column is entirely NULL or holds NaN or infinity.
    """
    parts: list[exp.Expression] = [_count()]
    for info in cols.infos:
        e = con.to_line(info.column, info.kind)
        parts += [exp.Count(this=e.copy()), exp.Min(this=e.copy()), exp.Max(this=e.copy()),
                  exp.Count(this=exp.Distinct(expressions=[e.copy()]))]
    stats = con.fetch_rows(sqlglot.select(*parts).from_(table_expr(table)))[0]
    n_rows = int(stats[0])
    if n_rows < 2:
        raise InputError(f"table {table!r} has {n_rows} rows; a synopsis needs at least 2.")
    for j, info in enumerate(cols.infos):
        nn, lo, hi, nd = stats[1 + 4 * j: 5 + 4 * j]
        if nn == 0:
            raise InputError(f"column {info.name!r} of {table!r} is entirely NULL.")
        if lo is None or not (math.isfinite(lo) and math.isfinite(hi)):
            raise InputError(f"column {info.name!r} holds non-finite values (NaN or infinity); the synopsis "
                             "cannot place them. Clean or exclude the column.")
        info.nullable, info.lo, info.hi, info.distinct = nn < n_rows, float(lo), float(hi), int(nd)
    if not fingerprint:  # the caller adds it up (a partitioned build: one part per partition)
        return TableStats(n_rows, "", con.table_bytes(table))
    fp = con.fetch_rows(con.fingerprint_query(table, cols.names + cols.group_by))[0]
    return TableStats(n_rows, f"{int(fp[0])}:{fp[1]}", con.table_bytes(table))


def append_key_expr(con: Connector, table: str, key: str | None) -> exp.Expression | None:
    """The expression whose values grow as rows are appended to ``table``: the column ``key`` on its numeric line,
    else the connector's row id where it is ordered (DuckDB), else None.

    Raises
    ------
    InputError
        ``key`` is not a numeric, date or timestamp column of the table.
    """
    if key is None:
        rid = con.row_id(table) if getattr(con, "ordered_row_ids", False) else None
        return None if rid is None else exp.cast(rid, "DOUBLE")
    types = dict(con.columns(table))
    kind = classify(types[key]) if key in types else None
    if kind is None:
        raise InputError(f"The 'append_key' parameter must name a numeric, date or timestamp column of {table!r}. "
                         f"Got {key!r} instead.")
    return con.to_line(_col(key), kind[0])


def append_marker(con: Connector, table: str, key: str | None) -> dict | None:
    """Where the rows of the build end: ``{"key": key, "max": largest key}`` (None: no ordered key)."""
    e = append_key_expr(con, table, key)
    if e is None:
        return None
    top = con.fetch_rows(sqlglot.select(exp.Max(this=e)).from_(table_expr(table)))[0][0]
    return {"key": key, "max": None if top is None else float(top)}


def count_groups(con: Connector, table: str, group_by: list[str], max_groups: int) -> int:
    """The number of GROUP BY combinations present (1 without GROUP BY columns).

    Raises
    ------
    InputError
        More than ``max_groups`` combinations.
    """
    if not group_by:
        return 1
    distinct = sqlglot.select(*(_col(g) for g in group_by)).distinct().from_(table_expr(table))
    n_groups = con.fetch_rows(sqlglot.select(_count()).from_(distinct.subquery()))[0][0]
    if n_groups > max_groups:
        raise InputError(f"group_by {group_by} has {n_groups} combinations, more than max_groups="
                         f"{max_groups}; GROUP BY columns must have few distinct values.")
    return n_groups


def count_cells(con: Connector, table: str, cols: Columns, max_bins: int) -> None:
    """Per column of at most ``max_bins`` distinct values, the (group, value) pairs present in the table
    (``info.cells``), in one scan: the rows its histogram and sum grid take at one bin a value. A column a group
    mostly determines (flights' ``distance``: 214 values, but 436 of the 7,490 (carrier x origin, distance) pairs
    occur) then costs its pairs, not groups times values, and may be discrete within a budget that a dense count
    would refuse (:func:`_marginal_bins`). Without GROUP BY columns a column's pairs are its values.

    Examples
    --------
    >>> import duckdb
    >>> from densitas.aqp.connector import DuckDBConnector
    >>> con = DuckDBConnector(duckdb.connect())
    >>> con.execute("CREATE TABLE t AS SELECT i % 4 AS g, (i % 4) * 10 + i % 3 AS x FROM range(1200) r(i)")
    >>> cols = resolve_columns(con, "t", ["x"], ["g"])
    >>> _ = read_statistics(con, "t", cols)
    >>> count_cells(con, "t", cols, max_bins=4096)
    >>> cols.infos[0].distinct, cols.infos[0].cells     # 12 values, 12 (g, x) pairs of the 48 a dense count takes
    (12, 12)
    """
    todo = [info for info in cols.infos if info.distinct <= max_bins]
    if not cols.group_by:
        for info in todo:
            info.cells = info.distinct
        return
    if not todo:
        return
    keys = [_col(g) for g in cols.group_by]
    parts = [exp.Count(this=exp.Distinct(expressions=[exp.Tuple(expressions=[*(k.copy() for k in keys),
                                                                            con.to_line(info.column, info.kind)])]))
             for info in todo]
    for info, n in zip(todo, con.fetch_rows(sqlglot.select(*parts).from_(table_expr(table)))[0], strict=True):
        info.cells = int(n)


@dataclass
class Plan:
    """The build's budget and bins: bytes for the whole synopsis, groups, bins per column (final once the
    edges are known)."""

    budget: int
    n_groups: int
    bins: list[int]
    costs: RowCosts  # what a stored row of each table counts for against the budget
    # what the sample can use of its share (:func:`sample_bytes`); None: the whole share
    sample_bytes: float | None = None

    def share_bytes(self, opts: BuildOptions, part: int) -> float:
        """Bytes for the 1-D histograms (``part`` 1), the sum grids (2) or the pair grids (3): their share of the
        budget, grown by what the sample cannot use of its own in proportion to the three shares.

        Examples
        --------
        >>> plan = Plan(budget=100_000, n_groups=1, bins=[], costs=RowCosts(1.0, 1.0, 1.0, 8.0))
        >>> round(plan.share_bytes(BuildOptions(), 1))              # 15% of the budget
        15000
        >>> plan.sample_bytes = 45_000                               # the sample uses 45 of its 65 kB
        >>> round(plan.share_bytes(BuildOptions(), 1))              # 15/35 of the 55 kB left
        23571
        """
        grids = sum(opts.shares[1:])
        return opts.shares[part] / grids * (self.budget - pair_reserve(self, opts)) if grids > 0 else 0.0


def plan_bins(infos: list[ColumnInfo], n_groups: int, opts: BuildOptions, table_bytes: int, n_rows: int) -> Plan:
    """The byte budget (``budget_bytes``, else ``budget_fraction`` of the table's storage, at least
    ``min_budget_bytes``), what each table's rows count for against it (:class:`RowCosts`), what the sample
    can use of its share (:func:`sample_bytes`) and each column's number of bins (:func:`_marginal_bins`)."""
    budget = opts.budget_bytes or max(opts.min_budget_bytes, int(opts.budget_fraction * table_bytes))
    costs = row_costs(infos, n_groups, n_rows, opts)
    plan = Plan(budget, n_groups, [], costs, sample_bytes(opts, budget, costs, n_rows, n_groups))
    plan.bins = _marginal_bins(infos, n_groups, opts, plan.share_bytes(opts, 1), costs)
    return plan


def sample_bytes(opts: BuildOptions, budget: int, costs: RowCosts, n_rows: int, n_groups: int = 1,
                 aside_rows: int = 0) -> float:
    """What the sample can use of its share of the budget: no more than ``max_sample_rows`` rows
    (``sample_size`` when given), nor the table's, at their compact cost (``compact_sample``), but at least the
    per-group floor of :func:`sample_quotas` (about ``min(200, N / groups)`` rows a group), which every group
    takes whatever the cap; and the ``aside_rows`` rows set aside whole (:func:`find_outliers`), which take
    sample rows' places. The grids get the rest: the budget is spent, not left unused where the sample is
    capped (TPC-H lineitem at SF1: 20,480 rows, a sixth of the sample's share). A partitioned build counts its
    rows at their nominal width (``compact_sample=False``) and keeps the whole share.

    Examples
    --------
    >>> costs = RowCosts(1.0, 1.0, 1.0, 8.0)
    >>> sample_bytes(BuildOptions(), 1_000_000, costs, n_rows=10**7)   # 20,480 rows at 8 bytes
    163840.0
    >>> sample_bytes(BuildOptions(), 100_000, costs, n_rows=10**7)     # its 65% share
    65000.0
    >>> sample_bytes(BuildOptions(), 1_000_000, costs, n_rows=10**7, n_groups=300)  # 300 groups of 200 rows
    480000.0
    """
    share = opts.shares[0] * budget
    if not opts.compact_sample:
        return share
    floor = n_groups * min(200.0, n_rows / max(n_groups, 1))
    rows = max(min(opts.sample_size or opts.max_sample_rows, n_rows), floor)
    return min(share, rows * costs.sample + aside_rows * costs.outliers)


def _marginal_bins(infos: list[ColumnInfo], n_groups: int, opts: BuildOptions, share: float, costs: RowCosts
                   ) -> list[int]:
    """Bins per column: the 1-D histograms' ``share`` of the budget (bytes) split evenly. A column whose
    histogram at one bin a value fits its part takes it (its rows: the (group, value) pairs present,
    ``info.cells``, else groups x values) and hands the slack to the others, which get as many bins as their
    part holds for every group (a dense estimate), at least 16.

    Examples
    --------
    >>> from densitas.aqp.columns import ColumnInfo
    >>> costs = RowCosts(1.0, 1.0, 1.0, 8.0)
    >>> mk = lambda d, cells: ColumnInfo("x", "INTEGER", "int", 1.0, lo=0.0, hi=d, distinct=d, cells=cells)
    >>> _marginal_bins([mk(200, 0), mk(5000, 0)], 35, BuildOptions(), 24_000.0, costs)  # dense: 200 x 35 rows
    [144, 144]
    >>> _marginal_bins([mk(200, 400), mk(5000, 0)], 35, BuildOptions(), 24_000.0, costs)  # 400 pairs: whole
    [200, 168]
    """
    k = len(infos)
    per_col = share / k
    dense_bin = n_groups * costs.marg + costs.edges  # a bin's bytes over every group
    cards = [min(info.distinct, opts.max_bins) for info in infos]
    full = [(info.cells if info.cells and info.distinct <= opts.max_bins else n_groups * card) * costs.marg
            + card * costs.edges for info, card in zip(infos, cards, strict=True)]
    bins = list(cards)
    slack_cols = [i for i in range(k) if full[i] > per_col]
    spare = sum(per_col - full[i] for i in range(k) if full[i] <= per_col)
    for i in slack_cols:
        bins[i] = int(max(16, min(cards[i], (per_col + spare / max(len(slack_cols), 1)) / dense_bin)))
    return bins


def find_bin_edges(con: Connector, table: str, infos: list[ColumnInfo], plan: Plan, n_rows: int, seed: int
                   ) -> None:
    """Each column's bin edges (``info.edges``, ``info.discrete``; ``plan.bins`` updated to the bins made).

    A column with at most its share of distinct values is *discrete*: its bins are its values. The others
    get half their edges at quantiles (equal mass) and half evenly spaced between the 0.1% and 99.9% quantiles
    (quantile bins alone grow wide, and their uniform spread poor, where the density is low), on the column's
    value grid. One scan computes every column's values; tables over :data:`QUANTILE_SAMPLE_ROWS` rows take the
    quantiles from a seeded hash sample of about that many rows (an edge need not be an exact quantile: the
    histograms stay exact).
    """
    bins = plan.bins
    aggs: list[exp.Expression] = []  # per column: the aggregate computing its values
    nqs = {}
    for j, info in enumerate(infos):
        info.discrete = info.distinct <= bins[j]
        value = con.to_line(info.column, info.kind)
        if info.discrete:
            aggs.append(con.distinct_values(value, info.name))
        else:
            nqs[j] = (bins[j] + 1) // 2
            aggs.append(con.quantiles(value, [i / nqs[j] for i in range(nqs[j])] + [0.001, 0.999]))
    qcols = [j for j in range(len(infos)) if not infos[j].discrete]
    big = n_rows > QUANTILE_SAMPLE_ROWS and qcols
    src = table_expr(table)

    def fetch(cols: list[int], where: tuple[exp.Expression, list] | None = None) -> list:
        q = sqlglot.select(*(aggs[j] for j in cols)).from_(src)
        params: list = []
        if where is not None:
            q, params = q.where(where[0]), where[1]
        return list(con.fetch_rows(q, params)[0])

    full = [j for j in range(len(infos)) if not big or infos[j].discrete]
    got_full = iter(fetch(full)) if full else iter(())
    if big:  # about QUANTILE_SAMPLE_ROWS rows by a seeded hash of the row id: the same rows whatever the threads
        rid = con.row_id(table)
        if rid is not None:
            salt, every = int(seed) + 7919, math.ceil(n_rows / QUANTILE_SAMPLE_ROWS)
            keep = (exp.Mod(this=con.row_hash(rid, _int_param(salt)), expression=exp.Placeholder())
                    .eq(_num(0)), [salt, every])
        else:
            keep = (exp.true(), [])
        got_q = iter(fetch(qcols, keep))
    else:
        got_q = iter(())
    got = [next(got_q) if big and not infos[j].discrete else next(got_full) for j in range(len(infos))]
    for j, info in enumerate(infos):
        if info.discrete:
            info.edges = np.array(got[j], dtype=np.float64)
        else:
            nq, qv = nqs[j], got[j]
            even = np.linspace(float(qv[nq]), float(qv[nq + 1]), bins[j] - nq + 1)[1:-1] if bins[j] - nq > 1 \
                else np.zeros(0)
            if info.step > 0:  # a bin's extent on the line starts at a value: edges on the column's value grid
                even = np.ceil(even / info.step - 1e-9) * info.step
            edges = np.unique(np.concatenate([np.asarray(qv[:nq], dtype=np.float64), even]))
            edges = edges[edges >= info.lo]
            edges[0] = info.lo
            info.edges = edges
        bins[j] = info.bins


def write_groups(con: Connector, tables: SynopsisTables, table: str, cols: Columns) -> None:
    """The group table: group id (by the GROUP BY values in order), the values, the group's rows."""
    lay = tables.groups
    src = table_expr(table)
    gid_type, n_type = lay.columns[0].sql_type, lay.columns[-1].sql_type
    if cols.group_by:
        keys = [_col(g) for g in cols.group_by]
        counts = sqlglot.select(*keys, exp.alias_(_count(), "n", quoted=True)).from_(src).group_by(*keys)
        order = exp.Order(expressions=[exp.Ordered(this=k.copy()) for k in keys])
        gid = exp.Sub(this=exp.Window(this=exp.RowNumber(), order=order), expression=_num(1))
        rows = sqlglot.select(exp.alias_(exp.cast(gid, gid_type), "gid", quoted=True),
                              *(k.copy() for k in keys), exp.alias_(exp.cast(_col("n"), n_type), "n", quoted=True)
                              ).from_(counts.subquery())
    else:
        rows = sqlglot.select(exp.alias_(exp.cast(_num(0), gid_type), "gid", quoted=True),
                              exp.alias_(exp.cast(_count(), n_type), "n", quoted=True)).from_(src)
    con.execute(exp.Create(this=lay.table(tables.id), kind="TABLE", expression=rows))


@dataclass
class Binned:
    """The temporary table of every row's group id ``gid``, fine bin ``b<j>`` (0 = NULL) and value ``v<j>`` on
    the numeric line per column, and its table row id ``_densitas_rid`` (NULL where the table has none)."""

    name: str
    n_columns: int

    @property
    def table(self) -> exp.Table:
        return exp.table_(self.name, quoted=True)

    @staticmethod
    def b(j: int) -> exp.Column:
        return _col(f"b{j}")

    @staticmethod
    def v(j: int) -> exp.Column:
        return _col(f"v{j}")

    def coarse(self, j: int, res: int, bins: int) -> exp.Expression:
        """Column ``j``'s cell at resolution ``res`` (0 = NULL): the fine bins ``1..bins`` in ``res`` runs (see
        :func:`~densitas.aqp.store.cell_map`)."""
        if res >= bins:
            return self.b(j)
        scaled = exp.Mul(this=exp.paren(exp.Sub(this=self.b(j), expression=_num(1))), expression=_num(res))
        return exp.case().when(self.b(j).eq(_num(0)), _num(0)).else_(
            exp.Add(this=_num(1), expression=exp.IntDiv(this=scaled, expression=_num(bins))))


def bin_rows(con: Connector, tables: SynopsisTables, table: str, cols: Columns,
             where: exp.Expression | None = None) -> Binned:
    """Every row's group id and fine bin per column, into a temporary table (:class:`Binned`); only the rows
    ``where`` holds when given (a refresh bins the appended rows).

    A discrete column's bin comes from an equality join on its value; the others' from an ASOF join on the
    lower edge. The table's row ids go along, so that the sample is a seeded function of them whatever the
    threads do.
    """
    infos = cols.infos
    edges = pd.DataFrame({"col": np.concatenate([np.full(info.bins, j, dtype=np.int32)
                                                 for j, info in enumerate(infos)]),
                          "bin": np.concatenate([np.arange(1, info.bins + 1, dtype=np.int32) for info in infos]),
                          "lo": np.concatenate([info.edges.astype(np.float64) for info in infos])})
    con.create_temp_table(EDGES_TMP, edges)
    rid = con.row_id(table)
    sel = [exp.alias_(con.to_line(info.column, info.kind), f"v{j}", quoted=True) for j, info in enumerate(infos)]
    sel += [_col(g) for g in cols.group_by]
    sel.append(exp.alias_(rid if rid is not None else exp.cast(exp.null(), "BIGINT"), "_densitas_rid", quoted=True))
    source = sqlglot.select(*sel).from_(table_expr(table))
    source = (source if where is None else source.where(where)).subquery("s")
    if cols.group_by:
        gid: exp.Expression = _col("gid", "g")
    else:
        gid = _num(0)
    q = exp.Select().from_(source)
    if cols.group_by:
        on = exp.and_(*(exp.NullSafeEQ(this=_col(g, "s"), expression=_col(g, "g")) for g in cols.group_by))
        q = q.join(exp.alias_(tables.table("groups"), "g", table=True, quoted=True), on=on)
    bins: list[exp.Expression] = []
    for j, info in enumerate(infos):
        edges_j = sqlglot.select(_col("bin"), _col("lo")).from_(exp.table_(EDGES_TMP, quoted=True)) \
            .where(_col("col").eq(_num(j))).subquery()
        if info.discrete:
            q = q.join(exp.alias_(edges_j, f"e{j}", table=True, quoted=True), join_type="LEFT",
                       on=_col(f"v{j}", "s").eq(_col("lo", f"e{j}")))
            bins.append(_col("bin", f"e{j}"))
        else:
            q, b = con.bin_join(q, edges_j, f"e{j}", _col(f"v{j}", "s"))
            bins.append(b)
    q = q.select(exp.alias_(gid, "gid", quoted=True),
                 *(exp.alias_(exp.func("coalesce", b, _num(0)), f"b{j}", quoted=True) for j, b in enumerate(bins)),
                 *(_col(f"v{j}", "s") for j in range(len(infos))), _col("_densitas_rid", "s"))
    con.create_temp_table(BINNED, q)
    _drop(con, exp.table_(EDGES_TMP, quoted=True))
    return Binned(BINNED, len(infos))


#: a sample row's value of a column on no value grid is rounded to within 2^-SAMPLE_BITS of the column's range
#: (sample_decimals): a millionth, far below any sample's error, in about 21 to 24 bits instead of 53
SAMPLE_BITS = 20
# a row set aside whole takes a sample row's place: at most this share of the planned sample's rows go to them.
# Chosen on the tuning tables (synthetic, lineitem, fertility) among 0.1 and 0.25 (benchmarks/RESULTS.md, "AQP:
# heavy tails")
OUTLIER_SHARE = 0.1
OUTLIER_ROUNDS = 8  # rounds of the bounds' fixed point (find_outliers)


@dataclass
class OutlierRule:
    """Which rows the build sets aside whole: those with a value outside ``[lo, hi]`` of a column that has bounds
    (``bounds[j]``; None: no bound). A refresh sets aside the appended rows by the same rule.

    Examples
    --------
    >>> rule = OutlierRule([None, (-3.0, 40.0)])
    >>> rule.predicate(lambda j: exp.column(f"v{j}")).sql()
    'v1 < -3.0 OR v1 > 40.0'
    >>> OutlierRule.none(2).predicate(lambda j: exp.column(f"v{j}")) is None
    True
    """

    bounds: list[tuple[float, float] | None]

    @classmethod
    def none(cls, k: int) -> OutlierRule:
        return cls([None] * k)

    @classmethod
    def from_json(cls, stored: list | None, k: int) -> OutlierRule:
        """The rule as the catalog stores it (:meth:`to_json`); none where a synopsis stores none."""
        return cls([None if b is None else (float(b[0]), float(b[1])) for b in stored]) if stored else cls.none(k)

    def to_json(self) -> list:
        return [None if b is None else [b[0], b[1]] for b in self.bounds]

    def predicate(self, value: Callable[[int], exp.Expression]) -> exp.Expression | None:
        """Whether a row is set aside, over the columns' values ``value(j)`` (NULL, never: a NULL is no outlier);
        None when no column has bounds."""
        out = [exp.or_(value(j) < _float(b[0]), value(j) > _float(b[1]))
               for j, b in enumerate(self.bounds) if b is not None]
        return exp.or_(*out) if out else None


def _float(x: float) -> exp.Expression:
    """``x`` as an SQL number (sqlglot writes the shortest form that reads back as ``x``)."""
    return exp.convert(float(x))


def planned_sample(opts: BuildOptions, plan: Plan, n_rows: int) -> int:
    """The sample's rows as planned before the grids are written: its share of the budget at its compact row
    cost (``sample_size`` when given), within the bounds :func:`sample_target` keeps.

    Examples
    --------
    >>> from densitas.aqp.columns import ColumnInfo
    >>> x = ColumnInfo("x", "DOUBLE", "float", 0.0, lo=0.0, hi=1.0, distinct=10**6)
    >>> plan = Plan(budget=100_000, n_groups=1, bins=[64], costs=RowCosts(1.0, 1.0, 1.0, 8.0))
    >>> planned_sample(BuildOptions(), plan, n_rows=10**7)      # 65% of 100 kB at 8 bytes a row
    8125
    >>> planned_sample(BuildOptions(sample_size=500), plan, n_rows=10**7)
    500
    """
    return sample_target(opts, plan.budget, int((1 - opts.shares[0]) * plan.budget), 0, n_rows, plan.costs.sample)


def find_outliers(con: Connector, binned: Binned, infos: list[ColumnInfo], n_sample: int) -> OutlierRule:
    """The rows worth storing whole, among ``binned``'s: those whose value of a numeric column lies more than
    ``c = sqrt(N / n)`` standard deviations from the column's mean, mean and deviation of the rows within the
    bounds (a fixed point, found in at most :data:`OUTLIER_ROUNDS` rounds), at most :data:`OUTLIER_SHARE` of the
    sample's ``n`` rows (the rows farthest out in units of ``c`` standard deviations).

    Why ``c``: sampling ``n`` of ``N`` rows estimates a SUM with variance about ``(N² / n) σ²``. Storing one row
    whole removes its ``(y − ȳ)²`` from ``N σ²`` and one row from the sample; the variance falls exactly when
    ``(y − ȳ)² > N σ² / n``, i.e. ``|z| > sqrt(N / n)``. A heavy tail (a Zipf count, a delay) has many such rows,
    and with them set aside the rest's deviation shrinks, so more qualify: hence the fixed point. A light-tailed
    column (uniform, normal at 1% sampling: ``c`` = 10) has none. This is outlier indexing (Chaudhuri, Das, Datar,
    Motwani and Narasayya, "Overcoming limitations of sampling for aggregation queries", ICDE 2001).

    Examples
    --------
    >>> import duckdb, json
    >>> from densitas.aqp import Engine
    >>> eng = Engine(duckdb.connect())
    >>> eng.con.execute("CREATE TABLE t AS SELECT (i % 100)::DOUBLE AS x, "
    ...                 "CASE WHEN i % 1000 = 0 THEN 1e6 ELSE i % 7 END AS y FROM range(100000) r(i)")
    >>> meta = eng.build("t", sample_size=2_000)
    >>> [round(b) for b in json.loads(meta["options"])["outliers"][1]]  # y: 3 ± sqrt(50)·2; its 100 values of 1e6 go
    [-11, 17]
    >>> eng.query("SELECT SUM(y) AS s FROM t WHERE x < 1")["s"].iloc[0]      # exact: 100 × 1e6 + 2,698
    np.float64(100002698.0)
    """
    n_rows = count_rows(con, binned.table)
    cols = [j for j, info in enumerate(infos) if info.numeric]
    cap = int(OUTLIER_SHARE * n_sample)
    if not cols or n_sample + cap >= n_rows:  # the sample holds about every row anyway
        return OutlierRule.none(len(infos))
    c = math.sqrt(n_rows / n_sample)
    centre = _fixed_point(con, binned, cols, c)
    rule = OutlierRule([_band(centre[j], c) if j in centre else None for j in range(len(infos))])
    pred = rule.predicate(binned.v)
    if pred is None or _count_where(con, binned, pred) <= cap:
        return rule
    # too many: keep the farthest, in units of c deviations (t > 1 widens every column's bounds alike)
    dist = [_distance(binned, j, centre[j], c) for j in centre]
    far = exp.Greatest(this=dist[0], expressions=dist[1:]) if len(dist) > 1 else dist[0]
    t = con.fetch_rows(sqlglot.select(exp.alias_(far, "t", quoted=True)).from_(binned.table)
                       .order_by(exp.Ordered(this=_col("t"), desc=True)).limit(1).offset(cap))[0][0]
    w = max(1.0, float(t or 0.0)) * (1 + 1e-9) * c  # the row at t and its ties stay: at most cap rows leave
    rule = OutlierRule([_band(centre[j], w) if j in centre else None for j in range(len(infos))])
    pred = rule.predicate(binned.v)
    return rule if pred is not None and _count_where(con, binned, pred) <= cap else OutlierRule.none(len(infos))


def _fixed_point(con: Connector, binned: Binned, cols: list[int], c: float) -> dict[int, tuple[float, float]]:
    """Per column of ``cols`` with spread, the mean and deviation of the values within ``c`` deviations of that
    mean (iterated from all values, at most :data:`OUTLIER_ROUNDS` rounds). A column whose kept values have no
    spread left (a flag, a constant with a few far values) keeps the round before, whose band it then is; one
    with no spread at all gets none."""
    centre: dict[int, tuple[float, float]] = {}
    active = list(cols)
    for _ in range(OUTLIER_ROUNDS):
        if not active:
            break
        stats = []
        for j in active:
            lo, hi = _band(centre[j], c) if j in centre else (None, None)
            kept = binned.v(j) if lo is None else exp.case().when(
                exp.Between(this=binned.v(j), low=_float(lo), high=_float(hi)), binned.v(j))
            stats += [exp.Avg(this=kept), exp.StddevPop(this=kept.copy()), exp.Min(this=kept.copy()),
                      exp.Max(this=kept.copy())]
        got = con.fetch_rows(sqlglot.select(*stats).from_(binned.table))[0]
        still = []
        for i, j in enumerate(active):
            m, sd, lo, hi = got[4 * i: 4 * i + 4]
            if lo is None or lo == hi or not sd:  # no spread (PostgreSQL's STDDEV_POP of a constant is round-off)
                continue
            m, sd = float(m), float(sd)
            if centre.get(j) != (m, sd):
                centre[j] = (m, sd)
                still.append(j)
        active = still
    return centre


def _band(centre: tuple[float, float], width: float) -> tuple[float, float]:
    """``mean ± width · deviation``."""
    return centre[0] - width * centre[1], centre[0] + width * centre[1]


def _count_where(con: Connector, binned: Binned, pred: exp.Expression) -> int:
    return int(con.fetch_rows(sqlglot.select(_count()).from_(binned.table).where(pred))[0][0])


def _distance(binned: Binned, j: int, centre: tuple[float, float], c: float) -> exp.Expression:
    """How far a row's value of column ``j`` lies from its mean, in units of ``c`` deviations (0 where NULL)."""
    m, sd = centre
    return exp.func("coalesce", exp.Div(this=exp.Abs(this=exp.Sub(this=binned.v(j), expression=_float(m))),
                                        expression=_float(c * sd)), _float(0.0))


def set_aside(con: Connector, tables: SynopsisTables, binned: Binned, rule: OutlierRule) -> None:
    """The synopsis' ``outliers`` table: the rows ``rule`` picks, moved there from ``binned``
    (:func:`move_outliers`) and taken out of their groups' row counts: the other tables describe the rest."""
    con.execute(tables.outliers.create(tables.id))
    if not move_outliers(con, tables.table("outliers"), tables.outliers, binned, rule):
        return
    groups = tables.groups.table(tables.id)
    aside = sqlglot.select(_count()).from_(exp.alias_(tables.table("outliers"), "o", table=True, quoted=True)).where(
        _col("gid", "o").eq(exp.column("gid", table=groups.name, quoted=True)))
    con.execute(exp.update(groups, {"n": exp.Sub(this=_col("n"), expression=aside.subquery())}))


def move_outliers(con: Connector, target: exp.Table, lay: TableLayout, binned: Binned, rule: OutlierRule) -> bool:
    """Move the rows of ``binned`` that ``rule`` picks into ``target`` (group id and values, as the sample stores
    its rows); whether ``rule`` picks any row at all.

    Examples
    --------
    >>> import duckdb
    >>> from densitas.aqp.connector import DuckDBConnector
    >>> con = DuckDBConnector(duckdb.connect())
    >>> con.execute("CREATE TABLE b AS SELECT 0 AS gid, i::DOUBLE AS v0 FROM range(10) r(i)")
    >>> con.execute("CREATE TABLE o (gid SMALLINT, v0 DOUBLE)")
    >>> move_outliers(con, exp.table_("o"), sample_layout(1, "outliers"), Binned("b", 1), OutlierRule([(0.0, 7.0)]))
    True
    >>> con.fetch_rows("SELECT count(*) FROM b"), con.fetch_rows("SELECT v0 FROM o ORDER BY v0")
    ([(8,)], [(8.0,), (9.0,)])
    """
    pred = rule.predicate(binned.v)
    if pred is None:
        return False
    rows = sqlglot.select(exp.alias_(exp.cast(_col("gid"), lay.columns[0].sql_type), "gid", quoted=True),
                          *(binned.v(j) for j in range(binned.n_columns))).from_(binned.table).where(pred)
    con.execute(exp.insert(rows, target))
    con.execute(exp.delete(binned.table, where=pred.copy()))
    return True


def _drop(con: Connector, tbl: exp.Table) -> None:
    con.execute(exp.Drop(tables=[tbl], kind="TABLE"))


def write_histograms(con: Connector, tables: SynopsisTables, binned: Binned, infos: list[ColumnInfo],
                     group_by: Sequence[str] = ()) -> None:
    """The fine 1-D histograms (exact count and sum per group and bin), and the edges with each bin's occupied
    range over the whole table (its smallest and largest value: the model spreads the bin's rows over it) and
    the rows at either end (:func:`occupied`); with groups, how the rows at the ends are split among them
    (:func:`end_dispersion`, into each column's ``end_dispersion``)."""
    marg = tables.marg.table(tables.id)
    con.execute(tables.marg.create(tables.id))
    occ = []
    for j in range(len(infos)):
        hist = sqlglot.select(_num(j), _col("gid"), binned.b(j), _count(), exp.Sum(this=binned.v(j))) \
            .from_(binned.table).group_by(_col("gid"), binned.b(j))
        con.execute(exp.insert(hist, marg))
        occ.append(con.fetch_df(occupied(binned, j)))
    occ_all = pd.concat(occ, ignore_index=True)
    probes = fetch_probe_counts(con, binned, infos)
    con.execute(tables.edges.create(tables.id))
    con.insert_frame(tables.edges.table(tables.id), edges_frame(infos, occ_all))
    labels = None
    if group_by:
        labels = con.fetch_df(sqlglot.select(_col("gid"), *(_col(g) for g in group_by))
                              .from_(tables.table("groups")))
        set_end_dispersion(infos, occ_all, labels, list(group_by))
    set_placement_error(infos, occ_all, probes, labels, list(group_by))


OCCUPIED = ("vmin", "vmax", "nmin", "nmax")


def occupied(binned: Binned, j: int) -> exp.Select:
    """Per group and non-empty fine bin of column ``j``: ``(col, gid, bin, vmin, vmax, nmin, nmax, n)``, the bin's
    smallest and largest value over the whole table, the group's rows holding each and its rows in the bin (two
    passes: the ends, then the rows at them).

    Examples
    --------
    >>> occupied(Binned("binned", 2), 1).named_selects
    ['col', 'gid', 'bin', 'vmin', 'vmax', 'nmin', 'nmax', 'n']
    """
    ends = sqlglot.select(exp.alias_(binned.b(j), "bin", quoted=True),
                          exp.alias_(exp.Min(this=binned.v(j)), "vmin", quoted=True),
                          exp.alias_(exp.Max(this=binned.v(j)), "vmax", quoted=True)) \
        .from_(binned.table).where(binned.b(j) > _num(0)).group_by(binned.b(j))

    def rows_at(end: str) -> exp.Expression:
        return exp.Sum(this=exp.case().when(exp.column(f"v{j}", "t", quoted=True).eq(_col(end, "e")), _num(1))
                       .else_(_num(0)))

    gid = exp.column("gid", "t", quoted=True)
    return sqlglot.select(exp.alias_(_num(j), "col", quoted=True), exp.alias_(gid, "gid", quoted=True),
                          _col("bin", "e"), _col("vmin", "e"), _col("vmax", "e"),
                          exp.alias_(rows_at("vmin"), "nmin", quoted=True),
                          exp.alias_(rows_at("vmax"), "nmax", quoted=True),
                          exp.alias_(_count(), "n", quoted=True)) \
        .from_(exp.alias_(binned.table, "t", table=True, quoted=True)) \
        .join(ends.subquery("e"), on=exp.column(f"b{j}", "t", quoted=True).eq(_col("bin", "e"))) \
        .group_by(gid, _col("bin", "e"), _col("vmin", "e"), _col("vmax", "e"))


#: where the build probes each fine bin (:func:`probe_counts`): a quarter, half and three quarters across it
PROBES = (1, 2, 3)


def _float(v: float) -> exp.Literal:
    return exp.Literal.number(repr(float(v)))


def probe_points(info: ColumnInfo) -> np.ndarray:
    """(bins, len(PROBES)): the points a quarter, half and three quarters across each fine bin of ``info``
    (between its edges, on the values' grid where they have a spacing): fixed before the rows are read, so that
    the counts below them add up over the parts of a table built in parts.

    Examples
    --------
    >>> probe_points(ColumnInfo("x", "INTEGER", "int", 1.0, lo=0.0, hi=9.0, edges=np.array([0.0, 5.0]))).tolist()
    [[1.0, 2.0, 4.0], [6.0, 8.0, 9.0]]
    """
    lo, up = info.edges.astype(np.float64), info.uppers()
    raw = lo[:, None] + (up - lo)[:, None] * (np.array(PROBES, dtype=np.float64) / 4)[None, :]
    return np.round(raw / info.step) * info.step if info.step > 0 else raw


def probe_counts(binned: Binned, j: int, step: float) -> exp.Select:
    """Per group and non-empty fine bin of column ``j``: ``(col, gid, bin, nq1, nq2, nq3)``, its rows below each
    of the bin's probe points (the temporary table :data:`PROBES_TMP` of :func:`write_probe_points`; half a step
    below, the values lying on the step's grid).

    Examples
    --------
    >>> probe_counts(Binned("binned", 1), 0, 1.0).named_selects
    ['col', 'gid', 'bin', 'nq1', 'nq2', 'nq3']
    """
    names = [f"q{k}" for k in PROBES]
    v = exp.column(f"v{j}", "t", quoted=True)

    def below(name: str) -> exp.Expression:
        return exp.Sum(this=exp.case().when(
            exp.LT(this=v, expression=exp.Sub(this=_col(name, "pr"), expression=_float(step / 2))), _num(1))
            .else_(_num(0)))

    gid = exp.column("gid", "t", quoted=True)
    on = exp.and_(exp.column(f"b{j}", "t", quoted=True).eq(_col("bin", "pr")), _col("col", "pr").eq(_num(j)))
    return sqlglot.select(exp.alias_(_num(j), "col", quoted=True), exp.alias_(gid, "gid", quoted=True),
                          exp.alias_(_col("bin", "pr"), "bin", quoted=True),
                          *(exp.alias_(below(q), f"n{q}", quoted=True) for q in names)) \
        .from_(exp.alias_(binned.table, "t", table=True, quoted=True)) \
        .join(exp.alias_(exp.table_(PROBES_TMP, quoted=True), "pr", table=True, quoted=True), on=on) \
        .group_by(gid, _col("bin", "pr"))


def write_probe_points(con: Connector, infos: Sequence[ColumnInfo]) -> list[int]:
    """The temporary table :data:`PROBES_TMP` of each continuous column's :func:`probe_points` (``col, bin, q1,
    q2, q3``); returns those columns (none for a discrete one: its bins are its values).

    Examples
    --------
    >>> from densitas.aqp.connector import connect
    >>> con = connect(":memory:")
    >>> infos = [ColumnInfo("x", "INTEGER", "int", 1.0, lo=0.0, hi=9.0, edges=np.array([0.0, 5.0])),
    ...          ColumnInfo("k", "INTEGER", "int", 1.0, lo=0.0, hi=3.0, edges=np.arange(4.0), discrete=True)]
    >>> write_probe_points(con, infos)
    [0]
    >>> con.fetch_rows(sqlglot.select("bin", "q2").from_(PROBES_TMP).order_by("bin"))
    [(1, 2.0), (2, 8.0)]
    """
    cols = [j for j, info in enumerate(infos) if not info.discrete and info.bins]
    if not cols:
        return cols
    frames = []
    for j in cols:
        pts = probe_points(infos[j])
        frames.append(pd.DataFrame({"col": np.full(len(pts), j, dtype=np.int32),
                                    "bin": np.arange(1, len(pts) + 1, dtype=np.int32),
                                    **{f"q{k}": pts[:, t] for t, k in enumerate(PROBES)}}))
    con.create_temp_table(PROBES_TMP, pd.concat(frames, ignore_index=True))
    return cols


def fetch_probe_counts(con: Connector, binned: Binned, infos: Sequence[ColumnInfo]) -> pd.DataFrame | None:
    """:func:`probe_counts` of every continuous column, in one query over the binned rows' table; None without
    continuous columns. The probe points' temporary table is dropped after.

    Examples
    --------
    >>> from densitas.aqp.connector import connect
    >>> con = connect(":memory:")
    >>> con.execute("CREATE TABLE binned AS SELECT 0 AS gid, CASE WHEN i < 5 THEN 1 ELSE 2 END AS b0, "
    ...             "i::DOUBLE AS v0 FROM range(10) t(i)")
    >>> info = ColumnInfo("x", "INTEGER", "int", 1.0, lo=0.0, hi=9.0, edges=np.array([0.0, 5.0]))
    >>> got = fetch_probe_counts(con, Binned("binned", 1), [info])       # below 1, 2, 4 and 6, 8, 9
    >>> got.sort_values("bin")[["bin", "nq1", "nq2", "nq3"]].astype(int).values.tolist()
    [[1, 1, 2, 4], [2, 1, 3, 4]]
    """
    cols = write_probe_points(con, infos)
    if not cols:
        return None
    try:
        queries = [probe_counts(binned, j, infos[j].step) for j in cols]
        return con.fetch_df(queries[0] if len(queries) == 1 else exp.union(*queries, distinct=False))
    finally:
        _drop(con, exp.table_(PROBES_TMP, quoted=True))


def merge_probes(parts: Sequence[pd.DataFrame | None]) -> pd.DataFrame | None:
    """:func:`probe_counts`' rows of parts of a table, added up per column, group and bin (None where no part
    has any: no continuous column).

    Examples
    --------
    >>> a = pd.DataFrame({"col": [0], "gid": [0], "bin": [1], "nq1": [2], "nq2": [3], "nq3": [4]})
    >>> merge_probes([a, a.assign(bin=[2]), a])[["bin", "nq2"]].values.tolist()
    [[1, 6], [2, 3]]
    """
    got = [p for p in parts if p is not None and len(p)]
    if not got:
        return None
    return pd.concat(got, ignore_index=True).groupby(["col", "gid", "bin"], as_index=False).sum()


def merge_occupied(parts: Sequence[pd.DataFrame]) -> pd.DataFrame:
    """Bins' occupied ranges from parts of the table (:func:`occupied`'s columns): the least ``vmin`` and its
    rows summed over the parts whose ``vmin`` it is, the greatest ``vmax`` likewise; per group where the parts
    have a ``gid`` column (all of them, or none: rows without one count for no group), else per bin.

    Examples
    --------
    >>> import pandas as pd
    >>> a = pd.DataFrame({"col": [0], "bin": [1], "vmin": [2.0], "vmax": [9.0], "nmin": [3], "nmax": [1]})
    >>> b = pd.DataFrame({"col": [0], "bin": [1], "vmin": [2.0], "vmax": [7.0], "nmin": [4], "nmax": [5]})
    >>> merge_occupied([a, b])[["vmin", "vmax", "nmin", "nmax"]].values.tolist()
    [[2.0, 9.0, 7.0, 1.0]]
    >>> a, b = a.assign(gid=0, n=10), b.assign(gid=1, n=12)       # per group: each group's rows at the ends
    >>> merge_occupied([a, b])[["gid", "vmax", "nmin", "nmax", "n"]].values.tolist()
    [[0.0, 9.0, 3.0, 1.0, 10.0], [1.0, 9.0, 4.0, 0.0, 12.0]]
    """
    occ = pd.concat(parts, ignore_index=True)
    occ = occ.loc[occ["vmin"].notna()]
    key = ["col", "bin"]
    ends = occ.groupby(key, as_index=False).agg(lo=("vmin", "min"), hi=("vmax", "max"))
    occ = occ.merge(ends, on=key)
    occ["nmin"] = np.where(occ["vmin"] == occ["lo"], occ["nmin"], 0)
    occ["nmax"] = np.where(occ["vmax"] == occ["hi"], occ["nmax"], 0)
    by = ["col", "gid", "bin"] if "gid" in occ.columns and occ["gid"].notna().all() else key
    extra = {"n": ("n", "sum")} if "n" in occ.columns and by != key else {}
    out = occ.groupby(by, as_index=False).agg(vmin=("lo", "first"), vmax=("hi", "first"), nmin=("nmin", "sum"),
                                              nmax=("nmax", "sum"), **extra)
    return out.astype({"vmin": np.float64, "vmax": np.float64, "nmin": np.float64, "nmax": np.float64})


def bin_ends(occ: pd.DataFrame) -> pd.DataFrame:
    """Per column and bin, the occupied range and the table's rows at its ends: :func:`occupied`'s per-group
    rows added up (returned as they are where they have no ``gid`` column).

    Examples
    --------
    >>> import pandas as pd
    >>> occ = pd.DataFrame({"col": [0, 0], "gid": [0, 1], "bin": [1, 1], "vmin": [2.0, 2.0], "vmax": [9.0, 9.0],
    ...                     "nmin": [3, 0], "nmax": [1, 2], "n": [7, 5]})
    >>> bin_ends(occ)[["bin", "vmin", "vmax", "nmin", "nmax"]].values.tolist()
    [[1.0, 2.0, 9.0, 3.0, 3.0]]
    """
    if "gid" not in occ.columns:
        return occ
    return occ.groupby(["col", "bin"], as_index=False).agg(vmin=("vmin", "first"), vmax=("vmax", "first"),
                                                          nmin=("nmin", "sum"), nmax=("nmax", "sum"))


#: group columns up to which :func:`end_dispersion` measures every subset of them (beyond: each column alone
#: and all of them together; a query grouping otherwise takes the largest measured)
END_SUBSETS_UP_TO = 6


def end_dispersion(occ: pd.DataFrame, labels: pd.DataFrame, group_by: list[str], j: int, bins: int
                   ) -> dict[str, list[list[float | None]]]:
    """How the table's rows at each end of column ``j``'s fine bins are split among groups, against a split in
    proportion to the groups' rows in the bin (the model's: :meth:`~densitas.aqp.synopsis.Synopsis._shares`), per
    set of group columns a query may group by.

    For a set ``T``, its classes ``O`` (the groups agreeing on ``T``), a bin ``b`` with distinct ends and an end
    holding ``c`` rows, ``O``'s share ``P = n_Ob / n_b`` of the bin's rows: the model's error in ``O``'s rows at
    that end is ``d = c_O − c·P``. A split of the ``c`` rows drawn at random by those shares (multinomial) has
    ``E d² = c·P(1 − P)``; the end's dispersion is ``Σ_O d² / Σ_O c·P(1 − P)``: exact, from the whole table. 1
    for rows placed at random, about 0 where every group holds its share of every value (a day's births in each
    state), far above 1 where a few groups hold a value. The empty set is left out: the groups' rows at an end
    add up to ``c`` exactly.

    ``occ``: :func:`occupied`'s per-group rows; ``labels``: the groups table (``gid`` and the group columns).
    Returns per set (:func:`subset_key`) the dispersion at each bin's low and high end (None where the bin has
    no two distinct ends).

    Examples
    --------
    >>> import pandas as pd
    >>> labels = pd.DataFrame({"gid": [0, 1], "g": ["a", "b"]})
    >>> occ = pd.DataFrame({"col": 0, "gid": [0, 1], "bin": 1, "vmin": 0.0, "vmax": 9.0,
    ...                     "nmin": [5, 5], "nmax": [10, 0], "n": [50, 50]})
    >>> end_dispersion(occ, labels, ["g"], 0, bins=1)   # low end: d = 0, 0; high end: ±5 against 2.5 + 2.5
    {'["g"]': [[0.0], [10.0]]}
    """
    o = occ.loc[(occ["col"] == j) & (occ["vmax"] > occ["vmin"])]
    if o.empty:
        return {}
    G = int(labels["gid"].max()) + 1
    b_idx = o["bin"].to_numpy(dtype=np.int64) - 1
    g_idx = o["gid"].to_numpy(dtype=np.int64)
    measured = np.zeros(bins, dtype=bool)
    measured[b_idx] = True
    n = np.zeros((G, bins))
    ends = [np.zeros((G, bins)), np.zeros((G, bins))]
    np.add.at(n, (g_idx, b_idx), o["n"].to_numpy(dtype=np.float64))
    for e, c in zip(ends, ("nmin", "nmax"), strict=True):
        np.add.at(e, (g_idx, b_idx), o[c].to_numpy(dtype=np.float64))
    out = {}
    for cols in _group_subsets(group_by):
        cls = _classes(labels, G, cols)
        n_O = _by_class(n, cls)  # (classes, bins)
        P = n_O / np.maximum(n_O.sum(axis=0), 1)
        per_end = []
        for e in ends:
            c_O = _by_class(e, cls)
            c = c_O.sum(axis=0)
            num = ((c_O - c * P) ** 2).sum(axis=0)
            den = (c * P * (1 - P)).sum(axis=0)
            ok = measured & (den > 0)
            per_end.append([float(f"{x:.4g}") if k_ else None
                            for x, k_ in zip(np.where(ok, num / np.where(ok, den, 1), 0.0), ok, strict=True)])
        out[subset_key(cols)] = per_end
    return out


def _group_subsets(group_by: Sequence[str]) -> list[list[str]]:
    """The sets of group columns a query may split its answers by that the build measures (the empty set left
    out): every one up to :data:`END_SUBSETS_UP_TO` group columns, beyond each column alone and all together."""
    k = len(group_by)
    if k <= END_SUBSETS_UP_TO:
        return [list(s) for r in range(1, k + 1) for s in itertools.combinations(group_by, r)]
    return [[g] for g in group_by] + [list(group_by)]


def _classes(labels: pd.DataFrame | None, G: int, cols: list[str]) -> np.ndarray:
    """(G,): each group's class among the groups agreeing on ``cols`` (all one class for no columns)."""
    if not cols or labels is None:
        return np.zeros(G, dtype=np.int64)
    cls = labels.set_index("gid").reindex(range(G)).groupby(cols, dropna=False, sort=False).ngroup().to_numpy()
    return np.where(cls < 0, cls.max() + 1, cls)


def placement_error(occ: pd.DataFrame, probes: pd.DataFrame | None, labels: pd.DataFrame | None,
                    group_by: Sequence[str], j: int, info: ColumnInfo) -> dict[str, float]:
    """How far the rows strictly inside column ``j``'s fine bins lie from the even spread the model places them
    by (:meth:`~densitas.aqp.synopsis.Synopsis._shares`) beyond what rows placed at random and the density's
    slope explain, per set of group columns a query may split its answers by (the empty set included):
    measured on the whole table at each bin's :func:`probe_points`.

    At a probe taking the share ``p`` of a bin's inner rows (those strictly between its least and greatest
    value), the model gives a group ``f·n_g`` of its rows in the bin (``f`` the whole bin's share, its ends'
    rows included; with one group only the inner rows are placed: ``f = p``, ``n`` their count), and the table
    holds ``c_g``: the error ``d_g = c_g − f·n_g``. Rows placed at random give ``E d_g² = f(1 − f)·n_g``, a
    density's slope the squared slope error ``s_g²`` (:func:`~densitas.aqp.columns.slope_error`). What neither
    explains is the density's shape within the bin: clusters of rows between its values, which move the count
    below a cut as a bridge does (variance ``∝ f(1 − f)``), by an amount in proportion to the bin's rows, as the
    slope's is: the query's placement variance adds ``κ·f(1 − f)·n_g²``. Per set ``T`` and its classes ``O``
    (groups agreeing on ``T``; one for the empty set; an answer adds up its groups' variances) ``κ_T = Σ (d_O² −
    Σ_O f(1 − f)·n_g − Σ_O s_g²) / Σ Σ_O f(1 − f)·n_g²`` over the bins and probes (``d_O = Σ_O d_g``), at least
    0. A shape the groups share (TPC-H's ``l_extendedprice``, a quantity times a price) moves their errors
    together: an answer over several groups takes the larger ``κ`` of the fewer classes. Exact, from the whole
    table; ``occ``: :func:`occupied`'s rows, ``probes``: :func:`probe_counts`', per group; ``labels``: the
    groups table (``gid`` and the group columns; None without groups).

    Examples
    --------
    >>> import pandas as pd
    >>> info = ColumnInfo("x", "INTEGER", "int", 1.0, lo=0.0, hi=299.0, edges=np.array([0.0, 100.0, 200.0]))
    >>> probe_points(info)[:, 1].tolist()
    [50.0, 150.0, 250.0]
    >>> occ = pd.DataFrame({"col": 0, "gid": 0, "bin": [1, 2, 3], "vmin": [0.0, 100.0, 200.0],
    ...                     "vmax": [99.0, 199.0, 299.0], "nmin": 1, "nmax": 1, "n": 100})
    >>> probes = pd.DataFrame({"col": 0, "gid": 0, "bin": [1, 2, 3], "nq1": 25, "nq2": [20, 50, 80], "nq3": 75})
    >>> placement_error(occ, probes, None, [], 0, info)  # (30² + 30² − Σ p(1 − p)·98) / Σ p(1 − p)·98²
    {'[]': 0.09059}
    """
    o = occ.loc[occ["col"] == j]
    pr = None if probes is None else probes.loc[probes["col"] == j]
    if pr is None or o.empty or pr.empty:
        return {}
    G = 1 if labels is None else int(labels["gid"].max()) + 1
    B = info.bins

    def per_bin(frame: pd.DataFrame, c: str) -> np.ndarray:  # a bin's value (the same in every group's row)
        a = np.full(B + 1, np.nan)
        a[frame["bin"].to_numpy(dtype=np.int64)] = frame[c].to_numpy(dtype=np.float64)
        return a[1:]

    def per_group(frame: pd.DataFrame, c: str) -> np.ndarray:  # (G, B + 1), bin 0 (NULL) empty
        a = np.zeros((G, B + 1))
        np.add.at(a, (frame["gid"].to_numpy(dtype=np.int64), frame["bin"].to_numpy(dtype=np.int64)),
                  frame[c].to_numpy(dtype=np.float64))
        return a

    w = per_group(o, "n")
    vmin, vmax = per_bin(o, "vmin"), per_bin(o, "vmax")
    lower, upper = dataclasses.replace(info, occupied_min=vmin, occupied_max=vmax).spread()
    n_g, nmin_g, nmax_g = w[:, 1:], per_group(o, "nmin")[:, 1:], per_group(o, "nmax")[:, 1:]
    n_b, nmin_b, nmax_b = n_g.sum(axis=0), nmin_g.sum(axis=0), nmax_g.sum(axis=0)
    inner_lo = vmin + info.step
    width = vmax - inner_lo
    known = (n_b > 0) & (nmin_b > 0) & (nmax_b > 0) & (vmax > vmin) & (width > 0)  # as Synopsis._ends
    with np.errstate(invalid="ignore", divide="ignore"):
        a_lo, a_hi = nmin_b / n_b, nmax_b / n_b
    points = probe_points(info)
    d, bern, nsq, slope2 = [], [], [], []
    for t, k in enumerate(PROBES):
        q = points[:, t]
        with np.errstate(invalid="ignore", divide="ignore"):
            p = np.clip((q - inner_lo) / np.where(width > 0, width, 1.0), 0.0, 1.0)
        at = np.flatnonzero(known & (p > 0) & (p < 1))
        if not len(at):
            continue
        c_g = per_group(pr, f"nq{k}")[:, 1:][:, at] - nmin_g[:, at]  # the inner rows below (vmin < q < vmax)
        if G == 1:  # only the inner rows are placed (Synopsis._placement)
            base = n_g[:, at] - nmin_g[:, at] - nmax_g[:, at]
            f = p[at]
            d.append(c_g - f * base)
        else:
            base = n_g[:, at]
            f = a_lo[at] + p[at] * (1 - a_lo[at] - a_hi[at])
            d.append(nmin_g[:, at] + c_g - f * base)
        bern.append(f * (1 - f) * base)
        nsq.append(base)
        slope2.append(np.nan_to_num(slope_error(w, lower, upper, at + 1, q[at]) ** 2))
    if not d:
        return {}
    d, bern, nsq, slope2 = (np.concatenate(a, axis=1) for a in (d, bern, nsq, slope2))
    out = {}
    for cols in [[], *_group_subsets(group_by)]:
        cls = _classes(labels, G, cols)
        den = _by_class(bern * nsq, cls).sum()
        if den > 0:
            num = (_by_class(d, cls) ** 2 - _by_class(bern, cls) - _by_class(slope2, cls)).sum()
            out[subset_key(cols)] = float(f"{max(num, 0.0) / den:.4g}")
    return out


def set_placement_error(infos: list[ColumnInfo], occ: pd.DataFrame, probes: pd.DataFrame | None,
                        labels: pd.DataFrame | None, group_by: Sequence[str]) -> None:
    """Each continuous column's :func:`placement_error` into its ``placement_error`` (a discrete column's bins
    are its values: no bin is cut between its ends).

    Examples
    --------
    >>> info = ColumnInfo("x", "INTEGER", "int", 1.0, lo=0.0, hi=299.0, edges=np.array([0.0, 100.0, 200.0]))
    >>> occ = pd.DataFrame({"col": 0, "gid": 0, "bin": [1, 2, 3], "vmin": [0.0, 100.0, 200.0],
    ...                     "vmax": [99.0, 199.0, 299.0], "nmin": 1, "nmax": 1, "n": 100})
    >>> probes = pd.DataFrame({"col": 0, "gid": 0, "bin": [1, 2, 3], "nq1": 25, "nq2": 50, "nq3": 75})
    >>> set_placement_error([info], occ, probes, None, [])
    >>> info.placement_error          # rows spread evenly: nothing beyond random placement
    {'[]': 0.0}
    """
    for j, info in enumerate(infos):
        if not info.discrete:
            info.placement_error = placement_error(occ, probes, labels, group_by, j, info)


def _by_class(a: np.ndarray, cls: np.ndarray) -> np.ndarray:
    """(classes, bins): the groups' rows ``a`` (groups, bins) added up per class ``cls`` (groups,)."""
    out = np.zeros((int(cls.max()) + 1, a.shape[1]))
    np.add.at(out, cls, a)
    return out


def set_end_dispersion(infos: list[ColumnInfo], occ: pd.DataFrame, labels: pd.DataFrame, group_by: list[str]
                       ) -> None:
    """Each continuous column's :func:`end_dispersion` into its ``end_dispersion`` (a discrete column's bins are
    its values: no bin is cut at an end).

    Examples
    --------
    >>> import pandas as pd
    >>> info = ColumnInfo("x", "INTEGER", "int", 1.0, edges=np.array([0.0]))
    >>> occ = pd.DataFrame({"col": 0, "gid": [0, 1], "bin": 1, "vmin": 0.0, "vmax": 9.0,
    ...                     "nmin": [5, 5], "nmax": [10, 0], "n": [50, 50]})
    >>> set_end_dispersion([info], occ, pd.DataFrame({"gid": [0, 1], "g": ["a", "b"]}), ["g"])
    >>> info.end_dispersion
    {'["g"]': [[0.0], [10.0]]}
    """
    for j, info in enumerate(infos):
        if not info.discrete:
            info.end_dispersion = end_dispersion(occ, labels, group_by, j, info.bins)


def nullable(v: pd.Series | np.ndarray, dtype: str = "Float64") -> pd.api.extensions.ExtensionArray:
    """Numbers with NaN as NULL, as pandas' nullable ``dtype`` (the stored tables hold NULL where a bin or cell
    has no value).

    Examples
    --------
    >>> nullable(np.array([1.5, np.nan])).tolist(), nullable(np.array([2.0, np.nan]), "Int64").tolist()
    ([1.5, <NA>], [2, <NA>])
    """
    a = np.asarray(v, dtype=np.float64)
    return pd.array(np.where(np.isnan(a), None, a), dtype=dtype)


def edges_frame(infos: Sequence[ColumnInfo], occ: pd.DataFrame) -> pd.DataFrame:
    """The edges table's rows: per column and bin the lower edge and the occupied range with the rows at its ends
    (``occ``, :func:`occupied`'s columns; NULL where a bin is empty).

    Examples
    --------
    >>> info = ColumnInfo("x", "DOUBLE", "float", 0.0, edges=np.array([0.0, 5.0]))
    >>> occ = pd.DataFrame({"col": [0], "bin": [2], "vmin": [5.5], "vmax": [9.0], "nmin": [3], "nmax": [1]})
    >>> edges_frame([info], occ)[["bin", "lo", "vmin", "nmax"]].values.tolist()
    [[1, 0.0, <NA>, <NA>], [2, 5.0, 5.5, 1]]
    """
    occ = bin_ends(occ)
    frames = []
    for j, info in enumerate(infos):
        o = occ.loc[occ["col"] == j]
        idx = o["bin"].to_numpy(dtype=np.int64) - 1
        cols = {}
        for c in OCCUPIED:
            a = np.full(info.bins, np.nan)
            a[idx] = o[c].to_numpy(dtype=np.float64)
            cols[c] = nullable(a, "Float64" if c[0] == "v" else "Int64")
        frames.append(pd.DataFrame({"col": np.full(info.bins, j, dtype=np.int32),
                                    "bin": np.arange(1, info.bins + 1, dtype=np.int32),
                                    "lo": info.edges.astype(np.float64), **cols}))
    return pd.concat(frames, ignore_index=True)


#: the coarsest sum grid a column gets, whatever the budget: a cut through a cell of it is fitted from the sample
MIN_SUM_RES = 4


def write_sum_grids(con: Connector, tables: SynopsisTables, binned: Binned, infos: list[ColumnInfo], plan: Plan,
                    opts: BuildOptions) -> list[int]:
    """Per column, per (group, cell of the column's sum grid), the row count and every numeric column's sum and
    non-NULL count (SUM/AVG of one column under predicates on another); returns each column's resolution
    (:func:`sum_grid_resolutions`)."""
    lay = tables.sums
    numeric = [j for j, info in enumerate(infos) if info.numeric]
    nullable = [j for j in numeric if infos[j].nullable]
    values = [_count()] + [exp.Sum(this=binned.v(j)) for j in numeric] + [exp.Count(this=binned.v(j))
                                                                          for j in nullable]
    sum_res = sum_grid_resolutions(infos, plan, opts, plan.costs.sums)
    con.execute(lay.create(tables.id))
    for j in range(len(infos)):
        cell = binned.coarse(j, sum_res[j], plan.bins[j])
        grid = sqlglot.select(_num(j), _col("gid"), cell, *(v.copy() for v in values)).from_(binned.table) \
            .group_by(_col("gid"), cell.copy())
        con.execute(exp.insert(grid, lay.table(tables.id)))
    return sum_res


def sum_grid_resolutions(infos: list[ColumnInfo], plan: Plan, opts: BuildOptions, row_bytes: float) -> list[int]:
    """Each column's sum grid resolution: the sum grids' share of the budget (:meth:`Plan.share_bytes`) in rows,
    split evenly among the columns. A column whose grid at full resolution fits its part takes it (its cuts are
    exact; a discrete column's rows are its (group, value) pairs, ``info.cells``, else groups x fine bins) and
    hands the rest to the others; the others take their part whole, cells
    being runs of fine bins at any resolution (:func:`~densitas.aqp.store.cell_map`), at least
    :data:`MIN_SUM_RES` (or the column's fine bins, when fewer).

    Examples
    --------
    >>> plan = Plan(budget=100_000, n_groups=1, bins=[5, 300, 40], costs=RowCosts(1.0, 40.0, 1.0, 8.0))
    >>> round(plan.share_bytes(BuildOptions(), 2) / 40.0)     # cells a group for the three columns
    250
    >>> sum_grid_resolutions([], plan, BuildOptions(), 40.0)  # 5 and 40 whole, the rest to the second
    [5, 205, 40]
    """
    bins = list(plan.bins)
    G = plan.n_groups
    rows = plan.share_bytes(opts, 2) / row_bytes  # grid rows in all
    # a discrete column at full resolution takes the rows of its (group, value) pairs (count_cells), else dense
    full = [infos[j].cells if j < len(infos) and infos[j].discrete and infos[j].cells and bins[j] == infos[j].distinct
            else G * bins[j] for j in range(len(bins))]
    res = [0] * len(bins)
    left = list(range(len(bins)))
    while left:  # full resolution where it fits, the slack handed on, until no column left fits whole
        per = rows / len(left)
        whole = [j for j in left if full[j] <= per]
        if not whole:
            break
        for j in whole:
            res[j] = bins[j]
            rows -= full[j]
        left = [j for j in left if j not in whole]
    for j in left:
        res[j] = min(bins[j], max(MIN_SUM_RES, int(rows / len(left) / G)))
    return res


def probe_dependence(con: Connector, binned: Binned, plan: Plan, grids: dict | None = None
                     ) -> dict[tuple[int, int], float]:
    """The dependence score (:func:`dependence`) of every pair of columns, from one GROUPING SETS query of
    every pair's 16 x 16 probe histogram per group. ``grids``, when given, receives each pair's probe grid in
    the format of :func:`finest_pair_grids` (exact counts, NULL cells included: a pair grid of resolution
    ``min(bins, 16)`` per dimension, for no further scan)."""
    k, bins = binned.n_columns, plan.bins
    pairs_all = list(itertools.combinations(range(k), 2))
    scores: dict[tuple[int, int], float] = {}
    if not pairs_all:
        return scores
    probe = [min(PROBE_RES, bins[j]) for j in range(k)]
    p = [_col(f"p{j}") for j in range(k)]
    cells = sqlglot.select(_col("gid"), *(exp.alias_(binned.coarse(j, probe[j], bins[j]), f"p{j}", quoted=True)
                                          for j in range(k))).from_(binned.table)
    sets = exp.GroupingSets(expressions=[exp.Tuple(expressions=[_col("gid"), p[a].copy(), p[b].copy()])
                                         for a, b in pairs_all])
    rows = con.fetch_numpy(sqlglot.select(_col("gid"), *p, exp.alias_(_count(), "n", quoted=True))
                           .from_(cells.subquery()).group_by(sets))
    gid_a = np.asarray(rows["gid"], dtype=np.int64)
    n_a = np.asarray(rows["n"], dtype=np.float64)
    pv = {j: np.ma.filled(np.ma.asarray(rows[f"p{j}"]).astype(np.float64), np.nan) for j in range(k)}
    for a_, b_ in pairs_all:
        # rows of this grouping set: both coordinates set, the others NULL (GROUPING SETS pads with NULL)
        sel = ~np.isnan(pv[a_]) & ~np.isnan(pv[b_])
        for j in range(k):
            if j not in (a_, b_):
                sel &= np.isnan(pv[j])
        ca, cb = pv[a_][sel].astype(np.int64), pv[b_][sel].astype(np.int64)
        if grids is not None:
            grids[(a_, b_)] = ((probe[a_], probe[b_]), (gid_a[sel], ca, cb, n_a[sel].astype(np.int64)))
        keep = (ca > 0) & (cb > 0)
        h = np.zeros((plan.n_groups, probe[a_], probe[b_]))
        np.add.at(h, (gid_a[sel][keep], ca[keep] - 1, cb[keep] - 1), n_a[sel][keep])
        scores[(a_, b_)] = dependence(h)
    return scores


@dataclass
class PairGrid:
    """A stored pair grid: its id, columns, resolution per dimension and dependence score."""

    id: int
    cols: tuple[int, int]
    res: tuple[int, int]
    score: float

    def to_dict(self) -> dict:
        """The grid's entry in the catalog's ``grids`` JSON."""
        return {"id": self.id, "cols": list(self.cols), "res": list(self.res), "score": self.score}


def write_pair_grids(con: Connector, tables: SynopsisTables, binned: Binned, infos: list[ColumnInfo], plan: Plan,
                     scores: dict[tuple[int, int], float], opts: BuildOptions, say: Callable[[str, float], None],
                     probe_grids: dict | None = None) -> list[PairGrid]:
    """Grids for the dependent pairs (:func:`_choose_pairs`) in what the histograms and sum grids left of the
    budget (the pair grids are sparse), less what the sample uses of its share (:func:`pair_reserve`)."""
    pair_budget = plan.budget - pair_reserve(plan, opts) - plan.costs.of(con, tables, "marg", "sums", "edges",
                                                                         "groups")
    chosen = _choose_pairs(con, binned, infos, plan.bins, scores, opts, pair_budget, say, probe_grids,
                           plan.costs.pairs)
    return insert_pair_grids(con, tables, chosen, scores)


def pair_reserve(plan: Plan, opts: BuildOptions) -> float:
    """Bytes kept from the grids for the sample: what it can use of its share (:func:`sample_bytes`) —
    beyond that the sample would not use them, and the grids do.

    Examples
    --------
    >>> plan = Plan(budget=100_000, n_groups=1, bins=[], costs=RowCosts(1.0, 1.0, 1.0, 8.0))
    >>> pair_reserve(plan, BuildOptions())                      # planned without a cap: the whole 65% share
    65000.0
    >>> plan.sample_bytes = 16_000.0                             # 2,000 rows at 8 bytes
    >>> pair_reserve(plan, BuildOptions())
    16000.0
    """
    return plan.sample_bytes if plan.sample_bytes is not None else opts.shares[0] * plan.budget


def insert_pair_grids(con: Connector, tables: SynopsisTables, chosen: list, scores: dict[tuple[int, int], float]
                      ) -> list[PairGrid]:
    """Create the pairs table and write the chosen grids (:func:`choose_pair_resolutions`) into it."""
    con.execute(tables.pairs.create(tables.id))
    grids = []
    for pi, (pair, res, cells) in enumerate(chosen):
        frame = pd.DataFrame({"pair": np.full(len(cells[0]), pi, dtype=np.int16),
                              "gid": cells[0].astype(np.int16), "c0": cells[1].astype(np.int16),
                              "c1": cells[2].astype(np.int16), "n": cells[3].astype(np.int32)})
        con.insert_frame(tables.pairs.table(tables.id), frame)
        grids.append(PairGrid(pi, pair, res, scores[pair]))
    return grids


def sample_quotas(gsizes: np.ndarray, n_sample: int, fixed: bool) -> np.ndarray:
    """Sample rows per group: proportional to the group's rows, at least ``min(N_g, 200)``; the proportional
    part shrunk so that the floor keeps the total within ``n_sample`` (unless ``fixed``: a requested size).

    Examples
    --------
    >>> sample_quotas(np.array([10_000, 1_000, 50]), 1_100, fixed=False).tolist()
    [850, 200, 50]
    """
    def quotas(f: float) -> np.ndarray:
        return np.minimum(gsizes, np.maximum(np.minimum(gsizes, 200),
                                             np.floor(f * n_sample * gsizes / gsizes.sum()).astype(np.int64)))

    lo_f, hi_f = 0.0, 1.0
    for _ in range(30):
        mid = (lo_f + hi_f) / 2
        lo_f, hi_f = (mid, hi_f) if quotas(mid).sum() <= n_sample else (lo_f, mid)
    return quotas(1.0) if fixed or quotas(1.0).sum() <= n_sample else quotas(lo_f)


@dataclass
class Sample:
    """The drawn sample: its rows, and per group the threshold ``t_g`` in [0, 1]: the sample is (up to ties of 53-bit
    hash units) the group's rows whose :func:`seeded_hash` unit lies below ``t_g`` (the unit of the group's
    ``q_g + 1``-th smallest hash; 1 where the whole group is in it), so that rows appended later join the sample
    by the same rule (:mod:`densitas.aqp.refresh`)."""

    rows: int
    thresholds: list[float]
    # per column, whether its stored values are its rows' own (sample_lossless; every column not rounded)
    lossless: list[bool] = dataclasses.field(default_factory=list)


def seeded_hash(con: Connector, key: exp.Expression) -> exp.Expression:
    """The sample's hash of a row id ``key``: ``row_hash(row_hash(key) XOR salt)``, the salt the statement's one
    parameter (:func:`sample_salt`)."""
    return con.row_hash(exp.BitwiseXor(this=con.row_hash(key), expression=con.salt_param()))


def sample_salt(seed: int) -> int:
    """The salt of the seed's sample hash: a parameter typed as the hashes (``UBIGINT`` in DuckDB, ``BIGINT`` in
    PostgreSQL), so that the seeds of :data:`SEED_MAX` or below give salts in ``[1, 2**63 - 1]``."""
    return int(seed) * 7919 + 1


def sample_target(opts: BuildOptions, budget: int, used: int, k: int, n_rows: int,
                  row_bytes: float | None = None) -> int:
    """The sample's rows: ``sample_size`` when given, else what the other tables (``used`` bytes) left of the
    budget at ``row_bytes`` a row (default the nominal ``2 + 8k``; :func:`sample_row_bytes`), at least 2,000 and
    at most ``max_sample_rows``; never more than the table's rows."""
    per_row = row_bytes or (2 + 8 * k)
    n_sample = opts.sample_size or int(min(opts.max_sample_rows, max(2000, (budget - used) / per_row)))
    return min(n_sample, n_rows)


def sample_row_bytes(infos: Sequence[ColumnInfo], rule: OutlierRule | None = None,
                     decimals: Sequence[int | None] | None = None) -> float:
    """What one sample row costs stored compactly, in bytes: per column the bits of its values on their value
    grid — ``log2`` of the grid points between its smallest and largest value (integers, decimals, dates:
    ``step`` > 0), or of its distinct values for a discrete column, or of the decimal places the sample rounds a
    column on no value grid to (``decimals``, by default :func:`sample_decimals`) — else a full 8-byte DOUBLE, one
    more bit where it holds NULLs. With the build's :class:`OutlierRule`, a column's range is clipped to its
    bounds: the rows beyond them are stored whole, not in the sample. The group id costs no bits a row: the
    sample is stored in group order, so its group column is one run a group (:data:`GROUP_RUN_BYTES`, counted
    with the groups).

    The table's budget is a fraction of its *compressed* storage, and the sample is stored compressed as well
    (DuckDB's ALP encodes a column of values on a decimal grid in about these bits, its RLE a sorted group
    column in a run per group, a validity mask with few NULLs as a sparse bitmap), so rows are counted at this
    cost, not their nominal width. Measured from the segment offsets of ``pragma_storage_info`` on a build's
    sample table: lineitem SF1 9.0 bytes a row stored against 9.25 counted here; flights' group column and four of
    its five value columns 38.8 bits a row against 42 counted (6.9 bytes a row counted in all, 8.1 before the
    ranges were clipped and the group id counted as runs; benchmarks/RESULTS.md, "AQP: the sample's bits").

    Examples
    --------
    >>> from densitas.aqp.columns import ColumnInfo
    >>> day = ColumnInfo("d", "DATE", "date", 1.0, lo=0.0, hi=2525.0, distinct=2526)   # 12 bits
    >>> price = ColumnInfo("p", "DOUBLE", "float", 0.0, lo=0.5, hi=9.5, distinct=10**6)  # 25 bits rounded
    >>> sample_row_bytes([day, price])
    4.625
    >>> sample_row_bytes([day, price], OutlierRule([(0.0, 100.0), None]))               # 7 bits for the days
    4.0
    """
    bounds = rule.bounds if rule is not None else [None] * len(infos)
    if decimals is None:
        decimals = sample_decimals(infos, rule)
    return math.ceil(sum(_value_bits(info, b, d) for info, b, d in zip(infos, bounds, decimals, strict=True))) / 8


def aside_row_bytes(infos: Sequence[ColumnInfo], n_groups: int) -> float:
    """What one row set aside whole (:func:`find_outliers`) costs: its values over the columns' whole ranges, as
    :func:`sample_row_bytes` counts them, and the bits of its group id (those rows are few and in no order).

    Examples
    --------
    >>> from densitas.aqp.columns import ColumnInfo
    >>> day = ColumnInfo("d", "DATE", "date", 1.0, lo=0.0, hi=2525.0, distinct=2526)   # 12 bits
    >>> aside_row_bytes([day], n_groups=4)                                               # + 2 bits of group id
    1.75
    """
    bits = math.log2(max(n_groups, 1)) if n_groups > 1 else 0.0
    return math.ceil(bits + sum(_value_bits(info, None) for info in infos)) / 8


def _value_bits(info: ColumnInfo, bounds: tuple[float, float] | None, decimals: int | None = None) -> int:
    """Bits of one stored value of the column (:func:`sample_row_bytes`), within ``bounds`` when given; rounded
    to ``decimals`` decimal places when given (:func:`sample_decimals`: one more bit, for ALP's per-vector
    frame)."""
    lo, hi = info.lo, info.hi
    if bounds is not None:
        lo, hi = max(lo, bounds[0]), min(hi, bounds[1])
    options = [64.0]
    if info.step > 0 and math.isfinite(hi - lo):
        options.append(math.log2(max(hi - lo, 0.0) / info.step + 1))
    if info.discrete and info.distinct > 0:
        options.append(math.log2(info.distinct + 1))
    if decimals is not None and math.isfinite(hi - lo):
        options.append(math.log2(max(hi - lo, 0.0) * 10.0 ** decimals + 1) + 1)
    return math.ceil(max(min(options), 1.0)) + (1 if info.nullable else 0)


def sample_decimals(infos: Sequence[ColumnInfo], rule: OutlierRule | None = None) -> list[int | None]:
    """Per column, the decimal places the sample stores its values at, or None for its exact values: a column
    on no value grid (a DOUBLE of full precision: ``step`` 0, not discrete) is rounded to the coarsest power of
    ten at most ``2^-SAMPLE_BITS`` of its range (within the outlier ``rule``'s bounds). DuckDB's ALP then stores
    about ``SAMPLE_BITS`` + 1 to 4 bits a value instead of 53 (its ALP-RD on full-precision doubles), so the
    same bytes hold about twice the sample rows of a table of such columns. A DECIMAL column (not discrete)
    is stored as integer codes at its own scale, losslessly: its values reach the sample as DOUBLEs, which ALP
    stores in as many bits as its choice of exponent for a vector's sample of values gives (a DECIMAL(10, 2) of
    1.03 to 499.87: 16 bits in most row orders, 27.2 in one), integers in the bits of their range.

    A value is stored as an integer code, rounded down (or to itself, on the step's grid) but kept in the row's
    fine bin (:func:`sample_value`):
    within a step, at most ``2^-SAMPLE_BITS`` of the range, of the row's own. A SUM of ``m`` such values moves by
    less than ``m`` steps, which the answer's interval adds (:meth:`~densitas.aqp.synopsis.Synopsis.estimate`);
    a row stored within a step of a predicate's bound may lie on either side of it: the interval adds such rows
    at their weight and value (``Synopsis._doubtful``). Where a group would be sampled whole (every group, where
    the sample is the table), no column is rounded (``build``): such a group's answers stay exact (codes and
    exact values cannot share a column). A column whose values lie so far from 0 against their range that a
    DOUBLE cannot hold them to the step (``|v| · 2^-52`` above a quarter step) keeps its exact values.

    Examples
    --------
    >>> from densitas.aqp.columns import ColumnInfo
    >>> price = ColumnInfo("p", "DOUBLE", "float", 0.0, lo=0.5, hi=9.5, distinct=10**6)
    >>> day = ColumnInfo("d", "DATE", "date", 1.0, lo=0.0, hi=2525.0, distinct=2526)
    >>> sample_decimals([price, day])       # 9 * 2^-20 = 8.6e-6: steps of 1e-6
    [6, None]
    >>> sample_row_bytes([day, price])      # 12 bits + log2(9e6 + 1) + 1 = 25 bits
    4.625
    >>> cost = ColumnInfo("c", "DECIMAL(10,2)", "decimal", 0.01, lo=1.0, hi=500.0, distinct=49_900)
    >>> sample_decimals([cost])             # its own scale: codes 100 to 50,000, the values themselves
    [2]
    >>> sample_decimals([dataclasses.replace(cost, hi=1e16)])    # codes past a DOUBLE's integers: exact values
    [None]
    """
    bounds = rule.bounds if rule is not None else [None] * len(infos)
    out: list[int | None] = []
    for info, b in zip(infos, bounds, strict=True):
        lo, hi = (info.lo, info.hi) if b is None else (max(info.lo, b[0]), min(info.hi, b[1]))
        span = hi - lo
        if info.kind == "decimal" and not info.discrete and 0 < info.step < 1 and math.isfinite(span):
            d = round(-math.log10(info.step))  # its own scale: every value on the grid, its code exact
        elif info.step > 0 or info.discrete or info.kind != "float" or not (math.isfinite(span) and span > 0):
            out.append(None)
            continue
        else:
            d = -math.floor(math.log10(span * 2.0 ** -SAMPLE_BITS))
        # the codes exact in a DOUBLE (a DECIMAL(18, 2) of 1e16 would not be)
        held = max(abs(lo), abs(hi)) * 2.0 ** -52 <= 0.25 * 10.0 ** -d  # a DOUBLE's spacing there
        out.append(d if held else None)
    return out


def integer_columns(infos: Sequence[ColumnInfo], decimals: Sequence[int | None] | None) -> list[bool]:
    """Per column, whether the sample stores integers only: an integer, date or timestamp column (its line is
    whole numbers: days, microseconds) or one stored as codes (``decimals[j]`` not None, :func:`sample_value`).
    The sample stores them as BIGINT (:func:`~densitas.aqp.store.sample_layout`), in the bits of their range.

    Examples
    --------
    >>> from densitas.aqp.columns import ColumnInfo
    >>> day = ColumnInfo("d", "DATE", "date", 1.0, lo=0.0, hi=2525.0, distinct=2526)
    >>> w = ColumnInfo("w", "DOUBLE", "float", 0.0, lo=0.5, hi=9.5, distinct=10**6)
    >>> integer_columns([day, w, w], [None, 6, None])
    [True, True, False]
    """
    decimals = list(decimals) if decimals else [None] * len(infos)
    return [info.kind in ("int", "date", "timestamp") or d is not None
            for info, d in zip(infos, decimals, strict=True)]


def sample_value(v: exp.Expression, decimals: int | None, edge: exp.Expression | None = None) -> exp.Expression:
    """A sample row's stored value of one column: ``v`` itself where ``decimals`` is None, else its integer code
    at ``decimals`` decimal places (:func:`sample_decimals`): ``FLOOR(v * 10^d)``, but not below the code of
    ``edge``, the lower edge of the row's fine bin, rounded up (``CEIL(LEAST(edge, v) * 10^d)``), so that the
    value it stands for (:func:`~densitas.aqp.store.decode_sample`) stays in the row's bin, within a step of ``v``.
    Stored as integers, the codes compress to the bits of their range whatever their order (DuckDB's ALP on
    the decimals themselves: 21.8 bits a value in one order, 32.4 in another, measured). ``10^-d`` divides
    instead for a negative ``d``.

    Examples
    --------
    >>> sample_value(exp.column("x"), 3).sql("duckdb")
    'CASE WHEN ABS(x * 1000 - ROUND(x * 1000)) <= 1e-6 THEN ROUND(x * 1000) ELSE FLOOR(x * 1000) END'
    """
    if decimals is None:
        return v

    def scaled(x: exp.Expression) -> exp.Expression:
        return _decimal_shift(x, decimals)

    def code(x: exp.Expression, rounding: type[exp.Func]) -> exp.Expression:
        # a value on the step's grid (up to the product's float noise) keeps its own code, so that it decodes to
        # itself; another is rounded down (a value), or up (an edge)
        on_grid = exp.Abs(this=exp.Sub(this=x.copy(), expression=exp.Round(this=x.copy()))) \
            <= exp.Literal.number("1e-6")
        return exp.case().when(on_grid, exp.Round(this=x.copy())).else_(rounding(this=x.copy()))

    down = code(scaled(v.copy()), exp.Floor)
    if edge is None:
        return down
    kept = exp.Greatest(this=down, expressions=[code(scaled(exp.Least(this=edge.copy(), expressions=[v.copy()])),
                                                     exp.Ceil)])
    return exp.case().when(exp.Is(this=v.copy(), expression=exp.Null()), exp.Null()).else_(kept)


def _decimal_shift(x: exp.Expression, d: int) -> exp.Expression:
    """``x · 10^d`` in SQL, an exact integer literal either way (``x * 10^d``, or ``x / 10^-d`` for ``d`` < 0): a
    value to its code at ``d`` decimal places, or (``-d``) a code back to its value."""
    p = _num(10 ** abs(d))
    return exp.Mul(this=x, expression=p) if d >= 0 else exp.Div(this=x, expression=p)


def sample_lossless(con: Connector, rows: exp.Expression, edges: exp.Table, decimals: Sequence[int | None],
                    params: list | None = None) -> list[bool]:
    """Per column, whether every one of ``rows`` (a table or query of binned rows: values ``v<j>``, bins ``b<j>``;
    its ``params``) decodes from its code (:func:`sample_value`) to its own value: the sample's rows of a column on
    the step's decimal grid (weights to a tenth of a kilogram, but for six averaged ones no sample row holds)
    lose nothing, so its answers need no allowance for the rounding (``decimals[j]`` None: exact, True)."""
    rounded = [j for j, d in enumerate(decimals) if d is not None]
    out = [True] * len(decimals)
    if not rounded:
        return out
    parts = []
    for j in rounded:
        d, v = decimals[j], _col(f"v{j}", "b")
        back = _decimal_shift(sample_value(v, d, _col("lo", f"e{j}")), -d)  # the value the code stands for
        parts.append(exp.Sum(this=exp.case().when(exp.and_(exp.Not(this=exp.Is(this=v.copy(), expression=exp.Null())),
                                                               exp.NEQ(this=back, expression=v.copy())), _num(1))
                             .else_(_num(0))))
    source = rows.subquery("b") if isinstance(rows, exp.Query) else exp.alias_(rows.copy(), "b", table=True,
                                                                                quoted=True)
    q = with_bin_edges(sqlglot.select(*parts).from_(source), "b", edges, decimals)
    for j, lost in zip(rounded, con.fetch_rows(q, params or [])[0], strict=True):
        out[j] = not lost
    return out


def with_bin_edges(q: exp.Select, row: str, edges: exp.Table, decimals: Sequence[int | None]) -> exp.Select:
    """``q`` (rows ``row`` of a binned table) joined, for each column rounded in the sample (``decimals`` not
    None), with its row's fine bin in the synopsis' ``edges`` table as ``e<j>``: :func:`sample_value` keeps the
    rounded value in the bin.

    Examples
    --------
    >>> q = sqlglot.select("*").from_("b")
    >>> with_bin_edges(q, "b", exp.table_("edges"), [None, 4]).sql("duckdb")
    'SELECT * FROM b LEFT JOIN edges AS "e1" ON "e1"."col" = 1 AND "e1"."bin" = "b"."b1"'
    """
    for j, d in enumerate(decimals):
        if d is None:
            continue
        e = f"e{j}"
        on = exp.and_(_col("col", e).eq(_num(j)), _col("bin", e).eq(_col(f"b{j}", row)))
        q = q.join(exp.alias_(edges.copy(), e, table=True, quoted=True), on=on, join_type="left")
    return q


def _bits(values: float) -> int:
    """Bits that tell ``values`` values apart (0 for one value: a constant column costs nothing compressed)."""
    return math.ceil(math.log2(values)) if values > 1 else 0


def sum_bits(info: ColumnInfo, n_rows: int) -> int:
    """Bits of a sum of at most ``n_rows`` of the column's values, sign included: on the column's value grid
    (``step`` > 0: integers, decimals, dates) the sum is a multiple of the step; else a full DOUBLE.

    Examples
    --------
    >>> from densitas.aqp.columns import ColumnInfo
    >>> sum_bits(ColumnInfo("n", "INTEGER", "int", 1.0, lo=-5.0, hi=1000.0), n_rows=1000)   # |sum| < 2**20
    21
    >>> sum_bits(ColumnInfo("x", "DOUBLE", "float", 0.0, lo=0.0, hi=1.0), n_rows=1000)
    64
    """
    if info.step > 0 and math.isfinite(info.hi - info.lo):
        return min(64, _bits(n_rows * max(abs(info.lo), abs(info.hi)) / info.step + 1) + 1)
    return 64


@dataclass(frozen=True)
class RowCosts:
    """Bytes one stored row of the histograms, sum grids, pair grids, bin edges and sample counts for against the
    budget (the small ``groups`` table counts at its layout's width, a group also its run in the sample's group
    column: :data:`GROUP_RUN_BYTES`; the ``edges`` rows at their layout's width unless :meth:`compact`).

    The budget is a fraction of the table's *compressed* storage, and DuckDB stores a synopsis' tables
    compressed as well (integers frame-of-reference bit-packed, doubles on a decimal grid by ALP): so that the
    budget buys what it says, rows count at their compact cost (:meth:`compact`: ``compact_grids``, and
    :func:`sample_row_bytes`: ``compact_sample``), not their nominal width (:meth:`nominal`).

    Examples
    --------
    >>> from densitas.aqp.columns import ColumnInfo
    >>> day = ColumnInfo("d", "DATE", "date", 1.0, lo=15706.0, hi=16070.0, distinct=365)
    >>> delay = ColumnInfo("x", "INTEGER", "int", 1.0, lo=-43.0, hi=1301.0, distinct=527, nullable=True)
    >>> RowCosts.compact([day, delay], n_groups=35, n_rows=336_776, opts=BuildOptions()).marg
    8.75
    >>> RowCosts.nominal([day, delay]).marg          # col, gid, bin SMALLINT; n INTEGER; s DOUBLE
    18
    """

    marg: float
    sums: float
    pairs: float
    sample: float
    aside: float | None = None  # a row set aside whole (aside_row_bytes); None: a sample row's cost
    group_run: float = GROUP_RUN_BYTES  # a group's run in the sample's group column; 0 where a row counts its gid
    edges: float = EDGE_BYTES  # a bin's row of the edges table (its lower edge and occupied range)

    @property
    def outliers(self) -> float:
        """What a row set aside whole costs (:func:`aside_row_bytes`; a sample row's where not given)."""
        return self.sample if self.aside is None else self.aside

    @classmethod
    def nominal(cls, infos: Sequence[ColumnInfo]) -> RowCosts:
        """Each row at its columns' SQL type widths (see :mod:`densitas.aqp.store`)."""
        numeric = [j for j, info in enumerate(infos) if info.numeric]
        nullable = [j for j in numeric if infos[j].nullable]
        return cls(marg=MARG_CELL_BYTES, sums=sums_layout(numeric, nullable).row_bytes, pairs=PAIR_CELL_BYTES,
                   sample=sample_layout(len(infos)).row_bytes, group_run=0.0)

    @classmethod
    def compact(cls, infos: Sequence[ColumnInfo], n_groups: int, n_rows: int, opts: BuildOptions) -> RowCosts:
        """Each grid row at the bits its fields need: an index at the bits of its range (a histogram row is
        1 + 6 + 10 + 19 + 34 bits above: two columns, 35 groups, 528 bins, counts to 336,776, a sum of 336,776
        dates; a sum-grid cell as a bin: its grid is at most as fine as the column's bins), a count at the bits
        of ``n_rows``, a sum at :func:`sum_bits` (the widest column's for the histograms, whose ``s`` holds each
        column's sums in turn); the sample's rows at :func:`sample_row_bytes`. An accounting model, not a
        measurement: it takes every sum to lie on its column's value grid, as ALP stores a DOUBLE that does."""
        k = len(infos)
        index = _bits(k) + _bits(n_groups)
        count = _bits(n_rows + 1)
        bins = _bits(max(min(info.distinct, opts.max_bins) for info in infos) + 1)
        marg = index + bins + count + max(sum_bits(info, n_rows) for info in infos)
        sums = (index + bins + count
                + sum(sum_bits(info, n_rows) + (count if info.nullable else 0) for info in infos if info.numeric))
        pairs = _bits(k * (k - 1) // 2) + _bits(n_groups) + 2 * _bits(opts.max_pair_res + 1) + count
        # an edge row: its column, its bin and three values (lower edge, least and greatest value held) on the
        # value grid of the widest column
        edges = _bits(k) + bins + 3 * max(_value_bits(info, None) - (1 if info.nullable else 0) for info in infos)
        return cls(marg=marg / 8, sums=sums / 8, pairs=pairs / 8, sample=sample_row_bytes(infos),
                   aside=aside_row_bytes(infos, n_groups), edges=edges / 8)

    def of(self, con: Connector, tables: SynopsisTables, *kinds: str) -> int:
        """Bytes of the synopsis' tables of ``kinds`` at these costs (``groups`` at its layout's width, a group
        with its run in the sample: :data:`GROUP_RUN_BYTES`; a row set aside whole at
        :attr:`outliers`).

        Examples
        --------
        >>> import duckdb
        >>> from densitas.aqp import Engine
        >>> from densitas.aqp.store import read
        >>> eng = Engine(duckdb.connect())
        >>> eng.con.execute("CREATE TABLE t AS SELECT (i % 50)::DOUBLE AS x FROM range(1000) r(i)")
        >>> meta = eng.build("t", sample_size=300)
        >>> st = read(eng.con, "t")
        >>> tables = SynopsisTables.of(meta["id"], st.infos, [])
        >>> RowCosts(marg=2.0, sums=0.0, pairs=0.0, sample=1.0).of(eng.con, tables, "marg", "sample")  # 50·2 + 300
        400
        """
        return round(sum(count_rows(con, tables.table(k)) * self._row_bytes(tables, k) for k in kinds))

    def _row_bytes(self, tables: SynopsisTables, kind: str) -> float:
        """One row of the synopsis table ``kind``: a group's row also pays its run in the sample's group column."""
        if kind == "groups":
            return tables.groups.row_bytes + self.group_run
        return getattr(self, kind)


def row_costs(infos: Sequence[ColumnInfo], n_groups: int, n_rows: int, opts: BuildOptions,
              rule: OutlierRule | None = None, decimals: Sequence[int | None] | None = None) -> RowCosts:
    """What the build counts each stored row for: compact grid rows where ``compact_grids``, compact sample
    rows where ``compact_sample`` (within the outlier ``rule``'s bounds when given, at the sample's stored
    ``decimals``: :func:`sample_row_bytes`), else their nominal widths.

    Examples
    --------
    >>> from densitas.aqp.columns import ColumnInfo
    >>> day = ColumnInfo("d", "DATE", "date", 1.0, lo=15706.0, hi=16070.0, distinct=365)
    >>> row_costs([day], 35, 336_776, BuildOptions()).marg                       # 0 + 6 + 9 + 19 + 34 bits
    8.5
    >>> costs = row_costs([day], 35, 336_776, BuildOptions(compact_grids=False))
    >>> costs.marg, costs.sample        # nominal histogram rows; the sample's still compact: 9 bits a day
    (18, 1.125)
    """
    nominal = RowCosts.nominal(infos)
    costs = RowCosts.compact(infos, n_groups, n_rows, opts) if opts.compact_grids else nominal
    if not opts.compact_sample:  # a sample row at its nominal width holds its group id
        return dataclasses.replace(costs, sample=nominal.sample, aside=None, group_run=0.0)
    return dataclasses.replace(costs, sample=sample_row_bytes(infos, rule, decimals),
                               aside=aside_row_bytes(infos, n_groups))


def synopsis_bytes(con: Connector, tables: SynopsisTables, sample_rows: int, costs: RowCosts) -> int:
    """A synopsis' size against its budget: its tables' rows at ``costs``, the sample's ``sample_rows`` rows
    at ``costs.sample`` each."""
    return costs.of(con, tables, "marg", "sums", "pairs", "outliers", "edges", "groups") \
        + round(sample_rows * costs.sample)


def _sample_plan(con: Connector, tables: SynopsisTables, plan: Plan, n_rows: int, opts: BuildOptions, k: int
                ) -> tuple[np.ndarray, np.ndarray]:
    """Each group's sample quota (:func:`sample_quotas`, of the rows :func:`sample_target` leaves the sample once
    the grids are written) and its rows."""
    used = plan.costs.of(con, tables, "marg", "sums", "pairs", "outliers", "edges", "groups")
    n_sample = sample_target(opts, plan.budget, used, k, n_rows, plan.costs.sample)
    groups = tables.groups.table(tables.id)
    gsizes = np.array(con.fetch_rows(sqlglot.select(_col("n")).from_(groups).order_by(_col("gid"))),
                      dtype=np.int64).ravel()
    return sample_quotas(gsizes, n_sample, bool(opts.sample_size)), gsizes


def draw_sample(con: Connector, tables: SynopsisTables, binned: Binned, plan: Plan, n_rows: int,
                opts: BuildOptions, decimals: Sequence[int | None] | None = None,
                planned: tuple[np.ndarray, np.ndarray] | None = None) -> Sample:
    """The stratified sample (:func:`sample_quotas` rows per group): each group's first rows in a seeded hash
    order of the table's row ids; returns its size and thresholds (:class:`Sample`). The sample gets what the
    other tables left of the budget, at most ``max_sample_rows`` (``sample_size`` when given). Values are stored
    rounded to ``decimals`` (:func:`sample_decimals`, None: exact). ``planned``: the quotas and group sizes of
    :func:`_sample_plan` at these costs, when the caller has them.

    A hash pre-filter keeps the sort small: it passes about ``2·q_g + 50`` rows of a group, and the ``q_g``
    smallest hashes always pass it; where it passes too few (vanishingly rare) the draw runs without it.
    """
    k = binned.n_columns
    quota, gsizes = planned if planned is not None else _sample_plan(con, tables, plan, n_rows, opts, k)
    frac = np.minimum(1.0, (2 * quota + 50) / np.maximum(gsizes, 1))
    con.create_temp_table(QUOTA, pd.DataFrame({"gid": np.arange(len(quota), dtype=np.int64),
                                               "q": np.asarray(quota, dtype=np.int64),
                                               "frac": np.asarray(frac, dtype=np.float64)}))
    decimals = list(decimals) if decimals is not None else [None] * binned.n_columns
    key = exp.func("coalesce", _col("_densitas_rid", "b"), con.row_id(BINNED, qualifier="b"))
    h = seeded_hash(con, key)  # the seed's salt is the statement's one parameter
    hashed = sqlglot.select(exp.Column(this=exp.Star(), table=exp.to_identifier("b", quoted=True)),
                            exp.alias_(h, "h", quoted=True)).from_(
        exp.alias_(binned.table, "b", table=True, quoted=True))
    rn = exp.Window(this=exp.RowNumber(), partition_by=[_col("gid")],
                    order=exp.Order(expressions=[exp.Ordered(this=_col("h"))]))
    lay = tables.sample
    target = lay.table(tables.id)
    con.execute(lay.create(tables.id))
    salt = sample_salt(opts.seed)
    for cond in (con.hash_unit(_col("h")) < _col("frac"), exp.true()):
        ranked = sqlglot.select(exp.Star(), exp.alias_(rn.copy(), "rn", quoted=True)) \
            .from_(hashed.subquery("x")).join(exp.table_(QUOTA, quoted=True), using=["gid"]).where(cond)
        rows = with_bin_edges(
            sqlglot.select(exp.alias_(exp.cast(_col("gid", "t"), lay.columns[0].sql_type), "gid", quoted=True),
                           *(exp.alias_(sample_value(_col(f"v{j}", "t"), decimals[j], _col("lo", f"e{j}")), f"v{j}",
                                        quoted=True) for j in range(k))).from_(ranked.subquery("t")),
            "t", tables.table("edges"), decimals) \
            .where(_col("rn", "t") <= _col("q", "t")).order_by(_col("gid", "t"), _col("rn", "t"))
        con.execute(exp.delete(target))
        con.execute(exp.insert(rows, target), [salt])
        if con.fetch_rows(sqlglot.select(_count()).from_(target))[0][0] >= quota.sum():
            break  # otherwise (vanishingly rare) the filter passed too few rows: draw without it
    # each group's threshold: the hash unit of its (q_g + 1)-th row; where the filter passed no such row, all
    # rows below the filter's bound are in the sample, so that bound is the threshold
    nxt = sqlglot.select(_col("gid"), exp.alias_(con.hash_unit(_col("h")), "t", quoted=True)).from_(
        ranked.subquery("t")).where(_col("rn").eq(exp.Add(this=_col("q"), expression=_num(1))))
    thresholds = np.where(quota >= gsizes, 1.0, frac)
    for g, t in con.fetch_rows(nxt, [salt]):
        thresholds[int(g)] = float(t)
    drawn = sqlglot.select(exp.Star()).from_(ranked.subquery("t")).where(_col("rn") <= _col("q"))
    lossless = sample_lossless(con, drawn, tables.table("edges"), decimals, [salt])  # the drawn rows' values
    _drop(con, binned.table)
    _drop(con, exp.table_(QUOTA, quoted=True))
    return Sample(int(quota.sum()), thresholds.tolist(), lossless)


def swap_catalog(con: Connector, meta: dict, old_ids: list[str]) -> None:
    """Replace the catalog row of the table by ``meta`` and drop the previous synopsis' tables (inside the
    build's transaction: the swap is atomic)."""
    _before_swap(meta)
    write_catalog(con, meta)
    for old_id in old_ids:
        drop_synopsis(con, old_id)


def build(con: Connector, table: str, columns: Sequence[str] | None = None, group_by: Sequence[str] | None = None,
          options: BuildOptions | None = None, progress: Callable[[str, float], None] | None = None) -> dict:
    """Build (or atomically replace) the synopsis of ``table``; returns its metadata row as a dict.

    Parameters
    ----------
    con : Connector
        The database holding ``table``; the synopsis is written to its ``densitas`` schema.
    table : str
        The table (``schema.table`` or ``table``).
    columns : sequence of str, optional
        Numeric, date or timestamp columns; default every such column not in ``group_by``.
    group_by : sequence of str, optional
        Categorical columns whose combinations are the groups (at most ``options.max_groups``).
    options : BuildOptions, optional
        Budget, bins, sample and seed.
    progress : callable, optional
        Called with each step's name and the fraction of the build done.

    Returns
    -------
    dict
        The catalog row (see :mod:`densitas.aqp.store`).

    Raises
    ------
    InputError
        Bad options, columns or group_by, a table too small, a column entirely NULL or non-finite.

    Examples
    --------
    >>> import duckdb
    >>> from densitas.aqp.connector import DuckDBConnector
    >>> con = DuckDBConnector(duckdb.connect())
    >>> con.execute("CREATE TABLE t AS SELECT i::DOUBLE AS x, (i % 7)::INTEGER AS k FROM range(5000) r(i)")
    >>> meta = build(con, "t", options=BuildOptions(sample_size=500))
    >>> meta["rows"], json.loads(meta["options"])["sample_size"]
    (5000, 500)
    """
    check_table_name(table)
    opts = options or BuildOptions()
    opts.check()
    say = progress or (lambda step, frac: None)
    t0 = time.perf_counter()
    cols = resolve_columns(con, table, columns, group_by)
    infos = cols.infos
    ensure_schema(con)

    say("statistics", 0.0)
    stats = read_statistics(con, table, cols)
    append = append_marker(con, table, opts.append_key)
    say("groups", 0.1)
    n_groups = count_groups(con, table, cols.group_by, opts.max_groups)
    count_cells(con, table, cols, opts.max_bins)
    plan = plan_bins(infos, n_groups, opts, stats.table_bytes,
                     stats.rows)
    say("bins", 0.15)
    find_bin_edges(con, table, infos, plan, stats.rows, opts.seed)
    plan.costs = row_costs(infos, plan.n_groups, stats.rows, opts)  # the sample's cost knows the discrete columns
    plan.sample_bytes = sample_bytes(opts, plan.budget, plan.costs, stats.rows, plan.n_groups)

    tables = SynopsisTables.of(uuid.uuid4().hex[:12], infos, cols.group_types)
    old_ids = catalog_ids(con, table)
    with con.transaction():
        write_groups(con, tables, table, cols)
        say("binning rows", 0.2)
        binned = bin_rows(con, tables, table, cols)
        rule = find_outliers(con, binned, infos, planned_sample(opts, plan, stats.rows)) if opts.outliers \
            else OutlierRule.none(len(infos))
        set_aside(con, tables, binned, rule)
        # the sample holds no row beyond the rule's bounds: its rows cost the bits of the narrower ranges, its
        # values on no value grid those of the decimals they are rounded to
        decimals = sample_decimals(infos, rule) if opts.compact_sample else [None] * len(infos)
        plan.costs = row_costs(infos, plan.n_groups, stats.rows, opts, rule, decimals)
        plan.sample_bytes = sample_bytes(opts, plan.budget, plan.costs, stats.rows, plan.n_groups,
                                         count_rows(con, tables.table("outliers")))
        write_histograms(con, tables, binned, infos, cols.group_by)
        sum_res = write_sum_grids(con, tables, binned, infos, plan, opts)
        say("dependence", 0.4)
        probe_grids: dict = {}
        scores = probe_dependence(con, binned, plan, probe_grids if opts.independent_pairs else None)
        grids = write_pair_grids(con, tables, binned, infos, plan, scores, opts, say, probe_grids)
        say("sample", 0.9)
        planned = None
        if any(d is not None for d in decimals):
            planned = _sample_plan(con, tables, plan, stats.rows, opts, len(infos))
            # a group sampled whole (every group, where the sample is the table) keeps its exact values and exact
            # answers: none rounded (codes and exact values cannot share a column); the costs change, and so the
            # quotas
            if (planned[0] >= planned[1]).any():
                decimals = [None] * len(infos)
                plan.costs = row_costs(infos, plan.n_groups, stats.rows, opts, rule, decimals)
                planned = None
        # integers (and codes) as BIGINT: DuckDB bit-packs them to their range's bits, as RowCosts counts them
        tables = dataclasses.replace(tables, sample=sample_layout(len(infos), integers=integer_columns(infos,
                                                                                                     decimals)))
        sample = draw_sample(con, tables, binned, plan, stats.rows, opts, decimals, planned)
        say("bandwidths", 0.95)
        bandwidths = _bandwidths(con, tables, infos, opts.bandwidth, decimals)
        meta = {"table_name": table, "id": tables.id, "version": FORMAT_VERSION,
                "build_seconds": time.perf_counter() - t0, "rows": stats.rows, "fingerprint": stats.fingerprint,
                "columns": json.dumps([i.to_dict() for i in infos]), "group_by": json.dumps(cols.group_by),
                "grids": json.dumps({"pairs": [g.to_dict() for g in grids], "sum_res": sum_res,
                                     "scores": [[a, b, v] for (a, b), v in scores.items()]}),
                "options": json.dumps({"budget_bytes": plan.budget, "sample_size": sample.rows, "seed": opts.seed,
                                       "sample_decimals": decimals, "sample_lossless": sample.lossless,
                                       "max_bins": opts.max_bins, "append": append,
                                       "thresholds": sample.thresholds, "outliers": rule.to_json(),
                                       "build": dataclasses.asdict(opts)}),
                "bandwidths": json.dumps(bandwidths),
                "size_bytes": synopsis_bytes(con, tables, sample.rows, plan.costs),
                "table_bytes": stats.table_bytes}
        swap_catalog(con, meta, old_ids)
    say("done", 1.0)
    meta["build_seconds"] = time.perf_counter() - t0
    set_build_seconds(con, table, meta["build_seconds"])
    meta["groups"] = plan.n_groups  # not stored: the groups table holds them
    meta["outlier_rows"] = count_rows(con, tables.table("outliers"))  # likewise: the rows stored whole
    return meta


# ---- helpers of the steps -------------------------------------------------------------------------------------


def _levels(bins: int, top: int) -> list[int]:
    """Candidate resolutions of one dimension of a pair grid: powers of two below ``bins``, then ``bins`` itself
    (the fine bins) when it is at most ``top``."""
    out = [r for r in (4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096) if r < bins and r <= top]
    if bins <= top:
        out.append(bins)
    return out or [min(bins, top)]


def dependence(counts: np.ndarray) -> float:
    """Dependence score of a pair from its probe histograms ``(G, r0, r1)`` (non-NULL cells): the total-variation
    distance between the joint and the product of the marginals, less the distance sampling noise alone gives
    under independence, averaged over groups by their rows."""
    total = counts.sum()
    if total <= 0:
        return 0.0
    score = 0.0
    for c in counts:
        n = c.sum()
        if n <= 0:
            continue
        e = np.outer(c.sum(axis=1), c.sum(axis=0)) / n
        tv = 0.5 * np.abs(c - e).sum() / n
        noise = 0.5 * np.sqrt(2 / np.pi * e * np.clip(1 - e / n, 0, None)).sum() / n
        score += n / total * max(0.0, tv - noise)
    return float(score)




def candidate_pairs(scores: dict, opts: BuildOptions) -> list[tuple[int, int]]:
    """The pairs that may get a grid: score at least ``min_dependence``, most dependent first."""
    return sorted((p for p, v in scores.items() if v >= opts.min_dependence), key=lambda p: -scores[p])


def finest_pair_grids(con: Connector, binned: Binned, bins: list[int], cand: list[tuple[int, int]],
                      opts: BuildOptions, say: Callable[[str, float], None] = lambda step, frac: None) -> dict:
    """Each candidate pair's grid at its finest resolution (``min(bins, max_pair_res)`` per dimension), one
    GROUP BY in the database each: ``{pair: ((ra, rb), (gid, x, y, n))}``, sparse, counts exact (they add over
    partitions of the rows)."""
    finest = {}
    for i, (a, b) in enumerate(cand):
        say(f"pair grid {i + 1}/{len(cand)}", 0.45 + 0.4 * i / max(len(cand), 1))
        ra, rb = (min(bins[j], opts.max_pair_res) for j in (a, b))
        x, y = binned.coarse(a, ra, bins[a]), binned.coarse(b, rb, bins[b])
        rows = con.fetch_numpy(sqlglot.select(_col("gid"), exp.alias_(x, "x", quoted=True),
                                              exp.alias_(y, "y", quoted=True), exp.alias_(_count(), "n", quoted=True))
                               .from_(binned.table).group_by(_col("gid"), x.copy(), y.copy()))
        finest[(a, b)] = ((ra, rb), tuple(np.asarray(rows[c], dtype=np.int64) for c in ("gid", "x", "y", "n")))
    return finest


def _choose_pairs(con: Connector, binned: Binned, infos: list[ColumnInfo], bins: list[int], scores: dict,
                  opts: BuildOptions, budget: float, say: Callable[[str, float], None],
                  probe_grids: dict | None = None, cell_bytes: float = PAIR_CELL_BYTES) -> list:
    """The pair grids to store: ``[(pair, (res0, res1), (gid, c0, c1, n))]``. Dependent pairs (score at least
    ``min_dependence``) in decreasing score each get a grid, starting at 16 x 16 and doubling the resolution in
    rounds, most dependent first, while the sparse cell count (exact, from the finest grid GROUP BY computed in
    the database) fits the budget."""
    cand = candidate_pairs(scores, opts)
    finest = finest_pair_grids(con, binned, bins, cand, opts, say)
    coarse = {p: g for p, g in (probe_grids or {}).items() if p not in finest}
    return choose_pair_resolutions(finest, bins, cand, opts, budget, coarse, cell_bytes)


def choose_pair_resolutions(finest: dict, bins: list[int], cand: list[tuple[int, int]], opts: BuildOptions,
                            budget: float, coarse: dict | None = None, cell_bytes: float = PAIR_CELL_BYTES
                            ) -> list:
    """From the candidates' finest grids (:func:`finest_pair_grids`), the grids to store (see
    :func:`_choose_pairs`).

    ``coarse``: grids of the other pairs (independent ones) at one resolution (the probe's, 16 x 16), stored as
    they are, after the candidates' starting grids and before their doubling rounds, in column order, while
    they fit. The model of an independent pair needs no grid, but the regression estimator does: a query with
    predicates on both columns has ``y = 1_A·1_B``, which no sum of one-column terms fits (for two halves a third
    of ``y``'s variance is the interaction; three columns: four sevenths beyond the main effects, of which the
    pair terms take three), and the exact cell counts make the product of the box's cell shares an auxiliary
    with a known total (:mod:`densitas.aqp.estimator`).
    """
    coarse = {p: g for p, g in (coarse or {}).items() if p not in cand and p not in finest}
    levels = {p: (_levels(bins[p[0]], opts.max_pair_res), _levels(bins[p[1]], opts.max_pair_res)) for p in cand}

    def at(p, li):
        """Cells of pair ``p`` at level index ``li`` (per dimension, capped at the dimension's finest)."""
        (la, lb), ((ra, rb), (g, x, y, n)) = levels[p], finest[p]
        res = (la[min(li, len(la) - 1)], lb[min(li, len(lb) - 1)])
        cx = _coarsen(x, ra, res[0], bins[p[0]])
        cy = _coarsen(y, rb, res[1], bins[p[1]])
        key = (g * (res[0] + 1) + cx) * (res[1] + 1) + cy
        uk, inv = np.unique(key, return_inverse=True)
        cnt = np.bincount(inv, n).astype(np.int64)
        gg, rem = np.divmod(uk, (res[0] + 1) * (res[1] + 1))
        return res, (gg, rem // (res[1] + 1), rem % (res[1] + 1), cnt)

    start = {p: max(0, next((i for i, r in enumerate(levels[p][0]) if r >= PROBE_RES), len(levels[p][0]) - 1))
             for p in cand}
    state: dict = {}
    used = 0.0
    for p in cand:  # most dependent first, at the starting resolution
        res, cells = at(p, start[p])
        size = len(cells[0]) * cell_bytes
        if used + size <= budget:
            state[p] = (start[p], res, cells)
            used += size
    extra_grids = []
    for p in sorted(coarse):  # the independent pairs' coarse grids (docstring)
        res, cells = coarse[p]
        size = len(cells[0]) * cell_bytes
        if used + size <= budget:
            extra_grids.append((p, tuple(res), cells))
            used += size
    grown = True
    while grown:  # doubling rounds
        grown = False
        for p in cand:
            if p not in state:
                continue
            li, res, cells = state[p]
            top = max(len(levels[p][0]), len(levels[p][1])) - 1
            if li >= top:
                continue
            nres, ncells = at(p, li + 1)
            extra = (len(ncells[0]) - len(cells[0])) * cell_bytes
            if used + extra <= budget:
                state[p] = (li + 1, nres, ncells)
                used += extra
                grown = True
    return [(p, state[p][1], state[p][2]) for p in cand if p in state] + extra_grids


def _coarsen(c: np.ndarray, res_from: int, res_to: int, bins: int) -> np.ndarray:
    """Cells at resolution ``res_from`` -> the nesting cells at ``res_to`` (0, NULL, stays 0)."""
    if res_to >= res_from:
        return c
    if res_from >= bins:  # from fine bins
        return cell_map(res_to, bins)[c]
    return np.where(c == 0, 0, 1 + (c - 1) // (res_from // res_to))


def _before_swap(meta: dict) -> None:
    """Hook just before the new synopsis replaces the old one (tests make it fail to check atomicity)."""


def _bandwidths(con: Connector, tables: SynopsisTables, infos: list[ColumnInfo], method: str,
                decimals: Sequence[int | None] | None = None) -> list[float]:
    """Per-column KDE bandwidths on the sample (:func:`densitas.kde.bandwidth`; 0 for discrete columns), its
    values stored at ``decimals`` (:func:`sample_value`)."""
    from densitas.kde import bandwidth

    out = []
    sample = tables.sample.table(tables.id)
    for j, info in enumerate(infos):
        v_j = _col(f"v{j}")
        q = sqlglot.select(exp.alias_(v_j, "v", quoted=True)).from_(sample).where(v_j.copy().is_(exp.null()).not_())
        v = np.asarray(con.fetch_numpy(q)["v"], dtype=np.float64)
        v = decode_sample(v[:, None], [decimals[j]])[:, 0] if decimals else v  # integer codes back to values
        if info.discrete or len(v) < 2 or np.ptp(v) == 0:
            out.append(0.0)
            continue
        # selected on at most 4,000 rows, then rescaled to the sample size by the AMISE rate n^(-1/5)
        m = min(len(v), 4000)
        sub = v[np.linspace(0, len(v) - 1, m).astype(np.int64)]
        try:
            h = float(bandwidth(sub, method))
        except (InputError, ValueError):
            h = float(bandwidth(sub, "silverman"))
        out.append(h * (m / len(v)) ** 0.2)
    return out


