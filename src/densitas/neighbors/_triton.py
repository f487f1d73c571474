"""Fused squared-Euclidean distance + running top-k in Triton (the CUDA fast path of k-NN search).

One program owns ``BM`` queries and one *split* of the references. It streams the split in tiles of ``BN``
references: the tile's distances ``‖q‖² + ‖c‖² − 2 q·c`` come from one ``tl.dot`` (TF32 on the matrix units
where allowed), and never leave the chip. Each distance and its reference index are packed into one int64 key
(the float's bits above the index: for non-negative floats the integer order is the float order, and equal
distances order by the lower index). The running top-``KP`` is an unsorted set of keys with its worst
distance as a threshold: a tile's distances below the threshold enter one round at a time (each row's smallest
replaces the row's worst), so after the first tiles almost every tile costs one comparison per distance; the
set is sorted once at the end. The result per (query, split) is ``KP``
candidate keys; :func:`candidates` merges the splits.

The keys are *candidates*: the caller re-ranks them in float64 and certifies that the exact top-k is among them
(:func:`fused_kneighbors`, or the search of :mod:`densitas.neighbors.search` through the operation
``knn_tile_topk``), so TF32 rounding never changes an answer.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from densitas._backend.device import sm_count
from densitas.exceptions import InputError
from densitas.neighbors.distances import DOT_ROUNDOFF, rounding_bound, seed_above

__all__ = ["MAX_D", "MAX_KP", "MAX_ROWS", "candidates", "candidates_below", "fused_applies", "fused_kneighbors",
           "masked_kneighbors", "mixed_kneighbors", "tile_topk"]

MAX_KP = 256  # the largest candidate list kept on chip; larger k takes the GEMM + topk path
MAX_D = 256  # the widest rows one dot covers; wider data takes the GEMM + topk path
MAX_ROWS = (1 << 32) - MAX_KP - 1  # references per launch: row numbers are the low 32 bits of a key
SHARED_BYTES = 200_000  # what the launch settings may ask of shared memory (the H200 has 227 kB per block)
_INF_BITS = 0x7F800000  # float32 +inf


@triton.jit
def _products(q, R, RN, ds, cols, cmask, d, stride_r, BD: tl.constexpr, PRECISION: tl.constexpr,
              SCALED: tl.constexpr):
    """The tile ``cols``'s dot products with the block's queries ``q`` (undone from float16's scale when
    ``SCALED``) and the references' squared norms (+inf past the end: those never enter or pass)."""
    dk = tl.arange(0, BD)
    # 64-bit offsets: 10⁸ references × 64 columns is past 2³¹ elements
    r = tl.load(R + cols[:, None].to(tl.int64) * stride_r + dk[None, :], mask=cmask[:, None] & (dk < d)[None, :],
                other=0.0)
    acc = tl.dot(q, tl.trans(r), input_precision=PRECISION)
    if SCALED:  # exact: a power of two
        acc = acc * ds
    return acc, tl.load(RN + cols, mask=cmask, other=float("inf"))


@triton.jit
def _tile(q, R, qn, RN, best, thresh, seed, rnmax, ds, cols, n, d, stride_r,
          BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr, KP: tl.constexpr, PRECISION: tl.constexpr,
          SCALED: tl.constexpr):
    """Fold the tile of references ``cols`` into the running top-KP ``best`` (unsorted keys) and its worst
    distance ``thresh`` (never above the row's ``seed``): the tile's distances below ``thresh`` enter one at a
    time (each row's smallest replaces its worst). A tile is first screened on ``‖c‖² − 2q·c`` alone (one
    fused multiply-add and one row minimum per distance): the row minimum plus ``‖q‖²`` against ``thresh``
    widened by ``2⁻¹⁸·(thresh + ‖q‖² + max‖c‖²)``, which covers the float32 rounding of both forms: a distance below
    ``thresh`` always passes the screen, so a tile with no improving distance costs that much and no more.
    ``SCALED``: the operands are float16 copies scaled by ``s`` (a power of two) and ``ds = s⁻²`` undoes it."""
    acc, rn = _products(q, R, RN, ds, cols, cols < n, d, stride_r, BD, PRECISION, SCALED)
    smin = tl.min(rn[None, :] - 2.0 * acc, axis=1)
    screen = thresh + 0.000003814697265625 * (thresh + qn + rnmax)  # 2⁻¹⁸ of margin
    left = tl.sum((smin + qn < screen).to(tl.int32), axis=0)  # padding rows: qn = +inf never passes
    if left > 0:
        dist = tl.maximum(qn[:, None] + rn[None, :] - 2.0 * acc, 0.0)
        # references are visited in increasing index within a split: a later equal distance never wins a tie
        hit = dist < thresh[:, None]
        left = tl.sum(tl.sum(hit.to(tl.int32), axis=1), axis=0)
        big = tl.full([BM, BN], 0x7FFFFFFFFFFFFFFF, tl.int64)
        bits = dist.to(tl.int32, bitcast=True).to(tl.int64)
        keys = tl.where(hit, (bits << 32) | cols[None, :].to(tl.int64), big)
        for _ in range(KP):  # at most KP rounds: a row takes at most KP keys from one tile
            if left > 0:
                kmin = tl.min(keys, axis=1)
                worst = tl.max(best, axis=1)
                take = kmin < worst
                best = tl.where((best == worst[:, None]) & take[:, None], kmin[:, None], best)
                worst = tl.max(best, axis=1)
                keys = tl.where((keys == kmin[:, None]) | (keys > worst[:, None]), big, keys)
                left = tl.sum(tl.sum((keys != big).to(tl.int32), axis=1), axis=0)
        thresh = tl.minimum((tl.max(best, axis=1) >> 32).to(tl.int32).to(tl.float32, bitcast=True), seed)
    return best, thresh


@triton.jit
def _knn_kernel(Q, R, QN, RN, RNMAX, DS, SEED, OUT, m, n, d, n_per_split,
                stride_q, stride_r,
                BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr, KP: tl.constexpr,
                PRECISION: tl.constexpr, INTERPRETED: tl.constexpr, HAS_SEED: tl.constexpr, SCALED: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_s = tl.program_id(1)
    n_splits = tl.num_programs(1)
    rows = pid_m * BM + tl.arange(0, BM)
    rmask = rows < m
    qn = tl.load(QN + rows, mask=rmask, other=float("inf"))  # +inf: padding rows never take a reference
    start = pid_s * n_per_split
    kk = tl.arange(0, KP)
    # +inf with distinct padding indices (keys must be unique: the worst is replaced by equality)
    best = (tl.full([BM, KP], 0x7F800000, tl.int64) << 32) | (tl.full([BM, KP], 0xFFFFFFFF, tl.int64) - kk[None, :])
    if HAS_SEED:  # a per-query bound: only distances below it are wanted
        seed = tl.load(SEED + rows, mask=rmask, other=float("inf"))
    else:
        seed = tl.full([BM], float("inf"), tl.float32)
    thresh = seed
    rnmax = tl.load(RNMAX)
    ds = tl.load(DS)
    dk = tl.arange(0, BD)  # the block's queries are loaded once, not once per tile
    q = tl.load(Q + rows[:, None].to(tl.int64) * stride_q + dk[None, :], mask=rmask[:, None] & (dk < d)[None, :],
                other=0.0)
    if INTERPRETED:  # the interpreter runs no range() over a runtime bound; a while loop is the same walk
        c0 = 0
        while c0 < n_per_split:
            best, thresh = _tile(q, R, qn, RN, best, thresh, seed, rnmax, ds, start + c0 + tl.arange(0, BN), n, d,
                                 stride_r, BM, BN, BD, KP, PRECISION, SCALED)
            c0 += BN
    else:
        for c0 in range(0, n_per_split, BN):
            best, thresh = _tile(q, R, qn, RN, best, thresh, seed, rnmax, ds, start + c0 + tl.arange(0, BN), n, d,
                                 stride_r, BM, BN, BD, KP, PRECISION, SCALED)
    best = tl.sort(best, dim=1)
    out = OUT + (rows[:, None] * n_splits + pid_s) * KP + kk[None, :]
    tl.store(out, best, mask=rmask[:, None])


@triton.jit
def _below_tile(q, R, qn, RN, tau, ds, CNT, OUT, rows, cols, stop, d, cap, stride_r,
                BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr, PRECISION: tl.constexpr,
                SCALED: tl.constexpr):
    """Append the keys of the tile ``cols``'s references below each query's ``tau`` to the query's row of ``OUT``."""
    acc, rn = _products(q, R, RN, ds, cols, cols < stop, d, stride_r, BD, PRECISION, SCALED)
    dist = tl.maximum(qn[:, None] + rn[None, :] - 2.0 * acc, 0.0)
    hit = dist < tau[:, None]
    if tl.max(tl.max(hit.to(tl.int32), axis=1), axis=0) > 0:
        # an int32 counter (an int64 one is several times slower on the H200); at most MAX_ROWS < 2³² references
        # pass, so a count past 2³¹ reads as negative and never wraps back into [0, cap)
        slot = tl.atomic_add(CNT + rows[:, None] + 0 * cols[None, :], tl.full([BM, BN], 1, tl.int32), mask=hit,
                             sem="relaxed")
        keys = (dist.to(tl.int32, bitcast=True).to(tl.int64) << 32) | cols[None, :].to(tl.int64)
        tl.store(OUT + rows[:, None].to(tl.int64) * cap + slot, keys, mask=hit & (slot >= 0) & (slot < cap))


@triton.jit
def _below_kernel(Q, R, QN, RN, DS, TAU, CNT, OUT, m, n, d, n_per_split, cap, stride_q, stride_r,
                  BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr, PRECISION: tl.constexpr,
                  INTERPRETED: tl.constexpr, SCALED: tl.constexpr):
    """Every reference whose approximate squared distance to a query is below the query's ``TAU``: its key (the
    distance's bits above the row, as in :func:`_tile`) is appended to the query's row of ``OUT`` (``cap`` wide)
    at the slot an atomic counter ``CNT`` hands out; a count past ``cap`` is still counted, not stored. No top-k
    is kept on chip, so a block can hold many queries (each reference tile is read once per block)."""
    pid_m = tl.program_id(0)
    pid_s = tl.program_id(1)
    rows = pid_m * BM + tl.arange(0, BM)
    rmask = rows < m
    qn = tl.load(QN + rows, mask=rmask, other=0.0)
    tau = tl.load(TAU + rows, mask=rmask, other=float("-inf"))  # padding rows never pass
    ds = tl.load(DS)
    dk = tl.arange(0, BD)
    q = tl.load(Q + rows[:, None].to(tl.int64) * stride_q + dk[None, :], mask=rmask[:, None] & (dk < d)[None, :],
                other=0.0)
    start = pid_s * n_per_split
    stop = tl.minimum(start + n_per_split, n)
    if INTERPRETED:  # the interpreter runs no range() over a runtime bound; a while loop is the same walk
        c0 = start
        while c0 < stop:
            _below_tile(q, R, qn, RN, tau, ds, CNT, OUT, rows, c0 + tl.arange(0, BN), stop, d, cap, stride_r,
                        BM, BN, BD, PRECISION, SCALED)
            c0 += BN
    else:
        for c0 in range(start, stop, BN):
            _below_tile(q, R, qn, RN, tau, ds, CNT, OUT, rows, c0 + tl.arange(0, BN), stop, d, cap, stride_r,
                        BM, BN, BD, PRECISION, SCALED)


def _pow2(x: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(1, x))))


def _checked(fn: str, precision: str, kp: int, n: int) -> None:
    """The arguments the candidate functions share, checked (``fn`` names the function in the message)."""
    if precision not in ("tf32", "ieee", "fp16"):
        raise InputError(f"The 'precision' parameter of {fn} must be 'tf32', 'ieee' or 'fp16'. Got {precision!r} "
                         "instead.")
    if kp != _pow2(kp) or kp > MAX_KP:
        raise InputError(f"The 'kp' parameter of {fn} must be a power of two <= {MAX_KP}. Got {kp} instead.")
    if n > MAX_ROWS:  # a key holds the reference's row in its low 32 bits, the padding takes the top MAX_KP
        raise InputError(f"The 'R' parameter of {fn} must have at most {MAX_ROWS:,} rows. Got {n:,} instead.")


def _split(m: int, n: int, BM: int, BN: int, device: torch.device, splits: int | None) -> tuple[int, int]:
    """``(splits, per)``: how many programs share the ``n`` references of a block of ``BM`` queries (by default
    enough programs to fill the GPU, four per multiprocessor, each with at least 16 tiles) and the references per
    program, a multiple of ``BN``."""
    if splits is None:
        sms = sm_count(device) if device.type == "cuda" else 4
        splits = max(1, min(triton.cdiv(4 * sms, triton.cdiv(m, BM)), triton.cdiv(n, 16 * BN)))
    per = triton.cdiv(triton.cdiv(max(n, 1), splits), BN) * BN
    return triton.cdiv(max(n, 1), per), per


def candidates(Q: torch.Tensor, R: torch.Tensor, kp: int, *, precision: str = "tf32",
               splits: int | None = None, block_m: int | None = None, block_n: int | None = None,
               num_warps: int | None = None, num_stages: int | None = None,
               with_norms: bool = True, seed: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """For each row of ``Q`` the ``kp`` references of ``R`` nearest in (TF32-rounded) squared distance.

    Parameters
    ----------
    Q, R : torch.Tensor
        float32, 2-D, same device and width.
    kp : int
        Candidates per query, a power of two ≤ :data:`MAX_KP`.
    precision : {"tf32", "ieee", "fp16"}
        ``tl.dot``'s input precision; "fp16": the dot's operands are float16 copies of ``Q`` and ``R`` scaled by a
        power of two that puts their largest magnitude at 2¹⁴ (half the bytes of float32 and twice TF32's rate
        on the matrix units; relative rounding 2⁻¹¹, as TF32's 2⁻¹⁰, plus the absolute rounding of values that
        scale below float16's normal range, :func:`rounding_bound`). The norms stay float32.
    splits : int, optional
        How many programs share the references of one block of queries (default: enough to fill the GPU).
    block_m, block_n, num_warps, num_stages : int, optional
        Launch settings (queries and references per tile, warps, pipeline stages); defaults by ``kp``.
    with_norms : bool
        False: the value is ``−2·q·c`` alone (forms that fold the norms into the product).
    seed : torch.Tensor of shape (len(Q),), float32, optional
        Per query, a value above which nothing is wanted (a search that already holds neighbours): the kernel
        keeps only values below it, and a tile with none costs one screen. Every reference not returned then
        has a value ≥ ``min(seed, dist2[:, -1])``.

    Returns
    -------
    dist2 : torch.Tensor of shape (len(Q), kp), float32
        Approximate squared distances, ascending (``inf`` where ``R`` has fewer rows, or fewer below ``seed``).
    index : torch.Tensor of shape (len(Q), kp), int64
        Their reference rows (ties by the lower index).
    """
    m, d = Q.shape
    n = R.shape[0]
    _checked("candidates", precision, kp, n)
    Q, R = Q.contiguous(), R.contiguous()
    if with_norms:
        qn, rn = (Q * Q).sum(1), (R * R).sum(1)
    else:  # the value is −2·Q·Rᵀ alone (the caller folded everything into the product)
        qn, rn = Q.new_zeros(m), R.new_zeros(n)
    # launch settings measured on the H200 (benchmarks/RESULTS.md): 64 queries, 3 stages for short lists;
    # 16 queries, 2 stages for kp = 128 (the kept keys take the registers)
    BM = block_m or (64 if kp <= 64 else 16)
    BN = max(block_n or 64, kp)
    stages = num_stages or (3 if kp <= 64 else 2)
    BD_ = max(16, _pow2(d))
    # the pipelined operand tiles must fit the H200's 227 kB of shared memory (wide rows: fewer stages, then
    # fewer queries per block)
    while stages * (BM + BN) * BD_ * 4 > SHARED_BYTES and not (block_m and num_stages):
        if stages > 2 and not num_stages:
            stages -= 1
        elif BM > 16 and not block_m:
            BM //= 2
        elif stages > 1 and not num_stages:
            stages -= 1
        else:
            break
    BD = max(16, _pow2(d))  # the whole row of features in one dot (d <= MAX_D)
    blocks = triton.cdiv(m, BM)
    splits, per = _split(m, n, BM, BN, Q.device, splits)
    out = torch.empty((m, splits, kp), dtype=torch.int64, device=Q.device)
    rnmax = rn.amax().clamp(min=0.0).reshape(1) if n else rn.new_zeros(1)  # on the device: no host sync
    seed_arg = seed.to(torch.float32).contiguous() if seed is not None else qn
    scaled = precision == "fp16"
    if scaled:
        Q, R, ds = _half_operands(Q, R)
    else:
        ds = rnmax  # unread
    _knn_kernel[(blocks, splits)](Q, R, qn, rn, rnmax, ds, seed_arg, out, m, n, d, per, Q.stride(0), R.stride(0),
                                  BM=BM, BN=BN, BD=BD, KP=kp, PRECISION="ieee" if scaled else precision,
                                  INTERPRETED=os.environ.get("TRITON_INTERPRET") == "1", HAS_SEED=seed is not None,
                                  SCALED=scaled, num_warps=num_warps or 4, num_stages=stages)
    keys = out.view(m, splits * kp)
    if splits > 1:
        keys = torch.sort(keys, dim=1).values[:, :kp]
    dist = (keys >> 32).to(torch.int32).view(torch.float32)
    return dist, keys & 0xFFFFFFFF


def candidates_below(Q: torch.Tensor, R: torch.Tensor, kp: int, seed: torch.Tensor, *, precision: str = "tf32",
                     cap: int | None = None, splits: int | None = None, block_m: int | None = None,
                     block_n: int | None = None, num_warps: int | None = None,
                     num_stages: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`candidates` with a seed, in two steps: a kernel that keeps no top-k on chip appends every reference
    below its query's ``seed`` to a per-query buffer of ``cap`` slots (:func:`_below_kernel`), then ``torch.topk``
    takes the ``kp`` smallest of each buffer. It is the faster form when the seed is tight (few references pass,
    as when it is the exact k-th value of a sample of the references): a block can then hold 64 queries instead of
    16, and a tile costs a dot and a comparison. Queries with more than ``cap`` references below their seed run
    :func:`candidates` instead. The contract is :func:`candidates`'s: every reference not returned has a value
    ≥ ``min(seed, dist2[:, -1])``.

    Parameters
    ----------
    Q, R, kp, precision
        As in :func:`candidates`.
    seed : torch.Tensor of shape (len(Q),)
        Per query, the value below which references are kept.
    cap : int, optional
        Slots per query (default ``8·kp``, at least 1,024).
    splits, block_m, block_n, num_warps, num_stages : int, optional
        Launch settings (default: 64 queries × 64 references per tile, 4 warps, 3 stages).

    Returns
    -------
    dist2 : torch.Tensor of shape (len(Q), kp), float32
        Approximate squared distances, ascending; ``inf`` past the references returned.
    index : torch.Tensor of shape (len(Q), kp), int64
        Their reference rows (ties by the lower index); ``len(R)`` where ``dist2`` is ``inf``.

    Examples
    --------
    >>> import torch
    >>> R = torch.arange(8.0).reshape(8, 1)
    >>> Q = torch.tensor([[2.2]])
    >>> # on CUDA or under Triton's interpreter (TRITON_INTERPRET=1)
    >>> d2, i = candidates_below(Q, R, 2, torch.tensor([1.0]), precision="ieee")  # doctest: +SKIP
    >>> i.tolist()  # doctest: +SKIP
    [[2, 3]]
    """
    m, d = Q.shape
    n = R.shape[0]
    _checked("candidates_below", precision, kp, n)
    cap = max(int(cap or max(1024, 8 * kp)), kp)
    Q, R = Q.contiguous(), R.contiguous()
    qn, rn = (Q * Q).sum(1), (R * R).sum(1)
    BM, BN = block_m or 64, block_n or 64
    BD = max(16, _pow2(d))
    stages = num_stages or 3
    while stages > 1 and stages * (BM + BN) * BD * 4 > SHARED_BYTES and not num_stages:
        stages -= 1
    splits, per = _split(m, n, BM, BN, Q.device, splits)
    scaled = precision == "fp16"
    if scaled:
        Qk, Rk, ds = _half_operands(Q, R)
    else:
        Qk, Rk, ds = Q, R, qn.new_ones(1)
    seed = seed.to(torch.float32).contiguous()
    keys = torch.empty((m, kp), dtype=torch.int64, device=Q.device)
    group = max(BM, (BUFFER_BYTES // (8 * cap)) // BM * BM)  # queries per launch: the buffer stays bounded
    for g0 in range(0, m, group):
        g1 = min(g0 + group, m)
        count = torch.zeros(g1 - g0, dtype=torch.int32, device=Q.device)
        out = torch.full((g1 - g0, cap), 0x7FFFFFFFFFFFFFFF, dtype=torch.int64, device=Q.device)
        if n:
            _below_kernel[(triton.cdiv(g1 - g0, BM), splits)](
                Qk[g0:g1], Rk, qn[g0:g1], rn, ds, seed[g0:g1], count, out, g1 - g0, n, d, per, cap, Qk.stride(0),
                Rk.stride(0), BM=BM, BN=BN, BD=BD, PRECISION="ieee" if scaled else precision,
                INTERPRETED=os.environ.get("TRITON_INTERPRET") == "1", SCALED=scaled, num_warps=num_warps or 4,
                num_stages=stages)
        keys[g0:g1] = torch.topk(out, kp, dim=1, largest=False, sorted=True).values
        over = torch.nonzero((count > cap) | (count < 0)).flatten() + g0  # negative: past 2³¹ passes
        if len(over):  # too many below the seed: the kernel that keeps a top-k on chip
            dist_o, idx_o = candidates(Q[over], R, kp, precision=precision, seed=seed[over])
            keys[over] = (dist_o.view(torch.int32).to(torch.int64) << 32) | idx_o
    dist = torch.where(keys == 0x7FFFFFFFFFFFFFFF, math.inf, (keys >> 32).to(torch.int32).view(torch.float32))
    index = torch.where(torch.isinf(dist), n, keys & 0xFFFFFFFF)  # padding: no reference passes at +inf
    return dist, index


#: The candidate buffer of one :func:`candidates_below` launch (queries × slots × 8 bytes) stays below this.
BUFFER_BYTES = 1 << 30
#: The threshold pass (:func:`_threshold_pass`) samples 1/THRESHOLD_SAMPLE² then 1/THRESHOLD_SAMPLE of the
#: references to set its seed; it runs for kp ≥ THRESHOLD_MIN_KP candidates and THRESHOLD_MIN_ROWS references
#: (None: never).
THRESHOLD_SAMPLE = 16
THRESHOLD_MIN_KP = 64
THRESHOLD_MIN_ROWS: int | None = 1 << 18
#: The threshold pass's first GEMM (queries × its sample of references, float32) runs in blocks below this size.
STAGE0_BYTES = 1 << 28


def threshold_applies(n: int, kp: int) -> bool:
    """Whether :func:`fused_kneighbors` runs the threshold pass by default for ``n`` references and ``kp``
    candidates.

    Examples
    --------
    >>> threshold_applies(1_000_000, 128), threshold_applies(1_000_000, 32), threshold_applies(1_000, 128)
    (True, False, False)
    """
    return THRESHOLD_MIN_ROWS is not None and kp >= THRESHOLD_MIN_KP and n >= THRESHOLD_MIN_ROWS and n > kp


def threshold_bytes(n: int, d: int, k: int, m: int) -> int:
    """Device memory the threshold pass adds for ``m`` queries (at most one launch's worth), ``n`` references of
    ``d`` columns and ``k`` neighbours: its buffer and ``torch.topk``'s copy of it, the sample of the references
    (float32 and float16 copies) and the first GEMM's block.

    Examples
    --------
    >>> threshold_bytes(1_000_000, 128, 100, 10_000) > 10_000 * 8192 * 8  # at least the buffer of 8,192 slots
    True
    """
    cap = max(1024, _pow2(3 * k * THRESHOLD_SAMPLE))
    return 2 * min(BUFFER_BYTES, m * cap * 8) + (n // THRESHOLD_SAMPLE + 1) * d * 6 + STAGE0_BYTES

#: float16's largest power of two kept below its maximum (65,504) after scaling, and its smallest normal
HALF_TOP, HALF_TINY = 2.0**14, 2.0**-14


def _half_operands(Q: torch.Tensor, R: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Float16 copies of ``Q`` and ``R`` scaled by ``s = 2^(14 − ⌈log₂ max|x|⌉)`` (a power of two: exact; the
    largest magnitude lands in [2¹³, 2¹⁴]) and ``s⁻²`` (float32, shape (1,)), all on the device, no host sync."""
    amax = torch.maximum(Q.abs().amax() if Q.numel() else Q.new_zeros(()),
                         R.abs().amax() if R.numel() else R.new_zeros(()))
    e = torch.ceil(torch.log2(amax.to(torch.float64).clamp(min=2.0**-100)))
    s = torch.exp2(math.log2(HALF_TOP) - e)
    return (Q * s.to(Q.dtype)).half().contiguous(), (R * s.to(R.dtype)).half().contiguous(), \
        (s**-2).to(torch.float32).reshape(1)


def _exact_order(dist: torch.Tensor, idx: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first k of each row by (distance, index): ties by the lower index."""
    by_index = torch.argsort(idx, dim=1)
    d1, i1 = dist.gather(1, by_index), idx.gather(1, by_index)
    order = torch.argsort(d1, dim=1, stable=True)[:, :k]
    return d1.gather(1, order), i1.gather(1, order)


def _rerank(Q64: torch.Tensor, R: torch.Tensor, idx: torch.Tensor, metric: str) -> torch.Tensor:
    """Float64 distances of each query to its candidates (inf for padding): ``metric`` "sqeuclidean", "cosine"
    (1 − cos), or "unit" (squared Euclidean between the unit vectors). The candidates are gathered from ``R``
    (float32 or float64) and widened to float64 — exactly, so no float64 copy of the references is needed."""
    valid = idx < R.shape[0]
    cand = R[idx.clamp(max=R.shape[0] - 1)].to(torch.float64)
    if metric == "cosine":
        num = (Q64[:, None, :] * cand).sum(-1)
        den = Q64.norm(dim=1)[:, None] * cand.norm(dim=2)
        dist = 1.0 - num / den
    else:
        if metric == "unit":
            cand = cand / cand.norm(dim=2, keepdim=True)
        dist = ((Q64[:, None, :] - cand) ** 2).sum(-1)
    return torch.where(valid, dist, torch.full_like(dist, math.inf))


def _centred(X: torch.Tensor, cosine: bool, rows: int = 1 << 20) -> tuple[torch.Tensor, torch.Tensor, float]:
    """The kernel's float32 input: the references centred on their float64 mean (for cosine: the unit vectors,
    not centred), with that mean and the largest centred norm — computed in blocks of ``rows`` rows, so the
    extra memory is one float32 copy of the references, not float64 ones."""
    n, d = X.shape
    mu = torch.zeros(d, dtype=torch.float64, device=X.device)
    if not cosine:
        for r0 in range(0, n, rows):
            mu += X[r0:r0 + rows].to(torch.float64).sum(0)
        mu /= max(n, 1)
    Xc = torch.empty((n, d), dtype=torch.float32, device=X.device)
    cmax = torch.zeros((), dtype=torch.float64, device=X.device)
    for r0 in range(0, n, rows):
        w = X[r0:r0 + rows].to(torch.float64)
        if cosine:
            w = w / w.norm(dim=1, keepdim=True)
        w -= mu
        cmax = torch.maximum(cmax, w.norm(dim=1).max())
        Xc[r0:r0 + rows] = w
    return Xc, mu, float(cmax)


def _certified(kth: torch.Tensor, last: torch.Tensor, eps: torch.Tensor, n: int, kp: int) -> torch.Tensor:
    """Queries whose exact k-th value ``kth`` is below the kernel's ``kp``-th value ``last`` less its rounding
    bound ``eps`` (no reference outside the candidates can then be nearer), or that saw every reference."""
    return (kth < last.to(torch.float64) - eps) | (n <= kp)


@dataclass
class _Ranked:
    """One candidate pass of a batch of queries: the exact first k (``dist``, ``ind``), the exact k-th squared
    value ``kth`` the certificate compares, the kernel's ``kp``-th value ``last`` and its rounding bound ``eps``."""

    dist: torch.Tensor
    ind: torch.Tensor
    kth: torch.Tensor
    last: torch.Tensor
    eps: torch.Tensor

    def replace(self, rows: torch.Tensor, other: _Ranked) -> None:
        """Take ``other``'s values (a pass over the queries ``rows`` only) for those rows."""
        for name in ("dist", "ind", "kth", "last", "eps"):
            getattr(self, name)[rows] = getattr(other, name)




def _candidate_pass(q64: torch.Tensor, Yw: torch.Tensor, Yc: torch.Tensor, X: torch.Tensor, Xc: torch.Tensor,
                    cmax: float, k: int, kp: int, precision: str, metric: str) -> _Ranked:
    """The kernel's ``kp`` candidates of the centred queries ``Yc``, re-ranked exactly in float64 against ``X``
    (``q64``: the queries as given; ``Yw``: as compared, the unit vectors for cosine), with the bound
    ``ε = 4·(u + d·2⁻²³)·‖q‖·max‖c‖ + (d + 4)·2⁻²²·(‖q‖² + max‖c‖²)`` of the kernel's rounding."""
    d2, idx = candidates(Yc.to(torch.float32), Xc, kp, precision=precision)
    exact = _rerank(q64, X, idx, metric)
    # certify on the unit vectors' squared distances (2·cosine distance) for cosine
    ex_sq = _rerank(Yw, X, idx, "unit") if metric == "cosine" else exact
    dist, ind = _exact_order(exact, idx, k)
    eps = rounding_bound(precision, Yc.norm(dim=1), cmax, X.shape[1])
    return _Ranked(dist, ind, torch.sort(ex_sq, dim=1).values[:, k - 1], d2[:, -1], eps)


def _two_piece_pass(q64: torch.Tensor, Yc: torch.Tensor, X: torch.Tensor, Xc: torch.Tensor, cmax: float,
                    k: int, kp: int, precision: str, first: int) -> _Ranked:
    """:func:`_candidate_pass` (squared Euclidean) in two pieces: the first ``first`` references unseeded, then
    the others with the seed :func:`_seed_above` of the first piece's exact k-th value, so that most of their
    tiles cost one screen and the running top-k starts full. Any k references bound the k-th value from above,
    so the seed never leaves out a neighbour; a reference of the second piece that is not returned has a kernel
    value ≥ ``min(seed, last)``, so the certificate's ``last`` is the smallest of the two pieces' bounds."""
    head = _candidate_pass(q64, q64, Yc, X[:first], Xc[:first], cmax, k, kp, precision, "sqeuclidean")
    seed = seed_above(head.kth, head.eps)
    d2, idx = candidates(Yc.to(torch.float32), Xc[first:], kp, precision=precision, seed=seed)
    exact = _rerank(q64, X[first:], idx, "sqeuclidean")
    dist, ind = _exact_order(torch.cat([head.dist, exact], 1), torch.cat([head.ind, idx + first], 1), k)
    last = torch.minimum(torch.minimum(head.last, seed), d2[:, -1])
    return _Ranked(dist, ind, dist[:, k - 1], last, head.eps)


def _strided(n: int, rows: int, device: torch.device) -> torch.Tensor:
    """About ``rows`` row numbers spread evenly over ``range(n)`` (a sample that ordered data cannot fool the way a
    prefix can)."""
    step = max(1, n // max(rows, 1))
    return torch.arange(0, n, step, device=device)[:max(rows, 1)]


def _bound_from(q64: torch.Tensor, X: torch.Tensor, ids: torch.Tensor, k: int) -> torch.Tensor:
    """An upper bound of each query's exact k-th squared distance: the k-th smallest exact value over the rows
    ``ids`` (any k references bound it; +inf where fewer than k are valid)."""
    exact = _rerank(q64, X, ids, "sqeuclidean")
    return torch.kthvalue(exact, k, dim=1).values if exact.shape[1] >= k else torch.full_like(exact[:, 0], math.inf)


def _threshold_pass(q64: torch.Tensor, Yc: torch.Tensor, X: torch.Tensor, Xc: torch.Tensor, cmax: float,
                    k: int, kp: int, precision: str, stats: dict[str, int] | None = None) -> _Ranked:
    """:func:`_candidate_pass` (squared Euclidean) without a top-k on chip for the bulk of the work: a seed that
    only about ``THRESHOLD_SAMPLE · k`` references per query pass, then :func:`candidates_below` over all of them.

    1. PyTorch's GEMM + top-k on an even sample of ``n / THRESHOLD_SAMPLE²`` references: the exact k-th value of
       the k nearest of them bounds the true k-th value from above (any k references do); plus 2ε, a seed.
    2. :func:`candidates_below` on a sample of ``n / THRESHOLD_SAMPLE`` references with that seed: a tighter
       bound the same way.
    3. :func:`candidates_below` on every reference with the tighter seed: the ``kp`` smallest of those below it.

    A reference not returned has a kernel value ≥ ``min(seed, last)``, so the certificate's ``last`` is that
    minimum; a seed too loose for the buffers only costs time (those queries run :func:`candidates`)."""
    n = len(X)
    eps = rounding_bound(precision, Yc.norm(dim=1), cmax, X.shape[1])
    Yf = Yc.to(torch.float32)
    s0 = _strided(n, max(kp, n // THRESHOLD_SAMPLE**2), X.device)
    Xs = Xc[s0]
    xs2 = (Xs * Xs).sum(1)[None, :]
    block = max(1, STAGE0_BYTES // (4 * len(s0)))  # queries per GEMM: the (block × sample) matrix stays bounded
    near = torch.cat([torch.topk(torch.addmm(xs2, Yf[b:b + block], Xs.T, alpha=-2.0), min(k, len(s0)), dim=1,
                                 largest=False, sorted=False).indices for b in range(0, len(Yf), block)])
    seed = seed_above(_bound_from(q64, X, s0[near], k), eps)
    s1 = _strided(n, max(kp, n // THRESHOLD_SAMPLE), X.device)
    cap = max(1024, _pow2(3 * k * THRESHOLD_SAMPLE))  # about k·THRESHOLD_SAMPLE pass: room for three times that
    _, loc = candidates_below(Yf, Xc[s1], kp, seed, precision=precision, cap=cap)
    safe = s1[loc.clamp(max=len(s1) - 1)]
    tighter = torch.where(loc < len(s1), safe, n)
    seed = torch.minimum(seed, seed_above(_bound_from(q64, X, tighter, k), eps))
    d2, idx = candidates_below(Yf, Xc, kp, seed, precision=precision, cap=cap)
    exact = _rerank(q64, X, idx, "sqeuclidean")
    dist, ind = _exact_order(exact, idx, k)
    last = torch.minimum(d2[:, -1], seed)
    if stats is not None:
        stats["threshold"] = stats.get("threshold", 0) + len(q64)
    return _Ranked(dist, ind, torch.sort(exact, dim=1).values[:, k - 1], last, eps)


def _settle(dist: torch.Tensor, ind: torch.Tensor, kth: torch.Tensor, last: torch.Tensor, eps: torch.Tensor,
            n: int, kp: int, exact: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
    """The certificate and its fallback, shared by every driver: a query is certified when its exact k-th value
    ``kth`` is below the kernel's ``kp``-th value ``last`` less its rounding bound ``eps`` (no reference outside
    the candidates can then be nearer) or when every reference is a candidate; the others are recomputed, in
    place, by float64 brute force over the references in chunks. ``exact(rows, ids)``: the exact values of the
    queries ``rows`` (positions in this batch) against the references ``ids`` (len(rows), c)."""
    bad = torch.nonzero(~_certified(kth, last, eps, n, kp)).flatten()
    if not len(bad):
        return
    k = dist.shape[1]
    best_d = torch.full((len(bad), 0), math.inf, dtype=torch.float64, device=dist.device)
    best_i = torch.zeros((len(bad), 0), dtype=torch.int64, device=dist.device)
    chunk = max(256, (1 << 22) // len(bad))  # (len(bad), chunk) values per step
    for c0 in range(0, n, chunk):
        ids = torch.arange(c0, min(c0 + chunk, n), device=dist.device).expand(len(bad), -1)
        best_d, best_i = _exact_order(torch.cat([best_d, exact(bad, ids)], 1), torch.cat([best_i, ids], 1), k)
    dist[bad], ind[bad] = best_d, best_i


def fused_kneighbors(Y: torch.Tensor, X: torch.Tensor, k: int, *, metric: str = "euclidean",
                     precision: str | None = None, query_chunk: int = 1 << 16, first_piece: int | None = None,
                     threshold: bool | None = None,
                     stats: dict[str, int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact k nearest rows of ``X`` for each row of ``Y`` through the fused kernel, certified in float64.

    The kernel returns ``kp ≥ k + max(8, k/4)`` candidates per query by approximate distances of centred data
    (float16 operands by default, or TF32: both round each input to 11 significant bits). Their exact float64
    distances are computed and sorted (ties by the lower index). A query is *certified* when its exact k-th
    distance is below the kernel's ``kp``-th distance less the kernel's rounding bound
    ``ε = 4·(2⁻¹⁰ + d·2⁻²³)·‖q‖·max‖c‖ + (d + 4)·2⁻²²·(‖q‖² + max‖c‖²)``, plus float16's absolute term
    (:func:`densitas.neighbors.distances.rounding_bound`): no reference outside the candidates can then be
    nearer. The rest (near-ties at the boundary of the candidate list; more of them the more references there
    are) run the kernel again with float32 products (``u = 2⁻²³``), and those still uncertified are recomputed
    by float64 brute force. So the answer equals the float64 reference. On request (``first_piece``) the kernel
    first runs on a piece of the references whose exact k-th values then seed its run over the rest
    (:func:`_two_piece_pass`).

    Parameters
    ----------
    Y, X : torch.Tensor
        Queries (m, d) and references (n, d), on one device, no NaN.
    k : int
        Neighbours, ``k + max(8, k // 4) <= MAX_KP`` and ``d <= MAX_D``.
    metric : {"euclidean", "sqeuclidean", "cosine"}
    precision : {"tf32", "fp16", "ieee"}, optional
        The kernel's dot-product precision (the result is exact either way); default :data:`FUSED_PRECISION`.
    query_chunk : int
        Queries per launch.
    first_piece : int, optional
        References in an unseeded first piece whose exact k-th values seed the kernel over the rest; default
        ``n // FIRST_PIECE`` when ``TWO_PIECE_MIN_ROWS`` is set and ``n`` reaches it, else one piece (0).
    threshold : bool, optional
        Run the threshold pass (:func:`_threshold_pass`: a seed from samples of the references, then a kernel with
        no top-k on chip) instead of the fused top-k kernel; default: for ``kp >= THRESHOLD_MIN_KP`` candidates
        and ``n >= THRESHOLD_MIN_ROWS`` references (:func:`threshold_applies`). Squared Euclidean forms only:
        ignored for cosine and when a first piece is set.
    stats : dict, optional
        Filled with counts: ``queries``, ``uncertified`` (after the first pass), ``uncertified_ieee`` (after the
        float32 pass, the ones brute force recomputes), ``threshold`` (queries the threshold pass answered) and
        ``first_piece`` (its size, 0 for one piece).

    Returns
    -------
    distances : torch.Tensor of shape (m, k), float64
    indices : torch.Tensor of shape (m, k), int64
    """
    cosine = metric == "cosine"
    exact_metric = "cosine" if cosine else "sqeuclidean"
    precision = precision or FUSED_PRECISION
    Xc, mu, cmax = _centred(X, cosine)
    kp = _pow2(k + max(8, k // 4))
    first = _first_piece(len(X), kp, first_piece) if not cosine else 0
    if threshold is None:
        threshold = threshold_applies(len(X), kp)
    threshold = bool(threshold) and not cosine and not first and len(X) > kp
    if stats is not None:
        stats["first_piece"] = first
    out_d, out_i = [], []
    for q0 in range(0, len(Y), query_chunk):
        q64 = Y[q0:q0 + query_chunk].to(torch.float64)
        Yw = q64 / q64.norm(dim=1, keepdim=True) if cosine else q64
        Yc = Yw - mu
        if threshold:
            ranked = _threshold_pass(q64, Yc, X, Xc, cmax, k, kp, precision, stats)
        elif first:
            ranked = _two_piece_pass(q64, Yc, X, Xc, cmax, k, kp, precision, first)
        else:
            ranked = _candidate_pass(q64, Yw, Yc, X, Xc, cmax, k, kp, precision, exact_metric)
        bad = torch.nonzero(~_certified(ranked.kth, ranked.last, ranked.eps, len(X), kp)).flatten()
        if stats is not None:
            stats["queries"] = stats.get("queries", 0) + len(q64)
            stats["uncertified"] = stats.get("uncertified", 0) + len(bad)
        if len(bad) and precision != "ieee":  # once more with float32 products: a bound 2¹³ times tighter
            ranked.replace(bad, _candidate_pass(q64[bad], Yw[bad], Yc[bad], X, Xc, cmax, k, kp, "ieee",
                                                exact_metric))
            if stats is not None:
                stats["uncertified_ieee"] = stats.get("uncertified_ieee", 0) + int(
                    (~_certified(ranked.kth[bad], ranked.last[bad], ranked.eps[bad], len(X), kp)).sum())
        _settle(ranked.dist, ranked.ind, ranked.kth, ranked.last, ranked.eps, len(X), kp,
                lambda rows, ids, q64=q64: _rerank(q64[rows], X, ids, exact_metric))
        out_d.append(ranked.dist)
        out_i.append(ranked.ind)
    dist, ind = torch.cat(out_d), torch.cat(out_i)
    if metric == "euclidean":
        dist = dist.sqrt()
    return dist, ind


def _first_piece(n: int, kp: int, first_piece: int | None) -> int:
    """References in the first (unseeded) piece of :func:`fused_kneighbors`: 0 for one piece."""
    if first_piece is None:
        first_piece = n // FIRST_PIECE if TWO_PIECE_MIN_ROWS is not None and n >= TWO_PIECE_MIN_ROWS else 0
    first_piece = int(first_piece)
    return first_piece if kp <= first_piece < n else 0


#: The fused driver's optional first piece is this fraction of the references (the streamed search cuts its first
#: chunk the same way), by default from this many references on (None: never — on the H200 two pieces were
#: 6–10 % slower than one at 100k × 1M × 64, k = 10 and 10k × 1M × 128, k = 100: the running top-k of one pass
#: fills as fast; benchmarks/RESULTS.md). The default dot precision: float16 operands, 1.18–1.38× faster than
#: TF32 there (half the bytes per tile, twice the matrix-unit rate), exact either way.
FIRST_PIECE = 16
TWO_PIECE_MIN_ROWS: int | None = None
FUSED_PRECISION = "fp16"

# The dot-product precision of the fused kernel inside the exact search, and the unit roundoff that the
# search's rounding bound must then use (densitas.neighbors.distances.bound_coefficient): TF32 keeps 10 of
# float32's 23 mantissa bits, so the matrix units run at full rate and the certificate is 2¹³ times looser;
# the few queries it cannot certify go to the float64 pass.
TILE_PRECISION = "tf32"
# relative rounding of one input of the dot: TF32 keeps 10 mantissa bits (2⁻¹⁰ covers truncation as well as
# rounding); "tf32x3" splits each input into two TF32 parts (about 2⁻²¹); "ieee" rounds nothing (0: float32)
UNIT_ROUNDOFF = {"tf32": 2.0**-10, "tf32x3": 2.0**-20, "ieee": 0.0}


def fused_applies(mode: str, masked: bool, nominal: bool, dtype: torch.dtype, d: int, k: int) -> bool:
    """Whether the fused kernel runs a fast pass of this form (else :func:`tile_topk` runs PyTorch's, in
    ``dtype`` with no TF32): dense squared Euclidean, float32, ``d <= MAX_D``, ``k`` candidates within
    :data:`MAX_KP`. The search uses it to pick the rounding bound."""
    return (mode == "sq" and not masked and not nominal and dtype == torch.float32 and d <= MAX_D
            and _pow2(k) <= MAX_KP)


def tile_topk(q, c, k: int, tile_cols: int):
    """The Triton implementation of the operation ``knn_tile_topk`` (contract in :mod:`densitas.neighbors._torch`).

    The dense squared-Euclidean mode (no missing values, no nominal columns, float32, at most :data:`MAX_D`
    columns, ``k`` a candidate count of at most :data:`MAX_KP`) runs the fused kernel; every other form runs the
    PyTorch implementation. The values carry TF32 rounding: the search's bound uses
    ``UNIT_ROUNDOFF[TILE_PRECISION]`` (the ``unit_roundoff`` attribute of this function).

    Examples
    --------
    >>> import torch
    >>> from densitas.neighbors._torch import prepare
    >>> x = torch.arange(12.0).reshape(6, 2)
    >>> q, c = prepare(x[:2], None, "sq", False, "query", torch.float32), \\
    ...     prepare(x, None, "sq", False, "reference", torch.float32)
    >>> v, i = tile_topk(q, c, 2, 1024)
    >>> sorted(i[0].tolist())
    [0, 1]
    """
    from densitas.neighbors._torch import tile_topk as torch_tile_topk

    on_device = q.x is not None and (q.x.is_cuda or os.environ.get("TRITON_INTERPRET") == "1")
    if not (on_device and fused_applies(q.mode, q.masked, q.nom is not None, q.x.dtype, q.x.shape[1], k)):
        return torch_tile_topk(q, c, k, tile_cols)
    kp = _pow2(k)
    dist, idx = candidates(q.x, c.x, kp, precision=TILE_PRECISION)
    kk = min(k, len(c))
    return dist[:, :kk], idx[:, :kk]


tile_topk.unit_roundoff = UNIT_ROUNDOFF[TILE_PRECISION]


def _one_hot_codes(yc: torch.Tensor, xc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Shared integer codes of one nominal column of the queries and the references, and their count."""
    values, inverse = torch.unique(torch.cat([xc, yc]), return_inverse=True)
    return inverse[len(xc):], inverse[:len(xc)], len(values)


def mixed_kneighbors(Y: torch.Tensor, X: torch.Tensor, nominal: list[int], k: int, *,
                     precision: str = "tf32", query_chunk: int = 1 << 15) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact k nearest rows by document 001's mixed Euclidean distance √(Σ numeric (a − b)² + Σ nominal [a ≠ b])
    through the fused kernel.

    Each nominal column becomes a one-hot block scaled by 1/√2, since ``‖(e_a − e_b)/√2‖² = [a ≠ b]``: the mixed
    distance is the Euclidean distance of the coded rows, which the kernel ranks (TF32). The candidates are
    re-ranked with the exact formula in float64 (numeric differences and integer mismatches, not the coded
    rows), certified as in :func:`fused_kneighbors`, and the uncertified queries recomputed by brute force.

    Parameters
    ----------
    Y, X : torch.Tensor
        Queries (m, d) and references (n, d), float, finite, nominal columns holding codes or any values.
    nominal : list of int
        The nominal columns.
    k : int

    Returns
    -------
    distances : torch.Tensor of shape (m, k), float64
    indices : torch.Tensor of shape (m, k), int64
    """
    d = X.shape[1]
    num = [j for j in range(d) if j not in set(nominal)]
    Xn, Yn = X[:, num].to(torch.float64), Y[:, num].to(torch.float64)
    yc, xc, widths = [], [], []
    for j in nominal:
        a, b, w = _one_hot_codes(Y[:, j], X[:, j])
        yc.append(a)
        xc.append(b)
        widths.append(w)
    Xcodes = torch.stack(xc, 1) if xc else torch.zeros((len(X), 0), dtype=torch.int64, device=X.device)
    Ycodes = torch.stack(yc, 1) if yc else torch.zeros((len(Y), 0), dtype=torch.int64, device=Y.device)
    if len(num) + sum(widths) > MAX_D:
        raise InputError(f"The 'nominal' parameter of mixed_kneighbors codes the rows {len(num) + sum(widths)} "
                         f"wide; at most {MAX_D} fit the kernel. Got {len(nominal)} nominal columns instead.")

    def coded(n64: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
        parts = [n64] + [torch.nn.functional.one_hot(codes[:, t], widths[t]).to(torch.float64) / math.sqrt(2.0)
                         for t in range(len(widths))]
        return torch.cat(parts, 1)

    Xa = coded(Xn, Xcodes)
    mu = Xa.mean(0)
    Xc = (Xa - mu).to(torch.float32).contiguous()
    cmax = float((Xa - mu).norm(dim=1).max()) if len(X) else 0.0
    da = Xa.shape[1]
    kp = _pow2(k + max(8, k // 4))

    def exact(qn: torch.Tensor, qcode: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        valid = idx < len(X)
        safe = idx.clamp(max=len(X) - 1)
        dist = ((qn[:, None, :] - Xn[safe]) ** 2).sum(-1) + (qcode[:, None, :] != Xcodes[safe]).sum(-1)
        return torch.where(valid, dist, torch.full_like(dist, math.inf))

    out_d, out_i = [], []
    for q0 in range(0, len(Y), query_chunk):
        qn, qcode = Yn[q0:q0 + query_chunk], Ycodes[q0:q0 + query_chunk]
        Yc = coded(qn, qcode) - mu
        d2, idx = candidates(Yc.to(torch.float32), Xc, kp, precision=precision)
        ex = exact(qn, qcode, idx)
        dist, ind = _exact_order(ex, idx, k)
        kth = dist[:, k - 1]
        eps = rounding_bound(precision, Yc.norm(dim=1), cmax, da)
        _settle(dist, ind, kth, d2[:, -1], eps, len(X), kp,
                lambda rows, ids, qn=qn, qcode=qcode: exact(qn[rows], qcode[rows], ids))
        out_d.append(dist)
        out_i.append(ind)
    return torch.cat(out_d).sqrt(), torch.cat(out_i)


def masked_kneighbors(Y: torch.Tensor, X: torch.Tensor, k: int, *, metric: str = "euclidean",
                      precision: str = "tf32", query_chunk: int = 1 << 15) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact k nearest rows with document 001's missing-value rule (a coordinate pair with a NaN on either side is
    skipped, no rescaling; a pair of rows with nothing in common has distance NaN and ranks last), through the
    fused kernel.

    With ``m`` the presence mask and ``x`` the centred values (0 where missing), the skipped-pair squared
    distance is ``Σ m_c x_q² + Σ m_q x_c² − 2 Σ x_q x_c = [x_q², x_q, m_q]·[m_c, −2x_c, x_c²]``: one dot product
    of width 3d, which the kernel ranks (TF32). Pairs with nothing in common come out as 0 there; the float64
    re-rank gives them +inf, and the certificate (every reference outside the candidates has a kernel value at
    least the ``kp``-th one, hence a true distance at least that less the rounding bound, or none at all) still
    holds, so only the exact k-th distance decides. Uncertified queries are recomputed by brute force.

    Parameters
    ----------
    Y, X : torch.Tensor
        Queries (m, d) and references (n, d), float, NaN allowed, no infinities; ``3·d <= MAX_D``.
    k : int
    metric : {"euclidean", "sqeuclidean"}
    precision : {"tf32", "ieee"}
        The kernel's dot-product precision (the result is exact either way).

    Returns
    -------
    distances : torch.Tensor of shape (m, k), float64
        NaN for a pair with no coordinate in common (ranked last).
    indices : torch.Tensor of shape (m, k), int64
    """
    if precision not in ("tf32", "ieee"):  # the bound below has no term for float16's subnormal rounding
        raise InputError("The 'precision' parameter of masked_kneighbors must be 'tf32' or 'ieee'. Got "
                         f"{precision!r} instead.")
    X64, Y64 = X.to(torch.float64), Y.to(torch.float64)
    mx, my = ~torch.isnan(X64), ~torch.isnan(Y64)
    mu = torch.nan_to_num(torch.nanmean(X64, 0), nan=0.0)
    x0, y0 = torch.nan_to_num(X64 - mu, nan=0.0), torch.nan_to_num(Y64 - mu, nan=0.0)
    R = torch.cat([mx.to(torch.float64), -2.0 * x0, x0 * x0], 1) * -0.5  # the kernel's value is −2·q·r
    rmax = float(R.norm(dim=1).max()) if len(X) else 0.0
    Rf = R.to(torch.float32).contiguous()
    w = R.shape[1]
    kp = _pow2(k + max(8, k // 4))
    u = DOT_ROUNDOFF[precision]

    def exact(q0: torch.Tensor, qm: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        valid = idx < len(X)
        safe = idx.clamp(max=len(X) - 1)
        both = qm[:, None, :] & mx[safe]
        diff = torch.where(both, q0[:, None, :] - x0[safe], 0.0)
        dist = (diff * diff).sum(-1)
        dist = torch.where(both.any(-1), dist, math.inf)
        return torch.where(valid, dist, torch.full_like(dist, math.inf))

    out_d, out_i = [], []
    for s0 in range(0, len(Y), query_chunk):
        q0, qm = y0[s0:s0 + query_chunk], my[s0:s0 + query_chunk]
        Q = torch.cat([q0 * q0, q0, qm.to(torch.float64)], 1)
        d2, idx = candidates(Q.to(torch.float32), Rf, kp, precision=precision, with_norms=False)
        ex = exact(q0, qm, idx)
        dist, ind = _exact_order(ex, idx, k)
        qn = Q.norm(dim=1)
        eps = 4 * (u + w * 2.0**-23) * qn * rmax * 2 + (w + 4) * 2.0**-22 * (qn**2 + rmax**2)
        _settle(dist, ind, dist[:, k - 1].clone(), d2[:, -1], eps, len(X), kp,
                lambda rows, ids, q0=q0, qm=qm: exact(q0[rows], qm[rows], ids))
        out_d.append(dist)
        out_i.append(ind)
    dist, ind = torch.cat(out_d), torch.cat(out_i)
    if metric == "euclidean":
        dist = dist.sqrt()
    return torch.where(torch.isinf(dist), math.nan, dist), ind
