"""Qwen3 through Cadence's ModelRunner against transformers' Qwen3ForCausalLM holding the same weights.

    python -m benchmarks.model_parity --model qwen3-14b --device cuda --out parity.json

Both models get the dummy weights of `core.execution.model.loader.dummy_tensors` (so no checkpoint is
needed); a prompt is prefilled and a few decode steps are teacher-forced with transformers' greedy
tokens. Prints the relative logits error of every step, Cadence's step times and peak memory.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import torch

from core.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from core.execution.model.loader import TORCH_DTYPES, dummy_tensors
from core.execution.runner import ModelRunner
from core.plan import StepPlan
from core.sampling_params import sampling_rows


def hf_model_like(config: ModelConfig, runner: ModelRunner, device: str):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    hf_config = Qwen3Config(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads,
        head_dim=config.head_dim,
        max_position_embeddings=config.max_position_embeddings,
        rope_theta=config.rope_theta,
        rms_norm_eps=config.rms_norm_eps,
        tie_word_embeddings=config.tie_word_embeddings,
    )
    dtype = TORCH_DTYPES[config.dtype]
    with torch.device(device):
        hf = Qwen3ForCausalLM._from_config(hf_config, dtype=dtype)
    hf = hf.to(dtype)
    print(
        "transformers rope:",
        getattr(hf.config, "rope_parameters", None),
        getattr(hf.config, "rope_theta", None),
    )
    state = hf.state_dict()
    with torch.no_grad():
        # The weights exactly as Cadence holds them (rounded to its dtype), cast to transformers' dtype.
        for name, tensor in dummy_tensors(runner.model, runner.config.seed, device, runner.dtype):
            state[name].copy_(tensor)
    return hf.eval()


def plan_for(
    tokens: list[int], start: int, pages: list[int], block_size: int, step_id: int, batch: int = 1
) -> StepPlan:
    """`batch` identical requests, each on its own pages, computing `tokens` at `start`."""
    n = len(tokens)
    pos = np.arange(start, start + n)
    width = len(pages)
    table = np.stack([np.asarray(pages) + b * width for b in range(batch)]).astype(np.int32)
    slots = np.concatenate(
        [table[b][pos // block_size] * block_size + pos % block_size for b in range(batch)]
    )
    return StepPlan(
        step_id=step_id,
        replica=0,
        query_start=(np.arange(batch + 1) * n).astype(np.int32),
        seq_lens=np.full(batch, start + n, np.int32),
        block_table=table,
        logits_index=((np.arange(batch) + 1) * n - 1).astype(np.int32),
        sampling=sampling_rows(batch, temperature=0.0),
        input_ids=np.tile(np.asarray(tokens, np.int32), batch),
        positions=np.tile(pos, batch).astype(np.int32),
        kv_index=slots.astype(np.int64),
    )


def timed(fn, device) -> tuple[object, float]:
    torch.cuda.synchronize(device) if device.type == "cuda" else None
    start = time.perf_counter()
    out = fn()
    torch.cuda.synchronize(device) if device.type == "cuda" else None
    return out, (time.perf_counter() - start) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen3-14b")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--decode-steps", type=int, default=16)
    parser.add_argument("--batch", type=int, default=32, help="batch of the decode timing")
    parser.add_argument("--num-layers", type=int, default=None, help="override the preset's layer count")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    block_size = 16
    model = ModelConfig.from_name(args.model)
    if args.num_layers:
        model = model.with_overrides(num_layers=args.num_layers)
    max_len = args.prompt_len + max(args.decode_steps, 12) + 1
    pages_per_req = -(-max_len // block_size)
    config = EngineConfig(
        model=model,
        cache=CacheConfig(block_size=block_size),
        scheduler=SchedulerConfig(max_num_batched_tokens=4096),
        device=args.device,
    )
    device = torch.device(args.device)
    runner, load_ms = timed(lambda: ModelRunner(config, num_pages=pages_per_req * args.batch), device)
    weights_gib = torch.cuda.memory_allocated(device) / 2**30 if device.type == "cuda" else 0.0
    profile_peak_gib = runner.profile_peak_memory() / 2**30 if device.type == "cuda" else 0.0

    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 151_000, size=args.prompt_len + args.decode_steps).tolist()
    prompt = tokens[: args.prompt_len]
    pages = list(range(pages_per_req))
    report = {"model": args.model, "dtype": model.dtype, "prompt_len": args.prompt_len}
    # Cadence: prefill the prompt, then decode the fixed continuation one token a step.
    rows = []
    with torch.no_grad():
        (logits, _), prefill_ms = timed(
            lambda: runner.forward_logits(plan_for(prompt, 0, pages, block_size, 0)), device
        )
        rows.append(logits[0])
        for step in range(args.decode_steps):
            position = args.prompt_len + step
            plan = plan_for([tokens[position]], position, pages, block_size, step + 1)
            rows.append(runner.forward_logits(plan)[0][0])
    ours = torch.stack(rows)  # [decode_steps + 1, vocab]
    # transformers over the whole sequence at once, in the serving dtype and in float32.
    theirs = {}
    for name, hf_dtype in (("serving_dtype", TORCH_DTYPES[model.dtype]), ("float32", torch.float32)):
        hf = hf_model_like(
            model.with_overrides(dtype=next(k for k, v in TORCH_DTYPES.items() if v == hf_dtype)),
            runner,
            args.device,
        )
        with torch.no_grad():
            out = hf(torch.tensor([tokens], device=device)).logits[0, args.prompt_len - 1 :].float()
        theirs[name] = out[: args.decode_steps + 1]
        del hf, out
        torch.cuda.empty_cache() if device.type == "cuda" else None
    reference = theirs["float32"]

    def errors(x: torch.Tensor) -> dict:
        diff = (x - reference).abs()
        return {
            "max_rel_error": float(diff.max() / reference.abs().max()),
            "mean_rel_error": float(diff.mean() / reference.abs().mean()),
            "greedy_agreement": float((x.argmax(-1) == reference.argmax(-1)).float().mean()),
        }

    report["cadence_vs_float32"] = errors(ours)
    report["transformers_vs_float32"] = errors(theirs["serving_dtype"])
    report["cadence_vs_transformers_same_dtype"] = {
        "mean_rel_error": float(
            (ours - theirs["serving_dtype"]).abs().mean() / theirs["serving_dtype"].abs().mean()
        )
    }
    with torch.no_grad():
        # Step times through execute(): the whole step, sampling included (reference attention, eager).
        for batch in (1, args.batch):
            times = []
            for i in range(12):
                plan = plan_for([1], args.prompt_len + i, pages, block_size, 100 + i, batch=batch)
                _, ms = timed(lambda p=plan: runner.execute(p), device)
                times.append(ms)
            report[f"decode_step_ms_batch{batch}"] = statistics.median(times[2:])
    report.update(
        load_ms=load_ms,
        prefill_ms=prefill_ms,
        weights_gib=weights_gib,
        profile_peak_gib=profile_peak_gib,
        peak_gib=torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else 0.0,
    )
    print(json.dumps(report, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
