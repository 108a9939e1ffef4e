"""What a request that leaves a sampling field out gets: a checkpoint's generation_config.json, read
by `read_generation_config`, or Qwen3's published defaults for the built-in presets."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from core.config_error import ConfigError


@dataclass(frozen=True)
class GenerationDefaults:
    """The checkpoint's generation_config.json: what a request that omits a field gets."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = no top-k
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    eos_token_ids: tuple[int, ...] = ()


QWEN3_GENERATION_DEFAULTS = GenerationDefaults(
    temperature=0.6, top_p=0.95, top_k=20, eos_token_ids=(151645, 151643)
)


def read_generation_config(directory: Path, eos_from_config) -> GenerationDefaults:
    eos = eos_from_config if isinstance(eos_from_config, list) else [eos_from_config]
    path = directory / "generation_config.json"
    if not path.is_file():
        return GenerationDefaults(eos_token_ids=tuple(e for e in eos if e is not None))
    try:
        gen = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from exc
    gen_eos = gen.get("eos_token_id", eos)
    gen_eos = gen_eos if isinstance(gen_eos, list) else [gen_eos]
    sample = gen.get("do_sample", False)
    return GenerationDefaults(
        # do_sample false in a generation config means greedy: temperature 0 in the API's terms.
        temperature=float(gen.get("temperature", 1.0)) if sample else 0.0,
        top_p=float(gen.get("top_p", 1.0)) if sample else 1.0,
        top_k=int(gen.get("top_k", 0) or 0) if sample else 0,
        min_p=float(gen.get("min_p", 0.0) or 0.0),
        repetition_penalty=float(gen.get("repetition_penalty", 1.0)),
        eos_token_ids=tuple(e for e in gen_eos if e is not None),
    )
