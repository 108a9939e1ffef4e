"""OpenAI response objects, as plain dicts ready for orjson: pure functions, no I/O.

The response half of the wire format whose request half is api/protocol.py: completion and
chat.completion objects, their streamed chunks and SSE framing, usage, and logprobs in each
endpoint's shape. api/openai_serving.py fills them from OutputDeltas.

Shapes (OpenAI's, plus vLLM's `stop_reason`, and the reasoning as `reasoning` and `reasoning_content`):
* completion choice: {index, text, logprobs, finish_reason, stop_reason}; its logprobs are
  {tokens, token_logprobs, top_logprobs: [{token: logprob}], text_offset}.
* chat choice: {index, message: {role, content, reasoning, reasoning_content}, logprobs, finish_reason,
  stop_reason}; a chunk's choice has `delta` instead of `message`; logprobs are
  {content: [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]}.
* usage: {prompt_tokens, completion_tokens, total_tokens, prompt_tokens_details: {cached_tokens}}.
* SSE: every event is `data: <json>\\n\\n`, the stream ends with `data: [DONE]\\n\\n`; with
  stream_options.include_usage every chunk has "usage": null and a last chunk carries the usage
  with no choices.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from ipc.messages import PromptTokenLogprobs, TopLogprob

SSE_DONE = b"data: [DONE]\n\n"


def sse(event: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(event) + b"\n\n"


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


# --- logprobs -------------------------------------------------------------------------------------


def completion_logprobs(tokens: Sequence[str], logprobs: Sequence[float | None],
                        top_logprobs: Sequence[Sequence[TopLogprob]], text_offset: int) -> dict[str, Any]:
    """Completions' logprobs for consecutive tokens, the first at `text_offset` in the choice's text."""
    offsets = []
    for token in tokens:
        offsets.append(text_offset)
        text_offset += len(token)
    return {
        "tokens": list(tokens),
        "token_logprobs": list(logprobs),
        "top_logprobs": [{t.token: t.logprob for t in top} for top in top_logprobs],
        "text_offset": offsets,
    }


def echoed_prompt_logprobs(prompt: PromptTokenLogprobs) -> dict[str, Any]:
    """Completions' logprobs of an echoed prompt, from offset 0: the first token's logprob and top
    are null; each other's top holds the prompt token itself and the top N, as in vLLM."""
    top: list[dict[str, float] | None] = [None]
    for token, logprob, entries in zip(prompt.tokens[1:], prompt.logprobs[1:], prompt.top_logprobs[1:]):
        top.append({**{t.token: t.logprob for t in entries}, token: logprob})
    part = completion_logprobs(prompt.tokens, prompt.logprobs, [], 0)
    part["top_logprobs"] = top
    return part


def prompt_logprobs_entries(prompt: PromptTokenLogprobs, prompt_ids: Sequence[int]
                            ) -> list[dict[str, dict[str, Any]] | None]:
    """vLLM's `prompt_logprobs`: null for the first token, then per token a map of token id ->
    {logprob, rank, decoded_token}: the prompt token's own, and the top N (ranks 1..N)."""
    entries: list[dict[str, dict[str, Any]] | None] = [None]
    for p in range(1, len(prompt.logprobs)):
        entry = {str(t.token_id): {"logprob": t.logprob, "rank": rank, "decoded_token": t.token}
                 for rank, t in enumerate(prompt.top_logprobs[p], start=1)}
        entry[str(prompt_ids[p])] = {"logprob": prompt.logprobs[p], "rank": prompt.ranks[p],
                                     "decoded_token": prompt.tokens[p]}
        entries.append(entry)
    return entries


def merge_completion_logprobs(parts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    return {key: [v for part in parts for v in part[key]]
            for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset")}


def chat_logprobs(tokens: Sequence[str], logprobs: Sequence[float],
                  top_logprobs: Sequence[Sequence[TopLogprob]]) -> dict[str, Any]:
    def entry(token: str, logprob: float) -> dict[str, Any]:
        return {"token": token, "logprob": logprob, "bytes": list(token.encode())}

    return {"content": [
        {**entry(token, logprob), "top_logprobs": [entry(t.token, t.logprob) for t in top]}
        for token, logprob, top in zip(tokens, logprobs, top_logprobs)
    ]}


# --- /v1/completions ------------------------------------------------------------------------------


def completion_choice(index: int, text: str, finish_reason: str | None, stop_reason: str | int | None,
                      logprobs: dict[str, Any] | None) -> dict[str, Any]:
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason,
            "stop_reason": stop_reason}


def completion(call_id: str, created: int, model: str, choices: list[dict[str, Any]],
               usage_: dict[str, Any]) -> dict[str, Any]:
    return {"id": call_id, "object": "text_completion", "created": created, "model": model,
            "choices": choices, "usage": usage_}


def completion_chunk(call_id: str, created: int, model: str, choices: list[dict[str, Any]],
                     include_usage: bool, usage_: dict[str, Any] | None = None) -> dict[str, Any]:
    chunk = {"id": call_id, "object": "text_completion", "created": created, "model": model,
             "choices": choices}
    if include_usage:
        chunk["usage"] = usage_
    return chunk


# --- /v1/chat/completions -------------------------------------------------------------------------


def reasoning_fields(reasoning: str | None) -> dict[str, str | None]:
    """The reasoning under both names clients read: `reasoning` (vLLM's since 0.11, whose
    `bench serve` times a thinking reply's first chunk by it) and `reasoning_content` (SGLang's,
    DeepSeek's, and vLLM's before)."""
    return {"reasoning": reasoning, "reasoning_content": reasoning}


def chat_message(content: str, reasoning_content: str | None,
                 tool_calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """An assistant message; with tool calls, content is null when the reply said nothing else."""
    if not tool_calls:
        return {"role": "assistant", "content": content, **reasoning_fields(reasoning_content)}
    return {"role": "assistant", "content": content or None, **reasoning_fields(reasoning_content),
            "tool_calls": [{k: v for k, v in call.items() if k != "index"} for call in tool_calls]}


def chat_choice(index: int, message: dict[str, Any], finish_reason: str | None,
                stop_reason: str | int | None, logprobs: dict[str, Any] | None) -> dict[str, Any]:
    return {"index": index, "message": message, "logprobs": logprobs, "finish_reason": finish_reason,
            "stop_reason": stop_reason}


def chat_completion(call_id: str, created: int, model: str, choices: list[dict[str, Any]],
                    usage_: dict[str, Any]) -> dict[str, Any]:
    return {"id": call_id, "object": "chat.completion", "created": created, "model": model,
            "choices": choices, "usage": usage_}


def chat_delta_choice(index: int, delta: dict[str, Any], finish_reason: str | None = None,
                      stop_reason: str | int | None = None,
                      logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason,
            "stop_reason": stop_reason}


def chat_chunk(call_id: str, created: int, model: str, choices: list[dict[str, Any]],
               include_usage: bool, usage_: dict[str, Any] | None = None) -> dict[str, Any]:
    chunk = {"id": call_id, "object": "chat.completion.chunk", "created": created, "model": model,
             "choices": choices}
    if include_usage:
        chunk["usage"] = usage_
    return chunk
