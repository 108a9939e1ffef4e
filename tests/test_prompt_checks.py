"""procs/prompt_checks.py: max_tokens fitted to the context from the exact prompt length, refusals
that carry their numbers, and chat turns handed to the chat template with their reasoning apart."""

from __future__ import annotations

import pytest

from core.sampling_params import SamplingParams
from core.tokenizer import load_tokenizer, render_chatml
from ipc.codec import decode, encode
from ipc.messages import ChatTurn, ContextOverflow, RequestFailed, TokenizedRequest
from procs.prompt_checks import PromptError, fit_to_context, template_message

MAX_MODEL_LEN = 512


def refusal(params: SamplingParams, num_prompt_tokens: int, prompt_field: str = "prompt") -> PromptError:
    with pytest.raises(PromptError) as caught:
        fit_to_context(params, num_prompt_tokens, MAX_MODEL_LEN, prompt_field)
    return caught.value


def test_max_tokens_left_out_is_exactly_the_room_of_a_multi_byte_prompt():
    # CJK and emoji: several UTF-8 bytes per token, so the byte count (the old estimate) is far above the
    # token count and would have left no room at all.
    tokenizer = load_tokenizer(None)
    text = "你好，世界！🙂" * 40
    num_prompt = len(tokenizer.encode(text))
    assert len(text.encode()) > MAX_MODEL_LEN > num_prompt
    left_out = SamplingParams(max_tokens=None, temperature=0.0)
    params = fit_to_context(left_out, num_prompt, MAX_MODEL_LEN, "prompt")
    assert params.max_tokens == MAX_MODEL_LEN - num_prompt
    assert params == SamplingParams(max_tokens=MAX_MODEL_LEN - num_prompt, temperature=0.0)


def test_an_explicit_max_tokens_that_fits_is_kept():
    params = SamplingParams(max_tokens=12)
    assert fit_to_context(params, MAX_MODEL_LEN - 12, MAX_MODEL_LEN, "prompt") is params


def test_a_refusal_carries_the_numbers_as_fields():
    error = refusal(SamplingParams(max_tokens=100), 450)
    assert error.field == "max_tokens"
    assert error.context == ContextOverflow(MAX_MODEL_LEN, 450, 100, 0)
    assert str(error) == ("This model's maximum context length is 512 tokens; the request has 450 prompt "
                          "tokens and asks for 100 more")


def test_a_prompt_that_fills_the_context_is_refused_on_the_prompt_field():
    asked = refusal(SamplingParams(max_tokens=1), MAX_MODEL_LEN, "messages")
    assert asked.field == "messages" and asked.context.max_tokens == 1
    left_out = refusal(SamplingParams(max_tokens=None), MAX_MODEL_LEN + 3)
    assert left_out.field == "prompt" and left_out.context == ContextOverflow(MAX_MODEL_LEN, 515, None, 0)
    assert str(left_out).endswith("the request has 515 prompt tokens, which leaves no room for output")


def test_min_tokens_beyond_the_room_is_refused_when_max_tokens_is_left_out():
    error = refusal(SamplingParams(max_tokens=None, min_tokens=20), MAX_MODEL_LEN - 10)
    assert error.field == "min_tokens" and error.context == ContextOverflow(MAX_MODEL_LEN, 502, None, 20)
    assert str(error).endswith("the request has 502 prompt tokens and asks for at least 20 more")
    fits = fit_to_context(SamplingParams(max_tokens=None, min_tokens=10), 502, MAX_MODEL_LEN, "prompt")
    assert fits.max_tokens == 10


def test_the_numbers_survive_the_wire():
    overflow = ContextOverflow(MAX_MODEL_LEN, 600, None)
    failed = RequestFailed("r1", overflow.describe(), "prompt", context=overflow)
    assert decode(encode(failed)) == failed


def test_a_scheduled_request_always_has_its_max_tokens():
    with pytest.raises(ValueError, match="max_tokens must be set"):
        TokenizedRequest("c/r1", [1, 2, 3], SamplingParams(max_tokens=None), 0.0)


def test_reasoning_content_reaches_the_template_as_its_own_field():
    turns = [ChatTurn("user", "What is 2+2?"), ChatTurn("assistant", "4", reasoning_content="Add them."),
             ChatTurn("user", "And 3+3?")]
    messages = [template_message(t) for t in turns]
    assert messages[1] == {"role": "assistant", "content": "4", "reasoning_content": "Add them."}
    assert "reasoning_content" not in messages[0]
    # An earlier turn's reasoning is dropped, as the Qwen3 template wants, and the prompt is the one the
    # reasoning inlined in <think> tags gave.
    inlined = [*messages[:1], {"role": "assistant", "content": "<think>\nAdd them.\n</think>\n\n4"},
               *messages[2:]]
    assert render_chatml(messages) == render_chatml(inlined) == (
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n"
        "<|im_start|>user\nAnd 3+3?<|im_end|>\n<|im_start|>assistant\n")


def test_reasoning_content_after_the_last_query_is_kept_in_think_tags():
    turns = [ChatTurn("user", "Weather?"),
             ChatTurn("assistant", "Let me look.", reasoning_content="Need it."), ChatTurn("tool", "sunny")]
    assert render_chatml([template_message(t) for t in turns]) == (
        "<|im_start|>user\nWeather?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nNeed it.\n</think>\n\nLet me look.<|im_end|>\n"
        "<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
