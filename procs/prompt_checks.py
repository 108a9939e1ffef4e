"""What the tokenizer process checks of a prompt once it is tokenized, and how a chat turn reaches
the chat template (`chat_prompt_ids`: a chat's prompt ids, for requests and tokenizer queries alike).

`fit_to_context` is the one place that knows a prompt's exact token count and max_model_len
together: it fills in a max_tokens left out (up to the context) and refuses, with the numbers as
fields (ContextOverflow), a request that does not fit. procs/tokenizer_proc.py calls it for every
request, and raises PromptError for what it refuses.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from core.sampling_params import SamplingParams
from core.tokenizer.tokenizer import Tokenizer
from ipc.messages import ChatTurn, ContextOverflow


class PromptError(ValueError):
    """A prompt the tokenizer refuses: `field` names the request field, `context` the numbers of one
    that does not fit the context."""

    def __init__(self, field_name: str, message: str, context: ContextOverflow | None = None) -> None:
        super().__init__(message)
        self.field = field_name
        self.context = context


def fit_to_context(params: SamplingParams, num_prompt_tokens: int, max_model_len: int,
                   prompt_field: str) -> SamplingParams:
    """`params` with max_tokens set, for a prompt of `num_prompt_tokens`: as asked when prompt and
    output fit max_model_len; when left out (None), all the room the prompt leaves. What does not fit
    raises PromptError with the numbers, on `prompt_field` when the prompt alone leaves no room, else
    on max_tokens (or min_tokens, when max_tokens was left out)."""
    asked = params.max_tokens
    room = max_model_len - num_prompt_tokens
    if asked is not None and asked <= room:
        return params
    if asked is None and room >= max(1, params.min_tokens):
        return replace(params, max_tokens=room)
    overflow = ContextOverflow(max_model_len, num_prompt_tokens, asked, params.min_tokens)
    if room < 1:
        field_name = prompt_field
    else:
        field_name = "max_tokens" if asked is not None else "min_tokens"
    raise PromptError(field_name, overflow.describe(), overflow)


def prompt_for_params(ids: list[int], params: SamplingParams, vocab_size: int,
                      max_model_len: int, max_logprobs: int) -> list[int]:
    """The prompt `params` make of `ids`: its last truncate_prompt_tokens (-1: max_model_len - 1, the
    most that leaves room for one token); PromptError on `logit_bias` when it names a token outside
    the model's vocabulary, and on `logprobs` / `prompt_logprobs` above the server's --max-logprobs
    (the API refuses those before; a native client's request is checked here)."""
    bad = next((token_id for token_id, _ in params.logit_bias if token_id >= vocab_size), None)
    if bad is not None:
        raise PromptError("logit_bias", f"token id {bad} is outside the model's vocabulary of {vocab_size}")
    for name in ("logprobs", "prompt_logprobs"):
        asked = getattr(params, name)
        if asked is not None and asked > max_logprobs:
            raise PromptError(name, f"{name} {asked} is more than this server allows "
                                    f"(--max-logprobs {max_logprobs})")
    keep = params.truncate_prompt_tokens
    if keep is None:
        return ids
    return ids[-(max_model_len - 1 if keep == -1 else keep):]


def template_message(turn: ChatTurn) -> dict[str, Any]:
    """A chat turn as the chat template takes it (tool calls in OpenAI's form); reasoning_content
    and tool_calls only where the client gave them. OpenAI's developer role is the system one (coding
    agents send it for reasoning models; Qwen3's template would drop it without a word)."""
    role = "system" if turn.role == "developer" else turn.role
    message: dict[str, Any] = {"role": role, "content": turn.content}
    if turn.reasoning_content is not None:
        message["reasoning_content"] = turn.reasoning_content
    if turn.tool_calls:
        message["tool_calls"] = [{"type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                                 for c in turn.tool_calls]
    return message


def chat_prompt_ids(tokenizer: Tokenizer, turns: list[ChatTurn], tools: list[dict[str, Any]] | None,
                    enable_thinking: bool, add_generation_prompt: bool,
                    continue_final_message: bool) -> list[int]:
    """A chat's prompt ids, rendered by the tokenizer's chat template; PromptError on `messages` when
    the template refuses the chat."""
    try:
        text = tokenizer.apply_chat_template([template_message(t) for t in turns], add_generation_prompt,
                                             enable_thinking, tools, continue_final_message)
    except ValueError as exc:
        raise PromptError("messages", str(exc)) from exc
    return tokenizer.encode(text)
