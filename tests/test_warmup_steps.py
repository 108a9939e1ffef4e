"""The runner's warm-up steps: well-formed plans, and together they reach every kernel variant."""

from __future__ import annotations

import numpy as np
import torch

from core.execution.attention.triton_backend import all_extends_fresh
from core.execution.attention.triton_decode import MIN_SPLIT_TOKENS, plan_splits, reduce_block
from core.execution.attention.triton_extend import extend_tiles
from core.execution.warmup_steps import compile_warmup_steps, warmup_plan

BLOCK_SIZE = 16
H200_SMS = 132


def test_warmup_plan_puts_each_token_in_its_own_pages():
    requests = [(0, 2), (4, 1), (30, 40)]
    plan = warmup_plan(requests, BLOCK_SIZE, vocab_size=1000)
    assert plan.query_start.tolist() == [0, 2, 3, 43]
    assert plan.seq_lens.tolist() == [2, 5, 70]
    assert plan.logits_index.tolist() == [1, 2, 42]
    row = np.repeat(np.arange(3), [2, 1, 40])
    pages = plan.block_table[row, plan.positions // BLOCK_SIZE]
    assert (plan.kv_index == pages * BLOCK_SIZE + plan.positions % BLOCK_SIZE).all()
    used = [set(plan.block_table[i, : -(-n // BLOCK_SIZE)].tolist()) for i, n in enumerate(plan.seq_lens)]
    assert not (used[0] & used[1]) and not (used[1] & used[2]) and not (used[0] & used[2])
    assert plan.positions[-40:].tolist() == list(range(30, 70))
    assert plan.input_ids.shape == (43,) and plan.input_ids.max() < 1000


def test_warmup_steps_reach_every_tile_family_and_reduce_block():
    """Each extend tile family over fresh prompts (the step's own K/V rows) and over a cached prefix
    (the pages): two compiled variants of the kernel each."""
    tiles, reduce_blocks = set(), set()
    for step in compile_warmup_steps(max_model_len=40960, max_tokens=8192):
        plan = warmup_plan(step, BLOCK_SIZE, vocab_size=1000)
        query_lens = np.diff(plan.query_start)
        extends, decodes = query_lens >= 2, query_lens == 1
        if extends.any():
            tiles.add((extend_tiles(torch.bfloat16, int(query_lens.max()), int(plan.seq_lens[extends].max())),
                       all_extends_fresh(query_lens, plan.seq_lens)))
        if decodes.any():
            num_splits = plan_splits(int(decodes.sum()), 8, int(plan.seq_lens[decodes].max()), H200_SMS, 64,
                                     MIN_SPLIT_TOKENS).num_splits
            reduce_blocks.add(0 if num_splits == 1 else reduce_block(num_splits))
    families = {extend_tiles(torch.bfloat16, 64, 100), extend_tiles(torch.bfloat16, 65, 100),
                extend_tiles(torch.bfloat16, 65, 1000)}
    assert tiles == {(family, fresh) for family in families for fresh in (True, False)}
    assert reduce_blocks == {0, 16, 32, 64}  # 0: one split, no reduce


def test_warmup_steps_fit_a_short_model_length_and_a_small_token_budget():
    for step in compile_warmup_steps(max_model_len=512, max_tokens=64):
        assert sum(n for _, n in step) <= 64 and all(c + n <= 512 for c, n in step)
    assert compile_warmup_steps(max_model_len=512, max_tokens=64) == [[(0, 2), (4, 1)], [(4, 2)]]
