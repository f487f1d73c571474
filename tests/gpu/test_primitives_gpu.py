"""Real Triton kernels at real sizes on a CUDA device, against float64 references (run with -m gpu)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from densitas import primitives as P
from densitas._backend.dispatch import use_backend

pytestmark = pytest.mark.gpu

SIZES = [1, 2, 4095, 4097, 1_000_003, 1 << 24]


@pytest.fixture(autouse=True)
def _cuda():
    if not torch.cuda.is_available():
        pytest.fail("the gpu suite needs a CUDA device")
    with use_backend("triton"):
        yield


def _rel(a, b):
    return float((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-300))


@pytest.mark.parametrize("n", SIZES)
def test_reduce_scan(n):
    x = torch.rand(n, device="cuda") - 0.25
    assert abs(float(P.reduce(x)) - float(x.double().sum())) <= 1e-6 * float(x.double().abs().sum())
    ref = torch.cumsum(x.double(), 0)
    tol = 1e-6 * float(x.double().abs().sum()) + 1e-6
    assert float((P.scan(x).double() - ref).abs().max()) <= tol
    assert float((P.scan(x, inclusive=False).double()[1:] - ref[:-1]).abs().max() if n > 1 else 0) <= tol
    rev = torch.flip(torch.cumsum(torch.flip(x.double(), [0]), 0), [0])
    assert float((P.scan(x, reverse=True).double() - rev).abs().max()) <= tol
    assert torch.equal(P.scan(x, "max"), torch.cummax(x, 0).values)
    xi = torch.randint(-1000, 1000, (n,), device="cuda", dtype=torch.int32)
    assert torch.equal(P.scan(xi), torch.cumsum(xi.long(), 0))
    assert torch.equal(P.scan(xi, "min"), torch.cummin(xi, 0).values)


def test_reduce_1e8_accuracy():
    x = torch.rand(10**8, device="cuda")
    assert abs(float(P.reduce(x)) - float(x.double().sum())) / float(x.double().sum()) <= 1e-6


@pytest.mark.parametrize("n", SIZES)
def test_segmented_compact_sort(n):
    x = torch.rand(n, device="cuda")
    seg = torch.sort(torch.randint(0, max(n // 50, 1), (n,), device="cuda")).values
    got = P.segmented_scan(x, seg)
    with use_backend("torch"):
        want = P.segmented_scan(x.double(), seg)
    assert _rel(got, want) <= 1e-5
    m = x < 0.5
    v, i = P.compact(x, m, return_indices=True)
    assert torch.equal(v, x[m]) and torch.equal(i, torch.nonzero(m).squeeze(1))
    k = torch.randint(-(2**31), 2**31 - 1, (min(n, 1 << 20),), device="cuda", dtype=torch.int32)
    sk, perm = P.radix_sort(k, torch.arange(k.numel(), device="cuda"))
    ref = torch.sort(k, stable=True)
    assert torch.equal(sk, ref.values) and torch.equal(perm, ref.indices)


@pytest.mark.parametrize("n", SIZES)
def test_histograms_rbk(n):
    x = torch.rand(n, device="cuda", dtype=torch.float64) * 1.2 - 0.1
    h, _ = P.histogram(x, 4096, (0.0, 1.0))
    np_h = np.histogram(x.cpu().numpy(), 4096, (0.0, 1.0))[0]
    assert np.array_equal(h.cpu().numpy(), np_h)
    g, _ = P.histogram(x, 4096, (0.0, 1.0), linear=True)
    with use_backend("torch"):
        g_ref, _ = P.histogram(x, 4096, (0.0, 1.0), linear=True)
    assert _rel(g, g_ref) <= 1e-9
    keys = torch.randint(0, 1000, (n,), device="cuda")
    vals = torch.rand(n, 3, device="cuda")
    got = P.reduce_by_key(keys, vals, num_keys=1000)
    want = torch.zeros(1000, 3, device="cuda", dtype=torch.float64).index_add_(0, keys, vals.double())
    assert _rel(got, want) <= 1e-6
    vals[0, 1] = float("nan")
    for op in ("min", "max"):
        r = P.reduce_by_key(keys, vals, op, num_keys=1000)
        assert torch.isnan(r[keys[0], 1]) and int(torch.isnan(r).sum()) == 1, op


@pytest.mark.parametrize("shape", [(1, 1), (63, 65), (1000, 777), (4096, 4096), (3, 200, 300)])
def test_sat(shape):
    a = torch.rand(shape, device="cuda")
    got = P.summed_area_table(a)
    want = a.double()
    for ax in range(a.ndim):
        want = torch.cumsum(want, ax)
    assert _rel(got, want) <= 1e-5
    got64 = P.summed_area_table(a, dtype=torch.float64)
    assert _rel(got64, want) <= 1e-12


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("linear", [False, True])
@pytest.mark.parametrize("weighted", [False, True])
def test_shared_memory_histogram_matches_torch(dtype, linear, weighted):
    """The CuPy shared-memory kernel (1-D histograms on CUDA) against the PyTorch reference, edges included."""
    from densitas.primitives import _cuda

    if not _cuda.available():
        pytest.fail("CuPy is part of the GPU image; the shared-memory histogram must be tested there")
    n = 3_000_017
    x = (torch.rand(n, device="cuda", dtype=torch.float64) * 1.2 - 0.1).to(dtype)
    x[:1000] = torch.linspace(0.0, 1.0, 1000, device="cuda", dtype=torch.float64).to(dtype)  # edge values
    w = torch.rand(n, device="cuda", dtype=dtype) if weighted else None
    got, _ = P.histogram(x, 4096, (0.0, 1.0), weights=w, linear=linear)
    with use_backend("torch"):
        want, _ = P.histogram(x, 4096, (0.0, 1.0), weights=w, linear=linear)
    if not weighted and not linear:
        assert torch.equal(got.cpu(), want.cpu())
    else:
        assert _rel(got, want) <= 1e-9


def test_memory_budget_counts_what_the_caching_allocator_holds_unused(monkeypatch):
    """A freed tensor stays reserved by PyTorch's allocator: the budget must still count it as free."""
    from densitas._backend.chunking import memory_budget

    monkeypatch.delenv("DENSITAS_MEMORY_BUDGET", raising=False)
    torch.cuda.empty_cache()
    before = memory_budget("cuda")
    block = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")  # 1 GiB, then freed into the cache
    del block
    assert torch.cuda.memory_reserved() - torch.cuda.memory_allocated() >= 1 << 30
    assert abs(memory_budget("cuda") - before) < (1 << 30) // 4  # the same half of the device, not 0.5 GiB less


@pytest.mark.parametrize("key_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("op", ["sum", "mean"])
def test_shared_memory_reduce_by_key_matches_float64(key_dtype, dtype, op):
    """One value column on CUDA goes through the shared-memory kernel (CuPy): float64 sums per key equal a
    float64 index_add to summation-order rounding; absent keys stay 0 (sum) or NaN (mean)."""
    pytest.importorskip("cupy")
    n = 3_000_017
    keys = torch.randint(0, 999, (n,), device="cuda", dtype=key_dtype)  # key 999 never occurs
    vals = (torch.rand(n, device="cuda", dtype=torch.float64) - 0.3).to(dtype)
    got = P.reduce_by_key(keys, vals, op, num_keys=1000)
    total = torch.zeros(1000, device="cuda", dtype=torch.float64).index_add_(0, keys.long(), vals.double())
    counts = torch.bincount(keys.long(), minlength=1000).double()
    want = total if op == "sum" else total / counts
    assert got.dtype == dtype
    assert _rel(got[:999].double(), want[:999]) <= (1e-6 if dtype == torch.float32 else 1e-12)
    assert (got[999] == 0) if op == "sum" else bool(torch.isnan(got[999]))
