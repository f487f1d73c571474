"""A synopsis in memory, and the estimators that answer a query from it.

**Model estimator (default, ``method="grid"``).** A query with predicate box ``B`` over the column set ``S``
and aggregated value ``y`` (1 for COUNT(*), the column for SUM, its non-NULL indicator for COUNT(col)) asks
for ``T = Σ_rows y·1_B(x)`` per group. The synopsis models each group's joint distribution as a *tree* over
``S``: the maximum spanning forest, by the build's dependence scores, of the stored pair grids among ``S``
(a Chow–Liu tree restricted to the query). Columns with no stored pair between them are independent; a pair
grid gives ``P(cell_v | cell_u)``; within a grid cell, and within a fine bin, positions follow the fine 1-D
histogram with each bin's mass spread evenly over its extent (the closed-form integral of a box kernel as wide
as the bin). The expectation is computed exactly for that model by message passing on the fine bins
(``λ_u = φ_u·Π_children E[λ_v | cell of u]``, ``φ_u`` the box's share of each fine bin), so any number of
predicate columns costs a few vector operations. ``y`` enters through its own bins when it is a predicate
column, otherwise through the sum grid of the predicate column it depends on most (exact per-cell sums).

Its error has three sources, each with a closed-form variance: rows placed evenly in fine bins the box cuts
(Bernoulli, plus the squared disagreement with a linear density through the neighbouring bins), rows placed
independently within pair-grid cells the box cuts, and the finite-population noise of independence between
components. Their sum, scaled by ``MODEL_VAR_SCALE``, is the model's variance ``V``.

The stratified sample checks the model on every query: its Horvitz–Thompson estimate ``H`` (variance ``σ²``)
disagrees with the model ``M`` by ``d = H − M``. When ``d² > 9(σ² + V)`` the model is biased for this query and
its mean squared error is taken as ``d² − σ²``; otherwise it is ``V``. The answer is the composite
``M + λ·d`` with ``λ = mse/(mse + σ²)`` and variance ``λ²σ² + (1 − λ)²·mse``; intervals are normal, AVG by the
delta method. With the whole table as the sample (σ² = 0) the answer is exact; where the model is exact (V = 0:
discrete columns, no independence assumed) it is kept as is.

**KDE estimator** (``method="kde"``; documents 000 and 003). Each sample row carries a Gaussian kernel with the
column's ``densitas.kde`` bandwidth, truncated to the column's range so that no mass leaks out of it (discrete
columns keep point masses); the answer is ``(N/n)·Σ_i y_i·Π_j ∫_{B_j} K_j(x − x_ij) dx`` in closed form. It
is kept for comparison (benchmarks/RESULTS.md).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.special import ndtr, ndtri

from densitas.aqp.build import FORMAT_VERSION, SCHEMA, cell_map
from densitas.aqp.columns import ColumnInfo, to_number
from densitas.aqp.connector import Connector
from densitas.aqp.sql import Condition, Query
from densitas.exceptions import InputError, UnsupportedQueryError

__all__ = ["Synopsis", "load", "z_value"]

# The model's placement variance (Bernoulli placement in cut bins and cells, the slope term, independence noise)
# leaves out the systematic within-cell error; it is scaled by this constant, fitted once so that 95% intervals
# cover 90-98% of the answers of the seed-0 workloads (benchmarks/RESULTS.md) and checked on other seeds.
MODEL_VAR_SCALE = 2.25


@dataclass
class Pair:
    """A stored pair grid: sparse cells ``(gid, c0, c1, n)`` at resolution ``res`` over the fine bins."""

    cols: tuple[int, int]
    res: tuple[int, int]
    score: float
    gid: np.ndarray
    c: tuple[np.ndarray, np.ndarray]
    n: np.ndarray
    maps: tuple[np.ndarray, np.ndarray]  # per dimension: fine bin (0..B) -> cell (0..res)
    starts: tuple[np.ndarray, np.ndarray]  # per dimension: first fine bin of each cell (maps are monotone)
    rowsum: tuple[np.ndarray, np.ndarray]  # per dimension: (G, res + 1) rows per cell


def _starts(m: np.ndarray) -> np.ndarray:
    return np.flatnonzero(np.diff(m, prepend=-1))


class Synopsis:
    """Loaded synopsis of one table (see :mod:`densitas.aqp.build`)."""

    def __init__(self, meta: dict, infos: list[ColumnInfo], groups: pd.DataFrame, marg: dict, sums: dict,
                 pairs: list[Pair], scores: dict, sample_gid: np.ndarray, sample_vals: np.ndarray) -> None:
        self.meta = meta
        self.table = meta["table_name"]
        self.infos = infos
        self.index = {info.name: j for j, info in enumerate(infos)}
        self.group_by: list[str] = json.loads(meta["group_by"])
        self.groups = groups  # gid order: group columns + n
        self.N = groups["n"].to_numpy(dtype=np.float64)
        G = len(self.N)
        self.fine = {j: marg[j][0] for j in marg}  # (G, B_j + 1) exact counts per fine bin, bin 0 NULL
        self.mean = {}
        for j, (w, sm) in marg.items():
            with np.errstate(invalid="ignore", divide="ignore"):
                m = np.where(w > 0, sm / np.where(w > 0, w, 1), 0.0)
            m[:, 0] = 0.0
            self.mean[j] = m
        self.sums = sums  # j -> (map, {key: (G, R + 1) totals}) with key ("n", None), ("s", k), ("nn", k)
        self.pairs = {p.cols: p for p in pairs}
        self.scores = scores
        self.bandwidths = json.loads(meta.get("bandwidths") or "[]")
        # the sample, sorted by group; values NaN where NULL
        order = np.argsort(sample_gid, kind="stable")
        self.s_gid = sample_gid[order].astype(np.int64)
        self.s_vals = sample_vals[order]
        self.n = np.bincount(self.s_gid, minlength=G).astype(np.float64)
        self.s_start = np.concatenate([[0], np.cumsum(self.n)]).astype(np.int64)
        self._moment_cache: dict = {}
        self._label_cache: dict = {}

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
        """(B_j + 1,): the share of each fine bin's rows that satisfy the condition (bin 0, NULL, never)."""
        info = self.infos[j]
        e = info.edges
        if info.discrete:
            f = np.zeros(len(e) + 1)
            for lo, loi, hi, hii in ivals:
                ok = ((e > lo) | ((e == lo) & loi)) & ((e < hi) | ((e == hi) & hii))
                f[1:] += ok
            return np.minimum(f, 1.0)
        upper = info.uppers()
        width = upper - e
        f = np.zeros(len(e) + 1)
        for lo, loi, hi, hii in ivals:
            L, U = _half_open(info, lo, loi, hi, hii)
            f[1:] += np.clip(np.minimum(upper, U) - np.maximum(e, L), 0.0, None) / width
        return np.minimum(f, 1.0)

    def _slope_var(self, j: int, ivals: list) -> np.ndarray:
        """(G,): squared disagreement, summed over the fine bins the box cuts, between the uniform spread within
        a bin and a linear density through the neighbouring bins' densities: the systematic part of the
        within-bin placement error, which the Bernoulli term misses where the density is steep."""
        info = self.infos[j]
        G = len(self.N)
        out = np.zeros(G)
        if info.discrete:
            return out
        e, up = info.edges, info.uppers()
        B = len(e)
        w = self.fine[j]
        for lo, loi, hi, hii in ivals:
            L, U = _half_open(info, lo, loi, hi, hii)
            for x in (L, U):
                if not math.isfinite(x):
                    continue
                i = int(np.searchsorted(e, x, side="right"))  # fine bin (1..B) holding x
                if i < 1 or i > B or x <= e[i - 1]:
                    continue
                a, b = e[i - 1], up[i - 1]
                h, mid = b - a, (a + b) / 2
                lo_i, hi_i = max(i - 1, 1), min(i + 1, B)
                if hi_i == lo_i or h <= 0:
                    continue
                dens = w[:, [lo_i, hi_i]] / (up[[lo_i - 1, hi_i - 1]] - e[[lo_i - 1, hi_i - 1]])
                span = (e[hi_i - 1] + up[hi_i - 1]) / 2 - (e[lo_i - 1] + up[lo_i - 1]) / 2
                slope = (dens[:, 1] - dens[:, 0]) / span
                d_i = w[:, i] / h
                slope = np.clip(slope, -2 * d_i / h, 2 * d_i / h)  # the density stays >= 0 within the bin
                out += (slope / 2 * ((x - mid) ** 2 - (a - mid) ** 2)) ** 2
        return out

    def _row_match(self, j: int, ivals: list, v: np.ndarray) -> np.ndarray:
        ok = np.zeros(v.shape, dtype=bool)
        for lo, loi, hi, hii in ivals:
            ok |= ((v > lo) | ((v == lo) & loi)) & ((v < hi) | ((v == hi) & hii))
        return ok  # NaN (NULL) compares false

    # ---- estimation -----------------------------------------------------------------------------------------
    def estimate(self, q: Query, method: str = "grid") -> tuple[dict, list[dict]]:
        """The output groups' label columns (name -> array; empty without GROUP BY), and per aggregate the
        estimate and variance of each output group."""
        for g in q.group_by:
            if g not in self.group_by:
                raise UnsupportedQueryError(self._missing(g, "GROUP BY"))
        box, gmask = self._box(q)
        cols = tuple(sorted(box))
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
            ck = (tuple(q.group_by), gmask.tobytes())
            if ck not in self._label_cache:
                if len(self._label_cache) > 256:  # distinct group filters are few in practice; stay bounded
                    self._label_cache.clear()
                labels = self.groups.loc[gids, list(q.group_by)].reset_index(drop=True)
                codes = labels.groupby(list(q.group_by), dropna=False, sort=True).ngroup().to_numpy()
                first = labels.drop_duplicates().assign(_c=codes[~labels.duplicated().to_numpy()])
                first = first.sort_values("_c").drop(columns="_c").reset_index(drop=True)
                self._label_cache[ck] = (codes, {c: first[c].to_numpy() for c in first.columns})
            codes, out = self._label_cache[ck]
            m = len(next(iter(out.values())))
        else:
            codes = np.zeros(len(gids), dtype=np.int64)
            out, m = {}, 1
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
                v = np.bincount(codes, var_fn(gids, [ks, kn], [1.0, -np.nan_to_num(avg)[codes]]),
                                minlength=m) / cnt ** 2
            results.append({"alias": a.alias, "func": "avg", "value": avg, "var": v, "count": cnt})
        if q.group_by:  # SQL has no row for a group without matching rows: drop groups surely empty
            rows = np.bincount(codes, est[gids, 0], minlength=m)
            rvar = np.bincount(codes, var_fn(gids, [0], [1.0]), minlength=m)
            keep = (rows >= 0.5) | (rvar > 0)
            out = {c: v[keep] for c, v in out.items()}
            for r in results:
                for k in ("value", "var", "count"):
                    r[k] = np.asarray(r[k])[keep]
        return out, results

    # ---- the model: a tree of pair grids over fine histograms ---------------------------------------------
    def _tree(self, nodes: list[int]) -> list[tuple[int, int]]:
        """Maximum spanning forest (by dependence score) of the stored pair grids among ``nodes``."""
        cand = sorted((p for p in self.pairs if p[0] in nodes and p[1] in nodes), key=lambda p: -self.pairs[p].score)
        parent = {u: u for u in nodes}

        def find(u):
            while parent[u] != u:
                parent[u] = parent[parent[u]]
                u = parent[u]
            return u

        out = []
        for a, b in cand:
            ra, rb = find(a), find(b)
            if ra != rb:
                parent[ra] = rb
                out.append((a, b))
        return out

    def _cell_mean(self, j: int, x: np.ndarray, starts: np.ndarray) -> np.ndarray:
        """(G, cells): the count-weighted mean of the per-fine-bin ``x`` ((B_j + 1,) or (G, B_j + 1)) of column
        ``j`` within each cell."""
        w = self.fine[j]
        num = np.add.reduceat(w * x, starts, axis=1)
        den = np.add.reduceat(w, starts, axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(den > 0, num / np.where(den > 0, den, 1), 0.0)

    def _message(self, pair: Pair, v: int, lam_v: np.ndarray) -> np.ndarray:
        """E[lambda_v(x_v) | x_u's cell] for each fine bin of u, through the grid of ``pair``, (G, B_u + 1)."""
        dv = pair.cols.index(v)
        du = 1 - dv
        lbar = self._cell_mean(v, lam_v, pair.starts[dv])
        G = len(self.N)
        R = pair.res[du] + 1
        num = np.bincount(pair.gid * R + pair.c[du], pair.n * lbar[pair.gid, pair.c[dv]],
                          minlength=G * R).reshape(G, R)
        den = pair.rowsum[du]
        with np.errstate(invalid="ignore", divide="ignore"):
            mu = np.where(den > 0, num / np.where(den > 0, den, 1), 0.0)
        return mu[:, pair.maps[du]]

    def _lam(self, u: int, parent: int | None, adj: dict, phis: dict) -> np.ndarray:
        lam = np.array(np.broadcast_to(phis[u], self.fine[u].shape), dtype=np.float64)
        for v in adj[u]:
            if v != parent:
                pair = self.pairs[(min(u, v), max(u, v))]
                lam *= self._message(pair, v, self._lam(v, u, adj, phis))
        return lam

    def _expect(self, comp: list[int], adj: dict, phis: dict) -> np.ndarray:
        """(G,): E[prod of the component's factors] per group."""
        root = comp[0]
        lam = self._lam(root, None, adj, phis)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.N > 0, (self.fine[root] * lam).sum(axis=1) / np.maximum(self.N, 1), 0.0)

    def _grid(self, cols, box, keys):
        """Model estimates per group (G, len(keys)), combined with the sample (see the module docstring), and a
        function giving per-group variances of linear combinations of the keys."""
        G = len(self.N)
        S = list(cols)
        phis = {u: self._fractions(u, box[u]) for u in S}
        edges = self._tree(S)
        adj: dict[int, list[int]] = {u: [] for u in S}
        for a, b in edges:
            adj[a].append(b)
            adj[b].append(a)
        comps, seen = [], set()
        for u in S:
            if u in seen:
                continue
            stack, comp = [u], []
            while stack:
                x = stack.pop()
                if x in seen:
                    continue
                seen.add(x)
                comp.append(x)
                stack += adj[x]
            comps.append(comp)
        comp_of = {u: ci for ci, comp in enumerate(comps) for u in comp}
        E = [self._expect(comp, adj, phis) for comp in comps]
        count = self.N * np.prod(E, axis=0) if E else self.N.copy()

        # placement variance (relative) of the count: fine bins the box cuts, grid cells it cuts, independence
        rv = np.zeros(G)
        with np.errstate(invalid="ignore", divide="ignore"):
            for u in S:
                w, ph = self.fine[u], phis[u]
                num = (w * (ph * (1 - ph))).sum(axis=1) + self._slope_var(u, box[u])
                den = (w * ph).sum(axis=1)
                rv += np.where(den > 0, num / np.where(den > 0, den, 1) ** 2, 0.0)
            for a, b in edges:
                pair = self.pairs[(a, b)]
                qa = self._cell_mean(a, phis[a], pair.starts[0])
                qb = self._cell_mean(b, phis[b], pair.starts[1])
                qq = qa[pair.gid, pair.c[0]] * qb[pair.gid, pair.c[1]]
                num = np.bincount(pair.gid, pair.n * qq * (1 - qq), minlength=G)
                den = np.bincount(pair.gid, pair.n * qq, minlength=G)
                rv += np.where(den > 0, num / np.where(den > 0, den, 1) ** 2, 0.0)
            for c1 in range(len(E)):
                for c2 in range(c1 + 1, len(E)):
                    p1, p2 = E[c1], E[c2]
                    rv += np.where((p1 > 0) & (p2 > 0), (1 - p1) * (1 - p2) / np.maximum(self.N * p1 * p2, 1e-300),
                                   0.0)

        model = np.empty((G, len(keys)))
        rv_k = np.empty((G, len(keys)))
        for t, (kind, j) in enumerate(keys):
            rv_k[:, t] = rv
            if kind == "n":
                model[:, t] = count
                continue
            factor = self.mean[j] if kind == "s" else (np.arange(self.fine[j].shape[1]) > 0).astype(np.float64)
            if not S:
                model[:, t] = (self.fine[j] * factor).sum(axis=1)
                continue
            if j in phis:  # the column is a predicate column: its own bins carry its values
                u, f = j, factor
            else:  # attach the column to the predicate column it depends on most, through that column's sum grid
                u = max(S, key=lambda x: self.scores.get((min(x, j), max(x, j)), 0.0))
                cmap, tot = self.sums[u]
                with np.errstate(invalid="ignore", divide="ignore"):
                    n_c = tot[("n", None)]
                    ratio = np.where(n_c > 0, tot[(kind, j)] / np.where(n_c > 0, n_c, 1), 0.0)
                f = ratio[:, cmap]
                st = _starts(cmap)
                qc = self._cell_mean(u, phis[u], st)
                with np.errstate(invalid="ignore", divide="ignore"):
                    num = (n_c * qc * (1 - qc)).sum(axis=1)
                    den = (n_c * qc).sum(axis=1)
                    rv_k[:, t] += np.where(den > 0, num / np.where(den > 0, den, 1) ** 2, 0.0)
            ph2 = dict(phis)
            ph2[u] = phis[u] * f
            ci = comp_of[u]
            Ek = self._expect(comps[ci], adj, ph2)
            with np.errstate(invalid="ignore", divide="ignore"):
                model[:, t] = np.where(E[ci] > 0, count / np.where(E[ci] > 0, E[ci], 1) * Ek,
                                       self.N * Ek * np.prod([E[c] for c in range(len(E)) if c != ci], axis=0))

        # the sample: Horvitz–Thompson per group from first and second moments of the rows in the box, and the
        # composite with the model
        sv = self.s_vals
        inside = np.ones(len(sv), dtype=bool)
        for u in S:
            inside &= self._row_match(u, box[u], sv[:, u])
        idx = np.flatnonzero(inside)
        gi = self.s_gid[idx]
        yi = self._sample_values(keys, idx)
        K = len(keys)
        m1 = np.stack([np.bincount(gi, yi[:, k], minlength=G) for k in range(K)], axis=1)
        m2 = np.empty((G, K, K))
        for k in range(K):
            for k2 in range(k, K):
                m2[:, k, k2] = m2[:, k2, k] = np.bincount(gi, yi[:, k] * yi[:, k2], minlength=G)
        y2 = self._moments(tuple(keys))
        n_g = np.maximum(self.n, 1)
        fpc = np.clip(1 - self.n / np.maximum(self.N, 1), 0.0, 1.0)
        p_model = np.where(self.N > 0, count / np.maximum(self.N, 1), 0.0)

        def parts(gids, W):
            """Per group of ``gids`` and weights ``W`` (len(gids), K): model variance factor E[u^2], HT and its
            variance for the combination u = Σ_k W_k y_k."""
            su = (m1[gids] * W).sum(axis=1)
            su2 = np.einsum("gk,gkl,gl->g", W, m2[gids], W)
            u2m = np.einsum("gk,gkl,gl->g", W, y2[gids], W) / n_g[gids]
            nn = self.n[gids]
            with np.errstate(invalid="ignore", divide="ignore"):
                var_u = np.where(nn > 1, (su2 - su * su / n_g[gids]) / np.maximum(nn - 1, 1), 0.0)
            pm = p_model[gids]
            var_u = np.maximum(var_u, pm * (1 - pm) * u2m)  # too few rows in the box to trust alone
            N = self.N[gids]
            return u2m, N / n_g[gids] * su, N ** 2 * fpc[gids] * var_u / n_g[gids]

        def composite(m, v, h, s2):
            d = h - m
            # the model's bias shows only when the sample disagrees beyond its noise (3 standard errors); a single
            # query's noisy disagreement would otherwise drag the model towards the sample
            mse = np.where(d * d > 9 * (s2 + v), d * d - s2, v)
            with np.errstate(invalid="ignore", divide="ignore"):
                lam = np.where(v > 0, np.where(mse + s2 > 0, mse / (mse + s2), 1.0), 0.0)
            var = lam * lam * s2 + (1 - lam) ** 2 * mse
            return m + lam * d, np.where(v > 0, var, 0.0)

        all_g = np.arange(G)
        est = np.empty((G, K))
        for t in range(K):
            W = np.zeros((G, K))
            W[:, t] = 1.0
            u2m, h, s2 = parts(all_g, W)
            est[:, t], _ = composite(model[:, t], MODEL_VAR_SCALE * rv_k[:, t] * count ** 2 * u2m, h, s2)

        def var_fn(gids, ks, ws):
            W = np.zeros((len(gids), K))
            for k, wk in zip(ks, ws, strict=True):
                W[:, k] += wk
            u2m, h, s2 = parts(gids, W)
            m = (model[gids] * W).sum(axis=1)
            v = MODEL_VAR_SCALE * rv_k[gids][:, ks].max(axis=1) * count[gids] ** 2 * u2m
            return composite(m, v, h, s2)[1]

        return est, var_fn

    def _sample_values(self, keys, rows: np.ndarray | None = None) -> np.ndarray:
        sv = self.s_vals if rows is None else self.s_vals[rows]
        y = np.empty((len(sv), len(keys)))
        for t, (kind, j) in enumerate(keys):
            if kind == "n":
                y[:, t] = 1.0
            elif kind == "s":
                y[:, t] = np.nan_to_num(sv[:, j], nan=0.0)
            else:
                y[:, t] = ~np.isnan(sv[:, j])
        return y

    def _moments(self, keys: tuple) -> np.ndarray:
        """(G, K, K): per group, the sums over its sample rows of y_k·y_l (cached per key tuple)."""
        got = self._moment_cache.get(keys)
        if got is None:
            y = self._sample_values(keys)
            G, K = len(self.N), len(keys)
            got = np.empty((G, K, K))
            for k in range(K):
                for k2 in range(k, K):
                    got[:, k, k2] = got[:, k2, k] = np.bincount(self.s_gid, y[:, k] * y[:, k2], minlength=G)
            self._moment_cache[keys] = got
        return got

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
                u = sum(np.broadcast_to(wk, (len(gids),))[t] * y[a:b, k] for k, wk in zip(ks, ws, strict=True))
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
    if int(meta.get("version") or 0) != FORMAT_VERSION:
        raise InputError(f"the synopsis of {table!r} has format version {meta.get('version')!r}, this densitas "
                         f"reads version {FORMAT_VERSION}; rebuild it (densitas build / Engine.build).")
    sid = meta["id"]
    col_dicts = json.loads(meta["columns"])
    edges = con.fetch_df(f"SELECT col, bin, lo FROM {SCHEMA}.edges_{sid} ORDER BY col, bin")
    infos = []
    for j, d in enumerate(col_dicts):
        infos.append(ColumnInfo.from_dict(d, edges.loc[edges["col"] == j, "lo"].to_numpy(dtype=np.float64)))
    if len(infos) == 0:
        raise InputError(f"synopsis of {table!r} has no columns")
    groups = con.fetch_df(f"SELECT * FROM {SCHEMA}.groups_{sid} ORDER BY gid").drop(columns="gid")
    G = len(groups)
    grids = json.loads(meta["grids"])

    def arr(d, c, dtype=np.float64):
        a = d[c]
        return np.nan_to_num(np.ma.filled(np.ma.asarray(a).astype(dtype), 0)) if np.ma.isMaskedArray(a) else \
            np.nan_to_num(np.asarray(a, dtype=dtype))

    m = con.fetch_numpy(f"SELECT col, gid, bin, n, s FROM {SCHEMA}.marg_{sid}")
    mcol, mg, mb = (arr(m, c, np.int64) for c in ("col", "gid", "bin"))
    mn, ms = arr(m, "n"), arr(m, "s")
    marg = {}
    for j, info in enumerate(infos):
        sel = mcol == j
        w = np.zeros((G, info.bins + 1))
        sm = np.zeros((G, info.bins + 1))
        np.add.at(w, (mg[sel], mb[sel]), mn[sel])
        np.add.at(sm, (mg[sel], mb[sel]), ms[sel])
        marg[j] = (w, sm)

    sm_ = con.fetch_numpy(f"SELECT * FROM {SCHEMA}.sums_{sid}")
    scol, sg, sc = (arr(sm_, c, np.int64) for c in ("col", "gid", "cell"))
    value_names = [c for c in sm_ if c not in ("col", "gid", "cell")]
    values = {c: arr(sm_, c) for c in value_names}
    sums = {}
    for j, info in enumerate(infos):
        cmap = cell_map(grids["sum_res"][j], info.bins)
        sel = scol == j
        tot = {}
        for c in value_names:
            key = ("n", None) if c == "n" else (("nn", int(c[2:])) if c.startswith("nn") else ("s", int(c[1:])))
            a = np.zeros((G, int(cmap.max()) + 1))
            np.add.at(a, (sg[sel], sc[sel]), values[c][sel])
            tot[key] = a
        for k, info_k in enumerate(infos):  # non-nullable columns: the non-NULL count is the row count
            if info_k.numeric and ("nn", k) not in tot:
                tot[("nn", k)] = tot[("n", None)]
        sums[j] = (cmap, tot)

    pr = con.fetch_numpy(f"SELECT pair, gid, c0, c1, n FROM {SCHEMA}.pairs_{sid}")
    pid = arr(pr, "pair", np.int64)
    pairs = []
    for g in grids["pairs"]:
        sel = pid == g["id"]
        a, b = g["cols"]
        ra, rb = g["res"]
        gid = arr(pr, "gid", np.int64)[sel]
        c = (arr(pr, "c0", np.int64)[sel], arr(pr, "c1", np.int64)[sel])
        n = arr(pr, "n")[sel]
        maps = (cell_map(ra, infos[a].bins), cell_map(rb, infos[b].bins))
        R = (int(maps[0].max()) + 1, int(maps[1].max()) + 1)
        rowsum = tuple(np.bincount(gid * R[d] + c[d], n, minlength=G * R[d]).reshape(G, R[d]) for d in (0, 1))
        pairs.append(Pair((a, b), (R[0] - 1, R[1] - 1), float(g["score"]), gid, c, n, maps,
                          (_starts(maps[0]), _starts(maps[1])), rowsum))
    scores = {(int(a), int(b)): float(v) for a, b, v in grids["scores"]}

    sample = con.fetch_numpy(f"SELECT * FROM {SCHEMA}.sample_{sid}")
    s_gid = np.asarray(sample["gid"], dtype=np.int64)
    cols_v = []
    for j in range(len(infos)):
        a = sample[f"v{j}"]
        cols_v.append(np.ma.filled(a.astype(np.float64), np.nan) if np.ma.isMaskedArray(a)
                      else np.asarray(a, dtype=np.float64))
    s_vals = np.stack(cols_v, axis=1)
    return Synopsis(meta, infos, groups, marg, sums, pairs, scores, s_gid, s_vals)
