"""Host arrays to the device without waiting for the GPU.

A copy from pageable host memory first waits for everything queued on the stream, so a step that
copies its inputs that way cannot be launched while the previous step still runs. `to_device`
stages a CUDA copy through pinned memory (torch's caching host allocator; arrays that are pinned
already, such as plans read from the registered ring, go as they are) and copies asynchronously.
"""

from __future__ import annotations

import numpy as np
import torch


def pinned(array: np.ndarray) -> torch.Tensor:
    """The array as a CPU tensor in pinned memory (itself when it already is)."""
    host = torch.from_numpy(np.ascontiguousarray(array))
    return host if host.is_pinned() else host.pin_memory()


def to_device(array: np.ndarray, device: torch.device, dtype: torch.dtype | None = None) -> torch.Tensor:
    if device.type == "cuda":
        return pinned(array).to(device=device, dtype=dtype, non_blocking=True)
    return torch.from_numpy(np.ascontiguousarray(array)).to(device=device, dtype=dtype)
