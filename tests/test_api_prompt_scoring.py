"""Parsing of the completion fields that score a prompt: `echo` with `logprobs` (and `max_tokens`
0), echo of token-id prompts, and vLLM's `prompt_logprobs`."""

from __future__ import annotations

from api.protocol import ServedModel, parse_completion_request
from core.generation_defaults import QWEN3_GENERATION_DEFAULTS

MODEL = ServedModel("qwen3-tiny", 4096, QWEN3_GENERATION_DEFAULTS)


def completion(**fields):
    return parse_completion_request({"prompt": "hi", **fields}, MODEL, "cmpl-1")


def test_echo_with_logprobs_asks_for_the_prompts_logprobs():
    parsed = completion(echo=True, logprobs=2)
    assert parsed.echo and not parsed.echo_only and parsed.prompt_logprobs is None
    assert parsed.requests[0].params.prompt_logprobs == 2 and parsed.requests[0].params.logprobs == 2
    assert completion(echo=True, logprobs=1, prompt_logprobs=4).requests[0].params.prompt_logprobs == 4
    assert completion(logprobs=1).requests[0].params.prompt_logprobs is None  # no echo: not scored


def test_echo_with_max_tokens_0_samples_one_token_the_call_drops():
    parsed = completion(echo=True, logprobs=0, max_tokens=0)
    assert parsed.echo_only and parsed.requests[0].params.max_tokens == 1
    assert parsed.requests[0].params.prompt_logprobs == 0


def test_echo_of_token_ids_asks_the_tokenizer_for_the_prompt_text():
    assert completion(prompt=[[5, 6], [7]], echo=True).requests[1].return_prompt_text is True
    assert completion(prompt="text", echo=True).requests[0].return_prompt_text is False
    assert completion(prompt=[5, 6]).requests[0].return_prompt_text is False


def test_prompt_logprobs_reach_the_sampling_params():
    parsed = completion(prompt_logprobs=3)
    assert parsed.prompt_logprobs == 3 and parsed.requests[0].params.prompt_logprobs == 3
    assert completion().requests[0].params.prompt_logprobs is None
