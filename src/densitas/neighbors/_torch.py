"""PyTorch implementation of the heavy operation of :mod:`densitas.neighbors` — the CPU path and the test oracle.

Operation ``"knn_tile_topk"``: for a block of queries and a block of references (both prepared by
:func:`prepare`), return for every query the ``k`` smallest **fast** (approximate, working-precision) values
and their reference positions in the block::

    knn_tile_topk(q: FastRows, c: FastRows, k: int, tile_cols: int) -> (values (m, k'), positions (m, k'))

with ``k' = min(k, len(c))``; values in any order, positions int64. Contract (what the search relies on):

* every reference of the block that is **not** returned has a fast value ≥ every returned value;
* every fast value is within the bound of :func:`densitas.neighbors.distances.fast_error_bound` of the exact
  value (so no tf32, no float16 accumulation);
* a pair with no coordinate present on both sides (missing="skip") has the value +inf.

The queries × references matrix is never materialised: references are processed ``tile_cols`` at a time
(a GEMM tile ``‖q‖² − 2q·c + ‖c‖²`` plus ``torch.topk``), merging the partial top-k lists.

**Triton hook.** A fused CUDA kernel (distance tile on the matrix units + running top-k on chip) registers
for the same operation name with the same contract, in ``densitas/neighbors/_triton.py``, through a
``_triton_registry.py`` beside this file (see :mod:`densitas.primitives._triton_registry`)::

    register("knn_tile_topk", "triton")(lazy("densitas.neighbors._triton", "tile_topk"))

and :func:`densitas._backend.dispatch.select` picks it for CUDA tensors. It may handle the dense "sq"
mode only and call :func:`tile_topk` below for the others.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from densitas._backend.dispatch import register

__all__ = ["FastRows", "prepare", "prepare_dense_sq", "smallest", "tile_topk"]


@dataclass
class FastRows:
    """Rows prepared for the fast pass of one metric.

    Attributes
    ----------
    mode : {"sq", "l1", "cos"}
    masked : bool
        Missing coordinates are skipped (``missing="skip"``): ``x`` holds 0 where the value is missing.
    x : (n, p) tensor or None
        Centred ("sq", "l1") or row-normalised ("cos") values in the fast dtype. None for references made by
        :func:`prepare_dense_sq` (their GEMM operand ``g`` is all the fast pass reads).
    g : (n, w) tensor or None
        The GEMM operand: queries ``[x, 1]`` · references ``[−2x, ‖x‖²]`` ("sq"), ``[x², x, m]`` ·
        ``[m, −2x, x²]`` (masked "sq"), ``x`` · ``−x`` ("cos").
    add : (n,) tensor or None
        The queries' ``‖x‖²`` (dense "sq"), added to the selected values only.
    mask : (n, p) tensor or None
        1 where present, 0 where missing (masked only), in the fast dtype.
    nom : (n, r) int64 tensor or None
        Nominal codes (−1 = missing).
    min_present : int
        The fewest coordinates present in a row (masked only; a lower bound for any subset of the rows). When
        the queries' and the references' add up to more than the numeric columns, every pair shares a
        coordinate (pigeonhole) and the fast pass skips counting them.
    """

    mode: str
    masked: bool
    x: torch.Tensor | None
    g: torch.Tensor | None
    add: torch.Tensor | None
    mask: torch.Tensor | None
    nom: torch.Tensor | None
    min_present: int = 0

    def __len__(self) -> int:
        t = next((t for t in (self.x, self.g, self.nom) if t is not None), None)
        return 0 if t is None else int(t.shape[0])

    def rows(self, s: slice) -> FastRows:
        def cut(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t[s]

        return FastRows(self.mode, self.masked, cut(self.x), cut(self.g), cut(self.add), cut(self.mask),
                        cut(self.nom), self.min_present)


def prepare(x: torch.Tensor | None, nom: torch.Tensor | None, mode: str, masked: bool, side: str,
            dtype: torch.dtype) -> FastRows:
    """Build :class:`FastRows` from transformed float64-or-float32 values ``x`` (NaN where missing).

    ``side`` is ``"query"`` or ``"reference"`` (the GEMM operands differ).
    """
    if x is None:
        return FastRows(mode, masked, None, None, None, None, nom)
    mask = None
    min_present = 0
    if masked:
        present = ~torch.isnan(x)
        mask = present.to(dtype)
        x = torch.where(present, x, 0.0)
        min_present = int(present.sum(1).min()) if x.shape[0] else 0
    xf = x.to(dtype).contiguous()
    g = add = None
    if mode == "sq":
        if masked:
            x2 = xf * xf
            g = torch.cat([x2, xf, mask], 1) if side == "query" else torch.cat([mask, -2.0 * xf, x2], 1)
        else:
            # one GEMM of width p + 1: [x, 1] · [−2x, ‖x‖²]ᵀ = ‖c‖² − 2q·c (no broadcast add of ‖c‖²)
            sq = (x.to(torch.float64) ** 2).sum(1).to(dtype)
            if side == "query":
                g = torch.cat([xf, torch.ones_like(sq)[:, None]], 1)
                add = sq
            else:
                g = torch.cat([-2.0 * xf, sq[:, None]], 1)
    elif mode == "cos" and not masked:
        g = xf if side == "query" else -xf
    return FastRows(mode, masked, xf, g.contiguous() if g is not None else None, add, mask, nom, min_present)


def prepare_dense_sq(x: torch.Tensor, shift: torch.Tensor, side: str, dtype: torch.dtype
                     ) -> tuple[FastRows, torch.Tensor]:
    """:class:`FastRows` of the dense squared-Euclidean fast pass (no missing values, no nominal columns) and
    the rows' scales ``a = ‖x − s‖`` (float64), straight from the raw rows ``x`` in three passes: what
    :func:`prepare` and :func:`densitas.neighbors.distances.row_scales` give from float64 centred rows, without
    the float64 copies (two of 376 MB each for Fashion-MNIST's training set).

    The centring rounds once in ``dtype`` (``fl(x − s)``, with ``s`` rounded to ``dtype``: any common shift is
    as good as another), as the cast of float64 centred values did; the norms are summed in float64 from those
    rounded values. A reference's operand ``[−2(x − s), ‖x − s‖²]`` is written in one pass as ``2s − 2x`` (the
    factor 2 is exact), so its ``x`` is left None; a query's is ``[x − s, 1]`` with ``x`` a view of it.

    Examples
    --------
    >>> x = torch.tensor([[1.0, 2.0], [3.0, 5.0]])
    >>> c, a = prepare_dense_sq(x, torch.tensor([2.0, 3.0], dtype=torch.float64), "reference", torch.float32)
    >>> c.g.tolist(), a.tolist()
    ([[2.0, 2.0, 2.0], [-2.0, -4.0, 5.0]], [1.4142135623730951, 2.23606797749979])
    """
    n, p = x.shape
    s = shift.to(dtype)
    g = torch.empty((n, p + 1), dtype=dtype, device=x.device)
    xs = g[:, :p]
    if side == "query":
        torch.sub(x, s, out=xs)
        scale = torch.linalg.vector_norm(xs, dim=1, dtype=torch.float64)
        g[:, p] = 1.0
        sq = scale * scale
        return FastRows("sq", False, xs, g, sq.to(dtype), None, None), scale
    torch.add(2.0 * s, x, alpha=-2.0, out=xs)  # −2(x − s), exactly twice the rounded x − s
    scale = torch.linalg.vector_norm(xs, dim=1, dtype=torch.float64).mul_(0.5)
    g[:, p] = (scale * scale).to(dtype)
    return FastRows("sq", False, None, g, None, None, None), scale


def _tile_values(q: FastRows, c: FastRows) -> torch.Tensor:
    """Fast values of one (queries × reference tile) block, without the queries' additive term."""
    m, n = len(q), len(c)
    d = None
    count = None
    if q.x is not None:
        if q.mode == "sq":
            d = q.g @ c.g.T
        elif q.mode == "cos":
            if q.masked:
                num = q.x @ c.x.T
                nq = (q.x * q.x) @ c.mask.T
                nc = q.mask @ (c.x * c.x).T
                den = torch.sqrt(nq * nc)
                d = 1.0 - torch.where(den > 0, num / torch.where(den > 0, den, 1.0), 0.0)
            else:
                d = q.g @ c.g.T  # −cos; the constant 1 is added after the selection
        elif q.masked:  # l1 with missing coordinates
            d = torch.zeros((m, n), dtype=q.x.dtype, device=q.x.device)
            for j in range(q.x.shape[1]):
                term = (q.x[:, j, None] - c.x[None, :, j]).abs_()
                term.mul_(q.mask[:, j, None]).mul_(c.mask[None, :, j])
                d.add_(term)
        else:
            d = torch.cdist(q.x, c.x, p=1.0)
        # a pair with no coordinate in common gets +inf; none exists when the rows' present counts add up to
        # more than the columns (pigeonhole), and then the count and its where are skipped
        if q.masked and (q.nom is not None or q.min_present + c.min_present <= q.x.shape[1]):
            count = q.mask @ c.mask.T
    if q.nom is not None:
        r = q.nom.shape[1]
        mism = torch.zeros((m, n), dtype=torch.int32, device=q.nom.device)
        both_count = torch.zeros((m, n), dtype=torch.int32, device=q.nom.device) if q.masked else None
        for j in range(r):
            a = q.nom[:, j, None]
            b = c.nom[None, :, j]
            ne = a != b
            if q.masked:
                both = (a >= 0) & (b >= 0)
                ne &= both
                both_count += both
            mism += ne
        dtype = d.dtype if d is not None else torch.float64
        d = mism.to(dtype) if d is None else d + mism.to(dtype)
        if both_count is not None:
            count = both_count.to(dtype) if count is None else count + both_count.to(dtype)
    if count is not None:
        d = torch.where(count > 0, d, torch.inf)
    return d


#: Column groups of the two-stage selection (see :func:`smallest`).
GROUPS = 8


def smallest(d: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` smallest values of each row of ``d`` and their columns (any order), in two stages.

    The columns are cut into ``GROUPS`` contiguous slices of width ``w``; the elementwise minimum over the
    slices gives the minimum of each strided group {j, j + w, …}; the ``k`` groups with the smallest minima
    hold the ``k`` smallest values (a group not chosen has its minimum, hence every value, ≥ the minima of
    the k chosen groups, each of which is ≥ its own smallest member), so one ``topk`` over those ``k·GROUPS``
    values (plus the leftover columns) finishes. About 1.6× faster than ``torch.topk`` on the whole row.
    """
    m, n = d.shape
    w = n // GROUPS
    if w < max(k, 64):
        return torch.topk(d, k, dim=1, largest=False, sorted=False)
    mins = torch.minimum(d[:, :w], d[:, w:2 * w])
    for g in range(2, GROUPS):
        torch.minimum(mins, d[:, g * w:(g + 1) * w], out=mins)
    _, gi = torch.topk(mins, k, dim=1, largest=False, sorted=False)
    cols = (gi[:, :, None] + torch.arange(GROUPS, device=d.device) * w).reshape(m, -1)
    if n > GROUPS * w:
        rest = torch.arange(GROUPS * w, n, device=d.device).expand(m, -1)
        cols = torch.cat([cols, rest], 1)
    v, j = torch.topk(torch.gather(d, 1, cols), k, dim=1, largest=False, sorted=False)
    return v, torch.gather(cols, 1, j)


#: The CPU selection (:func:`_pruned_topk`): strided column groups per tile, the narrowest group worth pruning
#: by, and how many waiting candidates per query trigger a merge into the running top-k.
PRUNE_GROUPS = 16
PRUNE_MIN_WIDTH = 64
PRUNE_PENDING = 2


def _merge_candidates(best_v: torch.Tensor, best_i: torch.Tensor, parts: list[tuple[torch.Tensor, ...]]
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge candidate triples ``(rows, values, columns)`` (flat, any number per row) into the running top-k
    ``(best_v, best_i)`` (m, k): each row's candidates fill a padded matrix beside its current k, and one
    ``topk`` keeps the k smallest. The padding is NaN, which ``topk`` ranks after every number and +inf, so it
    is never kept while a row holds k real entries (it always does)."""
    r = torch.cat([p[0] for p in parts])
    v = torch.cat([p[1] for p in parts])
    col = torch.cat([p[2] for p in parts])
    if len(parts) > 1:  # rows ascend within a part, not across parts
        o = torch.argsort(r, stable=True)
        r, v, col = r[o], v[o], col[o]
    m, k = best_v.shape
    cnt = torch.bincount(r, minlength=m)
    rank = torch.arange(len(r), device=r.device) - (torch.cumsum(cnt, 0) - cnt)[r]
    width = k + int(cnt.max())
    cv = torch.full((m, width), math.nan, dtype=best_v.dtype, device=best_v.device)
    ci = torch.zeros((m, width), dtype=torch.int64, device=best_v.device)
    cv[:, :k] = best_v
    ci[:, :k] = best_i
    rank += k
    cv[r, rank] = v
    ci[r, rank] = col
    nv, j = torch.topk(cv, k, dim=1, largest=False, sorted=False)
    return nv, torch.gather(ci, 1, j)


def _below(d: torch.Tensor, thr: torch.Tensor, s: int, groups: int) -> tuple[torch.Tensor, ...] | None:
    """The entries of a tile ``d`` (m × w, contiguous, ``w`` a multiple of ``groups``) below their row's
    threshold ``thr``: ``(rows ascending, values, columns + s)``, or None.

    The columns form ``w / groups`` strided groups {j, j + w/groups, …}; one reduction gives each group's
    minimum, and only the groups whose minimum is below the threshold are read again, entry by entry. A group
    not read has every entry ≥ its minimum ≥ the threshold."""
    m, wt = d.shape
    w = wt // groups
    dv = d.view(m, groups, w)
    gmin = torch.amin(dv, 1)
    # the rows with anything below their threshold first (a cheap reduction; late tiles have few), so that
    # the comparison and nonzero, several times slower per entry than the reductions, see only those
    rows = torch.nonzero(torch.amin(gmin, 1) < thr).squeeze(1)
    if rows.numel() == 0:
        return None
    if rows.numel() < m * 3 // 4:
        f = torch.nonzero((gmin[rows] < thr[rows, None]).view(-1)).squeeze(1)
        r = rows[torch.div(f, w, rounding_mode="floor")]
        j = f % w
    else:
        f = torch.nonzero((gmin < thr[:, None]).view(-1)).squeeze(1)
        r = torch.div(f, w, rounding_mode="floor")
        j = f - r * w
    vals = dv[r, :, j]  # (pairs, groups)
    pi, gi = torch.nonzero(vals < thr[r][:, None], as_tuple=True)
    return r[pi], vals[pi, gi], gi * w + j[pi] + s


def _fold(best_v: torch.Tensor, best_i: torch.Tensor, v: torch.Tensor, i: torch.Tensor, k: int
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """The k smallest (unsorted) of the running list ``best_*`` and a tile's candidates ``v, i``."""
    v, i = torch.cat([best_v, v], 1), torch.cat([best_i, i], 1)
    best_v, j = torch.topk(v, min(k, v.shape[1]), dim=1, largest=False, sorted=False)
    return best_v, torch.gather(i, 1, j)


def _pruned_topk(q: FastRows, c: FastRows, k: int, tile_cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The CPU form of :func:`tile_topk`: tiles of ``tile_cols`` references, each a GEMM into one reused
    buffer (dense modes) or :func:`_tile_values`, then a selection pruned by the running k-th value.

    The first tile seeds each query's top-k (``topk``); after it a tile costs one reduction pass (the minimum
    of every strided column group, :func:`_below`) plus work on the few entries below the threshold, instead
    of a selection over the whole tile. Candidates wait in a list and are merged (:func:`_merge_candidates`)
    once there are ``PRUNE_PENDING`` per query, which also refreshes the thresholds; a threshold that is not
    yet refreshed is larger, so it lets more through, never fewer. Nothing is dropped that is below the
    final k-th value: the contract of :func:`tile_topk` holds."""
    m, n = len(q), len(c)
    dense = q.x is not None and q.g is not None and not q.masked and q.nom is None  # one GEMM per tile
    buf = torch.empty(m * min(tile_cols, n), dtype=q.g.dtype, device=q.g.device) if dense else None
    best_v = best_i = thr = None
    parts: list[tuple[torch.Tensor, ...]] = []
    pending = 0
    for s in range(0, n, tile_cols):
        e = min(s + tile_cols, n)
        w = e - s
        if dense:
            d = buf[:m * w].view(m, w)
            torch.mm(q.g, c.g[s:e].T, out=d)
        else:
            d = _tile_values(q, c.rows(slice(s, e)))
        groups = PRUNE_GROUPS if w % PRUNE_GROUPS == 0 and w // PRUNE_GROUPS >= PRUNE_MIN_WIDTH else 0
        if best_v is None or best_v.shape[1] < k or not groups:
            v, i = smallest(d, min(k, w))
            i += s
            if best_v is None:
                best_v, best_i = v, i
            elif best_v.shape[1] < k:
                best_v, best_i = _fold(best_v, best_i, v, i, k)
            else:  # a narrow tile (the last of the block): its k smallest wait with the other candidates
                rows = torch.arange(m, device=d.device).repeat_interleave(v.shape[1])
                parts.append((rows, v.reshape(-1), i.reshape(-1)))
                pending += rows.numel()
        else:
            got = _below(d if dense else d.contiguous(), thr, s, groups)
            if got is not None:
                parts.append(got)
                pending += got[0].numel()
        if parts and (pending > PRUNE_PENDING * m or e == n):
            best_v, best_i = _merge_candidates(best_v, best_i, parts)
            parts, pending = [], 0
        if best_v.shape[1] == k and (thr is None or not parts):
            thr = best_v.amax(1)
    return best_v, best_i


@register("knn_tile_topk", "torch")
def tile_topk(q: FastRows, c: FastRows, k: int, tile_cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` smallest fast values per query over the reference block ``c`` (see the module docstring)."""
    n = len(c)
    tile_cols = max(int(tile_cols), 1)
    dev = q.x.device if q.x is not None else (q.nom.device if q.nom is not None else None)
    if dev is not None and dev.type == "cpu" and len(q):
        best_v, best_i = _pruned_topk(q, c, k, tile_cols)
    else:
        best_v = best_i = None
        for s in range(0, n, tile_cols):
            e = min(s + tile_cols, n)
            d = _tile_values(q, c.rows(slice(s, e)))
            v, i = smallest(d, min(k, e - s))
            i += s
            best_v, best_i = (v, i) if best_v is None else _fold(best_v, best_i, v, i, k)
    if q.add is not None:
        best_v = best_v + q.add[:, None]
    if q.mode == "cos" and not q.masked:
        best_v = best_v + 1.0
    return best_v, best_i
