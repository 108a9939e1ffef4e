"""The whole multiprocess system on the CPU: tokenizer, scheduler and executor processes for real.

DP and TP layouts must produce the greedy tokens of one replica; the DP router must spread work and
follow cached prefixes; an executor killed mid-run must cost a DP=2 client nothing and a DP=1 client
a clear error within seconds; a crash must leave nothing behind in /dev/shm.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import time

import numpy as np
import pytest
import zmq
from system_client import GREEDY, SystemClient, tiny_config

from core.sampling_params import SamplingParams
from ipc.messages import ContextOverflow
from ipc.shm_ring import SHM_DIR, run_prefix
from procs.launcher import Launcher, LaunchError, LaunchOptions

# Lengths around the page size (16) and past the step budget (256), so chunked prefill runs too.
PROMPT_LENGTHS = (1, 5, 15, 16, 17, 40, 100, 300)


def _prompts(seed: int = 0) -> dict[str, dict]:
    rng = np.random.default_rng(seed)
    prompts = {f"ids-{n}": {"prompt_token_ids": rng.integers(0, 151_000, n).tolist()} for n in PROMPT_LENGTHS}
    prompts["text"] = {"prompt": "The capital of France is"}
    prompts["chat"] = {"messages": [{"role": "user", "content": "Say hello."}]}
    return prompts


def _chat(prompts: dict[str, dict]) -> dict[str, dict]:
    from ipc.messages import ChatTurn

    out = {}
    for key, prompt in prompts.items():
        if "messages" in prompt:
            prompt = {"messages": [ChatTurn(**m) for m in prompt["messages"]]}
        out[key] = prompt
    return out


def _launch(config, **options) -> Launcher:
    return Launcher(config, LaunchOptions(startup_timeout_s=180, **options))


def _leftovers(launcher: Launcher) -> list[str]:
    return [name for name in os.listdir(SHM_DIR) if name.startswith(run_prefix(launcher.run_id))]


@pytest.fixture(scope="module")
def reference():
    """DP=1, TP=1: the outputs every other layout must reproduce."""
    with _launch(tiny_config()) as launcher, SystemClient(launcher.endpoints.tokenizer_frontend) as client:
        yield launcher, client


@pytest.fixture(scope="module")
def reference_tokens(reference):
    _, client = reference
    results = client.generate(_chat(_prompts()), GREEDY)
    for r in results.values():
        assert r.finish_reason == "length" and len(r.token_ids) == GREEDY.max_tokens
    return {k: r.token_ids for k, r in results.items()}


@pytest.mark.parametrize("dp,tp,async_on", [(1, 2, False), (2, 1, False), (2, 2, False), (1, 1, True),
                                             (2, 1, True), (1, 2, True)])
def test_dp_and_tp_layouts_produce_the_greedy_tokens_of_one_replica(dp, tp, async_on, reference_tokens):
    config = tiny_config(dp=dp, tp=tp)
    config = dataclasses.replace(config, scheduler=dataclasses.replace(config.scheduler,
                                                                       async_scheduling=async_on))
    with _launch(config) as launcher, \
            SystemClient(launcher.endpoints.tokenizer_frontend) as client:
        results = client.generate(_chat(_prompts()), GREEDY)
        info = client.info()
    for key, expected in reference_tokens.items():
        assert results[key].error is None, results[key]
        assert results[key].token_ids == expected, (
            f"dp={dp} tp={tp} async={async_on}: {key} differs from dp=1 tp=1")
    assert info.serving and len(info.replicas) == dp
    if dp == 2:  # both replicas took part
        assert all(r.stats.num_prompt_tokens > 0 for r in info.replicas)


def test_every_process_names_itself(reference):
    launcher, _ = reference
    titles = {}
    for child in launcher.children:
        with open(f"/proc/{child.process.pid}/cmdline", "rb") as f:
            titles[child.name] = f.read().split(b"\0")[0].decode().strip()
    assert titles == {"tokenizer": "cadence:tokenizer", "scheduler": "cadence:scheduler",
                      "executor dp=0 tp=0": "cadence:executor dp=0 tp=0"}


def test_streamed_outputs_arrive_one_per_step_and_join_to_the_whole(reference, reference_tokens):
    _, client = reference
    results = client.generate(_chat(_prompts()), GREEDY, stream=True)
    for key, expected in reference_tokens.items():
        assert results[key].token_ids == expected
        assert results[key].num_outputs == GREEDY.max_tokens  # one output per sampled token


def test_a_request_that_asks_hears_of_its_admission_before_its_first_output(reference, reference_tokens):
    """notify_admitted (what a streamed REST call sends, to start its response during the prefill):
    the scheduler's notice comes before any output; without it none comes; a refused request gets
    its refusal and no notice."""
    _, client = reference
    results = client.generate(_chat(_prompts()), GREEDY, stream=True, notify_admitted=True)
    for key, expected in reference_tokens.items():
        assert results[key].token_ids == expected and results[key].admitted_after_outputs == 0
    quiet = client.generate(_chat(_prompts()), GREEDY, stream=True)
    assert all(r.admitted_after_outputs is None for r in quiet.values())
    client.submit("long", SamplingParams(max_tokens=100), prompt_token_ids=list(range(450)),
                  notify_admitted=True)
    long = client.collect(["long"])["long"]
    assert long.failed is not None and long.admitted_after_outputs is None


def test_too_long_prompt_is_refused_with_the_numbers(reference):
    _, client = reference
    client.submit("long", SamplingParams(max_tokens=100), prompt_token_ids=list(range(450)))
    failed = client.collect(["long"])["long"].failed
    assert failed is not None and failed.field == "max_tokens"
    assert failed.context == ContextOverflow(max_model_len=512, num_prompt_tokens=450, max_tokens=100)
    assert failed.message == ("This model's maximum context length is 512 tokens; the request has 450 "
                              "prompt tokens and asks for 100 more")


def test_more_logprobs_than_the_server_allows_are_refused_naming_the_flag(reference):
    _, client = reference
    client.submit("many", SamplingParams(max_tokens=2, logprobs=21), prompt_token_ids=[1, 2, 3])
    client.submit("prompt", SamplingParams(max_tokens=2, prompt_logprobs=25), prompt_token_ids=[1, 2, 3])
    client.submit("most", SamplingParams(max_tokens=2, logprobs=20), prompt_token_ids=[1, 2, 3])
    widths: list[int] = []
    results = client.collect(["many", "prompt", "most"],
                             on_output=lambda out: widths.extend(len(top) for top in out.top_logprobs or []))
    assert results["many"].failed.field == "logprobs"
    assert results["many"].failed.message == "logprobs 21 is more than this server allows (--max-logprobs 20)"
    assert results["prompt"].failed.field == "prompt_logprobs"
    assert results["most"].failed is None and results["most"].finish_reason == "length"
    assert widths == [20, 20]


def test_a_burst_of_prompts_is_tokenized_together_and_a_bad_one_fails_alone(reference, reference_tokens):
    """Text, chat and id prompts sent at once (tokenized on the encoder threads, forwarded in order),
    with bad ones among them: each good one gets the tokens it gets alone, each bad one its error."""
    _, client = reference
    prompts = _chat(_prompts())
    burst = {f"{key}-{copy}": prompt for copy in range(3) for key, prompt in prompts.items()}
    burst["too-long"] = {"prompt": "word " * 600}
    burst["out-of-vocab"] = {"prompt_token_ids": [1, 2, 10**7]}
    burst["empty"] = {"prompt": ""}
    results = client.generate(burst, GREEDY)
    for key, result in results.items():
        if key in ("too-long", "out-of-vocab", "empty"):
            continue
        assert result.failed is None and result.error is None, result
        assert result.token_ids == reference_tokens[key.rsplit("-", 1)[0]], key
    assert "maximum context length is 512" in results["too-long"].failed.message
    assert "outside the model's vocabulary" in results["out-of-vocab"].failed.message
    assert results["empty"].failed.message == "the prompt is empty"


def test_stop_string_ends_the_request_and_frees_its_pages(reference, reference_tokens):
    launcher, client = reference
    full = client.generate({"t": {"prompt": "The capital of France is"}}, GREEDY)["t"]
    stop = full.text[len(full.text) // 2 : len(full.text) // 2 + 3]
    assert stop
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, stop=(stop,))
    result = client.generate({"s": {"prompt": "The capital of France is"}}, params)["s"]
    assert result.finish_reason == "stop"
    assert result.text == full.text[: full.text.index(stop)]
    _wait_for_idle(client)


def test_abort_ends_a_running_request_with_abort(reference):
    _, client = reference
    client.submit("a", SamplingParams(max_tokens=400, temperature=0.0, ignore_eos=True), prompt="Hi")
    seen = []

    def on_output(msg):
        if not seen:
            client.abort("a")
        seen.append(msg)

    result = client.collect(["a"], on_output=on_output)["a"]
    assert result.finish_reason == "abort" and result.error is None
    assert len(result.token_ids) < 400
    _wait_for_idle(client)


def test_router_spreads_distinct_requests_over_both_replicas():
    with _launch(tiny_config(dp=2)) as launcher, \
            SystemClient(launcher.endpoints.tokenizer_frontend) as client:
        rng = np.random.default_rng(7)
        prompts = {f"r{i}": {"prompt_token_ids": rng.integers(0, 151_000, 20).tolist()} for i in range(100)}
        results = client.generate(prompts, SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True))
        assert all(r.finish_reason == "length" for r in results.values())
        per_replica = [r.stats.num_prompt_tokens // 20 for r in client.info().replicas]
        assert sum(per_replica) == 100 and min(per_replica) >= 40, per_replica

        # A long shared prefix, cached on one replica by a first request, draws the group there.
        prefix = rng.integers(0, 151_000, 200).tolist()
        client.generate({"warm": {"prompt_token_ids": prefix + [1, 2, 3]}}, SamplingParams(max_tokens=1))
        before = [r.stats.prefix_cache_hit_tokens for r in client.info().replicas]
        group = {f"g{i}": {"prompt_token_ids": prefix + [10 + i, 11, 12]} for i in range(8)}
        results = client.generate(group, SamplingParams(max_tokens=2, temperature=0.0))
        gained = [r.stats.prefix_cache_hit_tokens - b for r, b in zip(client.info().replicas, before)]
        assert sorted(gained) == [0, 8 * 192], gained  # 12 full pages of the prefix, every request
        assert all(r.num_cached_tokens == 192 for r in results.values())


def test_router_keeps_each_group_of_a_burst_on_one_replica():
    """Sent at once, before any prefix is cached: the router's record of what it routed keeps each
    group together, and load spreads the groups. A replica's prompt tokens tell which groups it
    served: group g's prompts are 403 + (0, 1, 7, 49)[g] tokens long, so a replica's count of
    each group is a digit in base 7 of its prompt tokens beyond 403 each."""
    offsets = (0, 1, 7, 49)
    with _launch(tiny_config(dp=2)) as launcher, \
            SystemClient(launcher.endpoints.tokenizer_frontend) as client:
        rng = np.random.default_rng(9)
        prompts = []
        for group, offset in enumerate(offsets):
            prefix = rng.integers(0, 151_000, 400).tolist()
            for i in range(6):
                own = rng.integers(0, 151_000, 3 + offset).tolist()
                prompts.append((f"g{group}-{i}", {"prompt_token_ids": prefix + own}))
        burst = dict(prompts[i] for i in rng.permutation(len(prompts)))
        results = client.generate(burst, SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True))
        assert all(r.finish_reason == "length" for r in results.values())
        served = []  # per replica, its count of each group's prompts
        for replica in client.info().replicas:
            num_requests, beyond = divmod(replica.stats.num_prompt_tokens, 403)
            counts = [0, beyond % 7, beyond // 7 % 7, beyond // 49]
            counts[0] = num_requests - sum(counts)
            served.append(counts)
        assert all(count in (0, 6) for counts in served for count in counts), served
        assert all(sum(counts) > 0 for counts in served), served


def _wait_for_idle(client: SystemClient, timeout_s: float = 10.0) -> None:
    """Every replica alive back to zero requests and zero pages owned."""
    deadline = time.monotonic() + timeout_s
    while True:
        replicas = [r for r in client.info(fresh=False).replicas if r.alive]
        if all(r.stats.num_running == 0 and r.stats.num_waiting == 0 and r.stats.kv_usage == 0
               for r in replicas):
            return
        assert time.monotonic() < deadline, f"not idle after {timeout_s} s: {replicas}"
        time.sleep(0.05)


def test_killed_executor_with_dp2_costs_the_clients_nothing(reference):
    _, reference_client = reference
    params = SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True)
    rng = np.random.default_rng(11)
    prompts = {f"k{i}": {"prompt_token_ids": rng.integers(0, 151_000, 30).tolist()}
               for i in range(16)}
    expected = reference_client.generate(prompts, params)
    with _launch(tiny_config(dp=2)) as launcher, \
            SystemClient(launcher.endpoints.tokenizer_frontend) as client:
        killed = []

        def kill_once(msg):
            if not killed and msg.num_output_tokens >= 4:
                launcher.kill_executor(1, 0)
                killed.append(time.monotonic())

        results = client.collect(_submit_all(client, prompts, params), on_output=kill_once)
        assert killed
        for key, result in results.items():
            assert result.error is None and result.finish_reason == "length", result
            assert result.token_ids == expected[key].token_ids, f"{key} changed after its replica died"
        info = client.info()
        assert info.serving
        assert [r.alive for r in info.replicas] == [True, False]
        assert "executor dp=1 tp=0 exited with code -9" in info.replicas[1].reason
        _wait_for_idle(client)


def _submit_all(client: SystemClient, prompts: dict[str, dict], params: SamplingParams) -> list[str]:
    for key, prompt in prompts.items():
        client.submit(key, params, **prompt)
    return list(prompts)


def test_killed_executor_with_dp1_fails_every_request_fast_then_shuts_down_clean():
    launcher = _launch(tiny_config())
    launcher.start()
    try:
        with SystemClient(launcher.endpoints.tokenizer_frontend) as client:
            params = SamplingParams(max_tokens=400, temperature=0.0, ignore_eos=True)
            prompts = {f"d{i}": {"prompt": f"request {i}"} for i in range(6)}
            killed = []

            def kill_once(msg):
                if not killed:
                    launcher.kill_executor(0, 0)
                    killed.append(time.monotonic())

            results = client.collect(_submit_all(client, prompts, params), timeout_s=60, on_output=kill_once)
            for result in results.values():
                assert result.finish_reason == "abort"
                assert "no replica is serving" in result.error and "executor dp=0 tp=0" in result.error
                assert result.finished_s - killed[0] < 5.0
            deadline = time.monotonic() + 5
            while client.info(fresh=False).serving:
                assert time.monotonic() < deadline, "the serving state stayed true"
                time.sleep(0.05)
            assert not launcher.serving
            client.submit("late", params, prompt="anyone?", notify_admitted=True)
            late = client.collect(["late"], timeout_s=10)["late"]
            assert late.failed is not None and late.failed.status == 503
            assert late.admitted_after_outputs is None  # refused by the scheduler: never admitted
    finally:
        launcher.shutdown()
    assert all(not c.process.is_alive() for c in launcher.children)
    assert _leftovers(launcher) == []


def test_crashed_scheduler_is_noticed_and_leaves_nothing_in_dev_shm():
    launcher = _launch(tiny_config())
    launcher.start()
    try:
        assert _leftovers(launcher), "the ring should exist while serving"
        os.kill(launcher.scheduler.process.pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while launcher.fatal_error is None:
            assert time.monotonic() < deadline, "the launcher did not notice the dead scheduler"
            time.sleep(0.02)
        assert "scheduler exited with code -9" in launcher.fatal_error
        assert not launcher.serving
    finally:
        launcher.shutdown()
    assert all(not c.process.is_alive() for c in launcher.children)
    assert _leftovers(launcher) == []


def test_garbage_on_every_socket_is_logged_and_survived(reference):
    launcher, client = reference
    eps = launcher.endpoints
    context = zmq.Context.instance()
    dealer = context.socket(zmq.DEALER)
    dealer.connect(eps.tokenizer_frontend)
    dealer.send(b"\xff not json")
    dealer.send_multipart([b'{"type": "Nope", "body": {}}'])
    dealer.send_multipart([b'{"type": "Ping", "body": {"replica": 0, "nonce": 1}}'])  # a valid wrong type
    dealer.send_multipart([b'{"type": "GenerateRequest", "body": {"request_id": 5}}'])
    for address in (eps.scheduler_input, eps.results, eps.tokenizer_output):
        push = context.socket(zmq.PUSH)
        push.connect(address)
        push.send(b"garbage")
        push.send_multipart([b'{"type": "StepDone", "body": {"replica": 7, "rank": 0, "step_id": 3}}'])
        push.send_multipart([b'{"type": "StepDone", "body": {"replica": 0, "rank": 0, "step_id": 99999}}'])
        push.close(linger=1000)
    dealer.close(linger=1000)
    time.sleep(0.5)
    result = client.generate({"after": {"prompt": "still there?"}}, GREEDY)["after"]
    assert result.finish_reason == "length" and len(result.token_ids) == GREEDY.max_tokens
    assert all(c.process.is_alive() for c in launcher.children)


def test_an_invalid_output_fails_its_own_stream_and_the_others_finish(reference):
    """The tokenizer gets a TokenDeltas with one malformed item (a null where an int belongs) for a
    running request: that request ends with an error naming the field; the same message's good item
    and every other stream carry on (issue: one bad item used to drop the whole message)."""
    launcher, client = reference
    long = SamplingParams(max_tokens=200, temperature=0.0, ignore_eos=True)
    client.submit("victim", long, prompt="one")
    client.submit("bystander", GREEDY, prompt="two")
    internal_id = f"{client.channel._identity.hex()}/victim"
    bad = {"request_id": internal_id, "new_token_ids": [5], "num_cached_tokens": None}
    good = {"request_id": "nobody/nothing", "new_token_ids": [5]}

    def send_bad_output_once_running(out) -> None:
        # On the victim's first output: the tokenizer knows it and it has tokens left to make (sent
        # earlier, the bad message could reach the tokenizer before the request itself did).
        if out.request_id != "victim" or sent:
            return
        sent.append(True)
        push = zmq.Context.instance().socket(zmq.PUSH)
        push.connect(launcher.endpoints.tokenizer_output)
        push.send(b'{"type": "TokenDeltas", "body": {"outputs": [%s, %s]}}' % (
            json.dumps(good).encode(), json.dumps(bad).encode()))
        push.close(linger=1000)

    sent: list[bool] = []
    results = client.collect(["victim", "bystander"], timeout_s=60, on_output=send_bad_output_once_running)
    victim = results["victim"]
    assert victim.finish_reason == "abort" and len(victim.token_ids) < 200
    assert "invalid output" in victim.error and "outputs[1].num_cached_tokens" in victim.error
    assert results["bystander"].error is None and len(results["bystander"].token_ids) == GREEDY.max_tokens
    _wait_for_idle(client)  # the victim's abort reached the scheduler: nothing of it is held


def test_a_malformed_request_that_names_itself_is_refused_with_the_field(reference):
    launcher, client = reference
    client.channel._socket.send(b'{"type": "GenerateRequest", "body": {"request_id": "bad", '
                                b'"params": {"temperature": "hot"}, "prompt": "x"}}')
    failed = client.collect(["bad"], timeout_s=10)["bad"].failed
    assert failed is not None and failed.status == 400
    assert "invalid request" in failed.message and "params.temperature" in failed.message


def test_a_child_that_cannot_start_fails_the_launch_with_its_error(tmp_path):
    config = tiny_config()
    broken = dataclasses.replace(config, model=config.model.with_overrides(
        model_path=str(tmp_path / "missing"), load_format="safetensors"))
    launcher = _launch(broken)
    failure = r"(executor dp=0 tp=0 on cpu|tokenizer) failed to start: .*missing"
    with pytest.raises(LaunchError, match=failure):
        launcher.start()
    assert all(not c.process.is_alive() for c in launcher.children)
    assert _leftovers(launcher) == []
