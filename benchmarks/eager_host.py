"""How long the host takes to launch one eager step (no CUDA graph) of the 14B shape, and where that
time goes in Python: what a prefill of a few tokens (a short or cached prompt's TTFT) waits on.

    python -m benchmarks.eager_host [--quantization fp8] [--prefill-len 16] [--top 22]

For a one-row decode step at 2,048 tokens of context and a prefill of `--prefill-len` tokens: the
wall time of launching 5 steps (host) and of launching and finishing them (with sync), then a
cProfile of 5 more, its `--top` functions by own time. Where host and with-sync agree the GPU waits
on the host.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time

import numpy as np
import torch

from benchmarks.step_profile import decode_plan, prefill_plan
from core.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from core.execution.runner import ModelRunner

STEPS = 5


def time_steps(runner: ModelRunner, plan) -> tuple[float, float]:
    """Milliseconds a step: launched (host), and launched and finished."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(STEPS):
        runner.forward_logits(plan)
    launched = time.perf_counter() - start
    torch.cuda.synchronize()
    return launched / STEPS * 1e3, (time.perf_counter() - start) / STEPS * 1e3


def profile_steps(runner: ModelRunner, plan, top: int) -> str:
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(STEPS):
        runner.forward_logits(plan)
    torch.cuda.synchronize()
    profile.disable()
    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(top)
    return out.getvalue()


@torch.inference_mode()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen3-14b")
    parser.add_argument("--quantization", choices=["fp8"], default=None)
    parser.add_argument("--prefill-len", type=int, default=16)
    parser.add_argument("--top", type=int, default=22, help="functions shown from each profile")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks.eager_host needs a CUDA GPU")
    model = ModelConfig.from_name(args.model)
    if args.quantization:
        model = model.quantized_at_load(args.quantization)
    scheduler = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=8192, max_model_len=4096)
    config = EngineConfig(model=model, cache=CacheConfig(block_size=16), scheduler=scheduler, device="cuda",
                          enforce_eager=True)
    runner = ModelRunner(config, num_pages=1024)
    rng = np.random.default_rng(0)
    plans = {"decode, 1 row": decode_plan(1, 2048, 16, 129, rng),
             f"prefill, {args.prefill_len} tokens": prefill_plan(args.prefill_len, 16, rng)}
    for name, plan in plans.items():
        for _ in range(3):  # compile and warm up
            runner.forward_logits(plan)
        host, finished = time_steps(runner, plan)
        label = args.quantization or model.dtype
        print(f"{label} {name}: host {host:.1f} ms a step, with sync {finished:.1f}")
        print(profile_steps(runner, plan, args.top), flush=True)


if __name__ == "__main__":
    main()
