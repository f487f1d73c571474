"""Device resolution: ``"auto" | "cpu" | "cuda" | "cuda:N" | torch.device``."""

from __future__ import annotations

import functools
import logging

import torch

from densitas.exceptions import DeviceError, InputError

log = logging.getLogger("densitas")

__all__ = ["DeviceLike", "cuda_available", "resolve_device", "sm_count"]

DeviceLike = str | torch.device | None


def cuda_available() -> bool:
    """Whether PyTorch sees at least one CUDA device."""
    return torch.cuda.is_available()


def resolve_device(device: DeviceLike = "auto", *tensors: torch.Tensor) -> torch.device:
    """Turn a device request into a :class:`torch.device`.

    ``"auto"`` (or None) keeps the device of the first CUDA tensor among ``tensors``; otherwise it picks
    ``cuda`` when a CUDA device is available and ``cpu`` if not. An explicit request that cannot be honoured
    raises :class:`DeviceError`.

    Examples
    --------
    >>> resolve_device("cpu")
    device(type='cpu')
    """
    if device is None or (isinstance(device, str) and device == "auto"):
        for t in tensors:
            if isinstance(t, torch.Tensor) and t.device.type == "cuda":
                return t.device
        if cuda_available():
            return torch.device("cuda", torch.cuda.current_device())
        log.debug("device='auto': no CUDA device, using the CPU")
        return torch.device("cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise InputError(
            f"The 'device' parameter must be 'auto', 'cpu', 'cuda' or 'cuda:N'. Got {device!r} instead."
        ) from exc
    if dev.type == "cpu":
        return dev
    if dev.type == "cuda":
        if not cuda_available():
            raise DeviceError(f"device={device!r} was requested but PyTorch sees no CUDA device.")
        index = torch.cuda.current_device() if dev.index is None else dev.index
        if index >= torch.cuda.device_count():
            raise DeviceError(
                f"device={device!r} was requested but only {torch.cuda.device_count()} CUDA device(s) exist."
            )
        return torch.device("cuda", index)
    raise InputError(f"The 'device' parameter must be 'auto', 'cpu', 'cuda' or 'cuda:N'. Got {device!r} instead.")


@functools.cache
def sm_count(device: torch.device) -> int:
    """The number of streaming multiprocessors of the CUDA ``device`` (cached: kernels size their grids with it).

    Examples
    --------
    >>> callable(sm_count)
    True
    """
    return torch.cuda.get_device_properties(device).multi_processor_count
