"""The sampler as it was first written: sort the whole vocabulary, mask, race over every token.

Slow (a full sort and noise for every token of every row) and obviously right; the fast paths of
core/execution/sampling_paths.py and core/execution/sampling_kernels.py must draw the very same
tokens. Kept here only as the tests' oracle.
"""

from __future__ import annotations

import torch

from core.execution.sampling_noise import exponential_noise


def reference_tokens(logits: torch.Tensor, temperature, top_k, top_p, min_p, seed,
                     output_pos) -> torch.Tensor:
    """Token ids [N] (int64); per-row settings as 1-D tensors (top_k 0 = off)."""
    greedy = logits.argmax(dim=-1)
    safe_temperature = torch.where(temperature > 0, temperature, 1.0)
    probs = torch.softmax(logits / safe_temperature[:, None], dim=-1)
    probs = probs.masked_fill(probs < min_p[:, None] * probs.amax(dim=-1, keepdim=True), 0.0)
    vocab_size = probs.shape[1]
    # stable: among equal probabilities the lower id ranks first
    sorted_probs, sorted_ids = probs.sort(dim=-1, descending=True, stable=True)
    k = torch.where(top_k > 0, top_k, vocab_size)
    keep = torch.arange(vocab_size)[None, :] < k[:, None]
    sorted_probs = sorted_probs.masked_fill(~keep, 0.0)
    cumulative = sorted_probs.cumsum(dim=-1)
    in_nucleus = (cumulative - sorted_probs) < top_p[:, None] * cumulative[:, -1:]
    keep &= in_nucleus | (top_p[:, None] >= 1.0)
    keep_by_id = torch.empty_like(keep).scatter_(-1, sorted_ids, keep)
    probs = probs.masked_fill(~keep_by_id, 0.0)
    drawn = (probs / exponential_noise(seed, output_pos, vocab_size)).argmax(dim=-1)
    return torch.where(temperature > 0, drawn, greedy)
