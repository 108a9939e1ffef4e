"""A checkpoint's quantization format, read and checked without torch: what config.json's
`quantization_config` says, or what `--quantization` asks for.

Cadence serves one quantized format, Hugging Face's fine-grained FP8 as Qwen publishes it
(Qwen3-14B-FP8): every linear weight stored as float8_e4m3fn with one float32 `weight_scale_inv` per
128 x 128 block (the weight is `weight * weight_scale_inv` blockwise), activations quantized at run
time per token and group of 128 (`activation_scheme: dynamic`). `Fp8Config` holds it;
`read_quantization_config` checks a config.json's `quantization_config` field by field and refuses
what Cadence would serve wrongly (a static activation scheme, other block sizes, e5m2, ue8m0 scales,
a field it does not know) with a message that names the field. `quantize_at_load` is
`--quantization`: the same format made at load time from a checkpoint in bf16 (or from dummy
weights). The executor's side is core/execution/model/fp8_linear.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

FP8_BLOCK = 128  # the only weight_block_size served: [128, 128]

# What --quantization can make at load time from an unquantized checkpoint.
QUANTIZE_AT_LOAD_METHODS = ("fp8",)

# config.json's quantization_config keys Cadence reads for fp8, and the values it serves.
_FP8_KEYS = frozenset({"quant_method", "fmt", "activation_scheme", "weight_block_size",
                       "modules_to_not_convert", "ignored_layers", "modules_to_convert", "dequantize",
                       "scale_fmt", "expert_dtype"})


class QuantizationError(ValueError):
    """A quantization_config or --quantization that Cadence cannot serve; the message names the field."""


@dataclass(frozen=True)
class Fp8Config:
    """Block-scaled FP8 linear weights (e4m3, 128 x 128 blocks, dynamic 1 x 128 activation groups)."""

    # Checkpoint module names (or prefixes, or suffixes) whose linear layers stay in the model's dtype.
    modules_to_not_convert: tuple[str, ...] = ()
    # True: the checkpoint stores float8 weights and weight_scale_inv; False: it stores the weights in
    # a float dtype (or they are dummy) and each rank quantizes its shard at load (--quantization fp8).
    checkpoint_is_quantized: bool = True

    def leaves_unconverted(self, module: str) -> bool:
        """Whether the checkpoint module `module` (`model.layers.0.mlp.down_proj`) stays unquantized:
        a listed name equals it, is a prefix of it up to a dot, or is its last dotted parts."""
        for name in self.modules_to_not_convert:
            if module == name or module.startswith(name + ".") or module.endswith("." + name):
                return True
        return False


def read_quantization_config(method: str, fields: dict[str, Any], where: str) -> Fp8Config | None:
    """The checked format of a config.json `quantization_config` whose quant_method is `method`;
    None for a registered method that has no fields Cadence reads. `where` names the file."""
    if method != "fp8":
        return None
    unknown = sorted(set(fields) - _FP8_KEYS)
    if unknown:
        raise QuantizationError(f"{where}: quantization_config.{unknown[0]} is not a field Cadence knows for "
                                f"fp8 checkpoints: it reads {', '.join(sorted(_FP8_KEYS))}")
    _expect(fields, "fmt", "e4m3", where, "only float8_e4m3fn weights are served")
    _expect(fields, "activation_scheme", "dynamic", where,
            "activations are quantized per token at run time; static activation scales are not served")
    _expect(fields, "scale_fmt", "float", where, "weight_scale_inv must be float32")
    _expect(fields, "expert_dtype", "fp8", where, "Cadence serves dense models")
    _expect(fields, "dequantize", False, where, "serve the bf16 checkpoint instead")
    block = fields.get("weight_block_size")
    if block is None or list(block) != [FP8_BLOCK, FP8_BLOCK]:
        raise QuantizationError(
            f"{where}: quantization_config.weight_block_size is {block!r}; Cadence serves fp8 checkpoints "
            f"with [{FP8_BLOCK}, {FP8_BLOCK}] blocks only (per-tensor and other block sizes are not served)")
    if fields.get("modules_to_convert"):
        raise QuantizationError(f"{where}: quantization_config.modules_to_convert "
                                f"{fields['modules_to_convert']!r} is not served: embeddings and the LM head "
                                "stay in the model's dtype")
    skipped = fields.get("modules_to_not_convert")
    if skipped is None:
        skipped = fields.get("ignored_layers")
    skipped = skipped or []
    if not isinstance(skipped, list) or not all(isinstance(name, str) for name in skipped):
        raise QuantizationError(f"{where}: quantization_config.modules_to_not_convert must be a list of "
                                f"module names, got {skipped!r}")
    for name in skipped:
        if re.search(r"[*?\[\]()|^$\\]", name):
            raise QuantizationError(f"{where}: quantization_config.modules_to_not_convert entry {name!r} "
                                    "is a pattern; Cadence matches module names, prefixes and suffixes only")
    return Fp8Config(modules_to_not_convert=tuple(skipped), checkpoint_is_quantized=True)


def _expect(fields: dict[str, Any], key: str, served: Any, where: str, why: str) -> None:
    value = fields.get(key, served)
    if isinstance(value, str) and isinstance(served, str):
        value = value.lower()
    if value != served:
        raise QuantizationError(f"{where}: quantization_config.{key} is {fields[key]!r}; Cadence serves "
                                f"{served!r} only: {why}")


def quantize_at_load(method: str, quantization: str | None, model_name: str) -> Fp8Config | None:
    """The format of a model `model_name` whose checkpoint is quantized as `quantization` (None:
    unquantized) served with `--quantization method`: an unquantized checkpoint (or dummy weights)
    is quantized by each rank at load; a checkpoint already in `method` keeps its own format (None
    here); one quantized in another format is refused."""
    if method not in QUANTIZE_AT_LOAD_METHODS:
        raise QuantizationError(f"--quantization {method!r} is not served: use one of "
                                f"{', '.join(QUANTIZE_AT_LOAD_METHODS)}")
    if quantization == method:
        return None
    if quantization is not None:
        raise QuantizationError(f"--quantization {method}: model {model_name} is already quantized as "
                                f"{quantization!r}; serve it without --quantization")
    return Fp8Config(checkpoint_is_quantized=False)


def fp8_shard_problem(q_size: int, kv_size: int, intermediate_size: int, tp_size: int) -> str | None:
    """Why a Qwen3-shaped FP8 model cannot be split over `tp_size` ranks (a rank's share of some
    packed or sharded matrix would not be whole 128 x 128 blocks), or None. The executors check
    every shard against the checkpoint too; this says it before any process starts."""
    sizes = {"q_proj's rows (heads x head_dim)": q_size, "k_proj's and v_proj's rows": kv_size,
             "intermediate_size": intermediate_size}

    def on_blocks(rows: int, tp: int) -> bool:
        return tp == 1 or (rows % tp == 0 and (rows // tp) % FP8_BLOCK == 0)

    for what, rows in sizes.items():
        if not on_blocks(rows, tp_size):
            ok = [tp for tp in range(1, 65) if all(on_blocks(n, tp) for n in sizes.values())]
            return (f"tp_size {tp_size} would give each rank {rows / tp_size:g} of {what} {rows}, not whole "
                    f"{FP8_BLOCK} x {FP8_BLOCK} FP8 blocks: use a tp_size in {ok}")
    return None
