"""Seeded Exp(1) noise for the sampler: a pure function of (seed, output_pos, token id).

torch's generators draw a whole batch from one stream, so a request's noise would depend on its
row, on the batch size and on the device's RNG. Instead every uniform is a counter-based hash of
(seed, output_pos, token id). The same request therefore draws the same noise alone or in any batch,
in any row, on CPU or GPU, and a replayed request repeats itself. The sampler only ever needs the
noise of some tokens of a row (its top-k candidates, or one block of the vocabulary at a time inside
a kernel), so the noise is computed at given token ids, from two per-row keys.

The hash is murmur3's 32-bit finalizer. The keys are hashed on the host (numpy); the per-token part
runs on int64 tensors holding values in [0, 2^32):
a 32-bit product can reach 2^64 and overflow int64 (undefined in C++, so CPU and CUDA need not
agree), so `_mul32` multiplies by 16-bit halves of the constant and every intermediate stays below
2^49. On the CPU the same bits come from uint32 numpy arithmetic, which wraps by definition, and
core/execution/sampling_kernels.py computes them with uint32 arithmetic inside its kernels. The
integer part is bit-exact everywhere; -log is taken in float64, where CPU and CUDA agree to well
below float32 resolution.
"""

from __future__ import annotations

import numpy as np
import torch

MASK32 = 0xFFFFFFFF
# The hash's constants, shared with the Triton kernels.
FMIX_C1, FMIX_C2 = 0x85EBCA6B, 0xC2B2AE35
POS_SALT, SEED_SALT, TOKEN_SALT = 0x9E3779B9, 0x7F4A7C15, 0x2545F491
# Bound on the [rows, tokens] int64 temporaries of `exponential_noise`: ~128 MiB each at 2^24 elements.
_CHUNK_ELEMS = 1 << 24


def _mul32(x: torch.Tensor, constant: int) -> torch.Tensor:
    """x * constant mod 2^32, for x in [0, 2^32) held in int64, without any product reaching 2^63."""
    low = x * (constant & 0xFFFF)  # < 2^48
    high = (x * (constant >> 16)) & 0xFFFF  # only its low 16 bits survive the shift by 16
    return (low + (high << 16)) & MASK32


def _fmix32(x: torch.Tensor) -> torch.Tensor:
    """murmur3's finalizer: a bijection of [0, 2^32) with full avalanche."""
    x = x ^ (x >> 16)
    x = _mul32(x, FMIX_C1)
    x = x ^ (x >> 13)
    x = _mul32(x, FMIX_C2)
    return x ^ (x >> 16)


def _fmix32_host(x: np.ndarray) -> np.ndarray:
    """`_fmix32` on uint64 numpy arrays: their products wrap mod 2^64, which keeps the low 32 bits."""
    x = x ^ (x >> np.uint64(16))
    x = (x * np.uint64(FMIX_C1)) & np.uint64(MASK32)
    x = x ^ (x >> np.uint64(13))
    x = (x * np.uint64(FMIX_C2)) & np.uint64(MASK32)
    return x ^ (x >> np.uint64(16))


def noise_keys(seed: np.ndarray, output_pos: np.ndarray) -> np.ndarray:
    """The two 32-bit keys of each row's draw, int64 [2, N] (key_a, key_b), hashed on the host.

    For a fixed seed, output_pos -> key_a is a bijection: different positions never share a key."""
    seed = np.asarray(seed, dtype=np.int64).astype(np.uint64)  # two's complement bits
    output_pos = np.asarray(output_pos, dtype=np.int64).astype(np.uint64)
    mask, shift = np.uint64(MASK32), np.uint64(32)
    seed_low, seed_high = seed & mask, seed >> shift
    key_a = _fmix32_host(seed_low ^ _fmix32_host(seed_high ^ _fmix32_host((output_pos & mask)
                                                                           ^ np.uint64(POS_SALT))))
    key_b = _fmix32_host(key_a ^ _fmix32_host(seed_high ^ np.uint64(SEED_SALT)))
    return np.stack([key_a, key_b]).astype(np.int64)


def noise_at(keys: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """Exp(1) noise float32 [N, K] of the tokens `token_ids` [N, K] (int64) of each row's draw."""
    if token_ids.device.type == "cpu":
        return _noise_at_host(keys, token_ids)
    return _noise_at_int64(keys, token_ids)


def _noise_at_int64(keys: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """`noise_at` in int64 torch ops, on any device."""
    key_a, key_b = keys[0, :, None], keys[1, :, None]
    h = _fmix32(_fmix32(token_ids ^ TOKEN_SALT) ^ key_a)
    h = _fmix32((h + key_b) & MASK32)
    uniform = (h.to(torch.float64) + 0.5) * 2.0**-32  # in (0, 1), never 0 or 1
    return (-torch.log(uniform)).to(torch.float32)


def _fmix32_inplace(x: np.ndarray) -> np.ndarray:
    """`_fmix32` on a uint32 array, in place: numpy's unsigned products wrap mod 2^32."""
    x ^= x >> np.uint32(16)
    x *= np.uint32(FMIX_C1)
    x ^= x >> np.uint32(13)
    x *= np.uint32(FMIX_C2)
    x ^= x >> np.uint32(16)
    return x


def _noise_at_host(keys: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """`noise_at` on the CPU: the same bits in uint32 numpy arithmetic, in place, and numpy's float64 log.
    On a 2-core CPU a full 151,936-token row takes 6-7 ms against 20 for the int64 torch ops (8 rows:
    40-51 against 368), which made the noise most of a CPU step that samples whole rows."""
    key_a = keys[0].numpy().astype(np.uint32)[:, None]
    key_b = keys[1].numpy().astype(np.uint32)[:, None]
    ids = token_ids.numpy()
    if ids.ndim == 2 and ids.shape[0] > 1 and ids.strides[0] == 0:  # one row of ids for every draw
        per_token = _fmix32_inplace(ids[0].astype(np.uint32) ^ np.uint32(TOKEN_SALT))
        h = per_token[None, :] ^ key_a
    else:
        h = _fmix32_inplace(ids.astype(np.uint32) ^ np.uint32(TOKEN_SALT)) ^ key_a
    h = _fmix32_inplace(h)
    h += key_b
    uniform = _fmix32_inplace(h).astype(np.float64)
    uniform += 0.5
    uniform *= 2.0**-32  # in (0, 1), never 0 or 1
    return torch.from_numpy(np.negative(np.log(uniform, out=uniform), out=uniform).astype(np.float32))


def exponential_noise(seed: torch.Tensor, output_pos: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Exp(1) noise [N, V] float32 over the whole vocabulary, entry (i, v) a function of
    (seed[i], output_pos[i], v); in chunks of rows, so the int64 temporaries stay bounded."""
    keys = torch.from_numpy(noise_keys(seed.cpu().numpy(), output_pos.cpu().numpy())).to(seed.device)
    noise = torch.empty((seed.shape[0], vocab_size), dtype=torch.float32, device=seed.device)
    token_ids = torch.arange(vocab_size, device=seed.device, dtype=torch.int64)
    rows_per_chunk = max(1, _CHUNK_ELEMS // max(vocab_size, 1))
    for start in range(0, seed.shape[0], rows_per_chunk):
        rows = slice(start, start + rows_per_chunk)
        noise[rows] = noise_at(keys[:, rows], token_ids.expand(noise[rows].shape[0], -1))
    return noise
