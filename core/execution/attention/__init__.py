"""Attention backends behind one interface (backend.py): `reference` (torch, any device) and
`triton` (Triton kernels; CUDA, or the CPU under TRITON_INTERPRET=1)."""

from __future__ import annotations

import torch

from core.execution.attention.backend import AttentionBackend

BACKENDS = ("reference", "triton")


def make_backend(name: str, device: torch.device | str) -> AttentionBackend:
    """The attention backend called `name` for a model on `device`."""
    if name == "reference":
        from core.execution.attention.reference import ReferenceAttention

        return ReferenceAttention()
    if name == "triton":
        # Imported here: triton is only needed (and only installed) where this backend runs.
        from core.execution.attention.triton_backend import TritonAttention

        return TritonAttention(device)
    raise ValueError(f"unknown attention backend {name!r}: use one of {', '.join(BACKENDS)}")
