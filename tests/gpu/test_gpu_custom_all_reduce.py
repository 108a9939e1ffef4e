"""The one-shot all-reduce over CUDA IPC, with two processes sharing the one GPU (they time-slice,
so its timings say nothing about several cards; benchmarks/all_reduce.py measures those): the group
turns it on, every size and dtype gives the rank-ordered float32 sum rounded once (bit for bit),
eager and replayed in a CUDA graph, and the TP group sends small messages to it.

    python -m pytest tests/gpu/test_gpu_custom_all_reduce.py -s
"""

from __future__ import annotations

import datetime
import multiprocessing
import time

import pytest
import torch
from free_ports import free_port

from core.execution.all_reduce_kernel import CHUNK

MAX_BYTES = 1 << 20
SIZES = [1, 7, 5120, 2 * CHUNK + 3, 40 * 5120, MAX_BYTES // 4]
DTYPES = [torch.bfloat16, torch.float16, torch.float32]


def rank_input(seed: int, rank: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
    generator = torch.Generator(device="cuda").manual_seed(1000 * seed + rank)
    return (torch.randn(numel, generator=generator, device="cuda") * (rank + 1)).to(dtype)


def expected_sum(seed: int, world: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
    total = torch.zeros(numel, device="cuda")
    for rank in range(world):
        total += rank_input(seed, rank, numel, dtype).float()
    return total.to(dtype)


def run_rank(rank: int, world: int, port: int, reports) -> None:
    try:
        torch.cuda.set_device(0)
        from core.execution.custom_all_reduce import connect

        store = torch.distributed.TCPStore("127.0.0.1", port, world, is_master=rank == 0,
                                           timeout=datetime.timedelta(seconds=60))
        all_reduce = connect(store, rank, world, torch.device("cuda", 0), MAX_BYTES)
        if all_reduce is None:
            reports.put((rank, "off", "connect turned the kernel off (see the log)"))
            return
        seed = 0
        for dtype in DTYPES:
            for numel in SIZES:
                if numel * dtype.itemsize > MAX_BYTES:
                    continue
                seed += 1
                x = rank_input(seed, rank, numel, dtype)
                all_reduce(x)
                if not torch.equal(x, expected_sum(seed, world, numel, dtype)):
                    reports.put((rank, "wrong", f"eager {numel} x {dtype}"))
                    return
        static = torch.zeros(40 * 5120, dtype=torch.bfloat16, device="cuda")
        all_reduce(static)  # the kernel compiled for this shape before the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            all_reduce(static)
        for replay in range(8):
            seed += 1
            static.copy_(rank_input(seed, rank, static.numel(), static.dtype))
            graph.replay()
            if not torch.equal(static, expected_sum(seed, world, static.numel(), static.dtype)):
                reports.put((rank, "wrong", f"graph replay {replay}"))
                return
            if replay % 2:  # eager calls between replays keep every program's epoch in step
                y = rank_input(seed, rank, 5120, torch.bfloat16)
                all_reduce(y)
        torch.cuda.synchronize()
        x = rank_input(0, rank, 5120, torch.bfloat16)
        started = time.perf_counter()
        for _ in range(200):
            all_reduce(x)
        torch.cuda.synchronize()
        reports.put((rank, "ok", (time.perf_counter() - started) / 200 * 1e6))
    except Exception as exc:  # noqa: BLE001 - reported to the test
        reports.put((rank, "error", f"{type(exc).__name__}: {exc}"))


def test_two_processes_on_one_gpu_sum_exactly_eager_and_in_graphs():
    world = 2
    context = multiprocessing.get_context("spawn")
    reports = context.Queue()
    port = free_port()
    ranks = [context.Process(target=run_rank, args=(r, world, port, reports)) for r in range(world)]
    for process in ranks:
        process.start()
    results = {}
    deadline = time.monotonic() + 240
    while len(results) < world and time.monotonic() < deadline:
        try:
            rank, verdict, detail = reports.get(timeout=5)
            results[rank] = (verdict, detail)
        except Exception:  # noqa: BLE001 - queue.Empty: keep waiting until the deadline
            pass
    for process in ranks:
        process.join(timeout=10)
        process.kill()
    assert len(results) == world, f"ranks {sorted(set(range(world)) - set(results))} never reported: stuck"
    assert all(v == "ok" for v, _ in results.values()), results
    print(f"\n[one-shot all-reduce] two processes time-slicing one GPU: 10 KB bf16 in "
          f"{max(d for _, d in results.values()):.0f} us per call (not a multi-card figure)")


@pytest.mark.parametrize("custom", [True, False])
def test_a_one_rank_group_captures_tp_decode_graphs_equal_to_eager(custom):
    """A TP group of one rank over NCCL: the model's TP code paths (all-reduces through the kernel or
    through NCCL, the gather to rank 0) captured in decode graphs give the eager path's logits."""
    from test_gpu_decode_graphs import _steps

    from core.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
    from core.execution.custom_all_reduce import connect
    from core.execution.distributed import TPGroup
    from core.execution.runner import ModelRunner

    store = torch.distributed.HashStore()
    torch.distributed.init_process_group("nccl", store=store, rank=0, world_size=1)
    try:
        torch.cuda.set_device(0)
        group = TPGroup(rank=0, size=1, group=torch.distributed.group.WORLD,
                        custom_all_reduce=(connect(store, 0, 1, torch.device("cuda", 0), MAX_BYTES)
                                           if custom else None))
        assert (group.custom_all_reduce is not None) == custom

        def runner(enforce_eager: bool) -> ModelRunner:
            config = EngineConfig(model=ModelConfig.from_name("qwen3-tiny", dtype="float32"),
                                  cache=CacheConfig(block_size=16, num_pages=2048),
                                  scheduler=SchedulerConfig(max_model_len=1024, max_num_seqs=40),
                                  device="cuda", enforce_eager=enforce_eager)
            return ModelRunner(config, tp=group, show_progress=False)

        graphs, eager = runner(False), runner(True)
        assert graphs.graphs is not None and not graphs.graphs.logits_in_graph
        for batch in (1, 5, 40):
            import numpy as np

            for plan in _steps(batch, np.random.default_rng(batch)):
                assert (plan.num_tokens == plan.num_reqs) == graphs._graphed(plan)
                ours, _ = graphs.forward_logits(plan)
                theirs, _ = eager.forward_logits(plan)
                error = float((ours - theirs).abs().max() / theirs.abs().max())
                assert error < 1e-4, f"batch {batch} step {plan.step_id}: graph logits differ by {error:.2e}"
    finally:
        torch.distributed.destroy_process_group()
