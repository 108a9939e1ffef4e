"""What the checkpoint is: `ModelConfig`, read from a Hugging Face config.json (its sampling
defaults from core/generation_defaults.py, its quantization from core/quantization.py, its RoPE
scaling from core/rope_scaling.py) or taken from a built-in preset (`PRESETS`: the Qwen3-14B shape,
and a tiny one for the CPU). How it is served is core/config.py's.
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
    quantize_at_load,
    read_quantization_config,
)
from core.registry import LINEAR_METHODS, MODEL_TYPES
from core.rope_scaling import RopeScalingError, YarnScaling, read_rope_scaling

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
