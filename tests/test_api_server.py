"""api/server.py through a real uvicorn on loopback, against the fake tokenizer: every endpoint,
field by field in OpenAI's wire format, streaming and not, errors, auth, aborts and metrics."""

from __future__ import annotations

import contextlib
import dataclasses
import http.client
import socket
import time

import orjson
import pytest
import zmq
from api_fake_tokenizer import COMPLETION_REPLY, ENGINE_ERROR, FakeTokenizer, default_reply
from api_http import Reply, UvicornThread, get, post, request, sse_events
from prometheus_client.parser import text_string_to_metric_families

from api.protocol import ServedModel
from api.server import ApiConfig, build_app
from core.generation_defaults import QWEN3_GENERATION_DEFAULTS
from core.sampling_params import SamplingParams
from core.tokenizer.chat_template import render_chatml
from ipc.messages import AbortRequest, GenerateRequest

MODEL = ServedModel("qwen3-tiny", 4096, QWEN3_GENERATION_DEFAULTS)
HELLO = [{"role": "user", "content": "hi"}]
COMPLETION_TEXT = "".join(COMPLETION_REPLY)
COMPLETION_CHOICE_KEYS = {"index", "text", "logprobs", "finish_reason", "stop_reason"}
CHAT_CHOICE_KEYS = {"index", "message", "logprobs", "finish_reason", "stop_reason"}


@pytest.fixture(scope="module")
def fake():
    with FakeTokenizer() as fake:
        yield fake


@pytest.fixture(scope="module")
def port(fake):
    with UvicornThread(build_app(ApiConfig(MODEL, fake.address, timeout_s=10))) as server:
        yield server.port


def requests_of(fake, call_id: str) -> list[GenerateRequest]:
    return [r for r in fake.of_type(GenerateRequest) if r.request_id.startswith(call_id + "-")]


def chatml_len(messages, enable_thinking=True) -> int:
    return len(render_chatml(messages, add_generation_prompt=True, enable_thinking=enable_thinking))


def assert_usage(usage, prompt_tokens, completion_tokens, cached_tokens=0):
    assert usage == {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                     "total_tokens": prompt_tokens + completion_tokens,
                     "prompt_tokens_details": {"cached_tokens": cached_tokens}}


# --- state endpoints ------------------------------------------------------------------------------


def test_models_lists_the_served_model(port):
    reply = get(port, "/v1/models")
    assert reply.status == 200 and reply.headers["content-type"] == "application/json"
    (model,) = reply.json()["data"]
    assert reply.json()["object"] == "list"
    assert model["id"] == "qwen3-tiny" and model["object"] == "model" and model["owned_by"] == "cadence"
    assert model["max_model_len"] == 4096 and isinstance(model["created"], int)


def test_version(port):
    reply = get(port, "/version")
    assert reply.status == 200 and isinstance(reply.json()["version"], str)


def test_health_follows_the_engines_serving_flag(port, fake):
    ok = get(port, "/health")
    assert ok.status == 200 and ok.json()["status"] == "ok"
    fake.serving = False
    try:
        down = get(port, "/health")
    finally:
        fake.serving = True
    assert down.status == 503 and down.json()["status"] == "unavailable"
    assert "replica 1: executor dp=1 tp=0 died" in down.json()["reason"]


def test_a_requests_x_request_id_comes_back_on_its_response_errors_and_streams_included(port):
    tagged = {"X-Request-Id": "gw-7f3a-0001"}
    ok = post(port, "/v1/completions", {"model": "qwen3-tiny", "prompt": "hi", "max_tokens": 3},
              headers=tagged)
    assert ok.status == 200 and ok.headers["x-request-id"] == "gw-7f3a-0001"
    assert ok.json()["id"].startswith("cmpl-")  # the completion's own id stays Cadence's
    stream = post(port, "/v1/completions", {"model": "qwen3-tiny", "prompt": "hi", "max_tokens": 3,
                                            "stream": True}, headers=tagged)
    assert stream.status == 200 and stream.headers["x-request-id"] == "gw-7f3a-0001"
    refused = post(port, "/v1/completions", {"model": "qwen3-tiny", "prompt": "hi", "max_tokens": -1},
                   headers=tagged)
    assert refused.status == 400 and refused.headers["x-request-id"] == "gw-7f3a-0001"
    assert get(port, "/health", headers=tagged).headers["x-request-id"] == "gw-7f3a-0001"
    assert "x-request-id" not in get(port, "/health").headers  # none given, none made up
    assert "x-request-id" not in get(port, "/health", headers={"X-Request-Id": "x" * 300}).headers


def test_get_load_reports_each_replica_as_the_sglang_runtime_does(port, fake):
    busy = dataclasses.replace(fake.replicas[0], routed_load_tokens=4096)
    saved, fake.replicas = fake.replicas, [busy, fake.replicas[1]]
    try:
        reply = get(port, "/get_load")
    finally:
        fake.replicas = saved
    assert reply.status == 200
    assert reply.json() == [
        {"dp_rank": 0, "num_reqs": 5, "num_waiting_reqs": 2, "num_tokens": 4096, "alive": True},
        {"dp_rank": 1, "num_reqs": 0, "num_waiting_reqs": 0, "num_tokens": 0, "alive": False},
    ]


def test_unknown_route_and_wrong_method_are_openai_errors(port):
    missing = get(port, "/v1/embeddings")
    assert missing.status == 404 and missing.json()["error"]["message"] == "no route GET /v1/embeddings"
    wrong = get(port, "/v1/completions")
    assert wrong.status == 405 and "error" in wrong.json()


# --- /v1/completions ------------------------------------------------------------------------------


def test_completion_object_field_by_field(port, fake):
    before = int(time.time())
    reply = post(port, "/v1/completions", {"model": "qwen3-tiny", "prompt": "Say", "max_tokens": 16})
    assert reply.status == 200, reply
    body = reply.json()
    assert set(body) == {"id", "object", "created", "model", "choices", "usage"}
    assert body["id"].startswith("cmpl-") and body["object"] == "text_completion"
    assert before <= body["created"] <= time.time() + 1 and body["model"] == "qwen3-tiny"
    (choice,) = body["choices"]
    assert set(choice) == COMPLETION_CHOICE_KEYS
    assert choice == {"index": 0, "text": COMPLETION_TEXT, "logprobs": None, "finish_reason": "stop",
                      "stop_reason": None}
    assert_usage(body["usage"], 3, len(COMPLETION_REPLY))
    (sent,) = requests_of(fake, body["id"])
    assert sent.prompt == "Say" and sent.params.max_tokens == 16 and sent.params.temperature == 0.6


def test_completion_length_stop_string_and_stop_token(port):
    length = post(port, "/v1/completions", {"prompt": "a", "max_tokens": 2}).json()["choices"][0]
    assert (length["text"], length["finish_reason"], length["stop_reason"]) == (" one two", "length", None)
    stop = post(port, "/v1/completions", {"prompt": "b", "stop": [" three"]}).json()["choices"][0]
    assert (stop["text"], stop["finish_reason"], stop["stop_reason"]) == (" one two", "stop", " three")


def test_completion_streaming_chunks_add_up_to_the_whole(port):
    body = {"prompt": "Say", "max_tokens": 16}
    whole = post(port, "/v1/completions", body).json()
    reply = post(port, "/v1/completions", {**body, "stream": True})
    assert reply.status == 200 and reply.headers["content-type"].startswith("text/event-stream")
    events = sse_events(reply)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert len({c["id"] for c in chunks}) == 1 and chunks[0]["id"].startswith("cmpl-")
    assert all(c["object"] == "text_completion" and "usage" not in c for c in chunks)
    assert all(set(c["choices"][0]) == COMPLETION_CHOICE_KEYS for c in chunks)
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole["choices"][0]["text"]
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * (len(chunks) - 1) + ["stop"]


def test_completion_stream_with_usage_ends_with_a_usage_chunk(port):
    reply = post(port, "/v1/completions", {"prompt": [5, 6, 7, 8], "stream": True, "max_tokens": 3,
                                           "stream_options": {"include_usage": True}})
    events = sse_events(reply)
    *chunks, usage_chunk, done = events
    assert done == "[DONE]"
    assert all(c["usage"] is None for c in chunks)
    assert usage_chunk["choices"] == [] and usage_chunk["object"] == "text_completion"
    assert_usage(usage_chunk["usage"], 4, 3)


def test_several_prompts_with_n_choices(port, fake):
    body = post(port, "/v1/completions", {"prompt": ["ab", "cde"], "n": 2, "seed": 7, "max_tokens": 3}).json()
    assert [c["index"] for c in body["choices"]] == [0, 1, 2, 3]
    assert all(c["text"] == " one two three" for c in body["choices"])
    assert_usage(body["usage"], 2 + 3, 4 * 3)  # each prompt counted once, every choice's tokens
    sent = sorted(requests_of(fake, body["id"]), key=lambda r: r.request_id)
    assert [(r.prompt, r.params.seed) for r in sent] == [("ab", 7), ("ab", 8), ("cde", 7), ("cde", 8)]


def test_completion_logprobs(port):
    reply = post(port, "/v1/completions", {"prompt": "q", "max_tokens": 3, "logprobs": 2})
    choice = reply.json()["choices"][0]
    assert choice["logprobs"] == {
        "tokens": [" one", " two", " three"],
        "token_logprobs": [-0.25, -0.5, -0.75],
        "top_logprobs": [{" one": -0.25, "x": -1.25}, {" two": -0.5, "x": -1.5},
                         {" three": -0.75, "x": -1.75}],
        "text_offset": [0, 4, 8],
    }
    events = sse_events(post(port, "/v1/completions", {"prompt": "q", "max_tokens": 3, "logprobs": 0,
                                                       "stream": True}))
    offsets = [o for e in events[:-1] for o in e["choices"][0]["logprobs"]["text_offset"]]
    assert offsets == [0, 4, 8]


def test_a_repeated_prompt_reports_cached_tokens(port):
    body = {"prompt": "the same long prompt", "max_tokens": 1}
    post(port, "/v1/completions", body)
    usage = post(port, "/v1/completions", body).json()["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] == len("the same long prompt") - 1


# --- /v1/chat/completions -------------------------------------------------------------------------


def test_chat_completion_object_splits_reasoning(port, fake):
    reply = post(port, "/v1/chat/completions", {"model": "qwen3-tiny", "messages": HELLO})
    assert reply.status == 200, reply
    body = reply.json()
    assert set(body) == {"id", "object", "created", "model", "choices", "usage"}
    assert body["id"].startswith("chatcmpl-") and body["object"] == "chat.completion"
    (choice,) = body["choices"]
    assert set(choice) == CHAT_CHOICE_KEYS
    assert choice["message"] == {"role": "assistant", "content": "Hello! How can I help?",
                                 "reasoning": "The user greets me.",
                                 "reasoning_content": "The user greets me."}
    assert (choice["finish_reason"], choice["logprobs"]) == ("stop", None)
    assert_usage(body["usage"], chatml_len(HELLO), 16)
    (sent,) = requests_of(fake, body["id"])
    assert sent.enable_thinking is True and sent.messages[0].content == "hi"


def test_return_token_ids_gives_the_prompts_and_the_outputs_ids(port, fake):
    """vLLM's return_token_ids: a completion choice carries prompt_token_ids and token_ids (the
    output's alone, echo or not), a chat its token_ids and the prompt's beside the choices; a stream
    sends the prompt's in its first chunk and the tokens chunk by chunk. Without it, none."""
    body = {"prompt": [5, 6, 8311], "max_tokens": 3, "return_token_ids": True}
    (choice,) = post(port, "/v1/completions", body).json()["choices"]
    assert choice["prompt_token_ids"] == [5, 6, 8311] and len(choice["token_ids"]) == 3
    chunks = sse_events(post(port, "/v1/completions", {**body, "stream": True}))[:-1]
    assert chunks[0]["choices"][0]["prompt_token_ids"] == [5, 6, 8311]
    assert all("prompt_token_ids" not in c["choices"][0] for c in chunks[1:])
    assert [t for c in chunks for t in c["choices"][0]["token_ids"]] == choice["token_ids"]
    (echoed,) = post(port, "/v1/completions", {**body, "echo": True}).json()["choices"]
    assert echoed["token_ids"] == choice["token_ids"]  # the output's alone, as vLLM's
    assert echoed["text"].startswith("<5><6><8311>") and echoed["prompt_token_ids"] == [5, 6, 8311]

    chat_body = {"messages": HELLO, "max_tokens": 4, "return_token_ids": True}
    chat = post(port, "/v1/chat/completions", chat_body).json()
    prompt_ids = [ord(c) % 100_000 for c in render_chatml(HELLO, add_generation_prompt=True)]
    assert chat["prompt_token_ids"] == prompt_ids and len(chat["choices"][0]["token_ids"]) == 4
    events = sse_events(post(port, "/v1/chat/completions", {**chat_body, "stream": True}))[:-1]
    assert events[0]["prompt_token_ids"] == prompt_ids
    assert all("prompt_token_ids" not in e for e in events[1:])
    streamed = [t for e in events for t in e["choices"][0].get("token_ids", [])]
    assert streamed == chat["choices"][0]["token_ids"]

    plain = post(port, "/v1/completions", {"prompt": [5, 6, 8311], "max_tokens": 3, "stream": True}).body
    assert b"token_ids" not in plain
    sent = [r for r in fake.of_type(GenerateRequest) if r.prompt_token_ids == [5, 6, 8311]]
    assert [r.return_prompt_token_ids for r in sent] == [True, True, True, False]


def test_a_chat_stream_chunks_a_token_without_text_but_not_text_a_parser_holds(port):
    """A token that has no text yet (here pieces of "") gets a chunk with content "" (vLLM's server
    sends one, and its bench serve times tokens by them); text the tool-call parser holds back gets
    none, so a tool call's stream carries no empty contents; with return_token_ids every token goes
    out (in `token_ids`, the delta empty when the parser holds its text)."""
    def reply(request):
        return ["", "", "Hi"] if not request.tools else default_reply(request)

    tools = [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]
    with FakeTokenizer(reply=reply) as quiet, \
            UvicornThread(build_app(ApiConfig(MODEL, quiet.address, timeout_s=10))) as server:
        body = {"messages": HELLO, "stream": True, "chat_template_kwargs": {"enable_thinking": False}}
        events = sse_events(post(server.port, "/v1/chat/completions", body))[:-1]
        assert [e["choices"][0]["delta"] for e in events] == [
            {"role": "assistant", "content": ""}, {"content": ""}, {"content": ""}, {"content": "Hi"}, {}]
        called = sse_events(post(server.port, "/v1/chat/completions", {**body, "tools": tools}))[:-1]
        deltas = [e["choices"][0]["delta"] for e in called[1:]]
        assert all(d.get("content") != "" for d in deltas) and any("tool_calls" in d for d in deltas)
        with_ids = sse_events(post(server.port, "/v1/chat/completions",
                                   {**body, "tools": tools, "return_token_ids": True}))[:-1]
        assert sum(len(e["choices"][0].get("token_ids", [])) for e in with_ids) == len(default_reply(
            GenerateRequest("x", SamplingParams(), messages=[], tools=tools)))


def test_chat_without_thinking_is_all_content(port, fake):
    body = post(port, "/v1/chat/completions", {"messages": HELLO, "chat_template_kwargs":
                                               {"enable_thinking": False}}).json()
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "Hello! How can I help?",
                                             "reasoning": None, "reasoning_content": None}
    assert body["usage"]["prompt_tokens"] == chatml_len(HELLO, enable_thinking=False)
    assert requests_of(fake, body["id"])[0].enable_thinking is False


def test_chat_stream_role_first_then_reasoning_then_content(port):
    whole = post(port, "/v1/chat/completions", {"messages": HELLO, "n": 2}).json()
    events = sse_events(post(port, "/v1/chat/completions", {"messages": HELLO, "n": 2, "stream": True,
                                                            "stream_options": {"include_usage": True}}))
    *chunks, usage_chunk, done = events
    assert done == "[DONE]"
    assert all(c["object"] == "chat.completion.chunk" and c["usage"] is None for c in chunks)
    for index in (0, 1):
        mine = [c["choices"][0] for c in chunks if c["choices"][0]["index"] == index]
        assert mine[0]["delta"] == {"role": "assistant", "content": ""}
        assert all(set(c) == {"index", "delta", "logprobs", "finish_reason", "stop_reason"} for c in mine)
        reasoning = "".join(c["delta"].get("reasoning_content", "") for c in mine)
        assert all(c["delta"].get("reasoning") == c["delta"].get("reasoning_content") for c in mine)
        content = "".join(c["delta"].get("content", "") for c in mine)
        message = whole["choices"][index]["message"]
        assert (reasoning, content) == (message["reasoning_content"], message["content"])
        first_content = next(i for i, c in enumerate(mine) if c["delta"].get("content"))
        assert all("reasoning_content" not in c["delta"] and "reasoning" not in c["delta"]
                   for c in mine[first_content:])
        assert [c["finish_reason"] for c in mine][-1] == "stop"
    assert_usage(usage_chunk["usage"], chatml_len(HELLO), 32, cached_tokens=chatml_len(HELLO) - 1)


def test_chat_logprobs(port):
    body = post(port, "/v1/chat/completions", {"messages": HELLO, "logprobs": True, "top_logprobs": 1,
                                               "max_completion_tokens": 2}).json()
    assert body["choices"][0]["logprobs"] == {"content": [
        {"token": "<think>", "logprob": -0.25, "bytes": list(b"<think>"),
         "top_logprobs": [{"token": "<think>", "logprob": -0.25, "bytes": list(b"<think>")}]},
        {"token": "\n", "logprob": -0.5, "bytes": [10],
         "top_logprobs": [{"token": "\n", "logprob": -0.5, "bytes": [10]}]},
    ]}
    assert body["choices"][0]["finish_reason"] == "length" and body["usage"]["completion_tokens"] == 2


def test_return_tokens_as_token_ids_names_the_logprobs_tokens_by_id(port):
    """vLLM's return_tokens_as_token_ids: every token of the logprobs, sampled, top and an echoed
    prompt's, is "token_id:<id>" (the ids the text came from; the top's "x" is the fake's id 7)."""
    body = {"prompt": [5, 6, 8312], "max_tokens": 2, "logprobs": 2, "return_token_ids": True}
    plain = post(port, "/v1/completions", body).json()["choices"][0]
    named = post(port, "/v1/completions", {**body, "return_tokens_as_token_ids": True}).json()["choices"][0]
    ids = [f"token_id:{i}" for i in plain["token_ids"]]
    assert named["logprobs"]["tokens"] == ids
    assert named["logprobs"]["token_logprobs"] == plain["logprobs"]["token_logprobs"]
    tops = [sorted(top) for top in named["logprobs"]["top_logprobs"]]
    assert tops == [sorted([i, "token_id:7"]) for i in ids]
    echoed = post(port, "/v1/completions", {**body, "echo": True, "return_tokens_as_token_ids": True}).json()
    assert echoed["choices"][0]["logprobs"]["tokens"] == ["token_id:5", "token_id:6", "token_id:8312", *ids]
    chat = post(port, "/v1/chat/completions", {"messages": HELLO, "logprobs": True, "top_logprobs": 1,
                                               "max_completion_tokens": 2, "return_tokens_as_token_ids": True,
                                               "return_token_ids": True}).json()["choices"][0]
    (first, second) = chat["logprobs"]["content"]
    assert [first["token"], second["token"]] == [f"token_id:{i}" for i in chat["token_ids"]]
    assert first["top_logprobs"][0]["token"] == first["token"]
    assert first["bytes"] == list(first["token"].encode())


# --- errors ---------------------------------------------------------------------------------------


def assert_error(reply, status, param, message_part, error_type="invalid_request_error"):
    assert reply.status == status, reply
    assert reply.headers["content-type"] == "application/json"
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["type"], error["param"], error["code"]) == (error_type, param, None)
    assert message_part in error["message"]


def test_bad_requests_over_http(port):
    assert_error(post(port, "/v1/completions", raw=b'{"prompt": '), 400, None, "not valid JSON")
    assert_error(post(port, "/v1/chat/completions", {"messages": HELLO, "model": "llama"}), 404, "model",
                 "'llama' does not exist")
    assert_error(post(port, "/v1/chat/completions", {"messages": HELLO, "temperature": -1}), 400,
                 "temperature", "must be in [0, 100]")
    assert_error(post(port, "/v1/completions", {"prompt": "x", "n": 100}), 400, "n", "must be >= 1 and <= 64")


def test_a_prompt_over_the_context_is_refused_with_the_numbers(port):
    reply = post(port, "/v1/completions", {"prompt": "x" * 3000, "max_tokens": 2000})
    assert_error(reply, 400, "max_tokens", "maximum context length is 4096 tokens; the request has 3000 "
                 "prompt tokens and asks for 2000 more")
    streamed = post(port, "/v1/completions", {"prompt": "x" * 5000, "max_tokens": 1, "stream": True})
    assert_error(streamed, 400, "prompt", "the request has 5000 prompt tokens")  # refused before streaming


def test_a_defaulted_max_tokens_goes_out_as_up_to_the_context_and_runs_to_it(port, fake):
    # 4090 characters of 2 UTF-8 bytes; the tokenizer, not the API, counts them (one token each here)
    reply = post(port, "/v1/completions", {"prompt": "é" * 4090, "ignore_eos": True})
    assert reply.status == 200, reply
    body = reply.json()
    (sent,) = requests_of(fake, body["id"])
    assert sent.params.max_tokens is None
    assert body["usage"]["completion_tokens"] == 4096 - 4090
    assert body["choices"][0]["finish_reason"] == "length"
    nothing_left = post(port, "/v1/completions", {"prompt": "é" * 4096})
    assert_error(nothing_left, 400, "prompt", "4096 prompt tokens, which leaves no room for output")
    no_room_for_min = post(port, "/v1/completions", {"prompt": "é" * 4090, "min_tokens": 7})
    assert_error(no_room_for_min, 400, "min_tokens", "4090 prompt tokens and asks for at least 7 more")


def test_a_context_refusal_is_told_from_its_numbers_in_the_clients_own_field(port, fake):
    fake.refusal_prose = "words the API must not parse"
    try:
        reply = post(port, "/v1/chat/completions", {"messages": HELLO, "max_completion_tokens": 4096})
    finally:
        fake.refusal_prose = None
    assert_error(reply, 400, "max_completion_tokens", "This model's maximum context length is 4096 tokens; "
                 f"the request has {chatml_len(HELLO)} prompt tokens and asks for 4096 more")


def test_an_engine_error_is_a_500_or_an_error_event(port):
    reply = post(port, "/v1/completions", {"prompt": "ENGINE_ERROR please", "max_tokens": 10})
    assert_error(reply, 500, None, ENGINE_ERROR, "server_error")
    events = sse_events(post(port, "/v1/completions", {"prompt": "ENGINE_ERROR", "max_tokens": 10,
                                                       "stream": True}))
    assert events[-1] == "[DONE]"
    assert events[-2]["error"]["type"] == "server_error" and ENGINE_ERROR in events[-2]["error"]["message"]
    assert events[-3]["choices"][0]["finish_reason"] == "abort"


@pytest.mark.parametrize("path, body", [
    ("/v1/completions", {"prompt": "HOLD_FIRST", "stream": True, "max_tokens": 3}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "HOLD_FIRST"}], "stream": True,
                              "max_tokens": 3, "chat_template_kwargs": {"enable_thinking": False}}),
])
def test_a_stream_starts_its_response_once_admitted_while_its_first_token_is_held(fake, port, path, body):
    """A streamed call's status and headers go out once the engine has taken its requests, while
    their prefill runs (the first token is held here until the headers came); the chunks, the chat's
    role chunk among them, come with the first token."""
    fake.release_held.clear()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("POST", path, body=orjson.dumps(body), headers={"Content-Type": "application/json"})
        response = conn.getresponse()  # times out if the headers wait for the first token
        assert response.status == 200 and response.getheader("content-type").startswith("text/event-stream")
        fake.release_held.set()
        events = sse_events(Reply(response.status, {}, response.read()))
    finally:
        fake.release_held.set()
        conn.close()
    assert events[-1] == "[DONE]"
    if path == "/v1/chat/completions":
        assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        assert "".join(e["choices"][0]["delta"].get("content") or "" for e in events[1:-1]) == "Hello! How"
    else:
        assert "".join(e["choices"][0]["text"] for e in events[:-1]) == " one two three"
    request_sent = sent_with(fake, "HOLD_FIRST")[-1]
    assert request_sent.notify_admitted and not request_sent.return_prompt_token_ids


def test_a_stream_whose_engine_goes_silent_ends_with_a_timeout_event(fake):
    """No open socket that says nothing: a stream that gets no output for the request timeout
    ends with an error event and [DONE]."""
    with UvicornThread(build_app(ApiConfig(MODEL, fake.address, timeout_s=0.5))) as server:
        start = time.monotonic()
        events = sse_events(post(server.port, "/v1/completions", {"prompt": "GO_SILENT", "stream": True,
                                                                 "max_tokens": 50}))
    assert time.monotonic() - start < 5
    assert events[-1] == "[DONE]" and events[-2]["error"]["type"] == "timeout_error"
    assert "sent nothing" in events[-2]["error"]["message"]
    assert any(e.get("choices") and e["choices"][0]["text"] for e in events[:-2])  # it had started


def test_a_silent_tokenizer_gives_504_and_503_naming_its_address(tmp_path):
    address = f"ipc://{tmp_path}/silent.sock"
    config = ApiConfig(MODEL, address, timeout_s=0.3, info_timeout_s=0.2)
    silent = zmq.Context.instance().socket(zmq.ROUTER)  # takes the connection, never answers
    silent.linger = 0
    silent.bind(address)
    with contextlib.closing(silent), UvicornThread(build_app(config)) as server:
        assert_error(post(server.port, "/v1/completions", {"prompt": "x"}), 504, None,
                     f"the tokenizer at {address} sent nothing", "timeout_error")
        # A streamed call waits for its admission, not for its first token; neither comes here.
        assert_error(post(server.port, "/v1/completions", {"prompt": "x", "stream": True}), 504, None,
                     f"the tokenizer at {address} did not admit request(s)", "timeout_error")
        health = get(server.port, "/health")
        assert health.status == 503 and address in health.json()["reason"]
        assert get(server.port, "/metrics").status == 200  # the api's own metrics still scrape


# --- auth and limits ------------------------------------------------------------------------------


def test_api_key_and_body_limit(fake):
    config = ApiConfig(MODEL, fake.address, api_key="sekret", max_body_bytes=2048)
    with UvicornThread(build_app(config)) as server:
        missing = get(server.port, "/v1/models")
        assert_error(missing, 401, None, "missing Authorization header", "authentication_error")
        assert missing.headers["www-authenticate"] == "Bearer"
        wrong = post(server.port, "/v1/completions", {"prompt": "x"},
                     headers={"Authorization": "Bearer nope"})
        assert_error(wrong, 401, None, "invalid API key", "authentication_error")
        right = {"Authorization": "Bearer sekret"}
        assert get(server.port, "/v1/models", headers=right).status == 200
        small = post(server.port, "/v1/completions", {"prompt": "x", "max_tokens": 1}, headers=right)
        assert small.status == 200
        assert get(server.port, "/health").status == 200 and get(server.port, "/metrics").status == 200
        big = post(server.port, "/v1/completions", {"prompt": "x" * 4000}, headers=right)
        assert_error(big, 413, None, "the limit is 2048 bytes")
        chunks = iter([b'{"prompt": "', b"x" * 4000, b'"}'])  # no Content-Length: counted as it comes
        chunked = request(server.port, "POST", "/v1/completions", raw=chunks,
                          headers={**right, "Transfer-Encoding": "chunked"})
        assert_error(chunked, 413, None, "over the limit of 2048 bytes")


# --- clients that go away -------------------------------------------------------------------------


def open_raw_request(port: int, path: str, body: dict) -> socket.socket:
    data = orjson.dumps(body)
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(b"POST %s HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (path.encode(), len(data), data))
    return sock


def sent_with(fake, marker: str) -> list[GenerateRequest]:
    return [r for r in fake.of_type(GenerateRequest)
            if marker in (r.prompt or "") or any(marker in t.content for t in r.messages or [])]


@pytest.mark.parametrize("path, body, marker, enough", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "FOREVER stream-gone"}],
                              "stream": True, "max_tokens": 4000},
     "stream-gone", lambda got: got.count(b"data: ") >= 3),
    ("/v1/completions", {"prompt": "HOLD_FIRST held-gone", "stream": True, "max_tokens": 5}, "held-gone",
     lambda got: b"\r\n\r\n" in got),
], ids=["after three chunks", "before its first token"])
def test_a_streaming_client_that_disconnects_aborts_its_request(port, fake, path, body, marker, enough):
    """Also one that leaves while its prefill runs: its response started at admission, its first
    token is held here."""
    fake.release_held.clear()
    try:
        sock = open_raw_request(port, path, body)
        received = b""
        while not enough(received):
            chunk = sock.recv(65536)
            assert chunk, f"the server closed the connection after {received[:300]!r}"
            received += chunk
        assert received.startswith(b"HTTP/1.1 200")
        sock.close()
        (sent,) = sent_with(fake, marker)
        assert fake.wait_for(lambda: sent.request_id in [a.request_id for a in fake.of_type(AbortRequest)])
        assert fake.wait_for(lambda: fake.num_active == 0)
    finally:
        fake.release_held.set()


def test_a_waiting_client_that_disconnects_aborts_all_its_choices(port, fake):
    body = {"prompt": "FOREVER whole-gone", "n": 3, "max_tokens": 4000}
    sock = open_raw_request(port, "/v1/completions", body)
    assert fake.wait_for(lambda: len(sent_with(fake, "whole-gone")) == 3)
    time.sleep(0.05)
    sock.close()
    ids = sorted(r.request_id for r in sent_with(fake, "whole-gone"))
    assert fake.wait_for(lambda: sorted(a.request_id for a in fake.of_type(AbortRequest)
                                        if a.request_id in ids) == ids)
    assert fake.wait_for(lambda: fake.num_active == 0)


# --- metrics --------------------------------------------------------------------------------------


def test_metrics_parse_and_carry_engine_and_request_figures(port):
    post(port, "/v1/completions", {"prompt": "metrics", "max_tokens": 2})
    post(port, "/v1/completions", {"prompt": "metrics", "max_tokens": 2, "stream": True})
    reply = get(port, "/metrics")
    assert reply.status == 200 and reply.headers["content-type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(reply.body.decode())}

    def value(family, sample_name=None, **labels):
        (sample,) = [s for s in families[family].samples
                     if (sample_name is None or s.name == sample_name) and labels.items() <= s.labels.items()]
        return sample.value

    running = families["cadence:num_requests_running"]
    assert running.type == "gauge" and {s.labels["replica"] for s in running.samples} == {"0"}
    assert running.samples[0].labels["model_name"] == "qwen3-tiny"
    assert value("cadence:num_requests_running", replica="0") == 3
    assert value("cadence:num_requests_waiting", replica="0") == 2
    assert value("cadence:kv_cache_usage_perc", replica="0") == 0.25
    assert value("cadence:replica_up", replica="0") == 1 and value("cadence:replica_up", replica="1") == 0
    assert families["cadence:prompt_tokens"].type == "counter"
    assert value("cadence:prompt_tokens", "cadence:prompt_tokens_total", replica="0") == 1234
    assert value("cadence:generation_tokens", "cadence:generation_tokens_total", replica="0") == 5678
    assert value("cadence:prefix_cache_queries", "cadence:prefix_cache_queries_total", replica="0") == 1000
    assert value("cadence:prefix_cache_hits", "cadence:prefix_cache_hits_total", replica="0") == 400
    assert value("cadence:num_preemptions", "cadence:num_preemptions_total", replica="0") == 5
    assert value("cadence:step_execute_seconds", "cadence:step_execute_seconds_total", replica="0") == 2.5
    assert value("cadence:step_wait_seconds", "cadence:step_wait_seconds_total", replica="0") == 0.125
    assert value("cadence:step_wait_seconds", "cadence:step_wait_seconds_total", replica="1") == 0
    assert value("cadence:request_success", "cadence:request_success_total", finished_reason="length") >= 2
    for histogram in ("time_to_first_token_seconds", "inter_token_latency_seconds",
                      "e2e_request_latency_seconds"):
        family = families[f"cadence:{histogram}"]
        assert family.type == "histogram"
        assert value(f"cadence:{histogram}", f"cadence:{histogram}_count", model_name="qwen3-tiny") >= 2
    assert families["cadence:request_queue_time_seconds"].type == "histogram"
    queued = value("cadence:request_queue_time_seconds", "cadence:request_queue_time_seconds_count",
                   model_name="qwen3-tiny")
    assert queued >= 2  # the fake reports 0.25 s with each request's first token
    assert value("cadence:request_queue_time_seconds", "cadence:request_queue_time_seconds_sum",
                 model_name="qwen3-tiny") == 0.25 * queued
    assert not any(name.endswith("_created") for name in families)
