"""The LM head's weight layout on the CPU (core/execution/model/layers.py, `store_for_its_device`): a
float32 weight is kept hidden-major, which changes nothing but oneMKL's speed; other dtypes keep the
checkpoint's rows."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from core.execution.distributed import TPGroup
from core.execution.model.layers import ParallelLMHead, VocabParallelEmbedding, finish_loading


def tied_head(dtype: torch.dtype, vocab: int = 4096, hidden: int = 64
              ) -> tuple[torch.nn.Module, torch.Tensor]:
    """An embedding and an LM head sharing one weight, as a tied checkpoint loads them, and its values."""
    model = torch.nn.Module()
    model.embed = VocabParallelEmbedding(vocab, hidden, TPGroup())
    model.head = ParallelLMHead(vocab, hidden, TPGroup())
    values = torch.randn(vocab, hidden, generator=torch.Generator().manual_seed(0)).to(dtype)
    with torch.no_grad():
        model.embed.weight.data = values.clone()
    model.head.weight = model.embed.weight
    return model, values


def test_a_float32_head_is_kept_hidden_major_with_the_same_values_and_logits():
    model, values = tied_head(torch.float32)
    with torch.no_grad():
        finish_loading(model)
    weight = model.head.weight
    assert weight.t().is_contiguous() and not weight.is_contiguous()
    assert model.embed.weight is weight  # still tied
    assert torch.equal(weight, values)
    ids = torch.tensor([0, 5, 4095, 17])
    assert torch.equal(model.embed(ids), F.embedding(ids, values))
    for rows in (1, 2, 4, 8):
        hidden = torch.randn(rows, 64, generator=torch.Generator().manual_seed(rows))
        expected = F.linear(hidden, values)
        # oneMKL may sum in another order for one layout than the other (measured: one and two rows)
        torch.testing.assert_close(model.head.logits(hidden), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_half_precision_head_keeps_the_checkpoints_rows(dtype):
    model, values = tied_head(dtype)
    with torch.no_grad():
        finish_loading(model)
    assert model.head.weight.is_contiguous() and torch.equal(model.head.weight, values)
