"""Frozen, validated configuration of a Cadence deployment.

ModelConfig describes the checkpoint (from a Hugging Face config.json or a built-in preset; its
sampling defaults come from core/generation_defaults.py);
ParallelConfig, CacheConfig and SchedulerConfig describe how it is served. Every check happens in
`__post_init__`, and every error says what to change. `EngineConfig` ties them together and checks
the combinations (tp must divide the heads, the vocabulary, ...).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path

from core.config_error import ConfigError
from core.generation_defaults import QWEN3_GENERATION_DEFAULTS, GenerationDefaults, read_generation_config
from core.quantization import (
    Fp8Config,
    QuantizationError,
    fp8_shard_problem,
    quantize_at_load,
    read_quantization_config,
)
from core.registry import LINEAR_METHODS, MODEL_TYPES, attention_backend_choices
from core.rope_scaling import RopeScalingError, YarnScaling, read_rope_scaling
from core.sampling_params import DEFAULT_MAX_LOGPROBS

DTYPES = ("float32", "bfloat16", "float16")
LOAD_FORMATS = ("auto", "safetensors", "dummy")


@dataclass(frozen=True)
class ModelConfig:
    name: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 40960
    rope_scaling: YarnScaling | None = None  # config.json's YaRN (core/rope_scaling.py); None: plain RoPE
    tie_word_embeddings: bool = False
    bos_token_id: int | None = 151643
    eos_token_id: int | None = 151645
    dtype: str = "bfloat16"
    # Where the weights and tokenizer live; None for a preset served with dummy weights.
    model_path: str | None = None
    load_format: str = "auto"
    generation: GenerationDefaults = field(default_factory=GenerationDefaults)
    model_type: str = "qwen3"  # config.json's model_type: which model class serves it (core/registry.py)
    # config.json's quantization_config.quant_method (or --quantization): the LinearMethod that holds
    # and multiplies the linear weights; None: they are stored and multiplied in `dtype`.
    quantization: str | None = None
    # The checked quantization_config of an fp8 model (core/quantization.py); None otherwise.
    quantization_config: Fp8Config | None = None

    def __post_init__(self) -> None:
        for name in ("hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads",
                     "head_dim", "vocab_size", "max_position_embeddings"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"model {self.name}: {name} must be positive, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(
                f"model {self.name}: num_attention_heads {self.num_heads} is not a multiple of "
                f"num_key_value_heads {self.num_kv_heads}"
            )
        if self.model_type not in MODEL_TYPES:
            raise ConfigError(f"model {self.name}: model_type {self.model_type!r} is not served: "
                              f"use one of {', '.join(MODEL_TYPES)}")
        if self.quantization not in LINEAR_METHODS:
            raise ConfigError(f"model {self.name}: quantization {self.quantization!r} is not supported: "
                              f"Cadence loads {_quantization_names()}")
        if (self.quantization == "fp8") != (self.quantization_config is not None):
            raise ConfigError(f"model {self.name}: quantization {self.quantization!r} with "
                              f"quantization_config "
                              f"{self.quantization_config}: fp8, and only fp8, needs its Fp8Config")
        if self.dtype not in DTYPES:
            raise ConfigError(f"unknown dtype {self.dtype!r}: use one of {', '.join(DTYPES)}")
        if self.load_format not in LOAD_FORMATS:
            raise ConfigError(
                f"unknown load format {self.load_format!r}: use one of {', '.join(LOAD_FORMATS)}"
            )
        if self.load_format == "safetensors" and self.model_path is None:
            raise ConfigError(f"model {self.name}: load format safetensors needs a model directory")

    @property
    def max_positions(self) -> int:
        """The longest context the model computes: max_position_embeddings, or YaRN's scaled one."""
        scaled = self.rope_scaling.max_positions if self.rope_scaling is not None else 0
        return max(self.max_position_embeddings, scaled)

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def weights_are_dummy(self) -> bool:
        return self.load_format == "dummy" or (self.load_format == "auto" and self.model_path is None)

    def kv_bytes_per_token(self, tp_size: int = 1) -> int:
        """K and V of every layer for one token on one TP rank."""
        itemsize = 4 if self.dtype == "float32" else 2
        return 2 * self.num_layers * (self.num_kv_heads // tp_size) * self.head_dim * itemsize

    def with_overrides(self, **kwargs) -> ModelConfig:
        return replace(self, **kwargs)

    def quantized_at_load(self, method: str) -> ModelConfig:
        """This model served with `--quantization method` (core/quantization.py `quantize_at_load`)."""
        try:
            fmt = quantize_at_load(method, self.quantization, self.name)
        except QuantizationError as exc:
            raise ConfigError(str(exc)) from None
        return self if fmt is None else replace(self, quantization=method, quantization_config=fmt)

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, hf_overrides: dict | None = None,
                        **overrides) -> ModelConfig:
        """Read a Hugging Face model directory's config.json (and generation_config.json);
        `hf_overrides` replaces config.json's fields of the same names (vLLM's --hf-overrides)."""
        directory = Path(path)
        config_file = directory / "config.json"
        if not config_file.is_file():
            raise ConfigError(f"{directory} is not a model directory: it has no config.json")
        try:
            hf = {**json.loads(config_file.read_text()), **(hf_overrides or {})}
        except (OSError, json.JSONDecodeError) as exc:
            raise ConfigError(f"cannot read {config_file}: {exc}") from exc
        model_type = hf.get("model_type")
        if model_type not in MODEL_TYPES:
            raise ConfigError(
                f"{config_file}: model_type is {model_type!r}; Cadence serves {', '.join(MODEL_TYPES)}"
            )
        quantization_fields = hf.get("quantization_config") or {}
        quantization = quantization_fields.get("quant_method")
        if quantization not in LINEAR_METHODS:
            raise ConfigError(f"{config_file}: quantization {quantization!r} is not supported: "
                              f"Cadence loads {_quantization_names()}")
        try:
            quantization_config = read_quantization_config(quantization, quantization_fields,
                                                           str(config_file))
        except QuantizationError as exc:
            raise ConfigError(str(exc)) from None
        if hf.get("attention_bias", False):
            raise ConfigError(f"{config_file}: attention_bias=true is not supported by Cadence's Qwen3")
        if hf.get("use_sliding_window", False):
            raise ConfigError(f"{config_file}: use_sliding_window=true is not supported by Cadence's Qwen3")
        try:
            rope_scaling = read_rope_scaling(hf, str(config_file))
        except RopeScalingError as exc:
            raise ConfigError(str(exc)) from None
        try:
            num_heads = hf["num_attention_heads"]
            hidden_size = hf["hidden_size"]
            eos = hf.get("eos_token_id")
            fields = dict(
                name=directory.name,
                hidden_size=hidden_size,
                intermediate_size=hf["intermediate_size"],
                num_layers=hf["num_hidden_layers"],
                num_heads=num_heads,
                num_kv_heads=hf.get("num_key_value_heads", num_heads),
                head_dim=hf.get("head_dim") or hidden_size // num_heads,
                vocab_size=hf["vocab_size"],
                rope_theta=float(hf.get("rope_theta", (hf.get("rope_parameters") or {}).get(
                    "rope_theta", 1_000_000.0))),
                rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
                max_position_embeddings=hf.get("max_position_embeddings", 40960),
                rope_scaling=rope_scaling,
                tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
                bos_token_id=hf.get("bos_token_id"),
                eos_token_id=eos[0] if isinstance(eos, list) else eos,
                dtype=_dtype_from_hf(hf.get("torch_dtype") or hf.get("dtype")),
                model_path=str(directory),
                generation=read_generation_config(directory, eos),
                model_type=model_type,
                quantization=quantization,
                quantization_config=quantization_config,
            )
        except KeyError as exc:
            raise ConfigError(f"{config_file} lacks the field {exc.args[0]!r}") from exc
        return cls(**{**fields, **overrides})

    @classmethod
    def from_name(cls, name_or_path: str, hf_overrides: dict | None = None, **overrides) -> ModelConfig:
        """A preset name (`qwen3-14b`, `qwen3-tiny`) or a model directory; `hf_overrides` as in
        from_pretrained (a preset, which has no config.json, takes only its context fields)."""
        if name_or_path in PRESETS:
            return replace(_preset_with(PRESETS[name_or_path], hf_overrides or {}), **overrides)
        if Path(name_or_path).is_dir():
            return cls.from_pretrained(name_or_path, hf_overrides, **overrides)
        raise ConfigError(
            f"{name_or_path!r} is neither a preset ({', '.join(PRESETS)}) nor a model directory"
        )


# The config.json fields a preset's --hf-overrides may set: its context (YaRN for long prompts).
_PRESET_OVERRIDES = ("max_position_embeddings", "rope_scaling", "rope_parameters")


def _preset_with(preset: ModelConfig, hf_overrides: dict) -> ModelConfig:
    unknown = sorted(set(hf_overrides) - set(_PRESET_OVERRIDES))
    if unknown:
        raise ConfigError(f"--hf-overrides: the preset {preset.name} takes only "
                          f"{', '.join(_PRESET_OVERRIDES)}; got {', '.join(unknown)} (serve a model "
                          "directory to override other fields)")
    if not hf_overrides:
        return preset
    hf = {"max_position_embeddings": preset.max_position_embeddings, **hf_overrides}
    if type(hf["max_position_embeddings"]) is not int:  # checked first: YaRN's default original context
        raise ConfigError(f"--hf-overrides: max_position_embeddings must be an integer, got "
                          f"{hf['max_position_embeddings']!r}")
    try:
        scaling = read_rope_scaling(hf, "--hf-overrides")
    except RopeScalingError as exc:
        raise ConfigError(str(exc)) from None
    return replace(preset, max_position_embeddings=hf["max_position_embeddings"], rope_scaling=scaling)


def _quantization_names() -> str:
    return ", ".join("unquantized checkpoints" if name is None else name for name in LINEAR_METHODS)


def _dtype_from_hf(value: str | None) -> str:
    if value in (None, "auto"):
        return "bfloat16"
    return str(value).removeprefix("torch.")


PRESETS: dict[str, ModelConfig] = {
    "qwen3-14b": ModelConfig(
        name="qwen3-14b",
        hidden_size=5120,
        intermediate_size=17408,
        num_layers=40,
        num_heads=40,
        num_kv_heads=8,
        head_dim=128,
        vocab_size=151936,
        rope_theta=1_000_000.0,
        rms_norm_eps=1e-6,
        max_position_embeddings=40960,
        tie_word_embeddings=False,
        generation=QWEN3_GENERATION_DEFAULTS,
    ),
    # The same architecture, small enough to serve on a laptop CPU: the real vocabulary (so the
    # real tokenizer works), 4 layers, GQA 4:2 with head_dim 64 != hidden / heads.
    "qwen3-tiny": ModelConfig(
        name="qwen3-tiny",
        hidden_size=128,
        intermediate_size=384,
        num_layers=4,
        num_heads=4,
        num_kv_heads=2,
        head_dim=64,
        vocab_size=151936,
        rope_theta=1_000_000.0,
        rms_norm_eps=1e-6,
        max_position_embeddings=40960,
        tie_word_embeddings=True,
        dtype="float32",
        generation=QWEN3_GENERATION_DEFAULTS,
    ),
}


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
