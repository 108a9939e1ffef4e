"""ModelRunner: one rank's model shard, KV-cache shard and sampler; turns a StepPlan into a StepResult.

`execute(plan)` is `finish(launch(plan))`. `launch` queues the step's device work (inputs, forward,
sampler, the copies back to the host) and returns at once on a GPU; `finish` waits for it and builds
the StepResult. Between the two the executor may launch the next step, which is how async
scheduling keeps the GPU fed: that step's placeholder inputs (plan.prev_row) are filled on the
device from the tokens this runner sampled in the step before. Every TP rank runs the forward; only
rank 0 gets logits, samples and returns a result (`finish` gives the other ranks None). With async
scheduling on a TP replica, rank 0 broadcasts each step's sampled tokens so that every rank can
fill the next step's placeholders.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from core.config import EngineConfig
from core.execution.attention import make_backend
from core.execution.attention.backend import AttentionBackend, AttentionMetadata
from core.execution.decode_graphs import DecodeGraphs
from core.execution.distributed import TPGroup
from core.execution.host_to_device import to_device
from core.execution.kv_cache import FP8_KV_DTYPE, KVCache
from core.execution.mkl_vml import resolve_vml_dispatch
from core.execution.model.causal_lm import CausalLM
from core.execution.model.layers import finish_loading
from core.execution.model.loader import TORCH_DTYPES, load_checkpoint, load_dummy
from core.execution.prompt_logprobs import PromptScores, prompt_targets, score_prompt
from core.execution.registry import registered_class
from core.execution.sampler import Sampler, SamplingTensors
from core.execution.startup_phases import StartupPhases
from core.execution.structured_rows import StructuredRows
from core.execution.token_rows import TOKEN_ROWS_MAX_EXTRA_KV_READS, as_token_rows, extra_kv_reads
from core.execution.warmup_steps import compile_warmup_steps, warmup_plan
from core.plan import StepPlan, StepResult
from core.registry import MODEL_TYPES
from core.structured.token_masks import Vocabulary

# Without a GPU to profile, a CPU replica gives its KV cache this much memory unless told otherwise.
CPU_KV_CACHE_BYTES = 1 << 30


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype):
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def build_model(config: EngineConfig, tp: TPGroup, show_progress: bool = True) -> CausalLM:
    """Construct this rank's shard of the model class registered for the config's model_type, on its
    device, and fill it (checkpoint or dummy weights)."""
    resolve_vml_dispatch()  # before the first sizable float op of a CPU process (core/execution/mkl_vml.py)
    dtype = TORCH_DTYPES[config.model.dtype]
    device = torch.device(config.device)
    model_class = registered_class(MODEL_TYPES, config.model.model_type, "model type")
    with torch.device(device), _default_dtype(dtype):
        model = model_class(config.model, tp)
    if config.model.weights_are_dummy:
        load_dummy(model, config.seed, device, dtype)
    else:
        load_checkpoint(model, config.model.model_path, show_progress=show_progress)
    with torch.no_grad():
        finish_loading(model)
    return model.eval()


@dataclass
class LaunchedStep:
    """A step whose device work is queued; `finish` turns it into a StepResult."""

    plan: StepPlan
    start_s: float
    has_result: bool  # rank 0: finish returns a StepResult; the other TP ranks get None
    rows: np.ndarray  # the requests that sample
    # device-to-host copies in flight: token_ids, logprobs, top ids/logprobs, prompt scores
    host: dict[str, torch.Tensor]
    done: torch.cuda.Event | None  # recorded after the copies; None on the CPU (already done)
    prompt_start: np.ndarray | None = None  # PromptScores.start when the step scored prompt tokens

    def ready(self) -> bool:
        return self.done is None or self.done.query()

    def sampled_tokens(self) -> np.ndarray:
        """The tokens sampled per request of the plan (0 where none), once the step is done."""
        if self.done is not None:
            self.done.synchronize()
        tokens = np.zeros(self.plan.num_reqs, np.int32)
        tokens[self.rows] = self.host["token_ids"].numpy()
        return tokens


class ModelRunner:
    def __init__(self, config: EngineConfig, tp: TPGroup | None = None, num_pages: int | None = None,
                 backend: AttentionBackend | None = None, show_progress: bool = True,
                 memory_share: float = 1.0, load_vocabulary: Callable[[], Vocabulary] | None = None) -> None:
        """`load_vocabulary`: the tokenizer's tokens for structured outputs, loaded on first use."""
        self.config = config
        self.tp = tp = tp or TPGroup()
        self.device = torch.device(config.device)
        self.dtype = TORCH_DTYPES[config.model.dtype]
        self.backend = backend or make_backend(config.attention_backend, self.device)
        self.phases = StartupPhases(show_progress)  # each phase of the start-up logged with its time
        with self.phases.phase("loading weights"):
            self.model = build_model(config, tp, show_progress=show_progress)
        self.sampler = Sampler()
        self.structured = StructuredRows(load_vocabulary or _no_vocabulary)
        # The fraction of the card this runner may plan with: 1/N when N executors share one card.
        self.memory_share = memory_share
        self.num_pages = num_pages or config.cache.num_pages or self._num_pages_that_fit()
        if self.device.type == "cuda":
            with self.phases.phase("compiling kernels"):
                self._compile_kernels()
        self.kv_cache = self._allocate_kv_cache(self.num_pages)
        self.graphs = self._capture_graphs()
        # The tokens sampled at each row of the previous step, for the next step's placeholders; a TP
        # replica with async scheduling shares them from rank 0 every step.
        self._prev_tokens = torch.zeros(config.scheduler.max_num_seqs, dtype=torch.long, device=self.device)
        self.shares_samples = config.scheduler.async_scheduling and self.tp.size > 1
        self._previous: LaunchedStep | None = None  # rank 0: the last step, whose tokens placeholders take

    # --- memory --------------------------------------------------------------------------------

    def _page_bytes(self) -> int:
        m = self.config.model
        return KVCache.bytes_per_page(m.num_layers, self.config.cache.block_size,
                                      m.num_kv_heads // self.tp.size, m.head_dim, self.kv_dtype)

    def _allocate_kv_cache(self, num_pages: int) -> KVCache:
        m = self.config.model
        return KVCache(m.num_layers, num_pages, self.config.cache.block_size, m.num_kv_heads // self.tp.size,
                       m.head_dim, self.kv_dtype, self.device)

    @property
    def kv_dtype(self) -> torch.dtype:
        return self.dtype if self.config.cache.kv_cache_dtype == "auto" else FP8_KV_DTYPE

    def _num_pages_that_fit(self) -> int:
        if self.device.type != "cuda":
            return max(1, CPU_KV_CACHE_BYTES // self._page_bytes())
        with self.phases.phase("profiling memory"):
            peak = self.profile_peak_memory()
        total = torch.cuda.get_device_properties(self.device).total_memory
        budget = int(self.config.cache.gpu_memory_utilization * self.memory_share * total) - peak
        num_pages = budget // self._page_bytes()
        if num_pages < 1:
            raise RuntimeError(
                f"rank tp={self.tp.rank}: no memory left for the KV cache: the weights and a warm-up step "
                f"of {self.config.scheduler.max_num_batched_tokens} tokens peak at {peak / 2**30:.1f} GiB "
                f"of its {self.memory_share * total / 2**30:.1f} GiB share of the card; raise "
                f"gpu_memory_utilization, lower max_num_batched_tokens or use a larger tp_size"
            )
        return int(num_pages)

    def profile_peak_memory(self) -> int:
        """Peak GPU bytes of the weights plus one forward at the largest step the scheduler plans,
        its tokens scored as a prompt with the most top logprobs (core/execution/prompt_logprobs.py).
        Reserved, not allocated, bytes: the allocator's segments that stay half used after loading
        (a quantized weight's bf16 source freed around it) are lost to the KV cache all the same;
        counting only allocated bytes left two FP8 replicas sharing an 80 GB card 3.2 GB short each."""
        block_size = self.config.cache.block_size
        num_tokens = min(self.config.scheduler.max_num_batched_tokens, self.config.max_model_len)
        torch.cuda.empty_cache()
        scratch = self._allocate_kv_cache(-(-num_tokens // block_size))
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        most_logprobs = np.array([self.config.scheduler.max_logprobs], np.int32)
        plan = dataclasses.replace(warmup_plan([(0, num_tokens)], block_size, self.config.model.vocab_size),
                                   num_prompt_logprobs=most_logprobs)
        self.forward(plan, scratch)
        torch.cuda.synchronize(self.device)
        peak = torch.cuda.max_memory_reserved(self.device)
        del scratch
        torch.cuda.empty_cache()
        return peak

    def _compile_kernels(self) -> None:
        """Run the compile_warmup_steps on a scratch cache (freed after)."""
        scheduler, block_size = self.config.scheduler, self.config.cache.block_size
        steps = compile_warmup_steps(self.config.max_model_len, scheduler.max_num_batched_tokens)
        if not steps:
            return
        pages = max(sum(-(-(c + n) // block_size) for c, n in step) for step in steps)
        scratch = self._allocate_kv_cache(pages)
        for step in steps:
            self.forward_logits(warmup_plan(step, block_size, self.config.model.vocab_size), scratch)
        torch.cuda.synchronize(self.device)
        del scratch
        torch.cuda.empty_cache()

    def _capture_graphs(self) -> DecodeGraphs | None:
        """CUDA graphs of the decode step, with a backend that supports them, for every batch size
        whose all-reduces the TP group can capture (see decode_graphs)."""
        if self.device.type != "cuda" or self.config.enforce_eager or not self.backend.supports_decode_graphs:
            return None
        max_batch = self.graph_batch_limit()
        if max_batch == 0:
            return None
        capturing = f"capturing decode CUDA graphs up to batch {max_batch}"
        with torch.inference_mode(), self.phases.phase(capturing):
            return DecodeGraphs(self.model, self.backend, self.kv_cache, max_batch, self.config.max_model_len,
                                self.device, self.tp)

    def graph_batch_limit(self) -> int:
        """The largest decode batch (up to max_num_seqs) whose all-reduces, [batch, hidden] in the
        model's dtype, the TP group can capture in a graph; 0: none."""
        row_bytes = self.config.model.hidden_size * self.dtype.itemsize
        max_batch = self.config.scheduler.max_num_seqs
        if self.tp.captures_all_reduce(max_batch * row_bytes):
            return max_batch
        custom = self.tp.custom_all_reduce  # a gloo group: only what the kernel takes
        return 0 if custom is None else min(max_batch, custom.max_bytes // row_bytes)

    # --- the step ------------------------------------------------------------------------------

    def execute(self, plan: StepPlan) -> StepResult | None:
        """Run one step; rank 0 returns the sampled tokens, the other TP ranks None."""
        return self.finish(self.launch(plan))

    @torch.inference_mode()
    def launch(self, plan: StepPlan) -> LaunchedStep:
        """Queue the step's device work and return the handle `finish` waits on."""
        start = time.perf_counter()
        logits, rows, prompt = self.forward(plan)
        host: dict[str, torch.Tensor] = {}
        non_blocking = self.device.type == "cuda"  # into pinned memory, read after the event
        if prompt is not None and prompt.logprobs is not None:
            for name in ("logprobs", "ranks", "top_ids", "top_logprobs"):
                host[f"prompt_{name}"] = getattr(prompt, name).to("cpu", non_blocking=non_blocking)
        if not self.tp.is_first_rank:
            if self.shares_samples and len(rows):
                tokens = torch.empty(len(rows), dtype=torch.long, device=self.device)
                self._prev_tokens[to_device(rows, self.device)] = self.tp.broadcast_from_first(tokens)
        elif len(rows):
            allowed = (self.structured.masks(plan, rows, self._previous_tokens) if len(plan.grammar_spec)
                       else None)
            st = SamplingTensors.from_plan(plan, rows, self.device, allowed)
            drawn = (self.graphs.sample(st) if allowed is None and self._graphed(plan)
                     and self.graphs.can_sample(st) else None)
            out = self.sampler(logits, st, drawn=drawn)
            tokens = out.token_ids.long()
            if self.shares_samples:
                self.tp.broadcast_from_first(tokens)
            self._prev_tokens[to_device(rows, self.device)] = tokens
            host["token_ids"] = out.token_ids.to("cpu", non_blocking=non_blocking)
            if out.sampled_logprobs is not None:
                host["sampled_logprobs"] = out.sampled_logprobs.to("cpu", non_blocking=non_blocking)
            if out.top_token_ids is not None:
                host["top_token_ids"] = out.top_token_ids.to("cpu", non_blocking=non_blocking)
                host["top_logprobs"] = out.top_logprobs.to("cpu", non_blocking=non_blocking)
        done = None
        if self.device.type == "cuda":
            done = torch.cuda.Event()
            done.record()
        launched = LaunchedStep(plan, start, self.tp.is_first_rank, rows, host, done,
                                None if prompt is None else prompt.start)
        if self.tp.is_first_rank:
            self._previous = launched
        return launched

    def _previous_tokens(self) -> np.ndarray:
        if self._previous is None:
            raise RuntimeError("a placeholder refers to a previous step, but this runner has run none")
        return self._previous.sampled_tokens()

    def finish(self, launched: LaunchedStep) -> StepResult | None:
        """Wait for a launched step; rank 0 gets its result, the other TP ranks None."""
        if launched.done is not None:
            launched.done.synchronize()
        if not launched.has_result:
            return None
        plan, rows = launched.plan, launched.rows
        sampled = np.zeros(plan.num_reqs, dtype=np.int32)
        result = {}
        if len(rows):
            sampled[rows] = launched.host["token_ids"].numpy()
            for name in ("sampled_logprobs", "top_token_ids", "top_logprobs"):
                if name in launched.host:
                    result[name] = _scatter(launched.host[name], rows, plan.num_reqs)
        if launched.prompt_start is not None:
            result["prompt_logprob_start"] = launched.prompt_start
            result.update({f"prompt_{name}": launched.host[f"prompt_{name}"].numpy()
                           for name in ("logprobs", "ranks", "top_ids", "top_logprobs")})
        elapsed_ms = (time.perf_counter() - launched.start_s) * 1e3
        return StepResult(step_id=plan.step_id, replica=plan.replica, sampled_token_ids=sampled,
                          timings_ms={"execute": elapsed_ms}, **result)

    def _fill_placeholders(self, plan: StepPlan, input_ids: torch.Tensor) -> None:
        """Put the previous step's sampled tokens where the plan has placeholder inputs."""
        rows = plan.placeholder_rows
        if not len(rows):
            return
        if self.tp.size > 1 and not self.shares_samples:
            raise RuntimeError(f"step {plan.step_id} has placeholder inputs, but this TP rank does not "
                               f"receive the sampled tokens (async scheduling is off)")
        # One copy: where each placeholder sits in the step's tokens, and the previous step's row it reads.
        at, source = to_device(np.stack([plan.query_start[rows], plan.prev_row[rows]]).astype(np.int64),
                               self.device)
        input_ids[at] = self._prev_tokens[source]

    def _graphed(self, plan: StepPlan) -> bool:
        """Whether the step's forward (and, where it can, its sampling) replays a decode graph."""
        return self.graphs is not None and self.graphs.can_run(plan)

    def _graphed_as_token_rows(self, plan: StepPlan) -> bool:
        """Whether a step that is not a pure decode replays a decode graph, one row per token
        (core/execution/token_rows.py): --small-step-graphs, the step's tokens within the ladder and
        its rows' extra K/V reads within the bound."""
        return (self.config.small_step_graphs and self.graphs is not None
                and 0 < plan.num_tokens <= self.graphs.max_batch
                and extra_kv_reads(plan) <= TOKEN_ROWS_MAX_EXTRA_KV_READS)

    def forward_logits(self, plan: StepPlan, kv_cache: KVCache | None = None
                       ) -> tuple[torch.Tensor | None, np.ndarray]:
        """Float32 logits [N, vocab] of the rows that sample (rank 0; None elsewhere) and those rows."""
        logits, rows, _ = self.forward(plan, kv_cache)
        return logits, rows

    @torch.inference_mode()
    def forward(self, plan: StepPlan, kv_cache: KVCache | None = None
                ) -> tuple[torch.Tensor | None, np.ndarray, PromptScores | None]:
        """forward_logits, and the scores of the prompt tokens the plan asks for (None: it asks none)."""
        targets = prompt_targets(plan)
        if kv_cache is None and targets is None and self._graphed(plan):
            logits = self.graphs.run(plan, fill=lambda ids: self._fill_placeholders(plan, ids))
            return logits, plan.sampled_rows, None
        if kv_cache is None and targets is None and self._graphed_as_token_rows(plan):
            # A row per token, in the step's token order: the placeholders sit where they do in the plan.
            logits = self.graphs.run(as_token_rows(plan), fill=lambda ids: self._fill_placeholders(plan, ids))
            rows = plan.sampled_rows
            if logits is None or not len(rows):
                return None, rows, None
            return logits[to_device(plan.logits_index[rows], self.device).long()], rows, None
        kv_cache = kv_cache or self.kv_cache
        device = self.device
        input_ids = to_device(plan.input_ids, device).long()
        self._fill_placeholders(plan, input_ids)
        positions = to_device(plan.positions, device).long()
        meta = AttentionMetadata.from_plan(plan, device)
        hidden = self.model(input_ids, positions, kv_cache, self.backend, meta)  # [T, hidden]
        prompt = None if targets is None else score_prompt(hidden, targets, self.model.compute_logits)
        rows = plan.sampled_rows
        if not len(rows):
            return None, rows, prompt
        logits_index = to_device(plan.logits_index[rows], device).long()
        return self.model.compute_logits(hidden[logits_index]), rows, prompt  # [N, vocab] on rank 0


def _no_vocabulary() -> Vocabulary:
    raise RuntimeError("a request asks for a structured output; this runner was given no vocabulary")


def _scatter(values: torch.Tensor, rows: np.ndarray, num_reqs: int) -> np.ndarray:
    host = values.numpy()
    out = np.zeros((num_reqs, *host.shape[1:]), dtype=host.dtype)
    out[rows] = host
    return out
