"""POST /v1/responses (OpenAI's Responses API) through the official `openai` client: api/server.py on
a real uvicorn, the fake tokenizer's scripted replies behind it (a thinking reply; with tools, a
thought, a sentence and a call). The streamed events must satisfy the client's own accumulator
(`responses.stream`), and a response must say what the chat completion of the same conversation
says."""

from __future__ import annotations

import json

import pytest
from api_fake_tokenizer import FakeTokenizer
from api_http import UvicornThread, post

from api.protocol import ServedModel
from api.responses_request import parse_responses_body
from api.server import ApiConfig, build_app
from core.generation_defaults import QWEN3_GENERATION_DEFAULTS
from ipc.messages import GenerateRequest

openai = pytest.importorskip("openai")

MODEL = ServedModel("qwen3-tiny", 4096, QWEN3_GENERATION_DEFAULTS)
WEATHER = {"type": "function", "name": "get_weather",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
CHAT_WEATHER = {"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}


@pytest.fixture(scope="module")
def server():
    fake = FakeTokenizer()
    with fake, UvicornThread(build_app(ApiConfig(MODEL, fake.address, timeout_s=10))) as http:
        yield http.port, fake


def client(port: int):
    return openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)


def last_request(fake: FakeTokenizer) -> GenerateRequest:
    return fake.of_type(GenerateRequest)[-1]


def test_a_thinking_reply_is_a_reasoning_item_then_a_message_with_the_chat_completions_usage(server):
    port, _ = server
    reply = client(port).responses.create(model="qwen3-tiny", input="Hello")
    assert reply.status == "completed" and reply.incomplete_details is None
    assert [item.type for item in reply.output] == ["reasoning", "message"]
    assert reply.output[0].content[0].text == "The user greets me."
    assert reply.output_text == "Hello! How can I help?"
    chat = client(port).chat.completions.create(model="qwen3-tiny",
                                                messages=[{"role": "user", "content": "Hello"}])
    assert chat.choices[0].message.content == reply.output_text
    assert reply.usage.input_tokens == chat.usage.prompt_tokens
    assert reply.usage.output_tokens == chat.usage.completion_tokens == 16
    assert reply.usage.total_tokens == chat.usage.total_tokens
    assert reply.usage.output_tokens_details.reasoning_tokens == 8  # <think> ... </think>, both included
    assert reply.id.startswith("resp_") and reply.object == "response" and reply.store is False


def test_the_stream_satisfies_the_clients_accumulator_and_adds_up_to_the_whole_response(server):
    port, _ = server
    whole = client(port).responses.create(model="qwen3-tiny", input="Hello")
    with client(port).responses.stream(model="qwen3-tiny", input="Hello") as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert kinds.count("response.output_item.added") == kinds.count("response.output_item.done") == 2
    reasoning = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert (reasoning, text) == (whole.output[0].content[0].text, whole.output_text)
    assert final.output_text == whole.output_text and final.usage.output_tokens == whole.usage.output_tokens
    assert [item.type for item in final.output] == ["reasoning", "message"]
    assert final.usage.output_tokens_details.reasoning_tokens == 8


def test_a_function_call_is_an_item_of_its_own_whole_and_streamed(server):
    port, fake = server
    reply = client(port).responses.create(model="qwen3-tiny", input="Weather in Paris?", tools=[WEATHER])
    assert [item.type for item in reply.output] == ["reasoning", "message", "function_call"]
    chat = client(port).chat.completions.create(model="qwen3-tiny", tools=[CHAT_WEATHER],
                                                messages=[{"role": "user", "content": "Weather in Paris?"}])
    assert reply.output_text == chat.choices[0].message.content == "Let me check.\n"
    call = reply.output[2]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}
    assert call.call_id and call.status == "completed"
    sent = last_request(fake)
    assert sent.tools == [CHAT_WEATHER]
    asked = {"model": "qwen3-tiny", "input": "Weather in Paris?", "tools": [WEATHER]}
    with client(port).responses.stream(**asked) as stream:
        events = list(stream)
        final = stream.get_final_response()
    arguments = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert len(arguments) == 1 and json.loads(arguments[0].arguments) == {"city": "Paris"}
    assert [(item.type, getattr(item, "name", None)) for item in final.output] == [
        ("reasoning", None), ("message", None), ("function_call", "get_weather")]


def test_a_conversation_of_items_is_the_chat_it_describes(server):
    """Instructions, a developer message, an earlier call with its reasoning, and its output."""
    port, fake = server
    items = [{"role": "developer", "content": "Be brief."},
             {"role": "user", "content": [{"type": "input_text", "text": "Weather"},
                                          {"type": "input_text", "text": "in Paris?"}]},
             {"type": "reasoning", "id": "rs_1", "summary": [],
              "content": [{"type": "reasoning_text", "text": "Call it."}]},
             {"type": "function_call", "call_id": "call_1", "name": "get_weather",
              "arguments": '{"city": "Paris"}'},
             {"type": "function_call_output", "call_id": "call_1", "output": "sunny"}]
    reply = client(port).responses.create(model="qwen3-tiny", input=items, instructions="You are terse.",
                                          tools=[WEATHER], tool_choice="auto")
    assert reply.status == "completed" and reply.instructions == "You are terse."
    turns = last_request(fake).messages
    assert [(t.role, t.content) for t in turns] == [
        ("system", "You are terse."), ("developer", "Be brief."), ("user", "Weather\nin Paris?"),
        ("assistant", ""), ("tool", "sunny")]
    assert turns[3].reasoning_content == "Call it."
    assert [(c.name, c.arguments) for c in turns[3].tool_calls] == [("get_weather", '{"city": "Paris"}')]
    chat = client(port).chat.completions.create(model="qwen3-tiny", tools=[CHAT_WEATHER], messages=[
        {"role": "system", "content": "You are terse."}, {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": "Weather\nin Paris?"},
        {"role": "assistant", "content": None, "reasoning_content": "Call it.", "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}])
    assert reply.usage.input_tokens == chat.usage.prompt_tokens


def test_max_output_tokens_makes_an_incomplete_response_whole_and_streamed(server):
    port, fake = server
    reply = client(port).responses.create(model="qwen3-tiny", input="Hello", max_output_tokens=3)
    assert reply.status == "incomplete" and reply.incomplete_details.reason == "max_output_tokens"
    assert reply.usage.output_tokens == 3 and last_request(fake).params.max_tokens == 3
    assert reply.output[0].type == "reasoning" and reply.output[0].status == "incomplete"
    events = list(client(port).responses.create(model="qwen3-tiny", input="Hello", max_output_tokens=3,
                                                stream=True))
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.incomplete_details.reason == "max_output_tokens"


def test_settings_reach_the_engine_and_come_back_on_the_response(server):
    port, fake = server
    form = {"format": {"type": "json_schema", "name": "answer", "schema": {"enum": ["yes", "no"]}}}
    reply = client(port).responses.create(model="qwen3-tiny", input="Hello", temperature=0.5, top_p=0.9,
                                          text=form, extra_body={"top_k": 5, "seed": 7})
    params = last_request(fake).params
    assert (params.temperature, params.top_p, params.top_k, params.seed) == (0.5, 0.9, 5, 7)
    assert params.structured_output is not None
    assert (reply.temperature, reply.top_p) == (0.5, 0.9) and reply.text.format.type == "json_schema"


def test_an_engine_error_mid_stream_is_a_failed_response_event(server):
    port, _ = server
    events = list(client(port).responses.create(model="qwen3-tiny", input="ENGINE_ERROR", stream=True))
    assert events[-1].type == "response.failed"
    assert "boom" in events[-1].response.error.message


@pytest.mark.parametrize(("body", "param", "message"), [
    ({"input": ""}, "input", "must not be empty"),
    ({"input": []}, "input", "got an empty array"),
    ({"input": 3}, "input", "must be a string or a non-empty array"),
    ({"input": "x", "messages": []}, "messages", "takes 'input'"),
    ({"input": "x", "max_tokens": 3}, "max_tokens", "takes 'max_output_tokens'"),
    ({"input": "x", "max_output_tokens": 0}, "max_output_tokens", "an integer >= 1"),
    ({"input": "x", "previous_response_id": "resp_1"}, "previous_response_id", "stores no responses"),
    ({"input": "x", "background": True}, "background", "stores none"),
    ({"input": "x", "truncation": "auto"}, "truncation", "is refused, not cut"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, "tools[0].type", "built-in tools"),
    ({"input": "x", "tool_choice": "sometimes"}, "tool_choice", "must be \"auto\""),
    ({"input": "x", "text": {"format": {"type": "xml"}}}, "text.format", "text, json_object or json_schema"),
    ({"input": [{"type": "input_image", "image_url": "x"}]}, "input[0].type", "function_call_output"),
    ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, "input[0].content[0]",
     "only text"),
    ({"input": [{"role": "critic", "content": "x"}]}, "input[0].role", "must be one of"),
    ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "input[0].call_id",
     "must be a string"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0]", "stores none"),
    ({"input": "x", "temperature": -1}, "temperature", "must be in [0, 100]"),
    ({"input": "x", "max_output_tokens": 5000}, "max_output_tokens", "maximum context length is 4096"),
])
def test_a_bad_body_gets_a_400_naming_its_field(server, body, param, message):
    port, _ = server
    reply = post(port, "/v1/responses", {"model": "qwen3-tiny", **body})
    assert reply.status == 400, reply
    error = reply.json()["error"]
    assert error["param"] == param and message in error["message"], error


def test_ignored_fields_change_nothing_of_the_chat_request():
    plain = parse_responses_body({"input": "x"})
    noisy = parse_responses_body({"input": "x", "store": True, "metadata": {"a": "b"}, "user": "u",
                                  "include": ["reasoning.encrypted_content"], "reasoning": {"effort": "low"},
                                  "service_tier": "auto", "prompt_cache_key": "k", "safety_identifier": "s"})
    assert noisy.chat_body == plain.chat_body == {"messages": [{"role": "user", "content": "x"}]}
