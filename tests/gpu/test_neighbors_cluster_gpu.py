"""The fused k-NN kernel and the clustering steps on a real GPU (run on the device machine with -m gpu)."""

from __future__ import annotations

import pytest
import torch

from densitas.cluster import FuzzyKMeans
from densitas.neighbors import kneighbors

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _brute(Y: torch.Tensor, X: torch.Tensor, k: int, nominal: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Float64 brute force, ties by the lower index (squared Euclidean; last ``nominal`` columns by mismatch)."""
    p = X.shape[1] - nominal
    d = ((Y[:, None, :p].double() - X[None, :, :p].double()) ** 2).sum(-1)
    if nominal:
        d = d + (Y[:, None, p:] != X[None, :, p:]).sum(-1)
    o = torch.argsort(d, dim=1, stable=True)[:, :k]
    return d.gather(1, o), o


@pytest.mark.parametrize(("n", "d", "k"), [(200_000, 64, 10), (50_000, 128, 100), (30_000, 16, 300)])
def test_kneighbors_cuda_is_exact(n, d, k):
    g = torch.Generator(device="cuda").manual_seed(n + k)
    X = torch.randn(n, d, device="cuda", generator=g)
    X[1000:1300] = X[7]  # ties beyond the candidate list
    Y = torch.cat([X[:50], X[[7]], torch.randn(150, d, device="cuda", generator=g)])
    D, I_ = kneighbors(X, Y, k, metric="sqeuclidean")
    rd, ri = _brute(Y, X, k)
    assert torch.equal(I_, ri)
    assert torch.allclose(D, rd, rtol=1e-12, atol=1e-9)


def test_mixed_euclidean_cuda_is_exact():
    g = torch.Generator(device="cuda").manual_seed(5)
    X = torch.cat([torch.randn(60_000, 20, device="cuda", generator=g),
                   torch.randint(0, 6, (60_000, 5), device="cuda", generator=g).float()], 1)
    Y = X[:300]
    D, I_ = kneighbors(X, Y, 10, metric="mixed_euclidean", nominal=list(range(20, 25)))
    rd, ri = _brute(Y, X, 10, nominal=5)
    assert torch.equal(I_, ri)
    assert torch.allclose(D, rd.sqrt(), rtol=1e-12, atol=1e-9)


@pytest.mark.parametrize("n_nearest", [2, 6])
def test_fuzzy_kmeans_cuda_matches_cpu(n_nearest):
    g = torch.Generator().manual_seed(3)
    X = torch.randn(100_000, 8, generator=g, dtype=torch.float64)
    init = X[:6].clone()
    kw = dict(n_clusters=6, n_nearest=n_nearest, init=init.numpy(), max_iter=15, tol=0.0, fuzzifier=2.0)
    cpu = FuzzyKMeans(device="cpu", **kw).fit(X.numpy())
    gpu = FuzzyKMeans(device="cuda", **kw).fit(X.numpy())
    assert torch.allclose(torch.as_tensor(gpu.cluster_centers_), torch.as_tensor(cpu.cluster_centers_), rtol=1e-6,
                          atol=1e-9)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("k", "M", "q"), [(10, 2, 2.0), (10, 10, 2.0), (7, 3, 1.7), (64, 4, 2.5), (5, 5, 1.3)])
def test_fused_pass_cuda_equals_the_float64_reference(dtype, k, M, q):
    """The compiled fused kernel (one pass: sums, objective, labels) against the float64 PyTorch reference."""
    from densitas.cluster import _torch as ref
    from densitas.cluster import _triton as fused

    if dtype == torch.float64 and q != 2.0:
        assert not fused.fused_applies(torch.zeros((4, 10), dtype=dtype), k, q)  # single-precision powers
        return
    g = torch.Generator(device="cuda").manual_seed(k * 10 + M)
    X = torch.randn(300_007, 10, device="cuda", generator=g, dtype=dtype) * 3.0
    C = torch.randn(k, 10, device="cuda", generator=g, dtype=torch.float64) * 3.0
    C[0] = X[0].double()  # a zero distance
    C[2] = C[1]  # equal centroids: ties to the lower index
    s, J, lab = fused.fused_pass(X, C, M, q, labels=True)
    s_r, J_r, lab_r = ref.fused_pass(X.double(), C, M, q, labels=True)
    rtol = 1e-5 if dtype == torch.float32 else 1e-11
    torch.testing.assert_close(s[:, :10] / s[:, 10:], s_r[:, :10] / s_r[:, 10:], rtol=rtol, atol=rtol * 15)
    torch.testing.assert_close(J, J_r, rtol=rtol, atol=0.0)
    assert (lab != lab_r).float().mean() < 1e-4  # float32 distances may order near-ties differently
    if dtype == torch.float64:
        assert torch.equal(lab, lab_r)


def test_fuzzy_kmeans_cuda_fused_route_and_stopping():
    """On CUDA "auto" takes the fused route; the batched stopping test gives the update-by-update n_iter_."""
    g = torch.Generator().manual_seed(4)
    X = torch.randn(200_000, 10, generator=g, dtype=torch.float64)
    X[:100_000] += 4.0
    init = X[[0, 1, 150_000]].clone().numpy()
    kw = dict(n_clusters=3, n_nearest=2, init=init, max_iter=200, tol=1e-7, fuzzifier=2.0)
    cpu = FuzzyKMeans(device="cpu", **kw).fit(X.numpy())
    gpu = FuzzyKMeans(device="cuda", **kw).fit(X.cuda())
    assert gpu.centroid_update_ == "fused"
    assert gpu.n_iter_ == cpu.n_iter_ < 200
    assert torch.allclose(torch.as_tensor(gpu.cluster_centers_), torch.as_tensor(cpu.cluster_centers_), rtol=1e-6,
                          atol=1e-9)
    assert (gpu.labels_ == cpu.labels_).all()
