"""The fused Triton distance + top-k kernel, in the interpreter (TRITON_INTERPRET=1, set by tests/conftest.py).

Sizes stay tiny: the interpreter runs each program in Python.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

triton = pytest.importorskip("triton")

from densitas.neighbors import _triton as fused  # noqa: E402

SEED = int(os.environ.get("DENSITAS_TEST_SEED", "11"))


def _reference(Y: torch.Tensor, X: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Float64 squared distances, sorted by (distance, index)."""
    d = ((Y.double()[:, None, :] - X.double()[None, :, :]) ** 2).sum(-1)
    idx = torch.arange(len(X)).expand(len(Y), -1)
    order = np.lexsort((idx.numpy(), d.numpy()), axis=1)[:, :k]
    o = torch.from_numpy(order)
    return d.gather(1, o), idx.gather(1, o)


@pytest.mark.parametrize(("m", "n", "d", "kp", "splits"), [(5, 70, 3, 16, 2), (33, 40, 17, 32, 1), (3, 9, 2, 16, 1)])
def test_candidates_are_the_nearest_with_ties_by_lower_index(m, n, d, kp, splits):
    g = torch.Generator().manual_seed(SEED)
    X = torch.randint(0, 3, (n, d), generator=g).float()  # many exact ties
    Y = torch.randint(0, 3, (m, d), generator=g).float()
    dist, idx = fused.candidates(Y, X, kp, precision="ieee", splits=splits)
    k = min(kp, n)
    rd, ri = _reference(Y, X, k)
    assert torch.equal(idx[:, :k], ri), f"seed {SEED}"
    assert torch.allclose(dist[:, :k].double(), rd, atol=1e-5), f"seed {SEED}"
    if n < kp:  # padding: infinite distance past the references
        assert torch.isinf(dist[:, n:]).all()


def test_fused_kneighbors_is_exact_for_every_metric():
    g = torch.Generator().manual_seed(SEED)
    X = torch.randn(60, 6, generator=g) + 50.0  # far from the origin: the centring matters
    Y = torch.cat([X[:3], torch.randn(3, 6, generator=g) + 50.0])
    from sklearn.neighbors import NearestNeighbors

    for metric in ("euclidean", "sqeuclidean", "cosine"):
        D, I_ = fused.fused_kneighbors(Y, X, 4, metric=metric)
        ref = NearestNeighbors(n_neighbors=4, algorithm="brute", metric=metric).fit(X.double().numpy())
        rd, ri = ref.kneighbors(Y.double().numpy())
        np.testing.assert_allclose(D.numpy(), rd, rtol=1e-9, atol=1e-12, err_msg=f"{metric}, seed {SEED}")
        assert (I_.numpy() == ri).all(), f"{metric}, seed {SEED}"
        assert (I_[:3, 0] == torch.arange(3)).all()  # every query in X finds itself first


def test_tile_topk_meets_the_operation_contract():
    """Same values (to the TF32 bound) and same selected set as the PyTorch implementation."""
    from densitas.neighbors._torch import prepare
    from densitas.neighbors._torch import tile_topk as torch_tile_topk

    g = torch.Generator().manual_seed(SEED)
    X = torch.randn(50, 5, generator=g)
    q = prepare(X[:7], None, "sq", False, "query", torch.float32)
    c = prepare(X, None, "sq", False, "reference", torch.float32)
    v, i = fused.tile_topk(q, c, 6, 1024)
    tv, ti = torch_tile_topk(q, c, 6, 1024)
    assert set(map(tuple, torch.sort(i, 1).values.tolist())) == set(map(tuple, torch.sort(ti, 1).values.tolist()))
    bound = 4 * fused.tile_topk.unit_roundoff * float((X.norm(dim=1).max() * 2) ** 2)
    assert float((torch.sort(v, 1).values - torch.sort(tv, 1).values).abs().max()) <= bound


def test_kneighbors_through_the_triton_backend_equals_scikit_learn():
    """The search with the Triton implementation of knn_tile_topk forced (interpreter on the CPU)."""
    from sklearn.neighbors import NearestNeighbors

    from densitas._backend.dispatch import use_backend
    from densitas.neighbors import kneighbors

    rng = np.random.default_rng(SEED)
    X = rng.normal(size=(80, 4)).astype(np.float32)
    X[40:50] = X[:10]  # duplicates
    Y = np.concatenate([X[:5], rng.normal(size=(4, 4)).astype(np.float32)])
    with use_backend("triton"):
        D, I_ = kneighbors(X, Y, 5)
    rd, _ = NearestNeighbors(n_neighbors=5, algorithm="brute").fit(X.astype(np.float64)).kneighbors(
        Y.astype(np.float64))
    np.testing.assert_allclose(np.asarray(D), rd, rtol=1e-6, atol=1e-6, err_msg=f"seed {SEED}")
    ref = ((Y[:, None, :].astype(np.float64) - X[None].astype(np.float64)) ** 2).sum(-1)
    want = np.lexsort((np.broadcast_to(np.arange(len(X)), ref.shape), ref), axis=1)[:, :5]
    assert (np.asarray(I_) == want).all(), f"seed {SEED}"


def _tf32(x: torch.Tensor) -> torch.Tensor:
    """x with its float32 mantissa truncated to TF32's 10 bits (the worse of truncation and rounding)."""
    return (x.view(torch.int32) & ~0x1FFF).view(torch.float32)


def test_tf32_rounding_stays_inside_the_certificate_bound():
    """Simulated TF32 products (inputs truncated to 10 mantissa bits, float32 accumulation): every fast value is
    within the search's bound ε = κ·((a_q + a_c)² + 1) of the float64 value, for data with and without an
    offset (a bound too tight would certify wrong answers)."""
    from densitas.neighbors.distances import bound_coefficient, get_metric

    metric = get_metric("sqeuclidean")
    rng = np.random.default_rng(SEED)
    for offset in (0.0, 3.0):
        X = torch.from_numpy(rng.normal(size=(300, 33)).astype(np.float32) + offset)
        Y = torch.from_numpy(rng.normal(size=(40, 33)).astype(np.float32) + offset)
        mu = X.double().mean(0).float()
        Xc, Yc = X - mu, Y - mu
        fast = (Yc * Yc).sum(1)[:, None] + (Xc * Xc).sum(1)[None, :] - 2.0 * (_tf32(Yc) @ _tf32(Xc).T)
        exact = ((Y.double()[:, None, :] - X.double()[None, :, :]) ** 2).sum(-1)
        kappa = bound_coefficient(metric, 33, False, torch.float32, fused.UNIT_ROUNDOFF["tf32"])
        eps = kappa * ((Yc.double().norm(dim=1)[:, None] + Xc.double().norm(dim=1).max()) ** 2 + 1.0)
        err = (fast.double() - exact).abs()
        assert bool((err <= eps).all()), f"seed {SEED}, offset {offset}: max err/eps {float((err / eps).max())}"
        assert float((err / eps).max()) > 1e-3  # the bound is not vacuous: TF32 errors reach its scale


def test_mixed_euclidean_through_the_kernel_equals_the_direct_formula():
    """One-hot/√2 coding makes mixed Euclidean a Euclidean distance for the kernel; the re-rank uses the exact
    formula, so the answer equals a direct float64 implementation (ties by the lower index)."""
    rng = np.random.default_rng(SEED)
    n, m = 70, 6
    X = np.concatenate([rng.normal(size=(n, 3)), rng.integers(0, 3, size=(n, 2))], 1)
    X[30:35] = X[:5]  # duplicates
    Y = np.concatenate([X[:3], np.concatenate([rng.normal(size=(m - 3, 3)), rng.integers(0, 4, size=(m - 3, 2))], 1)])
    D, I_ = fused.mixed_kneighbors(torch.from_numpy(Y).float(), torch.from_numpy(X).float(), [3, 4], 5)
    X32, Y32 = X.astype(np.float32).astype(np.float64), Y.astype(np.float32).astype(np.float64)
    ref = ((Y32[:, None, :3] - X32[None, :, :3]) ** 2).sum(-1) + (Y32[:, None, 3:] != X32[None, :, 3:]).sum(-1)
    want = np.lexsort((np.broadcast_to(np.arange(n), ref.shape), ref), axis=1)[:, :5]
    assert (I_.numpy() == want).all(), f"seed {SEED}"
    np.testing.assert_allclose(D.numpy(), np.sqrt(np.take_along_axis(ref, want, 1)), rtol=1e-12)
    assert (I_[:3, 0] == torch.arange(3)).all()


def test_nan_skipping_through_the_kernel_equals_the_direct_rule():
    """Document 001's rule (pairs with a NaN skipped, no rescaling; nothing in common: NaN, last) through the
    kernel's [x², x, m]·[m, −2x, x²] product equals a direct float64 implementation."""
    rng = np.random.default_rng(SEED)
    n, m, d = 60, 7, 4
    X = rng.normal(size=(n, d))
    X[rng.random((n, d)) < 0.3] = np.nan
    X[5] = [np.nan, np.nan, 1.0, 2.0]
    Y = X[:m].copy()
    Y[6] = [3.0, 4.0, np.nan, np.nan]  # nothing in common with row 5 (and maybe others)
    X32, Y32 = X.astype(np.float32).astype(np.float64), Y.astype(np.float32).astype(np.float64)
    both = ~np.isnan(Y32)[:, None, :] & ~np.isnan(X32)[None, :, :]
    diff = np.where(both, np.nan_to_num(Y32[:, None, :]) - np.nan_to_num(X32[None, :, :]), 0.0)
    ref = np.where(both.any(-1), (diff**2).sum(-1), np.inf)
    want = np.lexsort((np.broadcast_to(np.arange(n), ref.shape), ref), axis=1)[:, :8]
    D, I_ = fused.masked_kneighbors(torch.from_numpy(Y).float(), torch.from_numpy(X).float(), 8, metric="sqeuclidean")
    assert (I_.numpy() == want).all(), f"seed {SEED}"
    got = np.take_along_axis(ref, want, 1)
    np.testing.assert_allclose(D.numpy(), np.where(np.isinf(got), np.nan, got), rtol=1e-9, atol=1e-12)
    # k = n: the pairs with nothing in common come last, as NaN, in index order
    D, I_ = fused.masked_kneighbors(torch.from_numpy(Y).float(), torch.from_numpy(X).float(), n, metric="sqeuclidean")
    want = np.lexsort((np.broadcast_to(np.arange(n), ref.shape), ref), axis=1)
    assert (I_.numpy() == want).all(), f"seed {SEED}"
    assert np.isnan(D.numpy()[6]).sum() == np.isinf(ref[6]).sum() >= 1


@pytest.mark.parametrize("driver", ["fused", "mixed", "masked"])
def test_uncertified_queries_take_the_brute_force(driver):
    """More exact ties than candidates: the certificate cannot vouch for the query, the float64 brute force
    answers it, ties by the lower index (every driver shares that step)."""
    rng = np.random.default_rng(SEED)
    X = rng.normal(size=(120, 3))
    X[10:110] = X[3]  # 101 copies of one row: far more than the kp = 16 candidates
    if driver == "mixed":
        X = np.concatenate([X, np.zeros((120, 1))], 1)
    Xt = torch.from_numpy(X).float()
    Y = Xt[[3, 0]]
    if driver == "fused":
        D, I_ = fused.fused_kneighbors(Y, Xt, 5, metric="sqeuclidean")
    elif driver == "mixed":
        D, I_ = fused.mixed_kneighbors(Y, Xt, [3], 5)
    else:
        D, I_ = fused.masked_kneighbors(Y, Xt, 5, metric="sqeuclidean")
    assert I_[0].tolist() == [3, 10, 11, 12, 13], f"seed {SEED}"
    assert float(D[0].abs().max()) == 0.0
    ref = ((X[0, None, :3].astype(np.float32).astype(np.float64)
            - X[:, :3].astype(np.float32).astype(np.float64)) ** 2).sum(-1)
    assert I_[1].tolist() == np.lexsort((np.arange(120), ref))[:5].tolist()


def _below_with_cap(cap):
    def run(Y, X, kp, *, precision, splits, seed):
        return fused.candidates_below(Y, X, kp, seed, precision=precision, splits=splits, cap=cap)
    return run


@pytest.mark.parametrize(("m", "n", "d", "kp", "splits"), [(6, 150, 3, 16, 2), (4, 70, 5, 16, 1)])
@pytest.mark.parametrize("form", ["top-k on chip", "below, roomy buffer", "below, buffer overflows"])
def test_seeded_candidates_keep_only_values_below_the_seed(m, n, d, kp, splits, form):
    """With a per-query seed the kernel returns the nearest rows whose value is below it (ties by the lower
    index) and nothing else; every row not returned has a value ≥ min(seed, the kp-th value). The same holds for
    :func:`candidates_below` (no top-k on chip: a buffer of the rows below the seed), also when a query's rows
    below its seed overflow the buffer (that query then takes the top-k kernel)."""
    fn = {"top-k on chip": fused.candidates, "below, roomy buffer": _below_with_cap(4096),
          "below, buffer overflows": _below_with_cap(kp)}[form]
    g = torch.Generator().manual_seed(SEED)
    X = torch.randint(0, 4, (n, d), generator=g).float()
    Y = torch.randint(0, 4, (m, d), generator=g).float()
    rd, ri = _reference(Y, X, n)
    seed = torch.tensor([rd[j, min(3 * j, n - 1)] for j in range(m)], dtype=torch.float32)
    seed[0] = float("inf")  # no seed for the first query
    seed[1] = 0.0  # nothing wanted
    dist, idx = fn(Y, X, kp, precision="ieee", splits=splits, seed=seed)
    for j in range(m):
        below = rd[j] < seed[j].double()
        want = ri[j][below][:kp]
        got = idx[j][torch.isfinite(dist[j])]
        assert torch.equal(got, want), f"query {j}, seed {SEED}"
        if form != "top-k on chip":  # the buffer's padding: row n at +inf
            assert bool((idx[j][~torch.isfinite(dist[j])] == n).all()), f"query {j}, seed {SEED}"
        returned = set(got.tolist())
        floor = min(float(seed[j]), float(dist[j, -1]))
        dropped = [float(v) for v, i in zip(rd[j], ri[j], strict=True) if int(i) not in returned]
        assert all(v >= floor for v in dropped), f"query {j}, seed {SEED}"


def test_candidates_refuses_more_rows_than_a_key_can_number(monkeypatch):
    """A key keeps the reference row in 32 bits: past MAX_ROWS rows the kernel would return wrong indices."""
    from densitas.exceptions import InputError

    monkeypatch.setattr(fused, "MAX_ROWS", 9)
    X = torch.randn(10, 3)
    with pytest.raises(InputError) as err:
        fused.candidates(X[:2], X, 16)
    assert "'R'" in str(err.value)
    fused.candidates(X[:2], X[:9], 16)  # at the limit: accepted


def test_fused_kneighbors_certifies_near_ties_with_float32_products():
    """Candidates packed closer than the TF32 bound but farther apart than the float32 one: the TF32 pass
    certifies none of the queries, the float32 pass all of them, and the answer is the float64 one."""
    from sklearn.neighbors import NearestNeighbors

    g = torch.Generator().manual_seed(SEED)
    # 200 references on the unit sphere at radii 1 + U(0, 0.05) round the queries, and 50 far ones at
    # (10, 0, 0, 0) that move the mean and the largest centred norm: the 3rd and the 16th (kp-th) squared
    # distances differ by ~6e-3, under the TF32 bound (~6e-2) and over the float32 one (~2e-4)
    u = torch.randn(200, 4, generator=g, dtype=torch.float64)
    near = u / u.norm(dim=1, keepdim=True) * (1.0 + 0.05 * torch.rand(200, 1, generator=g, dtype=torch.float64))
    far = torch.tensor([10.0, 0.0, 0.0, 0.0], dtype=torch.float64) + 0.1 * torch.randn(50, 4, generator=g,
                                                                                      dtype=torch.float64)
    X = torch.cat([near, far]).float()
    Y = (1e-6 * torch.randn(5, 4, generator=g, dtype=torch.float64)).float()
    stats: dict[str, int] = {}
    D, I_ = fused.fused_kneighbors(Y, X, 3, metric="sqeuclidean", stats=stats)
    rd, ri = NearestNeighbors(n_neighbors=3, algorithm="brute").fit(X.double().numpy()).kneighbors(Y.double().numpy())
    np.testing.assert_allclose(D.numpy(), rd**2, rtol=1e-9, atol=1e-15)
    assert (I_.numpy() == ri).all()
    assert stats["queries"] == 5 and stats["uncertified"] == 5, stats
    assert stats["uncertified_ieee"] == 0, stats


# ------------------------------------------------------------------ float16 operands and the two-piece driver


@pytest.mark.parametrize(("m", "n", "d", "kp", "splits"), [(5, 70, 3, 16, 2), (33, 40, 17, 32, 1)])
def test_half_candidates_are_exact_on_small_integers(m, n, d, kp, splits):
    """Small integers survive the float16 copies exactly (the scale is a power of two): same candidates and
    order (ties by the lower index) as the float64 reference."""
    g = torch.Generator().manual_seed(SEED)
    X = torch.randint(-3, 4, (n, d), generator=g).float()
    Y = torch.randint(-3, 4, (m, d), generator=g).float()
    dist, idx = fused.candidates(Y, X, kp, precision="fp16", splits=splits)
    k = min(kp, n)
    rd, ri = _reference(Y, X, k)
    assert torch.equal(idx[:, :k], ri), f"seed {SEED}"
    assert torch.allclose(dist[:, :k].double(), rd, atol=1e-4), f"seed {SEED}"


def test_half_values_stay_within_the_rounding_bound_also_below_the_normal_range():
    """Every float16 kernel value is within ``rounding_bound("fp16", ...)`` of the float64 value, on data built
    so that the absolute rounding of values scaled below float16's normal range matters: one query 10⁸ away sets
    the scale, the others and every reference are ~10⁻³ (subnormal once scaled). Without the bound's
    absolute term these pairs exceed it (checked below), so the test fails if that term is dropped."""
    from densitas.neighbors.distances import rounding_bound

    g = torch.Generator().manual_seed(SEED)
    d, n = 4, 200
    X = (1e-3 * torch.randn(n, d, generator=g, dtype=torch.float64)).float()
    Y = torch.cat([(1e-3 * torch.randn(7, d, generator=g, dtype=torch.float64)).float(),
                   torch.tensor([[1e8, 0.0, 0.0, 0.0]])])
    dist, idx = fused.candidates(Y, X, 256, precision="fp16")
    valid = idx < n
    exact = ((Y.double()[:, None, :] - X.double()[idx.clamp(max=n - 1)]) ** 2).sum(-1)
    err = torch.where(valid, (dist.double() - exact).abs(), 0.0)
    qn = Y.double().norm(dim=1)
    cmax = X.double().norm(dim=1).max() * (1 + 1e-6)
    eps = rounding_bound("fp16", qn, cmax, d)
    assert bool((err <= eps[:, None]).all()), float((err - eps[:, None]).max())
    plain = rounding_bound("tf32", qn, cmax, d)  # the relative terms alone
    assert bool((err[:7] > plain[:7, None]).any()), "the data no longer exercise the absolute term"


@pytest.mark.parametrize("precision", ["tf32", "fp16"])
@pytest.mark.parametrize("first", [16, 40, 149])
def test_two_piece_search_equals_float64_brute_force(precision, first):
    """The first piece seeds the rest; ties across the cut go to the lower index; the answer is the float64 one
    whatever the cut (the 41 copies of a row straddle it for first = 40)."""
    g = torch.Generator().manual_seed(SEED)
    X = torch.randint(0, 3, (150, 4), generator=g).float()
    X[20:61] = X[2]  # 41 copies of row 2: more ties than kp = 16 candidates
    X[-5:] += 40.0
    Y = torch.cat([X[[2, 0, 149]], torch.randint(0, 3, (5, 4), generator=g).float(), torch.randn(4, 4, generator=g)])
    stats: dict[str, int] = {}
    for k in (1, 5):
        D, I_ = fused.fused_kneighbors(Y, X, k, metric="sqeuclidean", precision=precision, first_piece=first,
                                       stats=stats)
        rd, ri = _reference(Y, X, k)
        assert stats["first_piece"] == first
        assert torch.equal(I_, ri), f"k={k}, seed {SEED}"
        np.testing.assert_allclose(D.numpy(), rd.numpy(), rtol=1e-12, atol=0)


def test_an_unknown_precision_is_refused():
    from densitas.exceptions import InputError

    X = torch.randn(10, 3)
    with pytest.raises(InputError) as err:
        fused.fused_kneighbors(X[:2], X, 2, precision="bf16")
    assert "'precision'" in str(err.value) and "'bf16'" in str(err.value)
    with pytest.raises(InputError) as err:  # the missing-value search's bound has no float16 term
        fused.masked_kneighbors(X[:2], X, 2, precision="fp16")
    assert "'precision'" in str(err.value) and "'fp16'" in str(err.value)


def test_two_piece_is_the_default_past_its_threshold(monkeypatch):
    monkeypatch.setattr(fused, "TWO_PIECE_MIN_ROWS", 64)  # off by default (slower on the H200)
    g = torch.Generator().manual_seed(SEED)
    X, Y = torch.randn(300, 3, generator=g), torch.randn(4, 3, generator=g)
    stats: dict[str, int] = {}
    _d, I_ = fused.fused_kneighbors(Y, X, 3, stats=stats)
    assert stats["first_piece"] == 300 // fused.FIRST_PIECE
    _rd, ri = _reference(Y, X, 3)
    assert torch.equal(I_, ri)
    fused.fused_kneighbors(Y, X, 3, metric="cosine", stats=stats)
    assert stats["first_piece"] == 0  # cosine: one piece


@pytest.mark.parametrize("precision", ["tf32", "fp16"])
def test_threshold_pass_equals_float64_brute_force(precision):
    """The threshold pass (seeds from two even samples, then the rows below the seed): the float64 answer, ties by
    the lower index; on continuous data every query is certified in the first pass (a seed too tight would leave
    them uncertified, one too loose overflows nothing here)."""
    g = torch.Generator().manual_seed(SEED)
    X, Y = torch.randn(3000, 5, generator=g), torch.randn(40, 5, generator=g)
    X = X[torch.argsort(X[:, 0])]  # ordered rows: a prefix would be a poor sample, the even one is not
    for k in (1, 12):
        stats: dict[str, int] = {}
        D, I_ = fused.fused_kneighbors(Y, X, k, metric="sqeuclidean", precision=precision, threshold=True,
                                       stats=stats)
        rd, ri = _reference(Y, X, k)
        assert stats["threshold"] == len(Y) and stats["uncertified"] == 0, f"k={k}, seed {SEED}: {stats}"
        assert torch.equal(I_, ri), f"k={k}, seed {SEED}"
        np.testing.assert_allclose(D.numpy(), rd.numpy(), rtol=1e-12, atol=0)


def test_candidates_below_in_several_launches_with_overflowing_rows(monkeypatch):
    """A buffer budget of one block of queries: 150 queries take three launches, and those with more rows below
    their seed than the 64 slots (those at or near the 81 copies of row 5) take the top-k kernel — the same
    candidates as :func:`candidates` either way, at the right queries."""
    monkeypatch.setattr(fused, "BUFFER_BYTES", 64 * 64 * 8)
    calls = []
    top_k = fused.candidates

    def counted(Q, *args, **kwargs):
        calls.append(len(Q))
        return top_k(Q, *args, **kwargs)

    monkeypatch.setattr(fused, "candidates", counted)
    g = torch.Generator().manual_seed(SEED)
    X = torch.randn(400, 4, generator=g)
    X[100:180] = X[5]
    Y = torch.cat([torch.randn(140, 4, generator=g), X[[5] * 10]])[torch.randperm(150, generator=g)]
    rd, _ri = _reference(Y, X, 400)
    seed = (rd[:, 20] * 1.01 + 1e-3).to(torch.float32)  # the 81 copies pass for the queries at row 5
    d2, idx = fused.candidates_below(Y, X, 16, seed, precision="ieee", cap=64, block_m=64)
    want_d, want_i = top_k(Y, X, 16, precision="ieee", seed=seed)
    over = int(((rd < seed[:, None].double()).sum(1) > 64).sum())  # the copies of row 5 pass: ≥ the ten at it
    assert over >= 10 and sum(calls) == over, (over, calls)  # the overflowing rows, and only they, over 3 launches
    fin = torch.isfinite(want_d)
    assert torch.equal(torch.isfinite(d2), fin), f"seed {SEED}"
    # the same rows up to ties and, to rounding, the same float32 distances: in the interpreter each kernel's tile
    # product is a NumPy matmul of its own tile shape, and the BLAS may round a 4-term dot differently by shape and
    # by column (one ulp on an AVX-512 CPU: the 81 equal rows need not tie); on a GPU both kernels run the same
    # tile function. Both lists are rows at the same float64 distances (to float32 rounding), in the same order.
    exact = ((Y.double()[:, None, :] - X.double()[None]) ** 2).sum(-1)
    torch.testing.assert_close(exact.gather(1, idx.clamp(max=len(X) - 1))[fin],
                               exact.gather(1, want_i.clamp(max=len(X) - 1))[fin], rtol=1e-6, atol=1e-6)
    scale = float((Y**2).sum(1).max() + (X**2).sum(1).max())  # ‖q‖² + ‖r‖² − 2q·r: rounding of the norms
    torch.testing.assert_close(d2[fin], want_d[fin], rtol=0, atol=4 * 2.0**-23 * scale)
    assert (idx[fin] != want_i[fin]).float().mean() < 0.05  # only the ties among the copies of row 5 may differ


def test_threshold_pass_with_more_ties_than_its_buffer_holds(monkeypatch):
    """1,100 copies of one row: the queries at that row have more rows below their seed than the buffer's 1,024
    slots, take the top-k kernel, and still get the float64 answer (ties by the lower index)."""
    calls = []
    top_k = fused.candidates
    monkeypatch.setattr(fused, "candidates", lambda Q, *a, **kw: calls.append(len(Q)) or top_k(Q, *a, **kw))
    g = torch.Generator().manual_seed(SEED)
    X = torch.randint(0, 4, (2600, 3), generator=g).float()
    X[300:1400] = X[7]
    Y = torch.cat([X[[7, 7, 0]], torch.randn(3, 3, generator=g)])
    D, I_ = fused.fused_kneighbors(Y, X, 6, metric="sqeuclidean", threshold=True)
    rd, ri = _reference(Y, X, 6)
    assert calls and calls[0] >= 2, calls  # the two queries at row 7 overflowed (the first call)
    assert torch.equal(I_, ri), f"seed {SEED}"
    np.testing.assert_allclose(D.numpy(), rd.numpy(), rtol=1e-12, atol=0)


def test_threshold_pass_is_the_default_for_long_lists_on_many_rows(monkeypatch):
    """By default (patched thresholds here) the pass runs for long lists on many rows, not for short lists, few
    rows or cosine; the answers are the float64 ones either way."""
    monkeypatch.setattr(fused, "THRESHOLD_MIN_ROWS", 500)
    monkeypatch.setattr(fused, "THRESHOLD_MIN_KP", 32)
    g = torch.Generator().manual_seed(SEED)
    X, Y = torch.randn(600, 3, generator=g), torch.randn(3, 3, generator=g)
    for k, metric, n, used in ((20, "euclidean", 600, True), (5, "euclidean", 600, False),
                               (20, "cosine", 600, False), (20, "euclidean", 400, False)):
        stats: dict[str, int] = {}
        _d, I_ = fused.fused_kneighbors(Y, X[:n], k, metric=metric, stats=stats)
        assert ("threshold" in stats) is used, (k, metric, n)
        if metric == "euclidean":
            assert torch.equal(I_, _reference(Y, X[:n], k)[1]), f"k={k}, n={n}, seed {SEED}"


def test_threshold_pass_with_a_seed_too_tight_still_answers_exactly(monkeypatch):
    """A seed below the true k-th value (here: 0, which no row passes) leaves neighbours out of the buffer: the
    queries go uncertified and are recomputed, and the answer stays the float64 one."""
    monkeypatch.setattr(fused, "seed_above", lambda kth, eps: torch.zeros_like(kth, dtype=torch.float32))
    g = torch.Generator().manual_seed(SEED)
    X, Y = torch.randn(2000, 4, generator=g), torch.randn(12, 4, generator=g)
    stats: dict[str, int] = {}
    D, I_ = fused.fused_kneighbors(Y, X, 8, metric="sqeuclidean", threshold=True, stats=stats)
    rd, ri = _reference(Y, X, 8)
    assert stats["uncertified"] == len(Y), stats
    assert torch.equal(I_, ri), f"seed {SEED}"
    np.testing.assert_allclose(D.numpy(), rd.numpy(), rtol=1e-12, atol=0)
