"""The TP all-reduce per message size: the one-shot kernel (core/execution/custom_all_reduce.py)
against NCCL, each replayed from a CUDA graph as decode steps replay them, and the size where NCCL
starts to win (what DEFAULT_MAX_BYTES should be on this machine).

    python -m benchmarks.all_reduce --ranks 2 --out results/allreduce_tp2.json

One process per rank, rank r on cuda:r. With fewer visible GPUs than ranks every rank shares
cuda:0 (the group is then gloo, so there is no NCCL column, and the kernel's times are those of
processes time-slicing one card: a correctness run, not a figure). Every size is checked against
NCCL's (or, sharing a card, the float32 reference) sum before it is timed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing
import socket
import statistics
import sys

# bf16 messages: 2 KB .. 8 MB; 10,240 B is one token of Qwen3-14B's hidden state.
SIZES = [2048, 10240, 32768, 65536, 131072, 262144, 524288, 1 << 20, 2 << 20, 4 << 20, 8 << 20]
CALLS_PER_GRAPH = 20
REPLAYS = 15


def _rank_main(rank: int, ranks: int, port: int, shared: bool, queue) -> None:
    import torch

    from core.execution.custom_all_reduce import connect

    device = torch.device("cuda", 0 if shared else rank)
    torch.cuda.set_device(device)
    store = torch.distributed.TCPStore("127.0.0.1", port, ranks, is_master=rank == 0,
                                       timeout=datetime.timedelta(seconds=120))
    backend = "gloo" if shared else "nccl"
    torch.distributed.init_process_group(backend, store=store, rank=rank, world_size=ranks)
    custom = connect(store, rank, ranks, device, max(SIZES))
    rows = []
    for size in SIZES:
        numel = size // 2
        generator = torch.Generator(device=device).manual_seed(rank * 7919 + size)
        x = torch.randn(numel, generator=generator, device=device).to(torch.bfloat16)
        row = {"bytes": size, "custom_ok": None, "custom_us": None, "nccl_us": None}
        if custom is not None:
            got = custom(x.clone())
            if shared:
                expected = x.float()
                torch.distributed.all_reduce(expected)  # gloo: the float32 sum
                expected = expected.to(torch.bfloat16)
            else:
                expected = x.clone()
                torch.distributed.all_reduce(expected)
            row["custom_ok"] = bool(((got.float() - expected.float()).abs()
                                     <= 1e-2 * expected.float().abs() + 1e-2).all())
        scratch = x.clone()  # the timed calls sum it over and over; its values do not matter
        if custom is not None:
            row["custom_us"] = _graph_us(lambda t=scratch: custom(t), device)
        if not shared:
            row["nccl_us"] = _graph_us(lambda t=scratch: torch.distributed.all_reduce(t), device)
        rows.append(row)
    if rank == 0:
        queue.put({"rows": rows, "custom": custom is not None,
                   "device": torch.cuda.get_device_name(device)})
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


def _graph_us(call, device) -> float:
    """Median microseconds per call, CALLS_PER_GRAPH calls captured in one graph."""
    import torch

    for _ in range(3):
        call()
    torch.cuda.synchronize(device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CALLS_PER_GRAPH):
            call()
    times = []
    for _ in range(REPLAYS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / CALLS_PER_GRAPH)
    return statistics.median(times)


def crossover(rows: list[dict]) -> int | None:
    """The smallest size from which NCCL is at least as fast as the kernel at every larger size."""
    timed = [r for r in rows if r["custom_us"] is not None and r["nccl_us"] is not None]
    answer = None
    for row in reversed(timed):
        if row["nccl_us"] <= row["custom_us"]:
            answer = row["bytes"]
        else:
            break
    return answer


def _us(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--out", default=None, help="write the rows as JSON here")
    args = p.parse_args(argv)
    import torch

    visible = torch.cuda.device_count()
    if visible == 0:
        print("no CUDA device visible", file=sys.stderr)
        return 2
    shared = visible < args.ranks
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    procs = [context.Process(target=_rank_main, args=(r, args.ranks, port, shared, queue))
             for r in range(args.ranks)]
    for proc in procs:
        proc.start()
    result = queue.get(timeout=900)
    for proc in procs:
        proc.join(timeout=60)
    result.update(ranks=args.ranks, shared_gpu=shared, crossover_bytes=crossover(result["rows"]),
                  command=f"python -m benchmarks.all_reduce --ranks {args.ranks}")
    print(f"{args.ranks} ranks on {result['device']}" + (" (sharing one card: not a multi-card figure)"
                                                          if shared else ""))
    print(f"{'bytes':>10} {'one-shot us':>12} {'NCCL us':>10} {'correct':>8}")
    for row in result["rows"]:
        custom_us, nccl_us = (_us(row[k]) for k in ("custom_us", "nccl_us"))
        print(f"{row['bytes']:>10} {custom_us:>12} {nccl_us:>10} {str(row['custom_ok']):>8}")
    if not shared:
        at = result["crossover_bytes"]
        print(f"NCCL is at least as fast from {at} bytes up" if at else
              "the one-shot kernel is faster at every size measured")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0 if all(r["custom_ok"] is not False for r in result["rows"]) and result["custom"] else 1


if __name__ == "__main__":
    sys.exit(main())
