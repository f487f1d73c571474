"""FuzzyKMeans: classic fuzzy c-means against scikit-fuzzy, GFKM against a direct float64 implementation, the
fuzzifier, determinism, stopping, empty clusters, out-of-core inputs, the scikit-learn contract, bad input."""

from __future__ import annotations

import warnings

import duckdb
import numpy as np
import pandas as pd
import pytest
import torch
from scipy.spatial.distance import cdist
from sklearn.utils.estimator_checks import check_estimator

from densitas._backend.dispatch import use_backend
from densitas.cluster import CENTROID_METHODS, FuzzyKMeans, schwaemmle_jensen
from densitas.exceptions import InputError

from .conftest import direct_gfkm, direct_memberships


def blobs(rng, n_per=40, d=3, k=4, spread=8.0):
    centres = rng.normal(size=(k, d)) * spread
    X = np.concatenate([c + rng.normal(size=(n_per, d)) for c in centres])
    first = np.arange(k) * n_per  # one point of each blob: an initialisation without empty clusters
    return X, first


# -------------------------------------------------------------------------------- scikit-fuzzy


def skfuzzy_cmeans_reference(data, c, m, maxiter, init):
    """scikit-fuzzy's ``cmeans`` loop transcribed from its published source (scikit-fuzzy 0.5.0,
    ``skfuzzy/cluster/_cmeans.py``: ``cmeans`` and ``_cmeans0``; ``normalize_columns.py``), with ``error=0`` so
    that exactly ``maxiter`` steps run. ``data`` is (features, samples); returns the centres after the last step.
    Used when scikit-fuzzy is not installed, and checked against it when it is."""
    eps = np.finfo(np.float64).eps
    u = np.fmax(init, eps)
    cntr = None
    for _ in range(maxiter):
        u_old = u / np.sum(u, axis=0, keepdims=True)
        u_old = np.fmax(u_old, eps)
        um = u_old ** m
        x = data.T
        cntr = um.dot(x) / np.atleast_2d(um.sum(axis=1)).T
        d = cdist(x, cntr).T
        d = np.fmax(d, eps)
        p = d / np.max(d, axis=0, keepdims=True)
        p = np.fmax(p, eps)
        p /= np.min(p, axis=0, keepdims=True)
        p = p ** (-2.0 / (m - 1))
        u = p / np.sum(p, axis=0, keepdims=True)
    return cntr


@pytest.mark.parametrize("p", [1, 3, 12])
@pytest.mark.parametrize("m", [1.6, 2.0, 2.5])
def test_classic_fcm_equals_scikit_fuzzy(seeded, p, m):
    X, first = blobs(seeded, n_per=30, d=4, k=3)
    k = 4
    C0 = X[np.r_[first, 5]]
    km = FuzzyKMeans(k, n_nearest=k, fuzzifier=m, init=C0, max_iter=p, tol=0, device="cpu").fit(X)
    assert km.n_iter_ == p and len(km.objective_) == p
    # scikit-fuzzy starts from memberships: those of the same initial centroids (its layout: features × samples)
    u0 = direct_memberships(cdist(X, C0, "sqeuclidean"), m).T
    want = skfuzzy_cmeans_reference(X.T, k, m, p, u0)
    np.testing.assert_allclose(km.cluster_centers_, want, rtol=1e-6, atol=1e-9)
    try:
        import skfuzzy
    except ImportError:
        return
    cntr, *_rest, pp, _fpc = skfuzzy.cluster.cmeans(X.T, k, m, error=0.0, maxiter=p, init=u0)
    assert pp == p
    # same float64 arithmetic in another summation order: relative 1e-12, and absolute 1e-12 of the data's scale
    # for a coordinate near zero (a weighted mean of values ~|X| carries rounding ~eps·|X|, not eps·|mean|)
    np.testing.assert_allclose(want, cntr, rtol=1e-12, atol=1e-12 * np.abs(X).max())
    np.testing.assert_allclose(km.cluster_centers_, cntr, rtol=1e-6, atol=1e-9)


def test_classic_fcm_objective_decreases(seeded):
    X, _ = blobs(seeded)
    km = FuzzyKMeans(5, n_nearest=5, fuzzifier=2.0, max_iter=30, tol=0, random_state=1, device="cpu").fit(X)
    J = np.r_[km.objective_, km.inertia_]
    assert np.all(np.diff(J) <= 1e-9 * J[0])


# ---------------------------------------------------------------------------------------- GFKM


@pytest.mark.parametrize("method", CENTROID_METHODS)
@pytest.mark.parametrize(("M", "q"), [(1, 2.0), (2, 1.5), (2, 2.0), (3, 3.0)])
def test_gfkm_equals_direct_float64(seeded, method, M, q):
    X, first = blobs(seeded, n_per=25, d=3, k=5)
    C0 = X[first] + 0.1
    p = 4
    want = direct_gfkm(X, C0, M, q, p)[-1]
    km = FuzzyKMeans(5, n_nearest=M, fuzzifier=q, init=C0, max_iter=p, tol=0, centroid_update=method,
                     device="cpu").fit(X)
    assert km.centroid_update_ == method and km.n_iter_ == p
    np.testing.assert_allclose(km.cluster_centers_, want, rtol=1e-10, atol=1e-10)
    D = cdist(X, km.cluster_centers_, "sqeuclidean")
    assert km.labels_.tolist() == np.argmin(D, 1).tolist()


def test_gfkm_on_the_triton_backend_equals_torch(seeded):
    X, first = blobs(seeded, n_per=15, d=3, k=4)
    X = X.astype(np.float32)
    args = dict(n_nearest=2, fuzzifier=1.8, init=X[first].astype(np.float64), max_iter=2, tol=0, device="cpu")
    want = FuzzyKMeans(4, centroid_update="counting_sort", **args).fit(X)
    for method in ("counting_sort", "atomic"):
        with use_backend("triton"):  # the fused top-k of densitas.neighbors, the atomic scatter, histogram, scan
            got = FuzzyKMeans(4, centroid_update=method, **args).fit(X)
        np.testing.assert_allclose(got.cluster_centers_, want.cluster_centers_, rtol=1e-5, atol=1e-5)
        assert got.labels_.tolist() == want.labels_.tolist()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("backend_name", ["torch", "triton"])
def test_gfkm_through_knn_tile_topk_equals_the_cpu_route(seeded, monkeypatch, backend_name, dtype):
    """The CUDA route (the M nearest from densitas.neighbors' knn_tile_topk, fused Triton kernel when forced)
    gives the CPU route's centroids."""
    import densitas.cluster.fuzzy as fz

    X, first = blobs(seeded, n_per=12, d=3, k=4)
    X = X.astype(dtype)
    args = dict(n_nearest=2, fuzzifier=1.8, init=X[first].astype(np.float64) + 0.05, max_iter=3, tol=0,
                device="cpu")
    want = FuzzyKMeans(4, **args).fit(X)
    monkeypatch.setattr(fz, "CPU_DENSE_SELECT", False)
    monkeypatch.setattr(fz, "FUSED", False)  # the knn_tile_topk route, not the fused pass (tests/cluster/test_fused.py)
    with use_backend(backend_name):
        got = FuzzyKMeans(4, **args).fit(X)
    np.testing.assert_allclose(got.cluster_centers_, want.cluster_centers_, rtol=1e-5, atol=1e-5)
    assert got.labels_.tolist() == want.labels_.tolist()
    # each squared distance the two routes compute in the data's precision (|x|² − 2x·c + |c|² against x − c)
    # carries a few roundings of |x|²: the objective, a sum of them, agrees to that, summed (float32,
    # DENSITAS_SEED=89241929: 133.27855 against 133.27710, 1.1e-5 relative, with distances ~3 and |x|² ~ 600)
    round_off = 4 * np.finfo(dtype).eps * float((X.astype(np.float64) ** 2).sum())
    np.testing.assert_allclose(got.objective_, want.objective_, rtol=1e-5, atol=round_off)


def test_empty_cluster_moves_to_the_farthest_point(seeded):
    X, first = blobs(seeded, n_per=20, d=2, k=2)
    C0 = np.r_[X[first], [[1e4, 1e4]]]  # the third centroid is nobody's nearest
    km = FuzzyKMeans(3, n_nearest=1, fuzzifier=2.0, init=C0, max_iter=1, tol=0, device="cpu").fit(X)
    dmin = cdist(X, C0[:2], "sqeuclidean").min(1)
    np.testing.assert_array_equal(km.cluster_centers_[2], X[np.argmax(dmin)])
    lab = cdist(X, C0[:2], "sqeuclidean").argmin(1)
    for j in range(2):
        np.testing.assert_allclose(km.cluster_centers_[j], X[lab == j].mean(0), rtol=1e-12,
                                   atol=1e-12 * np.abs(X).max())


# ------------------------------------------------------------------------ fuzzifier, init, stopping


def test_auto_fuzzifier_is_schwaemmle_jensen(seeded):
    X, _ = blobs(seeded, d=6)
    km = FuzzyKMeans(3, max_iter=2, random_state=0, device="cpu").fit(X)
    assert km.fuzzifier_ == pytest.approx(schwaemmle_jensen(X.shape[0], 6), rel=1e-15)
    assert FuzzyKMeans(3, fuzzifier=1.3, max_iter=2, random_state=0, device="cpu").fit(X).fuzzifier_ == 1.3


@pytest.mark.parametrize("init", ["k-means++", "random", "random-slices"])
def test_random_state_determinism(seeded, init):
    X, _ = blobs(seeded)
    a = FuzzyKMeans(4, init=init, fuzzifier=2.0, n_init=2, random_state=7, device="cpu").fit(X)
    b = FuzzyKMeans(4, init=init, fuzzifier=2.0, n_init=2, random_state=7, device="cpu").fit(X)
    np.testing.assert_array_equal(a.cluster_centers_, b.cluster_centers_)
    np.testing.assert_array_equal(a.labels_, b.labels_)
    np.testing.assert_array_equal(a.objective_, b.objective_)
    c = FuzzyKMeans(4, init=init, fuzzifier=2.0, max_iter=1, random_state=8, device="cpu").fit(X)
    d = FuzzyKMeans(4, init=init, fuzzifier=2.0, max_iter=1, random_state=9, device="cpu").fit(X)
    assert not np.array_equal(c.cluster_centers_, d.cluster_centers_)


def test_random_slices_takes_one_point_per_slice(seeded):
    X = np.arange(40.0)[:, None]  # row i holds i
    km = FuzzyKMeans(4, n_nearest=1, fuzzifier=2.0, init="random-slices", max_iter=1, random_state=3,
                     device="cpu")
    km._check_params()
    from densitas.cluster._data import TensorData

    C = km._init_centers(TensorData(torch.from_numpy(X), torch.device("cpu"), 1 << 20), 4,
                         np.random.RandomState(3))
    assert [int(c) // 10 for c in C[:, 0].tolist()] == [0, 1, 2, 3]


def test_tol_zero_runs_max_iter_and_tol_stops(seeded):
    X, _ = blobs(seeded)
    km = FuzzyKMeans(4, fuzzifier=2.0, max_iter=9, tol=0, random_state=0, device="cpu").fit(X)
    assert km.n_iter_ == 9 and km.objective_.shape == (9,)
    km2 = FuzzyKMeans(4, fuzzifier=2.0, max_iter=300, tol=1e-3, random_state=0, device="cpu").fit(X)
    assert km2.n_iter_ < 300
    again = FuzzyKMeans(4, fuzzifier=2.0, max_iter=1, tol=0, init=km2.cluster_centers_, device="cpu").fit(X)
    assert np.linalg.norm(again.cluster_centers_ - km2.cluster_centers_, axis=1).max() < 1e-2


# -------------------------------------------------------------------------------- out of core


@pytest.mark.parametrize("method", ["atomic", "sort_by_key", "dense", "counting_sort"])
def test_tiny_budget_gives_the_same_centroids(seeded, method):
    X, _ = blobs(seeded, n_per=50, d=3, k=4)
    args = dict(n_nearest=2, fuzzifier=1.7, max_iter=6, tol=0, random_state=4, centroid_update=method, device="cpu")
    big = FuzzyKMeans(4, **args).fit(X)
    tiny = FuzzyKMeans(4, memory_budget=12_000, **args).fit(X)  # about ten rows per chunk: 20 chunks a pass
    np.testing.assert_allclose(tiny.cluster_centers_, big.cluster_centers_, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(tiny.labels_, big.labels_)
    np.testing.assert_allclose(tiny.objective_, big.objective_, rtol=1e-12)
    np.testing.assert_allclose(tiny.predict_membership(X), big.predict_membership(X), rtol=1e-12)


def test_files_and_duckdb_equal_the_array(seeded, tmp_path):
    X, _ = blobs(seeded, n_per=30, d=3, k=3)
    df = pd.DataFrame(X, columns=["a", "b", "c"])
    args = dict(n_nearest=2, fuzzifier=2.0, max_iter=5, tol=0, random_state=2, device="cpu")
    want = FuzzyKMeans(3, **args).fit(df)
    df.to_parquet(tmp_path / "x.parquet", row_group_size=17)
    df.to_csv(tmp_path / "x.csv", index=False)
    np.save(tmp_path / "x.npy", X)
    con = duckdb.connect()
    con.execute("CREATE TABLE t AS SELECT * FROM df")
    for src in (tmp_path / "x.parquet", str(tmp_path / "x.csv"), tmp_path / "x.npy", con.table("t")):
        got = FuzzyKMeans(3, memory_budget=8000, **args).fit(src)
        np.testing.assert_allclose(got.cluster_centers_, want.cluster_centers_, rtol=1e-12, atol=1e-12)
        np.testing.assert_array_equal(got.labels_, want.labels_)
    assert list(FuzzyKMeans(3, **args).fit(tmp_path / "x.parquet").feature_names_in_) == ["a", "b", "c"]


def test_file_with_nan_or_text_raises(tmp_path):
    df = pd.DataFrame({"a": [1.0, 2.0, np.nan, 4.0], "b": [1.0, 2.0, 3.0, 4.0]})
    df.to_parquet(tmp_path / "nan.parquet")
    with pytest.raises(InputError):
        FuzzyKMeans(2, device="cpu").fit(tmp_path / "nan.parquet")
    df.assign(a=["x", "y", "z", "w"]).to_parquet(tmp_path / "text.parquet")
    with pytest.raises(InputError):
        FuzzyKMeans(2, device="cpu").fit(tmp_path / "text.parquet")


# ---------------------------------------------------------------------------- scikit-learn API


@pytest.mark.parametrize("est", [
    FuzzyKMeans(max_iter=30, device="cpu"),
    FuzzyKMeans(n_nearest=2, fuzzifier=1.5, init="random-slices", centroid_update="counting_sort", max_iter=40,
                memory_budget=20_000, device="cpu"),
], ids=["default", "slices-counting-tiny"])
def test_check_estimator(est):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # SkipTestWarning for checks that do not apply
        results = check_estimator(est, on_fail=None)
    failed = [(r["check_name"], str(r["exception"])[:200]) for r in results if r["status"] == "failed"]
    assert not failed
    assert sum(r["status"] == "passed" for r in results) >= 40


def test_prediction_methods_agree(seeded):
    X, _ = blobs(seeded, n_per=30)
    km = FuzzyKMeans(5, n_nearest=3, fuzzifier=1.8, random_state=0, device="cpu").fit(X)
    Y = seeded.normal(size=(23, 3)) * 8
    assert km.predict(X).tolist() == km.labels_.tolist()
    U = km.predict_membership(Y)
    np.testing.assert_allclose(U.sum(1), 1.0, rtol=1e-12)
    assert ((U > 0).sum(1) <= 3).all()
    idx, u = km.membership(Y)
    assert idx.shape == u.shape == (23, 3)
    np.testing.assert_allclose(np.take_along_axis(U, idx, 1), u, rtol=1e-12)
    D = cdist(Y, km.cluster_centers_)
    np.testing.assert_allclose(km.transform(Y), D, rtol=1e-9)
    assert (idx == np.argsort(D, 1, kind="stable")[:, :3]).all()  # nearest first
    np.testing.assert_allclose(u, direct_memberships(np.sort(D, 1)[:, :3] ** 2, km.fuzzifier_), rtol=1e-9)
    assert km.predict(Y).tolist() == np.argmin(D, 1).tolist() == U.argmax(1).tolist()
    assert km.score(X) == pytest.approx(-km.inertia_, rel=1e-12)
    assert km.fit_predict(X).tolist() == km.labels_.tolist()
    t = km.predict_membership(torch.from_numpy(Y))
    assert isinstance(t, torch.Tensor)
    np.testing.assert_allclose(t.numpy(), U, rtol=1e-12)
    assert km.get_feature_names_out().tolist() == [f"fuzzykmeans{j}" for j in range(5)]


def test_tensor_training_data(seeded):
    X, _ = blobs(seeded)
    a = FuzzyKMeans(4, fuzzifier=2.0, max_iter=5, random_state=0, device="cpu").fit(X)
    b = FuzzyKMeans(4, fuzzifier=2.0, max_iter=5, random_state=0, device="cpu").fit(torch.from_numpy(X))
    np.testing.assert_array_equal(a.cluster_centers_, b.cluster_centers_)
    assert isinstance(b.predict(torch.from_numpy(X)), torch.Tensor)


# ------------------------------------------------------------------------------------- errors


@pytest.mark.parametrize("params", [
    dict(n_clusters=0), dict(n_clusters=2.5), dict(n_nearest=0), dict(n_nearest=5, n_clusters=4),
    dict(fuzzifier=1.0), dict(fuzzifier=0.5), dict(fuzzifier=float("nan")), dict(fuzzifier="big"),
    dict(tol=-1.0), dict(max_iter=0), dict(n_init=0), dict(init="nope"), dict(init=np.zeros((3, 3))),
    dict(init=np.full((4, 2), np.nan)), dict(centroid_update="magic"), dict(memory_budget="lots"),
])
def test_bad_parameters_raise_input_error(params):
    X = np.random.default_rng(0).normal(size=(10, 2))
    with pytest.raises(InputError):
        FuzzyKMeans(**{"n_clusters": 4, **params}, device="cpu").fit(X)


def test_bad_data_raises_input_error():
    X = np.random.default_rng(0).normal(size=(10, 2))
    with pytest.raises(InputError):
        FuzzyKMeans(11, device="cpu").fit(X)  # k > n
    bad = X.copy()
    bad[3, 1] = np.nan
    with pytest.raises(InputError):
        FuzzyKMeans(2, device="cpu").fit(bad)
    bad[3, 1] = np.inf
    with pytest.raises(InputError):
        FuzzyKMeans(2, device="cpu").fit(torch.from_numpy(bad))
    km = FuzzyKMeans(2, device="cpu", random_state=0).fit(X)
    with pytest.raises(InputError):
        km.predict(bad)
    with pytest.raises(InputError):
        km.predict(X[:, :1])  # wrong number of features
