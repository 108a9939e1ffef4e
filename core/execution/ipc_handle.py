"""A CUDA IPC handle of a tensor as JSON, for the TP rendezvous store: no pickle.

torch.multiprocessing shares a CUDA tensor as `rebuild_cuda_tensor(*args)`, args of plain values
(bytes of the handle, sizes, offsets, flags), a dtype and two classes. The store is a TCP server
other processes could write to, so what is read from it must not be able to run code: the args
travel as JSON, the classes by name from a fixed list, and only that one rebuild function is ever
called. Both ends run the same torch, so the args mean the same on both.
"""

from __future__ import annotations

import json

import torch
from torch.multiprocessing.reductions import rebuild_cuda_tensor, reduce_tensor

# The classes torch names in a CUDA tensor's handle: the tensor's, and its storage's (typed in torch 2.x).
_CLASSES = {f"{c.__module__}.{c.__qualname__}": c
            for c in (torch.Tensor, torch.UntypedStorage, torch.storage.TypedStorage)}


def share(tensor: torch.Tensor) -> bytes:
    """The CUDA tensor's IPC handle, as bytes for the store."""
    rebuild, args = reduce_tensor(tensor)
    if rebuild is not rebuild_cuda_tensor:
        raise ValueError(f"torch shares this tensor with {rebuild.__name__}, not rebuild_cuda_tensor")
    return json.dumps([_encode(arg) for arg in args]).encode()


def open_shared(handle: bytes) -> torch.Tensor:
    """The tensor another process shared with `share`, mapped into this one."""
    return rebuild_cuda_tensor(*(_decode(arg) for arg in json.loads(handle)))


def _encode(value):
    if isinstance(value, bytes):
        return {"bytes": value.hex()}
    if isinstance(value, torch.dtype):
        return {"dtype": str(value).removeprefix("torch.")}
    if isinstance(value, type):
        name = f"{value.__module__}.{value.__qualname__}"
        if name not in _CLASSES:
            raise ValueError(f"cannot share a tensor of class {name}")
        return {"class": name}
    if isinstance(value, (tuple, list)):  # torch.Size too
        return [_encode(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"cannot put a {type(value).__name__} into an IPC handle")


def _decode(value):
    if isinstance(value, list):
        return tuple(_decode(v) for v in value)
    if not isinstance(value, dict):
        return value
    if "bytes" in value:
        return bytes.fromhex(value["bytes"])
    if "dtype" in value:
        dtype = getattr(torch, value["dtype"], None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"not a dtype: {value['dtype']!r}")
        return dtype
    if value.get("class") in _CLASSES:
        return _CLASSES[value["class"]]
    raise ValueError(f"not part of an IPC handle: {value!r}")
