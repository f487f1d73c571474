"""Building a synopsis: all heavy work runs as SQL inside the database.

A synopsis of a table over numeric/date columns ``C`` and categorical GROUP BY columns ``G`` holds, for each
combination of ``G`` values present (a *group*):

* the exact row count, and per numeric column the exact sum and non-NULL count;
* for every set of one, two and three columns of ``C``, a grid of exact cell counts, sums and non-NULL counts
  (bins adapt to the data: the distinct values of a discrete column, quantile bins otherwise; resolutions are
  chosen to fit a byte budget, by default 1% of the table's storage);
* a seeded, stratified random sample of rows, which corrects the grids' within-cell error and gives the
  confidence intervals (see :mod:`densitas.aqp.estimate`).

Everything is written to the ``densitas`` schema of the same database inside one transaction: a build that
fails leaves the previous synopsis of the table untouched and usable.
"""

from __future__ import annotations

import itertools
import json
import math
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from densitas.aqp.columns import ColumnInfo, classify
from densitas.aqp.connector import Connector, quote, table_ref
from densitas.exceptions import InputError

__all__ = ["BuildOptions", "build", "ensure_schema", "fingerprint_sql"]

SCHEMA = "densitas"
FORMAT_VERSION = 1


@dataclass
class BuildOptions:
    budget_bytes: int | None = None  # None: budget_fraction of the table's storage
    budget_fraction: float = 0.01
    min_budget_bytes: int = 256 * 1024
    max_bins: int = 4096  # most bins of a column (its distinct values when it has no more)
    max_dims: int = 3  # largest column set with its own grid
    sample_size: int | None = None  # None: from the budget
    max_groups: int = 1000
    seed: int = 0
    bandwidth: str = "plugin"  # densitas.kde method for the KDE estimator's per-column bandwidths
    shares: tuple[float, float, float, float] = (0.30, 0.30, 0.25, 0.15)  # sample, 1-D, 2-D, 3-D budget shares

    def check(self) -> None:
        if self.budget_bytes is not None and (not isinstance(self.budget_bytes, int) or self.budget_bytes <= 0):
            raise InputError(f"budget_bytes must be a positive integer, got {self.budget_bytes!r}.")
        if not 0 < self.budget_fraction <= 1:
            raise InputError(f"budget_fraction must be in (0, 1], got {self.budget_fraction!r}.")
        if not isinstance(self.max_bins, int) or not 2 <= self.max_bins <= 65536:
            raise InputError(f"max_bins must be an integer in [2, 65536], got {self.max_bins!r}.")
        if self.max_dims not in (1, 2, 3):
            raise InputError(f"max_dims must be 1, 2 or 3, got {self.max_dims!r}.")
        if self.sample_size is not None and (not isinstance(self.sample_size, int) or self.sample_size < 10):
            raise InputError(f"sample_size must be an integer >= 10, got {self.sample_size!r}.")
        if not isinstance(self.max_groups, int) or self.max_groups < 1:
            raise InputError(f"max_groups must be a positive integer, got {self.max_groups!r}.")


def ensure_schema(con: Connector) -> None:
    con.execute(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")
    con.execute(f"""CREATE TABLE IF NOT EXISTS {SCHEMA}.synopses (
        table_name VARCHAR PRIMARY KEY, id VARCHAR, version INTEGER, created_at TIMESTAMP, build_seconds DOUBLE,
        rows BIGINT, fingerprint VARCHAR, columns VARCHAR, group_by VARCHAR, grids VARCHAR, options VARCHAR,
        bandwidths VARCHAR, size_bytes BIGINT, table_bytes BIGINT)""")


def fingerprint_sql(table: str, columns: Sequence[str]) -> str:
    """SQL of the data fingerprint: row count and an order-independent hash of the synopsis columns."""
    cols = ", ".join(quote(c) for c in columns)
    return f"SELECT count(*), bit_xor(hash({cols})) FROM {table_ref(table)}"


def _grid_cell_bytes(dims: int, n_values: int) -> int:
    return 2 + 2 + 2 * dims + 4 + 8 * (n_values - 1)


def _allocate(infos: list[ColumnInfo], n_groups: int, n_rows: int, n_values: int, opts: BuildOptions,
              budget: int) -> tuple[list[int], dict[tuple[int, ...], tuple[int, ...]], int]:
    """Bins per column, resolution of each grid and sample size that fit ``budget`` bytes (dense estimate)."""
    k = len(infos)
    s_share, b1, b2, b3 = opts.shares
    if opts.max_dims < 3:
        b2, b3 = b2 + (b3 if opts.max_dims == 2 else 0), 0.0
    if opts.max_dims < 2:
        b1, b2 = b1 + b2, 0.0
    row_bytes = 4 + 8 * k
    n_sample = opts.sample_size or int(max(2000, s_share * budget / row_bytes))
    n_sample = min(n_sample, n_rows)

    def water_fill(cards: list[int], cells: float) -> tuple[int, ...]:
        """Per-dimension resolutions, each <= its card, with product <= cells, as even as possible."""
        res = [1] * len(cards)
        free = list(range(len(cards)))
        budget_cells = max(cells, 1.0)
        while free:
            r = int(budget_cells ** (1.0 / len(free)) + 1e-9)
            capped = [i for i in free if cards[i] <= r]
            if not capped:
                for i in free:
                    res[i] = max(2, r)
                break
            for i in capped:
                res[i] = cards[i]
                budget_cells /= cards[i]
                free.remove(i)
        return tuple(min(c, r) for c, r in zip(cards, res, strict=True))

    cards = [min(info.distinct, opts.max_bins) for info in infos]
    per_col = b1 * budget / (k * n_groups * _grid_cell_bytes(1, n_values))
    # discrete columns below the per-column share hand their slack to the others
    bins = list(cards)
    slack_cols = [i for i in range(k) if cards[i] > per_col]
    spare = sum(per_col - cards[i] for i in range(k) if cards[i] <= per_col)
    for i in slack_cols:
        bins[i] = int(max(16, min(cards[i], per_col + spare / max(len(slack_cols), 1))))
    grids: dict[tuple[int, ...], tuple[int, ...]] = {(i,): (bins[i],) for i in range(k)}
    for dims, share in ((2, b2), (3, b3)):
        subsets = list(itertools.combinations(range(k), dims))
        if not subsets or share <= 0:
            continue
        cells = share * budget / (len(subsets) * n_groups * _grid_cell_bytes(dims, n_values))
        for s in subsets:
            grids[s] = water_fill([bins[i] for i in s], cells)
    return bins, grids, n_sample


def _coarse_sql(col: int, res: int, bins: int) -> str:
    b = f"b{col}"
    if res >= bins:
        return b
    return f"CASE WHEN {b} = 0 THEN 0 ELSE 1 + ({b} - 1) * {res} // {bins} END"


def build(con: Connector, table: str, columns: Sequence[str] | None = None, group_by: Sequence[str] | None = None,
          options: BuildOptions | None = None, progress: Callable[[str, float], None] | None = None) -> dict:
    """Build (or atomically replace) the synopsis of ``table``; returns its metadata row as a dict."""
    opts = options or BuildOptions()
    opts.check()
    say = progress or (lambda step, frac: None)
    t0 = time.perf_counter()
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
    src = table_ref(table)
    ensure_schema(con)

    # 1. statistics and fingerprint in one scan
    say("statistics", 0.0)
    parts = ["count(*)"]
    for info in infos:
        e = info.expr
        parts += [f"count({e})", f"min({e})", f"max({e})", f"count(DISTINCT {e})"]
    stats = con.fetch_rows(f"SELECT {', '.join(parts)} FROM {src}")[0]
    n_rows = int(stats[0])
    if n_rows < 2:
        raise InputError(f"table {table!r} has {n_rows} rows; a synopsis needs at least 2.")
    for j, info in enumerate(infos):
        nn, lo, hi, nd = stats[1 + 4 * j: 5 + 4 * j]
        if nn == 0:
            raise InputError(f"column {info.name!r} of {table!r} is entirely NULL.")
        if lo is None or not (math.isfinite(lo) and math.isfinite(hi)):
            raise InputError(f"column {info.name!r} holds non-finite values (NaN or infinity); the synopsis "
                             "cannot place them. Clean or exclude the column.")
        info.nullable, info.lo, info.hi, info.distinct = nn < n_rows, float(lo), float(hi), int(nd)
    fp = con.fetch_rows(fingerprint_sql(table, columns + group_by))[0]
    fingerprint = f"{int(fp[0])}:{fp[1]}"
    table_bytes = con.table_bytes(table)

    # 2. groups
    say("groups", 0.1)
    if group_by:
        gsel = ", ".join(quote(g) for g in group_by)
        n_groups = con.fetch_rows(f"SELECT count(*) FROM (SELECT DISTINCT {gsel} FROM {src})")[0][0]
        if n_groups > opts.max_groups:
            raise InputError(f"group_by {group_by} has {n_groups} combinations, more than max_groups="
                             f"{opts.max_groups}; GROUP BY columns must have few distinct values.")
    else:
        n_groups = 1

    numeric = [j for j, info in enumerate(infos) if info.numeric]
    nullable = [j for j in numeric if infos[j].nullable]
    n_values = 1 + len(numeric) + len(nullable)
    budget = opts.budget_bytes or max(opts.min_budget_bytes, int(opts.budget_fraction * table_bytes))
    bins, grid_res, n_sample = _allocate(infos, n_groups, n_rows, n_values, opts, budget)

    # 3. bin edges: distinct values of discrete columns, quantiles otherwise
    say("bins", 0.15)
    for j, info in enumerate(infos):
        if info.distinct <= bins[j]:
            info.discrete = True
            vals = con.fetch_rows(f"SELECT DISTINCT {info.expr} AS v FROM {src} WHERE v IS NOT NULL ORDER BY v")
            info.edges = np.array([v[0] for v in vals], dtype=np.float64)
        else:
            qs = ", ".join(repr(i / bins[j]) for i in range(bins[j]))
            q = con.fetch_rows(f"SELECT quantile_disc({info.expr}, [{qs}]) FROM {src}")[0][0]
            edges = np.unique(np.asarray(q, dtype=np.float64))
            edges[0] = info.lo
            info.edges = edges
        bins[j] = info.bins

    syn_id = uuid.uuid4().hex[:12]
    cells_t, sample_t, edges_t, groups_t = (f"{SCHEMA}.{kind}_{syn_id}" for kind in ("cells", "sample", "edges",
                                                                                          "groups"))
    old = con.fetch_rows(f"SELECT id FROM {SCHEMA}.synopses WHERE table_name = ?", [table])
    with con.transaction():
        # 4. group ids and edge tables (temporary), then every row's bins (one ASOF JOIN per column)
        if group_by:
            gsel = ", ".join(quote(g) for g in group_by)
            con.execute(f"CREATE TABLE {groups_t} AS SELECT row_number() OVER (ORDER BY {gsel}) - 1 AS gid, * "
                        f"FROM (SELECT {gsel}, count(*) AS n FROM {src} GROUP BY {gsel})")
        else:
            con.execute(f"CREATE TABLE {groups_t} AS SELECT 0 AS gid, count(*) AS n FROM {src}")
        con.execute(f"CREATE TABLE {edges_t} (col INTEGER, bin INTEGER, lo DOUBLE)")
        for j, info in enumerate(infos):
            con.execute(f"INSERT INTO {edges_t} SELECT {j}, unnest(range(1, {info.bins + 1})), unnest(?::DOUBLE[])",
                        [info.edges.tolist()])
        say("binning rows", 0.2)
        sel = [f"{info.expr} AS v{j}" for j, info in enumerate(infos)]
        sel += [quote(g) for g in group_by]
        joins, bins_sel = [], []
        for j, info in enumerate(infos):
            # discrete columns: an equality (hash) join on the value; others: ASOF JOIN on the lower edge
            kind, op = ("LEFT JOIN", "=") if info.discrete else ("ASOF LEFT JOIN", ">=")
            joins.append(f"{kind} (SELECT bin, lo FROM {edges_t} WHERE col = {j}) e{j} ON s.v{j} {op} e{j}.lo")
            bins_sel.append(f"coalesce(e{j}.bin, 0) AS b{j}")
        gjoin = ""
        gid = "0"
        if group_by:
            cond = " AND ".join(f"s.{quote(g)} IS NOT DISTINCT FROM g.{quote(g)}" for g in group_by)
            gjoin = f"JOIN {groups_t} g ON {cond}"
            gid = "g.gid"
        vals = ", ".join(f"s.v{j}" for j in range(len(infos)))
        con.execute(f"CREATE TEMP TABLE _densitas_binned AS SELECT {gid} AS gid, {', '.join(bins_sel)}, {vals} "
                    f"FROM (SELECT {', '.join(sel)} FROM {src}) s {gjoin} {' '.join(joins)}")

        # 5. grids: totals (grid 0), then every column set up to max_dims
        value_cols = ["n INTEGER"] + [f"s{j} DOUBLE" for j in numeric] + [f"nn{j} INTEGER" for j in nullable]
        value_sql = ["count(*)"] + [f"sum(v{j})" for j in numeric] + [f"count(v{j})" for j in nullable]
        con.execute(f"CREATE TABLE {cells_t} (grid SMALLINT, gid SMALLINT, c0 SMALLINT, c1 SMALLINT, c2 SMALLINT, "
                    f"{', '.join(value_cols)})")
        grid_list: list[dict] = [{"id": 0, "cols": [], "res": []}]
        con.execute(f"INSERT INTO {cells_t} SELECT 0, gid, NULL, NULL, NULL, {', '.join(value_sql)} "
                    "FROM _densitas_binned GROUP BY gid")
        subsets = sorted(grid_res, key=lambda s: (len(s), s))
        for gi, s in enumerate(subsets, start=1):
            say(f"grid {gi}/{len(subsets)}", 0.25 + 0.6 * gi / len(subsets))
            res = grid_res[s]
            cs = [_coarse_sql(j, r, bins[j]) for j, r in zip(s, res, strict=True)]
            cpad = cs + ["NULL"] * (3 - len(cs))
            con.execute(f"INSERT INTO {cells_t} SELECT {gi}, gid, {', '.join(cpad)}, {', '.join(value_sql)} "
                        f"FROM _densitas_binned GROUP BY ALL")
            grid_list.append({"id": gi, "cols": list(s), "res": [min(r, bins[j]) for j, r in zip(s, res,
                                                                                            strict=True)]})

        # 6. the stratified sample: n_g proportional to the group's rows, at least min(N_g, 200)
        say("sample", 0.9)
        gsizes = np.array(con.fetch_rows(f"SELECT n FROM {groups_t} ORDER BY gid"), dtype=np.int64).ravel()
        quota = np.minimum(gsizes, np.maximum(np.minimum(gsizes, 200),
                                              np.round(n_sample * gsizes / gsizes.sum()).astype(np.int64)))
        con.execute("CREATE TEMP TABLE _densitas_quota AS SELECT unnest(range(?)) AS gid, unnest(?::BIGINT[]) AS q",
                    [len(quota), quota.tolist()])
        con.execute(f"CREATE TABLE {sample_t} AS SELECT gid, {vals.replace('s.', '')} FROM ("
                    f"SELECT b.*, row_number() OVER (PARTITION BY b.gid ORDER BY "
                    f"hash(xor(hash(b.rowid), {int(opts.seed) * 7919 + 1}::UBIGINT))) "
                    f"AS rn FROM _densitas_binned b) t JOIN _densitas_quota USING (gid) WHERE rn <= q "
                    "ORDER BY gid, rn")
        con.execute("DROP TABLE _densitas_binned")
        con.execute("DROP TABLE _densitas_quota")

        # 7. per-column KDE bandwidths on the sample (densitas.kde; on the GPU when one is present)
        say("bandwidths", 0.95)
        bandwidths = _bandwidths(con, sample_t, infos, opts.bandwidth)

        size = _stored_bytes(con, cells_t, sample_t, edges_t, groups_t)
        meta = {"table_name": table, "id": syn_id, "version": FORMAT_VERSION,
                "build_seconds": time.perf_counter() - t0, "rows": n_rows, "fingerprint": fingerprint,
                "columns": json.dumps([i.to_dict() for i in infos]), "group_by": json.dumps(group_by),
                "grids": json.dumps(grid_list), "options": json.dumps({"budget_bytes": budget,
                                                                        "sample_size": int(quota.sum()),
                                                                        "seed": opts.seed,
                                                                        "max_bins": opts.max_bins}),
                "bandwidths": json.dumps(bandwidths), "size_bytes": size, "table_bytes": table_bytes}
        _before_swap(meta)
        con.execute(f"DELETE FROM {SCHEMA}.synopses WHERE table_name = ?", [table])
        keys = list(meta)
        con.execute(f"INSERT INTO {SCHEMA}.synopses ({', '.join(keys)}, created_at) VALUES "
                    f"({', '.join('?' for _ in keys)}, now())", [meta[k] for k in keys])
        for (old_id,) in old:
            for kind in ("cells", "sample", "edges", "groups"):
                con.execute(f"DROP TABLE IF EXISTS {SCHEMA}.{kind}_{old_id}")
    say("done", 1.0)
    meta["build_seconds"] = time.perf_counter() - t0
    con.execute(f"UPDATE {SCHEMA}.synopses SET build_seconds = ? WHERE table_name = ?", [meta["build_seconds"],
                                                                                           table])
    return meta


def _before_swap(meta: dict) -> None:
    """Hook just before the new synopsis replaces the old one (tests make it fail to check atomicity)."""


def _bandwidths(con: Connector, sample_t: str, infos: list[ColumnInfo], method: str) -> list[float]:
    from densitas.kde import bandwidth

    out = []
    for j, info in enumerate(infos):
        v = np.asarray(con.fetch_numpy(f"SELECT v{j} AS v FROM {sample_t} WHERE v{j} IS NOT NULL")["v"],
                       dtype=np.float64)
        if info.discrete or len(v) < 2 or np.ptp(v) == 0:
            out.append(0.0)
            continue
        try:
            out.append(float(bandwidth(v, method)))
        except (InputError, ValueError):
            out.append(float(bandwidth(v, "silverman")))
    return out


def _stored_bytes(con: Connector, *tables: str) -> int:
    """Uncompressed bytes of the synopsis tables: rows times the width of their column types."""
    width = {"BIGINT": 8, "DOUBLE": 8, "INTEGER": 4, "SMALLINT": 2}
    total = 0
    for t in tables:
        schema, name = t.split(".")
        cols = con.fetch_rows("SELECT data_type FROM duckdb_columns() WHERE schema_name = ? AND table_name = ?",
                              [schema, name])
        rows = con.fetch_rows(f"SELECT count(*) FROM {t}")[0][0]
        total += int(rows) * sum(width.get(c[0], 8) for c in cols)
    return total
