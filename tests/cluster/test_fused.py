"""The fused pass of FuzzyKMeans (one Triton kernel per iteration, run here in the interpreter) against its float64
PyTorch reference: sums, objective and labels of one pass, several updates with no host synchronisation, ties,
zero distances, M = k; and FuzzyKMeans on the fused route against the chunked route (same stopping, history,
labels, empty-cluster relocation)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from densitas._backend.dispatch import use_backend
from densitas.cluster import FuzzyKMeans
from densitas.cluster import _torch as ref

from .conftest import direct_gfkm, direct_memberships


def _triton():
    from densitas.cluster import _triton

    return _triton


def _case(rng, n, d, k, dtype):
    """Rows with exact ties and centroids with exact ties and zero distances (representable in ``dtype``)."""
    X = torch.as_tensor(rng.normal(size=(n, d)) * 3.0, dtype=dtype)
    X[5] = X[6]  # duplicate rows
    C = torch.as_tensor(rng.normal(size=(k, d)) * 3.0, dtype=torch.float64)
    C[0] = X[0].to(torch.float64)  # row 0 is on centroid 0
    if k >= 3:
        C[2] = C[1]  # two equal centroids: every row ties between 1 and 2 (ties go to the lower index)
    if k >= 4:
        C[3] = X[10].to(torch.float64)
    return X, C


CASES = [  # n, d, k, M, q
    (70, 3, 5, 2, 2.0),
    (53, 10, 10, 10, 2.0),  # M = k: classic fuzzy c-means
    (41, 5, 7, 3, 1.7),
    (37, 20, 17, 17, 2.5),
    (33, 2, 3, 1, 2.0),  # M = 1: k-means
    (29, 1, 4, 2, 3.0),  # one feature
    (24, 7, 4, 4, 1.3),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("n", "d", "k", "M", "q"), CASES)
def test_fused_pass_equals_the_float64_reference(seeded, dtype, n, d, k, M, q):
    X, C = _case(seeded, n, d, k, dtype)
    s_ref, J_ref, lab_ref = ref.fused_pass(X.to(torch.float64), C, M, q, labels=True)
    s, J, lab = _triton().fused_pass(X, C, M, q, labels=True)
    rtol = 1e-5 if dtype == torch.float32 else 1e-12
    cent = s[:, :d] / s[:, d:]
    cent_ref = s_ref[:, :d] / s_ref[:, d:]
    scale = float(X.abs().max())
    torch.testing.assert_close(cent, cent_ref, rtol=rtol, atol=rtol * scale, equal_nan=True)  # NaN: empty
    torch.testing.assert_close(s[:, d], s_ref[:, d], rtol=rtol, atol=rtol)
    torch.testing.assert_close(J, J_ref, rtol=rtol, atol=0.0)
    assert torch.equal(lab, lab_ref)
    if k >= 3:
        assert not bool((lab == 2).any())  # the tie between the equal centroids 1 and 2 goes to 1


def test_fused_pass_without_sums_and_zero_rows(seeded):
    """sums=False gives the objective alone; a row on two equal centroids gives each half (the reference's
    1/z rule) — visible in the sums of the two clusters."""
    X = torch.tensor([[0.0, 0.0], [1.0, 0.0], [4.0, 4.0], [5.0, 4.0]], dtype=torch.float32)
    C = torch.tensor([[0.0, 0.0], [0.0, 0.0], [4.5, 4.0]], dtype=torch.float64)
    s, J, lab = _triton().fused_pass(X, C, 3, 2.0, sums=False, labels=True)
    _s, J_ref, lab_ref = ref.fused_pass(X, C, 3, 2.0, sums=False, labels=True)
    assert s is None and _s is None and lab.tolist() == lab_ref.tolist() == [0, 0, 2, 2]
    torch.testing.assert_close(J, J_ref, rtol=1e-6, atol=0.0)
    s, _, _ = _triton().fused_pass(X, C, 2, 2.0)
    s_ref, _, _ = ref.fused_pass(X, C, 2, 2.0)
    torch.testing.assert_close(s, s_ref, rtol=1e-6, atol=1e-7)
    # rows 0 and 1 split 1/2, 1/2 (weights 1/4 each) between the equal centroids 0 and 1; cluster 1 gets no other
    assert float(s[1, 2]) == 0.5 and s[1, :2].tolist() == [0.25, 0.0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("M", "q"), [(2, 2.0), (4, 1.8), (1, 2.0)])
def test_fused_iterations_equal_direct_gfkm(seeded, dtype, M, q):
    X, _ = _case(seeded, 60, 3, 4, dtype)
    C0 = X[[0, 15, 30, 45]].to(torch.float64) + 0.05
    Cs, J, move, empty = _triton().fused_iterations(X, C0, M, q, 3)
    Cr, Jr, mr, er = ref.fused_iterations(X.to(torch.float64), C0, M, q, 3)
    want = direct_gfkm(X.to(torch.float64).numpy(), C0.numpy(), M, q, 3)
    rtol = 1e-5 if dtype == torch.float32 else 1e-12
    scale = float(X.abs().max())
    for s in range(3):
        np.testing.assert_allclose(Cr[s + 1].numpy(), want[s], rtol=1e-12, atol=1e-12 * scale)
        np.testing.assert_allclose(Cs[s + 1].numpy(), want[s], rtol=rtol, atol=rtol * scale)
    torch.testing.assert_close(J, Jr, rtol=rtol, atol=0.0)
    torch.testing.assert_close(move, mr, rtol=1e-4 if dtype == torch.float32 else 1e-9, atol=rtol * scale)
    assert empty.tolist() == er.tolist() == [0, 0, 0]


def test_fused_iterations_flag_empty_clusters():
    X = torch.tensor([[0.0], [0.2], [5.0], [5.2]])
    C0 = torch.tensor([[0.0], [5.0], [100.0]], dtype=torch.float64)  # the third centroid is nobody's nearest
    Cs, _J, _move, empty = _triton().fused_iterations(X, C0, 1, 2.0, 2)
    assert empty.tolist() == [1, 1]
    assert float(Cs[2, 2, 0]) == 100.0  # left where it was (FuzzyKMeans redoes such an update)


def blobs(rng, n_per=25, d=3, k=3):
    centres = rng.normal(size=(k, d)) * 6.0
    X = np.concatenate([c + rng.normal(size=(n_per, d)) for c in centres])
    return X, np.arange(k) * n_per


@pytest.mark.parametrize(("M", "q", "tol", "max_iter", "dtype"), [
    (3, 2.0, 0.0, 7, np.float64),  # tol = 0: exactly max_iter updates over batches of 4 and 3
    (2, 1.6, 0.0, 5, np.float32),
    (2, 2.0, 1e-3, 40, np.float64),  # stops inside a batch: the first update that moves less than tol
    (1, 2.0, 1e-9, 40, np.float64),
])
def test_fuzzy_kmeans_fused_route_equals_the_chunked_route(seeded, M, q, tol, max_iter, dtype):
    X, first = blobs(seeded)
    X = X.astype(dtype)
    kw = dict(n_nearest=M, fuzzifier=q, init=X[first].astype(np.float64) + 0.3, max_iter=max_iter, tol=tol,
              device="cpu")
    want = FuzzyKMeans(3, **kw).fit(X)
    calls = []
    with use_backend("triton"):
        got = FuzzyKMeans(3, **kw)._fit(X, callback=lambda *a: calls.append(a))
    assert got.centroid_update_ == "fused" and want.centroid_update_ == "dense"
    assert got.n_iter_ == want.n_iter_ and len(got.objective_) == got.n_iter_ == len(calls)
    if tol == 0:
        assert got.n_iter_ == max_iter
    rtol = 1e-5 if dtype == np.float32 else 1e-10
    np.testing.assert_allclose(got.cluster_centers_, want.cluster_centers_, rtol=rtol, atol=rtol)
    np.testing.assert_allclose(got.objective_, want.objective_, rtol=rtol)
    np.testing.assert_allclose(got.inertia_, want.inertia_, rtol=rtol)
    assert got.labels_.tolist() == want.labels_.tolist()
    assert [c[0] for c in calls] == list(range(1, got.n_iter_ + 1))
    np.testing.assert_allclose([c[1] for c in calls], got.objective_)


def test_fused_route_relocates_empty_clusters_as_the_chunked_route(seeded):
    X, first = blobs(seeded, n_per=15, d=2, k=2)
    C0 = np.r_[X[first], [[1e4, 1e4]]]  # the third centroid is nobody's nearest: the first update is redone
    kw = dict(n_nearest=1, fuzzifier=2.0, init=C0, max_iter=3, tol=0, device="cpu")
    want = FuzzyKMeans(3, **kw).fit(X)
    with use_backend("triton"):
        got = FuzzyKMeans(3, **kw).fit(X)
    assert got.n_iter_ == want.n_iter_ == 3
    np.testing.assert_allclose(got.cluster_centers_, want.cluster_centers_, rtol=1e-10, atol=1e-10)
    # (the chunked route's distances come from a GEMM around a shift far from the 1e4 centroid: 1e-9 rounding)
    np.testing.assert_allclose(got.objective_, want.objective_, rtol=1e-7)
    assert np.abs(got.cluster_centers_ - 1e4).max() > 1.0  # moved off the far point


def test_fused_route_is_taken_only_where_it_applies(seeded):
    T = _triton()
    x = torch.zeros((10, 4))
    assert T.fused_applies(x, 64) and not T.fused_applies(x, 65)
    assert not T.fused_applies(torch.zeros((10, 129)), 8)
    assert not T.fused_applies(x.T.contiguous().T, 3)  # column stride != 1
    assert not T.fused_applies(x.to(torch.int64), 3)
    assert T.fused_applies(x.double(), 3, 2.0) and not T.fused_applies(x.double(), 3, 1.5)
    X, first = blobs(seeded, n_per=10)
    kw = dict(n_nearest=2, fuzzifier=2.0, init=X[first], max_iter=2, tol=0, device="cpu")
    with use_backend("triton"):
        assert FuzzyKMeans(3, centroid_update="atomic", **kw).fit(X).centroid_update_ == "atomic"
    assert FuzzyKMeans(3, **kw).fit(X).centroid_update_ == "dense"  # the CPU keeps the chunked route


@pytest.mark.parametrize("q", [2.0, 1.7])
@pytest.mark.parametrize("layout", ["rows", "columns"])
def test_classic_cpu_pass_equals_direct_fcm(seeded, monkeypatch, q, layout):
    """The CPU's classic path (two GEMMs per chunk over the cached [x, 1, ‖x − s‖²]ᵀ) over several chunks, one
    with zero distances (initial centroids on data points: the log-domain rule for that chunk), row-major or
    not (the sums from the rows, or from the cached columns), against a direct float64 fuzzy c-means."""
    import densitas.cluster.fuzzy as fz

    monkeypatch.setattr(fz, "CPU_CLASSIC_ROWS", 16)
    X, first = blobs(seeded, n_per=20, d=3, k=3)
    C0 = X[first + 5]  # rows 5, 25, 45: zero distances in the first update
    Xt = torch.as_tensor(X)
    if layout == "columns":
        Xt = Xt.T.contiguous().T
    km = FuzzyKMeans(3, n_nearest=3, fuzzifier=q, init=C0, max_iter=4, tol=0, device="cpu").fit(Xt)
    want = direct_gfkm(X, C0, 3, q, 4)
    np.testing.assert_allclose(km.cluster_centers_, want[-1], rtol=1e-10, atol=1e-10)
    J = [float((direct_memberships(((X[:, None] - c[None]) ** 2).sum(2), q) ** q
                * ((X[:, None] - c[None]) ** 2).sum(2)).sum()) for c in [C0, *want[:-1]]]
    np.testing.assert_allclose(km.objective_, J, rtol=1e-10)
