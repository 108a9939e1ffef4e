"""Function calling: tools offered through the chat template, `<tool_call>` blocks parsed out of the
reply (api/tool_call_parser.py), the request fields checked (api/tool_fields.py), and the whole
path through the official openai client, whole and streamed."""

from __future__ import annotations

import json

import pytest
from api_fake_tokenizer import FakeTokenizer
from api_http import UvicornThread

from api.errors import ApiError
from api.protocol import ServedModel, parse_chat_request
from api.server import ApiConfig, build_app
from api.tool_call_parser import ToolCallParser
from core.generation_defaults import QWEN3_GENERATION_DEFAULTS
from core.tokenizer import load_tokenizer, render_chatml
from ipc.messages import ToolCallTurn

MODEL = ServedModel("qwen3-tiny", 4096, QWEN3_GENERATION_DEFAULTS)
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Météo actuelle",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TOOLS_INTRO = ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
               "You are provided with function signatures within <tools></tools> XML tags:\n<tools>")
TOOLS_OUTRO = ("\n</tools>\n\nFor each function call, return a json object with function name and arguments "
               "within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, "
               "\"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n")
ASK = [{"role": "user", "content": "Weather?"}]
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


# --- the chat template ------------------------------------------------------------------------------


def test_tools_join_the_system_turn_and_earlier_calls_and_results_render_as_qwen3s_template_does():
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C"},
    ]
    assert render_chatml(messages, tools=[WEATHER]) == (
        "<|im_start|>system\nYou are terse.\n\n" + TOOLS_INTRO
        + "\n" + json.dumps(WEATHER, ensure_ascii=False) + TOOLS_OUTRO
        + "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
        + "<|im_start|>assistant\n" + CALL + "<|im_end|>\n"
        + "<|im_start|>user\n<tool_response>\n18 C\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
    assert "Météo" in render_chatml(messages, tools=[WEATHER])  # tojson keeps non-ASCII


def test_without_a_system_message_the_tools_make_one_and_calls_after_text_start_on_a_new_line():
    calls = [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
             {"function": {"name": "get_weather", "arguments": '{"city": "Lyon"}'}}]
    messages = [{"role": "user", "content": "q"},
                {"role": "assistant", "content": "Checking.", "tool_calls": calls}]
    text = render_chatml(messages, add_generation_prompt=False, tools=[WEATHER, WEATHER])
    assert text.startswith("<|im_start|>system\n" + TOOLS_INTRO + "\n{")
    assert text.count('\n{"type": "function"') == 2
    # the last assistant turn after the query gets its (empty) think block, as any does
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\nChecking.\n" + CALL + "\n"
                         + CALL.replace("Paris", "Lyon") + "<|im_end|>\n")


def test_the_tool_call_tags_encode_to_their_special_tokens():
    ids = load_tokenizer(None).encode(render_chatml([{"role": "user", "content": "q"}], tools=[WEATHER]))
    assert ids.count(151657) == 2 and ids.count(151658) == 2  # both mentions in the instructions


# --- the reply parser -------------------------------------------------------------------------------


def _parse(pieces: list[str], parallel: bool = True) -> tuple[str, list[dict]]:
    parser = ToolCallParser(parallel)
    content, calls = "", []
    for piece in pieces:
        part = parser.feed(piece)
        content, calls = content + part.content, calls + part.tool_calls
    content += parser.finish().content
    return content, calls


def _every_split(text: str) -> list[list[str]]:
    return [[text], list(text), [text[:7], text[7:23], text[23:]]]


TWO_CALLS = "Let me check.\n" + CALL + "\n" + CALL.replace("Paris", "Lyon")


@pytest.mark.parametrize("pieces", _every_split(TWO_CALLS))
def test_calls_come_out_of_the_content_however_the_reply_is_cut_into_deltas(pieces):
    content, calls = _parse(pieces)
    assert content == "Let me check.\n"
    assert [c["index"] for c in calls] == [0, 1]
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [{"city": "Paris"}, {"city": "Lyon"}]
    assert all(c["type"] == "function" and c["function"]["name"] == "get_weather" for c in calls)
    assert all(c["id"].startswith("call_") for c in calls) and calls[0]["id"] != calls[1]["id"]


@pytest.mark.parametrize("pieces", _every_split("Just text, <b>bold</b> and a < sign"))
def test_a_reply_without_calls_is_all_content(pieces):
    assert _parse(pieces) == ("Just text, <b>bold</b> and a < sign", [])


def test_a_block_that_is_not_a_call_and_a_block_cut_off_stay_in_the_content():
    bad = "<tool_call>\n{not json}\n</tool_call>"
    assert _parse(list(bad + " then")) == (bad + " then", [])
    cut = 'Sure.<tool_call>\n{"name": "get_weather", "argu'
    assert _parse(list(cut)) == (cut, [])


def test_text_after_a_call_is_content_unless_it_is_only_whitespace():
    assert _parse([CALL, "\n\n"])[0] == ""
    assert _parse([CALL, "\n", "Done."])[0] == "\nDone."


def test_parallel_tool_calls_false_keeps_the_first_call():
    _, calls = _parse([CALL, "\n", CALL.replace("Paris", "Lyon")], parallel=False)
    assert len(calls) == 1 and json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris"}


def test_string_arguments_are_kept_as_written():
    _, calls = _parse(['<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>'])
    assert calls[0]["function"]["arguments"] == '{"a": 1}'


# --- the request fields -----------------------------------------------------------------------------


def _chat(**fields):
    body = {"messages": [{"role": "user", "content": "Weather?"}], **fields}
    return parse_chat_request(body, MODEL, "r")


def test_tools_travel_to_the_tokenizer_and_choice_none_takes_them_away():
    parsed = _chat(tools=[WEATHER])
    assert parsed.requests[0].tools == [WEATHER] and parsed.tools.parse_calls
    for off in ({"tool_choice": "none"}, {}):
        parsed = _chat(tools=[WEATHER] if off else [], **off)
        assert parsed.requests[0].tools is None and not parsed.tools.parse_calls
    assert not _chat(tools=[WEATHER], parallel_tool_calls=False).tools.parallel


@pytest.mark.parametrize("fields, param, words", [
    ({"tool_choice": "required"}, "tool_choice", "offers no tools"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "get_time"}}},
     "tool_choice", "'get_time', which is not among the tools: get_weather"),
    ({"tool_choice": "sometimes"}, "tool_choice", "must be"),
    ({"tool_choice": {"type": "function", "function": "get_weather"}}, "tool_choice", "must be"),
    ({"tools": {"a": 1}}, "tools", "array"),
    ({"tools": [{"type": "retrieval"}]}, "tools[0].type", "function tool"),
    ({"tools": [{"type": "function", "function": {"description": "x"}}]}, "tools[0].function.name", "name"),
    ({"tools": [WEATHER, WEATHER]}, "tools[1].function.name", "two tools"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]},
     "tools[0].function.parameters", "JSON Schema"),
])
def test_bad_tool_fields_are_refused_naming_the_field(fields, param, words):
    with pytest.raises(ApiError) as refused:
        _chat(**fields)
    assert refused.value.status == 400 and refused.value.param == param and words in str(refused.value)


def test_an_assistant_turns_calls_travel_as_tool_call_turns():
    messages = [{"role": "user", "content": "q"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "c", "type": "function", "function": {"name": "f", "arguments": {"a": "é"}}}]},
                {"role": "tool", "tool_call_id": "c", "content": "r"}]
    turn = parse_chat_request({"messages": messages}, MODEL, "r").requests[0].messages[1]
    assert turn.tool_calls == [ToolCallTurn("f", '{"a": "é"}')]
    with pytest.raises(ApiError) as refused:
        parse_chat_request({"messages": [{"role": "user", "content": "q", "tool_calls": [{}]}]}, MODEL, "r")
    assert refused.value.param == "messages[0].tool_calls"


# --- end to end through the official client ---------------------------------------------------------

openai = pytest.importorskip("openai")


@pytest.fixture(scope="module")
def api():
    with FakeTokenizer() as fake, \
            UvicornThread(build_app(ApiConfig(MODEL, fake.address, timeout_s=10))) as http:
        yield openai.OpenAI(base_url=f"http://127.0.0.1:{http.port}/v1", api_key="none", max_retries=0), fake


def test_the_openai_client_gets_tool_calls_and_finish_reason_tool_calls(api):
    client, fake = api
    reply = client.chat.completions.create(model="qwen3-tiny", messages=ASK, tools=[WEATHER])
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me check.\n"
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert fake.received[-1].tools == [WEATHER]


def test_a_streamed_reply_adds_up_to_the_whole_one(api):
    client, _ = api
    stream = client.chat.completions.create(model="qwen3-tiny", messages=ASK, tools=[WEATHER], stream=True)
    content, calls, finish = "", [], None
    for chunk in stream:
        delta = chunk.choices[0].delta
        content += delta.content or ""
        calls += delta.tool_calls or []
        finish = chunk.choices[0].finish_reason or finish
    assert content == "Let me check.\n" and finish == "tool_calls"
    assert len(calls) == 1 and calls[0].index == 0 and calls[0].id.startswith("call_")
    assert json.loads(calls[0].function.arguments) == {"city": "Paris"}


def test_a_tool_loop_sends_the_call_and_its_result_back(api):
    client, fake = api
    messages = [{"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "18 C"}]
    client.chat.completions.create(model="qwen3-tiny", messages=messages, tools=[WEATHER])
    sent = fake.received[-1].messages
    assert sent[1].tool_calls == [ToolCallTurn("get_weather", '{"city": "Paris"}')]
    assert sent[2].content == "18 C"
