"""The peer: the same random workload through Hugging Face transformers' `generate_batch`.

    python -m benchmarks.peer_hf --model qwen3-14b --num-prompts 256 --input-len 512 --output-len 128 \\
        --out peer.json

transformers' continuous batching (`generate_batch`, its paged KV cache) in one process, on the
same GPU, with the same dummy weights Cadence generates for the preset (core.execution.model.loader's
`dummy_tensor`, by name and seed) and the same random token-id prompts as
`python -m benchmarks.load --dataset random` with the same seed. Reports total and output token
throughput over the wall time of the whole batch, so a report can put Cadence and the peer side
by side: peer_ratio = Cadence's total token throughput / the peer's.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from benchmarks.lib.datasets import random_dataset
from core.config import ModelConfig
from core.execution.model.loader import TORCH_DTYPES, dummy_tensor


def build_peer(config: ModelConfig, seed: int, device: str, attn_implementation: str):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    hf_config = Qwen3Config(
        vocab_size=config.vocab_size, hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size, num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads, num_key_value_heads=config.num_kv_heads,
        head_dim=config.head_dim, max_position_embeddings=config.max_position_embeddings,
        rope_theta=config.rope_theta, rms_norm_eps=config.rms_norm_eps,
        tie_word_embeddings=config.tie_word_embeddings,
    )
    hf_config._attn_implementation = attn_implementation
    dtype = TORCH_DTYPES[config.dtype]
    with torch.device(device):
        model = Qwen3ForCausalLM._from_config(hf_config, dtype=dtype)
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            tensor.copy_(dummy_tensor(name, tuple(tensor.shape), seed, device, dtype))
    return model.eval()


def _synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def run(args: argparse.Namespace) -> dict:
    from transformers import GenerationConfig

    config = ModelConfig.from_name(args.model, dtype=args.dtype)
    specs = random_dataset(args.num_prompts, args.input_len, args.output_len, 0.0, args.seed)
    inputs = [s.prompt_token_ids for s in specs]
    model = build_peer(config, args.weights_seed, args.device, args.attn_implementation)
    generation = GenerationConfig(max_new_tokens=args.output_len, do_sample=False, eos_token_id=None,
                                  pad_token_id=0)
    model.generate_batch(inputs=inputs[: min(4, len(inputs))], generation_config=generation,
                         progress_bar=False)  # warm-up: allocation, compilation, graphs
    _synchronize(args.device)
    start = time.perf_counter()
    outputs = model.generate_batch(inputs=inputs, generation_config=generation, progress_bar=False)
    _synchronize(args.device)
    wall_s = time.perf_counter() - start
    output_tokens = sum(len(o.generated_tokens) for o in outputs.values())
    input_tokens = sum(len(p) for p in inputs)
    return {
        "engine": "transformers generate_batch", "attn_implementation": args.attn_implementation,
        "model": config.name, "dtype": config.dtype, "num_prompts": len(inputs),
        "input_len": args.input_len, "output_len": args.output_len, "completed": len(outputs),
        "duration_s": wall_s, "total_input_tokens": input_tokens, "total_output_tokens": output_tokens,
        "output_throughput": output_tokens / wall_s,
        "total_token_throughput": (input_tokens + output_tokens) / wall_s,
        "transformers_version": __import__("transformers").__version__, "torch_version": torch.__version__,
    }


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="python -m benchmarks.peer_hf", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="qwen3-14b", help="a preset (default %(default)s)")
    p.add_argument("--dtype", default="bfloat16", help="default %(default)s")
    p.add_argument("--device", default="cuda", help="default %(default)s")
    p.add_argument("--num-prompts", type=int, default=256, help="default %(default)s")
    p.add_argument("--input-len", type=int, default=512, help="prompt tokens (default %(default)s)")
    p.add_argument("--output-len", type=int, default=128, help="new tokens per prompt (default %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="the load tool's dataset seed (default 0)")
    p.add_argument("--weights-seed", type=int, default=0,
                   help="Cadence's --seed of the dummy weights (default 0)")
    p.add_argument("--attn-implementation", default="sdpa",
                   help="the attention transformers runs (it pages it itself) (default %(default)s)")
    p.add_argument("--out", help="write the figures as JSON here")
    args = p.parse_args(argv)
    result = run(args)
    print(json.dumps(result, indent=2))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
    return result


if __name__ == "__main__":
    main()
