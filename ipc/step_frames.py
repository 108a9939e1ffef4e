"""A StepResult on the wire: a small StepDone envelope plus its arrays as raw frames, no copies.

frames: sampled token ids (int32 [B]); with logprobs also sampled logprobs (float32 [B]), top ids
(int32 [B, N]) and top logprobs (float32 [B, N]); then, when the step scored prompt tokens, their
starts per request (int32 [B + 1]), logprobs (float32 [P]), ranks (int32 [P]), top ids
(int32 [P, M]) and top logprobs (float32 [P, M]).
"""

from __future__ import annotations

import numpy as np

from core.plan import StepResult
from ipc.messages import StepDone


def result_to_frames(result: StepResult, rank: int) -> tuple[StepDone, list[memoryview]]:
    frames = [memoryview(np.ascontiguousarray(result.sampled_token_ids, np.int32))]
    has_logprobs = result.sampled_logprobs is not None
    num_top = 0
    if has_logprobs:
        top_ids, top_logprobs = result.top_token_ids, result.top_logprobs
        if top_ids is None or top_logprobs is None:
            top_ids = np.zeros((len(result.sampled_token_ids), 0), np.int32)
            top_logprobs = np.zeros((len(result.sampled_token_ids), 0), np.float32)
        num_top = top_ids.shape[1]
        frames += [memoryview(np.ascontiguousarray(a, dt)) for a, dt in (
            (result.sampled_logprobs, np.float32), (top_ids, np.int32), (top_logprobs, np.float32))]
    has_prompt = result.prompt_logprob_start is not None
    num_prompt_top = 0
    if has_prompt:
        num_prompt_top = result.prompt_top_ids.shape[1]
        frames += [memoryview(np.ascontiguousarray(a, dt)) for a, dt in (
            (result.prompt_logprob_start, np.int32), (result.prompt_logprobs, np.float32),
            (result.prompt_ranks, np.int32),
            (result.prompt_top_ids, np.int32), (result.prompt_top_logprobs, np.float32))]
    done = StepDone(replica=result.replica, rank=rank, step_id=result.step_id, error=result.error,
                    has_logprobs=has_logprobs, num_top=num_top, has_prompt_logprobs=has_prompt,
                    num_prompt_top=num_prompt_top, timings_ms=dict(result.timings_ms))
    return done, frames


def result_from_frames(done: StepDone, frames: tuple[memoryview, ...], num_reqs: int) -> StepResult:
    """Rebuild the StepResult; raises ValueError when the frames do not match the plan's B."""
    expected = (4 if done.has_logprobs else 1) + (5 if done.has_prompt_logprobs else 0)
    if done.error is not None and not frames:
        return StepResult(step_id=done.step_id, replica=done.replica,
                          sampled_token_ids=np.zeros(num_reqs, np.int32), error=done.error)
    if len(frames) != expected:
        raise ValueError(f"step {done.step_id} of replica {done.replica}: {len(frames)} frames, "
                         f"expected {expected}")
    sampled = np.frombuffer(frames[0], np.int32)
    if len(sampled) != num_reqs:
        raise ValueError(f"step {done.step_id} of replica {done.replica}: {len(sampled)} sampled ids "
                         f"for a plan of {num_reqs} requests")
    extra = {}
    if done.has_logprobs:
        extra = dict(
            sampled_logprobs=np.frombuffer(frames[1], np.float32),
            top_token_ids=np.frombuffer(frames[2], np.int32).reshape(num_reqs, done.num_top),
            top_logprobs=np.frombuffer(frames[3], np.float32).reshape(num_reqs, done.num_top),
        )
    if done.has_prompt_logprobs:
        start, logprobs, ranks, top_ids, top_logprobs = frames[-5:]
        scored = np.frombuffer(logprobs, np.float32)
        num_scored = len(scored)
        extra.update(
            prompt_logprob_start=np.frombuffer(start, np.int32), prompt_logprobs=scored,
            prompt_ranks=np.frombuffer(ranks, np.int32),
            prompt_top_ids=np.frombuffer(top_ids, np.int32).reshape(num_scored, done.num_prompt_top),
            prompt_top_logprobs=np.frombuffer(top_logprobs, np.float32).reshape(num_scored,
                                                                                 done.num_prompt_top),
        )
    return StepResult(step_id=done.step_id, replica=done.replica, sampled_token_ids=sampled,
                      error=done.error, timings_ms=dict(done.timings_ms), **extra)
