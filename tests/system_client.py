"""A minimal test client of the running system: a DEALER on the tokenizer's ROUTER.

It speaks ipc.messages directly, so the process tests do not depend on the API layer.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

from core.config import CacheConfig, EngineConfig, ModelConfig, ParallelConfig, SchedulerConfig
from core.sampling_params import SamplingParams
from ipc.channels import DealerChannel
from ipc.messages import (
    AbortRequest,
    GenerateRequest,
    OutputDelta,
    RequestAdmitted,
    RequestFailed,
    ServerInfo,
    ServerInfoQuery,
)

_ids = itertools.count()


def tiny_config(dp: int = 1, tp: int = 1, num_pages: int = 512, max_model_len: int = 512,
                max_num_seqs: int = 64, max_num_batched_tokens: int = 256, **cache) -> EngineConfig:
    """The qwen3-tiny preset (dummy weights, real Qwen vocabulary) on the CPU, small pools."""
    return EngineConfig(
        model=ModelConfig.from_name("qwen3-tiny"),
        parallel=ParallelConfig(tp_size=tp, dp_size=dp),
        cache=CacheConfig(num_pages=num_pages, **cache),
        scheduler=SchedulerConfig(max_model_len=max_model_len, max_num_seqs=max_num_seqs,
                                  max_num_batched_tokens=max_num_batched_tokens),
        device="cpu",
    )


@dataclass
class Result:
    request_id: str
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    num_outputs: int = 0
    finish_reason: str | None = None
    error: str | None = None
    failed: RequestFailed | None = None
    num_cached_tokens: int = 0
    finished_s: float | None = None
    admitted_after_outputs: int | None = None  # how many outputs came before its RequestAdmitted


class SystemClient:
    def __init__(self, address: str) -> None:
        self.channel = DealerChannel.connect(address, name="test client",
                                             identity=f"test-{next(_ids)}".encode())

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> SystemClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def submit(self, request_id: str, params: SamplingParams, **prompt) -> None:
        self.channel.send(GenerateRequest(request_id, params, **prompt))

    def abort(self, request_id: str) -> None:
        self.channel.send(AbortRequest(request_id))

    def info(self, timeout_s: float = 5.0, fresh: bool = True) -> ServerInfo:
        """The server's state; `fresh` waits out one scheduler report (0.2 s) so it includes
        everything that happened before the call."""
        if fresh:
            time.sleep(0.25)
        self.channel.send(ServerInfoQuery())
        while True:
            msg = self.channel.expect(timeout_s)
            if isinstance(msg, ServerInfo):
                return msg

    def collect(self, request_ids, timeout_s: float = 120.0, on_output=None) -> dict[str, Result]:
        """Wait until every request in `request_ids` finished or failed; results by id."""
        results = {rid: Result(rid) for rid in request_ids}
        open_ids = set(results)
        deadline = time.monotonic() + timeout_s
        while open_ids:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"requests {sorted(open_ids)[:5]}... did not finish in {timeout_s} s")
            msg = self.channel.expect(left)
            if isinstance(msg, RequestFailed):
                results[msg.request_id].failed = msg
                open_ids.discard(msg.request_id)
            elif isinstance(msg, RequestAdmitted):
                results[msg.request_id].admitted_after_outputs = results[msg.request_id].num_outputs
            elif isinstance(msg, OutputDelta):
                result = results[msg.request_id]
                result.text += msg.text
                result.token_ids += msg.token_ids
                result.num_outputs += 1
                result.num_cached_tokens = max(result.num_cached_tokens, msg.num_cached_tokens)
                if on_output is not None:
                    on_output(msg)
                if msg.finished:
                    result.finish_reason, result.error = msg.finish_reason, msg.error
                    result.finished_s = time.monotonic()
                    open_ids.discard(msg.request_id)
        return results

    def generate(self, prompts: dict[str, dict], params: SamplingParams, timeout_s: float = 120.0,
                 **options) -> dict[str, Result]:
        for request_id, prompt in prompts.items():
            self.submit(request_id, params, **prompt, **options)
        return self.collect(list(prompts), timeout_s)


GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
