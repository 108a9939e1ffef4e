"""Fill a model's parameters: from a Hugging Face safetensors checkpoint, or with dummy weights.

A checkpoint is one `model.safetensors` or shards listed in `model.safetensors.index.json`. Each rank
reads only its slice of each tensor, straight from the file (safetensors slices, never the whole
tensor), casts it to its parameter's dtype and copies it into place. Dummy weights generate every
checkpoint tensor in its full shape on the target device from (seed, tensor name) and then take the
same slices, so a TP=2 dummy model holds exactly the TP=1 weights split in two.
"""

from __future__ import annotations

import json
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open
from tqdm import tqdm

from core.execution.model.checkpoint_slice import CheckpointSlice, SliceMap

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded; the message names the file and the tensor."""


def checkpoint_files(directory: str | Path) -> dict[str, Path]:
    """Map every tensor name of the checkpoint in `directory` to the file that holds it."""
    directory = Path(directory)
    index_file = directory / "model.safetensors.index.json"
    if index_file.is_file():
        try:
            weight_map = json.loads(index_file.read_text())["weight_map"]
            if not isinstance(weight_map, dict):
                raise TypeError(f"weight_map is a {type(weight_map).__name__}, not an object")
        except (OSError, json.JSONDecodeError, KeyError, TypeError) as exc:
            raise CheckpointError(f"cannot read the shard index {index_file}: {exc!r}") from exc
        files = {name: directory / file for name, file in weight_map.items()}
        for path in sorted(set(files.values())):
            if not path.is_file():
                raise CheckpointError(
                    f"shard {path.name} listed in {index_file.name} is missing from {directory}"
                )
        return files
    single = directory / "model.safetensors"
    if single.is_file():
        return dict.fromkeys(_tensor_names(single), single)
    shards = sorted(directory.glob("*.safetensors"))
    if not shards:
        raise CheckpointError(f"{directory} holds no safetensors checkpoint (model.safetensors or shards)")
    files = {}
    for shard in shards:
        files.update(dict.fromkeys(_tensor_names(shard), shard))
    return files


def _tensor_names(path: Path) -> list[str]:
    try:
        with safe_open(str(path), framework="pt") as f:
            return list(f.keys())
    except Exception as exc:  # safetensors raises several types for a damaged file
        raise CheckpointError(f"cannot read checkpoint file {path}: {exc}") from exc


def load_checkpoint(model: torch.nn.Module, directory: str | Path, show_progress: bool = True) -> None:
    """Load this rank's slices of the checkpoint in `directory` into `model`."""
    wanted: SliceMap = model.checkpoint_slices()
    files = checkpoint_files(directory)
    missing = sorted(set(wanted) - set(files))
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise CheckpointError(f"checkpoint {directory} is missing tensor {missing[0]}{more}")
    unexpected = sorted(set(files) - set(wanted) - _ignorable(model, files))
    if unexpected:
        more = f" (and {len(unexpected) - 1} more)" if len(unexpected) > 1 else ""
        raise CheckpointError(f"checkpoint {directory} has unexpected tensor {unexpected[0]}{more}")
    params = dict(model.named_parameters(remove_duplicate=False))
    by_file: dict[Path, list[str]] = {}
    for name in wanted:
        by_file.setdefault(files[name], []).append(name)
    # A bar on a terminal only: in a log file its redraws would be noise (the runner logs the phase).
    progress = tqdm(total=len(wanted), desc="loading weights", unit="tensor",
                    disable=not show_progress or not sys.stderr.isatty())
    with torch.no_grad():
        for path, names in sorted(by_file.items()):
            try:
                handle = safe_open(str(path), framework="pt")
            except Exception as exc:
                raise CheckpointError(f"cannot read checkpoint file {path}: {exc}") from exc
            with handle as f:
                for name in names:
                    param_name, spec = wanted[name]
                    try:
                        tensor_slice = f.get_slice(name)
                        shape = tuple(tensor_slice.get_shape())
                    except Exception as exc:
                        raise CheckpointError(f"cannot read tensor {name} from {path}: {exc}") from exc
                    if shape != spec.full_shape:
                        raise CheckpointError(
                            f"tensor {name} in {path.name} has shape {shape}, expected {spec.full_shape}"
                        )
                    _copy_into(params[param_name], spec, spec.read(tensor_slice))
                    progress.update()
    progress.close()


def _ignorable(model: torch.nn.Module, files: dict[str, Path]) -> set[str]:
    # Tied checkpoints sometimes store lm_head.weight too, a copy of the embedding.
    if getattr(model.config, "tie_word_embeddings", False):
        return {"lm_head.weight"}
    return set()


def dummy_tensors(model: torch.nn.Module, seed: int, device: torch.device | str,
                  dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
    """Every checkpoint tensor of the model in its full shape, random but fixed by (seed, name)."""
    for name, (_, spec) in model.checkpoint_slices().items():
        yield name, dummy_tensor(name, spec.full_shape, seed, device, dtype)


def dummy_tensor(name: str, shape: tuple[int, ...], seed: int, device: torch.device | str,
                 dtype: torch.dtype) -> torch.Tensor:
    generator = torch.Generator(device=device)
    generator.manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % (2**63))
    values = torch.randn(shape, generator=generator, device=device, dtype=torch.float32)
    if name.endswith("norm.weight"):
        # Norm gains near one keep activations of a random deep model in a sane range.
        values = 1.0 + 0.1 * values
    else:
        values = 0.02 * values
    return values.to(dtype)


def load_dummy(model: torch.nn.Module, seed: int, device: torch.device | str, dtype: torch.dtype) -> None:
    """Fill `model` with the dummy tensors, drawn in `dtype` and cast to each parameter's."""
    wanted = model.checkpoint_slices()
    params = dict(model.named_parameters(remove_duplicate=False))
    with torch.no_grad():
        for name, full in dummy_tensors(model, seed, device, dtype):
            param_name, spec = wanted[name]
            _copy_into(params[param_name], spec, spec.read(full))
            del full


def _copy_into(param: torch.Tensor, spec: CheckpointSlice, values: torch.Tensor) -> None:
    # The parameter's dtype, not the model's: a quantized weight keeps its own (LinearMethod).
    destination = spec.destination(param.data)
    if tuple(destination.shape) != tuple(values.shape):
        raise CheckpointError(f"slice of shape {tuple(values.shape)} does not fit {tuple(destination.shape)}")
    destination.copy_(values.to(param.dtype), non_blocking=True)
