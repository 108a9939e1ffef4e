"""What a request says after a step, and when it ends: the stop rule and the TokenDeltas.

The scheduler appends each sampled token to its request, asks `stop_status` whether that ends it,
and reports the token with `token_output`; a request that ends outside a step (an abort, a failed
step) reports `final_output`.
"""

from __future__ import annotations

from collections.abc import Set

from core.plan import StepResult
from core.scheduling.request import Request, RequestStatus, TokenDelta


def stop_status(request: Request, token: int, eos_token_ids: Set[int],
                max_model_len: int) -> RequestStatus | None:
    """Whether `token`, just appended, ends the request. A stop token counts only from min_tokens on
    (the sampler does not draw one before: running_table.py), but a structured output ends where its
    form lets it end: its grammar, not min_tokens, decides."""
    params = request.sampling_params
    num_output = request.num_tokens - request.prompt_len
    if num_output >= params.min_tokens or params.structured_output:
        if token in params.stop_token_ids:
            request.stop_reason = token
            return RequestStatus.FINISHED_STOPPED
        if token in eos_token_ids and not params.ignore_eos:
            return RequestStatus.FINISHED_STOPPED
    if num_output >= params.max_tokens or request.num_tokens >= max_model_len:
        return RequestStatus.FINISHED_LENGTH
    return None


def token_output(request: Request, token: int, status: RequestStatus | None, row: int,
                 result: StepResult) -> TokenDelta:
    """The output of one sampled token (row `row` of the step; `status` is what `stop_status` said),
    with logprobs when asked for; the request's first token also carries its queue time."""
    output = TokenDelta(request.request_id, [token], status is not None,
                           None if status is None else status.value, request.stop_reason,
                           num_cached_tokens=request.num_cached_tokens)
    if request.num_tokens == request.prompt_len + 1:
        output.queue_time_s = request.queue_time_s
        if request.prompt_scores is not None:
            (output.prompt_logprobs, output.prompt_ranks,
             output.prompt_top_logprobs) = request.prompt_scores.deliver()
    num_logprobs = request.sampling_params.logprobs
    if num_logprobs is not None and result.sampled_logprobs is not None:
        output.logprobs = [float(result.sampled_logprobs[row])]
        if num_logprobs > 0 and result.top_token_ids is not None and result.top_logprobs is not None:
            ids = result.top_token_ids[row, :num_logprobs].tolist()
            values = result.top_logprobs[row, :num_logprobs].tolist()
            output.top_logprobs = [list(zip(ids, values))]
    return output


def final_output(request: Request) -> TokenDelta:
    """The last output of a request that ended outside a step: no token, its reason and error."""
    return TokenDelta(request.request_id, [], True, request.finish_reason, request.stop_reason,
                         num_cached_tokens=request.num_cached_tokens, error=request.error)
