"""The L2 prefetch of o_proj's weight: off by default, off where it cannot run, and when on asked for
by every layer's attention for small steps only, never changing what the model computes."""

from __future__ import annotations

import torch
from plans import Chunk, make_plan

from core.config import CacheConfig, EngineConfig, ModelConfig
from core.execution.model import l2_prefetch, linear_method
from core.execution.runner import ModelRunner

BLOCK_SIZE = 16


def _sm90(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (9, 0))
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)


def test_off_by_default_and_on_when_asked(monkeypatch):
    _sm90(monkeypatch)
    monkeypatch.delenv("CADENCE_L2_PREFETCH", raising=False)
    l2_prefetch.reread_environment()
    assert l2_prefetch._enabled_on(0) is False, "off until it is measured to gain"
    monkeypatch.setenv("CADENCE_L2_PREFETCH", "1")
    l2_prefetch.reread_environment()
    assert l2_prefetch._enabled_on(0) is (l2_prefetch.triton is not None)
    l2_prefetch.reread_environment()


def test_off_before_sm90_in_the_interpreter_and_on_the_cpu(monkeypatch):
    monkeypatch.setenv("CADENCE_L2_PREFETCH", "1")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (8, 0))
    l2_prefetch.reread_environment()
    assert l2_prefetch._enabled_on(0) is False
    _sm90(monkeypatch)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    l2_prefetch.reread_environment()
    assert l2_prefetch._enabled_on(0) is False
    monkeypatch.delenv("TRITON_INTERPRET")
    monkeypatch.setattr(l2_prefetch, "gdc_wait", None)  # a triton without the dependent launch
    l2_prefetch.reread_environment()
    assert l2_prefetch._enabled_on(0) is False
    assert l2_prefetch.prefetch_l2(torch.zeros(64, 64)) is False, "a CPU tensor is never prefetched"
    l2_prefetch.reread_environment()


def test_a_weight_larger_than_its_share_of_the_l2_is_not_asked_for(monkeypatch):
    launched = []
    monkeypatch.setattr(l2_prefetch, "l2_prefetch_enabled", lambda device: True)
    monkeypatch.setattr(l2_prefetch, "_device_index", lambda device: 0)
    monkeypatch.setattr(l2_prefetch, "_l2_bytes", lambda index: 50 * 2**20)
    monkeypatch.setattr(l2_prefetch, "dependent_launch", lambda device: False)

    class Kernel:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: launched.append((grid, args[1], kwargs["PIECE"]))

    monkeypatch.setattr(l2_prefetch, "_prefetch_l2_kernel", Kernel(), raising=False)
    fp8_o_proj = torch.empty(5120, 5120, dtype=torch.uint8)  # 26.2 MB: half the L2
    assert l2_prefetch.prefetch_l2(fp8_o_proj) is True
    (grid, total, piece), = launched
    assert total == 5120 * 5120 and grid[0] * piece * l2_prefetch.PIECES >= total
    assert (grid[0] - 1) * piece * l2_prefetch.PIECES < total, "no program past the weight's end"
    bf16_o_proj = torch.empty(5120, 5120, dtype=torch.bfloat16)  # 52 MB: the whole L2
    assert l2_prefetch.prefetch_l2(bf16_o_proj) is False and len(launched) == 1


def test_each_layer_asks_for_its_own_o_proj_weight_for_small_steps_only(monkeypatch):
    """A tiny model's steps on the CPU: a 17-token prefill asks for nothing, then each one-row decode
    step asks once a layer, for that layer's o_proj weight, in layer order."""
    asked = []
    monkeypatch.setattr(linear_method, "prefetch_l2", lambda weight: asked.append(weight) or False)
    config = EngineConfig(model=ModelConfig.from_name("qwen3-tiny", load_format="dummy"),
                          cache=CacheConfig(block_size=BLOCK_SIZE, num_pages=16))
    runner = ModelRunner(config, show_progress=False)
    prompt = list(range(1, l2_prefetch.PREFETCH_MAX_ROWS + 2))
    runner.forward_logits(make_plan([Chunk(prompt, 0, [0, 1])], BLOCK_SIZE))
    assert asked == [], "a step of more than PREFETCH_MAX_ROWS rows asks for nothing"
    o_proj_weights = [layer.self_attn.o_proj.weight for layer in runner.model.model.layers]
    for step in range(2):
        runner.forward_logits(make_plan([Chunk([7], len(prompt) + step, [0, 1])], BLOCK_SIZE))
    assert len(asked) == 2 * len(o_proj_weights)
    assert all(got is want for got, want in zip(asked, o_proj_weights * 2))
