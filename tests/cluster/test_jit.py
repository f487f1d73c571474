"""The compiled q = 2 fuzzy c-means loop (``densitas.cluster._jit``) inside the CPU's classic pass: against the
float64 reference pass written by direct differences, with chunks it must hand to the general rule (zero
distances), beside the GEMM steps in a whole fit; and what happens without Numba or without a writable cache."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

import densitas.cluster._cpu as cpu
from densitas.cluster import FuzzyKMeans, _jit
from densitas.cluster import _torch as ref
from densitas.cluster._cpu import augmented_rows, classic_pass

pytest.importorskip("numba")  # in the package's dependencies; the pass falls back to the GEMM steps without it


@pytest.fixture
def counted(monkeypatch):
    """Counts the chunks the compiled kernel runs (a pass that silently took the GEMM steps would pass the
    equality tests)."""
    calls = []

    def kernel_for(k, d, m=None):
        kern = _jit.classic_kernel(k, d, m)
        assert kern is not None
        return lambda *args: (calls.append(args[1]), kern(*args))[1]

    monkeypatch.setattr(cpu, "classic_kernel", kernel_for)
    return calls


@pytest.mark.parametrize("workers", [1, 3])
@pytest.mark.parametrize("rows", [1, 7, 1000])
def test_kernel_pass_equals_the_float64_reference(seeded, counted, rows, workers):
    """Continuous rows, far from every centroid: every chunk is the kernel's, from one thread or three; 1e-12 of
    the reference."""
    n, d, k = 203, 4, 5
    X = torch.as_tensor(seeded.normal(size=(n, d)) * 3.0 + 1.0)
    C = torch.as_tensor(seeded.normal(size=(k, d)) * 2.0)
    shift = X.mean(0)
    s, J, lab = classic_pass(augmented_rows(X, shift, rows), C, shift, 2.0, rows=rows, sums=True, labels=False,
                             jit=True, workers=workers)
    assert sorted(counted) == list(range(0, n, rows)) and lab is None
    s_ref, J_ref, _ = ref.fused_pass(X, C, k, 2.0)
    torch.testing.assert_close(s, s_ref, rtol=1e-12, atol=1e-12 * float(X.abs().max()))
    assert J == pytest.approx(float(J_ref), rel=1e-12)


def test_chunks_with_a_zero_distance_go_to_the_general_rule(seeded, counted, monkeypatch):
    """Integer rows with centroids on rows 0 and 7 (three zero distances): the kernel runs every chunk, the two
    holding those rows are redone by the general rule (their sums overwritten), and the sums equal the reference;
    the kernel's labels are kept (row 0 ties between centroids 0 and 1: the lower index)."""
    n, d, k = 61, 4, 5
    X = torch.as_tensor(seeded.integers(-6, 7, size=(n, d)), dtype=torch.float64)
    C = torch.as_tensor(seeded.integers(7, 10, size=(k, d)), dtype=torch.float64)
    C[0] = C[1] = X[0]
    if torch.equal(X[7], X[0]):
        X[7, 0] += 1.0
    C[3] = X[7]
    shift = torch.zeros(d, dtype=torch.float64)
    redone = []
    general = cpu.chunk_general
    monkeypatch.setattr(cpu, "chunk_general",
                        lambda Ca, xc, q, m=None: (redone.append(xc[0].clone()), general(Ca, xc, q, m))[1])
    s, J, lab = classic_pass(augmented_rows(X, shift, 7), C, shift, 2.0, rows=7, sums=True, labels=True, jit=True,
                             workers=2)
    assert sorted(counted) == list(range(0, n, 7))
    assert [r.tolist() for r in redone] == [X[:7, 0].tolist(), X[7:14, 0].tolist()]
    s_ref, J_ref, lab_ref = ref.fused_pass(X, C, k, 2.0, labels=True)
    np.testing.assert_array_equal(lab, lab_ref.numpy())  # exact integer distances: ties to the lower index
    assert lab[0] == 0 and lab[7] == 3
    torch.testing.assert_close(s, s_ref, rtol=1e-12, atol=1e-12 * float(X.abs().max()))
    assert J == pytest.approx(float(J_ref), rel=1e-12)


def test_the_kernel_reports_what_it_cannot_take():
    """A distance at the floor or NaN: ok is False. Otherwise the objective is Σ 1 / Σ_j (1/D_j)."""
    kern = _jit.classic_kernel(2, 1)
    C = np.array([[0.0], [4.0]])
    sums, lab = np.empty((2, 2)), np.full(3, -1, dtype=np.int64)
    J, ok = kern(np.array([[1.0, 3.0]]), 0, 2, C, 1e-300, sums, lab)
    assert ok and J == pytest.approx(2.0 / (1.0 + 1.0 / 9.0))
    u = np.array([[0.9, 0.1], [0.1, 0.9]])  # rows at 1 and 3: memberships 9/10 and 1/10
    np.testing.assert_allclose(sums, np.c_[(u ** 2) @ np.array([1.0, 3.0]), (u ** 2).sum(1)], rtol=1e-14)
    assert lab.tolist() == [0, 1, -1]  # written for the rows s:e only, from labels[0]
    assert not kern(np.array([[0.0, 3.0]]), 0, 2, C, 1e-300, sums, lab)[1]  # a zero distance
    assert not kern(np.array([[1.0, 3.0]]), 0, 2, C, 1.0, sums, lab)[1]  # at the floor
    assert not kern(np.array([[np.nan, 3.0]]), 0, 2, C, 1e-300, sums, lab)[1]
    assert kern(np.array([[np.nan, 1.0, 3.0]]), 1, 3, C, 1e-300, sums, lab)[1]  # only the rows s:e are read
    kern(np.array([[2.0, 2.0 + 1e-9]]), 0, 2, C, 1e-300, sums, lab)
    assert lab[:2].tolist() == [0, 1]  # a tie (2 is 2 from both) goes to the lower index


@pytest.mark.parametrize(("k", "m", "iters"), [(4, 4, 30), (5, 2, 20)])
def test_a_fit_with_the_kernel_equals_one_without(seeded, counted, monkeypatch, k, m, iters):
    """Classic (m = k: beside the GEMM steps) and GFKM (m < k: beside the general path): the same centroids,
    objectives and labels; the kernel runs in the first fit only."""
    import densitas.cluster.fuzzy as fz

    X = np.r_[seeded.normal(size=(700, 3)), seeded.normal(size=(500, 3)) + 4.0]
    monkeypatch.setattr(_jit, "MIN_ROWS", 0)
    fits = {}
    for jit in (True, False):
        monkeypatch.setattr(fz, "CPU_CLASSIC_JIT", jit)
        counted.clear()
        fits[jit] = FuzzyKMeans(k, n_nearest=m, fuzzifier=2.0, max_iter=iters, tol=0, random_state=3).fit(X)
        assert bool(counted) == jit  # one chunk a pass with the kernel, none without
    np.testing.assert_allclose(fits[True].cluster_centers_, fits[False].cluster_centers_, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(fits[True].objective_, fits[False].objective_, rtol=1e-10)
    np.testing.assert_array_equal(fits[True].labels_, fits[False].labels_)


def test_a_numba_failure_falls_back_to_the_gemm_steps(seeded, monkeypatch):
    """A compile or cache error inside Numba is not the user's: the kernel is None and the fit runs the GEMM
    steps (with the same centroids)."""
    import numba

    import densitas.cluster.fuzzy as fz

    def broken(*args, **kwargs):
        raise RuntimeError("cannot cache function 'kernel': no locator available")

    X = seeded.normal(size=(400, 2))
    monkeypatch.setattr(_jit, "MIN_ROWS", 0)
    want = FuzzyKMeans(3, n_nearest=3, fuzzifier=2.0, max_iter=5, tol=0, random_state=1).fit(X)
    monkeypatch.setattr(numba, "njit", broken)
    _jit._kernel.cache_clear()
    try:
        assert _jit.classic_kernel(3, 2) is None
        got = FuzzyKMeans(3, n_nearest=3, fuzzifier=2.0, max_iter=5, tol=0, random_state=1).fit(X)
    finally:
        _jit._kernel.cache_clear()
    assert fz.CPU_CLASSIC_JIT
    np.testing.assert_allclose(got.cluster_centers_, want.cluster_centers_, rtol=1e-10, atol=1e-12)


def test_without_numba_the_gemm_steps_run(seeded, monkeypatch):
    monkeypatch.setitem(sys.modules, "numba", None)  # import numba raises ImportError
    _jit._kernel.cache_clear()
    try:
        assert _jit.classic_kernel(3, 2) is None
        X = torch.as_tensor(seeded.normal(size=(50, 2)))
        C = torch.as_tensor(seeded.normal(size=(3, 2))) + 5.0
        shift = torch.zeros(2, dtype=torch.float64)
        s, J, _ = classic_pass(augmented_rows(X, shift, 16), C, shift, 2.0, rows=16, sums=True, labels=False,
                               jit=True)
        s_ref, J_ref, _ = ref.fused_pass(X, C, 3, 2.0)
        torch.testing.assert_close(s, s_ref, rtol=1e-12, atol=1e-12)
        assert J == pytest.approx(float(J_ref), rel=1e-12)
    finally:
        _jit._kernel.cache_clear()


def test_large_shapes_take_the_gemm_steps():
    assert _jit.classic_kernel(_jit.MAX_SUMS, 1) is None  # k(d + 1) = 2 MAX_SUMS


def test_the_source_is_cached_on_disk_and_compiled_in_memory_when_it_cannot_be(tmp_path, monkeypatch):
    """The generated module lands in DENSITAS_CACHE_DIR/jit and is imported from there; with a cache directory
    that cannot be made (a file in its place) the kernel is compiled in memory and gives the same answers."""
    names = [m for m in sys.modules if m.startswith("densitas_fcm_k3_d2_")]
    for m in names:
        monkeypatch.delitem(sys.modules, m)
    Xt = np.array([[0.5, 2.0, 7.0], [1.0, -1.0, 3.0]])
    C = np.array([[0.0, 0.0], [3.0, 3.0], [6.0, 2.0]])
    answers = []
    for where in ("dir", "file"):
        _jit._kernel.cache_clear()
        target = tmp_path / where
        if where == "file":
            target.write_text("not a directory")
        monkeypatch.setenv("DENSITAS_CACHE_DIR", str(target))
        for m in [m for m in sys.modules if m.startswith("densitas_fcm_k3_d2_")]:
            monkeypatch.delitem(sys.modules, m)
        sums = np.empty((3, 3))
        J, ok = _jit.classic_kernel(3, 2)(Xt, 0, 3, C, 1e-300, sums, np.empty(3, dtype=np.int64))
        answers.append((J, ok, sums.copy()))
        if where == "dir":
            (written,) = (target / "jit").glob("densitas_fcm_k3_d2_*.py")
            assert written.read_text() == _jit.kernel_source(3, 2)
    _jit._kernel.cache_clear()
    assert answers[0][1] and answers[1][1] and answers[0][0] == answers[1][0]
    np.testing.assert_array_equal(answers[0][2], answers[1][2])


@pytest.mark.parametrize(("k", "m"), [(5, 2), (4, 1), (6, 3)])
def test_gfkm_kernel_pass_equals_the_float64_reference(seeded, counted, k, m):
    """Generalized Fuzzy k-Means (the m nearest of k) in the kernel: sums, objective and labels of the float64
    reference (a stable sort for the m nearest), from two threads."""
    X = torch.as_tensor(seeded.normal(size=(997, 3)) * 3.0)
    C = torch.as_tensor(seeded.normal(size=(k, 3)) * 2.0)
    shift = X.mean(0)
    s, J, lab = classic_pass(augmented_rows(X, shift, 64), C, shift, 2.0, rows=64, sums=True, labels=True, jit=True,
                             workers=2, nearest=m)
    assert len(counted) == 16
    s_ref, J_ref, lab_ref = ref.fused_pass(X, C, m, 2.0, labels=True)
    torch.testing.assert_close(s, s_ref, rtol=1e-12, atol=1e-12 * float(X.abs().max()))
    assert J == pytest.approx(float(J_ref), rel=1e-12)
    np.testing.assert_array_equal(lab, lab_ref.numpy())


def test_gfkm_ties_and_zero_distances(seeded, counted):
    """Integer rows: exact ties (centroids 0 and 1 equal: the lower index is among the m nearest) and a zero
    distance (centroid 2 on row 5: its chunk goes to the general rule over the m nearest)."""
    X = torch.as_tensor(seeded.integers(-3, 4, size=(500, 3)), dtype=torch.float64)
    C = torch.as_tensor(seeded.integers(-3, 4, size=(5, 3)), dtype=torch.float64)
    C[1] = C[0]
    C[2] = X[5]
    shift = torch.zeros(3, dtype=torch.float64)
    s, J, lab = classic_pass(augmented_rows(X, shift, 16), C, shift, 2.0, rows=16, sums=True, labels=True, jit=True,
                             workers=2, nearest=2)
    s_ref, J_ref, lab_ref = ref.fused_pass(X, C, 2, 2.0, labels=True)
    torch.testing.assert_close(s, s_ref, rtol=1e-12, atol=1e-12 * float(X.abs().max()))
    assert J == pytest.approx(float(J_ref), rel=1e-12)
    np.testing.assert_array_equal(lab, lab_ref.numpy())
