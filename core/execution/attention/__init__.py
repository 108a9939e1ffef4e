"""Attention backends behind one interface (backend.py), registered by name in core/registry.py
ATTENTION_BACKENDS: `reference` (torch, any device) and `triton` (Triton kernels; CUDA, or the CPU
under TRITON_INTERPRET=1)."""

from __future__ import annotations

import torch

from core.execution.attention.backend import AttentionBackend
from core.execution.registry import registered_class
from core.registry import ATTENTION_BACKENDS, AUTO_ATTENTION_BACKENDS


def make_backend(name: str, device: torch.device | str) -> AttentionBackend:
    """The attention backend called `name` for a model on `device`; "auto": the device's default.
    Imported here, on first use: triton is only needed (and only installed) where its backend runs."""
    device = torch.device(device)
    if name == "auto":
        name = AUTO_ATTENTION_BACKENDS[device.type]
    return registered_class(ATTENTION_BACKENDS, name, "attention backend")(device)
