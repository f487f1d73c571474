"""Building the synopsis of a table partitioned into Parquet files: one partition per Dask task, then a merge.

Every part of a synopsis but the sample is a sum over rows (:mod:`densitas.aqp.refresh` merges a delta's synopsis
by the same rule), so once the bins, groups and grids are fixed, the synopsis of the whole table is the sum of its
partitions' synopses. :func:`build_parquet` runs in three steps:

1. **One global step** (on the client, one in-memory DuckDB reading the files): the choices a build makes from the
   whole table. The statistics (rows, each column's NULLs, range and distinct count) and the groups are one
   aggregate scan each; the quantile bin edges come from the seeded hash sample a normal build takes (about
   :data:`~densitas.aqp.build.QUANTILE_SAMPLE_ROWS` rows; all rows below that); the dependence scores, which decide
   the candidate pair grids, from the binned rows of a seeded hash sample of about :data:`PROBE_SAMPLE_ROWS` rows
   (all rows below that: then they are those of a normal build); the sum grids' resolutions and the byte budget
   as a normal build has them (the budget's default is ``budget_fraction`` of the files' bytes); the bounds beyond
   which rows are stored whole (:func:`~densitas.aqp.build.find_outliers`: a few aggregate scans of the files).
2. **One Dask task per file**: its own in-memory DuckDB over that one file (``read_parquet``) bins the rows with
   the fixed choices and returns the partial tables: fine histograms (counts, sums), each bin's occupied range,
   the sum grids, the candidate pairs' finest grids, the fingerprint's part ``(rows, XOR of row hashes)``, the
   partition's *bottom candidates* for the sample (below), and its rows beyond the bounds, stored whole (the
   partial tables are of the other rows, as a normal build's tables are).
3. **The client merges** them (histograms, sum grids and pair grids add; occupied ranges widen; fingerprints add
   rows and XOR hashes), chooses the pair grid resolutions within the budget from the merged finest grids exactly
   as a build does, draws the sample and writes the synopsis to the target database in one transaction (DuckDB or
   PostgreSQL, atomic as a normal build).

**Row ids.** A row's *global row id* is ``offset(f) + r``: ``r`` its row number in its file (``read_parquet``'s
``file_row_number``, from 0) and ``offset(f)`` the rows of the files listed before file ``f`` (from the files'
Parquet metadata). It is the row id DuckDB gives the row in a table made by inserting the files in the given order,
so such a table's normal build draws the same sample (and takes its quantile edges from the same rows).

**The sample.** The build keeps, in each group ``g``, the ``q_g`` rows with the smallest seeded hash of their row
id (:func:`~densitas.aqp.build.seeded_hash`) and records ``t_g``, the hash unit of the ``q_g + 1``-th. ``q_g``
depends on what the other tables leave of the budget, known only after the merge, but never exceeds the quota of
the largest sample the options allow (``sample_size``, else ``max_sample_rows``): each partition returns its
``q_g^max + 1`` rows of smallest hash per group, and the bottom ``q_g + 1`` of the whole group are among the
union of these. The merged sample is exactly the bottom ``q_g`` of the whole table, with its threshold ``t_g``:
the sample and the thresholds a normal build of the table draws (and a later :mod:`~densitas.aqp.refresh` rule
would extend).

Examples
--------
>>> import duckdb, tempfile, os
>>> from densitas.aqp import Engine
>>> d = tempfile.mkdtemp()
>>> con = duckdb.connect()
>>> for i in range(3):
...     con.execute(f"COPY (SELECT (r % 97)::DOUBLE AS x, r * 0.5 AS y FROM range({i * 4000}, {(i + 1) * 4000}) t(r)) "
...                 f"TO '{d}/part{i}.parquet'")  # doctest: +ELLIPSIS
<...>
>>> eng = Engine(duckdb.connect())
>>> meta = eng.build_parquet("events", os.path.join(d, "part*.parquet"), sample_size=500)
>>> meta["rows"], meta["partitions"]
(12000, 3)
>>> float(eng.query("SELECT COUNT(*) AS n FROM events WHERE x < 10")["n"].iloc[0])  # exact: 1240
1240.0
"""

from __future__ import annotations

import dataclasses
import glob
import json
import math
import os
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import sqlglot
from sqlglot import exp

from densitas.aqp import build as b
from densitas.aqp.columns import ColumnInfo
from densitas.aqp.connector import Connector, DuckDBConnector
from densitas.aqp.store import FORMAT_VERSION, SynopsisTables, catalog_ids, ensure_schema, stored_bytes
from densitas.exceptions import InputError, StaleSynopsisError

__all__ = ["PROBE_SAMPLE_ROWS", "ParquetSource", "build_parquet", "check_fingerprint", "file_rows", "parquet_files"]

SOURCE = "_densitas_source"  # the view over the files, in an in-memory DuckDB
VALUES = "_densitas_values"  # the view of its rows' values on their numeric lines (the outliers' moments)
ROW_ID = "_densitas_rid"  # its global row id column
FILE_ROW = "file_row_number"
# the dependence probe bins a seeded hash sample of about this many rows (tables with fewer: every row)
PROBE_SAMPLE_ROWS = 500_000


def parquet_files(files: str | os.PathLike | Sequence[str | os.PathLike]) -> list[str]:
    """The files of ``files``: a glob (``*``, ``?``, ``[``; matches sorted by name), a path, or a list of paths
    (kept in their order), as absolute paths.

    Raises
    ------
    InputError
        No file matches, or a listed file does not exist.

    Examples
    --------
    >>> try:
    ...     parquet_files([])
    ... except InputError as err:
    ...     print(err)
    The 'files' parameter of build_parquet must name at least one Parquet file. Got [] instead.
    """
    if isinstance(files, (str, os.PathLike)):
        text = os.fspath(files)
        if any(c in text for c in "*?["):
            found = sorted(glob.glob(text))
            if not found:
                raise InputError(f"The 'files' parameter of build_parquet matches no file. Got {text!r} instead.")
            files = found
        else:
            files = [text]
    paths = [os.path.abspath(os.fspath(f)) for f in files]
    if not paths:
        raise InputError(f"The 'files' parameter of build_parquet must name at least one Parquet file. Got {files!r} "
                         "instead.")
    for p in paths:
        if not os.path.isfile(p):
            raise InputError(f"Parquet file {p!r} does not exist.")
    if len(set(paths)) != len(paths):
        raise InputError("The 'files' parameter of build_parquet lists a file twice.")
    return paths


def _read_parquet(path: str) -> exp.Table:
    """``read_parquet('path', file_row_number = true)`` as a table."""
    return exp.Table(this=exp.Anonymous(this="read_parquet", expressions=[
        exp.Literal.string(path), exp.EQ(this=exp.column(FILE_ROW), expression=exp.true())]))


def file_rows(files: Sequence[str]) -> list[int]:
    """Rows of each Parquet file, from its metadata (no data read).

    Raises
    ------
    InputError
        A file is not a Parquet file DuckDB can read.
    """
    con = DuckDBConnector(":memory:")
    try:
        out = []
        for f in files:
            q = sqlglot.select(exp.func("sum", exp.column("num_rows"))).from_(exp.Table(this=exp.Anonymous(
                this="parquet_file_metadata", expressions=[exp.Literal.string(f)])))
            out.append(int(con.fetch_rows(q)[0][0] or 0))
        return out
    finally:
        con.close()


class ParquetSource(DuckDBConnector):
    """An in-memory DuckDB whose table :data:`SOURCE` is a view over Parquet files, with each row's global row id
    (``offsets[i] + file_row_number`` for the ``i``-th file) as its row id. The build's functions run on it as on
    a table.

    Examples
    --------
    >>> import duckdb, tempfile
    >>> path = tempfile.mkdtemp() + "/a.parquet"
    >>> duckdb.execute(f"COPY (SELECT range AS x FROM range(5)) TO '{path}'")  # doctest: +ELLIPSIS
    <...>
    >>> src = ParquetSource([path], [100])
    >>> src.columns(SOURCE), src.fetch_rows(f"SELECT min({ROW_ID}), max({ROW_ID}) FROM {SOURCE}")
    ([('x', 'BIGINT')], [(100, 104)])
    """

    def __init__(self, files: Sequence[str], offsets: Sequence[int]) -> None:
        super().__init__(":memory:")
        self.files = list(files)
        schema = None
        parts = []
        for f, off in zip(self.files, offsets, strict=True):
            described = self.fetch_rows(exp.Describe(this=sqlglot.select(exp.Star()).from_(_read_parquet(f))))
            cols = [(r[0], r[1]) for r in described if r[0] != FILE_ROW]
            if schema is None:
                schema = cols
            elif cols != schema:
                raise InputError(f"Parquet file {f!r} has columns {cols}, the first file {schema}; the partitions of "
                                 "a table must share its schema.")
            rid = exp.cast(exp.Add(this=exp.Literal.number(int(off)), expression=exp.column(FILE_ROW)), "BIGINT")
            parts.append(sqlglot.select(*(exp.column(c, quoted=True) for c, _ in cols),
                                        exp.alias_(rid, ROW_ID, quoted=True)).from_(_read_parquet(f)))
        if any(c == ROW_ID for c, _ in schema or []):
            raise InputError(f"Parquet column {ROW_ID!r} is reserved for the partitioned build's row id.")
        self._schema = schema or []
        body = parts[0] if len(parts) == 1 else exp.union(*parts, distinct=False)
        self.execute(exp.Create(this=exp.table_(SOURCE, quoted=True), kind="VIEW", expression=body))

    def columns(self, table: str) -> list[tuple[str, str]]:
        return list(self._schema) if table == SOURCE else super().columns(table)

    def row_id(self, table: str, qualifier: str | None = None) -> exp.Expression | None:
        if table == SOURCE:
            return exp.column(ROW_ID, table=qualifier, quoted=True)
        return super().row_id(table, qualifier)

    def table_bytes(self, table: str) -> int:
        """The files' bytes (the synopsis budget's default base, as a table's storage for a normal build)."""
        return sum(os.path.getsize(f) for f in self.files) if table == SOURCE else super().table_bytes(table)


@dataclass
class PartitionPlan:
    """What the global step fixed, shipped to every partition's task."""

    files: list[str]
    offsets: list[int]
    rows: list[int]
    infos: list[ColumnInfo]
    group_by: list[str]
    group_types: list[tuple[str, str]]
    groups: pd.DataFrame  # gid, GROUP BY values, n
    sum_res: list[int]
    candidates: list[tuple[int, int]]
    quota_max: np.ndarray  # per group: the largest q_g the options allow
    options: b.BuildOptions
    synopsis_id: str
    outliers: b.OutlierRule  # the rows set aside whole (their bounds need the whole table's moments)


def _probe_where(src: ParquetSource, n_rows: int, seed: int) -> exp.Expression | None:
    """The dependence probe's rows: about :data:`PROBE_SAMPLE_ROWS` by a seeded hash of the row id, or all."""
    if n_rows <= PROBE_SAMPLE_ROWS:
        return None
    every = int(np.ceil(n_rows / PROBE_SAMPLE_ROWS))
    salt = int(seed) + 104729  # typed as DuckDB types the literal (the hash depends on the type): large seeds BIGINT
    h = src.row_hash(src.row_id(SOURCE), exp.cast(exp.Literal.number(salt), "INTEGER" if salt < 2**31 else "BIGINT"))
    return exp.Mod(this=h, expression=exp.Literal.number(every)).eq(exp.Literal.number(0))


def global_step(files: list[str], columns: Sequence[str] | None, group_by: Sequence[str] | None,
                opts: b.BuildOptions) -> tuple[PartitionPlan, dict]:
    """Step 1: the choices of the build from the whole table (module docstring); returns the plan and what the
    catalog row needs from it (statistics, budget, dependence scores)."""
    rows = file_rows(files)
    offsets = np.concatenate([[0], np.cumsum(rows)[:-1]]).astype(np.int64).tolist()
    src = ParquetSource(files, offsets)
    try:
        cols = b.resolve_columns(src, SOURCE, columns, group_by)
        infos = cols.infos
        ensure_schema(src)
        stats = b.read_statistics(src, SOURCE, cols, fingerprint=False)
        n_groups = b.count_groups(src, SOURCE, cols.group_by, opts.max_groups)
        b.count_cells(src, SOURCE, cols, opts.max_bins)  # as a normal build: a column's (group, value) pairs
        plan = b.plan_bins(infos, n_groups, opts, stats.table_bytes, stats.rows)
        b.find_bin_edges(src, SOURCE, infos, plan, stats.rows, opts.seed)
        sid = uuid.uuid4().hex[:12]
        tables = SynopsisTables.of(sid, infos, cols.group_types)
        b.write_groups(src, tables, SOURCE, cols)
        groups = src.fetch_df(sqlglot.select(exp.Star()).from_(tables.table("groups"))
                              .order_by(exp.column("gid", quoted=True)))
        sum_res = b.sum_grid_resolutions(infos, plan, opts, tables.sums.row_bytes)
        rule = _outlier_rule(src, infos, opts, plan, stats.rows)
        binned = b.bin_rows(src, tables, SOURCE, cols, where=_probe_where(src, stats.rows, opts.seed))
        aside = rule.predicate(binned.v)
        if aside is not None:  # a build probes the rows it keeps
            src.execute(exp.delete(binned.table, where=aside))
        scores = b.probe_dependence(src, binned, plan)
    finally:
        src.close()
    gsizes = groups["n"].to_numpy(dtype=np.int64)
    n_max = min(opts.sample_size or opts.max_sample_rows, stats.rows)
    # the quotas are drawn on the groups less their rows set aside (at most `cap` of all): a group that loses fewer
    # than its share gets a larger quota, never above the quota of n_max · S / (S − cap) on the whole groups
    cap = int(b.OUTLIER_SHARE * b.planned_sample(opts, plan, stats.rows)) if any(rule.bounds) else 0
    quota_max = b.sample_quotas(gsizes, math.ceil(n_max * stats.rows / max(stats.rows - cap, 1)), True)
    pplan = PartitionPlan(files, offsets, rows, infos, cols.group_by, cols.group_types, groups, sum_res,
                          b.candidate_pairs(scores, opts), quota_max, opts, sid, rule)
    return pplan, {"rows": stats.rows, "table_bytes": stats.table_bytes, "budget": plan.budget, "bins": plan.bins,
                   "sample_bytes": b.pair_reserve(plan, opts),
                   "scores": scores}


def _outlier_rule(src: ParquetSource, infos: list[ColumnInfo], opts: b.BuildOptions, plan: b.Plan,
                  n_rows: int) -> b.OutlierRule:
    """The rows a normal build of the files' concatenation sets aside (:func:`~densitas.aqp.build.find_outliers`
    over a view of every row's values on their numeric lines: its moments are the whole table's)."""
    if not opts.outliers:
        return b.OutlierRule.none(len(infos))
    view = exp.table_(VALUES, quoted=True)
    values = sqlglot.select(*(exp.alias_(src.to_line(i.column, i.kind), f"v{j}", quoted=True)
                              for j, i in enumerate(infos))).from_(exp.table_(SOURCE, quoted=True))
    src.execute(exp.Create(this=view, kind="VIEW", expression=values))
    return b.find_outliers(src, b.Binned(VALUES, len(infos)), infos, b.planned_sample(opts, plan, n_rows))


def _union(queries: list[exp.Query]) -> exp.Query:
    return queries[0] if len(queries) == 1 else exp.union(*queries, distinct=False)


def _a(e: exp.Expression, name: str) -> exp.Alias:
    return exp.alias_(e, name, quoted=True)


def partition_synopsis(plan: PartitionPlan, index: int) -> dict[str, Any]:
    """Step 2, one Dask task: the partial synopsis tables of file ``index`` (see the module docstring)."""
    con = ParquetSource([plan.files[index]], [plan.offsets[index]])
    try:
        infos = [dataclasses.replace(i) for i in plan.infos]
        cols = b.Columns(infos, list(plan.group_by), list(plan.group_types))
        tables = SynopsisTables.of(plan.synopsis_id, infos, cols.group_types)
        ensure_schema(con)
        con.execute(tables.groups.create(tables.id))
        con.insert_frame(tables.groups.table(tables.id), plan.groups)
        binned = b.bin_rows(con, tables, SOURCE, cols)
        k, count = len(infos), exp.Count(this=exp.Star())
        out: dict[str, Any] = {"index": index}
        # the rows set aside whole leave the binned rows (as in a normal build) for the partial tables below
        con.execute(tables.outliers.create(tables.id))
        b.move_outliers(con, tables.table("outliers"), tables.outliers, binned, plan.outliers)
        out["outliers"] = con.fetch_df(sqlglot.select(exp.Star()).from_(tables.table("outliers")))
        out["marg"] = con.fetch_df(_union([
            sqlglot.select(_a(b._num(j), "col"), b._col("gid"), _a(binned.b(j), "bin"), _a(count.copy(), "n"),
                           _a(exp.Sum(this=binned.v(j)), "s")).from_(binned.table).group_by(b._col("gid"), binned.b(j))
            for j in range(k)]))
        out["occupied"] = con.fetch_df(_union([b.occupied(binned, j) for j in range(k)]))
        out["probes"] = b.fetch_probe_counts(con, binned, infos)
        numeric = [j for j, info in enumerate(infos) if info.numeric]
        nullable = [j for j in numeric if infos[j].nullable]
        names = ["n", *(f"s{j}" for j in numeric), *(f"nn{j}" for j in nullable)]
        values = [count.copy()] + [exp.Sum(this=binned.v(j)) for j in numeric] + \
            [exp.Count(this=binned.v(j)) for j in nullable]
        sums = []
        for j, info in enumerate(infos):
            cell = binned.coarse(j, plan.sum_res[j], info.bins)
            sums.append(sqlglot.select(_a(b._num(j), "col"), b._col("gid"), _a(cell, "cell"),
                                       *(_a(v.copy(), n) for v, n in zip(values, names, strict=True)))
                        .from_(binned.table).group_by(b._col("gid"), cell.copy()))
        out["sums"] = con.fetch_df(_union(sums))
        out["finest"] = b.finest_pair_grids(con, binned, [i.bins for i in infos], plan.candidates, plan.options)
        # the sample's candidates: each group's q_g^max + 1 rows of smallest seeded hash of the global row id
        con.create_temp_table(b.QUOTA, pd.DataFrame({"gid": np.arange(len(plan.quota_max), dtype=np.int64),
                                                     "q": np.asarray(plan.quota_max, dtype=np.int64) + 1}))
        h = b.seeded_hash(con, b._col(ROW_ID))
        rn = exp.Window(this=exp.RowNumber(), partition_by=[b._col("gid")],
                        order=exp.Order(expressions=[exp.Ordered(this=b._col("h"))]))
        hashed = sqlglot.select(b._col("gid"), _a(h, "h"), *(binned.v(j) for j in range(k))).from_(binned.table)
        ranked = sqlglot.select(exp.Star(), _a(rn, "rn")).from_(hashed.subquery("x"))
        cand = sqlglot.select(b._col("gid"), b._col("h"), _a(con.hash_unit(b._col("h")), "u"),
                              *(binned.v(j) for j in range(k))).from_(ranked.subquery("r")) \
            .join(exp.table_(b.QUOTA, quoted=True), using=["gid"]).where(b._col("rn") <= b._col("q"))
        out["candidates"] = con.fetch_df(cand, [b.sample_salt(plan.options.seed)])
        fp = con.fetch_rows(con.fingerprint_query(SOURCE, cols.names + cols.group_by))[0]
        out["fingerprint"] = (int(fp[0]), 0 if fp[1] is None else int(fp[1]))
        out["rows"] = int(fp[0])
        return out
    finally:
        con.close()


_nullable = b.nullable  # floats with NaN as NULL (where the build's SUM of no value is NULL)


@dataclass
class Merged:
    """The merged tables, as frames in the stored layouts' column order, and what the catalog needs."""

    marg: pd.DataFrame
    sums: pd.DataFrame
    edges: pd.DataFrame
    finest: dict
    candidates: pd.DataFrame
    fingerprint: str
    rows: int
    outliers: pd.DataFrame  # the rows set aside whole: gid, v0..
    groups: pd.DataFrame  # the plan's groups, their rows less those set aside


def merge_partials(plan: PartitionPlan, parts: list[dict]) -> Merged:
    """Step 3's sums: histograms, sum grids and finest pair grids add, occupied ranges widen, fingerprints add."""
    parts = sorted(parts, key=lambda p: p["index"])
    marg = pd.concat([p["marg"] for p in parts], ignore_index=True)
    marg = marg.groupby(["col", "gid", "bin"], as_index=False, sort=True).agg(
        n=("n", "sum"), s=("s", lambda s: s.sum(min_count=1)))
    marg = pd.DataFrame({"col": marg["col"].astype(np.int16), "gid": marg["gid"].astype(np.int16),
                         "bin": marg["bin"].astype(np.int16), "n": marg["n"].astype(np.int64),
                         "s": _nullable(marg["s"])})
    sums = pd.concat([p["sums"] for p in parts], ignore_index=True)
    value_cols = [c for c in sums.columns if c not in ("col", "gid", "cell")]
    sums = sums.groupby(["col", "gid", "cell"], as_index=False, sort=True).agg(
        **{c: (c, (lambda s: s.sum(min_count=1)) if c.startswith("s") else "sum") for c in value_cols})
    sums = pd.DataFrame({"col": sums["col"].astype(np.int16), "gid": sums["gid"].astype(np.int16),
                         "cell": sums["cell"].astype(np.int16),
                         **{c: _nullable(sums[c]) if c.startswith("s") else sums[c].astype(np.int64)
                            for c in value_cols}})
    occ = b.merge_occupied([p["occupied"] for p in parts])
    frames = [b.edges_frame(plan.infos, occ)]
    labels = plan.groups[["gid", *plan.group_by]] if plan.group_by else None
    if plan.group_by:  # the ends' split among the groups, as a normal build measures it (write_histograms)
        b.set_end_dispersion(plan.infos, occ, labels, list(plan.group_by))
    # the rows' placement within the bins, from the counts below fixed probes that add up over the parts
    b.set_placement_error(plan.infos, occ, b.merge_probes([p.get("probes") for p in parts]), labels,
                          list(plan.group_by))
    finest = {}
    for pair in plan.candidates:
        res = parts[0]["finest"][pair][0]
        g, x, y, n = (np.concatenate([p["finest"][pair][1][i] for p in parts]) for i in range(4))
        key = (g * (res[0] + 1) + x) * (res[1] + 1) + y
        uk, inv = np.unique(key, return_inverse=True)
        cnt = np.bincount(inv, n).astype(np.int64)
        gg, rem = np.divmod(uk, (res[0] + 1) * (res[1] + 1))
        finest[pair] = (res, (gg, rem // (res[1] + 1), rem % (res[1] + 1), cnt))
    n_rows, h = 0, 0
    for p in parts:
        n_rows += p["fingerprint"][0]
        h ^= p["fingerprint"][1]
    cands = pd.concat([p["candidates"] for p in parts], ignore_index=True)
    k = len(plan.infos)
    aside = pd.concat([p["outliers"] for p in parts], ignore_index=True)
    aside = pd.DataFrame({"gid": aside["gid"].to_numpy(dtype=np.int16),
                          **{f"v{j}": _nullable(aside[f"v{j}"]) for j in range(k)}})
    groups = plan.groups.copy()
    groups["n"] = groups["n"].to_numpy(dtype=np.int64) - np.bincount(aside["gid"].to_numpy(dtype=np.int64),
                                                                      minlength=len(groups))
    return Merged(marg, sums, pd.concat(frames, ignore_index=True), finest, cands, f"{n_rows}:{h}", n_rows, aside,
                  groups)


def draw_merged_sample(plan: PartitionPlan, cands: pd.DataFrame, quota: np.ndarray, gsizes: np.ndarray
                       ) -> tuple[pd.DataFrame, list]:
    """Each group's ``q_g`` candidates of smallest hash (the bottom ``q_g`` of the whole group), in hash order, and
    the thresholds ``t_g`` a normal build records (:func:`~densitas.aqp.build.draw_sample`: the unit of the
    ``q_g + 1``-th row, where the build's hash pre-filter passed it; the filter's bound where it did not).
    ``gsizes``: the groups' rows, less those set aside whole."""
    frac = np.minimum(1.0, (2 * quota + 50) / np.maximum(gsizes, 1))
    gid = cands["gid"].to_numpy(dtype=np.int64)
    hv = np.asarray(cands["h"].to_numpy(), dtype=np.uint64)
    order = np.lexsort((hv, gid))
    cands = cands.iloc[order].reset_index(drop=True)
    gid, unit = gid[order], cands["u"].to_numpy(dtype=np.float64)
    if np.any(quota > plan.quota_max):  # the partitions returned q_g^max + 1 candidates per group: never fewer
        raise AssertionError(f"sample quotas {quota.tolist()} above the candidates' bound {plan.quota_max.tolist()}")
    starts = np.searchsorted(gid, np.arange(len(gsizes)))
    rank = np.arange(len(gid)) - starts[gid]
    sample = cands.loc[rank < quota[gid]]
    # the build's pre-filter keeps rows whose unit lies below frac_g; it is used when it passes q_g rows of every
    # group (q_g-th unit below frac_g), else the build draws without it
    kth = [unit[starts[g] + quota[g] - 1] if quota[g] > 0 else -1.0 for g in range(len(gsizes))]
    filtered = all(kth[g] < frac[g] for g in range(len(gsizes)))
    thresholds = np.where(quota >= gsizes, 1.0, frac)
    for g in range(len(gsizes)):
        if quota[g] < gsizes[g]:
            nxt = unit[starts[g] + quota[g]]  # the (q_g + 1)-th: among the candidates (q_g <= q_g^max)
            if not filtered or nxt < frac[g]:
                thresholds[g] = nxt
    k = len(plan.infos)
    frame = pd.DataFrame({"gid": sample["gid"].to_numpy(dtype=np.int16),
                          **{f"v{j}": _nullable(sample[f"v{j}"]) for j in range(k)}})
    return frame, thresholds.tolist()


def _compute(plan: PartitionPlan, client: Any) -> list[dict]:
    """Step 2 on Dask: one task per file, on ``client`` when given, else Dask's default scheduler (a distributed
    client made current, or the local one); without Dask installed, one file after another in this process."""
    n = len(plan.files)
    if client is not None:
        futures = client.map(partition_synopsis, [plan] * n, range(n), pure=False)
        return client.gather(futures)
    try:
        import dask
    except ImportError:  # pragma: no cover - dask is in the test extra
        return [partition_synopsis(plan, i) for i in range(n)]
    return list(dask.compute(*(dask.delayed(partition_synopsis, pure=False)(plan, i) for i in range(n))))


def build_parquet(con: Connector, name: str, files: str | Sequence[str], columns: Sequence[str] | None = None,
                  group_by: Sequence[str] | None = None, options: b.BuildOptions | None = None,
                  client: Any = None) -> dict:
    """Build (or atomically replace) the synopsis ``name`` of the table held in Parquet files, one partition per
    Dask task; stored in ``con``'s ``densitas`` schema. Returns its catalog row (plus ``partitions``).

    Parameters
    ----------
    con : Connector
        The database the synopsis is written to (DuckDB or PostgreSQL); the files are read by DuckDB.
    name : str
        The synopsis' table name: queries say ``FROM name``.
    files : str or sequence of str
        A glob (matches sorted by name) or the files in order; they must share one schema. Their order defines the
        global row ids (module docstring).
    columns, group_by, options
        As :func:`densitas.aqp.build.build` (``append_key`` does not apply: refresh does not read files).
    client : distributed.Client, optional
        Run the partitions' tasks on this Dask client; default Dask's current scheduler.

    Returns
    -------
    dict
        The catalog row, plus ``groups``, ``partitions`` and ``phases`` (seconds of the global step, the
        partitions' tasks, and the merge and store).

    Raises
    ------
    InputError
        Bad files, options, columns or group_by (as a build).

    Examples
    --------
    See the module docstring.
    """
    # not here yet: compact accounting of the sample and grids, and the independent pairs' probe grids (the probe
    # is a hash sample)
    b.check_table_name(name)
    opts = dataclasses.replace(options or b.BuildOptions(), compact_sample=False, compact_grids=False,
                               independent_pairs=False)
    opts.check()
    if opts.append_key is not None:
        raise InputError("The 'append_key' parameter does not apply to a build from Parquet files (a refresh reads "
                         f"the database, not the files). Got {opts.append_key!r} instead.")
    t0 = time.perf_counter()
    paths = parquet_files(files)
    plan, info = global_step(paths, columns, group_by, opts)
    t1 = time.perf_counter()
    parts = _compute(plan, client)
    t2 = time.perf_counter()
    merged = merge_partials(plan, parts)
    if merged.rows != info["rows"]:
        raise StaleSynopsisError(f"the Parquet files changed during the build of {name!r}: {merged.rows} rows read by "
                                 f"the partitions, {info['rows']} by the global step; build again.")
    infos, k = plan.infos, len(plan.infos)
    tables = SynopsisTables.of(plan.synopsis_id, infos, plan.group_types)
    budget, n_groups = info["budget"], len(plan.groups)
    used = (len(merged.marg) * tables.marg.row_bytes + len(merged.sums) * tables.sums.row_bytes
            + len(merged.edges) * tables.edges.row_bytes + n_groups * tables.groups.row_bytes)
    chosen = b.choose_pair_resolutions(merged.finest, info["bins"], plan.candidates, opts,
                                       budget - info["sample_bytes"] - used)
    used += sum(len(cells[0]) for _, _, cells in chosen) * tables.pairs.row_bytes
    used += len(merged.outliers) * tables.sample.row_bytes  # a row set aside: a sample row at its nominal width
    gsizes = merged.groups["n"].to_numpy(dtype=np.int64)
    n_sample = b.sample_target(opts, budget, used, k, merged.rows)
    quota = b.sample_quotas(gsizes, n_sample, bool(opts.sample_size))
    sample, thresholds = draw_merged_sample(plan, merged.candidates, quota, gsizes)
    ensure_schema(con)
    old_ids = catalog_ids(con, name)
    with con.transaction():
        con.execute(tables.groups.create(tables.id))
        con.insert_frame(tables.table("groups"), merged.groups)
        for kind, frame in (("marg", merged.marg), ("sums", merged.sums), ("edges", merged.edges),
                            ("sample", sample), ("outliers", merged.outliers)):
            con.execute(getattr(tables, kind).create(tables.id))
            con.insert_frame(tables.table(kind), frame)
        grids = b.insert_pair_grids(con, tables, chosen, info["scores"])
        bandwidths = b._bandwidths(con, tables, infos, opts.bandwidth)
        meta = {"table_name": name, "id": tables.id, "version": FORMAT_VERSION,
                "build_seconds": time.perf_counter() - t0, "rows": merged.rows, "fingerprint": merged.fingerprint,
                "columns": json.dumps([i.to_dict() for i in infos]), "group_by": json.dumps(plan.group_by),
                "grids": json.dumps({"pairs": [g.to_dict() for g in grids], "sum_res": plan.sum_res,
                                     "scores": [[a, c, v] for (a, c), v in info["scores"].items()]}),
                "options": json.dumps({"budget_bytes": budget, "sample_size": len(sample), "seed": opts.seed,
                                       "max_bins": opts.max_bins, "append": None, "thresholds": thresholds,
                                       "outliers": plan.outliers.to_json(),
                                       "build": dataclasses.asdict(opts),
                                       "parquet": {"files": paths, "rows": plan.rows}}),
                "bandwidths": json.dumps(bandwidths),
                "size_bytes": stored_bytes(con, tables, "marg", "sums", "pairs", "sample", "outliers", "edges",
                                           "groups"),
                "table_bytes": info["table_bytes"]}
        b.swap_catalog(con, meta, old_ids)
    meta["build_seconds"] = time.perf_counter() - t0
    b.set_build_seconds(con, name, meta["build_seconds"])
    meta["groups"] = n_groups
    meta["outlier_rows"] = len(merged.outliers)
    meta["partitions"] = len(paths)
    meta["phases"] = {"global": t1 - t0, "partitions": t2 - t1, "merge_and_store": meta["build_seconds"] - (t2 - t0)}
    return meta


def check_fingerprint(meta: dict, columns: list[str]) -> None:
    """Raise :class:`~densitas.StaleSynopsisError` when the Parquet files of a synopsis built by
    :func:`build_parquet` (``meta`` its catalog row) no longer hold its rows: one hash scan of the files."""
    source = json.loads(meta["options"])["parquet"]
    files = source["files"]
    missing = [f for f in files if not os.path.isfile(f)]
    if missing:
        raise StaleSynopsisError(f"synopsis of {meta['table_name']!r} is stale: its Parquet file {missing[0]!r} is "
                                 "gone; rebuild it (Engine.build_parquet).")
    src = None
    try:  # opening the files checks their schema: a rewritten file with other types is a stale synopsis too
        src = ParquetSource(files, np.concatenate([[0], np.cumsum(source["rows"])[:-1]]).astype(np.int64).tolist())
        n, h = src.fetch_rows(src.fingerprint_query(SOURCE, columns))[0]
    except InputError as exc:
        raise StaleSynopsisError(f"synopsis of {meta['table_name']!r} no longer matches its Parquet files: {exc}") \
            from None
    finally:
        if src is not None:
            src.close()
    if f"{int(n)}:{0 if h is None else int(h)}" != meta["fingerprint"]:
        raise StaleSynopsisError(f"synopsis of {meta['table_name']!r} is stale: its Parquet files hold {int(n)} rows "
                                 f"(the synopsis {meta['rows']}) or other values; rebuild it (Engine.build_parquet).")
