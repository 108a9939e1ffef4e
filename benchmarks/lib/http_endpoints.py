"""The load tool's three ways into the HTTP server (`--endpoint`): each builds a request body and
reads the stream that answers it into a RequestTiming.

  openai     /v1/completions for token-id prompts, /v1/chat/completions for multi-turn turns
             (what vLLM's and SGLang's benchmarks send);
  responses  /v1/responses (OpenAI's Responses API, as Codex-style agents send it);
  messages   /v1/messages (Anthropic's Messages API, as Claude Code and the anthropic SDK send it).

The agent APIs take text: a token-id prompt goes as one user message of one word per id
(datasets.ids_as_words), so prompts that share ids still share a prefix. Every body asks for
exactly `output_len` tokens (`ignore_eos`, vLLM's extra field, which both agent APIs pass on).
"""

from __future__ import annotations

from typing import Any

import orjson

from benchmarks.lib.datasets import RequestSpec, ids_as_words

ENDPOINTS = ("openai", "responses", "messages")


def request_body(endpoint: str, spec: RequestSpec, history: list[dict] | None, common: dict[str, Any],
                 extra: dict[str, Any], text_prompts: bool) -> tuple[str, dict[str, Any]]:
    """(path, body) of one request: `common` (the model, the sampling fields) first, `extra` (the
    run's --extra-body) last, over everything."""
    body = {**common, "ignore_eos": True, "stream": True}
    if endpoint == "openai":
        body.update(max_tokens=spec.output_len, stream_options={"include_usage": True})
        if spec.prompt_token_ids is None:
            path, body["messages"] = "/v1/chat/completions", history
        else:
            ids = spec.prompt_token_ids
            path, body["prompt"] = "/v1/completions", ids_as_words(ids) if text_prompts else ids
        return path, {**body, **extra}
    messages = history if spec.prompt_token_ids is None else [
        {"role": "user", "content": ids_as_words(spec.prompt_token_ids)}]
    if endpoint == "responses":
        return "/v1/responses", {**body, "max_output_tokens": spec.output_len, "input": messages, **extra}
    if endpoint == "messages":
        return "/v1/messages", {**body, "max_tokens": spec.output_len, "messages": messages, **extra}
    raise ValueError(f"endpoint {endpoint!r} is not one of {', '.join(ENDPOINTS)}")


def read_line(endpoint: str, timing, line: bytes, now: float) -> None:
    """One line of the reply's server-sent events into `timing` (a RequestTiming)."""
    line = line.strip()
    if not line.startswith(b"data:"):
        return  # the agent APIs' `event:` lines repeat the data's type
    payload = line[5:].strip()
    if payload == b"[DONE]":
        timing.done_s = now
        return
    event = orjson.loads(payload)
    if event.get("error") is not None:
        timing.error = str(event["error"])
        return
    {"openai": _openai_chunk, "responses": _responses_event, "messages": _messages_event}[endpoint](
        timing, event, now)


def _openai_chunk(timing, chunk: dict, now: float) -> None:
    for choice in chunk.get("choices") or ():
        delta = choice.get("delta")
        text = delta.get("content") or delta.get("reasoning_content") or "" if delta else choice.get("text")
        timing.text += text or ""
        if choice.get("finish_reason") is None or text:
            timing.chunk_s.append(now)
    usage = chunk.get("usage")
    if usage:
        timing.prompt_tokens = usage["prompt_tokens"]
        timing.output_tokens = usage["completion_tokens"]
        details = usage.get("prompt_tokens_details") or {}
        timing.cached_tokens = details.get("cached_tokens") or 0


def _responses_event(timing, event: dict, now: float) -> None:
    kind = event.get("type", "")
    if kind in ("response.output_text.delta", "response.reasoning_text.delta",
                "response.function_call_arguments.delta"):
        timing.text += event.get("delta") or ""
        timing.chunk_s.append(now)
    elif kind in ("response.completed", "response.incomplete"):
        usage = event["response"].get("usage") or {}
        timing.prompt_tokens = usage.get("input_tokens", 0)
        timing.output_tokens = usage.get("output_tokens", 0)
        timing.cached_tokens = (usage.get("input_tokens_details") or {}).get("cached_tokens") or 0
        timing.done_s = now
    elif kind == "response.failed":
        error = event["response"].get("error") or {}
        timing.error = error.get("message") or "response.failed"


def _messages_event(timing, event: dict, now: float) -> None:
    kind = event.get("type", "")
    if kind == "content_block_delta":
        delta = event.get("delta") or {}
        timing.text += delta.get("text") or delta.get("thinking") or delta.get("partial_json") or ""
        timing.chunk_s.append(now)
    elif kind == "message_start":
        usage = event["message"].get("usage") or {}
        timing.cached_tokens = usage.get("cache_read_input_tokens") or 0
        timing.prompt_tokens = usage.get("input_tokens", 0) + timing.cached_tokens  # counted apart there
    elif kind == "message_delta":
        timing.output_tokens = (event.get("usage") or {}).get("output_tokens", timing.output_tokens)
    elif kind == "message_stop":
        timing.done_s = now
