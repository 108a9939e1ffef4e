"""One launched system of the generalization matrix and the native client that drives it.

`Server` starts the launcher for one EngineConfig, connects an `api.client.Client`, runs jobs
(all at once, or one after another) and waits for the pool balance after a cell: every replica
alive with nothing running or waiting, no page owned, and every page free or held only by the
prefix cache. The scheduler reports its state every 0.2 s, so a report is trusted only if the
tokenizer received it after the cell's last output arrived (its age says when).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence

from api.client import Client
from api.generation import Generation, make_request
from benchmarks.generalization.workload import Job
from core.config import EngineConfig
from core.sampling_params import SamplingParams
from ipc.messages import ReplicaInfo, ServerInfo
from procs.launch_options import LaunchOptions
from procs.launcher import Launcher

POLL_S = 0.05


class NotIdle(RuntimeError):
    """The pool did not balance after a cell; the message gives every replica's counters."""


class Server:
    def __init__(self, name: str, config: EngineConfig, options: LaunchOptions,
                 request_timeout_s: float) -> None:
        self.name = name
        self.config = config
        self.launcher = Launcher(config, options)
        self.request_timeout_s = request_timeout_s
        self.client: Client | None = None
        self.startup_s = 0.0
        self._ids = itertools.count()
        self.prompts: dict[str, list[int]] = {}  # every job's prompt by key, for score_next

    def __enter__(self) -> Server:
        started = time.perf_counter()
        self.launcher.start()
        try:
            self.client = Client(self.launcher.endpoints.tokenizer_frontend, timeout_s=self.request_timeout_s,
                                 name=f"generalization {self.name}")
        except BaseException:
            self.launcher.shutdown()
            raise
        self.startup_s = time.perf_counter() - started
        return self

    def __exit__(self, *exc: object) -> None:
        if self.client is not None:
            self.client.close()
        self.launcher.shutdown()

    # --- requests ---------------------------------------------------------------------------------

    def run(self, jobs: list[Job]) -> dict[str, Generation]:
        """Submit every job at once (one batch as far as the scheduler is concerned); results by key."""
        if len({job.key for job in jobs}) != len(jobs):
            raise ValueError(f"server {self.name}: a batch repeats a job key; give each copy its own key")
        self.prompts.update((job.key, job.prompt) for job in jobs)
        requests = [make_request(f"{job.key}#{next(self._ids)}", job.prompt, job.params) for job in jobs]
        generations = self.client.generate(requests)
        return {job.key: g for job, g in zip(jobs, generations)}

    def score_next(self, key: str, output: Sequence[int], tokens: Sequence[int]) -> dict[int, float]:
        """How many nats under the best logprob each of `tokens` lies after job `key`'s prompt (a job
        this server ran) and `output`, teacher-forced: per token one request whose prompt ends with it,
        its prompt logprobs giving the token's logprob and the position's best from one computation.
        (A server with the prefix cache on keeps these prompts' pages like any other's.)"""
        prompt = self.prompts.get(key)
        if prompt is None:
            raise KeyError(f"server {self.name} ran no job {key!r} to score")
        params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True, prompt_logprobs=1)
        jobs = [Job(f"{key}~score{token}", [*prompt, *output, token], params) for token in tokens]
        gaps: dict[int, float] = {}
        for token, job in zip(tokens, jobs):
            generation = self.run([job])[job.key]
            scored = generation.prompt_logprobs
            if not generation.ok or scored is None:
                raise RuntimeError(f"scoring {job.key} ended with {generation.error or generation.refused}")
            gaps[token] = scored.top_logprobs[-1][0].logprob - scored.logprobs[-1]
        return gaps

    def run_alone(self, jobs: list[Job]) -> dict[str, Generation]:
        """Each job by itself, the next one only after the previous one finished."""
        results: dict[str, Generation] = {}
        for job in jobs:
            results.update(self.run([job]))
        return results

    def info(self) -> ServerInfo:
        return self.client.server_info(timeout_s=10)

    def stats_now(self) -> list[ReplicaInfo]:
        """Every replica as of a report newer than this call (waits out at most one report)."""
        return self.wait_fresh(time.monotonic()).replicas

    def wait_fresh(self, since_s: float, timeout_s: float = 5.0) -> ServerInfo:
        """The first ServerInfo whose scheduler report reached the tokenizer after `since_s`."""
        deadline = time.monotonic() + timeout_s
        while True:
            sent_s = time.monotonic()
            info = self.info()
            if sent_s - info.status_age_s > since_s:
                return info
            if time.monotonic() > deadline:
                raise NotIdle(f"server {self.name}: no scheduler report newer than {timeout_s:g} s "
                              f"(the last is {info.status_age_s:.1f} s old)")
            time.sleep(POLL_S)

    def wait_idle(self, since_s: float, timeout_s: float) -> ServerInfo:
        """Wait until the pool balances (see the module docstring); NotIdle after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while True:
            info = self.wait_fresh(since_s, timeout_s)
            problems = [p for r in info.replicas if (p := _imbalance(r)) is not None]
            if not info.replicas:
                problems = ["no replica reported"]
            if not problems:
                return info
            if time.monotonic() > deadline:
                raise NotIdle(f"pool not balanced {timeout_s:g} s after the cell: " + "; ".join(problems))
            time.sleep(POLL_S)


def _imbalance(replica: ReplicaInfo) -> str | None:
    """What keeps an idle replica's pool from balancing, or None."""
    s = replica.stats
    if not replica.alive or s is None:
        return f"replica {replica.replica} is down: {replica.reason}"
    pages_ok = s.num_free_pages + s.num_cached_pages == replica.num_pages
    if s.num_running == 0 and s.num_waiting == 0 and s.kv_usage == 0 and pages_ok:
        return None
    return (f"replica {replica.replica}: {s.num_running} running, {s.num_waiting} waiting, kv_usage "
            f"{s.kv_usage:.4f}, {s.num_free_pages} free + {s.num_cached_pages} cached of "
            f"{replica.num_pages} pages")
