"""``densitas demo``: the primitives on generated data, checked against NumPy, timed side by side.

(The approximate-query issue turns the demo into the main job on an embedded DuckDB file.)
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

import densitas
from densitas import primitives as P
from densitas._backend.device import resolve_device
from densitas._backend.dispatch import backend_setting, select

# a fixed minimum width so that tables are not folded when output is piped or captured
console = Console(width=max(Console().width, 120))


def _time(fn: Callable[[], object], device: torch.device, reps: int = 3) -> float:
    fn()
    best = float("inf")
    for _ in range(reps):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - t0)
    return best


def _close(a, b, rtol: float) -> bool:
    a = np.asarray(a.cpu() if isinstance(a, torch.Tensor) else a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    return a.shape == b.shape and bool(np.all(np.abs(a - b) <= rtol * (np.abs(b).max() + 1)))


def run(size: int, device: str = "auto", seed: int = 0) -> bool:
    dev = resolve_device(device)
    rng = np.random.default_rng(seed)
    x_np = rng.lognormal(0.0, 1.0, size).astype(np.float32)
    keys_np = rng.integers(0, 1000, size).astype(np.int32)
    mask_np = x_np < np.median(x_np)
    side = max(int(np.sqrt(size)), 1)
    img_np = rng.random((side, side), dtype=np.float32)
    x, keys, mask, img = (torch.from_numpy(a).to(dev) for a in (x_np, keys_np, mask_np, img_np))
    hi = float(np.quantile(x_np, 0.99))

    cases = [
        ("reduce (sum)", lambda: P.reduce(x), lambda: np.sum(x_np, dtype=np.float64), 1e-6),
        ("scan (inclusive sum)", lambda: P.scan(x), lambda: np.cumsum(x_np.astype(np.float64)), 1e-5),
        ("compact (50%)", lambda: P.compact(x, mask), lambda: x_np[mask_np], 0.0),
        ("radix_sort (float32)", lambda: P.radix_sort(x), lambda: np.sort(x_np, kind="stable"), 0.0),
        ("histogram (256 bins)", lambda: P.histogram(x, 256, (0.0, hi))[0],
         lambda: np.histogram(x_np.astype(np.float64), 256, (0.0, hi))[0], 0.0),
        ("linear binning (401 pts)", lambda: P.histogram(x, 401, (0.0, hi), linear=True)[0], None, 1e-9),
        ("reduce_by_key (1000 keys)", lambda: P.reduce_by_key(keys, x, num_keys=1000),
         lambda: np.bincount(keys_np, x_np.astype(np.float64), minlength=1000), 1e-5),
        (f"summed_area_table ({side}²)", lambda: P.summed_area_table(img),
         lambda: np.cumsum(np.cumsum(img_np.astype(np.float64), 0), 1), 1e-5),
    ]

    def linbin_np():
        t = x_np.astype(np.float64)
        t = t[t <= hi] / (hi / 400)
        i = np.minimum(np.floor(t), 399).astype(np.int64)
        f = t - i
        return np.bincount(i, 1 - f, minlength=401) + np.bincount(i + 1, f, minlength=401)

    table = Table(title=f"densitas {densitas.__version__} primitives · n = {size:,} · device {dev} · "
                        f"backend {backend_setting()}")
    for col in ("operation", "backend", "densitas ms", "NumPy ms", "speed-up", "matches NumPy"):
        table.add_column(col, justify="left" if col in ("operation", "backend") else "right")
    all_ok = True
    op_names = ["reduce", "scan", "compact", "argsort", "histogram", "histogram", "reduce_by_key",
                "summed_area_table"]
    for (name, ours, ref, tol), op in zip(cases, op_names, strict=True):
        ref = ref or linbin_np
        t_ours = _time(ours, dev)
        t_ref = _time(ref, torch.device("cpu"))
        ok = _close(ours(), ref(), tol)
        all_ok &= ok
        table.add_row(name, select(op, dev)[0], f"{t_ours * 1e3:.2f}", f"{t_ref * 1e3:.2f}",
                      f"{t_ref / t_ours:.2f}×", "[green]yes[/green]" if ok else "[red]NO[/red]")
    console.print(table)
    console.print("All results match NumPy." if all_ok else "[red]Some results differ from NumPy.[/red]")
    return all_ok


def info() -> None:
    dev = resolve_device("auto")
    table = Table(title=f"densitas {densitas.__version__} · torch {torch.__version__}")
    table.add_column("operation")
    table.add_column(f"backend on {dev}")
    for op in ("reduce", "scan", "segmented_scan", "reduce_by_key", "compact", "argsort", "histogram",
               "summed_area_table"):
        table.add_row(op, select(op, dev)[0])
    console.print(table)
