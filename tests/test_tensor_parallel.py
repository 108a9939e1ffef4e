"""TP=2 over gloo, in two real processes, computes the logits TP=1 computes from the same checkpoint;
a rank that stalls at any phase of joining is named by its peer once --dist-timeout has passed."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from free_ports import free_port
from plans import Chunk, make_plan
from tiny_models import build_tiny_checkpoint

from core.config import CacheConfig, EngineConfig, ModelConfig, ParallelConfig
from core.execution import distributed
from core.execution.distributed import TPGroup, TPStartupError, init_tp_group
from core.execution.runner import ModelRunner
from procs.executor_start import forkserver_context

BLOCK_SIZE = 16


def _config(directory: str, tp_size: int) -> EngineConfig:
    return EngineConfig(model=ModelConfig.from_pretrained(directory, dtype="float32"),
                        parallel=ParallelConfig(tp_size=tp_size),
                        cache=CacheConfig(block_size=BLOCK_SIZE, num_pages=16))


def _plans(prompt: list[int], continuation: list[int]):
    pages = [4, 0, 9, 2]
    yield make_plan([Chunk(prompt, 0, pages)], BLOCK_SIZE)
    for i, token in enumerate(continuation):
        yield make_plan([Chunk([token], len(prompt) + i, pages)], BLOCK_SIZE, step_id=i + 1)


def _run(runner: ModelRunner, prompt, continuation) -> list[torch.Tensor | None]:
    out = []
    for plan in _plans(prompt, continuation):
        logits, _ = runner.forward_logits(plan)
        out.append(None if logits is None else logits.clone())
    return out


def _tp_worker(rank: int, directory: str, port: int, prompt, continuation, queue) -> None:
    torch.set_num_threads(1)
    tp = init_tp_group(rank, 2, f"tcp://127.0.0.1:{port}", backend="gloo")
    try:
        runner = ModelRunner(_config(directory, 2), tp=tp, show_progress=False)
        logits = _run(runner, prompt, continuation)
        if rank == 0:
            queue.put([x.numpy() for x in logits])
        else:
            assert all(x is None for x in logits), "only TP rank 0 receives logits"
            queue.put("rank 1 done")
    finally:
        torch.distributed.destroy_process_group()


def test_tp2_logits_equal_tp1(tmp_path):
    build_tiny_checkpoint(tmp_path, seed=5)
    rng = np.random.default_rng(3)
    prompt = rng.integers(0, 256, size=23).tolist()
    continuation = rng.integers(0, 256, size=6).tolist()
    expected = _run(ModelRunner(_config(str(tmp_path), 1), tp=TPGroup(), show_progress=False),
                    prompt, continuation)

    ctx = forkserver_context()
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_tp_worker, args=(r, str(tmp_path), port, prompt, continuation, queue))
             for r in range(2)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0, f"TP worker exited with {p.exitcode}"
    tp2 = next(r for r in results if not isinstance(r, str))
    assert "rank 1 done" in results
    for step, (ours, theirs) in enumerate(zip(tp2, expected)):
        error = float(np.abs(ours - theirs.numpy()).max() / np.abs(theirs.numpy()).max())
        assert error < 1e-5, f"step {step}: TP=2 logits differ from TP=1 by {error:.2e}"


def _join_worker(rank: int, port: int, stalled_rank: int, stall_at: str, timeout_s: float, queue) -> None:
    """One rank of a TP=2 group; `stalled_rank` stops for good on entering phase `stall_at` of
    joining ("start": it never reaches its peers at all)."""
    if rank == stalled_rank:
        if stall_at == "start":
            time.sleep(10 * timeout_s)
            return
        arrive = distributed._arrive

        def stall(store, phase: str, rank: int) -> None:
            if phase == stall_at:
                time.sleep(10 * timeout_s)
            arrive(store, phase, rank)

        distributed._arrive = stall
    started = time.monotonic()
    try:
        init_tp_group(rank, 2, f"tcp://127.0.0.1:{port}", "gloo", "cpu", timeout_s=timeout_s)
        queue.put((rank, "joined", time.monotonic() - started))
    except TPStartupError as exc:
        queue.put((rank, str(exc), time.monotonic() - started))


@pytest.mark.parametrize("stalled_rank,stall_at,message", [
    (1, "start", "tp=0 on cpu: tp=1 of 2 ranks did not join the TP group within 3 s (--dist-timeout)"),
    (0, "start", "tp=1 on cpu could not reach the rendezvous that tp=0 hosts at 127.0.0.1:"),
    (1, "connecting", "tp=0 on cpu: the gloo process group did not form within 3 s (--dist-timeout), "
                      "waiting for tp=1, which never got this far"),
    (1, "reducing", "tp=0 on cpu: the TP group's first all-reduce did not complete within 3 s "
                    "(--dist-timeout), waiting for tp=1, which never got this far"),
])
def test_a_rank_that_stalls_while_joining_is_named_by_its_peer_within_the_dist_timeout(stalled_rank, stall_at,
                                                                                      message):
    timeout_s = 3.0
    ctx = forkserver_context()
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_join_worker, args=(r, port, stalled_rank, stall_at, timeout_s, queue))
             for r in range(2)]
    for p in procs:
        p.start()
    try:
        rank, text, waited_s = queue.get(timeout=60)
    finally:
        for p in procs:
            p.kill()
            p.join(10)
    assert rank == 1 - stalled_rank
    assert text.startswith(message), text
    # Each phase has the whole timeout; the ones before the stall passed at once.
    assert timeout_s <= waited_s < timeout_s + 5, f"gave up after {waited_s:.1f} s"
