"""The device a model is loaded on: checked before anything is loaded, with one clear error."""

from __future__ import annotations

import torch

from ..errors import DeviceError


def _backend_available(kind: str) -> tuple[bool, int | None]:
    """Whether torch can use devices of ``kind`` here, and how many there are (None: unknown)."""
    if kind == "mps":
        backend = getattr(torch.backends, "mps", None)
        return bool(backend is not None and backend.is_available()), 1
    backend = getattr(torch, kind, None)  # torch.cuda, torch.xpu, ...
    if backend is None or not hasattr(backend, "is_available"):
        return False, None
    available = bool(backend.is_available())
    count = int(backend.device_count()) if available and hasattr(backend, "device_count") else None
    return available, count


def resolve_device(device: str | int | torch.device) -> torch.device:
    """``device`` (a string such as 'cpu', 'cuda', 'cuda:1', or a torch.device) if this machine has it."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise DeviceError(f"unknown device {device!r}: use 'cpu', 'cuda', 'cuda:1', 'mps', ...") from None
    if dev.type == "cpu":
        return dev
    if dev.type == "meta":
        raise DeviceError("device 'meta' holds no weights and cannot decode; use 'cpu' or a GPU")
    available, count = _backend_available(dev.type)
    if not available:
        raise DeviceError(f"device {str(device)!r} is not available on this machine (torch {torch.__version__} "
                          f"finds no {dev.type} device); use 'cpu'")
    if dev.index is not None and count is not None and dev.index >= count:
        raise DeviceError(f"device {str(device)!r} does not exist: this machine has {count} {dev.type} "
                          f"device(s), {dev.type}:0 to {dev.type}:{count - 1}")
    return dev
