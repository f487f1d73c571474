"""Refreshing a synopsis after rows were appended: the new rows' synopsis is built alone and merged.

Every part of a synopsis but the sample is a sum over rows, so the synopsis of a table that grew by rows ``A`` is
the old one plus the synopsis of ``A`` over the same bins and groups: fine histograms (counts and sums per bin),
sum grids and pair grids add cell by cell, group sizes add, each bin's occupied range widens to the new values'.
The build's edges, pair grids and dependence scores are kept (a rebuild re-chooses them).

**The sample.** The build draws, in each group ``g``, the ``q_g`` rows with the smallest seeded hash of their row
id (:func:`~densitas.aqp.build.seeded_hash`) and records ``t_g``, the hash unit of the ``q_g + 1``-th: the sample is
the group's rows whose unit lies below ``t_g``. A refresh adds the appended rows whose unit lies below the same
``t_g``. By rank conditioning (Cohen & Kaplan, "Summarizing data using bottom-k sketches", PODC 2007), given all
other rows' hashes each row of the group, old or new, is in the merged sample with probability ``t_g``: the merged
sample is an equal-probability sample of the grown group, and the estimator's weights ``N_g / n_g`` (Hájek) and its
variance stay those of the fresh build. The sample grows with the table (by ``t_g`` per appended row); a rebuild
resets it to the budget.

**Which rows are new.** Rows whose *append key* exceeds its maximum at the last build or refresh: a column given as
``append_key`` at build time (an id or a load date that only grows), else DuckDB's row id (rows appended later get
larger ones; PostgreSQL's ``ctid`` gives no such order, so there a synopsis without ``append_key`` is rebuilt). The
refresh counts the table: when its rows are not the synopsis' rows plus the new ones (rows deleted, or appended
with a key at most the old maximum) it rebuilds instead. Rows *updated* in place keep the count and are caught by
the data fingerprint, which is merged too (its row hashes are XORed): the merged fingerprint no longer matches the
table, so the next load reports the synopsis stale (``verify=True`` checks it during the refresh instead, also when
no rows were appended, at the cost of one hash scan of the table). New GROUP BY combinations, new values of a
discrete column, or NULLs in a column that had none also need bins or groups the synopsis lacks: those refresh by
rebuilding.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
import sqlglot
from sqlglot import exp

from densitas.aqp import build as b
from densitas.aqp.connector import Connector, table_expr
from densitas.aqp.store import SynopsisTables, catalog_ids, count_rows, read, sample_layout
from densitas.exceptions import InputError

__all__ = ["Delta", "RefreshResult", "find_delta", "refresh"]

THRESHOLDS = "_densitas_thresholds"  # temporary: each group's sample threshold


@dataclass
class RefreshResult:
    """What :func:`refresh` did: ``action`` is ``"merged"``, ``"current"`` (nothing appended) or ``"rebuilt"``;
    ``reason`` says why it rebuilt; ``meta`` is the synopsis' catalog row afterwards."""

    action: str
    appended: int
    reason: str | None
    meta: dict


@dataclass
class Delta:
    """The appended rows: how many, the predicate selecting them, and the key's new maximum (None: rebuild, with
    ``reason``)."""

    rows: int
    where: exp.Expression | None
    new_max: float | None
    reason: str | None = None


def find_delta(con: Connector, table: str, meta: dict) -> Delta:
    """The rows appended to ``table`` since its synopsis (``meta``, the catalog row) was built or refreshed."""
    opts = json.loads(meta.get("options") or "{}")
    marker = opts.get("append")
    if "thresholds" not in opts or "build" not in opts:
        return Delta(0, None, None, "the synopsis was built by a densitas without refresh support")
    if marker is None:
        return Delta(0, None, None, "the table has no ordered row id and the synopsis no append_key")
    key = b.append_key_expr(con, table, marker["key"])
    n_now = int(con.fetch_rows(sqlglot.select(exp.Count(this=exp.Star())).from_(table_expr(table)))[0][0])
    old_max = marker["max"]
    where = key.copy().is_(exp.null()).not_() if old_max is None else key.copy() > exp.Literal.number(repr(old_max))
    new_rows, new_max = con.fetch_rows(sqlglot.select(exp.Count(this=exp.Star()), exp.Max(this=key.copy()))
                                       .from_(table_expr(table)).where(where))[0]
    new_rows = int(new_rows)
    if n_now != int(meta["rows"]) + new_rows:
        what = ("rows were deleted or appended below the append key's maximum" if n_now < int(meta["rows"]) + new_rows
                else "rows were appended with an append key at most its maximum at the build (or with a NULL key)")
        return Delta(new_rows, where, None, f"the table has {n_now} rows, the synopsis {meta['rows']} plus {new_rows} "
                                            f"appended: {what}")
    return Delta(new_rows, where, None if new_max is None else float(new_max))


def _merge_fingerprint(old: str, part: tuple) -> str:
    """``rows:hash`` of the old rows merged with the appended rows' ``(count, xor of hashes)``."""
    n_old, h_old = old.split(":", 1)
    h_new = int(part[1]) if part[1] is not None else 0
    return f"{int(n_old) + int(part[0])}:{int(h_old) ^ h_new}"


def _sum_merge(con: Connector, target: exp.Table, old: exp.Table, delta: exp.Query, keys: list[str],
               values: list[str]) -> None:
    """``INSERT INTO target`` the old rows and ``delta``'s (same columns) summed by ``keys``."""
    both = exp.union(sqlglot.select(*(b._col(c) for c in keys + values)).from_(old), delta, distinct=False)
    merged = sqlglot.select(*(b._col(c) for c in keys),
                            *(exp.alias_(exp.Sum(this=b._col(c)), c, quoted=True) for c in values)) \
        .from_(both.subquery("u")).group_by(*(b._col(c) for c in keys))
    con.execute(exp.insert(merged, target))


def _edges_frame(infos: list, occ: pd.DataFrame) -> pd.DataFrame:
    """The edges table's rows: lower edges, each bin's occupied range widened to the appended values' (``occ``,
    :func:`~densitas.aqp.build.occupied`'s columns), the rows at its ends counted again where an end moved."""
    old = []
    for j, info in enumerate(infos):
        counts = {c: getattr(info, a) if len(getattr(info, a)) == info.bins else np.zeros(info.bins)
                  for c, a in (("nmin", "count_at_min"), ("nmax", "count_at_max"))}
        old.append(pd.DataFrame({"col": j, "bin": np.arange(1, info.bins + 1), "vmin": info.occupied_min,
                                 "vmax": info.occupied_max, **counts}))
    return b.edges_frame(infos, b.merge_occupied([*old, occ]))


def _misfit(con: Connector, binned: b.Binned, infos: list, delta_rows: int, rule: b.OutlierRule,
            aside_room: float) -> str | None:
    """Why the binned appended rows do not fit the synopsis (new groups, values outside a discrete column's
    values, NULLs in a column without them, more rows beyond ``rule``'s bounds than ``aside_room``), or None."""
    parts: list[exp.Expression] = [exp.Count(this=exp.Star())]
    for j, info in enumerate(infos):
        bad = exp.and_(binned.b(j).eq(b._num(0)), binned.v(j).is_(exp.null()).not_()) if info.discrete \
            else binned.v(j).is_(exp.null()) if not info.nullable else exp.false()
        parts.append(exp.Sum(this=exp.case().when(bad, b._num(1)).else_(b._num(0))))
    aside = rule.predicate(binned.v)
    parts.append(exp.Sum(this=exp.case().when(exp.false() if aside is None else aside, b._num(1)).else_(b._num(0))))
    row = con.fetch_rows(sqlglot.select(*parts).from_(binned.table))[0]
    if int(row[0]) != delta_rows:
        return f"{delta_rows - int(row[0])} appended rows belong to GROUP BY combinations the synopsis does not hold"
    for j, info in enumerate(infos):
        if int(row[1 + j] or 0):
            what = "values the discrete column did not hold" if info.discrete else "NULLs (it had none)"
            return f"{int(row[1 + j])} appended rows have {what} in {info.name!r}"
    if int(row[-1] or 0) > aside_room:
        return (f"{int(row[-1])} appended rows lie beyond the build's bounds for rows stored whole, more than the "
                f"synopsis keeps room for ({int(aside_room)})")
    return None


def _table_fingerprint(con: Connector, table: str, columns: list[str]) -> str:
    """The whole table's fingerprint (``rows:hash``, one hash scan), as the synopsis' catalog row stores it."""
    n, h = con.fetch_rows(con.fingerprint_query(table, columns))[0]
    return f"{int(n)}:{h}"


def _build_options(meta: dict) -> b.BuildOptions:
    """The options the synopsis (``meta``, its catalog row) was built with; a synopsis too old to store them is
    rebuilt with the defaults and its seed."""
    opts = json.loads(meta.get("options") or "{}")
    stored = opts.get("build") or {"seed": opts.get("seed", 0), "max_bins": opts.get("max_bins", 4096)}
    return b.BuildOptions(**{k: tuple(v) if k == "shares" else v for k, v in stored.items()
                             if k in b.BuildOptions.__dataclass_fields__})


def _rebuild(con: Connector, table: str, meta: dict, appended: int, reason: str) -> RefreshResult:
    columns = [c["name"] for c in json.loads(meta["columns"])]
    new = b.build(con, table, columns, json.loads(meta["group_by"]), _build_options(meta))
    return RefreshResult("rebuilt", appended, reason, new)


def refresh(con: Connector, table: str, *, verify: bool = False) -> RefreshResult:
    """Merge the rows appended to ``table`` into its synopsis, or rebuild it where a merge cannot be exact.

    Parameters
    ----------
    con : Connector
        The database holding ``table`` and its synopsis.
    table : str
        A table with a synopsis.
    verify : bool
        Also check the whole table's fingerprint against the merged one (one hash scan of the table): a row
        updated or deleted since the build then makes the refresh a rebuild instead of a stale synopsis.

    Returns
    -------
    RefreshResult

    Examples
    --------
    >>> import duckdb
    >>> from densitas.aqp import Engine
    >>> eng = Engine(duckdb.connect())
    >>> eng.con.execute("CREATE TABLE t AS SELECT i::DOUBLE AS x FROM range(10000) r(i)")
    >>> _ = eng.build("t", sample_size=500)
    >>> eng.con.execute("INSERT INTO t SELECT (i % 10000)::DOUBLE FROM range(1000) r(i)")
    >>> res = refresh(eng.con, "t")
    >>> res.action, res.appended, res.meta["rows"]
    ('merged', 1000, 11000)
    """
    t0 = time.perf_counter()
    st = read(con, table)
    meta = st.meta
    if "parquet" in json.loads(meta.get("options") or "{}"):
        raise InputError(f"the synopsis of {table!r} was built from Parquet files (Engine.build_parquet): a refresh "
                         "reads a table of the database; build it again from the files instead.")
    delta = find_delta(con, table, meta)
    if delta.reason is not None:
        return _rebuild(con, table, meta, delta.rows, delta.reason)
    if delta.rows == 0:
        # nothing appended, but rows may have been updated in place (the count stays): verify checks the content
        if verify and _table_fingerprint(con, table, [i.name for i in st.infos] + json.loads(meta["group_by"])) \
                != meta["fingerprint"]:
            return _rebuild(con, table, meta, 0, "rows of the synopsis were updated or deleted")
        return RefreshResult("current", 0, None, meta)
    cols = b.resolve_columns(con, table, [i.name for i in st.infos], json.loads(meta["group_by"]))
    cols.infos = infos = st.infos  # the synopsis' bins, not fresh statistics
    part = con.fetch_rows(con.fingerprint_query(table, cols.names + cols.group_by).where(delta.where))[0]
    fingerprint = _merge_fingerprint(meta["fingerprint"], part)
    if verify and _table_fingerprint(con, table, cols.names + cols.group_by) != fingerprint:
        return _rebuild(con, table, meta, delta.rows, "rows of the synopsis were updated or deleted")
    # the appended values' range: a continuous column's first edge moves down to a smaller new value
    line = [con.to_line(i.column, i.kind) for i in infos]
    ext = con.fetch_rows(sqlglot.select(*(f(this=e.copy()) for e in line for f in (exp.Min, exp.Max)))
                         .from_(table_expr(table)).where(delta.where.copy()))[0]
    for j, info in enumerate(infos):
        lo, hi = ext[2 * j], ext[2 * j + 1]
        if lo is not None and not info.discrete and float(lo) < info.lo:
            info.lo = float(lo)
            info.edges = info.edges.copy()
            info.edges[0] = info.lo
        if hi is not None and not info.discrete:
            info.hi = max(info.hi, float(hi))
    grids = json.loads(meta["grids"])
    opts = json.loads(meta["options"])
    old = SynopsisTables.of(meta["id"], infos, cols.group_types)
    new = SynopsisTables.of(uuid.uuid4().hex[:12], infos, cols.group_types)
    # its sample's integers (and codes) as BIGINT, as the build stores them (build.integer_columns)
    new = replace(new, sample=sample_layout(len(infos), integers=b.integer_columns(
        infos, opts.get("sample_decimals"))))
    with con.transaction():
        binned = b.bin_rows(con, old, table, cols, where=delta.where)
        rule = b.OutlierRule.from_json(opts.get("outliers"), len(infos))
        # room for rows stored whole: twice the build's share of a sample grown with the table, less those stored
        grown = int(opts.get("sample_size") or 0) * (int(meta["rows"]) + delta.rows) / max(int(meta["rows"]), 1)
        room = 2 * b.OUTLIER_SHARE * grown - count_rows(con, old.table("outliers")) if grown else math.inf
        misfit = _misfit(con, binned, infos, delta.rows, rule, room)
        if misfit is not None:
            b._drop(con, binned.table)
            reason = misfit
        else:
            reason = None
            _merge_outliers(con, binned, old, new, rule)
            _merge_tables(con, binned, old, new, infos, grids)
            sample_rows = _merge_sample(con, binned, old, new, opts)
            occ = con.fetch_df(_union([b.occupied(binned, j) for j in range(len(infos))]))
            for info in infos:  # the appended rows change how the ends' rows are split among the groups: not
                info.end_dispersion = {}  # measured again here, so the ends keep the row-by-row placement
            # the rows' shape within the bins (ColumnInfo.placement_error) is kept: a rate relative to the bins'
            # rows, which rows appended alike keep; the probes' counts are not stored to measure it again
            con.execute(new.edges.create(new.id))
            con.insert_frame(new.edges.table(new.id), _edges_frame(infos, occ))
            b._drop(con, binned.table)
            n_old = int(opts.get("sample_size") or 0)
            opts.update({"sample_size": sample_rows, "append": {**opts["append"], "max": delta.new_max}})
            # the KDE bandwidths follow the sample's size by the AMISE rate n^(-1/5), as the build rescales them
            shrink = (max(n_old, 1) / max(sample_rows, 1)) ** 0.2
            new_meta = {"table_name": table, "id": new.id, "version": meta["version"],
                        "build_seconds": time.perf_counter() - t0, "rows": int(meta["rows"]) + delta.rows,
                        "fingerprint": fingerprint, "columns": json.dumps([i.to_dict() for i in infos]),
                        "group_by": meta["group_by"], "grids": meta["grids"], "options": json.dumps(opts),
                        "bandwidths": json.dumps([h * shrink for h in json.loads(meta["bandwidths"] or "[]")]),
                        "size_bytes": b.synopsis_bytes(con, new, sample_rows, b.row_costs(
                            infos, count_rows(con, new.table("groups")), int(meta["rows"]) + delta.rows,
                            _build_options(meta), rule, opts.get("sample_decimals") or [None] * len(infos))),
                        "table_bytes": con.table_bytes(table)}
            b.swap_catalog(con, new_meta, catalog_ids(con, table))
    if reason is not None:
        return _rebuild(con, table, meta, delta.rows, reason)
    new_meta["build_seconds"] = time.perf_counter() - t0
    b.set_build_seconds(con, table, new_meta["build_seconds"])
    return RefreshResult("merged", delta.rows, None, new_meta)


def _merge_tables(con: Connector, binned: b.Binned, old: SynopsisTables, new: SynopsisTables, infos: list,
                  grids: dict) -> None:
    """The new synopsis' groups, histograms, sum grids and pair grids: the old ones plus the appended rows'."""
    count = exp.Count(this=exp.Star())
    # groups: the old rows plus the appended rows of each group
    lay = new.groups
    added = sqlglot.select(b._col("gid"), exp.alias_(count.copy(), "n", quoted=True)).from_(binned.table) \
        .group_by(b._col("gid"))
    names = [c.name for c in lay.columns]
    rows = sqlglot.select(*(b._col(c, "g") for c in names[:-1]),
                          exp.alias_(exp.cast(exp.Add(this=b._col("n", "g"), expression=exp.func(
                              "coalesce", b._col("n", "a"), b._num(0))), lay.columns[-1].sql_type), "n", quoted=True)) \
        .from_(exp.alias_(old.table("groups"), "g", table=True, quoted=True)) \
        .join(exp.alias_(added.subquery(), "a", table=True, quoted=True), join_type="LEFT",
              on=b._col("gid", "g").eq(b._col("gid", "a")))
    con.execute(lay.create(new.id))
    con.execute(exp.insert(rows, new.table("groups")))
    # fine histograms
    con.execute(new.marg.create(new.id))
    hist = [sqlglot.select(exp.alias_(b._num(j), "col", quoted=True), b._col("gid"),
                           exp.alias_(binned.b(j), "bin", quoted=True), exp.alias_(count.copy(), "n", quoted=True),
                           exp.alias_(exp.Sum(this=binned.v(j)), "s", quoted=True))
            .from_(binned.table).group_by(b._col("gid"), binned.b(j)) for j in range(len(infos))]
    _sum_merge(con, new.table("marg"), old.table("marg"), _union(hist), ["col", "gid", "bin"], ["n", "s"])
    # sum grids
    numeric = [j for j, info in enumerate(infos) if info.numeric]
    nullable = [j for j in numeric if infos[j].nullable]
    value_names = ["n", *(f"s{k}" for k in numeric), *(f"nn{k}" for k in nullable)]
    values = [count.copy()] + [exp.Sum(this=binned.v(k)) for k in numeric] + [exp.Count(this=binned.v(k))
                                                                               for k in nullable]
    con.execute(new.sums.create(new.id))
    sums = []
    for j, info in enumerate(infos):
        cell = binned.coarse(j, grids["sum_res"][j], info.bins)
        sums.append(sqlglot.select(exp.alias_(b._num(j), "col", quoted=True), b._col("gid"),
                                   exp.alias_(cell, "cell", quoted=True),
                                   *(exp.alias_(v.copy(), n, quoted=True) for v, n in zip(values, value_names,
                                                                                         strict=True)))
                    .from_(binned.table).group_by(b._col("gid"), cell.copy()))
    _sum_merge(con, new.table("sums"), old.table("sums"), _union(sums), ["col", "gid", "cell"], value_names)
    # pair grids, at their stored resolutions
    con.execute(new.pairs.create(new.id))
    pairs = []
    for g in grids["pairs"]:
        (a, c), (ra, rc) = g["cols"], g["res"]
        x, y = binned.coarse(a, ra, infos[a].bins), binned.coarse(c, rc, infos[c].bins)
        pairs.append(sqlglot.select(exp.alias_(b._num(g["id"]), "pair", quoted=True), b._col("gid"),
                                    exp.alias_(x, "c0", quoted=True), exp.alias_(y, "c1", quoted=True),
                                    exp.alias_(count.copy(), "n", quoted=True))
                     .from_(binned.table).group_by(b._col("gid"), x.copy(), y.copy()))
    if pairs:
        _sum_merge(con, new.table("pairs"), old.table("pairs"), _union(pairs), ["pair", "gid", "c0", "c1"], ["n"])


def _merge_outliers(con: Connector, binned: b.Binned, old: SynopsisTables, new: SynopsisTables,
                    rule: b.OutlierRule) -> None:
    """The old rows set aside whole plus the appended rows the build's rule picks (moved out of ``binned``, so
    that the groups, grids and sample merge the rest)."""
    target = new.table("outliers")
    con.execute(new.outliers.create(new.id))
    con.execute(exp.insert(sqlglot.select(*(b._col(c) for c in new.outliers.names)).from_(old.table("outliers")),
                           target))
    b.move_outliers(con, target, new.outliers, binned, rule)


def _union(queries: list[exp.Query]) -> exp.Query:
    return queries[0] if len(queries) == 1 else exp.union(*queries, distinct=False)


def _merge_sample(con: Connector, binned: b.Binned, old: SynopsisTables, new: SynopsisTables, opts: dict) -> int:
    """The old sample plus the appended rows whose seeded hash unit lies below their group's threshold; returns
    the merged sample's size."""
    thresholds = np.asarray(opts["thresholds"], dtype=np.float64)
    con.create_temp_table(THRESHOLDS, pd.DataFrame({"gid": np.arange(len(thresholds), dtype=np.int64),
                                                    "t": thresholds}))
    lay = new.sample
    target = lay.table(new.id)
    con.execute(lay.create(new.id))
    key = exp.func("coalesce", b._col("_densitas_rid", "b"), con.row_id(binned.name, qualifier="b"))
    unit = con.hash_unit(b.seeded_hash(con, key))
    k = binned.n_columns
    # appended rows are stored as the build stored its own (build.sample_decimals)
    decimals = opts.get("sample_decimals") or [None] * k
    # rounded down within the row's fine bin, whose lower edge the old synopsis' edges table holds (a bin's edge
    # does not move in a refresh but the first one's, down, which sample_value's LEAST(edge, v) keeps the row over)
    appended = sqlglot.select(exp.alias_(exp.cast(b._col("gid", "b"), lay.columns[0].sql_type), "gid", quoted=True),
                              *(exp.alias_(b.sample_value(b._col(f"v{j}", "b"), decimals[j], b._col("lo", f"e{j}")),
                                           f"v{j}", quoted=True) for j in range(k))) \
        .from_(exp.alias_(binned.table, "b", table=True, quoted=True))
    appended = b.with_bin_edges(appended, "b", old.table("edges"), decimals) \
        .join(exp.alias_(exp.table_(THRESHOLDS, quoted=True), "th", table=True, quoted=True),
              on=b._col("gid", "b").eq(b._col("gid", "th"))) \
        .where(unit < b._col("t", "th"))
    kept = sqlglot.select(*(b._col(c) for c in lay.names), exp.alias_(b._num(0), "o", quoted=True)) \
        .from_(old.table("sample"))
    appended = appended.select(exp.alias_(b._num(1), "o", quoted=True))
    # in group order, as a build stores it (its group column a run a group: build.GROUP_RUN_BYTES), the old rows
    # first; the values order the rest, so that the stored order does not depend on the scan's
    merged = sqlglot.select(*(b._col(c) for c in lay.names)).from_(
        exp.union(kept, appended, distinct=False).subquery("m")).order_by(
        b._col("gid"), b._col("o"), *(b._col(f"v{j}") for j in range(k)))
    con.execute(exp.insert(merged, target), [b.sample_salt(int(opts["seed"]))])
    if "sample_lossless" in opts:  # still exact only if the appended rows are too
        grown = b.sample_lossless(con, binned.table, old.table("edges"), decimals)  # every appended row: at most
        opts["sample_lossless"] = [a and g for a, g in zip(opts["sample_lossless"], grown, strict=True)]
    b._drop(con, exp.table_(THRESHOLDS, quoted=True))
    return int(con.fetch_rows(sqlglot.select(exp.Count(this=exp.Star())).from_(target))[0][0])

