"""The sampler's two random paths in torch: the definition, and the implementation on the CPU.

Every random draw follows one rule. Order a row's tokens by logit, highest first, ties to the lower
id. With p_i = exp((logit_i - max logit) / temperature), the probability relative to the top token:
  min_p  keeps the tokens with p_i >= min_p (min_p of the top token's probability);
  top_k  keeps the first k of those in the order;
  top_p  keeps a token while the mass of the kept tokens before it is below top_p of the kept mass
         (so the top token always stays, and the set is the smallest prefix reaching top_p);
and the token drawn is the kept token with the largest p_i / E_i, E_i the request's seeded Exp(1)
noise of token i (core/execution/sampling_noise.py). That exponential race picks token i with probability
p_i / sum of kept p, so nothing is renormalized, and a token's noise does not depend on the others.

Neither path sorts the vocabulary or draws noise for all of it:
- `sample_candidates` (rows with a top_k): the caller takes each row's K > top_k largest logits with
  one top-k pass; only those K are ordered, filtered and raced. The first k in the order are exact as
  long as the logits tied with the k-th one do not run past the K candidates (then torch.topk picks
  among them, deterministically for the same row).
- `sample_full_rows` (rows without a top_k): the race runs over the whole row, and top_p is met by
  rejection instead of a sort. The race's winner j is in the nucleus when the kept mass before j is
  below top_p; if not, no token at or after j is, so the race is run again over the tokens before j.
  The noise is the same in every round, so the winner that is accepted is the race's winner over the
  nucleus: the same token a sort would give. A round rarely rejects more than a few times, since the
  race favours the probable tokens, which are the nucleus.

core/execution/sampling_kernels.py runs the same two paths as Triton kernels on the GPU.
"""

from __future__ import annotations

import torch

from core.execution.sampling_noise import noise_at


def relative_probs(logits: torch.Tensor, temperature: torch.Tensor, top: torch.Tensor) -> torch.Tensor:
    """p = exp((logits - top) / temperature), rows' settings broadcast; the top token gets 1."""
    return torch.exp((logits - top[:, None]) / temperature[:, None])


def sample_candidates(values: torch.Tensor, ids: torch.Tensor, temperature: torch.Tensor,
                      top_k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor,
                      keys: torch.Tensor) -> torch.Tensor:
    """Token ids [N] (int64) drawn from each row's candidates: `values` [N, K] float32 logits and `ids`
    [N, K] int64 token ids of its K largest logits, in any order. Every row has temperature > 0 and
    0 < top_k <= K; `keys` int64 [2, N] are its noise keys."""
    num_candidates = values.shape[1]
    # into the order: by id first, then a stable sort by logit keeps ties in id order
    by_id = ids.argsort(dim=1)
    values, ids = values.gather(1, by_id), ids.gather(1, by_id)
    values, by_value = values.sort(dim=1, descending=True, stable=True)
    ids = ids.gather(1, by_value)
    p = relative_probs(values, temperature, values[:, 0])
    keep = torch.arange(num_candidates, device=values.device)[None, :] < top_k[:, None]
    keep &= p >= min_p[:, None]
    kept = torch.where(keep, p, 0.0)
    cumulative = kept.cumsum(dim=1)
    mass_before = cumulative - kept
    keep &= (mass_before < top_p[:, None] * cumulative[:, -1:]) | (top_p[:, None] >= 1.0)
    score = torch.where(keep, kept / noise_at(keys, ids), -1.0)
    return ids.gather(1, score.argmax(dim=1, keepdim=True)).squeeze(1)


def sample_full_rows(logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor,
                     min_p: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """Token ids [N] (int64) drawn over whole rows `logits` [N, V] (rows with temperature > 0 and no
    top_k), by the race and, where top_p < 1, rejection (see the module docstring)."""
    num_rows, vocab_size = logits.shape
    token_ids = torch.arange(vocab_size, device=logits.device)
    p = relative_probs(logits, temperature, logits.amax(dim=1))
    kept = torch.where(p >= min_p[:, None], p, 0.0)
    score = kept / noise_at(keys, token_ids.expand(num_rows, -1))
    winner = score.argmax(dim=1)
    if not bool((top_p < 1.0).any()):
        return winner
    total = kept.sum(dim=1)
    allowed = torch.ones_like(kept, dtype=torch.bool)
    while True:
        winner_logit = logits.gather(1, winner[:, None])
        before = (logits > winner_logit) | ((logits == winner_logit) & (token_ids[None, :] < winner[:, None]))
        mass_before = torch.where(before, kept, 0.0).sum(dim=1)
        accepted = (mass_before < top_p * total) | (top_p >= 1.0)
        if bool(accepted.all()):
            return winner
        # A rejected row keeps racing over the tokens before its winner; an accepted one is unchanged.
        allowed &= before | accepted[:, None]
        winner = torch.where(allowed, score, -1.0).argmax(dim=1)
