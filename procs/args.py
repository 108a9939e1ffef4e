"""The engine's command-line flags (vLLM's names where it has them) and the configs they make.
SGLang's names are accepted too (--model-path, --context-length, --tp-size, --dp-size,
--mem-fraction-static, --max-running-requests, --chunked-prefill-size, --disable-radix-cache,
--json-model-override-args), so either project's command line runs unchanged.

`cadence serve` and `python -m procs.launcher` both take these; the API adds its own (--host,
--port, --api-key, --served-model-name).
"""

from __future__ import annotations

import argparse
import json

from core.config import (
    KV_CACHE_DTYPES,
    CacheConfig,
    ConfigError,
    EngineConfig,
    ModelConfig,
    ParallelConfig,
    SchedulerConfig,
)
from core.model_config import LOAD_FORMATS
from core.quantization import QUANTIZE_AT_LOAD_METHODS
from core.registry import AUTO_ATTENTION_BACKENDS, attention_backend_choices
from core.tokenizer.jinja_template import read_chat_template
from procs.launch_options import LaunchOptions

DEFAULT_MODEL = "qwen3-tiny"


def add_engine_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    defaults_cache, defaults_sched = CacheConfig(), SchedulerConfig()
    group = parser.add_argument_group("engine")
    group.add_argument("--model", "--model-path", default=DEFAULT_MODEL,
                       help="a preset (qwen3-14b, qwen3-tiny) or a Hugging Face model directory "
                            f"(default: {DEFAULT_MODEL}, dummy weights, the built-in Qwen vocabulary)")
    group.add_argument("--tokenizer", default=None,
                       help="a directory with tokenizer files (default: the model directory, or the "
                            "built-in Qwen vocabulary for presets)")
    group.add_argument("--chat-template", default=None,
                       help="a Jinja chat template, or a file holding one, rendered instead of the "
                            "tokenizer's (default: the checkpoint's template, else Qwen3's ChatML)")
    group.add_argument("--hf-overrides", "--json-model-override-args", type=_json_object, default=None,
                       help="a JSON object of config.json fields to replace (vLLM's flag; SGLang's name "
                            "too), such as Qwen3's YaRN: '{\"rope_scaling\": {\"rope_type\": \"yarn\", "
                            "\"factor\": 4.0, \"original_max_position_embeddings\": 32768}}'")
    group.add_argument("--rope-scaling", type=_json_object, default=None,
                       help="config.json's rope_scaling, as vLLM's older flag that Qwen3's model card "
                            "gives: '{\"rope_type\": \"yarn\", \"factor\": 4.0, "
                            "\"original_max_position_embeddings\": 32768}' (the same as --hf-overrides "
                            "with it as rope_scaling)")
    group.add_argument("--tensor-parallel-size", "--tp", "--tp-size", "-tp", type=int, default=1, dest="tp",
                       help="ranks one replica is split across (default: 1)")
    group.add_argument("--data-parallel-size", "--dp", "--dp-size", "-dp", type=int, default=1, dest="dp",
                       help="independent replicas (default: 1)")
    group.add_argument("--device", choices=("cuda", "cpu"), default=None,
                       help="default: cuda when a GPU is present, else cpu")
    group.add_argument("--dtype", choices=("auto", "bfloat16", "float16", "float32"), default="auto",
                       help="auto: bfloat16 on GPU, float32 on CPU")
    group.add_argument("--max-model-len", "--context-length", type=int, default=None,
                       help="longest prompt + output, in tokens (default: the model's context)")
    group.add_argument("--max-num-seqs", "--max-running-requests", type=int,
                       default=defaults_sched.max_num_seqs,
                       help=f"requests running at once per replica (default: {defaults_sched.max_num_seqs})")
    group.add_argument("--max-logprobs", type=int, default=defaults_sched.max_logprobs,
                       help="the most top logprobs a request may ask for, per generated or prompt token "
                            f"(default: {defaults_sched.max_logprobs})")
    group.add_argument("--max-num-batched-tokens", "--chunked-prefill-size", type=int,
                       default=defaults_sched.max_num_batched_tokens,
                       help=f"tokens per step (default: {defaults_sched.max_num_batched_tokens})")
    group.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction, default=True,
                       help="split long prompts across steps (default: on)")
    group.add_argument("--long-prefill-token-threshold", type=int, default=0,
                       help="cap one request's chunk per step with chunked prefill (default: 0, no cap)")
    group.add_argument("--kv-cache-dtype", choices=KV_CACHE_DTYPES, default=defaults_cache.kv_cache_dtype,
                       help="auto: K/V in the model's dtype; fp8 (fp8_e4m3): float8 e4m3 with scale 1, "
                            "twice the tokens in the same memory (default: auto)")
    group.add_argument("--block-size", type=int, default=defaults_cache.block_size,
                       help=f"tokens per KV page (default: {defaults_cache.block_size})")
    group.add_argument("--gpu-memory-utilization", "--mem-fraction-static", type=float,
                       default=defaults_cache.gpu_memory_utilization,
                       help="fraction of each card for weights, activations and KV cache; executors "
                            f"sharing a card split it (default: {defaults_cache.gpu_memory_utilization})")
    group.add_argument("--num-gpu-blocks-override", type=int, default=None,
                       help="KV pages per executor instead of profiling memory")
    group.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True,
                       help="radix prefix cache over the KV pages (default: on)")
    group.add_argument("--disable-radix-cache", action="store_false", dest="enable_prefix_caching",
                       help="SGLang's name for --no-enable-prefix-caching")
    group.add_argument("--load-format", choices=LOAD_FORMATS, default="auto",
                       help="auto: the checkpoint's safetensors, or dummy weights for a preset")
    group.add_argument("--quantization", "-q", choices=QUANTIZE_AT_LOAD_METHODS, default=None,
                       help="fp8: quantize the linear weights of an unquantized checkpoint (or the dummy "
                            "weights) to FP8 with 128 x 128 block scales at load, as Hugging Face's "
                            "fine-grained FP8 checkpoints store them (default: the checkpoint's own format)")
    group.add_argument("--attention-backend", choices=attention_backend_choices(), default="auto",
                       help=f"auto: {AUTO_ATTENTION_BACKENDS['cuda']} on GPU, "
                            f"{AUTO_ATTENTION_BACKENDS['cpu']} on CPU")
    group.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=True,
                       help="plan the next step while the current one runs, two steps in flight per "
                            "replica (default: on)")
    group.add_argument("--enforce-eager", action="store_true",
                       help="no CUDA graphs for decode steps (default: graphs on every GPU replica, TP "
                            "ranks included where their all-reduces can be captured)")
    group.add_argument("--small-step-graphs", action=argparse.BooleanOptionalAction, default=True,
                       help="replay the decode graphs for small steps with prompt tokens too (a short "
                            "or mostly cached prompt, with the decodes beside it), one graph row per "
                            "token, instead of launching them eagerly (default: on)")
    group.add_argument("--disable-custom-all-reduce", action="store_true",
                       help="TP all-reduces all through NCCL, never the one-shot kernel over the peers' "
                            "memory that takes the small ones (default: the kernel where the GPUs can map "
                            "each other's memory)")
    group.add_argument("--seed", type=int, default=0, help="dummy weights and unseeded sampling (default: 0)")
    group.add_argument("--step-timeout", type=float, default=LaunchOptions.step_timeout_s,
                       help="seconds a step may take before its replica is declared stuck "
                            f"(default: {LaunchOptions.step_timeout_s:g})")
    group.add_argument("--startup-timeout", type=float, default=LaunchOptions.startup_timeout_s,
                       help=f"seconds to load and profile (default: {LaunchOptions.startup_timeout_s:g})")
    group.add_argument("--dist-timeout", type=float, default=LaunchOptions.dist_timeout_s,
                       help="seconds a TP rank waits for its peers at start-up and in a collective before "
                            "it fails naming the ranks that did not come "
                            f"(default: {LaunchOptions.dist_timeout_s:g})")
    return parser


def _json_object(text: str) -> dict:
    """--hf-overrides' value: a JSON object, or argparse's error naming what is wrong."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object, got {text!r}")
    return value


def _hf_overrides(args: argparse.Namespace) -> dict | None:
    """--hf-overrides with --rope-scaling folded in; both setting rope_scaling is a ConfigError."""
    if args.rope_scaling is None:
        return args.hf_overrides
    overrides = dict(args.hf_overrides or {})
    if "rope_scaling" in overrides or "rope_parameters" in overrides:
        raise ConfigError("--rope-scaling and --hf-overrides both set the RoPE scaling; give it once")
    overrides["rope_scaling"] = args.rope_scaling
    return overrides


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def config_from_args(args: argparse.Namespace) -> EngineConfig:
    """The EngineConfig the flags describe; ConfigError says which flag is wrong."""
    device = args.device or default_device()
    dtype = args.dtype
    if dtype == "auto":
        dtype = "bfloat16" if device == "cuda" else "float32"
    model = ModelConfig.from_name(args.model, _hf_overrides(args), dtype=dtype, load_format=args.load_format)
    if args.load_format == "safetensors" and model.model_path is None:
        raise ConfigError(f"--load-format safetensors needs a model directory, not the preset {args.model}")
    if args.quantization is not None:
        model = model.quantized_at_load(args.quantization)
    return EngineConfig(
        model=model,
        parallel=ParallelConfig(tp_size=args.tp, dp_size=args.dp,
                                disable_custom_all_reduce=args.disable_custom_all_reduce),
        cache=CacheConfig(block_size=args.block_size, num_pages=args.num_gpu_blocks_override,
                          gpu_memory_utilization=args.gpu_memory_utilization,
                          enable_prefix_caching=args.enable_prefix_caching,
                          kv_cache_dtype=args.kv_cache_dtype),
        scheduler=SchedulerConfig(max_num_seqs=args.max_num_seqs,
                                  max_num_batched_tokens=args.max_num_batched_tokens,
                                  max_model_len=args.max_model_len,
                                  enable_chunked_prefill=args.enable_chunked_prefill,
                                  long_prefill_token_threshold=args.long_prefill_token_threshold,
                                  async_scheduling=args.async_scheduling,
                                  max_logprobs=args.max_logprobs),
        device=device,
        seed=args.seed,
        attention_backend=args.attention_backend,
        enforce_eager=args.enforce_eager,
        small_step_graphs=args.small_step_graphs,
    )


def launch_options_from_args(args: argparse.Namespace) -> LaunchOptions:
    """The LaunchOptions the flags describe; ChatTemplateError for a template that cannot be read or
    compiled (before anything starts)."""
    template = None if args.chat_template is None else read_chat_template(args.chat_template)
    return LaunchOptions(served_model_name=getattr(args, "served_model_name", None),
                         tokenizer_path=args.tokenizer, chat_template=template,
                         step_timeout_s=args.step_timeout, startup_timeout_s=args.startup_timeout,
                         dist_timeout_s=args.dist_timeout)
