"""Which device a loader delivers to: ``"auto"``, the CPU, or a CUDA device that must be visible."""

from __future__ import annotations

import os

import torch

from dali_alchemi.errors import ConfigError, DeviceError

__all__ = ["resolve_device"]


def resolve_device(device: str | torch.device) -> torch.device:
    """``"auto"`` -> CUDA when a GPU is visible, else CPU; a CUDA device without a GPU is an error.

    Under ``torchrun`` (``LOCAL_RANK`` set) ``"auto"`` picks this process's own GPU, ``cuda:LOCAL_RANK``.

    Raises
    ------
    DeviceError
        If a CUDA device is asked for and none is visible.
    ConfigError
        If ``device`` is neither ``"auto"``, a CPU nor a CUDA device.
    """
    if isinstance(device, str) and device == "auto":
        if not torch.cuda.is_available():
            return torch.device("cpu")
        local_rank = os.environ.get("LOCAL_RANK")
        index = int(local_rank) % torch.cuda.device_count() if local_rank is not None else torch.cuda.current_device()
        return torch.device("cuda", index)
    resolved = torch.device(device)
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise DeviceError(f"device={device!r} needs a CUDA GPU, and none is visible (use device='cpu' or 'auto')")
        return torch.device("cuda", resolved.index if resolved.index is not None else torch.cuda.current_device())
    if resolved.type != "cpu":
        raise ConfigError(f"device must be 'auto', 'cpu' or a CUDA device, got {device!r}")
    return resolved
