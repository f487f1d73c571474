"""The chunked, out-of-core exact k-NN driver.

For each block of references (read from memory, a file or a DuckDB relation, one pass) and each tile of
queries:

1. the dispatched operation ``knn_tile_topk`` (:mod:`._torch`; a fused Triton kernel on CUDA) returns the
   ``k' = k + max(8, k/4)`` smallest **fast** values per query — a GEMM ``‖q‖² − 2q·c + ‖c‖²`` on centred data
   in the data's precision (float32 data: float32);
2. those candidates are **re-ranked exactly** in float64 (direct differences) and merged into a running
   top-k per query, ordered by (distance, reference index) — ties go to the lower index;
3. every reference the fast pass dropped had a fast value ≥ the block's k'-th value ``t``, so its exact value
   is ≥ ``t − ε`` (ε: the worst-case rounding bound of :func:`.distances.fast_error_bound`).

At the end a query is **certified** when ``min over blocks (t − ε)`` exceeds its exact k-th value (with a
relative slack of 1e-12): no dropped reference can then beat or tie with a returned one, and the answer
equals the float64 brute force. The rare queries that are not certified (more than k' references tied, within
ε, at the k-th distance — e.g. many duplicate rows) are answered by a second, exact float64 pass over the
references. Memory stays within the budget: the queries × references matrix is never formed.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from densitas._backend.chunking import memory_budget as default_budget
from densitas._backend.chunking import parse_bytes
from densitas._backend.dispatch import select
from densitas.neighbors import (
    _torch,  # noqa: F401  (registers the PyTorch implementation)
    _triton_registry,  # noqa: F401  (registers the fused Triton kernel, lazily)
)
from densitas.neighbors._torch import FastRows, prepare, prepare_dense_sq
from densitas.neighbors.distances import (
    Encoded,
    Metric,
    NominalCoder,
    Schema,
    bound_coefficient,
    encode,
    exact_values,
    fast_error_bound,
    row_scales,
)
from densitas.neighbors.io import Source

log = logging.getLogger("densitas")

__all__ = ["References", "SearchStats", "search"]

#: Largest query tile and reference tile of one fast-pass GEMM on the PyTorch path (cache-friendly sizes).
TILE_QUERIES = 512
TILE_REFERENCES = 8192
#: The same on a CUDA device: GEMMs and top-k selections large enough to fill the GPU (bounded by the budget).
TILE_QUERIES_CUDA = 8192
TILE_REFERENCES_CUDA = 65536
#: Relative slack of the certificate (covers the float64 rounding of the exact values).
CERT_SLACK = 1e-12


def candidates_for(k: int) -> int:
    """``k'``: candidates kept per query and block by the fast pass."""
    return k + max(8, k // 4)


@dataclass
class SearchStats:
    """What a search did: blocks read, queries answered by the exact fallback pass, the backend."""

    blocks: int = 0
    fallback_queries: int = 0
    backend: str = "torch"


class References:
    """A reference set: an in-memory :class:`Encoded` or a :class:`Source` encoded block by block.

    ``shift`` (the centring vector of the fast pass) is fixed from the first block so that every block and
    every query use the same one.
    """

    def __init__(self, *, source: Source | None = None, encoded: Encoded | None = None, schema: Schema,
                 coder: NominalCoder, missing: str, name: str = "X"):
        self.source = source
        self.encoded = encoded
        self.schema = schema
        self.coder = coder
        self.missing = missing
        self.name = name
        self.n_rows = encoded.n if encoded is not None else source.n_rows
        self.float_dtype: np.dtype | None = None
        self._shift: torch.Tensor | None = None

    def blocks(self, rows: int, device: torch.device) -> Iterator[tuple[int, Encoded]]:
        rows = max(int(rows), 1)
        if self.encoded is not None:
            for s in range(0, self.n_rows, rows):
                yield s, self.encoded.slice(slice(s, s + rows)).to(device)
            return
        for off, chunk in self.source.blocks(rows):
            enc = encode(chunk, self.schema, self.coder, missing=self.missing, name=self.name, row_offset=off,
                         float_dtype=self.float_dtype)
            if self.float_dtype is None and enc.num is not None:
                self.float_dtype = np.dtype(str(enc.num.dtype).replace("torch.", ""))
            yield off, enc.to(device)

    def shift(self, first: Encoded) -> torch.Tensor | None:
        if first.num is None:
            return None
        if self._shift is None:
            # any point near the data will do: the mean in the data's precision, and in float64 (NaN skipped)
            # only when that is not finite (missing values, or float32 sums past its range)
            s = first.num.mean(0).to(torch.float64)
            if not bool(torch.isfinite(s).all()):
                x = first.num.to(torch.float64)
                s = torch.nanmean(x, 0) if bool(torch.isnan(x).any()) else x.mean(0)
            self._shift = torch.nan_to_num(s, nan=0.0)
        return self._shift.to(first.num.device)


def _transform(x: torch.Tensor | None, metric: Metric, shift: torch.Tensor | None) -> torch.Tensor | None:
    """Centred (translation-invariant metrics) or row-normalised (cosine) float64 values; NaN kept."""
    if x is None:
        return None
    x64 = x.to(torch.float64)
    if metric.fast == "cos":
        norm = torch.linalg.vector_norm(torch.nan_to_num(x64, nan=0.0), dim=1, keepdim=True)
        return x64 / torch.where(norm > 0, norm, 1.0)
    return x64 - shift if shift is not None else x64


def _merge(state: tuple[torch.Tensor, ...] | None, key: torch.Tensor, idx: torch.Tensor, f: torch.Tensor,
           k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Merge candidates into a running top-k ordered by (key, index)."""
    if state is not None:
        key = torch.cat([state[0], key], 1)
        idx = torch.cat([state[1], idx], 1)
        f = torch.cat([state[2], f], 1)
    o1 = torch.argsort(idx, dim=1, stable=True)
    key1 = torch.gather(key, 1, o1)
    o2 = torch.argsort(key1, dim=1, stable=True)
    order = torch.gather(o1, 1, o2)[:, :k]
    return torch.gather(key, 1, order), torch.gather(idx, 1, order), torch.gather(f, 1, order)


def _keys(metric: Metric, f: torch.Tensor) -> torch.Tensor:
    d = metric.finish(f)
    return torch.nan_to_num(d, nan=math.inf)


def _gather_rows(t: torch.Tensor | None, pos: torch.Tensor) -> torch.Tensor | None:
    return None if t is None else t[pos]


def _fast_unit(backend: str, fast_dtype: torch.dtype, metric: Metric, skip: bool, nominal: bool, p: int,
               kp: int) -> float | None:
    """The input rounding of the fast pass when the fused Triton kernel runs it (TF32), else None (the fast
    pass is then PyTorch's, exact to ``fast_dtype``)."""
    # a user may have let PyTorch's float32 matmuls run in TF32 (allow_tf32, set_float32_matmul_precision)
    torch_tf32 = fast_dtype == torch.float32 and torch.get_float32_matmul_precision() != "highest"
    if backend != "triton":
        return 2.0**-10 if torch_tf32 else None
    from densitas.neighbors._triton import TILE_PRECISION, UNIT_ROUNDOFF, fused_applies

    if not fused_applies(metric.fast, skip, nominal, fast_dtype, p, kp):
        return 2.0**-10 if torch_tf32 else None
    return UNIT_ROUNDOFF[TILE_PRECISION]


def search(refs: References, queries: Encoded, k: int, metric: Metric, *, skip: bool, device: torch.device,
           budget: int | str | None = None, fast_dtype: torch.dtype | None = None,
           stats: SearchStats | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact k nearest references of every query.

    Parameters
    ----------
    refs : References
    queries : Encoded
        Encoded with the references' schema and coder.
    k : int
        1 ≤ k ≤ number of references (validated by the caller).
    metric : Metric
    skip : bool
        ``missing="skip"`` semantics.
    device : torch.device
    budget : int or str, optional
        Working-memory budget in bytes (default: :func:`densitas._backend.memory_budget` of ``device``).
    fast_dtype : torch.dtype, optional
        Precision of the fast pass; default float32 when the data are float32, float64 otherwise.
    stats : SearchStats, optional
        Filled with what the search did.

    Returns
    -------
    distances : (m, k) float64 tensor
        Ascending; NaN (ranked last) where a pair had no coordinate in common (``skip``).
    indices : (m, k) int64 tensor
    """
    stats = stats if stats is not None else SearchStats()
    cap = parse_bytes(budget) if budget is not None else default_budget(device)
    m = queries.n
    p = 0 if queries.num is None else int(queries.num.shape[1])
    r = 0 if queries.nom is None else int(queries.nom.shape[1])
    queries = queries.to(device)
    if fast_dtype is None:
        fast_dtype = torch.float32 if (queries.num is not None and queries.num.dtype in (torch.float32,
                                                                                          torch.float16)) \
            else torch.float64
    fsize = torch.finfo(fast_dtype).bits // 8
    kp_target = candidates_for(k)

    # ---- plan: reference block rows, fast-pass tile columns, query tile rows
    ref_row_bytes = p * (8 + 8 + fsize * (4 if skip else 2)) + r * 16 + 16
    block_rows = max(cap // 4 // max(ref_row_bytes, 1), 1)
    pair_bytes = fsize * (5 if skip else 2) + (12 if r else 0) + 8
    cuda = torch.device(device).type == "cuda"
    tile_refs, tile_queries = (TILE_REFERENCES_CUDA, TILE_QUERIES_CUDA) if cuda else (TILE_REFERENCES, TILE_QUERIES)
    tile_cols = int(max(min(tile_refs, block_rows, cap // 4 // pair_bytes), 1))
    kp_bytes = kp_target * (p * 8 * 3 + r * 24 + 64) + 2 * (k + kp_target) * 48
    per_query = tile_cols * pair_bytes + kp_bytes + p * 8 * 3
    q_rows = int(max(min(tile_queries, cap // 2 // per_query), 1))
    q_tiles = [slice(s, min(s + q_rows, m)) for s in range(0, m, q_rows)]

    backend, op = select("knn_tile_topk", device)
    stats.backend = backend
    nominal = bool(r and metric.nominal)
    kappas: dict[int, float] = {}  # per candidate count: the bound depends on whether the kernel runs in TF32
    states: list[tuple[torch.Tensor, ...] | None] = [None] * len(q_tiles)
    lower = torch.full((m,), math.inf, dtype=torch.float64, device=device)
    q_fast: FastRows | None = None
    q_scale = None
    for _off, blk in refs.blocks(block_rows, device):
        stats.blocks += 1
        n_b = blk.n
        if n_b == 0:
            continue
        shift = refs.shift(blk) if metric.center else None
        # dense squared Euclidean on the CPU (PyTorch's fast pass): operands straight from the raw rows, no
        # float64 copies
        dense = backend == "torch" and not cuda and metric.fast == "sq" and not skip and not nominal \
            and blk.num is not None and shift is not None
        if q_fast is None:
            if dense:
                q_fast, q_scale = prepare_dense_sq(queries.num, shift, "query", fast_dtype)
            else:
                qt = _transform(queries.num, metric, shift)
                q_fast = prepare(qt, queries.nom if metric.nominal else None, metric.fast, skip, "query",
                                 fast_dtype)
                q_scale = row_scales(metric, qt, r)
        if dense:
            c_fast, c_scale = prepare_dense_sq(blk.num, shift, "reference", fast_dtype)
        else:
            ct = _transform(blk.num, metric, shift)
            c_fast = prepare(ct, blk.nom if metric.nominal else None, metric.fast, skip, "reference", fast_dtype)
            c_scale = row_scales(metric, ct, r)
        a_c_max = float(c_scale.max()) if c_scale is not None else 0.0
        kp = min(kp_target, n_b)
        if kp not in kappas:
            kappas[kp] = bound_coefficient(metric, p, skip, fast_dtype,
                                           _fast_unit(backend, fast_dtype, metric, skip, nominal, p, kp))
        kappa = kappas[kp]
        for t_i, qs in enumerate(q_tiles):
            vals, pos = op(q_fast.rows(qs), c_fast, kp, tile_cols)
            if n_b > kp:
                t = vals.to(torch.float64).amax(1)
                eps = fast_error_bound(metric, kappa, None if q_scale is None else q_scale[qs], a_c_max,
                                       r if metric.nominal else 0, qs.stop - qs.start, device)
                lower[qs] = torch.minimum(lower[qs], t - eps)
            qe = queries.slice(qs)
            f = exact_values(metric, qe, _gather_rows(blk.num, pos),
                             _gather_rows(blk.nom, pos) if metric.nominal else None, skip)
            states[t_i] = _merge(states[t_i], _keys(metric, f), pos + _off, f, k)
    key = torch.cat([s[0] for s in states], 0)
    idx = torch.cat([s[1] for s in states], 0)
    f = torch.cat([s[2] for s in states], 0)
    f_k = torch.nan_to_num(f, nan=math.inf).amax(1)
    certified = lower > f_k * (1.0 + CERT_SLACK)
    failing = torch.nonzero(~certified).squeeze(1)
    if failing.numel():
        stats.fallback_queries = int(failing.numel())
        log.debug("knn: %d of %d queries not certified by the fast pass; exact float64 pass", failing.numel(), m)
        fk, fi = _exact_pass(refs, queries.take(failing), k, metric, skip=skip, device=device, cap=cap,
                             block_rows=block_rows)
        key[failing] = fk
        idx[failing] = fi
    dist = torch.where(torch.isinf(key), math.nan, key) if skip else key
    return dist, idx


def _exact_pass(refs: References, queries: Encoded, k: int, metric: Metric, *, skip: bool, device: torch.device,
                cap: int, block_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Float64 brute force (direct differences) with a running (distance, index) top-k: the fallback."""
    m = queries.n
    p = 0 if queries.num is None else int(queries.num.shape[1])
    r = 0 if queries.nom is None else int(queries.nom.shape[1])
    pair_bytes = (p * 8 * 4 + r * 24 + 64)
    cols = int(max(min(block_rows, cap // 2 // pair_bytes // max(min(m, 64), 1)), 1))
    q_rows = int(max(min(m, cap // 2 // (pair_bytes * cols)), 1))
    states: list[tuple[torch.Tensor, ...] | None] = [None] * math.ceil(m / q_rows)
    for off, blk in refs.blocks(block_rows, device):
        for s in range(0, blk.n, cols):
            e = min(s + cols, blk.n)
            c_num = None if blk.num is None else blk.num[None, s:e]
            c_nom = None if (blk.nom is None or not metric.nominal) else blk.nom[None, s:e]
            ids = torch.arange(off + s, off + e, device=device)
            for t_i, qs in enumerate(range(0, m, q_rows)):
                qe = queries.slice(slice(qs, qs + q_rows))
                if c_nom is not None:
                    c_nom_b = c_nom.expand(qe.n, -1, -1)
                else:
                    c_nom_b = None
                f = exact_values(metric, qe, c_num, c_nom_b, skip)
                states[t_i] = _merge(states[t_i], _keys(metric, f), ids.expand(qe.n, -1), f, k)
    return torch.cat([s_[0] for s_ in states], 0), torch.cat([s_[1] for s_ in states], 0)


def empty_result(m: int, k: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Shapes (m, k) of an answer for zero queries (or k = 0)."""
    return (torch.empty((m, k), dtype=torch.float64, device=device),
            torch.empty((m, k), dtype=torch.int64, device=device))


def as_numpy(t: torch.Tensor) -> Any:
    return t.detach().cpu().numpy()
