"""The pair-distance histogram (LSCV_h search) and the LSCV(H) gradient kernel, against float64 brute force."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from densitas._backend.dispatch import use_backend
from densitas.kde import bandwidth, pairhist
from densitas.kde import selectors as sel
from densitas.kde.pairsum import gauss_grad_sums


def _pairs(x: np.ndarray, w: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    i, j = np.triu_indices(x.shape[0], 1)
    y = ((x[i] - x[j]) ** 2).sum(1)
    return y, (np.ones_like(y) if w is None else w[i] * w[j])


@pytest.mark.parametrize("weighted", [False, True])
def test_histogram_sums_within_their_bound(backend, rng, weighted):
    n = 120 if backend == "torch" else 40
    x = rng.normal(size=(n, 3)) * np.array([1.0, 0.1, 3.0])
    x[7] = x[3]  # a duplicate: Y = 0 lands in bin 0
    w = rng.uniform(0.5, 3.0, n) if weighted else None
    y, wt = _pairs(x, w)
    xc = x - x.mean(0)
    hist = pairhist.pair_histogram(torch.from_numpy(x), None if w is None else torch.from_numpy(w),
                                   y_floor=1e-6, y_hi=4.0 * float((xc**2).sum(1).max()) * 1.001)
    a = np.array([1e-3, 0.05, 0.5, 5.0, 50.0])
    exact = (wt[None, :] * np.exp(-a[:, None] * y[None, :])).sum(1)
    s, bound = (t.numpy() for t in hist.sums(torch.from_numpy(a)))
    # the Triton path forms Y = ‖z_i‖² + ‖z_j‖² − 2 z_i·z_j in float32 (centred z): |ΔY| ≲ 4 eps32 (‖z_i‖² + ‖z_j‖²),
    # so each term moves by up to a·|ΔY|·e^{−aY} on top of the bounded truncation error (3e-5 of the sum, the
    # tolerance before, failed at a = 50 on ~20% of seeds: a·ΔY is not small there)
    if backend == "torch":
        slack = 1e-12 * exact
    else:
        i, j = np.triu_indices(n, 1)
        nrm = (xc**2).sum(1)
        reach = 4.0 * np.finfo(np.float32).eps * (nrm[i] + nrm[j])
        slack = (wt[None, :] * np.exp(-a[:, None] * y[None, :]) * a[:, None] * reach[None, :]).sum(1)
        slack += 1e-6 * exact  # the moments are float32 sums per program (~10³ terms a bin)
    assert np.all(np.abs(s - exact) <= bound + slack), (s, exact, bound, slack)
    # the bound is useful, not vacuous: ~1e-8 of the sum at 128 bins per octave
    assert np.all(bound <= 1e-6 * exact)
    assert float(hist.moments[:, 0].sum()) == pytest.approx(wt.sum(), rel=1e-6)


def test_histogram_bound_is_tight_enough_to_detect_coarse_bins(rng):
    """At 2 bins per octave the truncation error is large, and the bound still covers it (and grows with it)."""
    x = rng.normal(size=(200, 2))
    y, _ = _pairs(x, None)
    hist = pairhist.pair_histogram(torch.from_numpy(x), None, y_floor=1e-6, y_hi=4.0 * float((x**2).sum(1).max()) * 2,
                                   bins_per_octave=2)
    a = np.array([0.5, 2.0])
    exact = np.exp(-a[:, None] * y[None, :]).sum(1)
    s, bound = (t.numpy() for t in hist.sums(torch.from_numpy(a)))
    err = np.abs(s - exact)
    assert np.all(err <= bound)
    assert np.all(err > 1e-6 * exact)  # coarse bins really are inexact ...
    assert np.all(bound < 500 * err)  # ... and the worst-case bound is not vacuous (errors partly cancel)


def test_search_falls_back_when_the_bound_fails(monkeypatch, rng):
    """An untrusted histogram minimum is not used: the exact zoom search runs instead (same answer as with the
    histogram disabled)."""
    x = rng.normal(size=(150, 2))
    monkeypatch.setattr(pairhist, "TRUST_RTOL", 0.0)  # nothing is trusted
    calls = []
    real = sel.gauss_sums
    monkeypatch.setattr(sel, "gauss_sums", lambda *a, **k: calls.append(1) or real(*a, **k))
    h_fallback = bandwidth(x, "lscv_h", device="cpu")
    assert calls, "the exact search did not run"
    monkeypatch.setattr(pairhist, "TRUST_RTOL", 1e-6)
    calls.clear()
    h_hist = bandwidth(x, "lscv_h", device="cpu")
    assert not calls, "a trusted histogram minimum still ran exact pair sums"
    np.testing.assert_allclose(h_hist, h_fallback, rtol=3e-4)


def test_minimise_on_grids_reaches_a_fine_interior_minimum():
    target = 0.1234567
    f = lambda hs: ((torch.log(hs / target)) ** 2 + 1.0, torch.ones_like(hs, dtype=torch.bool))
    found = pairhist.minimise_on_grids(f, 1e-3, 10.0, torch.device("cpu"))
    assert found.h == pytest.approx(target, rel=1e-6)
    assert not found.at_edge and found.trusted
    edge = pairhist.minimise_on_grids(lambda hs: (hs, torch.ones_like(hs, dtype=torch.bool)), 1.0, 2.0,
                                      torch.device("cpu"))
    assert edge.at_edge and edge.h == pytest.approx(1.0)


@pytest.mark.parametrize("weighted", [False, True])
def test_lscv_gradient_sums_against_brute_force(backend, rng, weighted):
    n, d = (90, 3) if backend == "torch" else (40, 3)
    z = rng.normal(size=(n, d))
    w = rng.uniform(0.2, 2.0, n) if weighted else None
    i, j = np.triu_indices(n, 1)
    u = z[i] - z[j]
    e = np.exp(-(u**2).sum(1) / 4.0) * (1.0 if w is None else w[i] * w[j])
    e2 = np.exp(-(u**2).sum(1) / 2.0) * (1.0 if w is None else w[i] * w[j])
    want_s = np.array([e.sum(), e2.sum()])
    want_a = np.stack([np.einsum("p,pa,pb->ab", e, u, u), np.einsum("p,pa,pb->ab", e2, u, u)])
    with use_backend(backend):
        s, a = gauss_grad_sums(torch.from_numpy(z), None if w is None else torch.from_numpy(w))
    rtol = 1e-12 if backend == "torch" else 2e-6
    np.testing.assert_allclose(s.numpy(), want_s, rtol=rtol)
    np.testing.assert_allclose(a.numpy(), want_a, rtol=rtol, atol=rtol * np.abs(want_a).max())


@pytest.mark.parametrize("weighted", [False, True])
def test_pruned_hermite_sum_skips_far_tiles_exactly(rng, weighted):
    """The cutoff leaves most tiles of a spread sample dead; the Triton kernel skips them on the device and the
    sum still equals the unpruned float64 sum (a wrong skip test drops or double-counts whole tiles)."""
    from densitas.kde.pairsum import hermite_sum

    xn = np.sort(rng.uniform(0.0, 60.0, 120))
    wn = rng.uniform(0.5, 2.0, 120) if weighted else np.ones(120)
    x, w = torch.from_numpy(xn), (torch.from_numpy(wn) if weighted else None)
    with use_backend("torch"):
        want = hermite_sum(x, w, 0.7, 4, prune=False)
    with use_backend("triton"):
        got = hermite_sum(x, w, 0.7, 4, prune=True)
    # float32 rounding: u = x/g carries eps32·max|u| absolutely, so each term errs by that times |ψ'(u)|, plus
    # eps32·|ψ(u)| (ψ = H₄φ); the sum cancels (terms of both signs), so the scale is Σ|…|, not the result
    # (the worst of 200 seeds used 1.6% of it; one dead tile skipped wrongly moves the sum by far more)
    u = (xn[:, None] - xn[None, :]) / 0.7
    phi = np.exp(-u * u / 2.0) / np.sqrt(2.0 * np.pi)
    terms = np.abs((u**4 - 6 * u**2 + 3) * phi) + np.abs((u**5 - 10 * u**3 + 15 * u) * phi)
    scale = np.finfo(np.float32).eps * np.abs(xn / 0.7).max() * float((wn[:, None] * wn[None, :] * terms).sum())
    assert got == pytest.approx(want, rel=0, abs=scale)


@pytest.mark.parametrize("bad", [{"y_floor": 0.0}, {"y_floor": -1.0}, {"y_hi": float("nan")}, {"y_hi": float("inf")}])
def test_histogram_bad_range_names_the_parameter(bad):
    from densitas.exceptions import InputError

    kw = {"y_floor": 1e-6, "y_hi": 10.0, **bad}
    with pytest.raises(InputError):
        pairhist.pair_histogram(torch.zeros(3, 1, dtype=torch.float64), None, **kw)


def _search_case(rng, d: int, weighted: bool, bins_per_octave: int):
    n = 150
    x = rng.normal(size=(n, d)) * rng.uniform(0.5, 2.0, d)
    w = rng.uniform(0.5, 1.5, n) if weighted else None  # Σw(w − 1) small: LSCV keeps an interior minimum
    z = torch.from_numpy(x)
    zc = z - z.mean(0)
    wt = None if w is None else torch.from_numpy(w)
    nw = n if w is None else float(w.sum())
    sw2 = n if w is None else float((w * w).sum())
    h0 = (4.0 / ((d + 2.0) * nw)) ** (1.0 / (d + 4.0))
    lo, hi = h0 / pairhist.SEARCH_SPAN, h0 * pairhist.SEARCH_SPAN
    y_floor = 2.0 ** np.floor(np.log2(1e-3 * lo * lo))
    grid = pairhist.HistogramGrid.covering(y_floor, 4.0 * float((zc * zc).sum(1).max()) * 1.001, bins_per_octave)
    hist = pairhist.histogram_on(z, wt, grid)
    const = pairhist.LscvConstants(nw, sw2, sw2 - nw, d, float(np.log(np.linalg.det(np.cov(x.T).reshape(d, d)))))
    return hist, lo, hi, const


def _lscv_on_histogram(hist, const, h: float) -> tuple[float, float]:
    """LSCV(h) from the histogram in float64, and its positive term (the scale of its rounding)."""
    a = torch.tensor([1.0 / (4.0 * h * h)], dtype=torch.float64)
    s1, s2 = hist.sums(a)[0], hist.sums(2.0 * a)[0]
    hdet_inv = float(np.exp(-const.d * np.log(h) - 0.5 * const.logdet_s))
    value = pairhist.lscv_value(float(s1[0]), float(s2[0]), hdet_inv, const.n, const.sw2, const.sww1, const.d)
    positive = pairhist.lscv_value(float(s1[0]), 0.0, hdet_inv, const.n, const.sw2, 0.0, const.d)
    return value, positive


@pytest.mark.parametrize(("d", "weighted", "bins_per_octave", "window"), [
    (1, False, 128, None), (3, True, 128, None), (16, False, 128, None),
    (2, False, 128, (4.0, 8.0)),  # the whole window lies above the minimum: the first grid's minimum is its low end
    (2, True, 1, None),  # one bin per octave: the truncation bound fails, so nothing is trusted
    (3, False, 128, "rounded"),  # moments whose δ was rounded to 1e-3: the rounding term fails the bound
])
def test_triton_grid_search_matches_torch(rng, d, weighted, bins_per_octave, window):
    """The Triton search (one launch per grid, the previous minimum found on the device) against the PyTorch
    reference: the value it reports is LSCV at the h it reports, as low as the reference's minimum (the two may
    pick neighbouring points of a flat minimum: the sums are added in different orders), same flags."""
    pytest.importorskip("triton")
    from densitas.kde import _triton

    hist, lo, hi, const = _search_case(rng, d, weighted, bins_per_octave)
    if window == "rounded":
        hist, window = pairhist.PairHistogram(hist.grid, hist.moments, 1e-3), None
    if window is not None:
        h_min = float(pairhist.lscv_grid_search_torch(hist, lo, hi, const, 16, 4)[0])
        lo, hi = h_min * window[0], h_min * window[1]
    want = pairhist.lscv_grid_search_torch(hist, lo, hi, const, 16, 4)
    got = _triton.lscv_grid_search(hist, lo, hi, const, 16, 4)
    h, value = float(got[0]), float(got[1])
    at_h, positive = _lscv_on_histogram(hist, const, h)
    assert value == pytest.approx(at_h, rel=1e-9, abs=1e-12 * positive)
    assert h == pytest.approx(float(want[0]), rel=1e-5)
    if window is None:  # an interior minimum: the Triton point is as low as the reference's (at an edge the slope
        assert value <= float(want[1]) + 1e-7 * positive  # turns the last grid's spacing into a value difference)
    assert got[2:].tolist() == want[2:].tolist()
    assert bool(want[2]) == (window is not None)
    assert bool(want[3]) == (bins_per_octave > 1 and hist.quantum == 0.0)


def _kernel_model(x: np.ndarray, grid) -> torch.Tensor:
    """The CUDA pair-histogram kernel's arithmetic (``densitas.kde._cuda``, unweighted path) in NumPy float32:
    float32 differences of the centred points, the octave from the exponent bits, the sub-bin from log₂ of the
    mantissa, δ against the (hi, lo) sub-bin centre, the integer moments — then the module's own reconstruction."""
    from densitas.kde import _cuda

    z = (x - x.mean(0)).astype(np.float32)
    i, j = np.triu_indices(len(z), 1)
    y = ((z[i] - z[j]) ** 2).sum(1, dtype=np.float32)
    cent = _cuda._centres(torch.device("cpu")).numpy()
    chi, clo, rci = cent[:128], cent[128:256], cent[256:]
    under = y < np.float32(grid.y_floor)
    bits = y.view(np.uint32)
    e = (bits >> 23).astype(np.int64) - 127
    m = ((bits & 0x007FFFFF) | 0x3F800000).view(np.float32)
    k = np.clip((np.log2(m) * 128).astype(np.int64), 0, 127)
    b = (e - int(grid.u_lo)) * 128 + k + 1
    beyond = b > grid.bins
    b = np.where(beyond, grid.bins, b)
    k = np.where(beyond, (grid.bins - 1) % 128, k)
    m = np.where(beyond, np.ldexp(y, -(int(grid.u_lo) + (grid.bins - 1) // 128)).astype(np.float32), m)
    delta = ((m - chi[k]) - clo[k]) * rci[k]
    q, half = 1 << _cuda.QBITS, 1 << (_cuda.QBITS - 1)
    q1 = np.clip(np.rint(delta * np.float32(1.0 / _cuda.quantum(grid))).astype(np.int64), -q, q)
    q2 = (q1 * q1 + half) >> _cuda.QBITS
    q3 = (q2 * q1 + half) >> _cuda.QBITS
    qsum = np.zeros((grid.bins + 1, 4), dtype=np.int64)
    keep = ~under
    for col, v in enumerate((np.ones_like(q1), q1, q2, q3)):
        np.add.at(qsum[:, col], b[keep], v[keep])
    yu = y[under].astype(np.float64)
    raw0 = torch.tensor([len(yu), yu.sum(), (yu**2).sum(), (yu**3).sum()], dtype=torch.float64)
    return _cuda.moments_from_integers(torch.from_numpy(qsum), raw0, grid)


@pytest.mark.parametrize("d", [1, 4, 16])
def test_integer_moments_of_the_cuda_kernel_match_the_float64_histogram(rng, d):
    """The CUDA kernel's design, run on the CPU (CI has no GPU; the device suite compares the kernel itself with
    the PyTorch histogram): octave-aligned bins from the float's bits and integer δ moments in units of
    u = δ_max/1024 give S(a) = Σ e^{−aY} of the kernel's float32 distances within the histogram's truncation
    bound plus the worst case of the δ rounding (≤ u/2 per pair in the first-order term)."""
    from densitas.kde import _cuda

    n = 400
    x = rng.normal(size=(n, d)) * rng.uniform(0.5, 2.0, d)
    x[9] = x[4]  # a tied pair: bin 0
    xc = x - x.mean(0)
    h0 = (4.0 / ((d + 2.0) * n)) ** (1.0 / (d + 4.0))
    _, _, grid = pairhist.search_bounds(h0, 4.0 * float((xc**2).sum(1).max()) * 1.001)
    model = pairhist.PairHistogram(grid, _kernel_model(x, grid), _cuda.quantum(grid))
    assert float(model.moments[:, 0].sum()) == n * (n - 1) / 2
    assert float(model.moments[0, 0]) >= 1.0  # the tie
    z = (x - x.mean(0)).astype(np.float32)
    i, j = np.triu_indices(n, 1)
    y = ((z[i] - z[j]) ** 2).sum(1, dtype=np.float32).astype(np.float64)  # the kernel's distances
    a = np.array([0.05, 0.25, 1.0, 4.0]) / (h0 * h0)
    want = np.exp(-a[:, None] * y[None, :]).sum(1)
    got, bound = (t.numpy() for t in model.sums(torch.from_numpy(a)))
    assert np.all(np.abs(got - want) <= bound + 1e-12 * want), (got, want, bound)  # the bound counts the rounding
    assert np.all(bound <= 1e-4 * want)  # and is not vacuous
    plain = pairhist.PairHistogram(grid, model.moments)  # the same moments read as exact: a smaller bound
    assert np.all(plain.sums(torch.from_numpy(a))[1].numpy() < bound)


def test_histogram_search_policy_on_cuda(monkeypatch):
    """On CUDA the histogram search needs the shared-memory kernel (CuPy, ≤ 64 columns); weighted data only up to
    _cuda.WEIGHTED_MAX_ROWS rows (float32 per-block sums); without CuPy the exact passes run."""
    from densitas._backend import nvrtc
    from densitas.kde import _cuda

    cuda = torch.device("cuda")
    monkeypatch.setattr(nvrtc, "available", lambda: True)
    assert pairhist.histogram_pays(cuda, 16, 10_240, False)
    assert pairhist.histogram_pays(cuda, 64, 10**6, False)
    assert not pairhist.histogram_pays(cuda, 65, 1_000, False)
    assert pairhist.histogram_pays(cuda, 16, _cuda.WEIGHTED_MAX_ROWS, True)
    assert not pairhist.histogram_pays(cuda, 16, _cuda.WEIGHTED_MAX_ROWS + 1, True)
    monkeypatch.setattr(nvrtc, "available", lambda: False)
    assert not pairhist.histogram_pays(cuda, 16, 10_240, False)
    assert pairhist.histogram_pays(torch.device("cpu"), 16, 10**6, True)
