"""The KDE Triton kernels on a real GPU at real sizes (run on the device machine with -m gpu)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from densitas._backend.dispatch import use_backend
from densitas.kde import bandwidth, lscv_objective, plugin_functional
from densitas.kde.pairsum import gauss_sums
from densitas.testing.kde_reference import lscv_bruteforce, psi_bruteforce

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.mark.parametrize("r", [4, 6])
@pytest.mark.parametrize("weighted", [False, True])
def test_plugin_functional_gpu(rng, r, weighted):
    x = rng.lognormal(size=5000) + 50.0
    w = rng.integers(1, 4, size=5000).astype(float) if weighted else None
    got = plugin_functional(torch.from_numpy(x).cuda(), r, 0.2, weights=w)
    assert got == pytest.approx(psi_bruteforce(x, r, 0.2, w), rel=1e-5)


@pytest.mark.parametrize("d", [1, 3, 16])
def test_lscv_objective_gpu(rng, d):
    x = rng.normal(size=(1500, d))
    H = np.cov(x.T).reshape(d, d) * 0.3
    got = lscv_objective(torch.from_numpy(x).cuda(), H)
    t1, t2 = lscv_bruteforce(x, H, terms=True)
    assert got == pytest.approx(t1 - t2, rel=1e-5, abs=1e-5 * (t1 + t2))


def test_chain_matches_direct_exponentials_gpu(rng):
    z = torch.from_numpy(rng.normal(size=(20_000, 8))).cuda()
    a = torch.linspace(0.05, 0.5, 16, dtype=torch.float64)
    assert torch.allclose(gauss_sums(z, None, a, chain=True), gauss_sums(z, None, a), rtol=2e-5)


def test_plugin_bandwidth_gpu_matches_cpu(rng):
    x = np.r_[rng.normal(size=40_000), rng.normal(5, 0.3, size=10_000)]
    cpu = bandwidth(x, "plugin", engine="exact", device="cpu")
    assert bandwidth(x, "plugin", engine="exact", device="cuda") == pytest.approx(cpu, rel=1e-5)
    assert bandwidth(x, "plugin", engine="binned", device="cuda") == pytest.approx(cpu, rel=1e-3)


def test_lscv_h_gpu_is_as_good_as_cpu(rng):
    x = rng.normal(size=(3000, 4))
    Hg = bandwidth(x, "lscv_h", device="cuda")
    with use_backend("torch"):
        Hc = bandwidth(x, "lscv_h", device="cpu")
    vg, vc = lscv_objective(x, Hg, device="cpu"), lscv_objective(x, Hc, device="cpu")
    assert vg <= vc + 1e-6 * abs(vc)


@pytest.mark.parametrize("weighted", [False, True])
def test_pair_histogram_gpu_matches_torch(rng, weighted):
    from densitas.kde import pairhist

    x = torch.from_numpy(rng.normal(size=(6000, 16))).cuda()
    w = torch.from_numpy(rng.uniform(0.5, 2.0, 6000)).cuda() if weighted else None
    xc = x - x.mean(0)
    kw = dict(y_floor=1e-9, y_hi=4.0 * float((xc * xc).sum(1).max()) * 1.001)
    got = pairhist.pair_histogram(x, w, **kw)
    with use_backend("torch"):
        want = pairhist.pair_histogram(x, w, **kw)
    a = torch.tensor([0.01, 0.05, 0.2, 1.0], dtype=torch.float64)
    s_got, _ = got.sums(a)
    s_want, bound = want.sums(a)
    assert torch.allclose(s_got.cpu(), s_want.cpu(), rtol=2e-5)
    assert bool((bound <= 1e-5 * s_want).all())  # d = 16: pairs with a·Y ~ 30 carry the worst-case bound


@pytest.mark.parametrize("d", [1, 5, 16, 40])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("flush_every_tile", [False, True])
def test_shared_memory_pair_histogram_matches_torch(rng, monkeypatch, d, weighted, flush_every_tile):
    """The CuPy kernel (octave-aligned grid of the LSCV_h search) against the float64 PyTorch reference: the same
    pairs in the same bins (counts), and sums within float32 rounding of the pair distances. Flushing the integer
    sums after every tile exercises the flush path (at this size a block holds fewer than FLUSH_TILES tiles)."""
    pytest.importorskip("cupy")
    from densitas.kde import _cuda, pairhist

    if flush_every_tile:
        monkeypatch.setattr(_cuda, "FLUSH_TILES", 1)

    n = 3001
    x = torch.from_numpy(rng.normal(size=(n, d)) * rng.uniform(0.5, 2.0, d)).cuda()
    w = torch.from_numpy(rng.uniform(0.5, 2.0, n)).cuda() if weighted else None
    x[17] = x[3]  # a tied pair: bin 0
    xc = x - x.mean(0)
    _, _, grid = pairhist.search_bounds(0.5, 4.0 * float((xc * xc).sum(1).max()) * 1.001)
    assert _cuda.fits(d, grid)
    got = pairhist.PairHistogram(grid, _cuda.pair_histogram(x, w, grid))
    with use_backend("torch"):
        want = pairhist.histogram_on(x, w, grid)
    m_got, m_want = got.moments.cpu(), want.moments.cpu()
    assert float(m_got[:, 0].sum()) == pytest.approx(float(m_want[:, 0].sum()), rel=1e-6)
    # float32 distances move a pair across a bin edge only when it lies within ~1e-6 of it
    moved = (m_got[:, 0] - m_want[:, 0]).abs().sum() / m_want[:, 0].sum()
    assert float(moved) < 1e-3
    a = torch.tensor([1e-3, 0.01, 0.1, 1.0, 10.0], dtype=torch.float64)
    s_got, _ = got.sums(a)
    s_want, _ = want.sums(a)
    assert torch.allclose(s_got.cpu(), s_want.cpu(), rtol=2e-5, atol=1e-300)


def test_lscv_h_gpu_search_stays_on_the_device_and_matches_cpu(rng, monkeypatch):
    """bandwidth(…, "lscv_h") on CUDA: the shared-memory histogram and the Triton search run (and are trusted, so
    no exact pass follows) and give the CPU's h."""
    pytest.importorskip("cupy")
    from densitas.kde import _cuda, _triton
    from densitas.kde import selectors as sel

    calls = []
    for mod, name in ((_cuda, "pair_histogram"), (_triton, "lscv_grid_search")):
        real = getattr(mod, name)
        monkeypatch.setattr(mod, name, lambda *a, _r=real, _n=name, **k: calls.append(_n) or _r(*a, **k))
    exact = sel.gauss_sums
    monkeypatch.setattr(sel, "gauss_sums", lambda *a, **k: calls.append("exact") or exact(*a, **k))
    x = rng.normal(size=(4000, 6)) @ rng.normal(size=(6, 6))
    Hg = bandwidth(torch.from_numpy(x).cuda(), "lscv_h")
    assert calls == ["pair_histogram", "lscv_grid_search"]
    with use_backend("torch"):
        Hc = bandwidth(torch.from_numpy(x), "lscv_h", device="cpu")
    np.testing.assert_allclose(Hg, Hc, rtol=2e-4)


@pytest.mark.parametrize("quantum", [0.0, 1.0])
def test_triton_search_on_the_gpu_matches_torch(rng, quantum):
    """The compiled Triton search (float64 constants, not float32) against the PyTorch search on the same
    histogram: the LSCV it reports is the PyTorch LSCV at its h to 1e-9, as low as the PyTorch minimum, and the
    flags agree (a rounding unit of 1 makes nothing trusted)."""
    from densitas.kde import _triton, pairhist

    d, n = 8, 3000
    x = torch.from_numpy(rng.normal(size=(n, d)) * 1e-3).cuda()  # small units: log|S| far from 0
    xc = x - x.mean(0)
    h0 = (4.0 / ((d + 2.0) * n)) ** (1.0 / (d + 4.0))
    lo, hi, grid = pairhist.search_bounds(h0, 4.0 * float((xc * xc).sum(1).max()) * 1.001)
    z = xc / xc.std(0)
    with use_backend("torch"):
        hist = pairhist.histogram_on(z, None, grid)
    hist = pairhist.PairHistogram(grid, hist.moments, quantum)
    logdet = float(torch.logdet(torch.cov(x.T)))
    const = pairhist.LscvConstants(float(n), float(n), 0.0, d, logdet)
    got = _triton.lscv_grid_search(hist, lo, hi, const, 256, 3).cpu()
    want = pairhist.lscv_grid_search_torch(hist, lo, hi, const, 256, 3).cpu()
    h = float(got[0])
    a = torch.tensor([1.0 / (4.0 * h * h)], dtype=torch.float64, device="cuda")
    s1, s2 = float(hist.sums(a)[0][0]), float(hist.sums(2.0 * a)[0][0])
    hdet_inv = float(np.exp(-d * np.log(h) - 0.5 * logdet))
    at_h = pairhist.lscv_value(s1, s2, hdet_inv, float(n), float(n), 0.0, d)
    positive = pairhist.lscv_value(s1, 0.0, hdet_inv, float(n), float(n), 0.0, d)
    assert float(got[1]) == pytest.approx(at_h, rel=1e-9, abs=1e-12 * positive)
    assert float(got[1]) <= float(want[1]) + 1e-9 * positive
    assert got[2:].tolist() == want[2:].tolist()
    assert bool(got[3]) == (quantum == 0.0)


@pytest.mark.parametrize("weighted", [False, True])
def test_lscv_gradient_sums_gpu_match_torch(rng, weighted):
    from densitas.kde.pairsum import gauss_grad_sums

    z = torch.from_numpy(rng.normal(size=(5000, 16))).cuda()
    w = torch.from_numpy(rng.uniform(0.5, 2.0, 5000)).cuda() if weighted else None
    s, a = gauss_grad_sums(z, w)
    with use_backend("torch"):
        s0, a0 = gauss_grad_sums(z, w)
    assert torch.allclose(s, s0, rtol=2e-5)
    assert torch.allclose(a, a0, rtol=2e-5, atol=2e-5 * float(a0.abs().max()))


def test_lscv_h_gpu_is_a_minimiser(rng):
    """The exact zoom passes on the GPU (float32 pair sums) reach the CPU's minimum of LSCV to float32 rounding
    of the objective (the minimum is flat: h itself may differ by ~1e-3)."""
    x = rng.normal(size=(3000, 3)) @ np.array([[1.0, 0.5, 0.0], [0.0, 0.8, 0.3], [0.0, 0.0, 0.6]])
    from densitas.kde import pairhist

    pairhist.HISTOGRAM_DEVICES = ("cpu",)  # the exact zoom passes on the GPU
    try:
        H = bandwidth(torch.from_numpy(x).cuda(), "lscv_h")
    finally:
        pairhist.HISTOGRAM_DEVICES = ("cpu", "cuda")
    with use_backend("torch"):
        H0 = bandwidth(torch.from_numpy(x), "lscv_h", device="cpu")
    v, v0 = lscv_objective(x, H, device="cpu"), lscv_objective(x, H0, device="cpu")
    assert v <= v0 + 1e-6 * abs(v0)
    np.testing.assert_allclose(H, H0, rtol=5e-3)


def test_plugin_small_n_device_cutoffs_gpu(rng):
    """n below DEVICE_CUTOFF_MAX_N: the cutoffs stay on the device and far tiles are skipped in the kernel."""
    x = np.concatenate([rng.normal(0, 1, 20_000), rng.normal(40, 1, 20_000)])  # two far clusters
    got = plugin_functional(torch.from_numpy(x).cuda(), 4, 0.1)
    with use_backend("torch"):
        want = plugin_functional(torch.from_numpy(x), 4, 0.1, device="cpu")
    assert got == pytest.approx(want, rel=5e-5)  # float32 u = x/g at |x/g| ~ 400: ~3e-5 per term
