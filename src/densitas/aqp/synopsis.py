"""A synopsis in memory, and the estimators that answer a query from it.

**Grid estimator (default).** For a query with predicate box ``B`` on the column set ``S`` and an aggregated
value ``y`` (1 for COUNT(*), the column for SUM, its non-NULL indicator for COUNT(col)), the answer is
``T = Σ_rows y·1_B(x)``. The grid of ``S`` holds exact per-cell totals ``Y_k``; within a cell the box covers a
fraction ``f_k(B)`` of the cell's mass, the product over the cell's dimensions of the share of the fine
one-dimensional histogram of that column (exact counts, bins as fine as the distinct values allow) that lies in
``B``, and inside a fine bin the mass is spread uniformly over the bin's extent: the closed-form integral of a
box kernel the width of the bin. ``Σ_k f_k(B)·Y_k`` is exact for cells inside or outside the box and an
approximation on the cells it cuts. A uniform stratified sample corrects that approximation without bias
(the difference or "GREG" estimator of survey sampling)::

    T̂ = Σ_k f_k(B)·Y_k + (N_g/n_g)·Σ_{i in sample} y_i·(1_B(x_i) − f_{k(i)}(B))

per group ``g``. The correction is non-zero only for sample rows in cut cells, so its variance is that of
those rows alone, small next to plain sampling, and it gives the confidence interval (normal, with the finite
population correction; AVG by the delta method on SUM/COUNT).

**KDE estimator** (``method="kde"``; documents 000 and 003). Each sample row carries a Gaussian kernel with the
column's ``densitas.kde`` bandwidth, truncated to the column's range so that no mass leaks out of it (discrete
columns keep point masses); the answer is ``(N/n)·Σ_i y_i·Π_j ∫_{B_j} K_j(x − x_ij) dx`` in closed form. It
is kept for comparison: on the same budget the grid estimator is several times more accurate
(benchmarks/RESULTS.md).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.special import ndtr, ndtri

from densitas.aqp.build import SCHEMA
from densitas.aqp.columns import ColumnInfo, to_number
from densitas.aqp.connector import Connector
from densitas.aqp.sql import Condition, Query
from densitas.exceptions import InputError, UnsupportedQueryError

__all__ = ["Synopsis", "load", "z_value"]


@dataclass
class Grid:
    cols: tuple[int, ...]
    res: tuple[int, ...]
    maps: list[np.ndarray]  # per dimension: fine bin (0..B) -> cell index (0..res)
    values: np.ndarray  # (G, res_0 + 1, ..., V) dense totals; index 0 of each dimension is the NULL cell


class Synopsis:
    """Loaded synopsis of one table (see :mod:`densitas.aqp.build`)."""

    def __init__(self, meta: dict, infos: list[ColumnInfo], groups: pd.DataFrame, grids: dict,
                 sample_gid: np.ndarray, sample_vals: np.ndarray) -> None:
        self.meta = meta
        self.table = meta["table_name"]
        self.infos = infos
        self.index = {info.name: j for j, info in enumerate(infos)}
        self.group_by: list[str] = json.loads(meta["group_by"])
        self.groups = groups  # gid order: group columns + n
        self.N = groups["n"].to_numpy(dtype=np.float64)
        self.grids: dict[tuple[int, ...], Grid] = grids
        numeric = [j for j, i in enumerate(infos) if i.numeric]
        nullable = [j for j in numeric if infos[j].nullable]
        self.value_index = {("n", None): 0}
        for p, j in enumerate(numeric):
            self.value_index[("s", j)] = 1 + p
        for p, j in enumerate(nullable):
            self.value_index[("nn", j)] = 1 + len(numeric) + p
        self.bandwidths = json.loads(meta.get("bandwidths") or "[]")
        # the sample, sorted by group; values NaN where NULL; fine bins as the SQL ASOF join assigned them
        order = np.argsort(sample_gid, kind="stable")
        self.s_gid = sample_gid[order].astype(np.int64)
        self.s_vals = sample_vals[order]
        self.s_bins = np.zeros(self.s_vals.shape, dtype=np.int64)
        for j, info in enumerate(infos):
            v = self.s_vals[:, j]
            ok = ~np.isnan(v)
            self.s_bins[ok, j] = np.searchsorted(info.edges, v[ok], side="right")
        self.n = np.bincount(self.s_gid, minlength=len(self.N)).astype(np.float64)
        self.s_start = np.concatenate([[0], np.cumsum(self.n)]).astype(np.int64)
        self.fine = {j: grids[(j,)].values[..., 0] for j in range(len(infos))}  # (G, B_j + 1) exact counts

    # ---- query resolution -------------------------------------------------------------------------------
    def size_bytes(self) -> int:
        return int(self.meta["size_bytes"])

    def _box(self, q: Query) -> tuple[dict[int, list[tuple[float, bool, float, bool]]], np.ndarray]:
        """Per synopsis column, the condition's interval(s) as (lo, lo_inclusive, hi, hi_inclusive); and the
        mask of groups the categorical conditions keep."""
        box: dict[int, list] = {}
        gmask = np.ones(len(self.N), dtype=bool)
        for c in q.conditions:
            if c.column in self.index:
                j = self.index[c.column]
                ivals = self._intervals(self.infos[j], c)
                box[j] = ivals if j not in box else _intersect(box[j], ivals)
            elif c.column in self.group_by:
                vals = c.value if c.op == "in" else (c.value,)
                if c.op not in ("=", "in"):
                    raise UnsupportedQueryError(f"{c.op!r} on the categorical column {c.column!r} ({c.sql!r}); "
                                                "categorical columns take = and IN")
                col = self.groups[c.column]
                keep = np.zeros(len(self.N), dtype=bool)
                for v in vals:
                    keep |= _matches(col, v)
                gmask &= keep
            else:
                raise UnsupportedQueryError(self._missing(c.column, "WHERE"))
        return box, gmask

    def _count_key(self, column: str | None) -> tuple[str, int | None]:
        """Which stored total counts the rows an aggregate of ``column`` sees (non-NULL rows)."""
        if column is None:
            return ("n", None)
        j = self.index[column]
        return ("nn", j) if self.infos[j].nullable else ("n", None)

    def _missing(self, column: str, where: str) -> str:
        return (f"column {column!r} in {where} is not in the synopsis of {self.table!r} (synopsis columns: "
                f"{[i.name for i in self.infos]}; group_by: {self.group_by}); rebuild with it or use "
                "fallback='exact'")

    def _intervals(self, info: ColumnInfo, c: Condition) -> list[tuple[float, bool, float, bool]]:
        where = f"WHERE {c.sql!r}"
        if c.op == "in":
            pts = [to_number(info, v, where) for v in c.value]
            return [(p, True, p, True) for p in sorted(set(pts))]
        v = to_number(info, c.value, where)
        return [{"<": (-math.inf, False, v, False), "<=": (-math.inf, False, v, True),
                 ">": (v, False, math.inf, False), ">=": (v, True, math.inf, False),
                 "=": (v, True, v, True)}[c.op]]

    def _fractions(self, j: int, ivals: list) -> np.ndarray:
        """(G, B_j + 1): the share of each fine bin's rows that satisfy the condition (bin 0, NULL, never)."""
        info = self.infos[j]
        e = info.edges
        if info.discrete:
            f = np.zeros(len(e) + 1)
            for lo, loi, hi, hii in ivals:
                ok = ((e > lo) | ((e == lo) & loi)) & ((e < hi) | ((e == hi) & hii))
                f[1:] += ok
            return np.broadcast_to(np.minimum(f, 1.0), (len(self.N), len(e) + 1))
        upper = info.uppers()
        width = upper - e
        f = np.zeros(len(e) + 1)
        for lo, loi, hi, hii in ivals:
            L, U = _half_open(info, lo, loi, hi, hii)
            f[1:] += np.clip(np.minimum(upper, U) - np.maximum(e, L), 0.0, None) / width
        return np.broadcast_to(np.minimum(f, 1.0), (len(self.N), len(e) + 1))

    def _row_match(self, j: int, ivals: list, v: np.ndarray) -> np.ndarray:
        ok = np.zeros(v.shape, dtype=bool)
        for lo, loi, hi, hii in ivals:
            ok |= ((v > lo) | ((v == lo) & loi)) & ((v < hi) | ((v == hi) & hii))
        return ok  # NaN (NULL) compares false

    # ---- estimation -----------------------------------------------------------------------------------------
    def estimate(self, q: Query, method: str = "grid") -> tuple[pd.DataFrame, list[dict]]:
        """Per output group (rows of the returned frame), per aggregate: estimate and variance."""
        for g in q.group_by:
            if g not in self.group_by:
                raise UnsupportedQueryError(self._missing(g, "GROUP BY"))
        box, gmask = self._box(q)
        cols = tuple(sorted(box))
        if len(cols) > 3 or (cols and cols not in self.grids and method == "grid"):
            raise UnsupportedQueryError(f"a predicate on {len(cols)} columns "
                                        f"({[self.infos[j].name for j in cols]}); this synopsis has grids on at "
                                        "most " + str(max(len(k) for k in self.grids)) + " columns")
        needs = []
        for a in q.aggregates:
            if a.column is None:
                needs.append(("n", None))
                continue
            if a.column not in self.index:
                raise UnsupportedQueryError(self._missing(a.column, f"{a.func.upper()}({a.column})"))
            j = self.index[a.column]
            info = self.infos[j]
            if a.func in ("sum", "avg") and not info.numeric:
                raise UnsupportedQueryError(f"{a.func.upper()} of the {info.kind} column {a.column!r}")
            nn = self._count_key(a.column)
            needs += [nn] if a.func == "count" else [("s", j), nn]
        keys = list(dict.fromkeys([("n", None), *needs]))  # row counts always: empty groups are dropped
        est, var_fn = (self._grid if method == "grid" else self._kde)(cols, box, keys)

        # output groups
        gids = np.flatnonzero(gmask)
        if q.group_by:
            labels = self.groups.loc[gids, list(q.group_by)].reset_index(drop=True)
            codes = labels.groupby(list(q.group_by), dropna=False, sort=True).ngroup().to_numpy()
            out = labels.drop_duplicates().assign(_c=codes[~labels.duplicated().to_numpy()])
            out = out.sort_values("_c").drop(columns="_c").reset_index(drop=True)
        else:
            codes = np.zeros(len(gids), dtype=np.int64)
            out = pd.DataFrame(index=[0])
        m = len(out)
        results = []
        for a in q.aggregates:
            if a.func == "count":
                k = keys.index(self._count_key(a.column))
                val = np.bincount(codes, est[gids, k], minlength=m)
                v = np.bincount(codes, var_fn(gids, [k], [1.0]), minlength=m)
                results.append({"alias": a.alias, "func": "count", "value": val, "var": v, "count": val})
                continue
            j = self.index[a.column]
            ks, kn = keys.index(("s", j)), keys.index(self._count_key(a.column))
            tot = np.bincount(codes, est[gids, ks], minlength=m)
            cnt = np.bincount(codes, est[gids, kn], minlength=m)
            if a.func == "sum":
                v = np.bincount(codes, var_fn(gids, [ks], [1.0]), minlength=m)
                results.append({"alias": a.alias, "func": "sum", "value": tot, "var": v, "count": cnt})
                continue
            with np.errstate(divide="ignore", invalid="ignore"):
                avg = tot / cnt
                # delta method: the residual of SUM − AVG·COUNT, with the output group's AVG
                v = np.array([var_fn(gids[codes == o], [ks, kn], [1.0, -avg[o]]).sum() / cnt[o] ** 2
                              for o in range(m)])
            results.append({"alias": a.alias, "func": "avg", "value": avg, "var": v, "count": cnt})
        if q.group_by:  # SQL has no row for a group without matching rows: drop groups surely empty
            rows = np.bincount(codes, est[gids, 0], minlength=m)
            rvar = np.bincount(codes, var_fn(gids, [0], [1.0]), minlength=m)
            keep = (rows >= 0.5) | (rvar > 0)
            out = out[keep].reset_index(drop=True)
            for r in results:
                for k in ("value", "var", "count"):
                    r[k] = np.asarray(r[k])[keep]
        return out, results

    def _grid(self, cols, box, keys):
        """Per group (G, len(keys)) estimates, and a function giving per-group variances of linear combinations."""
        G = len(self.N)
        vidx = [self.value_index[k] for k in keys]
        if not cols:
            tot = self.grids[()].values[:, vidx]
            return tot, lambda gids, ks, ws: np.zeros(len(gids))
        grid = self.grids[cols]
        fr = []
        for d, j in enumerate(cols):
            f = self._fractions(j, box[j])  # (G, B+1) share per fine bin
            w = self.fine[j]
            if grid.res[d] >= self.infos[j].bins:
                fr.append(f)
            else:  # a coarse cell's share: the fine histogram's rows in the box over the cell's rows
                idx = grid.maps[d]
                num = np.zeros((G, grid.res[d] + 1))
                den = np.zeros((G, grid.res[d] + 1))
                for g in range(G):
                    num[g] = np.bincount(idx, w[g] * f[g], minlength=grid.res[d] + 1)
                    den[g] = np.bincount(idx, w[g], minlength=grid.res[d] + 1)
                with np.errstate(invalid="ignore", divide="ignore"):
                    fr.append(np.where(den > 0, num / np.where(den > 0, den, 1), 0.0))
        vals = grid.values[..., vidx]
        model = vals
        for f in fr:  # contract one dimension at a time: (G, c0, c1, ..., V) -> (G, ..., V)
            model = np.einsum("gc...,gc->g...", model, f)
        # sample correction
        sv = self.s_vals
        inside = np.ones(len(sv), dtype=bool)
        q = np.ones(len(sv))
        for d, j in enumerate(cols):
            inside &= self._row_match(j, box[j], sv[:, j])
            cell = grid.maps[d][self.s_bins[:, j]]
            q *= fr[d][self.s_gid, cell]
        y = self._sample_values(keys)  # (n, K)
        r = y * (inside.astype(np.float64) - q)[:, None]
        scale = self.N / np.maximum(self.n, 1)
        corr = np.zeros((G, len(keys)))
        np.add.at(corr, self.s_gid, r)
        est = model + corr * scale[:, None]
        # variance floor for groups with few rows in cut cells: the Bernoulli variance of the model itself
        cut = (q > 0) & (q < 1)
        cut_n = np.bincount(self.s_gid, cut.astype(np.float64), minlength=G)
        floor: dict[str, np.ndarray] = {}

        def variance_floor() -> np.ndarray:
            """Model variance × E[y²]/E[y]² (the within-cell spread cell means miss); only computed when a
            group has too few sample rows in cut cells, so off the common path."""
            if not floor:
                sy = np.zeros((G, len(keys)))
                sy2 = np.zeros((G, len(keys)))
                np.add.at(sy, self.s_gid, y)
                np.add.at(sy2, self.s_gid, y * y)
                with np.errstate(invalid="ignore", divide="ignore"):
                    ratio = np.nan_to_num(sy2 * np.maximum(self.n, 1)[:, None] / sy**2, nan=1.0, posinf=1.0)
                floor["v"] = self._model_var(grid, fr, vidx) * ratio
            return floor["v"]

        def var_fn(gids, ks, ws):
            out = np.zeros(len(gids))
            for t, g in enumerate(gids):
                a, b = self.s_start[g], self.s_start[g + 1]
                n_g = b - a
                if n_g < 2:
                    continue
                u = sum(w * r[a:b, k] for k, w in zip(ks, ws, strict=True))
                fpc = max(0.0, 1.0 - n_g / self.N[g])
                s2 = u.var(ddof=1)
                if cut_n[g] < 30:  # too few sample rows in cut cells to trust s2 alone
                    fl = variance_floor()
                    mv = sum(w * w * fl[g, k] for k, w in zip(ks, ws, strict=True))
                    s2 = max(s2, mv / self.N[g])
                out[t] = self.N[g] ** 2 * s2 / n_g * fpc
            return out

        return est, var_fn

    def _model_var(self, grid: Grid, fr: list[np.ndarray], vidx: list[int]) -> np.ndarray:
        """Σ_k f_k(1 − f_k)·Y_k²/C_k per group and value: the Bernoulli variance of membership in cut cells."""
        G = len(self.N)
        f = np.ones((G, *tuple(r + 1 for r in grid.res)))
        for d, fd in enumerate(fr):
            shape = [G] + [1] * len(grid.res)
            shape[1 + d] = -1
            f = f * fd.reshape(shape)
        counts = grid.values[..., 0]
        with np.errstate(invalid="ignore", divide="ignore"):
            out = np.zeros((G, len(vidx)))
            for t, v in enumerate(vidx):
                y2 = np.where(counts > 0, grid.values[..., v] ** 2 / np.where(counts > 0, counts, 1), 0.0)
                out[:, t] = (f * (1 - f) * y2).reshape(G, -1).sum(axis=1)
        return out

    def _sample_values(self, keys) -> np.ndarray:
        y = np.empty((len(self.s_vals), len(keys)))
        for t, (kind, j) in enumerate(keys):
            if kind == "n":
                y[:, t] = 1.0
            elif kind == "s":
                y[:, t] = np.nan_to_num(self.s_vals[:, j], nan=0.0)
            else:
                y[:, t] = ~np.isnan(self.s_vals[:, j])
        return y

    def _kde(self, cols, box, keys):
        G = len(self.N)
        sv = self.s_vals
        w = np.ones(len(sv))
        for j in cols:
            info = self.infos[j]
            v = sv[:, j]
            if info.discrete or self.bandwidths[j] <= 0:
                w = w * self._row_match(j, box[j], v)
                continue
            h = self.bandwidths[j]
            lo_b, hi_b = info.lo, info.top
            mass = np.zeros(len(v))
            for lo, loi, hi, hii in box[j]:
                L, U = _half_open(info, lo, loi, hi, hii)
                L, U = max(L, lo_b), min(U, hi_b)
                if U > L:
                    mass += ndtr((U - v) / h) - ndtr((L - v) / h)
            norm = ndtr((hi_b - v) / h) - ndtr((lo_b - v) / h)  # truncated to the column's range
            with np.errstate(invalid="ignore", divide="ignore"):
                w = w * np.nan_to_num(mass / norm, nan=0.0)
        y = self._sample_values(keys) * w[:, None]
        scale = self.N / np.maximum(self.n, 1)
        tot = np.zeros((G, len(keys)))
        np.add.at(tot, self.s_gid, y)
        est = tot * scale[:, None]

        def var_fn(gids, ks, ws):
            out = np.zeros(len(gids))
            for t, g in enumerate(gids):
                a, b = self.s_start[g], self.s_start[g + 1]
                if b - a < 2:
                    continue
                u = sum(wk * y[a:b, k] for k, wk in zip(ks, ws, strict=True))
                out[t] = self.N[g] ** 2 * u.var(ddof=1) / (b - a) * max(0.0, 1 - (b - a) / self.N[g])
            return out

        return est, var_fn


def _half_open(info: ColumnInfo, lo: float, loi: bool, hi: float, hii: bool) -> tuple[float, float]:
    """The condition as [L, U) on the column's line, where a value v occupies [v, v + step)."""
    s = info.step
    if s > 0:
        if math.isfinite(lo):
            L = math.ceil(lo / s - 1e-9) * s if loi else (math.floor(lo / s + 1e-9) + 1) * s
        else:
            L = -math.inf
        if math.isfinite(hi):
            U = (math.floor(hi / s + 1e-9) + 1) * s if hii else math.ceil(hi / s - 1e-9) * s
        else:
            U = math.inf
        return L, U
    if lo == hi and loi and hii:
        return lo, float(np.nextafter(lo, np.inf))
    return lo, hi


def _intersect(a: list, b: list) -> list:
    out = []
    for lo1, li1, hi1, hi1i in a:
        for lo2, li2, hi2, hi2i in b:
            lo, li = (lo1, li1) if lo1 > lo2 else (lo2, li2) if lo2 > lo1 else (lo1, li1 and li2)
            hi, hii = (hi1, hi1i) if hi1 < hi2 else (hi2, hi2i) if hi2 < hi1 else (hi1, hi1i and hi2i)
            if lo < hi or (lo == hi and li and hii):
                out.append((lo, li, hi, hii))
    return out


def _matches(col: pd.Series, value: object) -> np.ndarray:
    try:
        return (col == value).to_numpy(dtype=bool, na_value=False)
    except (TypeError, ValueError):
        return np.zeros(len(col), dtype=bool)


def z_value(confidence: float) -> float:
    return float(ndtri(0.5 + confidence / 2))


def load(con: Connector, table: str) -> Synopsis:
    """Read the synopsis of ``table`` from the database (raises InputError naming the table when none)."""
    try:
        rows = con.fetch_df(f"SELECT * FROM {SCHEMA}.synopses WHERE table_name = ?", [table])
    except Exception:
        rows = pd.DataFrame()
    if rows.empty:
        raise InputError(f"table {table!r} has no synopsis; build one first (densitas build / Engine.build).")
    meta = rows.iloc[0].to_dict()
    sid = meta["id"]
    col_dicts = json.loads(meta["columns"])
    edges = con.fetch_df(f"SELECT col, bin, lo FROM {SCHEMA}.edges_{sid} ORDER BY col, bin")
    infos = []
    for j, d in enumerate(col_dicts):
        infos.append(ColumnInfo.from_dict(d, edges.loc[edges["col"] == j, "lo"].to_numpy(dtype=np.float64)))
    groups = con.fetch_df(f"SELECT * FROM {SCHEMA}.groups_{sid} ORDER BY gid").drop(columns="gid")
    cells = con.fetch_numpy(f"SELECT * FROM {SCHEMA}.cells_{sid}")
    G = len(groups)
    value_names = [c for c in cells if c not in ("grid", "gid", "c0", "c1", "c2")]
    V = np.stack([np.asarray(cells[c], dtype=np.float64) for c in value_names], axis=1) if len(cells["grid"]) else \
        np.zeros((0, len(value_names)))
    grid_ids = np.asarray(cells["grid"])
    gid = np.asarray(cells["gid"], dtype=np.int64)
    grids: dict[tuple[int, ...], Grid] = {}
    for g in json.loads(meta["grids"]):
        cols, res = tuple(g["cols"]), tuple(g["res"])
        sel = grid_ids == g["id"]
        vals = np.zeros((G, *tuple(r + 1 for r in res), len(value_names)))
        idx = [gid[sel]] + [np.asarray(cells[f"c{d}"])[sel].astype(np.int64) for d in range(len(cols))]
        np.add.at(vals, tuple(idx), V[sel])
        maps = []
        for j, r in zip(cols, res, strict=True):
            b = infos[j].bins
            fine = np.arange(b + 1)
            maps.append(fine if r >= b else np.where(fine == 0, 0, 1 + (fine - 1) * r // b))
        grids[cols] = Grid(cols, res, maps, vals)
    sample = con.fetch_numpy(f"SELECT * FROM {SCHEMA}.sample_{sid}")
    s_gid = np.asarray(sample["gid"], dtype=np.int64)
    cols_v = []
    for j in range(len(infos)):
        a = sample[f"v{j}"]
        cols_v.append(np.ma.filled(a.astype(np.float64), np.nan) if np.ma.isMaskedArray(a)
                      else np.asarray(a, dtype=np.float64))
    s_vals = np.stack(cols_v, axis=1) if cols_v else np.zeros((len(s_gid), 0))
    if len(infos) == 0:
        raise InputError(f"synopsis of {table!r} has no columns")
    return Synopsis(meta, infos, groups, grids, s_gid, s_vals)
