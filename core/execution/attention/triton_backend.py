"""TritonAttention: the attention backend for GPUs, built from three Triton kernels.

Each layer's forward writes the step's K/V into the pages in one launch (triton_kv_write.py), then
attends: requests with one query token go to the split-KV decode kernel (triton_decode.py), the
others to the causal extend kernel (triton_extend.py), which reads a step of fresh prompts' keys from
the step's own K/V rows rather than the pages. A decode-only step launches no extend kernel
and a prefill-only step no decode kernel. Outputs equal ReferenceAttention's within rounding.

What depends only on the step (which requests decode, how to split their contexts, the extend
tiles and the split scratch buffers) is computed from the metadata's host arrays on the first
layer and reused by the others: forward never waits for the GPU and has no per-request Python loop.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from core.execution.attention.backend import AttentionBackend, AttentionMetadata
from core.execution.attention.triton_decode import (
    MIN_SPLIT_TOKENS,
    DecodeSplits,
    decode_attention,
    decode_tiles,
    plan_splits,
)
from core.execution.attention.triton_extend import (
    ExtendTiles,
    extend_attention,
    extend_tiles,
    extend_work_list,
)
from core.execution.attention.triton_kv_write import write_kv_paged
from core.execution.kv_cache import FP8_KV_DTYPE

# The Triton interpreter (CPU) runs programs one after another: a few "SMs" keep test launches small.
INTERPRETER_NUM_SMS = 4
# CUDA's limit on the second grid dimension, which counts extend tiles.
MAX_GRID_Y = 65535


@dataclass(frozen=True)
class _StepLaunch:
    """How this step's attention is launched; built once per step (per AttentionMetadata)."""

    meta: AttentionMetadata  # the step it belongs to, compared by identity
    shape_key: tuple  # (q_heads, kv_heads, head_dim, dtype, device) it was sized for
    splits: DecodeSplits | None  # None: no request decodes this step
    partial_out: torch.Tensor | None  # float32 [B, q_heads, num_splits, head_dim] when split
    partial_lse: torch.Tensor | None  # float32 [B, q_heads, num_splits]
    tiles: ExtendTiles | None  # None: no request has two or more queries
    work: torch.Tensor | None  # int32 [2, num_tiles] on the device
    fresh: bool = False  # every extending request has no cached prefix: its keys are the step's own


class TritonAttention(AttentionBackend):
    name = "triton"
    supports_decode_graphs = True

    def __init__(self, device: torch.device | str = "cuda", min_split_tokens: int = MIN_SPLIT_TOKENS) -> None:
        device = torch.device(device)
        if device.type == "cuda":
            index = device.index if device.index is not None else torch.cuda.current_device()
            self.num_sms = torch.cuda.get_device_properties(index).multi_processor_count
        else:
            self.num_sms = INTERPRETER_NUM_SMS
        self.min_split_tokens = min_split_tokens
        self._step: _StepLaunch | None = None

    def forward(self, q, k, v, k_cache, v_cache, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        write_kv_paged(k, v, k_cache, v_cache, meta.kv_index)
        return self.attend(q, k_cache, v_cache, meta, scale, step_kv=(k, v))

    def launch_state(self) -> _StepLaunch | None:
        """The last step's launch, whose split scratch buffers (partial_out, partial_lse) a graph writes."""
        return self._step

    def attend(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata,
               scale: float, step_kv: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """Attention of every query over its request's pages (K/V already written): [T, q_heads, head_dim].
        `step_kv`: the step's own (k, v), which the extend kernel reads instead of the pages when no
        extending request has a cached prefix and the cache holds them unrounded (its dtype is q's)."""
        if q.stride(-1) != 1:
            q = q.contiguous()
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        if q.shape[0] == 0:
            return out
        step = self._launch_for(q, k_cache, v_cache, meta)
        if step.splits is not None:
            decode_attention(q, k_cache, v_cache, out, meta.block_table, meta.seq_lens, meta.query_start,
                             scale, step.splits, step.partial_out, step.partial_lse)
        if step.tiles is not None:
            fresh_kv = step_kv if step.fresh and k_cache.dtype == q.dtype else None
            extend_attention(q, k_cache, v_cache, out, meta.block_table, meta.seq_lens, meta.query_start,
                             scale, step.work, step.tiles, fresh_kv)
        return out

    def _launch_for(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    meta: AttentionMetadata) -> _StepLaunch:
        shape_key = (q.shape[1], k_cache.shape[2], q.shape[2], k_cache.dtype, q.device)
        step = self._step
        if step is not None and step.meta is meta and step.shape_key == shape_key:
            return step
        _check_shapes(q, k_cache, v_cache)
        self._step = step = self._plan_step(q, k_cache, meta, shape_key)
        return step

    def _plan_step(self, q: torch.Tensor, k_cache: torch.Tensor, meta: AttentionMetadata,
                   shape_key: tuple) -> _StepLaunch:
        num_q_heads, head_dim = q.shape[1], q.shape[2]
        num_kv_heads = k_cache.shape[2]
        if meta.static_shapes:
            return self._plan_graph_step(q, k_cache, meta, shape_key)
        query_lens = np.diff(meta.query_start_cpu)
        num_reqs = len(query_lens)
        decodes = query_lens == 1
        splits = partial_out = partial_lse = None
        if decodes.any():
            longest = int(meta.seq_lens_cpu[decodes].max())
            splits = plan_splits(int(decodes.sum()), num_kv_heads, longest, self.num_sms,
                                 decode_tiles(q.dtype).block_n, self.min_split_tokens)
            if splits.num_splits > 1:
                partial_out = torch.empty(num_reqs, num_q_heads, splits.num_splits, head_dim,
                                          dtype=torch.float32, device=q.device)
                partial_lse = torch.empty(num_reqs, num_q_heads, splits.num_splits,
                                          dtype=torch.float32, device=q.device)
        tiles = work = None
        extends = query_lens >= 2
        fresh = all_extends_fresh(query_lens, meta.seq_lens_cpu)
        if extends.any():
            longest_keys = int(meta.seq_lens_cpu[extends].max())
            tiles = extend_tiles(q.dtype, int(query_lens.max()), longest_keys)
            work_cpu = extend_work_list(meta.query_start_cpu, meta.seq_lens_cpu, tiles.block_m)
            if work_cpu.shape[1] > MAX_GRID_Y:
                raise ValueError(f"step has {work_cpu.shape[1]} extend tiles of {tiles.block_m} queries; "
                                 f"the launch grid allows {MAX_GRID_Y}")
            work = torch.from_numpy(work_cpu)
            if q.device.type == "cuda":
                work = work.pin_memory()  # so the copy below is truly asynchronous
            work = work.to(q.device, non_blocking=True)
        return _StepLaunch(meta, shape_key, splits, partial_out, partial_lse, tiles, work, fresh)


    def _plan_graph_step(self, q: torch.Tensor, k_cache: torch.Tensor, meta: AttentionMetadata,
                         shape_key: tuple) -> _StepLaunch:
        """A decode launch fixed by the batch size alone: each request splits its own context into
        the same number of parts (computed in the kernel from its seq_len), so one captured graph
        serves every mix of lengths up to meta.max_seq_len."""
        num_reqs, num_q_heads, head_dim = len(meta.seq_lens_cpu), q.shape[1], q.shape[2]
        sized = plan_splits(num_reqs, k_cache.shape[2], meta.max_seq_len, self.num_sms,
                            decode_tiles(q.dtype).block_n, self.min_split_tokens)
        splits = DecodeSplits(sized.num_splits, 0)
        partial_out = partial_lse = None
        if splits.num_splits > 1:
            partial_out = torch.empty(num_reqs, num_q_heads, splits.num_splits, head_dim,
                                      dtype=torch.float32, device=q.device)
            partial_lse = torch.empty(num_reqs, num_q_heads, splits.num_splits, dtype=torch.float32,
                                      device=q.device)
        return _StepLaunch(meta, shape_key, splits, partial_out, partial_lse, None, None)


def all_extends_fresh(query_lens: np.ndarray, seq_lens: np.ndarray) -> bool:
    """Whether a step has requests with two or more queries and none of them has a cached prefix,
    so the extend kernel may read their keys from the step's own K/V rows (FRESH)."""
    extends = query_lens >= 2
    return bool(extends.any()) and bool((seq_lens[extends] == query_lens[extends]).all())


def _check_shapes(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    num_q_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads = k_cache.shape[2]
    if k_cache.shape != v_cache.shape or k_cache.stride() != v_cache.stride() or k_cache.stride(-1) != 1:
        raise ValueError(f"K cache {tuple(k_cache.shape)} / {k_cache.stride()} and V cache "
                         f"{tuple(v_cache.shape)} / {v_cache.stride()} need equal shapes and strides "
                         f"with head_dim contiguous")
    if k_cache.shape[3] != head_dim:
        raise ValueError(f"q has head_dim {head_dim}, the KV cache {k_cache.shape[3]}")
    if num_q_heads % num_kv_heads:
        raise ValueError(f"{num_q_heads} query heads are not a multiple of {num_kv_heads} KV heads")
    if k_cache.dtype not in (q.dtype, FP8_KV_DTYPE):
        raise ValueError(f"q is {q.dtype} but the KV cache is {k_cache.dtype} (the model's dtype or fp8)")
