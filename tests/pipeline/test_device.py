"""Device resolution: "auto", the CPU, and a CUDA device only where one is visible."""

from __future__ import annotations

import pytest
import torch

from dali_alchemi.errors import DeviceError
from dali_alchemi.pipeline.device import resolve_device


def test_device_resolution() -> None:
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(DeviceError, match="needs a CUDA GPU"):
            resolve_device("cuda")
    with pytest.raises(ValueError, match="device must be"):
        resolve_device("meta")
