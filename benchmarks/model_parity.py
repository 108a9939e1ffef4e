"""Qwen3 through Cadence's ModelRunner against transformers' Qwen3ForCausalLM holding the same weights.

    python -m benchmarks.model_parity --model qwen3-14b --device cuda --out parity.json

Both models get the dummy weights of `core.model.loader.dummy_tensors` (so no checkpoint is
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
from core.model.loader import TORCH_DTYPES, dummy_tensors
from core.plan import StepPlan
from core.runner import ModelRunner


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
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            hf = Qwen3ForCausalLM(hf_config)
    finally:
        torch.set_default_dtype(previous)
    state = hf.state_dict()
    with torch.no_grad():
        for name, tensor in dummy_tensors(runner.model, runner.config.seed, device, dtype):
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
    ones, zeros = np.ones(batch, np.float32), np.zeros(batch, np.float32)
    return StepPlan(
        step_id=step_id,
        replica=0,
        req_slot=np.arange(batch, dtype=np.int32),
        query_start=(np.arange(batch + 1) * n).astype(np.int32),
        seq_lens=np.full(batch, start + n, np.int32),
        block_table=table,
        logits_index=((np.arange(batch) + 1) * n - 1).astype(np.int32),
        temperature=zeros,
        top_p=ones,
        top_k=np.zeros(batch, np.int32),
        min_p=zeros,
        seed=np.zeros(batch, np.int64),
        output_pos=np.zeros(batch, np.int32),
        repetition_penalty=ones,
        presence_penalty=zeros,
        frequency_penalty=zeros,
        num_logprobs=np.full(batch, -1, np.int32),
        history_start=np.zeros(batch + 1, np.int32),
        history_prompt_len=np.zeros(batch, np.int32),
        history_ids=np.zeros(0, np.int32),
        input_ids=np.tile(np.asarray(tokens, np.int32), batch),
        positions=np.tile(pos, batch).astype(np.int32),
        slot_mapping=slots.astype(np.int64),
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
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    block_size = 16
    model = ModelConfig.from_name(args.model)
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
    hf = hf_model_like(model, runner, args.device)

    rng = np.random.default_rng(0)
    prompt = rng.integers(0, 151_000, size=args.prompt_len).tolist()
    pages = list(range(pages_per_req))
    report = {"model": args.model, "dtype": model.dtype, "prompt_len": args.prompt_len, "steps": []}
    with torch.no_grad():
        hf_out = hf(torch.tensor([prompt], device=device), use_cache=True)
        hf_logits, past = hf_out.logits[0, -1].float(), hf_out.past_key_values
        (ours, _), prefill_ms = timed(
            lambda: runner.forward_logits(plan_for(prompt, 0, pages, block_size, 0)), device
        )
        position = args.prompt_len
        for step in range(args.decode_steps + 1):
            error = float((ours[0] - hf_logits).abs().max() / hf_logits.abs().max())
            mean_error = float((ours[0] - hf_logits).abs().mean() / hf_logits.abs().mean())
            token = int(hf_logits.argmax())
            report["steps"].append(
                {
                    "step": step,
                    "max_rel_error": error,
                    "mean_rel_error": mean_error,
                    "greedy_equal": int(ours[0].argmax()) == token,
                }
            )
            if step == args.decode_steps:
                break
            hf_out = hf(torch.tensor([[token]], device=device), past_key_values=past, use_cache=True)
            hf_logits, past = hf_out.logits[0, -1].float(), hf_out.past_key_values
            ours, _ = runner.forward_logits(plan_for([token], position, pages, block_size, step + 1))
            position += 1
        del hf, past, hf_out
        torch.cuda.empty_cache() if device.type == "cuda" else None

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
        max_rel_error=max(s["max_rel_error"] for s in report["steps"]),
        greedy_agreement=sum(s["greedy_equal"] for s in report["steps"]) / len(report["steps"]),
    )
    print(json.dumps(report, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
