"""POST /v1/messages (Anthropic's Messages API) through the official `anthropic` client: api/server.py
on a real uvicorn, the fake tokenizer's scripted replies behind it (a thinking reply; with tools, a
thought, a sentence and a call). The client's stream helper must accumulate the events into the
message a whole call returns, and a message must say what the chat completion of the same
conversation says."""

from __future__ import annotations

import pytest
from api_fake_tokenizer import FakeTokenizer
from api_http import UvicornThread, post

from api.protocol import ServedModel
from api.server import ApiConfig, build_app
from core.generation_defaults import QWEN3_GENERATION_DEFAULTS
from ipc.messages import GenerateRequest

anthropic = pytest.importorskip("anthropic")
openai = pytest.importorskip("openai")

MODEL = ServedModel("qwen3-tiny", 4096, QWEN3_GENERATION_DEFAULTS)
WEATHER = {"name": "get_weather", "description": "The weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}
CHAT_WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER["input_schema"],
                                                 "description": WEATHER["description"]}}
HELLO = [{"role": "user", "content": "Hello"}]


@pytest.fixture(scope="module")
def server():
    fake = FakeTokenizer()
    app = build_app(ApiConfig(MODEL, fake.address, timeout_s=10, api_key="sk-test"))
    with fake, UvicornThread(app) as http:
        yield http.port, fake


def client(port: int):
    return anthropic.Anthropic(base_url=f"http://127.0.0.1:{port}", api_key="sk-test", max_retries=0)


def chat(port: int, **body):
    api = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="sk-test", max_retries=0)
    return api.chat.completions.create(model="qwen3-tiny", **body)


def last_request(fake: FakeTokenizer) -> GenerateRequest:
    return fake.of_type(GenerateRequest)[-1]


def test_a_thinking_reply_is_a_thinking_block_then_text_with_the_chat_completions_usage(server):
    port, _ = server
    message = client(port).messages.create(model="qwen3-tiny", max_tokens=100, messages=HELLO)
    assert [block.type for block in message.content] == ["thinking", "text"]
    assert message.content[0].thinking == "The user greets me."
    assert message.content[1].text == "Hello! How can I help?"
    assert message.stop_reason == "end_turn" and message.role == "assistant" and message.id.startswith("msg_")
    same = chat(port, messages=HELLO, max_tokens=100)
    usage = message.usage
    assert usage.input_tokens + usage.cache_read_input_tokens == same.usage.prompt_tokens
    assert usage.output_tokens == same.usage.completion_tokens == 16


def test_the_stream_accumulates_into_the_whole_message(server):
    port, _ = server
    whole = client(port).messages.create(model="qwen3-tiny", max_tokens=100, messages=HELLO)
    with client(port).messages.stream(model="qwen3-tiny", max_tokens=100, messages=HELLO) as stream:
        events = [event.type for event in stream]
        final = stream.get_final_message()
    assert events[0] == "message_start" and events[-1] == "message_stop"
    assert events.count("content_block_start") == events.count("content_block_stop") == 2
    assert [b.model_dump() for b in final.content] == [b.model_dump() for b in whole.content]
    assert final.stop_reason == "end_turn" and final.usage.output_tokens == whole.usage.output_tokens
    assert final.usage.input_tokens + final.usage.cache_read_input_tokens == \
        whole.usage.input_tokens + whole.usage.cache_read_input_tokens


def test_a_function_call_is_a_tool_use_block_whole_and_streamed(server):
    port, fake = server
    asked = {"model": "qwen3-tiny", "max_tokens": 200, "tools": [WEATHER],
             "messages": [{"role": "user", "content": "Weather in Paris?"}]}
    message = client(port).messages.create(**asked)
    assert [block.type for block in message.content] == ["thinking", "text", "tool_use"]
    call = message.content[2]
    assert (call.name, call.input) == ("get_weather", {"city": "Paris"}) and call.id
    assert message.stop_reason == "tool_use"
    assert last_request(fake).tools == [CHAT_WEATHER]
    with client(port).messages.stream(**asked) as stream:
        final = stream.get_final_message()
    assert [(b.type, getattr(b, "input", None)) for b in final.content] == [
        ("thinking", None), ("text", None), ("tool_use", {"city": "Paris"})]
    assert final.stop_reason == "tool_use"


def test_a_conversation_with_a_tool_round_trip_is_the_chat_it_describes(server):
    port, fake = server
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "Weather"},
                                     {"type": "text", "text": "in Paris?"}]},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "Call it.", "signature": "x"},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "sunny"}]},
            {"type": "text", "text": "Thanks"}]}]
    message = client(port).messages.create(model="qwen3-tiny", max_tokens=100, system="You are terse.",
                                           tools=[WEATHER], tool_choice={"type": "auto"}, messages=messages)
    turns = last_request(fake).messages
    assert [(t.role, t.content) for t in turns] == [
        ("system", "You are terse."), ("user", "Weather\nin Paris?"), ("assistant", ""), ("tool", "sunny"),
        ("user", "Thanks")]
    assert turns[2].reasoning_content == "Call it."
    assert [(c.name, c.arguments) for c in turns[2].tool_calls] == [("get_weather", '{"city": "Paris"}')]
    same = chat(port, max_tokens=100, tools=[CHAT_WEATHER], messages=[
        {"role": "system", "content": "You are terse."}, {"role": "user", "content": "Weather\nin Paris?"},
        {"role": "assistant", "content": None, "reasoning_content": "Call it.", "tool_calls": [
            {"id": "toolu_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"},
        {"role": "user", "content": "Thanks"}])
    assert message.usage.input_tokens + message.usage.cache_read_input_tokens == same.usage.prompt_tokens


def test_settings_reach_the_engine(server):
    port, fake = server
    client(port).messages.create(model="qwen3-tiny", max_tokens=7, messages=HELLO, stop_sequences=["zzz"],
                                 thinking={"type": "disabled"}, tools=[WEATHER],
                                 tool_choice={"type": "any", "disable_parallel_tool_use": True},
                                 extra_body={"temperature": 0.5, "top_p": 0.9, "top_k": 5, "min_p": 0.1,
                                             "seed": 3, "ignore_eos": True, "min_tokens": 2,
                                             "repetition_penalty": 1.1})
    sent = last_request(fake)
    params = sent.params
    assert (params.max_tokens, params.temperature, params.top_p, params.top_k) == (7, 0.5, 0.9, 5)
    assert (params.min_p, params.seed, params.ignore_eos, params.min_tokens) == (0.1, 3, True, 2)
    assert params.repetition_penalty == 1.1
    assert params.stop == ("zzz",) and sent.enable_thinking is False and params.structured_output is not None


def test_max_tokens_and_stop_sequences_end_a_message_as_anthropic_says(server):
    port, _ = server
    cut = client(port).messages.create(model="qwen3-tiny", max_tokens=3, messages=HELLO)
    assert cut.stop_reason == "max_tokens" and cut.usage.output_tokens == 3
    stopped = client(port).messages.create(model="qwen3-tiny", max_tokens=100, messages=HELLO,
                                           stop_sequences=["How"])
    assert (stopped.stop_reason, stopped.stop_sequence) == ("stop_sequence", "How")
    assert stopped.content[-1].text == "Hello! "


def test_an_engine_error_mid_stream_is_an_error_event(server):
    port, _ = server
    asked = {"model": "qwen3-tiny", "max_tokens": 100,
             "messages": [{"role": "user", "content": "ENGINE_ERROR"}]}
    with pytest.raises(anthropic.APIStatusError, match="boom"):  # noqa: SIM117 (the stream raises)
        with client(port).messages.stream(**asked) as stream:
            list(stream)


def test_the_key_is_taken_from_either_header_and_a_wrong_one_is_refused_naming_it(server):
    port, _ = server
    wrong = anthropic.Anthropic(base_url=f"http://127.0.0.1:{port}", api_key="nope", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError, match="invalid API key in the Authorization header"):
        wrong.messages.create(model="qwen3-tiny", max_tokens=5, messages=HELLO)
    body = {"model": "qwen3-tiny", "max_tokens": 5, "messages": HELLO}
    assert post(port, "/v1/messages", body, headers={"x-api-key": "sk-test"}).status == 200
    refused = post(port, "/v1/messages", body, headers={"x-api-key": "nope"})
    assert refused.status == 401
    assert "invalid API key in the x-api-key header" in refused.json()["error"]["message"]


@pytest.mark.parametrize(("body", "message"), [
    ({"messages": HELLO}, "'max_tokens' is required"),
    ({"max_tokens": 5, "messages": []}, "non-empty array of messages"),
    ({"max_tokens": 5, "messages": [{"role": "system", "content": "x"}]}, "must be user or assistant"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
     "images and documents are not supported"),
    ({"max_tokens": 5, "messages": HELLO, "tools": [{"type": "web_search_20250305", "name": "web_search"}]},
     "server tools are not supported"),
    ({"max_tokens": 5, "messages": HELLO, "tool_choice": {"type": "sometimes"}}, "'tool_choice' must be"),
    ({"max_tokens": 5, "messages": HELLO, "thinking": {"type": "maybe"}}, "'thinking.type' must be"),
    ({"max_tokens": 5, "messages": HELLO, "thinking": "yes"}, "'thinking' must be an object"),
    ({"max_tokens": 5, "messages": HELLO, "output_config": {"format": {"type": "xml"}}},
     "'output_config.format' must be"),
    ({"max_tokens": 5, "messages": HELLO, "stop_sequences": [""]}, "non-empty strings"),
    ({"max_tokens": 5, "messages": HELLO, "temperature": -1}, "'temperature' must be in [0, 100]"),
    ({"max_tokens": 5, "messages": HELLO, "ignore_eos": "yes"}, "'ignore_eos' must be"),
    ({"max_tokens": 5000, "messages": HELLO}, "maximum context length is 4096"),
    ({"max_tokens": 5, "messages": HELLO, "n": 2}, "'n' is not a field of /v1/messages"),
])
def test_a_bad_body_gets_anthropics_error_object(server, body, message):
    port, _ = server
    reply = post(port, "/v1/messages", {"model": "qwen3-tiny", **body}, headers={"x-api-key": "sk-test"})
    assert reply.status == 400, reply
    error = reply.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert message in error["error"]["message"], error
