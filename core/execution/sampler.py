"""Sampler: turns one step's logits into the next token of every request that samples.

The executor builds `SamplingTensors.from_plan(plan, plan.sampled_rows, device)` once per step and
calls `Sampler()(logits, st)` with the logits of those rows. The work is batched on the logits'
device; the host only gathers the rows' sampling records from the plan, hashes each row's noise keys
and sets a few flags that let the common cases (all greedy, no penalties, no logprobs) skip whole
stages.

Per row, in this order:
  1. logprobs of the raw model distribution (log_softmax of the logits as given), as vLLM reports;
  2. logit bias, penalties: repetition (HF-style, prompt + output tokens), presence and frequency
     (OpenAI-style, output tokens only), then a structured output's mask (the tokens its grammar
     does not allow next get -inf; core/execution/structured_rows.py computes the masks);
  3. temperature 0 -> argmax (ties go to the lowest id); otherwise min_p, top_k and top_p filter the
     tempered distribution and a seeded exponential race draws from what they keep: the top-k path
     for rows with a top_k, the full-row path for the others (core/execution/sampling_paths.py defines both;
     core/execution/sampling_kernels.py runs them on the GPU). The noise depends only on (seed, output_pos,
     token id), so a seeded request draws the same tokens in any batch.

`sample_tokens` is step 3 alone; core/execution/decode_graphs.py captures its kernels in the decode graph.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from core.execution import sampling_paths
from core.execution.host_to_device import to_device
from core.execution.sampling_noise import noise_keys
from core.plan import StepPlan
from core.sampling_params import SAMPLING_DTYPE

try:
    from core.execution import sampling_kernels
except ImportError:  # an install without triton: the torch paths serve every device
    sampling_kernels = None

# Bound on the [rows, vocab] temporaries of the torch full-row path: ~32 MiB each at 2^23 elements.
_FULL_ROW_CHUNK_ELEMS = 1 << 23


# The plan's sampling columns by kind: each kind goes to the device as one block.
_FLOAT_COLUMNS = tuple(name for name in SAMPLING_DTYPE.names if SAMPLING_DTYPE[name].kind == "f")
_INT_COLUMNS = tuple(name for name in SAMPLING_DTYPE.names if SAMPLING_DTYPE[name].kind != "f")


class DrawSettings(NamedTuple):
    """What the draw reads per row, in the sampling kernels' argument order."""

    temperature: torch.Tensor  # float32 [N]  0 = greedy
    top_k: torch.Tensor  # int64 [N]  0 = off
    top_p: torch.Tensor  # float32 [N]  1 = off
    min_p: torch.Tensor  # float32 [N]  0 = off
    keys: torch.Tensor  # int64 [2, N]  noise keys of each row's draw (core/execution/sampling_noise.py)

    @classmethod
    def zeros(cls, num_rows: int, device: torch.device) -> DrawSettings:
        """Settings of `num_rows` greedy rows: the static buffers a sampling graph reads."""
        floats, ints = (torch.zeros(3, num_rows, dtype=torch.float32, device=device),
                        torch.zeros(3, num_rows, dtype=torch.int64, device=device))
        return cls(temperature=floats[0], top_k=ints[0], top_p=floats[1], min_p=floats[2], keys=ints[1:])

    def rows(self, rows: torch.Tensor | slice) -> DrawSettings:
        """The settings of `rows` only (a slice gives views, an index tensor copies)."""
        return DrawSettings(*(setting[..., rows] for setting in self))


@dataclass(frozen=True, eq=False)
class SamplingTensors:
    """Sampling settings of the N rows that sample this step, on the device, plus host-side flags.

    One tensor per column of core/sampling_params.py's SAMPLING_COLUMNS (float columns as float32,
    integer ones as int64), filled by name in `from_plan`; then what the sampler derives per step."""

    temperature: torch.Tensor  # [N]  0 = greedy
    top_p: torch.Tensor  # [N]  1 = off
    top_k: torch.Tensor  # [N]  0 = off (a plan's -1 is mapped to 0)
    min_p: torch.Tensor  # [N]  0 = off
    seed: torch.Tensor  # [N]
    repetition_penalty: torch.Tensor  # [N]
    presence_penalty: torch.Tensor  # [N]
    frequency_penalty: torch.Tensor  # [N]
    num_logprobs: torch.Tensor  # [N]  -1 = none, 0 = sampled token only, K = also the top K
    output_pos: torch.Tensor  # int64 [N]  tokens generated so far: the noise index of this draw
    keys: torch.Tensor  # int64 [2, N]  noise keys of each row's draw (core/execution/sampling_noise.py)
    # Penalty history flattened to one entry per (row, token occurrence), only for rows with penalties.
    history_rows: torch.Tensor  # int64 [H]  row in 0..N-1
    history_ids: torch.Tensor  # int64 [H]  token id
    history_is_output: torch.Tensor  # bool [H]  False = prompt token (repetition penalty only)
    # Logit bias flattened to one entry per (row, token), only for rows that have one.
    bias_rows: torch.Tensor  # int64 [L]  row in 0..N-1
    bias_ids: torch.Tensor  # int64 [L]  token id
    bias_values: torch.Tensor  # float32 [L]  added to that token's logit
    # Host-side flags, computed once so the sampler never syncs to decide what to skip.
    all_greedy: bool
    any_penalties: bool  # some row has a non-default penalty and a non-empty history
    max_top_k: int  # the largest top_k among the rows that sample randomly; 0 when none has one
    top_k_rows: np.ndarray  # int64: the rows that sample randomly with a top_k (the top-k path)
    full_rows: np.ndarray  # int64: the rows that sample randomly without one (the full-row path)
    max_num_logprobs: int  # -1 when no row wants logprobs (or N = 0)
    max_history_id: int  # -1 when the flattened history is empty
    max_bias_id: int = -1  # -1 when no row has a logit bias
    # Structured outputs: the rows that sample with one and, per such row, the tokens it may draw.
    masked_rows: torch.Tensor | None = None  # int64 [M]  row in 0..N-1
    allowed: torch.Tensor | None = None  # uint8 [M, ceil(V / 8)]  packed bits, np.packbits' order

    @property
    def any_bias(self) -> bool:
        return self.max_bias_id >= 0

    def __post_init__(self) -> None:
        n = self.num_rows
        for name in (*SAMPLING_DTYPE.names, "output_pos"):
            shape = tuple(getattr(self, name).shape)
            if shape != (n,):
                raise ValueError(f"SamplingTensors.{name} has shape {shape}, expected ({n},)")
        h = self.history_ids.shape[0]
        for name in ("history_rows", "history_is_output"):
            shape = tuple(getattr(self, name).shape)
            if shape != (h,):
                raise ValueError(f"SamplingTensors.{name} has shape {shape}, expected ({h},)")
        num_bias = self.bias_ids.shape[0]
        for name in ("bias_rows", "bias_values"):
            shape = tuple(getattr(self, name).shape)
            if shape != (num_bias,):
                raise ValueError(f"SamplingTensors.{name} has shape {shape}, expected ({num_bias},)")

    @property
    def num_rows(self) -> int:
        return self.temperature.shape[0]

    @property
    def draw_settings(self) -> DrawSettings:
        return DrawSettings(self.temperature, self.top_k, self.top_p, self.min_p, self.keys)

    @classmethod
    def from_plan(cls, plan: StepPlan, rows: np.ndarray, device: torch.device | str,
                  allowed: tuple[np.ndarray, np.ndarray] | None = None) -> SamplingTensors:
        """Settings of the plan's requests `rows` (usually `plan.sampled_rows`), in that order;
        `allowed`: (positions in `rows`, packed masks) of the rows with a structured output."""
        rows = np.asarray(rows, dtype=np.int64)
        device = torch.device(device)
        settings = np.take(plan.sampling, rows)  # [N] records: one gather for every column
        np.maximum(settings["top_k"], 0, out=settings["top_k"])
        output_pos = plan.output_pos[rows]

        has_penalty = ((settings["repetition_penalty"] != 1.0) | (settings["presence_penalty"] != 0.0)
                       | (settings["frequency_penalty"] != 0.0))
        history_rows, history_ids, history_is_output = _flatten_history(plan, rows, has_penalty)
        if len(history_ids) and history_ids.min() < 0:
            bad = int(np.flatnonzero(history_ids < 0)[0])
            raise ValueError(f"step {plan.step_id}: request {int(rows[history_rows[bad]])} has history "
                             f"token id {int(history_ids[bad])} < 0")

        bias_rows, bias_ids, bias_values = _flatten_bias(plan, rows)
        if len(bias_ids) and bias_ids.min() < 0:
            bad = int(np.flatnonzero(bias_ids < 0)[0])
            raise ValueError(f"step {plan.step_id}: request {int(rows[bias_rows[bad]])} has logit bias "
                             f"token id {int(bias_ids[bad])} < 0")

        temperature, top_k = settings["temperature"], settings["top_k"]
        num_logprobs = settings["num_logprobs"]
        random = temperature != 0.0

        # Two host-to-device copies for the per-row settings (the float columns as float32; the integer
        # columns, output positions and noise keys as int64), and one per non-empty ragged array, each
        # staged through pinned memory: none waits for the GPU queue.
        float_rows = np.stack([settings[name] for name in _FLOAT_COLUMNS]).astype(np.float32, copy=False)
        int_rows = np.stack([*(settings[name] for name in _INT_COLUMNS), output_pos,
                             *noise_keys(settings["seed"], output_pos)]).astype(np.int64, copy=False)
        floats, ints = to_device(float_rows, device), to_device(int_rows, device)
        columns = {name: floats[i] for i, name in enumerate(_FLOAT_COLUMNS)}
        columns.update((name, ints[i]) for i, name in enumerate(_INT_COLUMNS))
        num_ints = len(_INT_COLUMNS)

        def put(array: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
            if not len(array):
                return torch.empty(0, dtype=dtype, device=device)
            return to_device(array, device, dtype)

        return cls(
            **columns, output_pos=ints[num_ints], keys=ints[num_ints + 1 :],
            history_rows=put(history_rows, torch.int64),
            history_ids=put(history_ids, torch.int64),
            history_is_output=put(history_is_output, torch.bool),
            bias_rows=put(bias_rows, torch.int64),
            bias_ids=put(bias_ids, torch.int64),
            bias_values=put(bias_values, torch.float32),
            all_greedy=not random.any(),
            any_penalties=len(history_ids) > 0,
            max_top_k=int(top_k[random].max()) if random.any() else 0,
            top_k_rows=np.flatnonzero(random & (top_k > 0)),
            full_rows=np.flatnonzero(random & (top_k == 0)),
            max_num_logprobs=int(num_logprobs.max()) if len(rows) else -1,
            max_history_id=int(history_ids.max()) if len(history_ids) else -1,
            max_bias_id=int(bias_ids.max()) if len(bias_ids) else -1,
            masked_rows=None if allowed is None else put(allowed[0], torch.int64),
            allowed=None if allowed is None else to_device(allowed[1], device),
        )


def _flatten_history(
    plan: StepPlan, rows: np.ndarray, take: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(row, token id, is_output) per history entry of the rows where `take`, without a Python loop."""
    starts = plan.history_start[rows].astype(np.int64)
    lengths = np.where(take, plan.history_start[rows + 1] - starts, 0)
    # offset of each entry inside its own request's history: a ragged arange
    offsets = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    history_rows = np.repeat(np.arange(len(rows)), lengths)
    history_ids = plan.history_ids[np.repeat(starts, lengths) + offsets]
    is_output = offsets >= np.repeat(plan.history_prompt_len[rows], lengths)
    return history_rows, history_ids, is_output


def _flatten_bias(plan: StepPlan, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(row, token id, bias) per logit-bias entry of `rows`, without a Python loop."""
    if not len(plan.bias_ids):  # most steps: nobody biases
        return np.zeros(0, np.int64), plan.bias_ids, plan.bias_values
    starts = plan.bias_start[rows].astype(np.int64)
    lengths = plan.bias_start[rows + 1] - starts
    offsets = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    index = np.repeat(starts, lengths) + offsets
    return np.repeat(np.arange(len(rows)), lengths), plan.bias_ids[index], plan.bias_values[index]


class SamplerOutput(NamedTuple):
    token_ids: torch.Tensor  # int32 [N]
    # The logprob fields cover every row (rows that asked for fewer or none just ignore theirs) and
    # are None when no row asked: sampled_logprobs when every num_logprobs is -1, the top ones when
    # the largest num_logprobs K is below 1.
    sampled_logprobs: torch.Tensor | None  # float32 [N]
    top_token_ids: torch.Tensor | None  # int32 [N, K]  most probable first
    top_logprobs: torch.Tensor | None  # float32 [N, K]


class Sampler:
    """Stateless: `Sampler()(logits, st)`; a class so the executor holds one policy object."""

    def __call__(self, logits: torch.Tensor, st: SamplingTensors,
                 drawn: torch.Tensor | None = None) -> SamplerOutput:
        """`drawn`: the tokens, when a decode graph has drawn them already (only logprobs are left)."""
        if logits.dim() != 2 or logits.shape[0] != st.num_rows:
            raise ValueError(f"logits have shape {tuple(logits.shape)}, expected ({st.num_rows}, vocab)")
        vocab_size = logits.shape[1]
        if st.max_history_id >= vocab_size:
            raise ValueError(
                f"penalty history holds token id {st.max_history_id}, the vocabulary has {vocab_size}"
            )
        if st.max_bias_id >= vocab_size:
            raise ValueError(f"a logit bias names token id {st.max_bias_id}, the vocabulary has {vocab_size}")
        logits = logits.float()
        raw_logprobs = torch.log_softmax(logits, dim=-1) if st.max_num_logprobs >= 0 else None
        if drawn is None:
            if st.any_bias:  # a new tensor: the caller's logits (a graph's output) stay as they are
                logits = logits.index_put((st.bias_rows, st.bias_ids), st.bias_values, accumulate=True)
            if st.any_penalties:
                logits = apply_penalties(logits, st)
            if st.allowed is not None:
                logits = apply_masks(logits, st.masked_rows, st.allowed)
            drawn = sample_tokens(logits, st)
        token_ids = drawn.to(torch.int32)
        return _gather_logprobs(raw_logprobs, token_ids, st.max_num_logprobs)


def apply_masks(logits: torch.Tensor, rows: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    """A copy of `logits` [N, V] where rows `rows` keep only the tokens their packed masks allow."""
    vocab_size = logits.shape[1]
    if packed.shape[1] != -(-vocab_size // 8):
        raise ValueError(f"structured-output masks cover {packed.shape[1] * 8} tokens, the logits "
                         f"{vocab_size}")
    shifts = torch.arange(7, -1, -1, dtype=torch.uint8, device=packed.device)
    allowed = ((packed.unsqueeze(-1) >> shifts) & 1).flatten(1)[:, :vocab_size].bool()  # [M, V]
    return logits.index_put((rows,), logits[rows].masked_fill(~allowed, float("-inf")))


def apply_penalties(logits: torch.Tensor, st: SamplingTensors) -> torch.Tensor:
    """Penalized copy of `logits` [N, V]; rows without history come back unchanged."""
    num_rows, vocab_size = logits.shape
    index = (st.history_rows, st.history_ids)
    seen = torch.zeros((num_rows, vocab_size), dtype=torch.bool, device=logits.device)
    seen.index_put_(index, torch.ones_like(st.history_is_output))
    repetition = st.repetition_penalty[:, None]
    logits = torch.where(seen, torch.where(logits > 0, logits / repetition, logits * repetition), logits)
    # Prompt entries add 0, so the output counts need no filtering (which would sync on the device).
    counts = torch.zeros((num_rows, vocab_size), dtype=torch.float32, device=logits.device)
    counts.index_put_(index, st.history_is_output.float(), accumulate=True)
    return logits - st.frequency_penalty[:, None] * counts - st.presence_penalty[:, None] * (counts > 0)


def candidate_count(max_top_k: int, vocab_size: int) -> int:
    """How many of each row's largest logits the top-k path takes: a power of two above the largest
    top_k (so ties at the k-th logit have room), at least 16 and at most the vocabulary."""
    return min(vocab_size, max(16, 1 << max_top_k.bit_length()))


def _triton_runs(logits: torch.Tensor, use_triton: bool | None) -> bool:
    if use_triton is None:
        return sampling_kernels is not None and logits.is_cuda
    if use_triton and sampling_kernels is None:
        raise RuntimeError("use_triton=True, but triton is not installed")
    return use_triton


def sample_tokens(logits: torch.Tensor, st: SamplingTensors, use_triton: bool | None = None) -> torch.Tensor:
    """Token ids [N] (int64) of the rows of `logits` [N, V] (float32, already penalized).

    Greedy rows take the argmax (ties to the lowest id); random rows go down the top-k path or the
    full-row path (core/execution/sampling_paths.py): Triton kernels on the GPU, torch ops otherwise."""
    tokens = logits.argmax(dim=-1)  # first maximum on CPU and CUDA: ties go to the lowest id
    if st.all_greedy:
        return tokens
    kernels = _triton_runs(logits, use_triton)
    settings = st.draw_settings
    if st.max_top_k > 0:
        count = candidate_count(st.max_top_k, logits.shape[1])
        if kernels and count <= sampling_kernels.MAX_KERNEL_CANDIDATES:
            values, ids = logits.topk(count, dim=-1)
            sampling_kernels.sample_candidates(values, ids, *settings, out=tokens)
        else:
            rows = torch.from_numpy(st.top_k_rows).to(logits.device)
            values, ids = logits[rows].topk(count, dim=-1)
            tokens[rows] = sampling_paths.sample_candidates(values, ids, *settings.rows(rows))
    if len(st.full_rows):
        if kernels:
            sampling_kernels.sample_full_rows(logits, *settings, out=tokens)
        else:
            _sample_full_rows_in_chunks(logits, st, settings, tokens)
    return tokens


def _sample_full_rows_in_chunks(logits: torch.Tensor, st: SamplingTensors,
                                settings: DrawSettings, tokens: torch.Tensor) -> None:
    """The torch full-row path, a few rows at a time so its [rows, V] temporaries stay bounded."""
    rows_per_chunk = max(1, _FULL_ROW_CHUNK_ELEMS // logits.shape[1])
    for start in range(0, len(st.full_rows), rows_per_chunk):
        rows = torch.from_numpy(st.full_rows[start : start + rows_per_chunk]).to(logits.device)
        temperature, _, top_p, min_p, keys = settings.rows(rows)
        tokens[rows] = sampling_paths.sample_full_rows(logits[rows], temperature, top_p, min_p, keys)


def _gather_logprobs(
    raw_logprobs: torch.Tensor | None, token_ids: torch.Tensor, max_num_logprobs: int
) -> SamplerOutput:
    if raw_logprobs is None:
        return SamplerOutput(token_ids, None, None, None)
    sampled = raw_logprobs.gather(-1, token_ids.long()[:, None]).squeeze(-1)
    if max_num_logprobs < 1:
        return SamplerOutput(token_ids, sampled, None, None)
    top_logprobs, top_ids = raw_logprobs.topk(min(max_num_logprobs, raw_logprobs.shape[1]), dim=-1)
    return SamplerOutput(token_ids, sampled, top_ids.to(torch.int32), top_logprobs)
