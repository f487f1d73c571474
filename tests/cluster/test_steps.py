"""The steps on their own: document 004's worked example for every centroid method and backend, the methods
against each other and a direct float64 loop, memberships, nearest centroids, the fuzzifier formula, errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from densitas.cluster import (
    CENTROID_METHODS,
    centroid_update,
    choose_method,
    group_by_cluster,
    memberships,
    schwaemmle_jensen,
)
from densitas.cluster._torch import counting_scatter as torch_scatter
from densitas.cluster.steps import membership_weights, nearest_centroids
from densitas.exceptions import InputError

from .conftest import (
    EX_CENTROIDS,
    EX_COUNTS,
    EX_NN,
    EX_OFFSETS,
    EX_ORDER,
    EX_W,
    EX_WSUM,
    EX_X,
    direct_centroids,
    direct_memberships,
)


@pytest.mark.parametrize("method", CENTROID_METHODS)
def test_worked_example_centroids(backend, method):
    got = centroid_update(EX_X, EX_NN, EX_W, 4, method=method, device="cpu")
    np.testing.assert_allclose(got, EX_CENTROIDS, atol=5e-5)
    np.testing.assert_allclose(got, direct_centroids(EX_X, EX_NN, EX_W, 4), rtol=1e-12)
    wsum = np.bincount(EX_NN.ravel(), EX_W.ravel(), minlength=4)
    np.testing.assert_allclose(wsum, EX_WSUM, rtol=1e-12)


@pytest.mark.parametrize("method", ["counting_sort", "sort_by_key"])
def test_worked_example_grouping(backend, method):
    g = group_by_cluster(EX_NN, 4, method=method, device="cpu")
    assert g.counts.tolist() == EX_COUNTS  # the histogram
    assert g.offsets.tolist() == EX_OFFSETS  # its exclusive scan
    points = (g.order // 2 + 1).tolist()
    segments = [points[o:o + c] for o, c in zip(EX_OFFSETS, EX_COUNTS, strict=True)]
    if method == "sort_by_key" or backend == "torch":
        assert segments == EX_ORDER  # the stable order
    else:  # the atomic scatter keeps the members of each cluster, not their order
        assert [sorted(s) for s in segments] == EX_ORDER
    assert g.keys.tolist() == [j for j in range(4) for _ in range(4)]


@pytest.mark.parametrize("n", [1, 2, 15, 17, 64, 131])
def test_methods_agree_on_random_inputs(backend, seeded, n):
    k = int(seeded.integers(1, 12))
    M = int(seeded.integers(1, k + 1))
    d = int(seeded.integers(1, 7))
    X = seeded.normal(size=(n, d)) * 10 + 3
    nn = np.stack([seeded.permutation(k)[:M] for _ in range(n)])
    w = seeded.random((n, M))
    want = direct_centroids(X, nn, w, k)
    for method in (*CENTROID_METHODS, "auto"):
        got = centroid_update(X, nn, w, k, method=method, device="cpu")
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12, err_msg=method)
        assert np.array_equal(np.isnan(got).all(1), np.isnan(want).all(1)), method  # empty clusters: NaN rows


def test_float32_points_accumulate_in_float64(seeded):
    X = (seeded.normal(size=(500, 4)) + 1000).astype(np.float32)
    nn = seeded.integers(0, 3, size=(500, 1))
    w = seeded.random((500, 1))
    want = direct_centroids(X.astype(np.float64), nn, w, 3)
    for method in CENTROID_METHODS:
        got = centroid_update(X, nn, w, 3, method=method, device="cpu")
        assert got.dtype == np.float64
        np.testing.assert_allclose(got, want, rtol=1e-12, err_msg=method)


def test_tensor_in_tensor_out():
    got = centroid_update(torch.tensor(EX_X), torch.tensor(EX_NN), torch.tensor(EX_W), 4, method="atomic")
    assert isinstance(got, torch.Tensor)
    np.testing.assert_allclose(got.numpy(), EX_CENTROIDS, atol=5e-5)


@pytest.mark.parametrize("n", [1, 15, 16, 17, 100, 257])
def test_triton_counting_scatter_groups_like_the_reference(seeded, n):
    from densitas.cluster._triton import counting_scatter as triton_scatter

    k = int(seeded.integers(1, 9))
    keys = torch.from_numpy(seeded.integers(0, k, size=n))
    counts = torch.bincount(keys, minlength=k)
    offsets = torch.cumsum(counts, 0) - counts
    ref = torch_scatter(keys, offsets)
    got = triton_scatter(keys, offsets)
    assert sorted(got.tolist()) == list(range(n))
    for j in range(k):
        seg = slice(int(offsets[j]), int(offsets[j] + counts[j]))
        assert sorted(got[seg].tolist()) == ref[seg].tolist()  # the reference is stable: ascending positions
        assert bool((keys[ref[seg]] == j).all())


def test_reference_scatter_beyond_the_one_hot_limit(seeded):
    keys = torch.from_numpy(seeded.integers(0, 300, size=2000))
    counts = torch.bincount(keys, minlength=300)
    offsets = torch.cumsum(counts, 0) - counts
    order = torch_scatter(keys, offsets)
    assert order.tolist() == torch.sort(keys, stable=True).indices.tolist()


def test_memberships_formula(seeded):
    D = seeded.random((40, 3)) * 5
    D[3, 1] = 0.0
    D[7] = [0.0, 2.0, 0.0]  # two zero distances: half each
    for q in (1.1, 1.5, 2.0, 3.7):
        u = memberships(D, q)
        np.testing.assert_allclose(u, direct_memberships(D, q), rtol=1e-12, atol=1e-300)
        np.testing.assert_allclose(u.sum(1), 1.0, rtol=1e-12)
    assert u[3].tolist() == [0.0, 1.0, 0.0] and u[7].tolist() == [0.5, 0.0, 0.5]
    np.testing.assert_allclose(memberships(np.sqrt(D), 2.0, squared=False), memberships(D, 2.0), rtol=1e-12)


def test_memberships_extreme_fuzzifiers_stay_finite(seeded):
    D = seeded.random((20, 4)) * 1e3 + 1e-6
    for q in (1.0001, 60.0):
        u, w = membership_weights(torch.from_numpy(D), q)
        assert bool(torch.isfinite(u).all()) and bool(torch.isfinite(w).all())
        np.testing.assert_allclose(u.sum(1).numpy(), 1.0, rtol=1e-12)
    u, _ = membership_weights(torch.from_numpy(D), 1.0001)
    # the reference: a softmax of −log D / (q − 1), which cannot overflow (the rows' nearest two centroids can be
    # close enough that the largest membership is well below 1, so no fixed bound on it holds for every seed)
    z = -np.log(D) / (1.0001 - 1.0)
    ref = np.exp(z - z.max(1, keepdims=True))
    ref /= ref.sum(1, keepdims=True)
    np.testing.assert_allclose(u.numpy(), ref, rtol=1e-8, atol=1e-300)
    assert (u.argmax(1).numpy() == D.argmin(1)).all()


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_nearest_centroids_equal_brute_force(backend, seeded, dtype):
    n, d, k = 37, 5, 9
    X = seeded.normal(size=(n, d)).astype(dtype)
    C = seeded.normal(size=(k, d))
    full = ((X.astype(np.float64)[:, None, :] - C[None]) ** 2).sum(2)
    x = torch.from_numpy(X)
    for M in (1, 2, 4, k):
        D, nn = nearest_centroids(x, torch.from_numpy(C), M, torch.from_numpy(C.mean(0)))
        want = np.sort(full, 1)[:, :M]
        np.testing.assert_allclose(np.sort(D.numpy(), 1), want, rtol=1e-5 if dtype == np.float32 else 1e-10,
                                   atol=1e-5 if dtype == np.float32 else 1e-12)
        np.testing.assert_allclose(np.take_along_axis(full, nn.numpy(), 1), D.numpy(),
                                   rtol=1e-5 if dtype == np.float32 else 1e-10, atol=1e-5)


def test_schwaemmle_jensen_formula():
    for n, d in [(1, 1), (50, 2), (1000, 10), (60000, 784), (1_025_010, 10)]:
        want = 1 + (1418 / n + 22.05) * d ** -2 + (12.33 / n + 0.243) * d ** (-0.0406 * math.log(n) - 0.1134)
        assert schwaemmle_jensen(n, d) == pytest.approx(want, rel=1e-15)
        assert schwaemmle_jensen(n, d) > 1
    assert schwaemmle_jensen(1000, 10) == pytest.approx(1.33777722620731, rel=1e-12)


def test_choose_method():
    assert choose_method(10**6, 10, 10, 10) == "dense"
    assert choose_method(10**6, 10, 1000, 2) == "atomic"
    assert choose_method(10**6, 10, 10, 2) in CENTROID_METHODS


@pytest.mark.parametrize("bad", [
    dict(nearest=[[0, 4]]),  # index ≥ k
    dict(nearest=[[-1, 0]]),
    dict(nearest=[[0.0, 1.0]]),  # not integers
    dict(weights=[[-1.0, 0.5]]),
    dict(weights=[[np.nan, 0.5]]),
    dict(X=[[np.nan, 1.0]]),
    dict(weights=[[1.0]]),  # shape mismatch
    dict(method="bogus"),
    dict(n_clusters=0),
])
def test_centroid_update_bad_input(bad):
    args = dict(X=[[1.0, 2.0]], nearest=[[0, 1]], weights=[[0.5, 0.5]], n_clusters=4, method="auto")
    args.update(bad)
    with pytest.raises(InputError):
        centroid_update(args["X"], args["nearest"], args["weights"], args["n_clusters"], method=args["method"],
                        device="cpu")


def test_memberships_bad_input():
    for q in (1.0, 0.5, "auto", float("nan"), True):
        with pytest.raises(InputError):
            memberships([[1.0, 2.0]], q)
    with pytest.raises(InputError):
        memberships([[-1.0, 2.0]], 2.0)


@pytest.mark.parametrize("q", [1.3, 2.0, 3.5])
def test_closed_form_objective_equals_the_sum(seeded, q):
    from densitas.cluster.steps import weights_and_objective

    D = torch.from_numpy(seeded.random((50, 4)) * 7 + 0.01)
    u_ref, w_ref = membership_weights(D, q)
    J_ref = float((w_ref * D).sum())
    for dim, Dl in ((1, D), (0, D.T.contiguous())):
        for keep_u, overwrite in ((True, False), (False, False), (False, True)):
            u, w, J = weights_and_objective(Dl.clone(), q, dim, keep_u=keep_u, overwrite=overwrite)
            w = w if dim == 1 else w.T
            np.testing.assert_allclose(w.numpy(), w_ref.numpy(), rtol=1e-12)
            assert float(J) == pytest.approx(J_ref, rel=1e-12)
            if keep_u:
                np.testing.assert_allclose((u if dim == 1 else u.T).numpy(), u_ref.numpy(), rtol=1e-12)
    Dz = D.clone()
    Dz[5, 2] = 0.0  # a zero distance: the log-domain path
    for dim, Dl in ((1, Dz), (0, Dz.T.contiguous())):
        _, w, J = weights_and_objective(Dl.clone(), q, dim, keep_u=False, overwrite=True)
        w = w if dim == 1 else w.T
        assert w[5].tolist() == [0.0, 0.0, 1.0, 0.0]
        assert float(J) == pytest.approx(float((membership_weights(Dz, q)[1] * Dz).sum()), rel=1e-12)
