"""PyTorch pair sums: the CPU path and the test oracle of the Triton kernels in :mod:`densitas.kde._triton`.

All sums run over the strict upper triangle ``i < j`` in tiles (never an n×n array) and accumulate in float64.
Tiles are sized by the chunk planner (:func:`densitas._backend.plan_chunks`) within the memory budget
(:func:`densitas._backend.memory_budget`, ``DENSITAS_MEMORY_BUDGET``), and no larger than keeps a tile in cache.
Inputs are prepared by :mod:`densitas.kde.pairsum` (centred, sorted for the 1-D sums, whitened for the Gaussian
ones); the contracts are documented there.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from densitas._backend.chunking import memory_budget, plan_chunks
from densitas._backend.dispatch import register

# Elements per tile at most: 2^18 float64 values = 2 MiB per temporary, so that the elementwise passes over a
# tile stay in cache (2.3x faster than 16 MiB tiles on the 2-core CI machine). A smaller memory budget wins.
TILE_ELEMS = 1 << 18
FLOAT64 = 8
# Floors of exponents. PyTorch's CPU exp leaves its vectorised fast path for arguments below about −708 (and for
# −∞): 10–50× slower per element, which made searches that reach small h (tied data, the lower-end extension of
# LSCV_h) crawl. exp(−700) ≈ 1e-304 and exp(−350) ≈ 1e-152 (whose square, e² in the LSCV sums, stays a normal
# number) change a sum by at most that much per pair: far below float64 rounding of every term they meet.
HERMITE_EXP_FLOOR = -700.0
GAUSS_EXP_FLOOR = -350.0


@dataclass(frozen=True)
class TilePlan:
    """Tiles of the upper triangle: row blocks from the chunk planner, ``cols`` columns per tile.

    ``temporaries`` float64 arrays of one tile's shape are alive at once, so one tile's working set is
    ``len(rows) · cols · temporaries · 8`` bytes, at most ``budget``.

    Examples
    --------
    >>> TilePlan([slice(0, 4), slice(4, 6)], cols=8, temporaries=2, budget=512).tile_bytes
    512
    """

    rows: list[slice]
    cols: int
    temporaries: int
    budget: int

    @property
    def tile_bytes(self) -> int:
        """The largest tile's working set in bytes."""
        longest = max((r.stop - r.start for r in self.rows), default=0)
        return longest * self.cols * self.temporaries * FLOAT64


def plan_tiles(rows: int, cols: int, temporaries: int, device: torch.device, *,
               max_elems: int = TILE_ELEMS) -> TilePlan:
    """Plan tiles over ``rows`` rows and at most ``cols`` columns so that a tile's ``temporaries`` float64
    arrays fit both ``max_elems`` elements each (cache) and the memory budget of ``device``, whichever is
    smaller; one row by one column at the very least.

    Examples
    --------
    >>> plan = plan_tiles(10_000, 2048, 4, torch.device("cpu"))
    >>> plan.cols, plan.rows[0]
    (2048, slice(0, 128, None))
    """
    budget = min(memory_budget(device), max_elems * temporaries * FLOAT64)
    cols = max(1, min(cols, budget // (temporaries * FLOAT64)))
    return TilePlan(plan_chunks(rows, cols * temporaries * FLOAT64, budget=budget), cols, temporaries, budget)


def _tiles(n: int, jmax: torch.Tensor | None, plan: TilePlan):
    """Yield ``(i0, i1, j0, j1)`` tiles covering the pairs ``i < j ≤ jmax[i]`` (all ``j`` when ``jmax`` is None)."""
    for block in plan.rows:
        i0, i1 = block.start, block.stop
        jend = n if jmax is None else int(jmax[i1 - 1]) + 1
        for j0 in range(i0 + 1, jend, plan.cols):
            yield i0, i1, j0, min(jend, j0 + plan.cols)


def _upper_mask(i0: int, i1: int, j0: int, j1: int, device: torch.device) -> torch.Tensor | None:
    if j0 > i1 - 1:  # the whole tile lies above the diagonal
        return None
    i = torch.arange(i0, i1, device=device)[:, None]
    j = torch.arange(j0, j1, device=device)[None, :]
    return j > i


@register("kde_hermite_pairsum", "torch")
def hermite_pairsum(x: torch.Tensor, w: torch.Tensor | None, scale: float, coefs: list[float],
                    jmax: torch.Tensor | None) -> float:
    """``Σ_{i<j} w_i w_j He(u_ij) exp(−u_ij²/2)``, ``u_ij = (x_j − x_i)·scale``, ``He(u) = Σ_m coefs[m] u^(2m)``.

    ``x`` is sorted; ``jmax[i]`` (non-decreasing) bounds the columns of row ``i`` (pairs beyond it are below the
    cutoff chosen by the caller); None means all columns.
    """
    n = x.shape[0]
    xd = x.to(torch.float64)
    wd = None if w is None else w.to(torch.float64)
    total = torch.zeros((), dtype=torch.float64, device=x.device)
    plan = plan_tiles(n - 1, min(n, 4096), 3, x.device)  # u² (in place), the polynomial, the mask
    for i0, i1, j0, j1 in _tiles(n, jmax, plan):
        u = xd[None, j0:j1] - xd[i0:i1, None]
        u.mul_(scale)
        s = u.mul_(u)  # u², in place
        p = torch.full_like(s, coefs[-1])
        for c in reversed(coefs[:-1]):
            p.mul_(s).add_(c)
        p.mul_(s.mul_(-0.5).clamp_min_(HERMITE_EXP_FLOOR).exp_())
        mask = _upper_mask(i0, i1, j0, j1, x.device)
        if mask is not None:
            p.masked_fill_(~mask, 0.0)
        if wd is not None:
            total += (wd[i0:i1] @ p @ wd[j0:j1])
        else:
            total += p.sum()
    return float(total)


def _sqdist(zi: torch.Tensor, zj: torch.Tensor, ni: torch.Tensor, nj: torch.Tensor) -> torch.Tensor:
    y = torch.addmm(ni[:, None] + nj[None, :], zi, zj.T, alpha=-2.0)
    return y.clamp_min_(0.0)


@register("kde_gauss_pairsum", "torch")
def gauss_pairsum(z: torch.Tensor, w: torch.Tensor | None, a: torch.Tensor, chain: bool) -> torch.Tensor:
    """``S[k] = (Σ_{i<j} w_i w_j exp(−a_k Y_ij), Σ_{i<j} w_i w_j exp(−2 a_k Y_ij))`` with ``Y_ij = ‖z_i − z_j‖²``.

    Returns a (K, 2) float64 tensor. ``chain`` says that ``a`` is an arithmetic progression (the Triton kernel
    then replaces exponentials by products; this reference ignores it).
    """
    n = z.shape[0]
    zd = z.to(torch.float64)
    wd = None if w is None else w.to(torch.float64)
    norms = (zd * zd).sum(1)
    ad = a.to(device=z.device, dtype=torch.float64)
    out = torch.zeros(ad.shape[0], 2, dtype=torch.float64, device=z.device)
    alist = [float(v) for v in ad]
    chain = chain and len(alist) > 1
    plan = plan_tiles(n - 1, min(n, 2048), 5, z.device)  # Y, the ratio, e, e², the mask
    for i0, i1, j0, j1 in _tiles(n, None, plan):
        y = _sqdist(zd[i0:i1], zd[j0:j1], norms[i0:i1], norms[j0:j1])
        outside = _upper_mask(i0, i1, j0, j1, z.device)
        outside = None if outside is None else ~outside
        # exp(−a_{k+1}Y) = exp(−a_k Y)·exp(−ΔY)
        ratio = torch.exp((y * (alist[0] - alist[1])).clamp_min_(GAUSS_EXP_FLOOR)) if chain else None
        e = None
        for k, ak in enumerate(alist):
            if chain and e is not None:
                e.mul_(ratio)  # pairs outside the triangle stay 0
            else:
                e = torch.exp((y * (-ak)).clamp_min_(GAUSS_EXP_FLOOR))
                if outside is not None:
                    e.masked_fill_(outside, 0.0)
            if wd is not None:
                out[k, 0] += wd[i0:i1] @ (e @ wd[j0:j1])
                out[k, 1] += wd[i0:i1] @ ((e * e) @ wd[j0:j1])
            else:
                flat = e.view(-1)
                out[k, 0] += flat.sum()
                out[k, 1] += torch.dot(flat, flat)
    return out


@register("kde_gauss_pairsum_grad", "torch")
def gauss_pairsum_grad(z: torch.Tensor, w: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Sums and second moments for the LSCV(H) gradient, with ``Y_ij = ‖z_i − z_j‖²`` and ``u = z_i − z_j``:

    ``S = (Σ_{i<j} w_i w_j e_ij, Σ w_i w_j e_ij²)``, ``A = (Σ_{i<j} w_i w_j e_ij u uᵀ, Σ w_i w_j e_ij² u uᵀ)`` with
    ``e_ij = exp(−Y_ij / 4)``. Returns ``S`` (2,) and ``A`` (2, d, d), float64.

    The moments use ``Σ_{i<j} W_ij u uᵀ = Zᵀ diag(s) Z − (C + Cᵀ)``, ``s_i = Σ_{j≠i} W_ij``,
    ``C = Σ_{i<j} W_ij z_i z_jᵀ``: two matrix products per tile instead of d² products per pair.
    """
    n, d = z.shape
    zd = z.to(torch.float64)
    wd = None if w is None else w.to(torch.float64)
    norms = (zd * zd).sum(1)
    s = torch.zeros(2, n, dtype=torch.float64, device=z.device)
    cross = torch.zeros(2, d, d, dtype=torch.float64, device=z.device)
    plan = plan_tiles(n - 1, min(n, 2048), 5, z.device)  # Y, e, e², exp(Y/4) (weighted), the mask
    for i0, i1, j0, j1 in _tiles(n, None, plan):
        y = _sqdist(zd[i0:i1], zd[j0:j1], norms[i0:i1], norms[j0:j1])
        e1 = torch.exp(y.mul_(-0.25).clamp_min_(GAUSS_EXP_FLOOR))
        mask = _upper_mask(i0, i1, j0, j1, z.device)
        if mask is not None:
            e1.masked_fill_(~mask, 0.0)
        if wd is not None:
            e1.mul_(wd[i0:i1, None]).mul_(wd[None, j0:j1])
            e2 = e1 * torch.exp(y)  # w_i w_j e² = (w_i w_j e) · e, with y = −Y/4
        else:
            e2 = e1 * e1
        for t, e in enumerate((e1, e2)):
            s[t, i0:i1] += e.sum(1)
            s[t, j0:j1] += e.sum(0)
            cross[t] += zd[i0:i1].T @ (e @ zd[j0:j1])
    sums = s.sum(1) / 2
    moments = torch.einsum("tn,na,nb->tab", s, zd, zd) - cross - cross.transpose(1, 2)
    return sums, moments
