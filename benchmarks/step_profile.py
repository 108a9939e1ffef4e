"""Where the milliseconds of one step go: the ModelRunner alone (no scheduler, no IPC) on the GPU.

    python -m benchmarks.step_profile --model qwen3-14b --batches 1,64,256 --context 2048 --out step.json

For each decode batch (every request one new token at `--context` tokens of context, pages scattered):
  graph     the captured CUDA graph alone (forward + logits), CUDA-event median;
  execute   ModelRunner.execute: graph + sampler + tokens to the host, wall-clock median;
  eager     the same forward launched kernel by kernel (no graph);
  kernels   torch.profiler's sum of GPU kernel time inside one graph replay, by category (linear
            products, attention, norms/RoPE/activation and other elementwise, sampler), and the
            gap: graph time minus kernel time, i.e. the GPU idling between the graph's kernels;
  sampler   per sampling mode (greedy; Qwen3's defaults: temperature 0.6, top_p 0.95, top_k 20): the
            sampler alone on the step's logits (its graph where the step can use it, CUDA-event
            median; the eager sampler beside it), its share of graph + sampler, and execute again.
Plus one prefill of `--prefill-len` tokens (the TTFT's GPU share at concurrency 1) with the same
breakdown, and laid on a timeline (benchmarks/lib/kernel_timeline.py: the host's lead before the first
kernel, the idle gaps between kernels and what the host was doing then; `--trace` keeps the profiler
trace). The floor is every weight byte read once at the device's measured read rate
(benchmarks/lib/ceilings.py: 4.3 TB/s on an H200, 3.0 on an H100).

Under programmatic dependent launch (core/execution/dependent_launch.py, on from sm_90) a kernel's
programs start while its predecessor still runs and wait for it, so the profiler's kernel times
overlap and include that wait: their sum can exceed the graph's time (a negative gap). The graph
time is then the figure; for each kernel's own cost, run with CADENCE_PDL=0. The JSON says which
(`dependent_launch`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time

import numpy as np
import torch

from benchmarks.lib.ceilings import read_ceiling
from benchmarks.lib.kernel_timeline import format_timeline, profile_timeline
from core.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from core.execution.dependent_launch import dependent_launch
from core.execution.runner import ModelRunner
from core.execution.sampler import SamplingTensors
from core.plan import StepPlan
from core.sampling_params import sampling_rows

# Sampling modes profiled: name -> (temperature, top_p, top_k); "defaults" is Qwen3's generation_config.
SAMPLING_MODES = {"greedy": (0.0, 1.0, 0), "defaults": (0.6, 0.95, 20)}

CATEGORIES = (  # first match wins; kernel names lower-cased
    ("linear", ("gemm", "gemv", "cutlass", "nvjet", "xmma", "splitk", "matmul")),
    ("attention", ("decode", "extend", "attention", "kv_write", "flash")),
    ("sampler", ("argmax", "argmin", "topk", "sort", "softmax", "scatter", "gather", "candidates",
                 "full_rows")),
    ("norm_rope_act", ("rms", "rope", "silu", "norm", "fused")),
)


def category(kernel_name: str) -> str:
    name = kernel_name.lower()
    for label, keys in CATEGORIES:
        if any(k in name for k in keys):
            return label
    return "elementwise_other"


def decode_plan(batch: int, context: int, block_size: int, pages_per_req: int, rng) -> StepPlan:
    """`batch` requests at position context - 1, each on its own pages (shuffled across the pool)."""
    pages = rng.permutation(batch * pages_per_req).astype(np.int32).reshape(batch, pages_per_req)
    pos = np.full(batch, context - 1, np.int32)
    slots = pages[np.arange(batch), pos // block_size].astype(np.int64) * block_size + pos % block_size
    return StepPlan(
        step_id=0, replica=0, query_start=np.arange(batch + 1, dtype=np.int32),
        seq_lens=np.full(batch, context, np.int32), block_table=pages,
        logits_index=np.arange(batch, dtype=np.int32), sampling=sampling_rows(batch, temperature=0.0),
        input_ids=rng.integers(0, 150_000, batch).astype(np.int32), positions=pos, kv_index=slots,
    )


def prefill_plan(length: int, block_size: int, rng) -> StepPlan:
    plan = decode_plan(1, length, block_size, -(-length // block_size), rng)
    pos = np.arange(length, dtype=np.int32)
    slots = plan.block_table[0, pos // block_size].astype(np.int64) * block_size + pos % block_size
    return dataclasses.replace(
        plan, query_start=np.array([0, length], np.int32), logits_index=np.array([length - 1], np.int32),
        input_ids=rng.integers(0, 150_000, length).astype(np.int32), positions=pos, kv_index=slots)


def cuda_ms(fn, repeats: int) -> float:
    """Median CUDA-event time of fn() over `repeats` calls after two warm-ups."""
    for _ in range(2):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def wall_ms(fn, repeats: int) -> float:
    for _ in range(2):
        fn()
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def kernel_breakdown(fn) -> tuple[dict[str, float], int, list[tuple[str, float]]]:
    """GPU kernel milliseconds of one fn() call by category, the kernel count, and the top kernels."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    totals: dict[str, float] = {}
    per_name: dict[str, float] = {}
    count = 0
    for event in prof.events():
        if event.device_type != torch.autograd.DeviceType.CUDA:
            continue
        ms = event.device_time / 1e3 if hasattr(event, "device_time") else event.cuda_time / 1e3
        if ms <= 0 or "memcpy" in event.name.lower() or "memset" in event.name.lower():
            continue
        count += 1
        totals[category(event.name)] = totals.get(category(event.name), 0.0) + ms
        per_name[event.name] = per_name.get(event.name, 0.0) + ms
    top = sorted(per_name.items(), key=lambda kv: -kv[1])[:12]
    return totals, count, [(name[:90], ms) for name, ms in top]


def with_sampling(plan: StepPlan, mode: str) -> StepPlan:
    temperature, top_p, top_k = SAMPLING_MODES[mode]
    batch = plan.num_reqs
    sampling = sampling_rows(batch, temperature=temperature, top_p=top_p, top_k=top_k,
                             seed=np.arange(batch, dtype=np.int64) * 7919)
    return dataclasses.replace(plan, sampling=sampling)


def profile_sampler(runner: ModelRunner, plan: StepPlan, repeats: int) -> dict:
    """The sampler's milliseconds on this step's logits, per sampling mode."""
    out = {}
    for mode in SAMPLING_MODES:
        sampled = with_sampling(plan, mode)
        logits, rows = runner.forward_logits(sampled)
        st = SamplingTensors.from_plan(sampled, rows, runner.device)
        eager_ms = cuda_ms(lambda: runner.sampler(logits, st), repeats)  # noqa: B023
        graphs = runner.graphs
        in_graph = graphs is not None and graphs.can_run(sampled) and graphs.can_sample(st)
        sampler_ms = cuda_ms(lambda: graphs.sample(st), repeats) if in_graph else eager_ms  # noqa: B023
        out[mode] = {"sampler_ms": sampler_ms, "sampler_in_graph": in_graph, "sampler_eager_ms": eager_ms,
                     "execute_ms": wall_ms(lambda: runner.execute(sampled), repeats)}  # noqa: B023
    return out


def profile_decode(runner: ModelRunner, plan: StepPlan, repeats: int) -> dict:
    row: dict = {"batch": plan.num_reqs}
    graphs = runner.graphs
    if graphs is not None and graphs.can_run(plan):
        row["graph_ms"] = cuda_ms(lambda: graphs.run(plan), repeats)
        row["kernels_ms"], row["num_kernels"], row["top"] = kernel_breakdown(lambda: graphs.run(plan))
        row["kernels_from"] = "graph replay"
        row["gap_ms"] = row["graph_ms"] - sum(row["kernels_ms"].values())
    row["execute_ms"] = wall_ms(lambda: runner.execute(plan), repeats)
    row["sampling"] = profile_sampler(runner, plan, repeats)
    forward_ms = row.get("graph_ms")
    for mode in row["sampling"].values():
        mode["share"] = mode["sampler_ms"] / (forward_ms + mode["sampler_ms"]) if forward_ms else None
    runner.graphs = None  # eager: the same forward, kernel by kernel
    try:
        row["eager_ms"] = wall_ms(lambda: runner.forward_logits(plan), max(3, repeats // 4))
        if row.get("num_kernels", 0) < 10:  # no graph, or the profiler does not see inside graphs
            row["kernels_ms"], row["num_kernels"], row["top"] = kernel_breakdown(
                lambda: runner.forward_logits(plan))
            row["kernels_from"] = "eager forward"
    finally:
        runner.graphs = graphs
    return row


def profile_prefill(runner: ModelRunner, plan: StepPlan, weight_bytes: int, trace_path: str | None) -> dict:
    prefill = {"tokens": plan.num_tokens, "execute_ms": wall_ms(lambda: runner.execute(plan), 5)}
    prefill["kernels_ms"], prefill["num_kernels"], prefill["top"] = kernel_breakdown(
        lambda: runner.execute(plan))
    prefill["timeline"] = profile_timeline(lambda: runner.execute(plan), trace_path)
    flops = 2 * (weight_bytes / 2) * plan.num_tokens  # bf16: parameters = bytes / 2
    prefill["tflop_s"] = flops / (prefill["execute_ms"] * 1e-3) / 1e12
    return prefill


def memory_breakdown(runner: ModelRunner) -> dict:
    """What the KV-pool sizing sees: the weights, and the peak of the warm-up step above them, with the
    operators that allocated most during that step (torch.profiler's memory view)."""
    from torch.profiler import ProfilerActivity, profile

    gib = 2**30
    weights = torch.cuda.memory_allocated()
    peak = runner.profile_peak_memory()
    with profile(activities=[ProfilerActivity.CUDA], profile_memory=True) as prof:
        runner.profile_peak_memory()
    ops = sorted(((e.key, e.self_device_memory_usage) for e in prof.key_averages()),
                 key=lambda kv: -kv[1])[:10]
    return {"allocated_before_kv_gib": weights / gib, "profile_peak_gib": peak / gib,
            "step_peak_above_weights_gib": (peak - weights) / gib,
            "top_allocating_ops_gib": [(name, usage / gib) for name, usage in ops]}


@torch.inference_mode()  # the runner's buffers and graphs are inference tensors
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen3-14b")
    parser.add_argument("--batches", default="1,64,256",
                        help="decode batch sizes (comma-separated; empty: the prefill alone)")
    parser.add_argument("--context", type=int, default=2048, help="tokens of context per decode request")
    parser.add_argument("--prefill-len", type=int, default=1784)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--quantization", choices=["fp8"], default=None,
                        help="quantize the weights at load, as cadence serve --quantization does")
    parser.add_argument("--out", default=None, help="write the figures as JSON here")
    parser.add_argument("--trace", default=None,
                        help="write the prefill's profiler trace here (Chrome format, gzipped: name.json.gz)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks.step_profile needs a CUDA GPU")

    batches = [int(b) for b in args.batches.split(",") if b.strip()]
    block_size = 16
    pages_per_req = -(-(args.context + 1) // block_size)
    model = ModelConfig.from_name(args.model)
    if args.quantization:
        model = model.quantized_at_load(args.quantization)
    config = EngineConfig(
        model=model, cache=CacheConfig(block_size=block_size),
        scheduler=SchedulerConfig(max_num_seqs=max(batches, default=1), max_num_batched_tokens=8192,
                                  max_model_len=max(args.context, args.prefill_len) + 16),
        device="cuda",
    )
    num_pages = max(max(batches, default=0) * pages_per_req, -(-args.prefill_len // block_size))
    runner = ModelRunner(config, num_pages=num_pages)
    memory = memory_breakdown(runner)  # KV cache and graphs already allocated: count from here
    weight_bytes = sum(p.numel() * p.element_size() for p in runner.model.parameters())
    ceiling_tb_s, ceiling_of = read_ceiling(torch.cuda.get_device_name())
    floor_ms = weight_bytes / (ceiling_tb_s * 1e12) * 1e3
    rng = np.random.default_rng(0)
    pdl = dependent_launch(torch.device("cuda"))
    report: dict = {"model": args.model, "device": torch.cuda.get_device_name(), "context": args.context,
                    "dependent_launch": pdl,
                    "weight_gb": weight_bytes / 1e9, "weight_floor_ms": floor_ms, "read_tb_s": ceiling_tb_s,
                    "memory": memory,
                    "decode": [], "prefill": {}}

    for batch in batches:
        plan = decode_plan(batch, args.context, block_size, pages_per_req, rng)
        report["decode"].append(profile_decode(runner, plan, args.repeats))
    report["prefill"] = profile_prefill(runner, prefill_plan(args.prefill_len, block_size, rng), weight_bytes,
                                        args.trace)

    print(f"\n{report['device']}, {args.model}: weights {report['weight_gb']:.2f} GB, "
          f"read-once floor {floor_ms:.2f} ms per decode step (at {ceiling_tb_s} TB/s, {ceiling_of})")
    print("programmatic dependent launch on: kernel times overlap and include waits (CADENCE_PDL=0 for "
          "each kernel's own)\n" if pdl else "")
    cats = [c for c, _ in CATEGORIES] + ["elementwise_other"]
    print(f"{'batch':>5s} {'graph':>7s} {'execute':>8s} {'eager':>7s} {'kernels':>7s} "
          + " ".join(f"{c[:13]:>13s}" for c in cats) + f" {'gap':>6s}")
    for row in report["decode"]:
        k = row.get("kernels_ms", {})
        print(f"{row['batch']:5d} {row.get('graph_ms', float('nan')):7.2f} {row['execute_ms']:8.2f} "
              f"{row['eager_ms']:7.2f} {row.get('num_kernels', 0):7d} "
              + " ".join(f"{k.get(c, 0.0):13.2f}" for c in cats) + f" {row.get('gap_ms', float('nan')):6.2f}")
    print("\nsampler per decode step (graph where the step can use it; eager beside it):")
    print(f"{'batch':>5s} {'mode':>9s} {'sampler':>8s} {'eager':>7s} {'share':>6s} {'execute':>8s}")
    for row in report["decode"]:
        for mode, s in row["sampling"].items():
            share = f"{100 * s['share']:5.1f}%" if s["share"] is not None else "    - "
            print(f"{row['batch']:5d} {mode:>9s} {s['sampler_ms']:8.3f} {s['sampler_eager_ms']:7.3f} "
                  f"{share} {s['execute_ms']:8.2f}")
    prefill = report["prefill"]
    k = prefill["kernels_ms"]
    print(f"\nprefill {args.prefill_len} tokens: execute {prefill['execute_ms']:.1f} ms "
          f"({prefill['tflop_s']:.0f} TFLOP/s of weight products), "
          + ", ".join(f"{c} {k.get(c, 0.0):.1f}" for c in cats))
    for name, ms in prefill["top"]:
        print(f"  {ms:7.3f} ms  {name}")
    print(format_timeline(f"prefill {args.prefill_len} tokens on the timeline", prefill["timeline"]))
    print(f"\nmemory: {memory['allocated_before_kv_gib']:.2f} GiB allocated (weights, this KV pool, graphs); "
          f"the {config.scheduler.max_num_batched_tokens}-token warm-up step peaks "
          f"{memory['step_peak_above_weights_gib']:.2f} GiB above that; top allocators:")
    for name, usage in memory["top_allocating_ops_gib"]:
        print(f"  {usage:7.3f} GiB  {name[:90]}")
    for row in report["decode"][:1] + report["decode"][-1:]:
        print(f"\ntop kernels, decode batch {row['batch']} ({row['kernels_from']}):")
        for name, ms in row["top"]:
            print(f"  {ms:7.3f} ms  {name}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=2)
        print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
