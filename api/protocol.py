"""OpenAI request bodies -> GenerateRequests: parsing and validation, pure functions, no I/O.

api/server.py reads a body and calls `parse_completion_request` (POST /v1/completions) or
`parse_chat_request` (POST /v1/chat/completions). Either returns a `ParsedRequest` holding one
GenerateRequest per choice, or raises `ApiError` naming the offending field (`param`) with the
status OpenAI clients expect: 400 for a malformed, mistyped or out-of-range field, 404 for a model
this server does not serve, 413 for a body over the limit. The response half of the wire format
(completion objects, chunks, usage, logprobs) lives in api/responses.py.

Choices of this server, where OpenAI and vLLM leave room:

* A field given as `null` counts as left out. Fields left out take the checkpoint's generation
  defaults (temperature, top_p, top_k, min_p, repetition_penalty), as vLLM does.
* Unknown fields are ignored with one warning per field name, as vLLM does: routers and SDKs add
  fields of their own (the SGLang gateway's `no_stop_trim`). With
  `strict_fields` (`--strict-request-fields`) they are refused (400, `param` = the field), so a typo
  never silently changes nothing. Bad values of known fields are refused either way. A few OpenAI
  fields this server cannot honour are accepted only at their no-op value (`suffix` "").
* `tools` (function calling; api/tool_fields.py): offered to the model through the chat template,
  and the reply's calls come back as `tool_calls` with finish_reason "tool_calls". `tool_choice`
  "auto" and "none" are honoured, and so are "required" and a named function, by constrained
  decoding.
* `response_format` (`json_object`, `json_schema`) and vLLM's `guided_json` / `guided_choice`
  constrain the output (api/structured_fields.py).
* `echo` (completions) puts the prompt before each choice's text (a token-id prompt as the
  tokenizer process decodes it); with `logprobs` the choice's logprobs start with the prompt's
  tokens, the first one's logprob null, as in vLLM. `max_tokens` 0 is allowed with echo (scoring a
  prompt, as evaluation harnesses do): the choice is the prompt alone. The request then runs with
  max_tokens 1 and the API drops the token it samples.
* `prompt_logprobs` (vLLM's): each completion choice carries `prompt_logprobs` (a chat completion,
  not streamed, once beside its choices): null for the first prompt token, then per token a map of
  token id -> {logprob, rank, decoded_token}: the prompt token's own and the top
  `prompt_logprobs` ones.
* `stream_options.continuous_usage_stats` (vLLM's): every chunk carries the usage so far.
* `max_tokens` left out means "up to the context length": max_model_len minus the prompt. The api
  process neither tokenizes nor renders chats, so the request goes out with max_tokens None and the
  tokenizer process, which counts the prompt's tokens, fills in the exact room (or refuses a prompt
  that leaves none, with the numbers as fields: see api/openai_serving.py).
* A chat goes out as its messages (ChatTurn: role, content, an assistant's reasoning_content); the
  tokenizer process renders it with the chat template.
* `n` is at most MAX_CHOICES, and one call makes at most MAX_REQUESTS_PER_CALL requests
  (prompts x n). With a seed, choice i is sampled with seed + i (wrapped to 64 bits) so the n
  choices differ and a repeated call repeats them; without one, the scheduler draws a seed per choice.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import orjson

from api.body_fields import (
    BodyFields,
    all_ints,
    check_unknown,
    describe,
    first_bad_token_id,
    require_noop,
)
from api.chat_messages import (
    continued_answer,
    parse_continue_final_message,
    parse_messages,
    parse_template_kwargs,
)
from api.errors import ApiError, invalid
from api.sampling_fields import SAMPLING_FIELDS, sampling_params
from api.structured_fields import STRUCTURED_FIELDS, parse_structured_output
from api.tool_fields import ToolSettings, parse_tool_fields
from core.generation_defaults import GenerationDefaults
from core.sampling_params import DEFAULT_MAX_LOGPROBS, SamplingParams
from ipc.messages import GenerateRequest

MAX_CHOICES = 64
MAX_REQUESTS_PER_CALL = 1024

_COMMON_FIELDS = frozenset({
    "model", "n", "logprobs", "user", "stream", "stream_options", "skip_special_tokens", "return_token_ids",
    "return_tokens_as_token_ids", *SAMPLING_FIELDS, *STRUCTURED_FIELDS,
})
COMPLETION_FIELDS = _COMMON_FIELDS | {"prompt", "echo", "suffix", "best_of", "prompt_logprobs"}
CHAT_FIELDS = _COMMON_FIELDS | {
    "messages", "max_completion_tokens", "top_logprobs", "chat_template_kwargs",
    "add_generation_prompt", "continue_final_message", "tools", "tool_choice", "parallel_tool_calls",
    "prompt_logprobs",
}


@dataclass(frozen=True)
class ServedModel:
    """What the protocol needs to know about the model behind the API."""

    name: str  # the served model name: requests must name it or leave `model` out
    max_model_len: int  # prompt + output tokens
    defaults: GenerationDefaults  # what a request that leaves a sampling field out gets
    max_logprobs: int = DEFAULT_MAX_LOGPROBS  # the most top logprobs a request may ask for

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("ServedModel.name must not be empty")
        if self.max_model_len < 2:
            raise ValueError(f"ServedModel.max_model_len must be >= 2, got {self.max_model_len}")


@dataclass(frozen=True)
class ParsedRequest:
    """A validated call: choice i of the response is requests[i]."""

    endpoint: str  # "completions" or "chat"
    model: str
    requests: tuple[GenerateRequest, ...]  # prompt p's choices are p*n .. p*n+n-1
    n: int
    stream: bool
    include_usage: bool  # stream_options.include_usage: a last chunk with usage
    continuous_usage: bool  # stream_options.continuous_usage_stats: the usage so far in every chunk
    logprobs: int | None  # None: no logprobs; k: the sampled token's and the top k
    max_tokens_field: str  # how the client named max_tokens: "max_tokens" or "max_completion_tokens"
    echo: bool = False  # completions: each choice's text starts with its prompt
    echo_only: bool = False  # completions: echo with max_tokens 0: the sampled token is dropped
    prompt_logprobs: int | None = None  # the body's prompt_logprobs (vLLM's)
    tools: ToolSettings = ToolSettings(None, True)  # chat: the functions offered; calls parsed if any
    # vLLM's return_token_ids: the prompt's and the output's token ids beside the text
    return_token_ids: bool = False
    tokens_as_ids: bool = False  # vLLM's return_tokens_as_token_ids: logprobs' tokens as "token_id:<id>"

    @property
    def num_prompts(self) -> int:
        return len(self.requests) // self.n


def parse_json_body(raw: bytes) -> Any:
    """The decoded JSON body, or a 400 saying why it is not JSON."""
    if not raw.strip():
        raise invalid(None, "the request body is empty; send a JSON object")
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise invalid(None, f"the request body is not valid JSON: {e}") from None


def parse_completion_request(body: Any, model: ServedModel, request_id: str, *,
                             strict_fields: bool = False) -> ParsedRequest:
    """A /v1/completions body -> one GenerateRequest per (prompt, choice). `strict_fields` refuses
    fields this server does not know instead of ignoring them."""
    fields = BodyFields(body, COMPLETION_FIELDS, "/v1/completions", strict=strict_fields)
    model_name = _check_model(fields, model)
    prompts = _parse_prompts(fields)
    echo = fields.bool("echo", False)
    require_noop(fields, "suffix", ("",), "suffix is not supported")
    logprobs = fields.int("logprobs", 0, model.max_logprobs)
    prompt_logprobs = fields.int("prompt_logprobs", 0, model.max_logprobs)
    scored = [k for k in (prompt_logprobs, logprobs if echo else None) if k is not None]
    n = _parse_n(fields, len(prompts))
    best_of = fields.int("best_of", 1, MAX_CHOICES)
    if best_of is not None and best_of != n:
        raise invalid("best_of", f"best_of must equal n ({n}) when given (choices are not ranked), "
                      f"got {best_of}")
    max_tokens = fields.int("max_tokens", None, None)
    echo_only = echo and max_tokens == 0
    stream, include_usage, continuous_usage = _parse_stream(fields, "/v1/completions", strict_fields)
    skip_special = fields.bool("skip_special_tokens", True)
    return_token_ids = fields.bool("return_token_ids", False)
    tokens_as_ids = fields.bool("return_tokens_as_token_ids", False)
    params = sampling_params(fields, model.defaults, 1 if echo_only else max_tokens, "max_tokens", logprobs,
                             "logprobs", max(scored) if scored else None,
                             parse_structured_output(fields, reasoning=False))
    requests = []
    for p, prompt in enumerate(prompts):
        for i in range(n):
            requests.append(GenerateRequest(
                request_id=f"{request_id}-{p * n + i}",
                params=_choice_params(params, i),
                prompt=prompt if isinstance(prompt, str) else None,
                prompt_token_ids=prompt if isinstance(prompt, list) else None,
                stream=True,
                skip_special_tokens=skip_special,
                return_prompt_text=echo and isinstance(prompt, list),
                # the echoed prompt's logprobs name its tokens by these ids with tokens_as_ids
                return_prompt_token_ids=bool(scored) or return_token_ids,
                notify_admitted=stream,
            ))
    return ParsedRequest("completions", model_name, tuple(requests), n, stream, include_usage,
                         continuous_usage, logprobs, "max_tokens", echo, echo_only, prompt_logprobs,
                         return_token_ids=return_token_ids, tokens_as_ids=tokens_as_ids)


def parse_chat_request(body: Any, model: ServedModel, request_id: str, *,
                       strict_fields: bool = False) -> ParsedRequest:
    """A /v1/chat/completions body -> n GenerateRequests of one chat. `strict_fields` refuses
    fields this server does not know instead of ignoring them."""
    fields = BodyFields(body, CHAT_FIELDS, "/v1/chat/completions", strict=strict_fields)
    model_name = _check_model(fields, model)
    messages = parse_messages(fields.get("messages", required=True))
    enable_thinking = parse_template_kwargs(fields)
    add_generation_prompt = fields.bool("add_generation_prompt", True)
    continue_final = parse_continue_final_message(fields, messages, add_generation_prompt)
    tool_settings = parse_tool_fields(fields)
    # A continued final message has its reasoning block closed already: the form applies to its answer.
    structured_output = parse_structured_output(
        fields, reasoning=enable_thinking and not continue_final, tools=tool_settings,
        written=continued_answer(messages[-1]) if continue_final else "")
    want_logprobs = fields.bool("logprobs", False)
    top_logprobs = fields.int("top_logprobs", 0, model.max_logprobs)
    if top_logprobs and not want_logprobs:
        raise invalid("top_logprobs", "top_logprobs needs logprobs set to true")
    logprobs = (top_logprobs or 0) if want_logprobs else None
    n = _parse_n(fields, 1)
    # max_completion_tokens is OpenAI's newer name; it wins when both are given.
    max_completion_tokens = fields.int("max_completion_tokens", None, None)
    max_field = "max_tokens" if max_completion_tokens is None else "max_completion_tokens"
    max_tokens = max_completion_tokens
    if max_tokens is None:
        max_tokens = fields.int("max_tokens", None, None)
    stream, include_usage, continuous_usage = _parse_stream(fields, "/v1/chat/completions", strict_fields)
    prompt_logprobs = fields.int("prompt_logprobs", 0, model.max_logprobs)
    if prompt_logprobs is not None and stream:
        raise invalid("prompt_logprobs", "prompt_logprobs is not supported with stream true on chat "
                      "completions (the response carries them once, beside its choices)")
    skip_special = fields.bool("skip_special_tokens", True)
    return_token_ids = fields.bool("return_token_ids", False)
    tokens_as_ids = fields.bool("return_tokens_as_token_ids", False)
    logprobs_field = "top_logprobs" if top_logprobs else "logprobs"
    params = sampling_params(fields, model.defaults, max_tokens, max_field, logprobs, logprobs_field,
                             prompt_logprobs, structured_output)
    requests = tuple(
        GenerateRequest(
            request_id=f"{request_id}-{i}",
            params=_choice_params(params, i),
            messages=list(messages),
            tools=tool_settings.tools,
            enable_thinking=enable_thinking,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final,
            stream=True,
            skip_special_tokens=skip_special,
            return_prompt_token_ids=prompt_logprobs is not None or return_token_ids,
            notify_admitted=stream,
        )
        for i in range(n)
    )
    return ParsedRequest("chat", model_name, requests, n, stream, include_usage, continuous_usage, logprobs,
                         max_field, prompt_logprobs=prompt_logprobs, tools=tool_settings,
                         return_token_ids=return_token_ids, tokens_as_ids=tokens_as_ids)


# --- parts of a request ---------------------------------------------------------------------------


def _check_model(fields: BodyFields, model: ServedModel) -> str:
    """The served model's name, after the checks every endpoint shares."""
    name = fields.str("model")
    if name is not None and name != model.name:
        raise ApiError(404, f"the model {name!r} does not exist; this server serves {model.name!r}", "model")
    fields.str("user")  # accepted for OpenAI compatibility; not used
    return model.name


def _parse_n(fields: BodyFields, num_prompts: int) -> int:
    n = fields.int("n", 1, MAX_CHOICES, default=1)
    assert n is not None
    if n * num_prompts > MAX_REQUESTS_PER_CALL:
        raise invalid("n", f"{num_prompts} prompt(s) x n={n} makes {n * num_prompts} choices; one call may "
                      f"ask for at most {MAX_REQUESTS_PER_CALL}")
    return n


def _parse_stream(fields: BodyFields, endpoint: str, strict: bool) -> tuple[bool, bool, bool]:
    """stream, stream_options.include_usage, stream_options.continuous_usage_stats."""
    stream = fields.bool("stream", False)
    options = fields.get("stream_options")
    if options is None:
        return stream, False, False
    if not stream:
        raise invalid("stream_options", "stream_options is only allowed when stream is true")
    if not isinstance(options, dict):
        raise invalid("stream_options", f"'stream_options' must be an object, got {describe(options)}")
    check_unknown(set(options) - {"include_usage", "continuous_usage_stats"}, endpoint, strict,
                  "stream option", "stream_options.")
    include_usage, continuous = (_stream_option(options, name) for name in ("include_usage",
                                                                            "continuous_usage_stats"))
    return stream, include_usage, include_usage and continuous  # as vLLM: per-chunk usage needs both


def _stream_option(options: dict[str, Any], name: str) -> bool:
    value = options.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise invalid(f"stream_options.{name}",
                      f"'stream_options.{name}' must be a boolean, got {describe(value)}")
    return value


def _parse_prompts(fields: BodyFields) -> list[str | list[int]]:
    """The completions `prompt`: a string, strings, token ids, or lists of token ids."""
    value = fields.get("prompt", required=True)
    if isinstance(value, str):
        prompts: list[Any] = [value]
    elif isinstance(value, list) and value and all_ints(value):
        prompts = [value]
    elif isinstance(value, list) and value:
        prompts = value
    elif isinstance(value, list):
        raise invalid("prompt", "'prompt' must not be an empty array")
    else:
        raise invalid("prompt", "'prompt' must be a string, an array of strings, an array of token ids or an "
                      f"array of token-id arrays, got {describe(value)}")
    if len(prompts) > MAX_REQUESTS_PER_CALL:
        raise invalid("prompt", f"'prompt' has {len(prompts)} prompts; one call may carry at most "
                      f"{MAX_REQUESTS_PER_CALL}")
    for i, prompt in enumerate(prompts):
        where = "prompt" if prompts[0] is value else f"prompt[{i}]"
        if isinstance(prompt, str):
            if not prompt:
                raise invalid(where, f"'{where}' must not be empty")
        elif isinstance(prompt, list):
            if not prompt:
                raise invalid(where, f"'{where}' must not be an empty array of token ids")
            bad = first_bad_token_id(prompt)
            if bad is not None:
                raise invalid(where, f"'{where}[{bad}]' must be a non-negative integer token id, got "
                              f"{describe(prompt[bad])}")
        else:
            raise invalid(where, f"'{where}' must be a string or an array of token ids, "
                          f"got {describe(prompt)}")
    kinds = {type(p) for p in prompts}
    if len(kinds) > 1:
        raise invalid("prompt", "'prompt' mixes strings and token-id arrays; send one kind per call")
    return prompts


def _choice_params(params: SamplingParams, choice: int) -> SamplingParams:
    if params.seed is None or choice == 0:
        return params
    wrapped = (params.seed + choice + 2**63) % 2**64 - 2**63
    return replace(params, seed=wrapped)
