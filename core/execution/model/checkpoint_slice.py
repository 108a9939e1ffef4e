"""CheckpointSlice: which part of a checkpoint tensor this rank holds, and where it goes.

Each sharded layer describes, for every checkpoint tensor it is built from, the slice of that tensor
this rank holds and where it goes in the layer's parameter. The loader (loader.py) is then one
generic loop: look the name up, read the slice straight from the file, copy it in.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class CheckpointSlice:
    """Rows or columns [start, start + length) along `dim` of a checkpoint tensor of shape
    `full_shape`, copied into the parameter at `dest_offset` along the same dim."""

    full_shape: tuple[int, ...]
    dim: int = 0
    start: int = 0
    length: int | None = None  # None: the whole tensor, unsharded
    dest_offset: int = 0

    def read(self, tensor_slice) -> torch.Tensor:
        """Read this slice from a safetensors slice object or a full tensor."""
        if self.length is None:
            return tensor_slice[:]
        index = [slice(None)] * len(self.full_shape)
        index[self.dim] = slice(self.start, self.start + self.length)
        return tensor_slice[tuple(index)]

    def destination(self, param: torch.Tensor) -> torch.Tensor:
        if self.length is None:
            return param
        return param.narrow(self.dim, self.dest_offset, self.length)


# Checkpoint tensor name -> (the parameter it fills, relative to the module that answers, and how).
SliceMap = dict[str, tuple[str, CheckpointSlice]]
