"""Exact k-NN against a reference set that lives in host memory (or in a file), streamed through the device.

The reference rows are cut into chunks (:func:`densitas._backend.plan_chunks`, within the memory budget). On a
CUDA device each chunk is copied host → device on a side stream into one of two device buffers (double
buffering), from page-locked (pinned) memory: the caller's own when the tensor is pinned already, else two
pinned staging buffers that the host fills while the device works on the chunk before. The copy of chunk
``i + 1`` thus overlaps the fused distance + top-k of chunk ``i``; the loop never waits for the device except
to reuse a staging buffer.

Per chunk and query, the fused kernel (:func:`densitas.neighbors._triton.candidates`; PyTorch's GEMM + top-k
where Triton does not run) returns the ``kp`` nearest rows by TF32 distance of centred data, seeded with the
running exact k-th distance plus twice the rounding bound (so after the first chunk almost every tile costs
one screen: nothing in it can still enter). They are re-ranked
in float64 (direct differences, as the in-memory path does) and merged into a running top-k on the device,
ordered by (distance, global row): ties go to the lower row. Every row the kernel dropped had a kernel value
≥ the chunk's ``kp``-th value ``t``, so its exact squared distance is ≥ ``t − ε`` (ε: the kernel's rounding
bound, the one of :func:`densitas.neighbors._triton.fused_kneighbors`, with the chunk's largest centred norm).
A query whose exact k-th distance is below ``min over chunks (t − ε)`` is certified; the rare others get a
second, exact float64 pass over the streamed chunks. The answer therefore equals the float64 brute force, and
is the same for any chunking (a tiny ``memory_budget`` included).

The same loop runs on CPU tensors (no streams, no pinned memory; the kernel in the Triton interpreter or
PyTorch's fast pass), which is how the tests cover it without a GPU.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from densitas._backend.chunking import memory_budget as default_budget
from densitas._backend.chunking import parse_bytes, plan_chunks
from densitas._backend.dispatch import select
from densitas.exceptions import InputError
from densitas.neighbors import _triton_registry  # noqa: F401  (registers the fused kernel, lazily)
from densitas.neighbors.distances import rounding_bound, seed_above

__all__ = ["HostChunks", "NonFiniteError", "StreamStats", "stream_kneighbors", "transfer_floor"]

#: Largest chunk of reference rows (bytes on the device per buffer): large enough that a chunk's kernel runs
#: well past launch overhead, small enough that the first, unoverlapped copy is short.
MAX_CHUNK_BYTES = 1 << 29
_KERNEL_ALIGN = 128  # chunk lengths are multiples of the kernel's reference tile
#: Launch settings of the fused kernel on a chunk (:func:`densitas.neighbors._triton.candidates`'s block_m,
#: block_n, num_warps, num_stages): the fastest of ten on the H200 for the seeded chunks of 10k queries × 2M
#: references, d = 64 (``bench_neighbors.py --stream 1e7 --launch-sweep``; benchmarks/RESULTS.md).
LAUNCH: dict[str, int] = {"block_m": 64, "block_n": 128, "num_warps": 4, "num_stages": 3}
#: The dot precision of the chunk kernel ("tf32" or "fp16": :func:`densitas.neighbors._triton.candidates`):
#: float16 operands streamed 10⁸ references in 0.85 s against TF32's 1.13 s on the H200 (benchmarks/RESULTS.md).
STREAM_PRECISION = "fp16"
#: The first chunk is cut at 1/FIRST_PIECE of its rows: the unseeded kernel on that piece sets the seed.
FIRST_PIECE = 16


class NonFiniteError(InputError):
    """The streamed references or the queries hold NaN or an infinity. :func:`densitas.neighbors.kneighbors`
    catches it and takes its general path, which names the row and column (or skips NaN).

    Examples
    --------
    >>> from densitas.exceptions import DensitasError
    >>> issubclass(NonFiniteError, DensitasError)
    True
    """


@dataclass
class StreamStats:
    """What a streamed search did: chunks and rows per chunk (the first chunk cut at ``first_rows``), query
    tiles, whether the source was pinned already, queries answered by the exact fallback pass, and the
    candidate backend.

    Examples
    --------
    >>> StreamStats(chunks=3, chunk_rows=1024).fallback_queries
    0
    """

    chunks: int = 0
    chunk_rows: int = 0
    first_rows: int | None = None
    query_tiles: int = 0
    pinned_source: bool = False
    fallback_queries: int = 0
    backend: str = "torch"


class HostChunks:
    """A host-resident reference set read chunk by chunk: ``n_rows`` × ``width`` float32 rows.

    Parameters
    ----------
    data : ndarray or torch.Tensor, optional
        2-D float32 rows in host memory; chunks are views (a pinned tensor's chunks are pinned).
    blocks : callable, optional
        Instead of ``data``: ``blocks(rows)`` yields ``(offset, chunk)`` with consecutive chunks of at most
        ``rows`` rows as float32 CPU tensors or arrays (a file or a DuckDB relation, encoded block by block);
        it must be callable more than once. Then ``n_rows`` and ``width`` are required.

    Examples
    --------
    >>> import numpy as np
    >>> src = HostChunks(np.zeros((5, 2), dtype=np.float32))
    >>> [(off, tuple(c.shape)) for off, c in src.blocks(2)]
    [(0, (2, 2)), (2, (2, 2)), (4, (1, 2))]
    """

    def __init__(self, data: Any = None, *, blocks: Callable[[int], Iterator[tuple[int, Any]]] | None = None,
                 n_rows: int | None = None, width: int | None = None):
        if data is not None:
            t = data if isinstance(data, torch.Tensor) else torch.from_numpy(np.asarray(data))
            if t.ndim != 2:
                raise InputError(f"The 'data' parameter of HostChunks must be 2-dimensional (rows × columns). Got "
                                 f"shape {tuple(t.shape)} instead.")
            if t.dtype != torch.float32 or t.device.type != "cpu":
                raise InputError(f"The 'data' parameter of HostChunks must hold float32 values in host memory. Got "
                                 f"{t.dtype} on {t.device} instead.")
            self.data: torch.Tensor | None = t.detach()
            self.n_rows, self.width = int(t.shape[0]), int(t.shape[1])
            self._blocks = None
        else:
            if blocks is None or n_rows is None or width is None:
                raise InputError("HostChunks needs 'data', or 'blocks' with 'n_rows' and 'width'.")
            self.data = None
            self.n_rows, self.width = int(n_rows), int(width)
            self._blocks = blocks

    @property
    def pinned(self) -> bool:
        """Whether the rows already lie in page-locked memory (then no staging copy is needed)."""
        return self.data is not None and torch.cuda.is_available() and self.data.is_pinned()

    def blocks(self, rows: int) -> Iterator[tuple[int, torch.Tensor]]:
        """Yield ``(offset, chunk)``: consecutive float32 CPU tensors of at most ``rows`` rows."""
        rows = max(int(rows), 1)
        if self.data is not None:
            for s in range(0, self.n_rows, rows):
                yield s, self.data[s:s + rows]
            return
        for off, chunk in self._blocks(rows):
            t = chunk if isinstance(chunk, torch.Tensor) else torch.from_numpy(np.asarray(chunk))
            yield int(off), t.to(torch.float32)


# ------------------------------------------------------------------------------------------- the pipeline


class _Pipeline:
    """Host chunks onto ``device``: two device buffers, two pinned staging buffers (when the source is not
    pinned), a copy stream; ``run(fn)`` calls ``fn(offset, rows_on_device)`` on the compute stream for every
    chunk, the copy of the next chunk overlapping it. On a CPU device ``fn`` gets the host chunk itself."""

    def __init__(self, src: HostChunks, rows: int, device: torch.device, first_rows: int | None = None):
        self.src, self.rows, self.device = src, rows, device
        self.first_rows = first_rows  # the first chunk is cut in two there (a short unseeded first piece)
        self.cuda = device.type == "cuda"
        if self.cuda:
            shape = (rows, src.width)
            self.buf = [torch.empty(shape, dtype=torch.float32, device=device) for _ in range(2)]
            self.stage: list[torch.Tensor] | None = None
            self.copy_stream = torch.cuda.Stream(device)
            self.copied = [torch.cuda.Event() for _ in range(2)]
            self.freed = [torch.cuda.Event() for _ in range(2)]
            self.staged = [torch.cuda.Event() for _ in range(2)]  # the copy out of a staging buffer is done
        self.used = [False, False]  # whether a buffer has events to wait for (kept across runs)

    def _staging(self) -> list[torch.Tensor]:
        if self.stage is None:
            self.stage = [torch.empty((self.rows, self.src.width), dtype=torch.float32, pin_memory=True)
                          for _ in range(2)]
        return self.stage

    def _blocks(self) -> Iterator[tuple[int, torch.Tensor]]:
        first = True
        for off, h in self.src.blocks(self.rows):
            f = self.first_rows
            if first and f is not None and 0 < f < h.shape[0]:
                yield off, h[:f]
                off, h = off + f, h[f:]
            first = False
            yield off, h

    def run(self, fn: Callable[[int, torch.Tensor], None]) -> int:
        chunks = 0
        if not self.cuda:
            for off, h in self._blocks():
                fn(off, h.contiguous())
                chunks += 1
            return chunks
        compute = torch.cuda.current_stream(self.device)
        used = self.used
        for off, h in self._blocks():
            slot = chunks % 2
            n_h = h.shape[0]
            h = h.contiguous()
            if not h.is_pinned():
                stage = self._staging()[slot]
                if used[slot]:
                    self.staged[slot].synchronize()  # the copy of chunk i − 2 out of this buffer is done
                stage[:n_h].copy_(h)
                h = stage[:n_h]
            dst = self.buf[slot][:n_h]
            with torch.cuda.stream(self.copy_stream):
                if used[slot]:
                    self.copy_stream.wait_event(self.freed[slot])  # chunk i − 2's compute is done with it
                dst.copy_(h, non_blocking=True)
                self.copied[slot].record(self.copy_stream)
                self.staged[slot].record(self.copy_stream)
            compute.wait_event(self.copied[slot])
            fn(off, dst)
            self.freed[slot].record(compute)
            used[slot] = True
            chunks += 1
        return chunks


# --------------------------------------------------------------------------------------- candidate step


def _candidate_step(device: torch.device, budget: int) -> tuple[Callable, str, str]:
    """``(fn, precision, backend)``: ``fn(Q, R, kp, seed)`` → (values (m, kp) ascending, local rows (m, kp)), the
    kp smallest approximate squared distances (rows ≥ len(R) pad with +inf; the fused kernel keeps only values
    below ``seed``, PyTorch's pass ignores it), and the precision of the dot products behind them (the key of
    :func:`densitas.neighbors.distances.rounding_bound`). Every row not returned has a value ≥
    ``min(seed, values[:, -1])``."""
    backend, _ = select("knn_tile_topk", device)
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    if backend == "triton" and (device.type == "cuda" or interpreted):
        from densitas.neighbors._triton import candidates

        precision = STREAM_PRECISION

        def fused(Q: torch.Tensor, R: torch.Tensor, kp: int,
                  seed: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
            return candidates(Q, R, kp, precision=precision, seed=seed, **LAUNCH)

        return fused, precision, "triton"
    tf32 = torch.get_float32_matmul_precision() != "highest"

    def gemm_topk(Q: torch.Tensor, R: torch.Tensor, kp: int,
                  seed: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        qn, rn = (Q * Q).sum(1), (R * R).sum(1)
        kk = min(kp, R.shape[0])
        step = max(1, budget // 8 // max(4 * R.shape[0], 1))
        vals, idx = [], []
        for s in range(0, Q.shape[0], step):
            v = torch.addmm(rn[None, :], Q[s:s + step], R.T, alpha=-2.0).add_(qn[s:s + step, None]).clamp_(min=0)
            a, b = torch.topk(v, kk, dim=1, largest=False, sorted=True)
            vals.append(a)
            idx.append(b)
        v, i = torch.cat(vals), torch.cat(idx)
        if kk < kp:
            v = torch.cat([v, v.new_full((v.shape[0], kp - kk), math.inf)], 1)
            i = torch.cat([i, i.new_full((i.shape[0], kp - kk), R.shape[0])], 1)
        return v, i

    return gemm_topk, ("tf32" if tf32 else "ieee"), "torch"


def _order(dist: torch.Tensor, idx: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first k of each row by (distance, index)."""
    by_index = torch.argsort(idx, dim=1)
    d1, i1 = dist.gather(1, by_index), idx.gather(1, by_index)
    order = torch.argsort(d1, dim=1, stable=True)[:, :k]
    return d1.gather(1, order), i1.gather(1, order)


def _sq64(q64: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """Float64 squared distances by direct differences, (len(q64), r.shape[-2]) from r (c, d) or (m, c, d)."""
    r64 = r.to(torch.float64)
    if r64.ndim == 2:
        r64 = r64[None]
    return ((q64[:, None, :] - r64) ** 2).sum(-1)


# ----------------------------------------------------------------------------------------------- driver


def stream_kneighbors(Y: Any, X: HostChunks | Any, k: int, *, metric: str = "euclidean",
                      device: torch.device | str = "cpu", memory_budget: int | str | None = None,
                      chunk_rows: int | None = None,
                      stats: StreamStats | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact k nearest host-resident reference rows of every query, the references streamed through ``device``.

    Parameters
    ----------
    Y : array-like or torch.Tensor
        Queries (m, d), finite; moved to ``device``.
    X : HostChunks, ndarray or CPU torch.Tensor
        References (n, d), float32, in host memory (a pinned tensor is copied from directly), or a
        :class:`HostChunks` reading them from a file or table.
    k : int
        Neighbours, 1 ≤ k ≤ n, with ``k + max(8, k // 4)`` within the kernel's candidate limit
        (:data:`densitas.neighbors._triton.MAX_KP`) and d ≤ :data:`densitas.neighbors._triton.MAX_D`.
    metric : {"euclidean", "sqeuclidean"}
    device : torch.device or str
        Where the distances are computed ("cuda": pinned staging, two streams; "cpu": the same loop in place).
    memory_budget : int or str, optional
        Working-memory bound on the device (default :func:`densitas._backend.memory_budget`); the chunk and
        query-tile sizes come from it. Any budget gives the same answer.
    chunk_rows : int, optional
        Force the reference rows per chunk (tests, benchmarks).
    stats : StreamStats, optional
        Filled with what the search did.

    Returns
    -------
    distances : torch.Tensor of shape (m, k), float64, on ``device``
        Ascending.
    indices : torch.Tensor of shape (m, k), int64, on ``device``
        Rows of ``X``; among equal distances the lower row first.

    Raises
    ------
    InputError
        ``k`` outside its range, a metric other than (squared) Euclidean, mismatched widths, a non-finite value
        in ``Y`` or ``X`` (:func:`densitas.neighbors.kneighbors` names the row and column instead).

    Examples
    --------
    >>> import numpy as np
    >>> X = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 2.0], [1.0, 0.0]], dtype=np.float32)
    >>> d, i = stream_kneighbors([[0.9, 0.0]], X, 3, memory_budget="64kB", chunk_rows=2)
    >>> i.tolist(), np.round(d.numpy(), 3).tolist()
    ([[1, 3, 0]], [[0.1, 0.1, 0.9]])
    """
    from densitas.neighbors._triton import MAX_D, MAX_KP, _pow2

    stats = stats if stats is not None else StreamStats()
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    src = X if isinstance(X, HostChunks) else HostChunks(X)
    if metric not in ("euclidean", "sqeuclidean"):
        raise InputError(f"The 'metric' parameter of stream_kneighbors must be 'euclidean' or 'sqeuclidean'. Got "
                         f"{metric!r} instead.")
    Yt = (Y.detach() if isinstance(Y, torch.Tensor) else torch.as_tensor(np.asarray(Y, dtype=np.float32)))
    if Yt.ndim != 2 or Yt.shape[1] != src.width:
        raise InputError(f"The queries must be 2-dimensional with the references' {src.width} columns. Got shape "
                         f"{tuple(Yt.shape)} instead.")
    n, d, m = src.n_rows, src.width, int(Yt.shape[0])
    if isinstance(k, bool) or not isinstance(k, int | np.integer) or not 1 <= k <= n:
        raise InputError(f"The 'k' parameter of stream_kneighbors must be an int in [1, n_references] = [1, {n}]. "
                         f"Got {k!r} instead.")
    k = int(k)
    kp = _pow2(k + max(8, k // 4))
    if kp > MAX_KP or d > MAX_D:
        raise InputError(f"stream_kneighbors keeps at most {MAX_KP} candidates of at most {MAX_D} columns. Got "
                         f"k={k} ({kp} candidates) and {d} columns instead.")
    Y64 = Yt.to(dev, torch.float64)
    if not bool(torch.isfinite(Y64).all()):
        raise NonFiniteError("The queries hold NaN or infinite values; kneighbors names them (or use "
                             "missing='skip').")
    cap = parse_bytes(memory_budget) if memory_budget is not None else default_budget(dev)
    cand, precision, stats.backend = _candidate_step(dev, cap)
    stats.pinned_source = src.pinned

    # ---- plan: a quarter of the budget for the query tile's state, the rest for the chunks
    per_query = d * 8 * 2 + d * 4 + k * 32 + 8 + kp * 8 * 24 + kp * d * 8 * 3
    q_rows = int(max(1, min(m, cap // 4 // per_query))) if m else 1
    # per reference row of a chunk: two device buffers, the centred copy, the kernel driver's squared rows,
    # norms; pinned staging (host) when the source is not pinned
    per_row = d * 4 * 4 + 16 + (d * 4 * 2 if not stats.pinned_source and dev.type == "cuda" else 0)
    if chunk_rows is None:
        plan = plan_chunks(max(n, 1), per_row, budget=max(cap - q_rows * per_query, per_row), align=_KERNEL_ALIGN)
        rows = min(plan[0].stop, max(_KERNEL_ALIGN, MAX_CHUNK_BYTES // (4 * d)))
    else:
        rows = int(chunk_rows)
    rows = max(1, min(rows, n))
    stats.chunk_rows = rows
    # the first chunk runs unseeded (every tile inserts at first): a short first piece sets the seed cheaply
    stats.first_rows = max(_KERNEL_ALIGN, rows // FIRST_PIECE) if rows > 2 * _KERNEL_ALIGN else None
    pipe = _Pipeline(src, rows, dev, stats.first_rows)
    mu32: torch.Tensor | None = None
    centred = torch.empty((rows, d), dtype=torch.float32, device=dev)
    finite = torch.ones((), dtype=torch.bool, device=dev)

    out_d = torch.empty((m, k), dtype=torch.float64, device=dev)
    out_i = torch.empty((m, k), dtype=torch.int64, device=dev)
    if m == 0:
        return out_d, out_i
    for q0 in range(0, m, q_rows):
        q1 = min(q0 + q_rows, m)
        stats.query_tiles += 1
        y64 = Y64[q0:q1]
        mq = q1 - q0
        best_d = torch.full((mq, 0), math.inf, dtype=torch.float64, device=dev)
        best_i = torch.zeros((mq, 0), dtype=torch.int64, device=dev)
        lower = torch.full((mq,), math.inf, dtype=torch.float64, device=dev)
        state: dict[str, Any] = {"d": best_d, "i": best_i, "lower": lower, "mu": mu32, "finite": finite}
        sub = max(1, cap // 4 // max(kp * d * 8 * 3, 1))  # queries per re-rank step

        def chunk(off: int, R: torch.Tensor, y64=y64, mq=mq, state=state, sub=sub) -> None:
            c = R.shape[0]
            if state["mu"] is None:  # the centring of every chunk and query: the first chunk's mean
                state["mu"] = R.mean(0, dtype=torch.float64).to(torch.float32)
            if "Yc" not in state:
                state["Yc"] = (y64 - state["mu"].to(torch.float64)).to(torch.float32).contiguous()
                state["qn"] = state["Yc"].to(torch.float64).norm(dim=1)
            Yc, qn = state["Yc"], state["qn"]
            state["finite"] &= torch.isfinite(R).all()
            Rc = torch.sub(R, state["mu"], out=centred[:c])
            if c > kp:
                # rows the kernel drops are at least min(seed, its kp-th value) less the rounding bound ε; the
                # seed, the running exact k-th value plus 2ε, keeps every row that could still enter
                cmax = torch.linalg.vector_norm(Rc, dim=1).amax().to(torch.float64) * (1.0 + 1e-5)
                eps = rounding_bound(precision, qn, cmax, d)
                kth = state["d"][:, k - 1] if state["d"].shape[1] >= k else torch.full_like(qn, math.inf)
                seed = seed_above(kth, eps)
                vals, loc = cand(Yc, Rc, kp, seed)
                bound = torch.minimum(vals[:, -1].to(torch.float64), seed.to(torch.float64)) - eps
                state["lower"] = torch.minimum(state["lower"], bound)
            else:  # every row is a candidate
                vals, loc = cand(Yc, Rc, kp)
            valid = loc < c
            safe = loc.clamp(max=c - 1)
            exact = torch.empty((mq, kp), dtype=torch.float64, device=dev)
            for s in range(0, mq, sub):
                exact[s:s + sub] = _sq64(y64[s:s + sub], R[safe[s:s + sub]])
            exact = torch.where(valid, exact, math.inf)
            state["d"], state["i"] = _order(torch.cat([state["d"], exact], 1),
                                            torch.cat([state["i"], loc + off], 1), k)

        stats.chunks += pipe.run(chunk)
        mu32, finite = state["mu"], state["finite"]
        if not bool(finite):
            raise NonFiniteError("The references hold NaN or infinite values; kneighbors names them (or use "
                                 "missing='skip').")
        best_d, best_i = state["d"], state["i"]
        bad = torch.nonzero(~(best_d[:, k - 1] < state["lower"])).flatten()
        if len(bad):
            stats.fallback_queries += len(bad)
            fd, fi = _exact_stream(pipe, y64[bad], k, cap)
            best_d[bad], best_i[bad] = fd, fi
        out_d[q0:q1], out_i[q0:q1] = best_d, best_i
    if metric == "euclidean":
        out_d = out_d.sqrt()
    return out_d, out_i


def _exact_stream(pipe: _Pipeline, q64: torch.Tensor, k: int, cap: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Float64 brute force of the queries ``q64`` over the streamed references (the certificate's fallback)."""
    dev, mq, d = q64.device, q64.shape[0], q64.shape[1]
    state = {"d": torch.full((mq, 0), math.inf, dtype=torch.float64, device=dev),
             "i": torch.zeros((mq, 0), dtype=torch.int64, device=dev)}
    cols = max(64, cap // 4 // max(mq * d * 8 * 3, 1))

    def chunk(off: int, R: torch.Tensor) -> None:
        for s in range(0, R.shape[0], cols):
            e = min(s + cols, R.shape[0])
            ids = torch.arange(off + s, off + e, device=dev).expand(mq, -1)
            state["d"], state["i"] = _order(torch.cat([state["d"], _sq64(q64, R[s:e])], 1),
                                            torch.cat([state["i"], ids], 1), k)

    pipe.run(chunk)
    return state["d"], state["i"]


def transfer_floor(src: HostChunks, rows: int, device: torch.device | str = "cuda",
                   first_rows: int | None = None) -> float:
    """Seconds to copy every chunk of ``src`` host → device through the same pipeline with no compute (the
    floor a streamed search can approach): ``rows`` and ``first_rows`` as a search's :class:`StreamStats`
    report them. CUDA only.

    Examples
    --------
    >>> import numpy as np, torch
    >>> if torch.cuda.is_available():  # doctest: +SKIP
    ...     seconds = transfer_floor(HostChunks(np.zeros((10**6, 64), np.float32)), rows=2**18)
    """
    dev = torch.device(device)
    pipe = _Pipeline(src, rows, dev, first_rows)
    torch.cuda.synchronize(dev)
    import time

    t0 = time.perf_counter()
    pipe.run(lambda off, R: None)
    torch.cuda.synchronize(dev)
    return time.perf_counter() - t0
