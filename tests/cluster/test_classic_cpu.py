"""The CPU's classic fuzzy c-means pass (``densitas.cluster._cpu``: two GEMMs per chunk over the cached
[x, 1, ‖x − s‖²]ᵀ, the chunks shared among threads) against the float64 reference pass written by direct
differences, on integer data where every distance of the GEMM is exact: zero distances, two centroids on the same
point, ties; the same result whatever the thread count; PyTorch's thread settings left as they were."""

from __future__ import annotations

import multiprocessing
import os
import threading

import numpy as np
import pytest
import torch

from densitas.cluster import _torch as ref
from densitas.cluster._cpu import augmented_rows, classic_pass


def _integer_case(rng, n=61, d=4, k=5):
    """Small integer rows and centroids: with the shift 0 every product and sum of the distance GEMM is an exact
    integer in float64, so the pass sees the same distances as the reference. Centroids 0 and 1 are both row 0
    (two zero distances: 1/2 each), centroid 3 is row 7 (one zero distance); integer data has exact ties."""
    X = torch.as_tensor(rng.integers(-6, 7, size=(n, d)), dtype=torch.float64)
    C = torch.as_tensor(rng.integers(7, 10, size=(k, d)), dtype=torch.float64)  # outside the rows' range
    C[0] = C[1] = X[0]
    if torch.equal(X[7], X[0]):  # centroid 3 must not be a third zero distance of row 0
        X[7, 0] += 1.0
    C[3] = X[7]
    return X, C


@pytest.mark.parametrize("q", [2.0, 1.5, 3.0])
@pytest.mark.parametrize("rows", [1, 7, 1000])
def test_classic_pass_equals_the_float64_reference(seeded, q, rows):
    """A chunk with a zero distance takes the general rule (zero distances exactly, the log domain), which gives
    the reference's 1/z. The only rounding left is in the reciprocals, powers and sums: 1e-12."""
    X, C = _integer_case(seeded)
    d = X.shape[1]
    shift = torch.zeros(d, dtype=torch.float64)
    s, J, lab = classic_pass(augmented_rows(X, shift, rows), C, shift, q, rows=rows, sums=True, labels=True)
    s_ref, J_ref, lab_ref = ref.fused_pass(X, C, C.shape[0], q, labels=True)
    torch.testing.assert_close(s, s_ref, rtol=1e-12, atol=1e-12 * float(X.abs().max()))
    assert J == pytest.approx(float(J_ref), rel=1e-12)
    np.testing.assert_array_equal(lab, lab_ref.numpy())
    assert lab[0] == 0  # row 0 is on centroids 0 and 1: the tie goes to the lower index
    # row 0 alone in a pass: half its weight (1/2)^q to each of centroids 0 and 1, nothing to the others
    one, _, _ = classic_pass(augmented_rows(X[:1], shift, rows), C, shift, q, rows=rows, sums=True, labels=False)
    assert one[:, d].tolist() == [0.5 ** q, 0.5 ** q, 0.0, 0.0, 0.0]


def test_classic_pass_without_sums():
    X = torch.tensor([[0.0, 0.0], [1.0, 0.0], [4.0, 4.0], [5.0, 4.0]], dtype=torch.float64)
    C = torch.tensor([[0.0, 0.0], [0.0, 0.0], [4.0, 4.0]], dtype=torch.float64)
    shift = torch.zeros(2, dtype=torch.float64)
    s, J, lab = classic_pass(augmented_rows(X, shift, 2), C, shift, 2.0, rows=2, sums=False, labels=True)
    _s, J_ref, lab_ref = ref.fused_pass(X, C, 3, 2.0, sums=False, labels=True)
    assert s is None and lab.tolist() == lab_ref.tolist() == [0, 0, 2, 2]
    assert J == pytest.approx(float(J_ref), rel=1e-12)


@pytest.mark.parametrize("q", [2.0, 1.7])
def test_only_chunks_with_a_zero_distance_take_the_general_rule(seeded, monkeypatch, q):
    """Integer data (exact distances): the two chunks holding rows 0 and 7 (zero distances) are redone by the
    general rule, the seven others keep the fast rule's weights, and the sums equal the reference's."""
    import densitas.cluster._cpu as cpu

    X, C = _integer_case(seeded)
    shift = torch.zeros(X.shape[1], dtype=torch.float64)
    redone = []
    general = cpu.chunk_general
    monkeypatch.setattr(cpu, "chunk_general",
                        lambda Ca, xc, q, m=None: (redone.append(xc[0].clone()), general(Ca, xc, q, m))[1])
    s, J, _ = classic_pass(augmented_rows(X, shift, 7), C, shift, q, rows=7, sums=True, labels=False)
    assert [r.tolist() for r in redone] == [X[:7, 0].tolist(), X[7:14, 0].tolist()]
    s_ref, J_ref, _ = ref.fused_pass(X, C, C.shape[0], q)
    torch.testing.assert_close(s, s_ref, rtol=1e-12, atol=1e-12 * float(X.abs().max()))
    assert J == pytest.approx(float(J_ref), rel=1e-12)


def test_classic_pass_runs_the_blas_on_one_thread_and_restores_it():
    """The sums GEMM runs in the pass's own threads with NumPy's BLAS on one thread; the caller's count is put
    back afterwards."""
    from threadpoolctl import threadpool_info, threadpool_limits

    X = torch.as_tensor(np.arange(40.0).reshape(20, 2))
    C = X[[0, 10]].clone() + 0.5
    shift = C.mean(0)
    with threadpool_limits(limits=2, user_api="blas"):
        seen = []
        import densitas.cluster._cpu as cpu

        real = cpu.chunk_weights

        def spy(*args):
            seen.extend(i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas")
            return real(*args)

        cpu.chunk_weights = spy
        try:
            classic_pass(augmented_rows(X, shift, 8), C, shift, 2.0, rows=8, sums=True, labels=False)
        finally:
            cpu.chunk_weights = real
        assert seen and set(seen) == {1}
        assert {i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"} == {2}


def _threads_of_a_new_thread() -> int:
    seen = []
    t = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))
    t.start()
    t.join()
    return seen[0]


@pytest.mark.parametrize("q", [2.0, 1.7])
def test_classic_pass_is_the_same_for_any_thread_count(seeded, q):
    """Each chunk's sums are kept apart and added in chunk order: 1, 2 or 3 threads give the same bits. The
    calling thread's PyTorch setting is kept, and so is the default a thread started afterwards gets."""
    X = torch.as_tensor(seeded.normal(size=(300, 3)) * 3.0)
    C = X[[4, 50, 200]].clone()  # zero distances: the log-domain rule in some chunks for q = 1.7
    shift = C.mean(0)
    Xa = augmented_rows(X, shift, 16)
    before = torch.get_num_threads()
    results = []
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            results.append(classic_pass(Xa, C, shift, q, rows=16, sums=True, labels=True))
            assert torch.get_num_threads() == threads
            assert _threads_of_a_new_thread() == threads
    finally:
        torch.set_num_threads(before)
    for s, J, lab in results[1:]:
        assert torch.equal(s, results[0][0]) and J == results[0][1]
        np.testing.assert_array_equal(lab, results[0][2])


def _pass_in_child(Xa, C, shift):
    torch.set_num_threads(2)
    return classic_pass(Xa, C, shift, 2.0, rows=16, sums=True, labels=False)[0]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_classic_pass_in_a_forked_child(seeded):
    """A child forked after a threaded pass runs its own threaded pass (no state of the parent's threads is
    needed there) and gets the parent's result."""
    X = torch.as_tensor(seeded.normal(size=(200, 3)))
    C = X[:3].clone()
    shift = C.mean(0)
    Xa = augmented_rows(X, shift, 16)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        want = classic_pass(Xa, C, shift, 2.0, rows=16, sums=True, labels=False)[0]
    finally:
        torch.set_num_threads(before)
    with multiprocessing.get_context("fork").Pool(1) as pool:
        got = pool.apply_async(_pass_in_child, (Xa, C, shift)).get(timeout=60)
    assert torch.equal(got, want)


def test_a_classic_fit_runs_torch_single_threaded_between_passes_and_restores_it(seeded, monkeypatch):
    """The iterations run with one PyTorch thread (no OpenMP threads spinning on the pass's cores); the pass still
    gets as many threads as PyTorch had, and the setting is put back after the fit."""
    import densitas.cluster.fuzzy as fz
    from densitas.cluster import FuzzyKMeans

    seen = []
    real = fz.classic_pass

    def spy(*args, **kwargs):
        seen.append((torch.get_num_threads(), kwargs["workers"]))
        return real(*args, **kwargs)

    monkeypatch.setattr(fz, "classic_pass", spy)
    saved = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        FuzzyKMeans(3, n_nearest=3, fuzzifier=2.0, max_iter=4, tol=0, random_state=0).fit(seeded.normal(size=(300, 2)))
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(saved)
    assert seen and set(seen) == {(1, 3)}


def test_only_the_cached_classic_path_runs_single_threaded(seeded, monkeypatch):
    """float32 data (no cache [x, 1, ‖x − s‖²]ᵀ) keeps PyTorch's threads for its passes; float64 in memory takes
    one thread around its cache and passes."""
    import contextlib

    import densitas.cluster.fuzzy as fz
    from densitas.cluster import FuzzyKMeans

    entered = []
    real = fz.single_threaded

    @contextlib.contextmanager
    def spy():
        entered.append(True)
        with real() as n:
            yield n

    monkeypatch.setattr(fz, "single_threaded", spy)
    X = seeded.normal(size=(300, 2))
    FuzzyKMeans(3, n_nearest=3, fuzzifier=2.0, max_iter=2, random_state=0).fit(X.astype(np.float32))
    assert entered == []
    FuzzyKMeans(3, n_nearest=3, fuzzifier=2.0, max_iter=2, random_state=0).fit(X)
    assert entered == [True]


def test_overlapping_fits_put_the_thread_count_back(seeded):
    """Fits in several Python threads at once share one setting: the last to finish restores the count."""
    from densitas.cluster import FuzzyKMeans

    X = seeded.normal(size=(3000, 3))
    saved = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        errors = []

        def fit(it):
            try:
                FuzzyKMeans(4, n_nearest=4, fuzzifier=2.0, max_iter=it, tol=0, random_state=it).fit(X)
            except BaseException as err:  # re-raised below
                errors.append(err)

        threads = [threading.Thread(target=fit, args=(it,)) for it in (5, 40, 15, 60)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors and torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(saved)
