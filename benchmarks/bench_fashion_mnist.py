"""Real data for the k-NN and fuzzy clustering issues: Fashion-MNIST (60,000 × 784 train, 10,000 test).

The data come from Debian's package ``dataset-fashion-mnist`` (``sudo apt-get install dataset-fashion-mnist``;
``dpkg -L dataset-fashion-mnist`` lists ``/usr/share/datasets/fashion-mnist/*.gz``) or any directory holding the
four IDX files (``--data DIR``). This script installs nothing; without the files it says how to get them.

1. **k-NN classification** (issue 11): densitas ``KNeighborsClassifier`` and scikit-learn's (brute force) for
   k = 1 … 20 with uniform weights on the same ``--test`` queries (default: all 10,000): accuracy of both and
   whether the predictions are identical. Each library answers ONE k = 20 query (its lists are sorted, so the
   first k columns are the k nearest) and its own estimator votes for every k (scikit-learn's ``predict`` on
   those lists through its own ``_mode``, its fused route being declined for the occasion); then one timed
   fit + predict at k = 10 per library, by its ordinary route, checked against the k = 10 row.
2. **Fuzzy c-means** (issue 12): densitas ``FuzzyKMeans`` (k = 10, classic FCM, q = 2, float64) and
   scikit-fuzzy's ``cmeans`` from the same initial centroids for the same ``--iters`` iterations: time per
   iteration, the largest centroid difference, and the adjusted Rand index of the hard labels against the true
   classes.

Usage::

    python benchmarks/bench_fashion_mnist.py [--data DIR] [--test 10000] [--iters 20] [--device cpu]
"""

from __future__ import annotations

import argparse
import gzip
import sys
import time
from pathlib import Path

import numpy as np

DEFAULT_DIR = Path("/usr/share/datasets/fashion-mnist")
FILES = {"train_x": "train-images-idx3-ubyte.gz", "train_y": "train-labels-idx1-ubyte.gz",
         "test_x": "t10k-images-idx3-ubyte.gz", "test_y": "t10k-labels-idx1-ubyte.gz"}


def read_idx(path: Path) -> np.ndarray:
    """One IDX file (gzip): images as (n, rows·cols) uint8, labels as (n,) uint8."""
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    arr = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    return arr.reshape(dims[0], -1) if ndim > 1 else arr


def load(directory: Path) -> dict[str, np.ndarray]:
    missing = [name for name in FILES.values() if not (directory / name).is_file()]
    if missing:
        sys.exit(f"Fashion-MNIST not found in {directory} (missing {', '.join(missing)}). Install Debian's "
                 "package: sudo apt-get install dataset-fashion-mnist, or pass --data DIR with the four IDX files.")
    return {k: read_idx(directory / v) for k, v in FILES.items()}


def _answer_from(est, dist: np.ndarray, ind: np.ndarray) -> None:
    """Make ``est.kneighbors`` answer from one k = 20 query: the first ``n_neighbors`` columns of its lists (the
    estimator's own ``predict`` then votes on them)."""
    def kneighbors(X=None, n_neighbors=None, return_distance=True):
        k = est.n_neighbors if n_neighbors is None else n_neighbors
        return (dist[:, :k], ind[:, :k]) if return_distance else ind[:, :k]

    est.kneighbors = kneighbors


def knn(d: dict[str, np.ndarray], n_test: int, device: str, k_max: int = 20) -> None:
    """Predictions for k = 1 … k_max from ONE k_max-neighbour query per library (the lists are sorted, so the
    first k columns are the k nearest), each voted on by that library's own estimator; then one timed
    fit + predict at k = 10 per library, which must equal the k = 10 row of the table."""
    import sklearn.neighbors._classification as sk_cls
    from sklearn.neighbors import KNeighborsClassifier as SkKNN

    from densitas.neighbors import KNeighborsClassifier

    Xtr, ytr = d["train_x"].astype(np.float32) / 255.0, d["train_y"]
    Xte, yte = d["test_x"][:n_test].astype(np.float32) / 255.0, d["test_y"][:n_test]
    print(f"\n1. k-NN classification: {len(Xtr):,} train × {len(Xte):,} test queries × 784, uniform weights")
    t0 = time.perf_counter()
    ours = KNeighborsClassifier(n_neighbors=k_max, device=device).fit(Xtr, ytr)
    d_ours, i_ours = ours.kneighbors(Xte)
    t_ours = time.perf_counter() - t0
    t0 = time.perf_counter()
    peer = SkKNN(n_neighbors=k_max, algorithm="brute").fit(Xtr, ytr)
    d_peer, i_peer = peer.kneighbors(Xte)
    t_peer = time.perf_counter() - t0
    same_lists = float(np.mean(np.all(i_ours == i_peer, axis=1)))
    same_sets = float(np.mean([set(a) == set(b) for a, b in zip(i_ours, i_peer, strict=True)]))
    print(f"  one k = {k_max} query (fit included): densitas {t_ours:.2f} s, scikit-learn {t_peer:.2f} s; "
          f"identical lists {same_lists:.4f}, identical sets {same_sets:.4f}")
    _answer_from(ours, d_ours, i_ours)
    _answer_from(peer, d_peer, i_peer)
    # scikit-learn's uniform brute-force predict computes its own neighbours (ArgKminClassMode) unless that
    # route is declined: declined here, its predict votes (scipy-style mode) on the lists of the one query
    usable = sk_cls.ArgKminClassMode.is_usable_for
    sk_cls.ArgKminClassMode.is_usable_for = classmethod(lambda cls, *a, **kw: False)
    try:
        rows = {}
        for k in range(1, k_max + 1):
            ours.set_params(n_neighbors=k)
            peer.set_params(n_neighbors=k)
            rows[k] = (ours.predict(Xte), peer.predict(Xte))
    finally:
        sk_cls.ArgKminClassMode.is_usable_for = usable
    print(f"  {'k':>3s} {'densitas acc':>13s} {'sklearn acc':>12s} {'identical':>10s}")
    for k, (p_ours, p_peer) in rows.items():
        print(f"  {k:3d} {np.mean(p_ours == yte):13.4f} {np.mean(p_peer == yte):12.4f} "
              f"{bool(np.array_equal(p_ours, p_peer))!s:>10s}")
    n_same = sum(bool(np.array_equal(a, b)) for a, b in rows.values())
    print(f"  identical predictions for {n_same} of {k_max} values of k")
    # the timed direct runs at k = 10: each library's estimator from scratch, its ordinary predict
    t0 = time.perf_counter()
    p_ours = KNeighborsClassifier(n_neighbors=10, device=device).fit(Xtr, ytr).predict(Xte)
    a = time.perf_counter() - t0
    t0 = time.perf_counter()
    p_peer = SkKNN(n_neighbors=10, algorithm="brute").fit(Xtr, ytr).predict(Xte)
    b = time.perf_counter() - t0
    print(f"  time of fit + predict at k = 10: densitas {a:.2f} s, scikit-learn {b:.2f} s ({b / a:.2f}×); "
          f"equal to the k = 10 row: densitas {bool(np.array_equal(p_ours, rows[10][0]))}, scikit-learn "
          f"{bool(np.array_equal(p_peer, rows[10][1]))}")


def fcm(d: dict[str, np.ndarray], iters: int, seed: int, device: str) -> None:
    from sklearn.metrics import adjusted_rand_score

    from densitas.cluster import FuzzyKMeans
    from densitas.cluster.steps import memberships

    X = d["train_x"].astype(np.float64) / 255.0
    y = d["train_y"]
    c = 10
    rng = np.random.default_rng(seed)
    C0 = X[rng.choice(len(X), c, replace=False)]
    print(f"\n2. Fuzzy c-means: {len(X):,} × 784, c = {c}, q = 2, float64, {iters} iterations from the same "
          f"{c} random rows (seed {seed})")

    def fit(n_iter: int) -> tuple[float, FuzzyKMeans]:
        t0 = time.perf_counter()
        est = FuzzyKMeans(c, n_nearest=c, fuzzifier=2.0, init=C0, max_iter=n_iter, tol=0, device=device).fit(X)
        return time.perf_counter() - t0, est

    fit(1)  # warm-up: kernels compiled, libraries loaded
    t_one, _ = fit(1)
    t_all, ours = fit(iters)
    t_ours = t_all / iters
    steady = (t_all - t_one) / max(iters - 1, 1)
    ari_ours = adjusted_rand_score(y, ours.labels_)
    print(f"  densitas FuzzyKMeans ({device}): {1e3 * t_ours:8.1f} ms / iteration (whole fit, the data's copy "
          f"included), steady {1e3 * steady:.1f} ms; ARI {ari_ours:.4f}")
    try:
        import skfuzzy
    except ImportError:
        print("  scikit-fuzzy not installed (pip install scikit-fuzzy): no peer")
        return
    D0 = np.maximum((X * X).sum(1)[:, None] - 2 * X @ C0.T + (C0 * C0).sum(1)[None], 0.0)
    u0 = memberships(D0, 2.0).T
    t0 = time.perf_counter()
    res = skfuzzy.cluster.cmeans(X.T, c, 2.0, error=0.0, maxiter=iters, init=u0)
    t_peer = (time.perf_counter() - t0) / iters
    C_peer, u_peer = res[0], res[1]
    ari_peer = adjusted_rand_score(y, u_peer.argmax(axis=0))
    diff = float(np.abs(C_peer - ours.cluster_centers_).max())
    print(f"  scikit-fuzzy cmeans:  {1e3 * t_peer:8.1f} ms / iteration, ARI {ari_peer:.4f}; densitas "
          f"{t_peer / t_ours:.1f}× faster; max |ΔC| {diff:.2e} (pixels scaled to [0, 1])")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DIR)
    ap.add_argument("--test", type=int, default=10_000, help="test queries for the k-NN part (of 10,000)")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--skip-knn", action="store_true")
    ap.add_argument("--skip-fcm", action="store_true")
    a = ap.parse_args()
    d = load(a.data)
    if not a.skip_fcm:
        fcm(d, a.iters, a.seed, a.device)
    if not a.skip_knn:
        knn(d, a.test, a.device)


if __name__ == "__main__":
    main()
