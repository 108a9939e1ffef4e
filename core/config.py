"""Frozen, validated configuration of a Cadence deployment.

ModelConfig (core/model_config.py) describes the checkpoint, from a Hugging Face config.json or a
built-in preset; ParallelConfig, CacheConfig and SchedulerConfig describe how it is served. Every
check happens in `__post_init__`, and every error says what to change. `EngineConfig` ties them
together and checks the combinations (tp must divide the heads, the vocabulary, ...).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from core.config_error import ConfigError
from core.model_config import ModelConfig
from core.quantization import fp8_shard_problem
from core.registry import attention_backend_choices
from core.sampling_params import DEFAULT_MAX_LOGPROBS


@dataclass(frozen=True)
class ParallelConfig:
    tp_size: int = 1
    dp_size: int = 1
    # True: every all-reduce of a TP group goes through torch.distributed (NCCL), never the one-shot
    # kernel of core/execution/custom_all_reduce.py.
    disable_custom_all_reduce: bool = False

    def __post_init__(self) -> None:
        for name in ("tp_size", "dp_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1, got {getattr(self, name)}")

    @property
    def world_size(self) -> int:
        return self.tp_size * self.dp_size


KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3")


@dataclass(frozen=True)
class CacheConfig:
    block_size: int = 16
    # None: executors size the pool from gpu_memory_utilization after profiling memory.
    num_pages: int | None = None
    gpu_memory_utilization: float = 0.90
    enable_prefix_caching: bool = True
    # "auto": K/V in the model's dtype; "fp8" (or vLLM's "fp8_e4m3"): float8 e4m3, scale 1
    # (core/execution/kv_cache.py).
    kv_cache_dtype: str = "auto"

    def __post_init__(self) -> None:
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ConfigError(f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, "
                              f"got {self.kv_cache_dtype!r}")
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise ConfigError(f"block_size must be a power of two (1, 2, 4, ..., 256), got {self.block_size}")
        if self.block_size > 256:
            raise ConfigError(f"block_size {self.block_size} is too large: use at most 256")
        if self.num_pages is not None and self.num_pages < 1:
            raise ConfigError(f"num_pages must be positive, got {self.num_pages}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ConfigError(
                f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}"
            )


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    # None: the model's max_position_embeddings.
    max_model_len: int | None = None
    enable_chunked_prefill: bool = True
    # Caps one request's share of a step so a long prompt does not starve the others; 0 = no cap.
    long_prefill_token_threshold: int = 0
    # Plan the next step while the current one runs (two steps in flight per replica), so the
    # scheduler and the IPC hide behind the GPU; on a TP replica rank 0 broadcasts each step's
    # sampled tokens to the other ranks. On an H200 it took concurrency-1 TPOT from 9.5 to 8.4 ms and
    # the GPU's idle share between steps from 8.6 % to 0.0 % (benchmarks/NOTES.md).
    async_scheduling: bool = True
    # The most top logprobs (per sampled or prompt token) a request may ask for.
    max_logprobs: int = DEFAULT_MAX_LOGPROBS

    def __post_init__(self) -> None:
        if self.max_logprobs < 0:
            raise ConfigError(f"max_logprobs must be >= 0, got {self.max_logprobs}")
        if self.max_num_seqs < 1:
            raise ConfigError(f"max_num_seqs must be at least 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens < 1:
            raise ConfigError(f"max_num_batched_tokens must be at least 1, got {self.max_num_batched_tokens}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ConfigError(f"max_model_len must be at least 2, got {self.max_model_len}")
        if self.long_prefill_token_threshold < 0:
            raise ConfigError(
                f"long_prefill_token_threshold must be >= 0, got {self.long_prefill_token_threshold}"
            )


@dataclass(frozen=True)
class EngineConfig:
    """Everything one deployment needs, checked as a whole."""

    model: ModelConfig
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    device: str = "cpu"
    seed: int = 0
    attention_backend: str = "auto"  # a name of core/registry.py's ATTENTION_BACKENDS, or auto
    enforce_eager: bool = False  # True: no CUDA graphs for decode steps
    # Small steps that are not pure decodes replayed by the decode graphs, one row per token
    # (core/execution/token_rows.py); measured on an H100: short prompts' TTFT less than half.
    small_step_graphs: bool = True

    def __post_init__(self) -> None:
        if self.attention_backend not in attention_backend_choices():
            raise ConfigError(f"unknown attention backend {self.attention_backend!r}: use one of "
                              f"{', '.join(attention_backend_choices())}")
        m, tp = self.model, self.parallel.tp_size
        for what, value in (("num_attention_heads", m.num_heads), ("num_key_value_heads", m.num_kv_heads),
                            ("intermediate_size", m.intermediate_size), ("vocab_size", m.vocab_size)):
            if value % tp:
                divisors = [d for d in range(1, min(value, 64) + 1) if _divides_all(m, d)]
                raise ConfigError(
                    f"tp_size {tp} does not divide {what} {value} of model {m.name}: "
                    f"use a tp_size in {divisors}"
                )
        problem = m.quantization == "fp8" and fp8_shard_problem(m.q_size, m.kv_size, m.intermediate_size, tp)
        if problem:
            raise ConfigError(f"model {m.name} in FP8: {problem}")
        max_len = self.scheduler.max_model_len
        if max_len is not None and max_len > m.max_positions:
            yarn = m.rope_scaling
            scaled = (f" (YaRN: {yarn.original_max_position_embeddings} x {yarn.factor:g})" if yarn
                      else " (max_position_embeddings)")
            raise ConfigError(
                f"max_model_len {max_len} exceeds the model's context of {m.max_positions} positions"
                f"{scaled}: lower --max-model-len"
            )
        if self.device.split(":")[0] not in ("cpu", "cuda"):
            raise ConfigError(f"unknown device {self.device!r}: use cpu or cuda")

    @property
    def max_model_len(self) -> int:
        return self.scheduler.max_model_len or self.model.max_positions


def _divides_all(m: ModelConfig, d: int) -> bool:
    return all(v % d == 0 for v in (m.num_heads, m.num_kv_heads, m.intermediate_size, m.vocab_size))
