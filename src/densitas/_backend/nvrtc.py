"""CUDA C kernels compiled at run time through NVRTC (CuPy's ``RawModule``), for the few scatters that need
shared memory, which Triton does not expose. CuPy is an optional GPU dependency: every caller keeps a Triton
or PyTorch path for when it is missing, and the PyTorch reference stays the test oracle.

Examples
--------
>>> isinstance(available(), bool)
True
"""

from __future__ import annotations

import functools
import importlib.util
import warnings

import torch

__all__ = ["available", "launch", "max_shared_bytes", "module"]


@functools.cache
def available() -> bool:
    """Whether CuPy can be imported (kernels compile on first use).

    Examples
    --------
    >>> available() in (True, False)
    True
    """
    return importlib.util.find_spec("cupy") is not None


@functools.cache
def module(source: str):
    """The compiled ``cupy.RawModule`` of ``source`` (compiled once per process).

    Examples
    --------
    >>> callable(module)
    True
    """
    import cupy

    return cupy.RawModule(code=source, options=("--std=c++14",))


@functools.lru_cache(maxsize=16)
def _external_stream(ptr: int):
    """A CuPy view of a raw CUDA stream handle (CuPy 14 deprecates ``ExternalStream`` in favour of
    ``Stream.from_external``; either works for a raw handle)."""
    import cupy

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return cupy.cuda.ExternalStream(ptr)


def _torch_stream(device: torch.device):
    """PyTorch's current stream of ``device`` as a CuPy stream context (the legacy default stream explicitly, so
    that an enclosing CuPy stream context cannot move the launch off PyTorch's order)."""
    import cupy

    ptr = torch.cuda.current_stream(device).cuda_stream
    if ptr == 0:
        return cupy.cuda.Stream.null
    return _external_stream(ptr)


_OPTED_IN: dict[tuple[int, str, str], int] = {}  # (device, source, kernel) → the dynamic shared memory it may use


@functools.lru_cache(maxsize=64)
def _function(source: str, name: str):
    return module(source).get_function(name)


def _allow_shared(kernel, key: tuple[int, str, str], shared_mem: int) -> None:
    """Opt ``kernel`` in to ``shared_mem`` bytes of dynamic shared memory (beyond 48 KiB) on the current device
    (CuPy loads a kernel per device); never lowers it."""
    if shared_mem > max(48 * 1024, _OPTED_IN.get(key, 0)):
        kernel.max_dynamic_shared_size_bytes = shared_mem
        _OPTED_IN[key] = shared_mem


def launch(source: str, name: str, device: torch.device, grid: tuple[int, ...], block: tuple[int, ...],
           args: tuple, shared_mem: int = 0) -> None:
    """Launch kernel ``name`` of ``source`` on PyTorch's current stream of ``device``. Tensor arguments are passed
    as their device addresses (``None`` as a null pointer), others as they are (NumPy scalars of the kernel's
    parameter types: ``np.int32``, ``np.float32``, …).

    Examples
    --------
    >>> callable(launch)
    True
    """
    import cupy

    index = device.index if device.index is not None else torch.cuda.current_device()
    kernel = _function(source, name)
    conv = tuple(a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args)
    with cupy.cuda.Device(index), _torch_stream(device):
        _allow_shared(kernel, (index, source, name), shared_mem)
        kernel(grid, block, conv, shared_mem=shared_mem)


def max_shared_bytes(device: torch.device) -> int:
    """The dynamic shared memory one block of ``device`` may opt in to (227 KiB on an H100/H200, 99 KiB on an
    L4).

    Examples
    --------
    >>> callable(max_shared_bytes)
    True
    """
    props = torch.cuda.get_device_properties(device)
    return int(getattr(props, "shared_memory_per_block_optin", 48 * 1024))
