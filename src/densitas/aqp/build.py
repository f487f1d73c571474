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
  storage). Independent pairs cost nothing;
* a seeded, stratified random sample of rows, which checks the model for bias on every query and feeds the
  KDE estimator (see :mod:`densitas.aqp.synopsis`).

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
import pandas as pd

from densitas.aqp.columns import ColumnInfo, classify
from densitas.aqp.connector import Connector, quote, table_ref
from densitas.exceptions import DensitasError, InputError

__all__ = ["BuildOptions", "build", "ensure_schema", "fingerprint_sql"]

SCHEMA = "densitas"
FORMAT_VERSION = 3
KINDS = ("marg", "sums", "pairs", "sample", "edges", "groups")
# bin, cell and group numbers are stored as SMALLINT: BuildOptions keeps max_bins and max_groups (and with them
# every bin, cell and group id) within its range
INDEX_MAX = 32767


@dataclass
class BuildOptions:
    budget_bytes: int | None = None  # None: budget_fraction of the table's storage
    budget_fraction: float = 0.01
    min_budget_bytes: int = 256 * 1024
    max_bins: int = 4096  # most bins of a column (its distinct values when it has no more)
    max_pair_res: int = 256  # finest resolution of a pair grid, per dimension
    min_dependence: float = 0.002  # pairs whose probe dependence score is lower get no grid
    sample_size: int | None = None  # None: from the budget, at most max_sample_rows
    # a query reads every sample row (the regression estimator), so its latency grows with the sample: beyond
    # this many rows the budget's sample share is left unused and a query costs what it costs at TPC-H SF1
    max_sample_rows: int = 32_768
    max_groups: int = 1000
    seed: int = 0
    bandwidth: str = "plugin"  # densitas.kde method for the KDE estimator's per-column bandwidths
    # budget shares: sample, 1-D histograms, sum grids, pair grids (what the others leave goes to the sample);
    # chosen on the tuning tables (lineitem, synthetic, fertility) among (.15,.3,.2,.35), (.5,.15,.1,.25) and these
    shares: tuple[float, float, float, float] = (0.70, 0.10, 0.05, 0.15)

    def check(self) -> None:
        if self.budget_bytes is not None and (not isinstance(self.budget_bytes, int) or self.budget_bytes <= 0):
            raise InputError(f"budget_bytes must be a positive integer, got {self.budget_bytes!r}.")
        if not 0 < self.budget_fraction <= 1:
            raise InputError(f"budget_fraction must be in (0, 1], got {self.budget_fraction!r}.")
        if isinstance(self.max_bins, bool) or not isinstance(self.max_bins, int) \
                or not 2 <= self.max_bins <= INDEX_MAX:
            raise InputError(f"The 'max_bins' parameter of BuildOptions must be an integer in [2, {INDEX_MAX}] "
                             f"(bin numbers are stored as SMALLINT). Got {self.max_bins!r} instead.")
        if not isinstance(self.max_pair_res, int) or not 2 <= self.max_pair_res <= 4096:
            raise InputError(f"max_pair_res must be an integer in [2, 4096], got {self.max_pair_res!r}.")
        if not 0 <= self.min_dependence < 1:
            raise InputError(f"min_dependence must be in [0, 1), got {self.min_dependence!r}.")
        if (len(self.shares) != 4 or any(not 0 <= x <= 1 for x in self.shares)
                or not 0.99 <= sum(self.shares) <= 1.01):
            raise InputError(f"shares must be four fractions summing to 1, got {self.shares!r}.")
        if isinstance(self.max_sample_rows, bool) or not isinstance(self.max_sample_rows, int) \
                or self.max_sample_rows < 10:
            raise InputError("The 'max_sample_rows' parameter of BuildOptions must be an integer >= 10. "
                             f"Got {self.max_sample_rows!r} instead.")
        if self.sample_size is not None and (not isinstance(self.sample_size, int) or self.sample_size < 10):
            raise InputError(f"sample_size must be an integer >= 10, got {self.sample_size!r}.")
        if isinstance(self.max_groups, bool) or not isinstance(self.max_groups, int) \
                or not 1 <= self.max_groups <= INDEX_MAX:
            raise InputError(f"The 'max_groups' parameter of BuildOptions must be an integer in [1, {INDEX_MAX}] "
                             f"(group ids are stored as SMALLINT). Got {self.max_groups!r} instead.")


def ensure_schema(con: Connector) -> None:
    con.execute(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")
    con.execute(f"""CREATE TABLE IF NOT EXISTS {SCHEMA}.synopses (
        table_name VARCHAR PRIMARY KEY, id VARCHAR, version INTEGER, created_at TIMESTAMP, build_seconds DOUBLE,
        rows BIGINT, fingerprint VARCHAR, columns VARCHAR, group_by VARCHAR, grids VARCHAR, options VARCHAR,
        bandwidths VARCHAR, size_bytes BIGINT, table_bytes BIGINT)""")


def _row_id(con: Connector, src: str) -> str:
    """``rowid`` where ``src`` is a base table (stable row ids), else NULL."""
    try:
        con.fetch_rows(f"SELECT rowid FROM {src} LIMIT 0")
    except DensitasError:
        return "NULL::BIGINT"
    return "rowid"


def fingerprint_sql(table: str, columns: Sequence[str]) -> str:
    """SQL of the data fingerprint: row count and an order-independent hash of the synopsis columns."""
    cols = ", ".join(quote(c) for c in columns)
    return f"SELECT count(*), bit_xor(hash({cols})) FROM {table_ref(table)}"


MARG_CELL_BYTES = 2 + 2 + 2 + 4 + 8  # col, gid, bin, n, s
PAIR_CELL_BYTES = 2 + 2 + 2 + 2 + 4  # pair, gid, c0, c1, n
EDGE_BYTES = 4 + 4 + 8 + 8 + 8  # col, bin, lo, vmin, vmax
# tables with more rows take their quantile edges from a seeded hash sample of about this many rows
QUANTILE_SAMPLE_ROWS = 2_000_000
PROBE_RES = 16


def _marginal_bins(infos: list[ColumnInfo], n_groups: int, opts: BuildOptions, budget: int) -> list[int]:
    """Bins per column: the 1-D share of the budget split evenly (dense estimate); columns with fewer distinct
    values than their share hand the slack to the others."""
    k = len(infos)
    per_col = opts.shares[1] * budget / (k * (n_groups * MARG_CELL_BYTES + EDGE_BYTES))
    cards = [min(info.distinct, opts.max_bins) for info in infos]
    bins = list(cards)
    slack_cols = [i for i in range(k) if cards[i] > per_col]
    spare = sum(per_col - cards[i] for i in range(k) if cards[i] <= per_col)
    for i in slack_cols:
        bins[i] = int(max(16, min(cards[i], per_col + spare / max(len(slack_cols), 1))))
    return bins


def _levels(bins: int, top: int) -> list[int]:
    """Candidate resolutions of one dimension of a pair grid: powers of two below ``bins``, then ``bins`` itself
    (the fine bins) when it is at most ``top``."""
    out = [r for r in (4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096) if r < bins and r <= top]
    if bins <= top:
        out.append(bins)
    return out or [min(bins, top)]


def cell_map(res: int, bins: int) -> np.ndarray:
    """Fine bin (0 = NULL, 1..bins) -> cell (0 = NULL, 1..res) of a grid dimension of resolution ``res``. Maps of
    powers of two nest, so a finer grid coarsens to a coarser one by summing."""
    fine = np.arange(bins + 1)
    if res >= bins:
        return fine
    return np.where(fine == 0, 0, 1 + (fine - 1) * res // bins)


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

    budget = opts.budget_bytes or max(opts.min_budget_bytes, int(opts.budget_fraction * table_bytes))
    bins = _marginal_bins(infos, n_groups, opts, budget)

    # 3. bin edges: distinct values of discrete columns, quantiles otherwise
    say("bins", 0.15)
    # one scan computes every column's distinct values (discrete) or quantiles (the others)
    aggs, nqs = [], {}
    for j, info in enumerate(infos):
        info.discrete = info.distinct <= bins[j]
        if info.discrete:
            aggs.append(f"list(DISTINCT {info.expr} ORDER BY {info.expr}) "
                        f"FILTER (WHERE {quote(info.name)} IS NOT NULL)")
        else:
            # half the edges at quantiles (equal mass), half evenly spaced between the 0.1% and 99.9% quantiles:
            # quantile bins alone grow wide, and their uniform spread poor, where the density is low
            nqs[j] = (bins[j] + 1) // 2
            qs = ", ".join(repr(i / nqs[j]) for i in range(nqs[j]))
            aggs.append(f"quantile_disc({info.expr}, [{qs}, 0.001, 0.999])")
    # quantile edges of a large table come from a seeded sample of its rows (sorting every value of every column
    # is most of a 60 M-row build); an edge need not be an exact quantile, the histograms stay exact
    qcols = [j for j in range(len(infos)) if not infos[j].discrete]
    big = n_rows > QUANTILE_SAMPLE_ROWS and qcols
    full = [a for j, a in enumerate(aggs) if not big or infos[j].discrete]
    got_full = iter(con.fetch_rows(f"SELECT {', '.join(full)} FROM {src}")[0]) if full else iter(())
    if big:  # about QUANTILE_SAMPLE_ROWS rows by a seeded hash of the row id: the same rows whatever the threads
        rid = _row_id(con, src)
        keep = f"hash({rid}, {int(opts.seed) + 7919}) % {math.ceil(n_rows / QUANTILE_SAMPLE_ROWS)} = 0" \
            if rid == "rowid" else "true"
        got_q = iter(con.fetch_rows(f"SELECT {', '.join(aggs[j] for j in qcols)} FROM {src} WHERE {keep}")[0])
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

    syn_id = uuid.uuid4().hex[:12]
    marg_t, sums_t, pairs_t, sample_t, edges_t, groups_t = (f"{SCHEMA}.{kind}_{syn_id}" for kind in KINDS)
    old = con.fetch_rows(f"SELECT id FROM {SCHEMA}.synopses WHERE table_name = ?", [table])
    with con.transaction():
        # 4. group ids and edge tables (temporary), then every row's bins (one ASOF JOIN per column)
        if group_by:
            gsel = ", ".join(quote(g) for g in group_by)
            con.execute(f"CREATE TABLE {groups_t} AS SELECT row_number() OVER (ORDER BY {gsel}) - 1 AS gid, * "
                        f"FROM (SELECT {gsel}, count(*) AS n FROM {src} GROUP BY {gsel})")
        else:
            con.execute(f"CREATE TABLE {groups_t} AS SELECT 0 AS gid, count(*) AS n FROM {src}")
        con.execute(f"CREATE TABLE {edges_t} (col INTEGER, bin INTEGER, lo DOUBLE, vmin DOUBLE, vmax DOUBLE)")
        for j, info in enumerate(infos):
            con.execute(f"INSERT INTO {edges_t} SELECT {j}, unnest(range(1, {info.bins + 1})), unnest(?::DOUBLE[]), "
                        "NULL, NULL", [info.edges.tolist()])
        say("binning rows", 0.2)
        sel = [f"{info.expr} AS v{j}" for j, info in enumerate(infos)]
        sel += [quote(g) for g in group_by]
        # the sample hashes the table's own row ids, so that a seed draws the same rows whatever the threads do
        # (a view has none: then the binned copy's row ids, which follow the scan's order)
        rid = _row_id(con, src)
        sel.append(f"{rid} AS _densitas_rid")
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
        con.execute(f"CREATE TEMP TABLE _densitas_binned AS SELECT {gid} AS gid, {', '.join(bins_sel)}, {vals}, "
                    "s._densitas_rid "
                    f"FROM (SELECT {', '.join(sel)} FROM {src}) s {gjoin} {' '.join(joins)}")

        # 5. fine 1-D histograms: exact count and sum per (group, bin)
        con.execute(f"CREATE TABLE {marg_t} (col SMALLINT, gid SMALLINT, bin SMALLINT, n INTEGER, s DOUBLE)")
        for j in range(len(infos)):
            con.execute(f"INSERT INTO {marg_t} SELECT {j}, gid, b{j}, count(*), sum(v{j}) FROM _densitas_binned "
                        "GROUP BY ALL")
            # each bin's occupied range over the whole table: the model spreads the bin's rows over it
            con.execute(f"UPDATE {edges_t} SET vmin = m.vmin, vmax = m.vmax FROM (SELECT b{j} AS bin, "
                        f"min(v{j}) AS vmin, max(v{j}) AS vmax FROM _densitas_binned WHERE b{j} > 0 GROUP BY ALL) m "
                        f"WHERE {edges_t}.col = {j} AND {edges_t}.bin = m.bin")

        # 5b. sum grids: per column, per (group, cell), the count and every numeric column's sum and non-NULL
        # count (SUM/AVG of one column under predicates on another)
        numeric = [j for j, info in enumerate(infos) if info.numeric]
        nullable = [j for j in numeric if infos[j].nullable]
        value_cols = ["n INTEGER"] + [f"s{j} DOUBLE" for j in numeric] + [f"nn{j} INTEGER" for j in nullable]
        value_sql = ["count(*)"] + [f"sum(v{j})" for j in numeric] + [f"count(v{j})" for j in nullable]
        sum_cell = 2 + 2 + 2 + 4 + 8 * len(numeric) + 4 * len(nullable)
        per_col = opts.shares[2] * budget / (len(infos) * n_groups * sum_cell)
        sum_res = []
        for j in range(len(infos)):
            levels = _levels(bins[j], 4096)
            sum_res.append(max([r for r in levels if r <= per_col], default=levels[0]))
        con.execute(f"CREATE TABLE {sums_t} (col SMALLINT, gid SMALLINT, cell SMALLINT, {', '.join(value_cols)})")
        for j in range(len(infos)):
            con.execute(f"INSERT INTO {sums_t} SELECT {j}, gid, {_coarse_sql(j, sum_res[j], bins[j])}, "
                        f"{', '.join(value_sql)} FROM _densitas_binned GROUP BY ALL")

        # 6. dependence of every pair on a 16 x 16 probe grid, then grids for the dependent pairs
        say("dependence", 0.4)
        k = len(infos)
        pairs_all = list(itertools.combinations(range(k), 2))
        scores: dict[tuple[int, int], float] = {}
        if pairs_all:
            probe = [min(PROBE_RES, bins[j]) for j in range(k)]
            pc = ", ".join(f"{_coarse_sql(j, probe[j], bins[j])} AS p{j}" for j in range(k))
            sets = ", ".join(f"(gid, p{a}, p{b})" for a, b in pairs_all)
            keys = ", ".join(f"p{j}" for j in range(k))
            rows = con.fetch_numpy(f"SELECT gid, {keys}, count(*) AS n FROM (SELECT gid, {pc} FROM "
                                   f"_densitas_binned) GROUP BY GROUPING SETS ({sets})")
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
                keep = (ca > 0) & (cb > 0)
                h = np.zeros((n_groups, probe[a_], probe[b_]))
                np.add.at(h, (gid_a[sel][keep], ca[keep] - 1, cb[keep] - 1), n_a[sel][keep])
                scores[(a_, b_)] = dependence(h)
        # the pair grids get what the histograms left (they are sparse), less the sample's share
        pair_budget = budget * (1 - opts.shares[0]) - _stored_bytes(con, marg_t, sums_t, edges_t, groups_t)
        chosen = _choose_pairs(con, infos, bins, scores, opts, pair_budget, say)
        con.execute(f"CREATE TABLE {pairs_t} (pair SMALLINT, gid SMALLINT, c0 SMALLINT, c1 SMALLINT, n INTEGER)")
        grid_list: list[dict] = []
        for pi, (pair, res, cells) in enumerate(chosen):
            frame = pd.DataFrame({"pair": np.full(len(cells[0]), pi, dtype=np.int16),
                                  "gid": cells[0].astype(np.int16), "c0": cells[1].astype(np.int16),
                                  "c1": cells[2].astype(np.int16), "n": cells[3].astype(np.int32)})
            con.insert_frame(pairs_t, frame)
            grid_list.append({"id": pi, "cols": list(pair), "res": list(res), "score": scores[pair]})
        used = _stored_bytes(con, marg_t, sums_t, pairs_t, edges_t, groups_t)
        n_sample = opts.sample_size or int(min(opts.max_sample_rows, max(2000, (budget - used) / (2 + 8 * k))))
        n_sample = min(n_sample, n_rows)

        # 6. the stratified sample: n_g proportional to the group's rows, at least min(N_g, 200)
        say("sample", 0.9)
        gsizes = np.array(con.fetch_rows(f"SELECT n FROM {groups_t} ORDER BY gid"), dtype=np.int64).ravel()

        def quotas(f: float) -> np.ndarray:
            return np.minimum(gsizes, np.maximum(np.minimum(gsizes, 200),
                                                 np.floor(f * n_sample * gsizes / gsizes.sum()).astype(np.int64)))

        lo_f, hi_f = 0.0, 1.0  # shrink the proportional part so that the floor of 200 rows keeps the budget
        for _ in range(30):
            mid = (lo_f + hi_f) / 2
            lo_f, hi_f = (mid, hi_f) if quotas(mid).sum() <= n_sample else (lo_f, mid)
        quota = quotas(1.0) if opts.sample_size or quotas(1.0).sum() <= n_sample else quotas(lo_f)
        # the first q_g rows of each group in a seeded hash order; a hash pre-filter keeps the sort small (it
        # passes about 2·q_g + 50 rows, and the q_g smallest hashes always pass it)
        frac = np.minimum(1.0, (2 * quota + 50) / np.maximum(gsizes, 1))
        con.execute("CREATE TEMP TABLE _densitas_quota AS SELECT unnest(range(?)) AS gid, unnest(?::BIGINT[]) AS q, "
                    "unnest(?::DOUBLE[]) AS frac", [len(quota), quota.tolist(), frac.tolist()])
        salt = int(opts.seed) * 7919 + 1
        hashed = (f"(SELECT b.*, hash(xor(hash(coalesce(b._densitas_rid, b.rowid)), {salt}::UBIGINT)) AS h "
                  "FROM _densitas_binned b)")
        for cond in ("(h >> 11)::DOUBLE / 9007199254740992.0 < frac", "true"):
            con.execute(f"CREATE OR REPLACE TABLE {sample_t} AS SELECT gid::SMALLINT AS gid, "
                        f"{vals.replace('s.', '')} FROM (SELECT *, row_number() OVER (PARTITION BY gid ORDER BY h) "
                        f"AS rn FROM {hashed} x JOIN _densitas_quota USING (gid) WHERE {cond}) t WHERE rn <= q "
                        "ORDER BY gid, rn")
            if con.fetch_rows(f"SELECT count(*) FROM {sample_t}")[0][0] >= quota.sum():
                break  # otherwise (vanishingly rare) the filter passed too few rows: draw without it
        con.execute("DROP TABLE _densitas_binned")
        con.execute("DROP TABLE _densitas_quota")

        # 7. per-column KDE bandwidths on the sample (densitas.kde; on the GPU when one is present)
        say("bandwidths", 0.95)
        bandwidths = _bandwidths(con, sample_t, infos, opts.bandwidth)

        size = _stored_bytes(con, marg_t, sums_t, pairs_t, sample_t, edges_t, groups_t)
        meta = {"table_name": table, "id": syn_id, "version": FORMAT_VERSION,
                "build_seconds": time.perf_counter() - t0, "rows": n_rows, "fingerprint": fingerprint,
                "columns": json.dumps([i.to_dict() for i in infos]), "group_by": json.dumps(group_by),
                "grids": json.dumps({"pairs": grid_list, "sum_res": sum_res, "scores": [[a, b, v] for (a, b), v in
                                                                     scores.items()]}),
                "options": json.dumps({"budget_bytes": budget,
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
            for kind in (*KINDS, "cells"):
                con.execute(f"DROP TABLE IF EXISTS {SCHEMA}.{kind}_{old_id}")
    say("done", 1.0)
    meta["build_seconds"] = time.perf_counter() - t0
    con.execute(f"UPDATE {SCHEMA}.synopses SET build_seconds = ? WHERE table_name = ?", [meta["build_seconds"],
                                                                                           table])
    return meta


def _choose_pairs(con: Connector, infos: list[ColumnInfo], bins: list[int], scores: dict, opts: BuildOptions,
                  budget: float, say: Callable[[str, float], None]) -> list:
    """The pair grids to store: ``[(pair, (res0, res1), (gid, c0, c1, n))]``. Dependent pairs (score at least
    ``min_dependence``) in decreasing score each get a grid, starting at 16 x 16 and doubling the resolution in
    rounds, most dependent first, while the sparse cell count (exact, from the finest grid GROUP BY computed in
    the database) fits the budget."""
    cand = sorted((p for p, v in scores.items() if v >= opts.min_dependence), key=lambda p: -scores[p])
    finest = {}
    for i, (a, b) in enumerate(cand):
        say(f"pair grid {i + 1}/{len(cand)}", 0.45 + 0.4 * i / max(len(cand), 1))
        ra, rb = (min(bins[j], opts.max_pair_res) for j in (a, b))
        rows = con.fetch_numpy(f"SELECT gid, {_coarse_sql(a, ra, bins[a])} AS x, {_coarse_sql(b, rb, bins[b])} AS y, "
                               "count(*) AS n FROM _densitas_binned GROUP BY ALL")
        finest[(a, b)] = ((ra, rb), tuple(np.asarray(rows[c], dtype=np.int64) for c in ("gid", "x", "y", "n")))
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
        size = len(cells[0]) * PAIR_CELL_BYTES
        if used + size <= budget:
            state[p] = (start[p], res, cells)
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
            extra = (len(ncells[0]) - len(cells[0])) * PAIR_CELL_BYTES
            if used + extra <= budget:
                state[p] = (li + 1, nres, ncells)
                used += extra
                grown = True
    return [(p, state[p][1], state[p][2]) for p in cand if p in state]


def _coarsen(c: np.ndarray, res_from: int, res_to: int, bins: int) -> np.ndarray:
    """Cells at resolution ``res_from`` -> the nesting cells at ``res_to`` (0, NULL, stays 0)."""
    if res_to >= res_from:
        return c
    if res_from >= bins:  # from fine bins
        return cell_map(res_to, bins)[c]
    return np.where(c == 0, 0, 1 + (c - 1) // (res_from // res_to))


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
        # selected on at most 4,000 rows, then rescaled to the sample size by the AMISE rate n^(-1/5)
        m = min(len(v), 4000)
        sub = v[np.linspace(0, len(v) - 1, m).astype(np.int64)]
        try:
            h = float(bandwidth(sub, method))
        except (InputError, ValueError):
            h = float(bandwidth(sub, "silverman"))
        out.append(h * (m / len(v)) ** 0.2)
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
