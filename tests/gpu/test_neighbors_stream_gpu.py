"""Host-resident references streamed through a real GPU (pinned staging, two streams, merge on the device):
exact against a float64 brute force and identical to the in-memory CUDA path (run on the device machine with
-m gpu)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from densitas.neighbors import kneighbors
from densitas.neighbors.stream import HostChunks, StreamStats, stream_kneighbors

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _brute(Y: torch.Tensor, X: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Float64 squared distances on the GPU, ties by the lower index (16 queries at a time)."""
    out_d, out_i = [], []
    for s in range(0, len(Y), 16):
        d = ((Y[s:s + 16, None, :].double() - X[None, :, :].double()) ** 2).sum(-1)
        o = torch.argsort(d, dim=1, stable=True)[:, :k]
        out_d.append(d.gather(1, o))
        out_i.append(o)
    return torch.cat(out_d), torch.cat(out_i)


def _data(n: int, d: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, d, generator=g)
    X[1000:1300] = X[7]  # ties beyond the candidate list
    Y = torch.cat([X[:40], X[[7]], torch.randn(100, d, generator=g)])
    return X, Y


@pytest.mark.parametrize("pinned", [False, True])
@pytest.mark.parametrize(("n", "d", "k", "budget"), [(120_000, 64, 10, "16MB"), (50_000, 128, 100, "64MB"),
                                                     (30_011, 5, 1, "1MB")])
def test_streamed_cuda_is_exact(pinned, n, d, k, budget):
    X, Y = _data(n, d, n + k)
    if pinned:
        X = X.pin_memory()
    stats = StreamStats()
    D, I_ = stream_kneighbors(Y.cuda(), X, k, metric="sqeuclidean", device="cuda", memory_budget=budget,
                              stats=stats)
    assert stats.chunks > 2 and stats.pinned_source == pinned and stats.backend == "triton"
    rd, ri = _brute(Y.cuda(), X.cuda(), k)
    assert torch.equal(I_, ri)
    assert torch.allclose(D, rd, rtol=1e-12, atol=1e-9)


def test_kneighbors_streams_host_arrays_with_the_in_memory_answer():
    X, Y = _data(200_000, 32, 3)
    d_mem, i_mem = kneighbors(X.cuda(), Y.cuda(), 10)  # the in-memory fused path
    d_np, i_np = kneighbors(X.numpy(), Y.numpy(), 10, device="cuda", memory_budget="32MB")  # streamed
    d_t, i_t = kneighbors(X, Y.cuda(), 10, memory_budget="32MB")  # host tensor, device queries
    assert (i_np == i_mem.cpu().numpy()).all() and torch.equal(i_t, i_mem)
    np.testing.assert_allclose(d_np, d_mem.cpu().numpy(), rtol=1e-14, atol=0)
    torch.testing.assert_close(d_t, d_mem, rtol=1e-14, atol=0)


def test_kneighbors_streamed_nan_still_names_the_value():
    X, Y = _data(20_000, 8, 4)
    X[1234, 5] = float("nan")
    with pytest.raises(ValueError, match="1234"):
        kneighbors(X.numpy(), Y.numpy(), 3, device="cuda")
    _d, i = kneighbors(X.numpy(), Y.numpy(), 3, device="cuda", missing="skip")
    assert i.shape == (len(Y), 3)


def test_streamed_reader_chunks_cuda(tmp_path):
    X, Y = _data(90_000, 16, 5)
    path = tmp_path / "x.npy"
    np.save(path, X.numpy())

    def blocks(rows):
        arr = np.load(path, mmap_mode="r")
        for s in range(0, len(arr), rows):
            yield s, np.array(arr[s:s + rows])

    D, I_ = stream_kneighbors(Y.cuda(), HostChunks(blocks=blocks, n_rows=len(X), width=16), 5, device="cuda",
                              memory_budget="4MB")
    rd, ri = _brute(Y.cuda(), X.cuda(), 5)
    assert torch.equal(I_, ri)
    assert torch.allclose(D, rd.sqrt(), rtol=1e-12, atol=1e-9)
    _d2, i2 = kneighbors(str(path), Y.numpy(), 5, device="cuda", memory_budget="4MB")  # a file, streamed
    assert (i2 == ri.cpu().numpy()).all()


@pytest.mark.parametrize(("n", "d", "k"), [(300_000, 64, 10), (200_000, 128, 100), (150_000, 7, 3)])
@pytest.mark.parametrize("precision", ["tf32", "fp16"])
@pytest.mark.parametrize("pieces", [1, 2, "threshold"])
def test_fused_driver_cuda_is_exact(precision, pieces, n, d, k):
    """The in-memory fused driver in one piece, in two (the first seeds the rest) or as the threshold pass (seeds
    from samples, then the rows below the seed), with TF32 or float16 operands, on the real kernel: the float64
    answer, ties by the lower index."""
    from densitas.neighbors import _triton as fused

    X, Y = _data(n, d, n + k)
    X[-7:] *= 1e-4  # tiny rows beside normal ones: float16's scale puts them near its subnormal range
    Xc, Yc = X.cuda(), Y.cuda()
    stats: dict[str, int] = {}
    first = n // fused.FIRST_PIECE if pieces == 2 else 0
    D, I_ = fused.fused_kneighbors(Yc, Xc, k, metric="sqeuclidean", precision=precision, first_piece=first,
                                   threshold=pieces == "threshold", stats=stats)
    assert stats["first_piece"] == first
    assert ("threshold" in stats) is (pieces == "threshold")
    rd, ri = _brute(Yc, Xc, k)
    assert torch.equal(I_, ri)
    assert torch.allclose(D, rd, rtol=1e-12, atol=1e-9)


@pytest.mark.parametrize("k", [10, 100])
def test_streamed_half_operands_cuda_is_exact(monkeypatch, k):
    from densitas.neighbors import stream

    monkeypatch.setattr(stream, "STREAM_PRECISION", "fp16")
    X, Y = _data(120_000, 64, 5 + k)
    stats = StreamStats()
    D, I_ = stream_kneighbors(Y.cuda(), X.pin_memory(), k, metric="sqeuclidean", device="cuda",
                              memory_budget="16MB", stats=stats)
    assert stats.chunks > 2 and stats.backend == "triton"
    rd, ri = _brute(Y.cuda(), X.cuda(), k)
    assert torch.equal(I_, ri)
    assert torch.allclose(D, rd, rtol=1e-12, atol=1e-9)


def test_threshold_pass_with_clustered_rows_cuda_is_exact():
    """Ordered, clustered references with 9,000 copies of one row (past the buffer's slots for the queries at it):
    the threshold pass on the real kernels gives the float64 answer."""
    from densitas.neighbors import _triton as fused

    X, Y = _data(400_000, 32, 300)
    X = X[torch.argsort(X[:, 0])]
    X[1000:10000] = X[77]
    Y[:5] = X[77]
    Xc, Yc = X.cuda(), Y.cuda()
    stats: dict[str, int] = {}
    D, I_ = fused.fused_kneighbors(Yc, Xc, 100, metric="sqeuclidean", stats=stats)
    assert stats["threshold"] == len(Y)
    rd, ri = _brute(Yc, Xc, 100)
    assert torch.equal(I_, ri)
    assert torch.allclose(D, rd, rtol=1e-12, atol=1e-9)
