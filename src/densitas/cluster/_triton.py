"""Triton kernel of :mod:`densitas.cluster`: the atomic scatter of document 004's counting sort (method (a)).

Each program takes a block of keys; every element claims the next free slot of its key's segment with one
``atomic_add`` on a per-key cursor (initialised to the exclusive scan of the histogram) and writes its position
there. Coalesced reads, one atomic per element; the order inside a segment depends on the scheduling — exactly
the property the paper names ("fast, but loses point order inside a cluster"). Contract as in
:mod:`densitas.cluster._torch`.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from densitas._backend.device import sm_count
from densitas._backend.dispatch import interpret_mode

__all__ = ["counting_scatter", "fused_applies", "fused_iterations", "fused_pass"]

BLOCK = 16 if interpret_mode() else 1024  # tiny blocks under the interpreter: small tests span many programs


@triton.jit
def _scatter_kernel(keys_ptr, cursor_ptr, order_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    key = tl.load(keys_ptr + i, mask=m, other=0)
    slot = tl.atomic_add(cursor_ptr + key, 1, mask=m, sem="relaxed")
    tl.store(order_ptr + slot, i, mask=m)


def counting_scatter(keys: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """The Triton implementation of ``cluster_counting_scatter`` (positions grouped by key, unstable)."""
    n = keys.shape[0]
    order = torch.empty(n, dtype=torch.int64, device=keys.device)
    if n == 0:
        return order
    cursor = offsets.to(torch.int64).contiguous().clone()
    _scatter_kernel[(triton.cdiv(n, BLOCK),)](keys.to(torch.int64).contiguous(), cursor, order, n, BLOCK=BLOCK)
    return order


# ------------------------------------------------------------------------------- one whole iteration, fused

#: The largest k and d the fused pass holds on chip (distances to every centroid, the (k, d) partial sums);
#: beyond them FuzzyKMeans takes its chunked path.
FUSED_MAX_CLUSTERS = 64
FUSED_MAX_FEATURES = 128
#: Persistent programs per multiprocessor: each loops over its share of the row blocks and adds its partial
#: sums once (so k·(d + 1) atomic adds per program, not per block).
PROGS_PER_SM = 4
#: Padded k·d up to which the partial sums are a broadcast product (blocks of 32 rows, 8 warps, 2 programs per
#: multiprocessor: the fastest of 153 launch settings measured on the H200 at N = 1,025,010, d = k = 10 —
#: benchmarks/RESULTS.md); beyond it an FMA ``tl.dot`` (blocks of 64 or 32 rows).
SUM3D_MAX = 256


@functools.cache
def _pow2(v: int) -> int:
    return 1 << max(int(v) - 1, 0).bit_length()


@triton.jit
def _block(X, C, LAB, rows, acc, wsum, jsum, n, d, stride_x, inv_qm1, q, K: tl.constexpr, M: tl.constexpr,
           KP: tl.constexpr, DP: tl.constexpr, BLOCK: tl.constexpr, Q2: tl.constexpr, SUMS: tl.constexpr,
           LABELS: tl.constexpr, SUM3D: tl.constexpr):
    """One block of rows of :func:`_fused_pass_kernel`; returns the updated partial sums."""
    ck = tl.arange(0, KP)
    cd = tl.arange(0, DP)
    kmask = ck < K
    dmask = cd < d
    dt = X.dtype.element_ty
    rmask = rows < n
    x = tl.load(X + rows[:, None].to(tl.int64) * stride_x + cd[None, :], mask=rmask[:, None] & dmask[None, :],
                other=0.0)
    # squared distances by differences (no cancellation), one centroid at a time, into a (BLOCK, KP) tile
    D = tl.full((BLOCK, KP), float("inf"), dt)
    for j in tl.static_range(K):
        c = tl.load(C + j * d + cd, mask=dmask, other=0.0).to(dt)
        diff = x - c[None, :]
        D = tl.where(ck[None, :] == j, tl.sum(diff * diff, axis=1)[:, None], D)
    dmin = tl.min(D, axis=1)
    if M == K:
        sel = kmask[None, :] & rmask[:, None]
    else:  # the M nearest, one round each: the smallest left, ties to the lower index
        sel = ck[None, :] < 0
        Dw = D
        for _m in tl.static_range(M):
            mn = tl.min(Dw, axis=1)
            im = tl.min(tl.where(Dw == mn[:, None], ck[None, :], KP), axis=1)
            hit = ck[None, :] == im[:, None]
            sel = sel | hit
            Dw = tl.where(hit, float("inf"), Dw)
        sel = sel & kmask[None, :] & rmask[:, None]
    # memberships relative to the nearest: a = (Dmin / D)^(1/(q−1)) ∈ [0, 1] (no overflow for any q);
    # a row at distance 0 from z centroids gives each of them 1/z
    # (every operand kept finite and positive where it matters: no 0·inf, no log of 0)
    zero = dmin <= 0.0
    Ds = tl.where(sel, D, 0.0)
    ratio = tl.where(sel & (D > 0.0), dmin[:, None] / tl.where(sel & (D > 0.0), D, 1.0), 0.0)
    if Q2:
        a = ratio
    else:
        a = tl.where(ratio > 0.0, tl.exp2(tl.log2(tl.where(ratio > 0.0, ratio, 1.0)) * inv_qm1), 0.0)
    a = tl.where(zero[:, None], tl.where(sel & (D <= 0.0), 1.0, 0.0).to(dt), a)
    u = a / tl.maximum(tl.sum(a, axis=1), 1e-30)[:, None]
    if Q2:
        w = u * u
    else:
        w = tl.where(u > 0.0, tl.exp2(tl.log2(tl.where(u > 0.0, u, 1.0)) * q), 0.0)
    jsum += tl.sum(w * Ds, axis=1).to(tl.float64)
    if SUMS:
        if SUM3D:  # small k·d: a broadcast product reduced over the rows (measured faster than the FMA dot)
            acc += tl.sum(w[:, :, None] * x[:, None, :], axis=0)
        else:
            acc = tl.dot(tl.trans(w), x, acc, input_precision="ieee", out_dtype=dt)
        wsum += tl.sum(w, axis=0)
    if LABELS:
        lab = tl.min(tl.where(D == dmin[:, None], ck[None, :], KP), axis=1)
        tl.store(LAB + rows, lab.to(tl.int64), mask=rmask)
    return acc, wsum, jsum


@triton.jit
def _fused_pass_kernel(X, C, ACC, LAB, n, d, stride_x, per_prog, inv_qm1, q, K: tl.constexpr, M: tl.constexpr,
                       KP: tl.constexpr, DP: tl.constexpr, BLOCK: tl.constexpr, Q2: tl.constexpr,
                       SUMS: tl.constexpr, LABELS: tl.constexpr, INTERPRETED: tl.constexpr,
                       SUM3D: tl.constexpr):
    """One GFKM pass over the row blocks ``pid, pid + P, …`` (``per_prog`` of them): distances to every
    centroid (registers), the M nearest, memberships u, weights u^q, the objective and the partial sums Σ w·x,
    Σ w, added atomically once per program into ``ACC`` (k·(d + 1) + 1 float64: the sums row by row, then J)."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    ck = tl.arange(0, KP)
    cd = tl.arange(0, DP)
    kmask = ck < K
    dmask = cd < d
    dt = X.dtype.element_ty
    acc = tl.zeros((KP, DP), dtype=dt)
    wsum = tl.zeros((KP,), dtype=dt)
    jsum = tl.zeros((BLOCK,), dtype=tl.float64)
    if INTERPRETED:  # the interpreter runs no range() over a runtime bound; a while loop is the same walk
        i = 0
        while i < per_prog:
            acc, wsum, jsum = _block(X, C, LAB, (pid + i * nprog) * BLOCK + tl.arange(0, BLOCK), acc, wsum, jsum,
                                     n, d, stride_x, inv_qm1, q, K, M, KP, DP, BLOCK, Q2, SUMS, LABELS, SUM3D)
            i += 1
    else:
        for i in range(per_prog):
            acc, wsum, jsum = _block(X, C, LAB, (pid + i * nprog) * BLOCK + tl.arange(0, BLOCK), acc, wsum, jsum,
                                     n, d, stride_x, inv_qm1, q, K, M, KP, DP, BLOCK, Q2, SUMS, LABELS, SUM3D)
    if SUMS:
        tl.atomic_add(ACC + ck[:, None] * (d + 1) + cd[None, :], acc.to(tl.float64),
                      mask=kmask[:, None] & dmask[None, :], sem="relaxed")
        tl.atomic_add(ACC + ck * (d + 1) + d, wsum.to(tl.float64), mask=kmask, sem="relaxed")
    tl.atomic_add(ACC + K * (d + 1), tl.sum(jsum, axis=0), sem="relaxed")


@triton.jit
def _finalize_kernel(ACC, C_OLD, C_NEW, J_OUT, MOVE_OUT, EMPTY_OUT, k, d, KP: tl.constexpr, DP: tl.constexpr):
    """New centroids from the sums (zero total weight: the old centroid, counted as empty), the largest move and
    the objective; then zero ``ACC`` for the next pass. One program."""
    ck = tl.arange(0, KP)
    cd = tl.arange(0, DP)
    km = ck < k
    m2 = km[:, None] & (cd < d)[None, :]
    sp = ACC + ck[:, None] * (d + 1) + cd[None, :]
    s = tl.load(sp, mask=m2, other=0.0)
    tot = tl.load(ACC + ck * (d + 1) + d, mask=km, other=1.0)
    old = tl.load(C_OLD + ck[:, None] * d + cd[None, :], mask=m2, other=0.0)
    pos = tot > 0.0
    new = tl.where(pos[:, None], s / tl.where(pos, tot, 1.0)[:, None], old)
    tl.store(C_NEW + ck[:, None] * d + cd[None, :], new, mask=m2)
    diff = tl.where(m2, new - old, 0.0)
    tl.store(MOVE_OUT, tl.max(tl.sqrt(tl.sum(diff * diff, axis=1)), axis=0))
    tl.store(EMPTY_OUT, tl.sum((km & (tot <= 0.0)).to(tl.int32), axis=0))
    tl.store(J_OUT, tl.load(ACC + k * (d + 1)))
    tl.store(sp, tl.zeros((KP, DP), dtype=tl.float64), mask=m2)
    tl.store(ACC + ck * (d + 1) + d, tl.zeros((KP,), dtype=tl.float64), mask=km)
    tl.store(ACC + k * (d + 1), 0.0)


def fused_applies(X: torch.Tensor, n_clusters: int, fuzzifier: float = 2.0) -> bool:
    """Whether the fused pass takes ``X`` with ``n_clusters`` centroids and fuzzifier q: float32 rows (or float64
    rows with q = 2: the kernel's powers ``exp2``/``log2`` are single-precision on the GPU, measured 1e-7 relative
    on float64 data) with unit column stride, k ≤ :data:`FUSED_MAX_CLUSTERS`, d ≤ :data:`FUSED_MAX_FEATURES`."""
    ok_dtype = X.dtype == torch.float32 or (X.dtype == torch.float64 and float(fuzzifier) == 2.0)
    return (X.ndim == 2 and ok_dtype and X.shape[0] > 0
            and (X.stride(1) == 1 or X.shape[1] == 1) and 1 <= n_clusters <= FUSED_MAX_CLUSTERS
            and 1 <= X.shape[1] <= FUSED_MAX_FEATURES)


def _launch(X: torch.Tensor, C: torch.Tensor, acc: torch.Tensor, lab: torch.Tensor | None, M: int, q: float,
            sums: bool) -> None:
    n, d = X.shape
    k = C.shape[0]
    KP = max(16, _pow2(k))
    DP = max(16, _pow2(d))
    if interpret_mode():
        BLOCK, warps, progs = 16, 4, 3  # several programs, several blocks each, in small tests
    elif KP * DP <= SUM3D_MAX:
        BLOCK, warps, progs = 32, 8, sm_count(X.device) * 2
    else:
        BLOCK = 64 if KP * DP <= 4096 else 32
        warps, progs = (4 if KP * DP <= 4096 else 8), sm_count(X.device) * PROGS_PER_SM
    n_blocks = triton.cdiv(n, BLOCK)
    grid = max(1, min(n_blocks, progs))
    M = min(int(M), k)
    _fused_pass_kernel[(grid,)](X, C, acc, lab if lab is not None else acc, n, d, X.stride(0),
                                triton.cdiv(n_blocks, grid), 1.0 / (q - 1.0), float(q), K=k, M=M, KP=KP, DP=DP,
                                BLOCK=BLOCK, Q2=q == 2.0, SUMS=sums, LABELS=lab is not None,
                                INTERPRETED=interpret_mode(), SUM3D=KP * DP <= SUM3D_MAX, num_warps=warps)


def fused_pass(X: torch.Tensor, C: torch.Tensor, n_nearest: int, q: float, *, sums: bool = True,
               labels: bool = False) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor | None]:
    """The Triton implementation of ``cluster_fused_pass`` (contract in :mod:`densitas.cluster._torch`): one
    kernel over the data, in X's precision (float32 data: float32 arithmetic, float64 sums across programs)."""
    k, d = C.shape
    acc = torch.zeros(k * (d + 1) + 1, dtype=torch.float64, device=X.device)
    lab = torch.empty(X.shape[0], dtype=torch.int64, device=X.device) if labels else None
    _launch(X, C.to(device=X.device, dtype=torch.float64).contiguous(), acc, lab, n_nearest, q, sums)
    return (acc[:-1].view(k, d + 1) if sums else None), acc[-1], lab


def fused_iterations(X: torch.Tensor, C0: torch.Tensor, n_nearest: int, q: float, steps: int
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The Triton implementation of ``cluster_fused_iterations``: two launches per update (the fused pass and
    a one-program finalize that also clears the sums), nothing read back to the host."""
    k, d = C0.shape
    dev = X.device
    Cs = torch.empty((steps + 1, k, d), dtype=torch.float64, device=dev)
    Cs[0] = C0
    acc = torch.zeros(k * (d + 1) + 1, dtype=torch.float64, device=dev)
    J = torch.empty(steps, dtype=torch.float64, device=dev)
    move = torch.empty(steps, dtype=torch.float64, device=dev)
    empty = torch.empty(steps, dtype=torch.int32, device=dev)
    KP = max(16, _pow2(k))
    DP = max(16, _pow2(d))
    for s in range(steps):
        _launch(X, Cs[s], acc, None, n_nearest, q, True)
        _finalize_kernel[(1,)](acc, Cs[s], Cs[s + 1], J[s:], move[s:], empty[s:], k, d, KP=KP, DP=DP)
    return Cs, J, move, empty
