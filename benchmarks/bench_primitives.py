"""Primitives side by side with their PyTorch (CUDA) or NumPy (CPU) equivalents, in one run.

    PYTHONPATH=src python benchmarks/bench_primitives.py                  # CUDA if present, else CPU
    PYTHONPATH=src python benchmarks/bench_primitives.py --device cpu --log2n 24

Prints one table: time, GB/s (bytes that must move, counted per row), ratio peer/densitas (> 1: densitas
faster), and the max relative difference from the peer's answer. ``--json FILE`` writes the rows too.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np
import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _timing import bench

from densitas import primitives as P
from densitas._backend.dispatch import select, use_backend


def rel(a, b) -> float:
    a = torch.as_tensor(np.asarray(a.cpu() if isinstance(a, torch.Tensor) else a), dtype=torch.float64)
    b = torch.as_tensor(np.asarray(b.cpu() if isinstance(b, torch.Tensor) else b), dtype=torch.float64)
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))


def rows_for(dev: torch.device, log2n: int, sat_side: int, quick: bool):
    n = 1 << log2n
    g = torch.Generator(device=dev).manual_seed(0)
    x = torch.rand(n, device=dev, generator=g, dtype=torch.float32)
    gpu = dev.type == "cuda"
    xn = None if gpu else x.numpy()
    rows = []

    def add(name, ours, peer, nbytes=None, items=None, check=None, peer_name=""):
        t_ours = bench(ours, dev)
        t_peer = bench(peer, dev)
        err = check() if check else float("nan")
        rows.append(dict(name=name, ours_ms=t_ours * 1e3, peer=peer_name, peer_ms=t_peer * 1e3,
                         ratio=t_peer / t_ours, gbs=(nbytes / t_ours / 1e9) if nbytes else None,
                         peer_gbs=(nbytes / t_peer / 1e9) if nbytes else None,
                         gkeys=(items / t_ours / 1e9) if items else None, err=err,
                         backend=select(_OPS[name.split()[0]], dev)[0]))

    # reduce
    if gpu:
        add("reduce sum f32", lambda: P.reduce(x), lambda: torch.sum(x), 4 * n,
            check=lambda: abs(float(P.reduce(x)) - float(x.double().sum())) / float(x.double().sum()),
            peer_name="torch.sum")
    else:
        add("reduce sum f32", lambda: P.reduce(x), lambda: np.sum(xn), 4 * n,
            check=lambda: abs(float(P.reduce(x)) - float(x.double().sum())) / float(x.double().sum()),
            peer_name="np.sum")
    # scan
    if gpu:
        add("scan sum f32", lambda: P.scan(x), lambda: torch.cumsum(x, 0), 8 * n,
            check=lambda: rel(P.scan(x), torch.cumsum(x.double(), 0)), peer_name="torch.cumsum")
    else:
        add("scan sum f32", lambda: P.scan(x), lambda: np.cumsum(xn), 8 * n,
            check=lambda: rel(P.scan(x), np.cumsum(xn.astype(np.float64))), peer_name="np.cumsum")
    # compaction at 50% density: read x (4n) + mask (n), write n/2 values (2n)
    mask = x < 0.5
    if gpu:
        add("compact 50%", lambda: P.compact(x, mask), lambda: x[mask], 7 * n,
            check=lambda: rel(P.compact(x, mask), x[mask]), peer_name="x[mask]")
    else:
        mn = mask.numpy()
        add("compact 50%", lambda: P.compact(x, mask), lambda: xn[mn], 7 * n,
            check=lambda: rel(P.compact(x, mask), xn[mn]), peer_name="x[mask]")
    # linear binning onto 4096 grid points
    def lb_peer():
        t = x.double() * 4095
        i = t.floor().clamp(0, 4094).long()
        f = t - i
        return torch.bincount(i, 1 - f, minlength=4096) + torch.bincount(i + 1, f, minlength=4096)

    def lb_np():
        t = xn.astype(np.float64) * 4095
        i = np.clip(np.floor(t), 0, 4094).astype(np.int64)
        f = t - i
        return np.bincount(i, 1 - f, minlength=4096) + np.bincount(i + 1, f, minlength=4096)

    add("histogram linear 4096", lambda: P.histogram(x, 4096, (0.0, 1.0), linear=True),
        lb_peer if gpu else lb_np, 4 * n,
        check=lambda: rel(P.histogram(x, 4096, (0.0, 1.0), linear=True)[0], lb_peer()),
        peer_name="2× bincount" if gpu else "2× np.bincount")
    add("histogram 4096 bins", lambda: P.histogram(x, 4096, (0.0, 1.0)),
        (lambda: torch.histc(x, 4096, 0, 1)) if gpu else (lambda: np.histogram(xn, 4096, (0.0, 1.0))), 4 * n,
        check=lambda: rel(P.histogram(x, 4096, (0.0, 1.0))[0], np.histogram(x.cpu().numpy(), 4096, (0, 1))[0]),
        peer_name="torch.histc" if gpu else "np.histogram")
    # reduce_by_key, 1000 keys, int32 keys + float32 values
    keys = torch.randint(0, 1000, (n,), device=dev, generator=g, dtype=torch.int32)
    if gpu:
        def rbk_peer():
            return torch.zeros(1000, device=dev).index_add_(0, keys, x)
        add("reduce_by_key 1000", lambda: P.reduce_by_key(keys, x, num_keys=1000), rbk_peer, 8 * n,
            check=lambda: rel(P.reduce_by_key(keys, x, num_keys=1000),
                              torch.zeros(1000, device=dev, dtype=torch.float64).index_add_(0, keys, x.double())),
            peer_name="index_add_")
    else:
        kn = keys.numpy()
        add("reduce_by_key 1000", lambda: P.reduce_by_key(keys, x, num_keys=1000),
            lambda: np.bincount(kn, xn, minlength=1000), 8 * n,
            check=lambda: rel(P.reduce_by_key(keys, x, num_keys=1000), np.bincount(kn, xn, minlength=1000)),
            peer_name="np.bincount")
    # summed-area table
    a = torch.rand(sat_side, sat_side, device=dev, generator=g)
    if gpu:
        add(f"summed_area_table {sat_side}²", lambda: P.summed_area_table(a),
            lambda: torch.cumsum(torch.cumsum(a, 0), 1), 8 * a.numel(),
            check=lambda: rel(P.summed_area_table(a), torch.cumsum(torch.cumsum(a.double(), 0), 1)),
            peer_name="cumsum∘cumsum")
    else:
        an = a.numpy()
        add(f"summed_area_table {sat_side}²", lambda: P.summed_area_table(a),
            lambda: np.cumsum(np.cumsum(an, 0), 1), 8 * a.numel(),
            check=lambda: rel(P.summed_area_table(a), np.cumsum(np.cumsum(an.astype(np.float64), 0), 1)),
            peer_name="np.cumsum∘cumsum")
    # sort: 2^(log2n-2) int32 keys
    ks = torch.randint(-(2**31), 2**31 - 1, (n // 4,), device=dev, generator=g, dtype=torch.int32)
    if gpu:
        add("radix_sort int32 (auto)", lambda: P.radix_sort(ks), lambda: torch.sort(ks, stable=True), items=n // 4,
            check=lambda: rel(P.radix_sort(ks), torch.sort(ks).values), peer_name="torch.sort")
        if not quick:
            small = ks[: 1 << 22]
            with use_backend("triton"):
                t_split = bench(lambda: P.radix_sort(small), dev)
            t_lib = bench(lambda: torch.sort(small, stable=True), dev)
            rows.append(dict(name="radix_sort 2^22 split (doc 002)", ours_ms=t_split * 1e3, peer="torch.sort",
                             peer_ms=t_lib * 1e3, ratio=t_lib / t_split, gbs=None, peer_gbs=None,
                             gkeys=(1 << 22) / t_split / 1e9, err=float("nan"), backend="triton"))
    else:
        ksn = ks.numpy()
        add("radix_sort int32", lambda: P.radix_sort(ks), lambda: np.sort(ksn, kind="stable"), items=n // 4,
            check=lambda: rel(P.radix_sort(ks), np.sort(ksn)), peer_name="np.sort stable")
    return rows


_OPS = {k: k for k in ("reduce", "scan", "compact", "histogram", "reduce_by_key", "summed_area_table")} | {
    "radix_sort": "argsort"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="auto")
    ap.add_argument("--log2n", type=int, default=None, help="elements: 2^log2n (default 30 on CUDA, 24 on CPU)")
    ap.add_argument("--sat", type=int, default=None, help="summed-area table side (default 16384 CUDA, 4096 CPU)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    dev = torch.device("cuda" if (args.device == "auto" and torch.cuda.is_available()) else
                       ("cpu" if args.device == "auto" else args.device))
    log2n = args.log2n or (30 if dev.type == "cuda" else 24)
    sat = args.sat or (16384 if dev.type == "cuda" else 4096)
    rows = rows_for(dev, log2n, sat, args.quick)
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else f"CPU ({torch.get_num_threads()} threads)"
    print(f"\nprimitives on {name}, n = 2^{log2n}, torch {torch.__version__}")
    hdr = f"{'operation':34s} {'backend':7s} {'densitas ms':>11s} {'GB/s':>7s} {'peer':>16s} {'peer ms':>9s} " \
          f"{'peer GB/s':>9s} {'ratio':>6s} {'max rel err':>11s}"
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        gbs = f"{r['gbs']:7.0f}" if r["gbs"] else (f"{r['gkeys']:5.2f}Gk" if r["gkeys"] else "      -")
        pg = f"{r['peer_gbs']:9.0f}" if r["peer_gbs"] else "        -"
        print(f"{r['name']:34s} {r['backend']:7s} {r['ours_ms']:11.3f} {gbs:>7s} {r['peer']:>16s} "
              f"{r['peer_ms']:9.3f} {pg} {r['ratio']:6.2f} {r['err']:11.2e}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(dict(device=name, log2n=log2n, rows=rows), fh, indent=1)


if __name__ == "__main__":
    main()
