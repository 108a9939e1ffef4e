"""load_checkpoint: every kind of bad checkpoint is refused with its own message naming the tensor or
file, and the good layouts (sharded, tied with a stored lm_head) load the same weights."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from tiny_models import build_tiny_checkpoint

from core.config import ModelConfig
from core.execution.distributed import TPGroup
from core.execution.model.loader import CheckpointError, load_checkpoint
from core.execution.model.qwen3 import Qwen3ForCausalLM

UP_PROJ = "model.layers.0.mlp.up_proj.weight"


@pytest.fixture(scope="module")
def saved_checkpoints(tmp_path_factory):
    """One untied and one tied tiny checkpoint, built once; tests copy them before damaging them."""
    untied, tied = tmp_path_factory.mktemp("untied"), tmp_path_factory.mktemp("tied")
    build_tiny_checkpoint(untied, tie=False, seed=4)
    build_tiny_checkpoint(tied, tie=True, seed=5)
    return {"untied": untied, "tied": tied}


@pytest.fixture
def checkpoint(tmp_path, saved_checkpoints):
    """A fresh copy of the untied checkpoint: (directory, its tensors)."""
    directory = tmp_path / "untied"
    shutil.copytree(saved_checkpoints["untied"], directory)
    return directory, load_file(directory / "model.safetensors")


@pytest.fixture
def tied_checkpoint(tmp_path, saved_checkpoints):
    directory = tmp_path / "tied"
    shutil.copytree(saved_checkpoints["tied"], directory)
    return directory, load_file(directory / "model.safetensors")


def load(directory) -> Qwen3ForCausalLM:
    model = Qwen3ForCausalLM(ModelConfig.from_pretrained(directory, dtype="float32"), TPGroup())
    load_checkpoint(model, directory, show_progress=False)
    return model


def rewrite(directory, tensors: dict[str, torch.Tensor]) -> None:
    save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})


def assert_weights_equal_checkpoint(model: Qwen3ForCausalLM, tensors: dict[str, torch.Tensor]) -> None:
    params = dict(model.named_parameters(remove_duplicate=False))
    for ckpt_name, (param_name, spec) in model.checkpoint_slices().items():
        loaded = spec.destination(params[param_name].data)
        assert torch.equal(loaded, spec.read(tensors[ckpt_name])), f"{ckpt_name} loaded wrongly"


def shard(directory, tensors: dict[str, torch.Tensor], index: bool = True) -> dict[str, str]:
    """Replace model.safetensors by two shards (and their index); return the weight map."""
    (directory / "model.safetensors").unlink()
    names = sorted(tensors)
    weight_map = {}
    for i, part in enumerate((names[: len(names) // 2], names[len(names) // 2 :])):
        file = f"model-{i + 1:05d}-of-00002.safetensors"
        save_file({n: tensors[n] for n in part}, directory / file, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, file))
    if index:
        (directory / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {}, "weight_map": weight_map}))
    return weight_map


def test_intact_checkpoint_loads_every_tensor(checkpoint):
    directory, tensors = checkpoint
    assert_weights_equal_checkpoint(load(directory), tensors)


def test_missing_tensor_is_named(checkpoint):
    directory, tensors = checkpoint
    del tensors[UP_PROJ]
    rewrite(directory, tensors)
    with pytest.raises(CheckpointError, match=f"checkpoint {directory} is missing tensor {UP_PROJ}$"):
        load(directory)


def test_several_missing_tensors_name_the_first_and_count_the_rest(checkpoint):
    directory, tensors = checkpoint
    for layer in (0, 1):
        del tensors[f"model.layers.{layer}.self_attn.q_norm.weight"]
    rewrite(directory, tensors)
    with pytest.raises(CheckpointError, match=r"missing tensor model.layers.0.self_attn.q_norm.weight "
                                              r"\(and 1 more\)"):
        load(directory)


def test_untied_checkpoint_without_lm_head_is_missing_it(checkpoint):
    directory, tensors = checkpoint
    del tensors["lm_head.weight"]
    rewrite(directory, tensors)
    with pytest.raises(CheckpointError, match="is missing tensor lm_head.weight"):
        load(directory)


def test_unexpected_tensor_is_named(checkpoint):
    directory, tensors = checkpoint
    tensors["model.layers.0.self_attn.q_proj.bias"] = torch.zeros(128)
    rewrite(directory, tensors)
    message = f"checkpoint {directory} has unexpected tensor model.layers.0.self_attn.q_proj.bias"
    with pytest.raises(CheckpointError, match=message):
        load(directory)


def test_wrong_shape_names_the_tensor_its_shape_and_the_expected_one(checkpoint):
    directory, tensors = checkpoint
    tensors[UP_PROJ] = tensors[UP_PROJ][:48]  # [96, 64] in the real checkpoint
    rewrite(directory, tensors)
    with pytest.raises(CheckpointError, match=rf"tensor {UP_PROJ} in model.safetensors has shape \(48, 64\), "
                                              rf"expected \(96, 64\)"):
        load(directory)


def test_transposed_tensor_is_a_wrong_shape(checkpoint):
    directory, tensors = checkpoint
    name = "model.layers.1.self_attn.o_proj.weight"
    tensors[name] = tensors[name].t().contiguous()
    rewrite(directory, tensors)
    with pytest.raises(CheckpointError, match=rf"tensor {name} .*has shape \(128, 64\), "
                                              rf"expected \(64, 128\)"):
        load(directory)


def test_truncated_file_is_named(checkpoint):
    directory, _ = checkpoint
    path = directory / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=f"cannot read checkpoint file {path}"):
        load(directory)


def test_garbled_header_is_named(checkpoint):
    directory, _ = checkpoint
    path = directory / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[8:40] = b"\xff" * 32  # the JSON header starts at byte 8
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=f"cannot read checkpoint file {path}"):
        load(directory)


def test_empty_file_is_named(checkpoint):
    directory, _ = checkpoint
    path = directory / "model.safetensors"
    path.write_bytes(b"")
    with pytest.raises(CheckpointError, match=f"cannot read checkpoint file {path}"):
        load(directory)


def test_directory_without_a_checkpoint_says_so(checkpoint):
    directory, _ = checkpoint
    (directory / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match=f"{directory} holds no safetensors checkpoint"):
        load(directory)


def test_sharded_checkpoint_loads_the_same_weights_as_one_file(checkpoint):
    directory, tensors = checkpoint
    single = load(directory)
    weight_map = shard(directory, tensors)
    assert len(set(weight_map.values())) == 2
    sharded = load(directory)
    assert_weights_equal_checkpoint(sharded, tensors)
    for (name, a), (_, b) in zip(single.named_parameters(), sharded.named_parameters()):
        assert torch.equal(a, b), f"{name} differs between the sharded and the single-file load"


def test_shards_without_an_index_are_found_by_name(checkpoint):
    directory, tensors = checkpoint
    shard(directory, tensors, index=False)
    assert_weights_equal_checkpoint(load(directory), tensors)


def test_index_naming_a_missing_shard_names_it(checkpoint):
    directory, tensors = checkpoint
    shard(directory, tensors)
    (directory / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(CheckpointError, match="shard model-00002-of-00002.safetensors listed in "
                                              f"model.safetensors.index.json is missing from {directory}"):
        load(directory)


def test_unreadable_index_is_named(checkpoint):
    directory, tensors = checkpoint
    shard(directory, tensors)
    (directory / "model.safetensors.index.json").write_text('{"metadata": {}}')
    with pytest.raises(CheckpointError, match="cannot read the shard index .*model.safetensors.index.json"):
        load(directory)


def test_index_pointing_at_the_wrong_shard_names_the_tensor(checkpoint):
    directory, tensors = checkpoint
    weight_map = shard(directory, tensors)
    first, second = sorted(set(weight_map.values()))
    weight_map[UP_PROJ] = second if weight_map[UP_PROJ] == first else first
    (directory / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(CheckpointError, match=f"cannot read tensor {UP_PROJ} from .*{weight_map[UP_PROJ]}"):
        load(directory)


def test_tied_checkpoint_loads_the_embedding_into_the_lm_head(tied_checkpoint):
    directory, tensors = tied_checkpoint
    assert "lm_head.weight" not in tensors
    model = load(directory)
    assert_weights_equal_checkpoint(model, tensors)
    assert model.lm_head.weight is model.model.embed_tokens.weight


def test_tied_checkpoint_that_also_stores_lm_head_loads(tied_checkpoint):
    directory, tensors = tied_checkpoint
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].clone()
    rewrite(directory, tensors)
    model = load(directory)
    assert torch.equal(model.lm_head.weight, tensors["model.embed_tokens.weight"])
    assert model.lm_head.weight is model.model.embed_tokens.weight
