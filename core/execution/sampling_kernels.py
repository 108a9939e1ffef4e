"""The sampler's two random paths as Triton kernels, one program per row (GPU; CPU interpreter in tests).

Same rule and same noise as core/execution/sampling_paths.py, which defines them; only the float32 sums differ
in their order, so a draw can differ from the torch path only where two scores, or a kept mass and
top_p, agree to the last bits. Both kernels take every row of the step and write the rows of their
own path into `out`, leaving the others: `sample_candidates` the rows with temperature > 0 and
0 < top_k, `sample_full_rows` those with temperature > 0 and no top_k. Launches depend on shapes
only, so a CUDA graph captures them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from core.execution.sampling_noise import FMIX_C1, FMIX_C2, TOKEN_SALT

_C1 = tl.constexpr(FMIX_C1)
_C2 = tl.constexpr(FMIX_C2)
_TOKEN_SALT = tl.constexpr(TOKEN_SALT)

# Rows of the full-row kernel are walked in blocks of this many logits.
FULL_ROW_BLOCK = 2048
# The candidate kernel compares every pair of candidates: [K, K] in registers.
MAX_KERNEL_CANDIDATES = 128


@triton.jit
def _fmix32(x):
    x = x ^ (x >> 16)
    x = x * tl.full(x.shape, _C1, tl.uint32)
    x = x ^ (x >> 13)
    x = x * tl.full(x.shape, _C2, tl.uint32)
    return x ^ (x >> 16)


@triton.jit
def _noise(token_ids, key_a, key_b):
    """Exp(1) noise of `token_ids` (int64) in the draw keyed (key_a, key_b): sampling_noise.noise_at."""
    h = _fmix32(_fmix32(token_ids.to(tl.uint32) ^ tl.full(token_ids.shape, _TOKEN_SALT, tl.uint32)) ^ key_a)
    h = _fmix32(h + key_b)
    uniform = (h.to(tl.float64) + 0.5) * 2.3283064365386963e-10  # 2^-32
    return (-tl.log(uniform)).to(tl.float32)


@triton.jit
def _candidates_kernel(values_ptr, ids_ptr, stride_values, stride_ids, temperature_ptr, top_k_ptr,
                       top_p_ptr, min_p_ptr, keys_ptr, stride_keys, out_ptr, num_candidates,
                       BLOCK_K: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    temperature = tl.load(temperature_ptr + row)
    top_k = tl.load(top_k_ptr + row)
    if temperature <= 0.0:
        return
    if top_k <= 0:
        return
    offs = tl.arange(0, BLOCK_K)
    valid = offs < num_candidates
    values = tl.load(values_ptr + row * stride_values + offs, mask=valid, other=float("-inf"))
    ids = tl.load(ids_ptr + row * stride_ids + offs, mask=valid, other=0).to(tl.int64)
    # before[a, b]: candidate b comes before candidate a in the order (logit down, id up)
    va, vb = values[:, None], values[None, :]
    before = ((vb > va) | ((vb == va) & (ids[None, :] < ids[:, None]))) & valid[None, :]
    rank = tl.sum(before.to(tl.int32), axis=1)
    p = tl.exp((values - tl.max(values, axis=0)) / temperature)
    keep = valid & (rank < top_k) & (p >= tl.load(min_p_ptr + row))
    kept = tl.where(keep, p, 0.0)
    mass_before = tl.sum(tl.where(before, kept[None, :], 0.0), axis=1)
    top_p = tl.load(top_p_ptr + row)
    limit = tl.where(top_p >= 1.0, float("inf"), top_p * tl.sum(kept, axis=0))
    keep &= mass_before < limit
    key_a = tl.load(keys_ptr + row).to(tl.uint32)
    key_b = tl.load(keys_ptr + stride_keys + row).to(tl.uint32)
    score = tl.where(keep, kept / _noise(ids, key_a, key_b), -1.0)
    best = tl.max(score, axis=0)
    # the first candidate in the order among equal best scores
    winner_rank = tl.min(tl.where(score == best, rank, BLOCK_K), axis=0)
    token = tl.sum(tl.where((rank == winner_rank) & valid, ids, 0), axis=0)
    tl.store(out_ptr + row, token)


@triton.jit
def _race(row_ptr, vocab_size, top, temperature, min_p, pivot_logit, pivot_id, key_a, key_b,
          BLOCK: tl.constexpr):
    """The kept token before (pivot_logit, pivot_id) with the largest p / E: (its id, its logit)."""
    offs = tl.arange(0, BLOCK)
    lane_score = tl.full((BLOCK,), -2.0, tl.float32)
    lane_id = tl.zeros((BLOCK,), tl.int64)
    for start in range(0, vocab_size, BLOCK):
        ids = start + offs.to(tl.int64)
        valid = ids < vocab_size
        x = tl.load(row_ptr + ids, mask=valid, other=float("-inf"))
        p = tl.exp((x - top) / temperature)
        allowed = valid & (p >= min_p) & ((x > pivot_logit) | ((x == pivot_logit) & (ids < pivot_id)))
        score = tl.where(allowed, p / _noise(ids, key_a, key_b), -1.0)
        better = score > lane_score  # strictly: a lane keeps its lowest id among equal scores
        lane_score = tl.where(better, score, lane_score)
        lane_id = tl.where(better, ids, lane_id)
    best = tl.max(lane_score, axis=0)
    winner = tl.min(tl.where(lane_score == best, lane_id, vocab_size), axis=0)
    return winner, tl.load(row_ptr + winner)


@triton.jit
def _kept_mass(row_ptr, vocab_size, top, temperature, min_p, pivot_logit, pivot_id, BLOCK: tl.constexpr):
    """Sum of p over the kept tokens before (pivot_logit, pivot_id)."""
    offs = tl.arange(0, BLOCK)
    mass = tl.zeros((BLOCK,), tl.float32)
    for start in range(0, vocab_size, BLOCK):
        ids = start + offs.to(tl.int64)
        valid = ids < vocab_size
        x = tl.load(row_ptr + ids, mask=valid, other=float("-inf"))
        p = tl.exp((x - top) / temperature)
        before = valid & (p >= min_p) & ((x > pivot_logit) | ((x == pivot_logit) & (ids < pivot_id)))
        mass += tl.where(before, p, 0.0)
    return tl.sum(mass, axis=0)


@triton.jit
def _full_rows_kernel(logits_ptr, stride_logits, temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr,
                      keys_ptr, stride_keys, out_ptr, vocab_size, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    temperature = tl.load(temperature_ptr + row)
    if temperature <= 0.0:
        return
    if tl.load(top_k_ptr + row) > 0:
        return
    row_ptr = logits_ptr + row * stride_logits
    offs = tl.arange(0, BLOCK)
    top_lanes = tl.full((BLOCK,), float("-inf"), tl.float32)
    for start in range(0, vocab_size, BLOCK):
        ids = start + offs
        top_lanes = tl.maximum(top_lanes, tl.load(row_ptr + ids, mask=ids < vocab_size, other=float("-inf")))
    top = tl.max(top_lanes, axis=0)
    min_p = tl.load(min_p_ptr + row)
    top_p = tl.load(top_p_ptr + row)
    key_a = tl.load(keys_ptr + row).to(tl.uint32)
    key_b = tl.load(keys_ptr + stride_keys + row).to(tl.uint32)
    # pivot past every token: the first race is over the whole row
    no_logit = float("-inf")
    no_id = vocab_size + 1
    winner, winner_logit = _race(row_ptr, vocab_size, top, temperature, min_p, no_logit, no_id,
                                 key_a, key_b, BLOCK)
    if top_p < 1.0:
        limit = top_p * _kept_mass(row_ptr, vocab_size, top, temperature, min_p, no_logit, no_id, BLOCK)
        mass = _kept_mass(row_ptr, vocab_size, top, temperature, min_p, winner_logit, winner, BLOCK)
        while mass >= limit:  # the winner is outside the nucleus: race over the tokens before it
            winner, winner_logit = _race(row_ptr, vocab_size, top, temperature, min_p, winner_logit,
                                         winner, key_a, key_b, BLOCK)
            mass = _kept_mass(row_ptr, vocab_size, top, temperature, min_p, winner_logit, winner, BLOCK)
    tl.store(out_ptr + row, winner)


def sample_candidates(values: torch.Tensor, ids: torch.Tensor, temperature: torch.Tensor,
                      top_k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor, keys: torch.Tensor,
                      out: torch.Tensor) -> None:
    """Write into `out` [N] (int64) the draw of every row with temperature > 0 and a top_k, from its
    candidates `values`/`ids` [N, K] (K <= MAX_KERNEL_CANDIDATES, K >= each such row's top_k)."""
    num_rows, num_candidates = values.shape
    if num_candidates > MAX_KERNEL_CANDIDATES:
        raise ValueError(f"{num_candidates} candidates, the kernel takes at most {MAX_KERNEL_CANDIDATES}")
    if num_rows == 0:
        return
    block_k = max(16, triton.next_power_of_2(num_candidates))
    _candidates_kernel[(num_rows,)](
        values, ids, values.stride(0), ids.stride(0), temperature, top_k, top_p, min_p, keys,
        keys.stride(0), out, num_candidates, BLOCK_K=block_k, num_warps=4 if block_k <= 64 else 8)


def sample_full_rows(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                     top_p: torch.Tensor, min_p: torch.Tensor, keys: torch.Tensor, out: torch.Tensor) -> None:
    """Write into `out` [N] (int64) the draw of every row with temperature > 0 and no top_k, over its
    whole row of `logits` [N, V] (float32, last dim contiguous)."""
    num_rows, vocab_size = logits.shape
    if num_rows == 0:
        return
    _full_rows_kernel[(num_rows,)](
        logits, logits.stride(0), temperature, top_k, top_p, min_p, keys, keys.stride(0), out, vocab_size,
        BLOCK=FULL_ROW_BLOCK, num_warps=8)
