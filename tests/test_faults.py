"""Fault-injection matrix on the CPU: an executor killed (SIGKILL) under a load of 32 concurrent
streams of mixed shapes (long chunked prompts, a hot shared prefix, short prompts; greedy and
seeded sampling), at a chosen kind of step: during a long chunked prefill, in a mixed
prefill+decode step, in pure decode; with async scheduling on and off, with preemption forced by a
small pool, and one TP rank of a DP=2 x TP=2 server. A TP rank of a DP=1 server that dies makes the
server say it cannot serve before its request's error reaches the client, and its surviving peer is
ended even when it cannot take SIGTERM.

A DP=2 server must finish every stream with exactly the tokens of a server that never failed; a
DP=1 server must end every stream with an error within 20 s and stop reporting itself as serving.
Afterwards the surviving replica holds no page that is neither free nor cached and the router's
load accounting is back to zero.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time

import numpy as np
import pytest
from system_client import SystemClient, tiny_config

from core.sampling_params import SamplingParams
from ipc.messages import OutputDelta
from procs.executor_proc import TP_STEP_FAILED_EXIT_CODE
from procs.fault_injection import ENV, InjectedFault, step_kind_matches
from procs.launcher import Launcher, LaunchOptions

MAX_MODEL_LEN = 1024


def _workload() -> dict[str, tuple[dict, SamplingParams]]:
    """32 requests: 8 long prompts (chunked past the 256-token step), 12 behind a shared 200-token
    prefix (a hot cache), 12 short; a quarter sample with a seed, the rest are greedy."""
    rng = np.random.default_rng(2026)
    shared = rng.integers(0, 151_000, 200).tolist()
    prompts = [rng.integers(0, 151_000, int(n)).tolist() for n in rng.integers(300, 600, 8)]
    prompts += [shared + rng.integers(0, 151_000, int(n)).tolist() for n in rng.integers(3, 40, 12)]
    prompts += [rng.integers(0, 151_000, int(n)).tolist() for n in rng.integers(1, 40, 12)]
    work = {}
    for i, ids in enumerate(prompts):
        max_tokens = int(8 + (i * 7) % 33)
        sampled = dict(temperature=1.0, top_p=0.9, seed=1000 + i) if i % 4 == 3 else dict(temperature=0.0)
        work[f"s{i:02d}"] = ({"prompt_token_ids": ids},
                             SamplingParams(max_tokens=max_tokens, ignore_eos=True, **sampled))
    return work


WORKLOAD = _workload()


def _config(device: str, dp: int = 1, tp: int = 1, async_on: bool = True, num_pages: int = 512):
    config = tiny_config(dp=dp, tp=tp, num_pages=num_pages, max_model_len=MAX_MODEL_LEN, max_num_seqs=32)
    return dataclasses.replace(config, device=device, scheduler=dataclasses.replace(
        config.scheduler, async_scheduling=async_on))


def _run(client: SystemClient, timeout_s: float = 240.0, keys: list[str] | None = None):
    keys = list(WORKLOAD) if keys is None else keys
    for key in keys:
        prompt, params = WORKLOAD[key]
        client.submit(key, params, **prompt)
    return client.collect(keys, timeout_s=timeout_s)


# What a survivor is sent after the fault: every third request, long, shared-prefix, short and seeded.
AFTERWARDS = list(WORKLOAD)[::3]


@pytest.fixture(scope="module")
def device() -> str:
    """Where the executors run; tests/gpu/test_gpu_faults.py runs this matrix again with "cuda"."""
    return "cpu"


@pytest.fixture(scope="module")
def expected_tokens(device):
    with Launcher(_config(device), LaunchOptions(startup_timeout_s=180)) as launcher, \
            SystemClient(launcher.endpoints.tokenizer_frontend) as client:
        results = _run(client)
    for key, result in results.items():
        assert result.error is None and len(result.token_ids) == WORKLOAD[key][1].max_tokens
    return {key: r.token_ids for key, r in results.items()}


def _wait_until_balanced(client: SystemClient, timeout_s: float = 10.0) -> None:
    """Every live replica idle with every page free or cached; the router's load zero everywhere."""
    deadline = time.monotonic() + timeout_s
    while True:
        info = client.info()
        live = [r for r in info.replicas if r.alive]
        balanced = all(r.stats.num_running == r.stats.num_waiting == 0 and r.stats.kv_usage == 0
                       and r.stats.num_free_pages + r.stats.num_cached_pages == r.num_pages for r in live)
        if balanced and all(r.routed_load_tokens == 0 for r in info.replicas):
            return
        assert time.monotonic() < deadline, f"not balanced after {timeout_s} s: {info.replicas}"


MATRIX = [  # id, dp, tp, the fault, async scheduling, KV pages per replica
    ("chunked-prefill", 2, 1, "dp=1 tp=0 at=prefill after=2", True, 512),
    ("mixed", 2, 1, "dp=1 tp=0 at=mixed after=4", True, 512),
    ("decode", 2, 1, "dp=1 tp=0 at=decode after=6", True, 512),
    ("decode-sync", 2, 1, "dp=1 tp=0 at=decode after=6", False, 512),
    ("preemption", 2, 1, "dp=0 tp=0 at=mixed after=3", True, 96),
    ("tp-rank", 2, 2, "dp=1 tp=1 at=mixed after=3", True, 512),
    # A step that raises on one TP rank: the group is out of lockstep, the rank exits.
    ("tp-step-error", 2, 2, "dp=1 tp=1 at=decode after=4 do=raise", True, 512),
]


@pytest.mark.parametrize("dp,tp,fault,async_on,num_pages", [m[1:] for m in MATRIX],
                         ids=[m[0] for m in MATRIX])
def test_a_killed_executor_of_a_dp2_server_costs_no_stream_a_token(device, expected_tokens, monkeypatch, dp,
                                                                    tp, fault, async_on, num_pages):
    monkeypatch.setenv(ENV, fault)
    dead = InjectedFault.parse(fault)
    config = _config(device, dp, tp, async_on, num_pages)
    with Launcher(config, LaunchOptions(startup_timeout_s=180)) as launcher, \
            SystemClient(launcher.endpoints.tokenizer_frontend) as client:
        results = _run(client)
        killed = launcher.replicas[dead.replica].executors[dead.rank].process
        exit_code = -9 if dead.action == "kill" else TP_STEP_FAILED_EXIT_CODE
        assert killed.exitcode == exit_code, "the fault never fired: no step of its kind came"
        for key, result in results.items():
            assert result.error is None and result.finish_reason == "length", (key, result)
            assert result.token_ids == expected_tokens[key], f"{key} changed on its way to a live replica"
        info = client.info()
        assert info.serving and [r.alive for r in info.replicas].count(False) == 1
        assert f"executor dp={dead.replica} tp={dead.rank} exited with code {exit_code}" in \
            info.replicas[dead.replica].reason
        live = next(r for r in info.replicas if r.alive)
        if num_pages < 512:
            assert live.stats.num_preemptions > 0, "the small pool was meant to force preemption"
        _wait_until_balanced(client)
        # The survivor keeps serving new work.
        again = _run(client, keys=AFTERWARDS)
        assert all(again[k].token_ids == expected_tokens[k] for k in AFTERWARDS)
        _wait_until_balanced(client)


def test_a_killed_executor_of_a_dp1_server_ends_every_stream_with_an_error_within_20_s(device, monkeypatch):
    monkeypatch.setenv(ENV, "dp=0 tp=0 at=decode after=5")
    with Launcher(_config(device), LaunchOptions(startup_timeout_s=180)) as launcher, \
            SystemClient(launcher.endpoints.tokenizer_frontend) as client:
        results = _run(client, timeout_s=120)
        died_s = time.monotonic()  # an upper bound of the death: every stream has ended by now
        first_error_s = min(r.finished_s for r in results.values() if r.error)
        assert launcher.replicas[0].executors[0].process.exitcode == -9
        for key, result in results.items():
            if result.error is None:  # finished before the kill
                assert len(result.token_ids) == WORKLOAD[key][1].max_tokens
                continue
            assert result.finish_reason == "abort", result
            assert "no replica is serving" in result.error and "executor dp=0 tp=0" in result.error
            assert result.finished_s - first_error_s < 20.0
        assert died_s - first_error_s < 20.0
        assert sum(r.error is not None for r in results.values()) > 0
        assert not client.info().serving


def test_a_dead_tp_rank_turns_the_server_unavailable_before_its_request_fails_and_its_wedged_peer_is_ended(
        device):
    with Launcher(_config(device, dp=1, tp=2), LaunchOptions(startup_timeout_s=180)) as launcher, \
            SystemClient(launcher.endpoints.tokenizer_frontend) as client:
        client.submit("long", SamplingParams(max_tokens=900, temperature=0.0, ignore_eos=True),
                      prompt_token_ids=[9707, 11, 1879])
        assert isinstance(client.channel.expect(60), OutputDelta)  # it runs
        survivor, victim = (launcher.replicas[0].executors[rank].process for rank in (0, 1))
        # A rank blocked in a collective with a dead peer (NCCL waits inside CUDA) never runs its
        # SIGTERM handler; a stopped process does not either.
        os.kill(survivor.pid, signal.SIGSTOP)
        os.kill(victim.pid, signal.SIGKILL)
        msg = client.channel.expect(30)
        while not msg.finished:  # the rest of the stream, up to its error
            msg = client.channel.expect(30)
        assert msg.error is not None and "executor dp=0 tp=1 exited with code -9" in msg.error
        # Asked after the error came, the server already says it cannot serve (/health: 503).
        info = client.info(fresh=False)
        assert not info.serving and not info.replicas[0].alive
        # The launcher's threads reap it too: poll until one of them has recorded its exit code (a
        # join here can return while another thread is between reaping it and recording the code).
        deadline = time.monotonic() + 10
        while survivor.exitcode is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert survivor.exitcode == -signal.SIGKILL, "the survivor of the dead replica kept running"


def test_a_hung_executor_is_named_killed_and_its_requests_move_after_the_step_timeout(
        device, expected_tokens, monkeypatch):
    monkeypatch.setenv(ENV, "dp=1 tp=0 at=decode after=4 do=hang")
    options = LaunchOptions(startup_timeout_s=180, step_timeout_s=5.0)
    with Launcher(_config(device, dp=2), options) as launcher, \
            SystemClient(launcher.endpoints.tokenizer_frontend) as client:
        results = _run(client)
        for key, result in results.items():
            assert result.error is None and result.token_ids == expected_tokens[key], key
        hung = launcher.replicas[1].executors[0].process
        hung.join(5)
        assert hung.exitcode == -9, "the scheduler should have killed the hung executor"
        reason = client.info().replicas[1].reason
        assert "executor dp=1 tp=0" in reason and "within 5 s" in reason, reason
        assert "took step" in reason and "stuck inside the step" in reason, reason  # it hung holding it
        _wait_until_balanced(client)


def test_step_kinds_are_told_apart_from_the_plan():
    from plans import Chunk, make_plan

    def plan(*chunks: tuple[int, int, bool]):  # (start, tokens, samples) per request
        return make_plan([Chunk(list(range(n)), start, list(range(8)), sample)
                          for start, n, sample in chunks], block_size=16)

    prefill, decode, mixed = plan((0, 64, False)), plan((10, 1, True), (20, 1, True)), plan((10, 1, True),
                                                                                          (0, 5, True))
    assert step_kind_matches(prefill, "prefill") and not step_kind_matches(prefill, "decode")
    assert step_kind_matches(decode, "decode") and not step_kind_matches(decode, "mixed")
    assert step_kind_matches(mixed, "mixed") and not step_kind_matches(mixed, "prefill")


@pytest.mark.parametrize("text,message", [("dp=1 tp=0 at=later", "not one of"), ("dp=x", "invalid literal"),
                                          ("when=now", "cannot read"), ("do=explode", "do='explode'")])
def test_a_malformed_fault_drill_is_refused_with_the_field(text, message):
    with pytest.raises(ValueError, match=message):
        InjectedFault.parse(text)


@pytest.mark.parametrize("kill,kill_after,message", [
    ("cadence:nobody", 0.0, "the drill killed nothing: no process titled 'cadence:nobody'"),
    ("cadence:executor dp=0 tp=0", 120.0,
     r"the drill killed nothing: the load ended after .* before --kill-after 120"),
], ids=["no-such-process", "load-ended-first"])
def test_a_fault_drill_that_kills_nothing_fails_naming_why(tmp_path, kill, kill_after, message):
    """A drill whose kill never happened does not report a fault survived: it ends with the reason."""
    from benchmarks import fault_drill

    argv = ["--serve=--model qwen3-tiny --device cpu --max-model-len 256", "--kill", kill,
            "--kill-after", str(kill_after), "--server-log", str(tmp_path / "server.log"), "--",
            "--dataset", "random", "--input-len", "16", "--output-len", "4", "--num-prompts", "8",
            "--max-concurrency", "4"]
    with pytest.raises(SystemExit, match=message):
        fault_drill.main(argv)
