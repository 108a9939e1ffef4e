"""api/protocol.py, api/reasoning.py and api/responses.py: OpenAI bodies in, GenerateRequests and
response objects out, without sockets."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from api import body_fields, responses
from api.errors import ApiError
from api.protocol import (
    MAX_CHOICES,
    MAX_REQUESTS_PER_CALL,
    ServedModel,
    parse_chat_request,
    parse_completion_request,
    parse_json_body,
)
from api.reasoning import ReasoningSplitter
from core.generation_defaults import QWEN3_GENERATION_DEFAULTS
from ipc.messages import ChatTurn, TopLogprob

MODEL = ServedModel("qwen3-tiny", 4096, QWEN3_GENERATION_DEFAULTS)
CHAT = {"messages": [{"role": "user", "content": "hi"}]}
COMPLETION = {"prompt": "hi"}


def completion(**fields):
    return parse_completion_request({**COMPLETION, **fields}, MODEL, "cmpl-1")


def chat(**fields):
    return parse_chat_request({**CHAT, **fields}, MODEL, "chat-1")


# --- the table of malformed requests ----------------------------------------------------------------

# (endpoint, body, status, param, a piece of the message)
MALFORMED = [
    # the body itself
    ("completions", [1, 2], 400, None, "must be a JSON object"),
    ("completions", "prompt", 400, None, "must be a JSON object"),
    ("chat", None, 400, None, "must be a JSON object"),
    ("completions", {**COMPLETION, "foo": 1}, 400, "foo", "unrecognized request argument 'foo'"),
    ("chat", {**CHAT, "functions": []}, 400, "functions", "unrecognized request argument"),
    # model
    ("completions", {**COMPLETION, "model": "gpt-4"}, 404, "model", "'gpt-4' does not exist"),
    ("chat", {**CHAT, "model": 7}, 400, "model", "must be a string"),
    # prompt
    ("completions", {}, 400, "prompt", "'prompt' is a required field"),
    ("completions", {"prompt": ""}, 400, "prompt", "must not be empty"),
    ("completions", {"prompt": []}, 400, "prompt", "must not be an empty array"),
    ("completions", {"prompt": 12}, 400, "prompt", "got an integer 12"),
    ("completions", {"prompt": [1, -2, 3]}, 400, "prompt", "'prompt[1]' must be a non-negative integer"),
    ("completions", {"prompt": [[1, 2], []]}, 400, "prompt[1]", "must not be an empty array"),
    ("completions", {"prompt": ["a", 1]}, 400, "prompt[1]", "must be a string or an array of token ids"),
    ("completions", {"prompt": [[1], "a"]}, 400, "prompt", "mixes strings and token-id arrays"),
    ("completions", {"prompt": [[1, True]]}, 400, "prompt[0]", "'prompt[0][1]' must be a non-negative"),
    ("completions", {"prompt": ["x"] * (MAX_REQUESTS_PER_CALL + 1)}, 400, "prompt", "at most 1024"),
    # messages
    ("chat", {}, 400, "messages", "'messages' is a required field"),
    ("chat", {"messages": []}, 400, "messages", "non-empty array"),
    ("chat", {"messages": "hi"}, 400, "messages", "non-empty array"),
    ("chat", {"messages": ["hi"]}, 400, "messages[0]", "must be an object"),
    ("chat", {"messages": [{"role": "robot", "content": "x"}]}, 400, "messages[0].role", "must be one of"),
    ("chat", {"messages": [{"content": "x"}]}, 400, "messages[0].role", "must be one of"),
    ("chat", {"messages": [{"role": "user"}]}, 400, "messages[0].content", "is required on a user message"),
    ("chat", {"messages": [{"role": "user", "content": 5}]}, 400, "messages[0].content", "string or an"),
    ("chat", {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}, 400,
     "messages[0].content[0]", "only text is supported"),
    ("chat", {"messages": [{"role": "user", "content": [{"type": "text", "text": 3}]}]}, 400,
     "messages[0].content[0].text", "must be a string"),
    ("chat", {"messages": [{"role": "user", "content": "x", "mood": "happy"}]}, 400, "messages[0].mood",
     "unrecognized message field"),
    ("chat", {"messages": [{"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]}]}, 400,
     "messages[0].tool_calls[0].function", "'function': {'name'"),
    ("chat", {"messages": [{"role": "user", "content": "x", "reasoning_content": "hm"}]}, 400,
     "messages[0].reasoning_content", "on an assistant message"),
    ("chat", {"messages": [{"role": "user", "content": "x", "reasoning": "hm"}]}, 400,
     "messages[0].reasoning", "on an assistant message"),
    ("chat", {"messages": [{"role": "assistant", "content": "4", "reasoning": "2+2",
                            "reasoning_content": "3"}]},
     400, "messages[0].reasoning", "two names of one field"),
    ("completions", {**COMPLETION, "return_token_ids": "yes"}, 400, "return_token_ids", "must be a boolean"),
    ("completions", {**COMPLETION, "return_tokens_as_token_ids": 0}, 400, "return_tokens_as_token_ids",
     "must be a boolean"),
    ("chat", {"messages": [{"role": "user", "content": "x"}], "return_token_ids": 1}, 400, "return_token_ids",
     "must be a boolean"),
    # sampling fields: types
    ("completions", {**COMPLETION, "temperature": "hot"}, 400, "temperature", "number, got a string"),
    ("completions", {**COMPLETION, "temperature": True}, 400, "temperature", "must be a number"),
    ("completions", {**COMPLETION, "top_k": 2.5}, 400, "top_k", "must be an integer"),
    ("completions", {**COMPLETION, "max_tokens": "10"}, 400, "max_tokens", "must be an integer"),
    ("completions", {**COMPLETION, "seed": [1]}, 400, "seed", "must be an integer"),
    ("completions", {**COMPLETION, "ignore_eos": 1}, 400, "ignore_eos", "must be a boolean"),
    ("completions", {**COMPLETION, "stream": "yes"}, 400, "stream", "must be a boolean"),
    ("completions", {**COMPLETION, "stop": 5}, 400, "stop", "non-empty string or an array"),
    ("completions", {**COMPLETION, "stop": ["ok", ""]}, 400, "stop",
     "'stop[1]' must be a non-empty string, got a string \"\""),
    ("completions", {**COMPLETION, "stop": ["ok", None]}, 400, "stop",
     "'stop[1]' must be a non-empty string, got null"),
    ("chat", {**CHAT, "messages": []}, 400, "messages", "got an empty array"),
    ("completions", {**COMPLETION, "stop": ["s"] * 65}, 400, "stop", "at most 64"),
    ("completions", {**COMPLETION, "stop_token_ids": [1, "2"]}, 400, "stop_token_ids", "non-negative"),
    ("completions", {**COMPLETION, "user": 3}, 400, "user", "must be a string"),
    # sampling fields: ranges
    ("completions", {**COMPLETION, "max_tokens": 0}, 400, "max_tokens", "must be an integer >= 1"),
    ("chat", {**CHAT, "max_completion_tokens": -5}, 400, "max_completion_tokens", ">= 1"),
    ("completions", {**COMPLETION, "temperature": -0.1}, 400, "temperature", "must be in [0, 100]"),
    ("completions", {**COMPLETION, "top_p": 0}, 400, "top_p", "must be in (0, 1]"),
    ("completions", {**COMPLETION, "top_p": 1.5}, 400, "top_p", "must be in (0, 1]"),
    ("completions", {**COMPLETION, "top_k": -2}, 400, "top_k", "-1 or 0"),
    ("completions", {**COMPLETION, "min_p": 2}, 400, "min_p", "must be in [0, 1]"),
    ("completions", {**COMPLETION, "presence_penalty": 3}, 400, "presence_penalty", "[-2, 2]"),
    ("completions", {**COMPLETION, "frequency_penalty": -2.5}, 400, "frequency_penalty", "[-2, 2]"),
    ("completions", {**COMPLETION, "repetition_penalty": 0}, 400, "repetition_penalty", "(0, 10]"),
    ("completions", {**COMPLETION, "seed": 2**64}, 400, "seed", "64 bits"),
    ("completions", {**COMPLETION, "min_tokens": 20, "max_tokens": 10}, 400, "min_tokens", "max_tokens=10"),
    # choices
    ("completions", {**COMPLETION, "n": 0}, 400, "n", "'n' must be >= 1"),
    ("chat", {**CHAT, "n": MAX_CHOICES + 1}, 400, "n", f"<= {MAX_CHOICES}"),
    ("completions", {"prompt": ["a"] * 100, "n": 20}, 400, "n", "2000 choices"),
    ("completions", {**COMPLETION, "best_of": 3}, 400, "best_of", "must equal n"),
    # logprobs
    ("completions", {**COMPLETION, "logprobs": 21}, 400, "logprobs", "<= 20"),
    ("completions", {**COMPLETION, "logprobs": True}, 400, "logprobs", "must be an integer"),
    ("chat", {**CHAT, "logprobs": 3}, 400, "logprobs", "must be a boolean"),
    ("chat", {**CHAT, "top_logprobs": 2}, 400, "top_logprobs", "needs logprobs set to true"),
    ("chat", {**CHAT, "logprobs": True, "top_logprobs": 30}, 400, "top_logprobs", "<= 20"),
    # streaming options
    ("completions", {**COMPLETION, "stream_options": {"include_usage": True}}, 400, "stream_options",
     "only allowed when stream is true"),
    ("chat", {**CHAT, "stream": True, "stream_options": {"include_usage": "yes"}}, 400,
     "stream_options.include_usage", "must be a boolean"),
    ("chat", {**CHAT, "stream": True, "stream_options": {"verbose": True}}, 400, "stream_options.verbose",
     "unrecognized stream option"),
    ("chat", {**CHAT, "stream": True, "stream_options": [1]}, 400, "stream_options", "must be an object"),
    # chat template
    ("chat", {**CHAT, "chat_template_kwargs": {"enable_thinking": "no"}}, 400,
     "chat_template_kwargs.enable_thinking", "must be a boolean"),
    ("chat", {**CHAT, "chat_template_kwargs": {"tools_mode": 1}}, 400, "chat_template_kwargs.tools_mode",
     "unknown chat template argument"),
    ("chat", {**CHAT, "chat_template_kwargs": "thinking"}, 400, "chat_template_kwargs", "must be an object"),
    # fields this server only takes at their no-op value
    ("completions", {**COMPLETION, "prompt_logprobs": 21}, 400, "prompt_logprobs", "<= 20, got 21"),
    ("completions", {**COMPLETION, "prompt_logprobs": -1}, 400, "prompt_logprobs", ">= 0"),
    ("completions", {**COMPLETION, "max_tokens": 0}, 400, "max_tokens", ">= 1"),
    ("completions", {**COMPLETION, "suffix": "end"}, 400, "suffix", "not supported"),
    ("completions", {**COMPLETION, "truncate_prompt_tokens": 0}, 400, "truncate_prompt_tokens", "-1 or >= 1"),
    ("chat", {**CHAT, "truncate_prompt_tokens": "5"}, 400, "truncate_prompt_tokens", "must be an integer"),
    ("chat", {**CHAT, "include_stop_str_in_output": 1}, 400, "include_stop_str_in_output",
     "must be a boolean"),
    # logit_bias
    ("completions", {**COMPLETION, "logit_bias": [1, 2]}, 400, "logit_bias", "must be an object"),
    ("completions", {**COMPLETION, "logit_bias": {"a": 1}}, 400, "logit_bias", "keys must be token ids"),
    ("completions", {**COMPLETION, "logit_bias": {"-5": 1}}, 400, "logit_bias", "keys must be token ids"),
    ("completions", {**COMPLETION, "logit_bias": {"5": "1"}}, 400, "logit_bias", "must be a number"),
    ("chat", {**CHAT, "logit_bias": {"5": 101}}, 400, "logit_bias", "must be in [-100, 100], got 101"),
    ("chat", {**CHAT, "logit_bias": {str(i): 1 for i in range(1025)}}, 400, "logit_bias",
     "at most 1024 tokens"),
    ("chat", {**CHAT, "tools": [{"type": "function"}]}, 400, "tools[0].function", "must be an object"),
    ("chat", {**CHAT, "tool_choice": "required"}, 400, "tool_choice", "offers no tools"),
    ("chat", {**CHAT, "response_format": {"type": "xml"}}, 400, "response_format", "'json_schema'"),
]


@pytest.mark.parametrize(("endpoint", "body", "status", "param", "message"), MALFORMED,
                         ids=[f"{i}-{row[3]}" for i, row in enumerate(MALFORMED)])
def test_malformed_request_gets_status_param_and_message(endpoint, body, status, param, message):
    parse = parse_completion_request if endpoint == "completions" else parse_chat_request
    with pytest.raises(ApiError) as info:
        parse(body, MODEL, "id-1", strict_fields=True)
    error = info.value
    assert (error.status, error.param) == (status, param), error.message
    assert message in error.message
    assert error.to_dict() == {"error": {"message": error.message, "type": "invalid_request_error",
                                         "param": param, "code": None}}


def test_the_servers_max_logprobs_bounds_every_logprobs_field():
    wide = dataclasses.replace(MODEL, max_logprobs=100)  # cadence serve --max-logprobs 100
    assert parse_completion_request({**COMPLETION, "logprobs": 100}, wide, "c").logprobs == 100
    assert parse_completion_request({**COMPLETION, "prompt_logprobs": 100}, wide, "c").prompt_logprobs == 100
    assert parse_chat_request({**CHAT, "logprobs": True, "top_logprobs": 100}, wide, "c").logprobs == 100
    for parse, body, param in ((parse_completion_request, {**COMPLETION, "logprobs": 101}, "logprobs"),
                               (parse_chat_request, {**CHAT, "logprobs": True, "top_logprobs": 101},
                                "top_logprobs"),
                               (parse_chat_request, {**CHAT, "prompt_logprobs": 101}, "prompt_logprobs")):
        with pytest.raises(ApiError) as info:
            parse(body, wide, "c")
        assert info.value.param == param and "<= 100, got 101" in info.value.message


def test_the_table_has_at_least_forty_rows():
    assert len(MALFORMED) >= 40


UNKNOWN_FIELD_ROWS = {"foo", "functions", "stream_options.verbose"}


@pytest.mark.parametrize(("endpoint", "body", "status", "param", "message"),
                         [row for row in MALFORMED if row[3] not in UNKNOWN_FIELD_ROWS])
def test_bad_values_of_known_fields_are_refused_without_strict_fields_too(endpoint, body, status, param,
                                                                          message):
    parse = parse_completion_request if endpoint == "completions" else parse_chat_request
    with pytest.raises(ApiError) as info:
        parse(body, MODEL, "id-1")
    assert (info.value.status, info.value.param) == (status, param)


def test_unknown_fields_are_ignored_with_one_warning_per_name(caplog, monkeypatch):
    monkeypatch.setattr(body_fields, "IGNORED_FIELDS", body_fields.IgnoredFieldLog())
    # What the SGLang Model Gateway adds to every body it forwards.
    router_fields = {"no_stop_trim": False, "return_hidden_states": False, "separate_reasoning": True}
    with caplog.at_level("WARNING", logger="cadence.api"):
        parsed = completion(**router_fields, max_tokens=3)
        completion(**router_fields)
        chat(continue_final_message=False, stream=True, stream_options={"include_usage": True, "x_new": 1})
    assert parsed.requests[0].params.max_tokens == 3
    warnings = [r.getMessage() for r in caplog.records]
    # the second completion names nothing new; continue_final_message (false) is a chat field
    assert len(warnings) == 2, warnings
    assert all(f"'{name}'" in warnings[0] for name in router_fields) and "/v1/completions" in warnings[0]
    assert "'stream_options.x_new'" in warnings[1]


def test_strict_fields_refuse_what_the_router_adds():
    with pytest.raises(ApiError) as info:
        parse_completion_request({**COMPLETION, "no_stop_trim": False}, MODEL, "id-1", strict_fields=True)
    assert (info.value.status, info.value.param) == (400, "no_stop_trim")


@pytest.mark.parametrize(("raw", "message"), [
    (b"", "the request body is empty"),
    (b"   ", "the request body is empty"),
    (b'{"prompt": "hi"', "not valid JSON"),
    (b"{'prompt': 'hi'}", "not valid JSON"),
    (b'{"temperature": NaN}', "not valid JSON"),
    (b"\xff\xfe", "not valid JSON"),
])
def test_malformed_json_is_a_400_without_param(raw, message):
    with pytest.raises(ApiError) as info:
        parse_json_body(raw)
    assert (info.value.status, info.value.param) == (400, None)
    assert message in info.value.message


# --- what valid requests become -------------------------------------------------------------------


def test_left_out_fields_take_the_checkpoints_generation_defaults():
    (request,) = completion().requests
    params = request.params
    assert (params.temperature, params.top_p, params.top_k, params.min_p, params.repetition_penalty) == (
        0.6, 0.95, 20, 0.0, 1.0)
    assert (params.presence_penalty, params.frequency_penalty) == (0, 0)
    assert (params.seed, params.logprobs) == (None, None)


def test_null_counts_as_left_out():
    (request,) = completion(temperature=None, top_k=None, stop=None, n=None, seed=None).requests
    assert (request.params.temperature, request.params.top_k, request.params.stop) == (0.6, 20, ())


def test_given_fields_reach_the_sampling_params():
    parsed = completion(max_tokens=7, temperature=0, top_p=0.5, top_k=3, min_p=0.1, seed=9, stop="END",
                        stop_token_ids=[5, 6], ignore_eos=True, presence_penalty=0.5, frequency_penalty=-0.5,
                        repetition_penalty=1.2, min_tokens=2, logprobs=3, skip_special_tokens=False)
    params = parsed.requests[0].params
    assert params.max_tokens == 7 and params.temperature == 0.0 and params.is_greedy
    assert (params.top_p, params.top_k, params.min_p, params.seed) == (0.5, 3, 0.1, 9)
    assert (params.stop, params.stop_token_ids, params.ignore_eos) == (("END",), (5, 6), True)
    assert (params.presence_penalty, params.frequency_penalty, params.repetition_penalty) == (0.5, -0.5, 1.2)
    assert (params.min_tokens, params.logprobs, parsed.logprobs) == (2, 3, 3)
    assert parsed.requests[0].skip_special_tokens is False


def test_every_prompt_form_becomes_requests():
    assert completion(prompt="abc").requests[0].prompt == "abc"
    assert completion(prompt=[1, 2, 3]).requests[0].prompt_token_ids == [1, 2, 3]
    assert [r.prompt for r in completion(prompt=["a", "b"]).requests] == ["a", "b"]
    assert [r.prompt_token_ids for r in completion(prompt=[[1], [2, 3]]).requests] == [[1], [2, 3]]


def test_n_choices_per_prompt_have_ordered_ids_and_derived_seeds():
    parsed = completion(prompt=["a", "b"], n=3, seed=100)
    assert parsed.n == 3 and parsed.num_prompts == 2
    assert [r.request_id for r in parsed.requests] == [f"cmpl-1-{i}" for i in range(6)]
    assert [r.prompt for r in parsed.requests] == ["a", "a", "a", "b", "b", "b"]
    assert [r.params.seed for r in parsed.requests] == [100, 101, 102, 100, 101, 102]


def test_n_choices_without_a_seed_leave_the_seed_to_the_scheduler():
    assert [r.params.seed for r in chat(n=3).requests] == [None, None, None]


def test_derived_seeds_wrap_to_64_bits():
    seeds = [r.params.seed for r in completion(n=2, seed=2**63 - 1).requests]
    assert seeds == [2**63 - 1, -(2**63)]


def test_max_tokens_left_out_is_left_to_the_tokenizer_which_counts_the_prompt():
    # The api process counts no tokens: "up to the context" travels as None, for every prompt form.
    assert completion(prompt=[1, 2, 3]).requests[0].params.max_tokens is None
    assert completion(prompt="世界" * 3000).requests[0].params.max_tokens is None
    assert chat().requests[0].params.max_tokens is None
    assert completion(max_tokens=5).requests[0].params.max_tokens == 5


def test_min_tokens_without_max_tokens_is_checked_against_the_context_by_the_tokenizer():
    assert completion(min_tokens=100).requests[0].params.min_tokens == 100


def test_max_completion_tokens_wins_over_max_tokens():
    assert chat(max_tokens=5, max_completion_tokens=9).requests[0].params.max_tokens == 9
    assert chat(max_tokens=5, max_completion_tokens=9).max_tokens_field == "max_completion_tokens"
    assert chat(max_tokens=5).requests[0].params.max_tokens == 5
    assert chat(max_tokens=5).max_tokens_field == completion().max_tokens_field == "max_tokens"


def test_chat_messages_become_turns_with_text_parts_joined():
    parsed = chat(messages=[
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}],
         "name": "ann"},
        {"role": "assistant", "content": None},
        {"role": "assistant", "content": "4", "reasoning_content": "2+2"},
        {"role": "assistant", "content": "5", "reasoning": "2+3"},  # vLLM's name for it
        {"role": "assistant", "content": "6", "reasoning": "3+3", "reasoning_content": "3+3"},
        {"role": "tool", "content": "42", "tool_call_id": "c1"},
    ])
    assert parsed.requests[0].messages == [
        ChatTurn("system", "be brief"), ChatTurn("user", "one\ntwo"), ChatTurn("assistant", ""),
        ChatTurn("assistant", "4", reasoning_content="2+2"),
        ChatTurn("assistant", "5", reasoning_content="2+3"),
        ChatTurn("assistant", "6", reasoning_content="3+3"), ChatTurn("tool", "42")]


def test_chat_thinking_switch_and_logprobs():
    parsed = chat(chat_template_kwargs={"enable_thinking": False}, logprobs=True, top_logprobs=4, n=2)
    assert all(r.enable_thinking is False for r in parsed.requests)
    assert parsed.logprobs == 4 and parsed.requests[1].params.logprobs == 4
    assert chat(logprobs=True).logprobs == 0
    assert chat(logprobs=False).logprobs is None and chat().requests[0].enable_thinking is True


def test_stream_options_and_model_name():
    parsed = chat(stream=True, stream_options={"include_usage": True}, model="qwen3-tiny")
    assert (parsed.stream, parsed.include_usage, parsed.model, parsed.endpoint) == (True, True, "qwen3-tiny",
                                                                                   "chat")
    assert completion(stream=True).include_usage is False


def test_continuous_usage_stats_takes_include_usage_as_vllm_does():
    both = {"include_usage": True, "continuous_usage_stats": True}
    assert completion(stream=True, stream_options=both).continuous_usage is True
    assert chat(stream=True, stream_options={"continuous_usage_stats": True}).continuous_usage is False
    assert completion(stream=True, stream_options={"include_usage": True}).continuous_usage is False


def test_logit_bias_reaches_every_choices_sampling_params():
    parsed = chat(logit_bias={"151645": -100, "7": 2.5}, n=2)
    assert all(r.params.logit_bias == ((151645, -100.0), (7, 2.5)) for r in parsed.requests)
    assert completion().requests[0].params.logit_bias == ()


def test_noop_values_of_unsupported_fields_are_accepted():
    completion(echo=False, suffix=None, logit_bias={}, best_of=1, user="u1")
    chat(tools=[], tool_choice="none", response_format={"type": "text"}, parallel_tool_calls=False)


# --- reasoning split ------------------------------------------------------------------------------


def split_all(pieces):
    splitter = ReasoningSplitter()
    parts = [splitter.feed(p) for p in pieces] + [splitter.finish()]
    return "".join(p.reasoning for p in parts), "".join(p.content for p in parts)


@pytest.mark.parametrize(("text", "reasoning", "content"), [
    ("<think>\nI should greet.\n</think>\n\nHello!", "I should greet.", "Hello!"),
    ("<think>\n\n</think>\n\nHello!", "", "Hello!"),
    ("Hello! <think> is a tag", "", "Hello! <think> is a tag"),
    ("  \n<think>a\nb</think>c", "a\nb", "c"),
    ("<think>\ncut off by max_tokens", "cut off by max_tokens", ""),
    ("<thi", "", "<thi"),
    ("", "", ""),
    ("\n\nHello", "", "\n\nHello"),
    ("<think>x</think>\n\n", "x", ""),
    ("<think>a</thin", "a</thin", ""),
])
def test_reasoning_split(text, reasoning, content):
    assert split_all([text]) == (reasoning, content)
    assert split_all(list(text)) == (reasoning, content)  # one character at a time


@given(st.text(alphabet="<>/thinkab\n ", max_size=40), st.lists(st.integers(0, 40), max_size=6))
def test_streamed_split_equals_whole_split(text, cuts):
    cuts = sorted({0, len(text), *[c for c in cuts if c <= len(text)]})
    pieces = [text[a:b] for a, b in zip(cuts, cuts[1:])]
    assert split_all(pieces) == split_all([text])


# --- response objects -----------------------------------------------------------------------------


def test_usage_object():
    assert responses.usage(10, 5, 4) == {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15,
                                         "prompt_tokens_details": {"cached_tokens": 4}}


def test_completion_logprobs_offsets_continue_across_outputs():
    first = responses.completion_logprobs(["ab", "c"], [-1.0, -2.0], [[TopLogprob(1, "ab", -1.0)], []], 0)
    second = responses.completion_logprobs(["de"], [-3.0], [[]], 3)
    assert first == {"tokens": ["ab", "c"], "token_logprobs": [-1.0, -2.0],
                     "top_logprobs": [{"ab": -1.0}, {}], "text_offset": [0, 2]}
    assert responses.merge_completion_logprobs([first, second])["text_offset"] == [0, 2, 3]


def test_chat_logprobs_carry_utf8_bytes():
    entry = responses.chat_logprobs(["é"], [-0.5], [[TopLogprob(3, "é", -0.5), TopLogprob(4, "e", -2.0)]])
    assert entry == {"content": [{"token": "é", "logprob": -0.5, "bytes": [195, 169], "top_logprobs": [
        {"token": "é", "logprob": -0.5, "bytes": [195, 169]},
        {"token": "e", "logprob": -2.0, "bytes": [101]},
    ]}]}


def test_sse_framing():
    assert responses.sse({"a": 1}) == b'data: {"a":1}\n\n'
    assert responses.SSE_DONE == b"data: [DONE]\n\n"
