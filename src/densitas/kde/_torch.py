"""PyTorch pair sums: the CPU path and the test oracle of the Triton kernels in :mod:`densitas.kde._triton`.

All sums run over the strict upper triangle ``i < j`` in tiles (never an n×n array) and accumulate in float64.
Inputs are prepared by :mod:`densitas.kde.pairsum` (centred, sorted for the 1-D sums, whitened for the Gaussian
ones); the contracts are documented there.
"""

from __future__ import annotations

import torch

from densitas._backend.dispatch import register

# Elements per tile: 2^18 float64 values = 2 MiB per temporary, so that the elementwise passes over a tile
# stay in cache (2.3x faster than 16 MiB tiles on the 2-core CI machine).
TILE_ELEMS = 1 << 18


def _row_block(n: int, width: int) -> int:
    return max(1, min(n, TILE_ELEMS // max(width, 1)))


def _tiles(n: int, jmax: torch.Tensor | None, rows: int, cols: int):
    """Yield ``(i0, i1, j0, j1)`` tiles covering the pairs ``i < j ≤ jmax[i]`` (all ``j`` when ``jmax`` is None)."""
    for i0 in range(0, n - 1, rows):
        i1 = min(n, i0 + rows)
        jend = n if jmax is None else int(jmax[i1 - 1]) + 1
        for j0 in range(i0 + 1, jend, cols):
            yield i0, i1, j0, min(jend, j0 + cols)


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
    cols = 4096
    rows = _row_block(n, cols)
    for i0, i1, j0, j1 in _tiles(n, jmax, rows, cols):
        u = xd[None, j0:j1] - xd[i0:i1, None]
        u.mul_(scale)
        s = u.mul_(u)  # u², in place
        p = torch.full_like(s, coefs[-1])
        for c in reversed(coefs[:-1]):
            p.mul_(s).add_(c)
        p.mul_(s.mul_(-0.5).exp_())
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
    cols = 2048
    rows = _row_block(n, cols)
    for i0, i1, j0, j1 in _tiles(n, None, rows, cols):
        y = _sqdist(zd[i0:i1], zd[j0:j1], norms[i0:i1], norms[j0:j1])
        mask = _upper_mask(i0, i1, j0, j1, z.device)
        if mask is not None:
            y.masked_fill_(~mask, torch.inf)  # exp(−a·∞) = 0 for every a > 0
        ratio = torch.exp(y * (alist[0] - alist[1])) if chain else None  # exp(−a_{k+1}Y) = exp(−a_k Y)·exp(−ΔY)
        e = None
        for k, ak in enumerate(alist):
            e = e.mul_(ratio) if (chain and e is not None) else torch.exp(y * (-ak))
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
    cols = 2048
    rows = _row_block(n, cols)
    for i0, i1, j0, j1 in _tiles(n, None, rows, cols):
        y = _sqdist(zd[i0:i1], zd[j0:j1], norms[i0:i1], norms[j0:j1])
        e1 = torch.exp(y.mul_(-0.25))
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
