"""Memory budget and chunk planning, so that operations stay bounded whatever the input size."""

from __future__ import annotations

import os
import re

import torch

from densitas.exceptions import InputError

__all__ = ["memory_budget", "parse_bytes", "plan_chunks"]

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_bytes(value: str | int) -> int:
    """Parse ``"512MB"``, ``"2GiB"``, ``"1e9"`` or an int into a number of bytes.

    Examples
    --------
    >>> parse_bytes("2GiB")
    2147483648
    """
    if isinstance(value, int) and not isinstance(value, bool):
        if value <= 0:
            raise InputError(f"A memory budget must be positive. Got {value!r} instead.")
        return value
    m = re.fullmatch(r"\s*([0-9.eE+]+)\s*([a-zA-Z]*)\s*", str(value))
    if not m or m.group(2).lower() not in _UNITS:
        raise InputError(f"Cannot read a byte size from {value!r}; use e.g. '512MB' or '2GiB'.")
    try:
        n = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    except ValueError as exc:
        raise InputError(f"Cannot read a byte size from {value!r}; use e.g. '512MB' or '2GiB'.") from exc
    if n <= 0:
        raise InputError(f"A memory budget must be positive. Got {value!r} instead.")
    return n


def _available_ram() -> int:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES"))


def memory_budget(device: torch.device | str = "cpu") -> int:
    """Bytes an operation may use for its working set on ``device``.

    ``DENSITAS_MEMORY_BUDGET`` (e.g. ``"2GiB"``) wins; otherwise half the free memory of a CUDA device (counting
    what PyTorch's caching allocator holds unused), or a quarter of the available RAM for the CPU.
    """
    env = os.environ.get("DENSITAS_MEMORY_BUDGET")
    if env:
        return parse_bytes(env)
    dev = torch.device(device)
    if dev.type == "cuda":
        free, _total = torch.cuda.mem_get_info(dev)
        # memory PyTorch's caching allocator holds but no tensor uses is free to this process too (without it, a
        # second call after a large first one sees a fraction of the device and takes a slower path)
        cached = torch.cuda.memory_reserved(dev) - torch.cuda.memory_allocated(dev)
        return max((free + cached) // 2, 1 << 20)
    return max(_available_ram() // 4, 1 << 20)


def plan_chunks(n: int, bytes_per_item: int, *, budget: int | str | None = None,
                device: torch.device | str = "cpu", align: int = 1) -> list[slice]:
    """Split ``range(n)`` into contiguous slices whose working set fits the memory budget.

    Parameters
    ----------
    n : int
        Number of items (rows, queries, ...).
    bytes_per_item : int
        Working-set bytes one item needs.
    budget : int or str, optional
        Bytes available; defaults to :func:`memory_budget` of ``device``.
    align : int
        Chunk lengths are multiples of ``align`` (except the last), e.g. a kernel's tile size.

    Examples
    --------
    >>> plan_chunks(10, 100, budget=400)
    [slice(0, 4, None), slice(4, 8, None), slice(8, 10, None)]
    """
    if n < 0:
        raise InputError(f"'n' must be ≥ 0. Got {n!r} instead.")
    if bytes_per_item <= 0:
        raise InputError(f"'bytes_per_item' must be positive. Got {bytes_per_item!r} instead.")
    if align < 1:
        raise InputError(f"'align' must be ≥ 1. Got {align!r} instead.")
    cap = parse_bytes(budget) if budget is not None else memory_budget(device)
    per = max(cap // bytes_per_item, 1)
    per = max((per // align) * align, align)
    return [slice(i, min(i + per, n)) for i in range(0, n, per)]
