"""LSCV_h on the CPU: the pair-distance histogram search against the exact grid-and-zoom passes, one run.

    PYTHONPATH=src python benchmarks/bench_lscv_search.py
"""

import time

import numpy as np

from densitas.kde import bandwidth, lscv_objective, pairhist


def timed_lscv_h(x: np.ndarray) -> tuple[float, np.ndarray]:
    t0 = time.perf_counter()
    h = bandwidth(x, "lscv_h", device="cpu")
    return time.perf_counter() - t0, h


if __name__ == "__main__":
    rng = np.random.default_rng(0)
    for n in (4000, 10000):
        X = rng.normal(size=(n, 16))
        t_hist, H1 = timed_lscv_h(X)
        pairhist.HISTOGRAM_DEVICES = ()
        t_exact, H0 = timed_lscv_h(X)
        pairhist.HISTOGRAM_DEVICES = ("cpu",)
        v1, v0 = lscv_objective(X, H1, device="cpu"), lscv_objective(X, H0, device="cpu")
        print(f"lscv_h CPU n={n} d=16: histogram {t_hist:.2f} s, exact grid+zoom {t_exact:.2f} s, "
              f"ratio {t_exact / t_hist:.1f}x, h rel diff {abs(H1[0, 0] - H0[0, 0]) / H0[0, 0] / 2:.1e}, "
              f"LSCV hist {v1:.10e} exact {v0:.10e}", flush=True)
