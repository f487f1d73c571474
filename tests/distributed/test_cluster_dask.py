"""FuzzyKMeans on Dask arrays and DataFrames: the centroids, iterations, objective and labels of the
single-machine fit of the same data, for every centroid update and initialisation, on a two-process LocalCluster
and on the local scheduler."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from densitas.cluster import FuzzyKMeans
from densitas.exceptions import DensitasError

da = pytest.importorskip("dask.array")
dd = pytest.importorskip("dask.dataframe")


def blobs(rng, n=900, d=3):
    centres = rng.normal(size=(4, d)) * 5
    return centres[rng.integers(0, 4, size=n)] + rng.normal(size=(n, d))


def assert_same_fit(a: FuzzyKMeans, b: FuzzyKMeans, objective_rtol: float = 1e-9) -> None:
    """float64 data: the objective to 1e-9; float32 data (distances in float32, summed per block): 1e-6."""
    assert a.n_iter_ == b.n_iter_
    np.testing.assert_allclose(b.cluster_centers_, a.cluster_centers_, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(b.objective_, a.objective_, rtol=objective_rtol)
    np.testing.assert_allclose(b.inertia_, a.inertia_, rtol=objective_rtol)
    np.testing.assert_array_equal(np.asarray(b.labels_), a.labels_)


@pytest.mark.parametrize(("options", "init"), [
    ({"n_clusters": 4, "n_nearest": 2, "centroid_update": "auto"}, "k-means++"),
    ({"n_clusters": 4, "n_nearest": 4, "centroid_update": "dense"}, "random"),  # classic fuzzy c-means
    ({"n_clusters": 5, "n_nearest": 2, "centroid_update": "atomic"}, "random-slices"),
    ({"n_clusters": 5, "n_nearest": 3, "centroid_update": "counting_sort"}, "k-means++"),
    ({"n_clusters": 4, "n_nearest": 1, "centroid_update": "sort_by_key"}, "k-means++"),  # k-means
])
def test_fit_equals_single_machine(rng, scheduler, options, init):
    X = blobs(rng)
    seed = int(rng.integers(1 << 30))
    kw = {"fuzzifier": 2.0, "init": init, "max_iter": 12, "tol": 0.0, "device": "cpu", "random_state": seed,
          **options}
    one = FuzzyKMeans(**kw).fit(X)
    many = FuzzyKMeans(**kw).fit(da.from_array(X, chunks=((300, 1, 299, 300), 3)))
    assert many.centroid_update_ == one.centroid_update_
    labels = many.labels_
    assert isinstance(labels, da.Array)
    assert_same_fit(one, many)
    np.testing.assert_array_equal(labels.compute(), one.labels_)


def test_fit_dataframe_float32_tolerance_and_n_init(rng, client):
    X = blobs(rng, n=600).astype(np.float32)
    frame = pd.DataFrame(X, columns=["u", "v", "w"])
    kw = {"n_clusters": 3, "fuzzifier": 1.7, "n_init": 2, "tol": 1e-4, "device": "cpu",
          "random_state": int(rng.integers(1 << 30))}
    one = FuzzyKMeans(**kw).fit(frame)
    many = FuzzyKMeans(**kw).fit(dd.from_pandas(frame, npartitions=3))
    assert list(many.feature_names_in_) == ["u", "v", "w"]
    # the same run of the two: the same iterations from the same start (two inits can end at the same centroids in
    # as many iterations from different starts: then their first objectives differ)
    same_run = (one.n_iter_ == many.n_iter_ and np.allclose(many.cluster_centers_, one.cluster_centers_, rtol=1e-3,
                                                            atol=1e-4)
                and np.isclose(many.objective_[0], one.objective_[0], rtol=1e-3))
    if same_run:
        assert_same_fit(one, many, objective_rtol=1e-6)
    else:  # both inits reached the same minimum (possibly in as many iterations, with the clusters in another
        # order), and float32 rounding of the per-block sums picked the other run
        np.testing.assert_allclose(many.inertia_, one.inertia_, rtol=1e-5)
        order = lambda C: C[np.lexsort(C.T[::-1])]  # the same centroids, in either run's order
        np.testing.assert_allclose(order(many.cluster_centers_), order(one.cluster_centers_), rtol=1e-3, atol=1e-4)


def test_empty_cluster_is_relocated_like_single_machine(rng, client):
    X = blobs(rng, n=400, d=2)
    init = np.array([[0.0, 0.0], [1.0, 1.0], [1e4, 1e4]])  # the far centroid has no point among its nearest
    kw = {"n_clusters": 3, "n_nearest": 1, "init": init, "fuzzifier": 2.0, "max_iter": 5, "tol": 0.0,
          "device": "cpu"}
    one = FuzzyKMeans(**kw).fit(X)
    many = FuzzyKMeans(**kw).fit(da.from_array(X, chunks=90))
    assert np.abs(one.cluster_centers_).max() < 1e3  # it was moved onto the data
    # per-block sums in another order, through a relocation: the inertia to 1e-8 (DENSITAS_SEED=799448425: 1.2e-9)
    assert_same_fit(one, many, objective_rtol=1e-8)


def test_predictions_on_dask_queries(rng, scheduler):
    X = blobs(rng, n=300)
    km = FuzzyKMeans(3, fuzzifier=2.0, device="cpu", random_state=0, max_iter=5).fit(X)
    Xd = da.from_array(X, chunks=77)
    np.testing.assert_array_equal(km.predict(Xd).compute(), km.predict(X))
    np.testing.assert_allclose(km.transform(Xd).compute(), km.transform(X), rtol=1e-12)
    np.testing.assert_allclose(km.predict_membership(Xd).compute(), km.predict_membership(X), rtol=1e-12)
    idx, u = km.membership(Xd)
    ref_idx, ref_u = km.membership(X)
    np.testing.assert_array_equal(idx.compute(), ref_idx)
    np.testing.assert_allclose(u.compute(), ref_u, rtol=1e-12)
    assert km.score(Xd) == pytest.approx(km.score(X), rel=1e-12)


def test_errors_name_the_problem(rng, client):
    X = blobs(rng, n=100)
    X[57, 1] = np.nan
    with pytest.raises(DensitasError):  # raised in a worker's task, re-raised on the client
        FuzzyKMeans(2, fuzzifier=2.0, device="cpu").fit(da.from_array(X, chunks=25))
    with pytest.raises(DensitasError):
        FuzzyKMeans(200, device="cpu").fit(da.from_array(blobs(rng, n=100), chunks=25))
    with pytest.raises(DensitasError):
        FuzzyKMeans(2, centroid_update="bogus", device="cpu").fit(da.from_array(blobs(rng, n=100), chunks=25))


@pytest.fixture
def loop_calls(monkeypatch):
    """Counts the runs of the workers' loop (the client side of :class:`densitas.cluster.dask._WorkerLoop`)."""
    from densitas.cluster import dask as cdask

    calls: list[int] = []
    run = cdask._WorkerLoop.__call__

    def counted(self, C, shift, max_iter):
        calls.append(max_iter)
        return run(self, C, shift, max_iter)

    monkeypatch.setattr(cdask._WorkerLoop, "__call__", counted)
    return calls


@pytest.mark.parametrize("options", [{"n_clusters": 4, "n_nearest": 2, "centroid_update": "auto"},
                                     {"n_clusters": 3, "n_nearest": 3, "centroid_update": "sort_by_key"}])
def test_persisted_data_is_fitted_inside_the_workers(rng, client, loop_calls, options):
    """Blocks in cluster memory: the updates run in one task per worker joined by an all-reduce; the result is
    the single-machine fit's (iterations, centroids, objectives, labels)."""
    X = blobs(rng, n=1200)
    kw = {**options, "fuzzifier": 2.0, "tol": 1e-7, "device": "cpu", "random_state": int(rng.integers(1 << 30))}
    one = FuzzyKMeans(**kw).fit(X)
    many = FuzzyKMeans(**kw).fit(da.from_array(X, chunks=250).persist())
    assert loop_calls == [kw.get("max_iter", 300)]  # one run of the loop did every update
    assert_same_fit(one, many)


def test_workers_loop_hands_an_empty_cluster_to_the_client(rng, client, loop_calls):
    """An update that leaves a cluster empty stops the workers' loop; the client relocates the cluster (as the
    single machine does) and the loop goes on from there."""
    X = blobs(rng, n=400, d=2)
    init = np.array([[0.0, 0.0], [1.0, 1.0], [1e4, 1e4]])
    kw = {"n_clusters": 3, "n_nearest": 1, "init": init, "fuzzifier": 2.0, "max_iter": 5, "tol": 0.0,
          "device": "cpu"}
    one = FuzzyKMeans(**kw).fit(X)
    many = FuzzyKMeans(**kw).fit(da.from_array(X, chunks=90).persist())
    assert loop_calls[:2] == [5, 4]  # stopped before the first update; went on after the relocation
    assert_same_fit(one, many, objective_rtol=1e-8)  # as test_empty_cluster_is_relocated_like_single_machine


def test_lazy_data_or_a_callback_keep_the_map_reduce(rng, client, loop_calls):
    X = blobs(rng, n=300)
    kw = {"n_clusters": 3, "fuzzifier": 2.0, "device": "cpu", "random_state": 0, "max_iter": 4, "tol": 0.0}
    FuzzyKMeans(**kw).fit(da.from_array(X, chunks=100))  # blocks computed per task: nothing to loop over
    from densitas.cluster.dask import fit_dask

    seen = []
    fit_dask(FuzzyKMeans(**kw), da.from_array(X, chunks=100).persist(), callback=lambda *a: seen.append(a))
    assert loop_calls == [] and len(seen) == 4


def test_workers_loop_reports_a_bad_block_without_hanging(rng, client, loop_calls):
    """A block that fails its check on one worker stops every worker's loop (they agree before the first
    all-reduce of sums), and the client gets that worker's error, naming the row."""
    from densitas.exceptions import InputError

    X = blobs(rng, n=200)
    X[157, 2] = np.nan  # in the last block: the worker holding the first blocks prepares fine
    init = X[:2].copy()
    Xd = da.from_array(X, chunks=50).persist()
    from distributed import futures_of, wait

    from densitas._collective import placement

    wait(Xd)
    client.rebalance(futures_of(Xd))
    assert len(placement(Xd, list(Xd.to_delayed(optimize_graph=False).ravel())).workers) == 2
    with pytest.raises(InputError) as err:
        FuzzyKMeans(2, init=init, fuzzifier=2.0, device="cpu", max_iter=3).fit(Xd)
    assert "157" in str(err.value)
    assert len(loop_calls) == 1
    for worker in client.scheduler_info()["workers"]:  # no worker is left waiting in an all-reduce
        assert client.submit(int, 1, workers=[worker], pure=False).result(timeout=30) == 1


def test_a_group_that_cannot_form_falls_back_to_the_map_reduce(rng, client, monkeypatch):
    """When the workers' tasks cannot all join (another such run holds a worker), the fit drives the updates
    from the client instead, with the same result."""
    from densitas import _collective
    from densitas._collective import GroupUnavailableError

    def unavailable(*args, **kwargs):
        raise GroupUnavailableError("Task 1 of 2 could not join the group.")

    monkeypatch.setattr(_collective, "run_on_workers", unavailable)
    X = blobs(rng, n=600)
    kw = {"n_clusters": 3, "fuzzifier": 2.0, "tol": 1e-7, "device": "cpu", "random_state": 1}
    assert_same_fit(FuzzyKMeans(**kw).fit(X), FuzzyKMeans(**kw).fit(da.from_array(X, chunks=150).persist()))
