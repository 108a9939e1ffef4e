"""One replica in one process, for the tests: scheduler, runner and the loop that joins them.

    step = schedule -> execute -> update

The multiprocess system drives the same Scheduler and ModelRunner with the plan crossing shared
memory in between; here they meet in one loop, so a test can check greedy outputs against batching,
chunking, preemption and the prefix cache without processes. Users generate offline through
api/offline.py (`LLM`), which runs the real processes.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from core.config import EngineConfig
from core.execution.runner import ModelRunner
from core.plan import StepPlan, StepResult
from core.sampling_params import SamplingParams
from core.scheduling.request import Request, TokenDelta
from core.scheduling.scheduler import Scheduler


@dataclass
class FinishedRequest:
    """Everything one request produced, assembled from its outputs."""

    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    num_cached_tokens: int = 0
    error: str | None = None
    logprobs: list[float] | None = None
    prompt_logprobs: list[float | None] | None = None
    prompt_ranks: list[int | None] | None = None
    prompt_top_logprobs: list[list[tuple[int, float]]] | None = None


class Engine:
    def __init__(self, config: EngineConfig, runner: ModelRunner | None = None) -> None:
        self.config = config
        self.runner = runner or ModelRunner(config)
        model = config.model
        eos = model.generation.eos_token_ids
        if not eos and model.eos_token_id is not None:
            eos = (model.eos_token_id,)
        self.scheduler = Scheduler(config.scheduler, config.cache, self.runner.num_pages,
                                   config.max_model_len, eos_token_ids=tuple(eos), seed=config.seed)
        self._ids = itertools.count()

    def add_request(self, prompt_token_ids: list[int], params: SamplingParams,
                    request_id: str | None = None) -> str:
        """Queue a request; raises RequestRejectedError when it can never run."""
        request_id = request_id or f"req-{next(self._ids)}"
        self.scheduler.add_request(Request(request_id, list(prompt_token_ids), params))
        return request_id

    def abort(self, request_id: str) -> bool:
        return self.scheduler.abort_request(request_id)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def step(self) -> list[TokenDelta]:
        plan = self.scheduler.schedule()
        if plan is None:
            return self.scheduler.drain_outputs()
        return self.scheduler.update(plan, self._execute(plan))

    def _execute(self, plan: StepPlan) -> StepResult:
        try:
            return self.runner.execute(plan)
        except Exception as exc:  # the step's requests fail with the message; the engine lives on
            return StepResult(step_id=plan.step_id, replica=plan.replica,
                              sampled_token_ids=np.zeros(plan.num_reqs, np.int32),
                              error=f"step {plan.step_id} failed: {type(exc).__name__}: {exc}")

    def generate(self, prompts: Iterable[list[int]], params: SamplingParams | list[SamplingParams],
                 max_steps: int = 1_000_000) -> list[FinishedRequest]:
        """Run `prompts` to completion, all at once; results in the prompts' order."""
        prompts = [list(p) for p in prompts]
        all_params = params if isinstance(params, list) else [params] * len(prompts)
        completions = {}
        for prompt, p in zip(prompts, all_params):
            request_id = self.add_request(prompt, p)
            completions[request_id] = FinishedRequest(request_id, prompt)
        for _ in range(max_steps):
            if not self.has_unfinished():
                break
            for out in self.step():
                self._collect(completions[out.request_id], out)
        else:
            raise RuntimeError(f"generation did not finish within {max_steps} steps")
        for out in self.scheduler.drain_outputs():
            self._collect(completions[out.request_id], out)
        return list(completions.values())

    @staticmethod
    def _collect(completion: FinishedRequest, out: TokenDelta) -> None:
        completion.token_ids.extend(out.new_token_ids)
        if out.logprobs is not None:
            completion.logprobs = (completion.logprobs or []) + list(out.logprobs)
        if out.prompt_logprobs is not None:
            completion.prompt_logprobs = out.prompt_logprobs
            completion.prompt_ranks = out.prompt_ranks
            completion.prompt_top_logprobs = out.prompt_top_logprobs
        if out.finished:
            completion.finish_reason = out.finish_reason
            completion.error = out.error
        completion.num_cached_tokens = max(completion.num_cached_tokens, out.num_cached_tokens)
