"""What a request must satisfy to be queued at all: the scheduler rejects, with the reason, a request
that could never run, instead of letting it wait forever.

A request can never run when it is not new, its prompt is empty, prompt + max_tokens exceed
max_model_len, its pages (prompt + max_tokens - 1 tokens: the last sampled token never gets KV)
outnumber the whole pool, or, with chunked prefill off, its prompt is longer than one step's
token budget. Used by core/scheduling/scheduler.py's add_request.
"""

from __future__ import annotations

from core.config import SchedulerConfig
from core.scheduling.request import Request, RequestStatus


def why_never_runs(request: Request, config: SchedulerConfig, max_model_len: int, block_size: int,
                   pool_pages: int) -> str | None:
    """None if the request can run, else why not, phrased for the client."""
    params, prompt_len = request.sampling_params, request.prompt_len
    if request.status is not RequestStatus.WAITING or request.num_output_tokens:
        return f"it is not a new request (status {request.status.value})"
    if prompt_len == 0:
        return "the prompt is empty"
    if prompt_len + params.max_tokens > max_model_len:
        return (f"{prompt_len} prompt tokens + max_tokens {params.max_tokens} exceed max_model_len "
                f"{max_model_len}: shorten the prompt or lower max_tokens")
    num_pages = -(-(prompt_len + params.max_tokens - 1) // block_size)
    if num_pages > pool_pages:
        return (f"{prompt_len} prompt tokens + max_tokens {params.max_tokens} need {num_pages} KV pages "
                f"of {block_size} tokens, the pool has {pool_pages}: lower max_tokens")
    if not config.enable_chunked_prefill and prompt_len > config.max_num_batched_tokens:
        return (f"the prompt has {prompt_len} tokens, more than max_num_batched_tokens "
                f"{config.max_num_batched_tokens}, and chunked prefill is off: enable chunked "
                f"prefill or raise max_num_batched_tokens")
    return None
