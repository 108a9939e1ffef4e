"""DecodeGraphs: the decode forward (every request one new token) captured as CUDA graphs.

An eager decode step launches hundreds of small kernels from Python, one layer after another, and
at small batches the GPU waits on the launches: the weight-read floor of Qwen3-14B is 6.5 ms a
step, eager launching alone costs tens. A graph replays the whole forward, logits included, with
one launch. Graphs are captured once at startup for a ladder of batch sizes; a step of B requests
replays the smallest captured size >= B, its inputs copied into the graph's static buffers and the
rows past B padded: no query (the attention kernels skip them), KV slot -1 (nothing is written).
Steps that are not pure decodes, or larger than the ladder, run eagerly. Graphs never change
outputs: the same kernels run on the same data.

On a TP replica every rank captures the same ladder and replays the same size in lockstep (each
decides from the same plan), the all-reduces inside the graphs: the one-shot kernel of
core/execution/custom_all_reduce.py for the sizes it takes, NCCL's captured collectives above it
(a gloo group, which moves CUDA tensors through the host, gets graphs only up to the largest size
the kernel takes). There the graph ends at the hidden states: the logits (the vocabulary-parallel
lm_head and the gather to rank 0) and rank 0's broadcast of the sampled tokens run eagerly after the
replay, and rank 0 copies the logits into the sampling graph's static buffer.

Each size also has a sampling graph, replayed right after the forward when a step samples randomly:
the argmax, the top-k pass and the two sampling kernels of core/execution/sampler.py's `sample_tokens`, over
the forward's logits, with the rows' settings copied into static buffers (padding rows get
temperature 0, which the kernels skip). It takes every row whose top_k is below GRAPH_CANDIDATES
and any top_p / min_p; a step with penalties or a larger top_k samples eagerly, from the same
logits. A step where every row is greedy takes the argmax eagerly: one kernel.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable

import numpy as np
import torch

from core.execution.attention.backend import AttentionBackend, AttentionMetadata
from core.execution.distributed import TPGroup
from core.execution.host_to_device import pinned
from core.execution.kv_cache import KVCache
from core.execution.sampler import DrawSettings, SamplingTensors, candidate_count, sampling_kernels
from core.plan import StepPlan

# Candidates the sampling graph takes per row: rows with a top_k up to 63 (Qwen3's default is 20).
GRAPH_CANDIDATES = 64

# Batch sizes captured (up to max_num_seqs): dense where decode batches usually are.
LADDER = (1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384, 512)


class DecodeGraphs:
    def __init__(self, model: torch.nn.Module, backend: AttentionBackend, kv_cache: KVCache,
                 max_batch: int, max_seq_len: int, device: torch.device, tp: TPGroup | None = None) -> None:
        tp = tp or TPGroup()
        self.sizes = [s for s in LADDER if s < max_batch] + [max_batch]
        self.max_batch = max_batch
        self.model = model
        # One rank: the graph ends at the logits. TP: at the hidden states (the logits' gather is eager).
        self.logits_in_graph = tp.group is None
        self.vocab_size = model.config.vocab_size
        # TP rank 0: the step's logits, copied in after the replay, that the sampling graphs read.
        self._static_logits = None
        if not self.logits_in_graph and tp.is_first_rank:
            self._static_logits = torch.zeros(max_batch, self.vocab_size, dtype=torch.float32, device=device)
        block_size = kv_cache.block_size
        max_pages = -(-max_seq_len // block_size)
        # Static inputs: every graph reads its first `size` rows of these.
        self.input_ids = torch.zeros(max_batch, dtype=torch.long, device=device)
        self.positions = torch.zeros(max_batch, dtype=torch.long, device=device)
        self.kv_index = torch.full((max_batch,), -1, dtype=torch.long, device=device)
        self.seq_lens = torch.ones(max_batch, dtype=torch.int32, device=device)
        self.query_start = torch.arange(max_batch + 1, dtype=torch.int32, device=device)
        self.block_table = torch.zeros(max_batch, max_pages, dtype=torch.int32, device=device)
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._outputs: dict[int, torch.Tensor] = {}  # per size: the logits, or on TP the hidden states
        self._keep: list[object] = []  # per graph, the backend's launch_state (split scratch) it writes
        # The sampling graphs' static settings (every graph reads its first `size` rows) and draws.
        self.draw_settings = DrawSettings.zeros(max_batch, device)
        self._sampling_graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._draws: dict[int, torch.Tensor] = {}
        self._last_size = 0
        pool = torch.cuda.graph_pool_handle()
        for size in reversed(self.sizes):  # largest first, so smaller graphs reuse its pool memory
            meta = AttentionMetadata(
                query_start=self.query_start[: size + 1], seq_lens=self.seq_lens[:size],
                block_table=self.block_table[:size], kv_index=self.kv_index[:size],
                query_start_cpu=np.arange(size + 1, dtype=np.int32),
                seq_lens_cpu=np.full(size, max_seq_len, dtype=np.int32),
                max_query_len=1, max_seq_len=max_seq_len, static_shapes=True,
            )
            self._forward(model, backend, kv_cache, meta, size)  # compiles kernels, sizes launches
            torch.cuda.synchronize(device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self._outputs[size] = self._forward(model, backend, kv_cache, meta, size)
            self._graphs[size] = graph
            self._keep.append(backend.launch_state())
            if sampling_kernels is not None and tp.is_first_rank:
                self._capture_sampling(size, pool)
        torch.cuda.synchronize(device)

    def _forward(self, model, backend, kv_cache, meta, size: int) -> torch.Tensor:
        hidden = model(self.input_ids[:size], self.positions[:size], kv_cache, backend, meta)
        # [size, vocab] float32 logits, or the [size, hidden] states on TP
        return model.compute_logits(hidden) if self.logits_in_graph else hidden

    def _capture_sampling(self, size: int, pool) -> None:
        settings = self.draw_settings.rows(slice(0, size))
        logits = self._outputs[size] if self.logits_in_graph else self._static_logits[:size]
        self.num_candidates = min(GRAPH_CANDIDATES, logits.shape[1])

        def draw() -> torch.Tensor:
            tokens = logits.argmax(dim=-1)
            values, ids = logits.topk(self.num_candidates, dim=-1)
            sampling_kernels.sample_candidates(values, ids, *settings, tokens)
            sampling_kernels.sample_full_rows(logits, *settings, tokens)
            return tokens

        draw()  # compiles the kernels outside the capture
        torch.cuda.synchronize(logits.device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            self._draws[size] = draw()
        self._sampling_graphs[size] = graph

    def can_sample(self, st: SamplingTensors) -> bool:
        """Whether the sampling graph draws this step's tokens: rows that sample randomly, none with
        penalties or a logit bias, every top_k one the graph's candidates hold (sampler.py's
        `candidate_count`)."""
        if (self._last_size not in self._sampling_graphs or st.all_greedy or st.any_penalties
                or st.any_bias):
            return False
        return candidate_count(st.max_top_k, self.vocab_size) <= self.num_candidates

    def sample(self, st: SamplingTensors) -> torch.Tensor:
        """The tokens [B] (int64) of the step just replayed by `run`, drawn by its sampling graph."""
        num_rows, size = st.num_rows, self._last_size
        for static, setting in zip(self.draw_settings, st.draw_settings):
            static[..., :num_rows].copy_(setting)
        self.draw_settings.temperature[num_rows:size].zero_()  # padding rows: greedy, which the kernels skip
        self._sampling_graphs[size].replay()
        return self._draws[size][:num_rows]

    def can_run(self, plan: StepPlan) -> bool:
        """A pure decode step (one token per request, each sampling) within the ladder."""
        num_reqs = plan.num_reqs
        return (0 < num_reqs <= self.max_batch and plan.num_tokens == num_reqs
                and bool((plan.logits_index >= 0).all()))

    def run(self, plan: StepPlan, fill: Callable[[torch.Tensor], None] | None = None) -> torch.Tensor | None:
        """Logits [B, vocab] of the step's B requests, in plan order (None on TP ranks other than 0).

        `fill`, when given, may patch the input ids (the graph's static buffer) before the replay."""
        num_reqs = plan.num_reqs
        size = self.sizes[bisect.bisect_left(self.sizes, num_reqs)]
        width = plan.block_table.shape[1]

        def put(dst: torch.Tensor, src: np.ndarray) -> None:
            dst.copy_(pinned(src), non_blocking=True)

        put(self.input_ids[:num_reqs], plan.input_ids)
        put(self.positions[:num_reqs], plan.positions)
        put(self.kv_index[:num_reqs], plan.kv_index)
        put(self.seq_lens[:num_reqs], plan.seq_lens)
        put(self.query_start[: num_reqs + 1], plan.query_start)
        put(self.block_table[:num_reqs, :width], plan.block_table)
        if fill is not None:
            fill(self.input_ids[:num_reqs])
        if size > num_reqs:  # padding rows: no query, no KV write
            self.query_start[num_reqs + 1 : size + 1].fill_(num_reqs)
            self.kv_index[num_reqs:size].fill_(-1)
        self._graphs[size].replay()
        self._last_size = size
        if self.logits_in_graph:
            return self._outputs[size][:num_reqs]
        logits = self.model.compute_logits(self._outputs[size][:num_reqs])  # every rank: the gather
        if logits is None or self._static_logits is None:
            return logits
        self._static_logits[:num_reqs].copy_(logits)
        return self._static_logits[:num_reqs]
