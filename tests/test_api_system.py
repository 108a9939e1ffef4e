"""The API over the real system: the launcher's tokenizer, scheduler and executor processes on the
CPU (qwen3-tiny, dummy weights, the built-in Qwen vocabulary), the REST server and the native
client side by side on the same tokenizer."""

from __future__ import annotations

import socket
import time
from dataclasses import replace

import orjson
import pytest
from api_http import UvicornThread, get, post, sse_events
from free_ports import free_tcp_address
from prometheus_client.parser import text_string_to_metric_families

from api.client import Client, ClientError
from api.protocol import ServedModel
from api.server import ApiConfig, build_app
from core.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from core.sampling_params import SamplingParams
from core.tokenizer import load_tokenizer
from core.tokenizer.chat_template import render_chatml
from ipc.messages import ChatTurn
from procs.launcher import Launcher, LaunchOptions

MAX_MODEL_LEN = 512
HELLO = [{"role": "user", "content": "Say hello."}]


KEY = "native key"


@pytest.fixture(scope="module")
def system():
    """The REST server on the tokenizer's ipc address; native clients over loopback tcp with KEY,
    which the front end requires of every client once it listens on tcp (the REST server's too)."""
    config = EngineConfig(model=ModelConfig.from_name("qwen3-tiny"), cache=CacheConfig(num_pages=256),
                          scheduler=SchedulerConfig(max_model_len=MAX_MODEL_LEN, max_num_seqs=32,
                                                    max_num_batched_tokens=256), device="cpu")
    tcp = free_tcp_address()
    options = LaunchOptions(served_model_name="tiny", startup_timeout_s=180, native_tcp=tcp,
                            native_api_key=KEY)
    with Launcher(config, options) as launcher:
        address = launcher.endpoints.tokenizer_frontend
        model = ServedModel("tiny", config.max_model_len, config.model.generation)
        api = ApiConfig(model, address, timeout_s=60, tokenizer_api_key=KEY)
        with UvicornThread(build_app(api)) as server:
            yield server.port, tcp


def stream_then_disconnect(port: int, body: dict, num_events: int) -> bytes:
    """POST a streaming completion, read `num_events` SSE events, hang up; returns what came."""
    data = orjson.dumps(body)
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(data), data))
        received = b""
        while received.count(b"data: ") < num_events:
            chunk = sock.recv(65536)
            assert chunk, f"the server closed the connection after {received[:300]!r}"
            received += chunk
    return received


def metric(port: int, family: str, sample: str | None = None) -> float:
    families = {f.name: f for f in text_string_to_metric_families(get(port, "/metrics").body.decode())}
    return sum(s.value for s in families[family].samples if sample is None or s.name == sample)


def test_chat_usage_counts_the_real_tokens(system):
    port, _ = system
    reply = post(port, "/v1/chat/completions", {"model": "tiny", "messages": HELLO, "max_tokens": 4,
                                                "temperature": 0})
    assert reply.status == 200, reply
    body = reply.json()
    tokenizer = load_tokenizer(None)
    num_prompt = len(tokenizer.encode(render_chatml(HELLO)))
    assert body["usage"]["prompt_tokens"] == num_prompt and body["usage"]["completion_tokens"] == 4
    assert body["choices"][0]["finish_reason"] == "length"
    assert get(port, "/health").status == 200


def test_tools_reach_the_prompt_through_the_tokenizer_process(system):
    port, _ = system
    tools = [{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}]
    earlier_call = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]}
    messages = [*HELLO, earlier_call, {"role": "tool", "tool_call_id": "c1", "content": "noon"}]
    reply = post(port, "/v1/chat/completions", {"model": "tiny", "messages": messages, "tools": tools,
                                                "max_tokens": 2, "temperature": 0})
    assert reply.status == 200, reply
    expected = load_tokenizer(None).encode(render_chatml(messages, tools=tools))
    assert reply.json()["usage"]["prompt_tokens"] == len(expected)
    assert reply.json()["choices"][0]["finish_reason"] == "length"  # random weights call nothing


def test_streamed_greedy_text_equals_whole_and_the_native_clients(system):
    port, address = system
    body = {"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}
    whole = post(port, "/v1/completions", body).json()["choices"][0]
    events = sse_events(post(port, "/v1/completions", {**body, "stream": True}))
    assert events[-1] == "[DONE]"
    assert "".join(e["choices"][0]["text"] for e in events[:-1]) == whole["text"]
    with Client(address, timeout_s=60, api_key=KEY) as client:
        (native,) = client.generate([body["prompt"]], SamplingParams(max_tokens=8, temperature=0))
    assert native.text == whole["text"] and native.finish_reason == whole["finish_reason"] == "length"


def test_a_native_batch_and_a_context_refusal(system):
    _, address = system
    with Client(address, timeout_s=60, api_key=KEY) as client:
        results = client.generate([f"Count to {i}:" for i in range(20)], SamplingParams(max_tokens=3))
        too_long = client.generate([list(range(1, MAX_MODEL_LEN + 1))], SamplingParams(max_tokens=3))[0]
    assert all(r.ok and r.num_output_tokens == 3 for r in results)
    assert too_long.refused is not None and f"maximum context length is {MAX_MODEL_LEN}" in too_long.error


def test_a_default_max_tokens_runs_to_the_context_length(system):
    port, _ = system
    prompt = list(range(100, 100 + MAX_MODEL_LEN - 5))
    choice = post(port, "/v1/completions", {"prompt": prompt}).json()
    assert choice["usage"]["completion_tokens"] == 5 and choice["choices"][0]["finish_reason"] == "length"


def test_a_disconnected_stream_frees_the_engine(system):
    port, _ = system

    def generated() -> float:
        return metric(port, "cadence:generation_tokens", "cadence:generation_tokens_total")

    before = generated()
    stream_then_disconnect(port, {"prompt": "Tell a long story.", "max_tokens": 400, "stream": True}, 3)
    # idle = nothing running and the generated-token count standing still
    last, deadline = -1.0, time.monotonic() + 15
    while time.monotonic() < deadline:
        time.sleep(0.3)
        now = generated()
        if now == last and metric(port, "cadence:num_requests_running") == 0:
            break
        last = now
    assert metric(port, "cadence:num_requests_running") == 0
    assert 2 <= generated() - before < 400  # aborted mid-way, not run to max_tokens


def test_a_default_max_tokens_is_exactly_the_room_a_multi_byte_prompt_leaves(system):
    # Several UTF-8 bytes per token: the byte count is past the context, the token count is not.
    port, _ = system
    tokenizer = load_tokenizer(None)
    prompt = "世界" * (MAX_MODEL_LEN - 8)
    num_prompt = len(tokenizer.encode(prompt))
    assert len(prompt.encode()) > MAX_MODEL_LEN and MAX_MODEL_LEN - 12 <= num_prompt < MAX_MODEL_LEN
    body = post(port, "/v1/completions", {"prompt": prompt, "ignore_eos": True, "temperature": 0}).json()
    assert body["usage"]["prompt_tokens"] == num_prompt
    assert body["usage"]["completion_tokens"] == MAX_MODEL_LEN - num_prompt
    assert body["choices"][0]["finish_reason"] == "length"


def test_an_earlier_turns_reasoning_content_is_left_out_by_the_template(system):
    _, address = system
    chat = [ChatTurn("user", "What is 2+2?"), ChatTurn("assistant", "4", reasoning_content="Add them."),
            ChatTurn("user", "And 3+3?")]
    with Client(address, timeout_s=60, api_key=KEY) as client:
        (result,) = client.generate([chat], SamplingParams(max_tokens=1), detokenize=False)
    assert result.ok, result
    assert load_tokenizer(None).decode(result.prompt_token_ids) == (
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n"
        "<|im_start|>user\nAnd 3+3?<|im_end|>\n<|im_start|>assistant\n")


def test_native_clients_over_tcp_with_a_wrong_key_or_none_are_refused(system):
    _, address = system
    for key in ("wrong", None):
        with Client(address, timeout_s=60, api_key=key) as client, pytest.raises(ClientError) as info:
            client.generate(["Hello"], SamplingParams(max_tokens=2))
        assert "refused" in str(info.value)


def test_echo_with_logprobs_scores_the_prompt_through_the_system(system):
    port, address = system
    prompt = "The capital of France is"
    body = {"model": "tiny", "prompt": prompt, "echo": True, "logprobs": 2, "temperature": 0}
    only = post(port, "/v1/completions", {**body, "max_tokens": 0}).json()["choices"][0]
    one = post(port, "/v1/completions", {**body, "max_tokens": 1}).json()["choices"][0]
    assert only["text"] == prompt and one["text"].startswith(prompt) and len(one["text"]) > len(prompt)
    scored = only["logprobs"]
    assert "".join(scored["tokens"]) == prompt and scored["token_logprobs"][0] is None
    assert all(lp <= 0 for lp in scored["token_logprobs"][1:]) and scored["top_logprobs"][0] is None
    assert all(2 <= len(top) <= 3 for top in scored["top_logprobs"][1:])
    num_prompt = len(scored["tokens"])
    assert one["logprobs"]["tokens"][:num_prompt] == scored["tokens"]
    assert one["logprobs"]["token_logprobs"][1:num_prompt] == pytest.approx(scored["token_logprobs"][1:],
                                                                             abs=1e-4)
    assert len(one["logprobs"]["tokens"]) == num_prompt + 1
    with Client(address, timeout_s=60, api_key=KEY) as client:
        (native,) = client.generate([prompt], SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=0))
    assert native.prompt_logprobs.tokens == scored["tokens"]
    assert native.prompt_logprobs.logprobs[1:] == pytest.approx(scored["token_logprobs"][1:], abs=1e-4)
    assert native.prompt_logprobs.ranks[0] is None and min(native.prompt_logprobs.ranks[1:]) >= 1


def test_tokenize_counts_what_the_completions_serve_and_detokenize_inverts_it(system):
    port, _ = system
    prompt = "The capital of France is Paris. 東京"
    tokens = post(port, "/tokenize", {"model": "tiny", "prompt": prompt, "return_token_strs": True}).json()
    assert tokens["tokens"] == load_tokenizer(None).encode(prompt)
    assert tokens["count"] == len(tokens["tokens"])
    assert tokens["max_model_len"] == MAX_MODEL_LEN and len(tokens["token_strs"]) == tokens["count"]
    served = post(port, "/v1/completions", {"model": "tiny", "prompt": prompt, "max_tokens": 1}).json()
    assert served["usage"]["prompt_tokens"] == tokens["count"]
    assert post(port, "/detokenize", {"tokens": tokens["tokens"]}).json() == {"prompt": prompt}
    assert post(port, "/detokenize", {"tokens": []}).json() == {"prompt": ""}
    assert post(port, "/tokenize", {"prompt": prompt}).json()["token_strs"] is None


def test_tokenize_a_chat_counts_the_chat_completions_prompt(system):
    port, _ = system
    tools = [{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}]
    for extra in ({}, {"tools": tools}, {"chat_template_kwargs": {"enable_thinking": False}},
                  {"add_generation_prompt": False}):
        counted = post(port, "/tokenize", {"messages": HELLO, **extra}).json()
        served = post(port, "/v1/chat/completions", {"messages": HELLO, "max_tokens": 1, **extra}).json()
        assert counted["count"] == served["usage"]["prompt_tokens"], extra


def test_a_developer_message_is_rendered_as_a_system_one(system):
    """OpenAI's developer role (coding agents send it to reasoning models) is the system role."""
    port, _ = system
    tools = [{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}]
    for extra in ({}, {"tools": tools}):
        ids = {role: post(port, "/tokenize", {"messages": [{"role": role, "content": "Be brief."}, *HELLO],
                                              **extra}).json()["tokens"]
               for role in ("developer", "system")}
        assert ids["developer"] == ids["system"], extra
        system_turn = load_tokenizer(None).encode("<|im_start|>system\n")
        assert ids["system"][:len(system_turn)] == system_turn
        body = {"messages": [{"role": "developer", "content": "Be brief."}, *HELLO], "max_tokens": 1, **extra}
        reply = post(port, "/v1/chat/completions", body).json()
        assert reply["usage"]["prompt_tokens"] == len(ids["system"])


def test_responses_and_messages_calls_run_through_the_engine_as_their_chat_completion(system):
    """/v1/responses and /v1/messages: the prompt is the chat's as /tokenize counts it, the greedy
    reply the chat completion's, cut by the token limit as each API says."""
    port, _ = system
    messages = [{"role": "system", "content": "Be brief."}, *HELLO]
    counted = post(port, "/tokenize", {"messages": messages}).json()["count"]
    chat = post(port, "/v1/chat/completions", {"messages": messages, "max_tokens": 4,
                                               "temperature": 0}).json()["choices"][0]["message"]
    expected = [t for t in (chat["reasoning_content"], chat["content"]) if t]
    reply = post(port, "/v1/responses", {"input": HELLO, "instructions": "Be brief.", "max_output_tokens": 4,
                                         "temperature": 0}).json()
    assert reply["status"] == "incomplete" and reply["incomplete_details"] == {"reason": "max_output_tokens"}
    assert reply["usage"]["input_tokens"] == counted and reply["usage"]["output_tokens"] == 4
    assert [part["text"] for item in reply["output"] for part in item.get("content", [])] == expected
    message = post(port, "/v1/messages", {"messages": HELLO, "system": "Be brief.", "max_tokens": 4,
                                          "temperature": 0}).json()
    assert message["type"] == "message" and message["stop_reason"] == "max_tokens"
    usage = message["usage"]
    assert usage["input_tokens"] + usage["cache_read_input_tokens"] == counted and usage["output_tokens"] == 4
    assert [block.get("thinking", block.get("text")) for block in message["content"]] == expected


def test_messages_count_tokens_is_the_prompt_a_messages_call_runs(system):
    """/v1/messages/count_tokens through the official anthropic client: the count of a conversation
    (with a system prompt, tools, thinking on and off) is what /v1/messages then reports as its
    input; a bad body gets Anthropic's error object."""
    anthropic = pytest.importorskip("anthropic")
    port, _ = system
    client = anthropic.Anthropic(base_url=f"http://127.0.0.1:{port}", api_key="none", max_retries=0)
    tools = [{"name": "get_time", "description": "The time", "input_schema": {"type": "object"}}]
    for extra in ({}, {"tools": tools}, {"tools": tools, "thinking": {"type": "disabled"}}):
        counted = client.messages.count_tokens(model="tiny", messages=HELLO, system="Be brief.", **extra)
        message = client.messages.create(model="tiny", messages=HELLO, system="Be brief.", max_tokens=1,
                                         **extra)
        assert counted.input_tokens == message.usage.input_tokens + message.usage.cache_read_input_tokens
    plain = client.messages.count_tokens(model="tiny", messages=HELLO).input_tokens
    assert plain == post(port, "/tokenize", {"messages": HELLO}).json()["count"]
    with_max = post(port, "/v1/messages/count_tokens",
                    {"model": "tiny", "messages": HELLO, "max_tokens": "x"})
    assert with_max.json() == {"input_tokens": plain}  # not a field of this route: ignored
    with pytest.raises(anthropic.BadRequestError, match="non-empty array of messages"):
        client.messages.count_tokens(model="tiny", messages=[])
    with pytest.raises(anthropic.NotFoundError, match="does not exist"):
        client.messages.count_tokens(model="claude-nonexistent", messages=HELLO)


def test_return_token_ids_are_the_tokenizers_prompt_and_the_sampled_tokens(system):
    """vLLM's return_token_ids through the real processes: a chat's prompt ids are what /tokenize
    renders for its messages, a greedy stream's token ids join to the whole reply's, and they
    detokenize to its text."""
    port, _ = system
    body = {"messages": HELLO, "max_tokens": 6, "temperature": 0, "return_token_ids": True,
            "chat_template_kwargs": {"enable_thinking": False}}
    whole = post(port, "/v1/chat/completions", body).json()
    no_thinking = {"chat_template_kwargs": body["chat_template_kwargs"]}
    rendered = post(port, "/tokenize", {"messages": HELLO, **no_thinking}).json()
    assert whole["prompt_token_ids"] == rendered["tokens"]
    ids = whole["choices"][0]["token_ids"]
    assert len(ids) == whole["usage"]["completion_tokens"] == 6
    events = sse_events(post(port, "/v1/chat/completions", {**body, "stream": True}))[:-1]
    assert events[0]["prompt_token_ids"] == whole["prompt_token_ids"]
    assert [t for e in events for t in e["choices"][0].get("token_ids", [])] == ids
    text = post(port, "/detokenize", {"tokens": ids}).json()["prompt"]
    assert text == whole["choices"][0]["message"]["content"]


def test_tokenizer_info_names_the_special_tokens_and_bad_bodies_name_their_field(system):
    port, _ = system
    info = get(port, "/tokenizer_info").json()
    assert info["eos_token"] == "<|im_end|>" and info["model_max_length"] == MAX_MODEL_LEN
    assert info["chat_template"] is None and info["vocab_size"] == 151936  # the built-in vocabulary
    refusals = [("/tokenize", {}, "prompt"), ("/tokenize", {"prompt": "a", "messages": HELLO}, "prompt"),
                ("/tokenize", {"prompt": 5}, "prompt"), ("/tokenize", {"messages": []}, "messages"),
                ("/tokenize", {"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
                ("/detokenize", {}, "tokens"), ("/detokenize", {"tokens": [1, -2]}, "tokens"),
                ("/detokenize", {"tokens": "12"}, "tokens"), ("/detokenize", {"tokens": [10**9]}, "tokens")]
    for path, body, field in refusals:
        reply = post(port, path, body)
        assert reply.status == 400 and reply.json()["error"]["param"] == field, (path, body, reply.json())
    assert post(port, "/tokenize", {"model": "other", "prompt": "a"}).status == 404
    too_big = post(port, "/detokenize", {"tokens": [10**9]}).json()["error"]["message"]
    assert "outside the model's vocabulary" in too_big
    assert get(port, "/health").status == 200  # and the server serves on


def test_continue_final_message_prefills_the_answer(system):
    port, _ = system
    chat = [*HELLO, {"role": "assistant", "content": "Hello! My name is"}]
    body = {"messages": chat, "add_generation_prompt": False, "continue_final_message": True}
    served = post(port, "/v1/chat/completions", {**body, "max_tokens": 3, "temperature": 0})
    assert served.status == 200, served
    expected = load_tokenizer(None).encode(render_chatml(chat, False, continue_final_message=True))
    assert served.json()["usage"]["prompt_tokens"] == len(expected)
    assert post(port, "/tokenize", body).json()["tokens"] == expected
    both = post(port, "/v1/chat/completions", {**body, "add_generation_prompt": True})
    assert both.status == 400 and both.json()["error"]["param"] == "continue_final_message"
    not_assistant = post(port, "/tokenize", {**body, "messages": HELLO})
    assert not_assistant.status == 400 and not_assistant.json()["error"]["param"] == "messages"


def test_logit_bias_steers_the_real_sampler_and_an_unknown_token_is_refused(system):
    port, address = system
    body = {"model": "tiny", "prompt": "Once upon a time", "max_tokens": 4, "temperature": 0, "logprobs": 1}
    forced = post(port, "/v1/completions", {**body, "logit_bias": {"1000": 100}}).json()["choices"][0]
    assert forced["logprobs"]["tokens"] == [load_tokenizer(None).decode([1000])] * 4
    assert forced["logprobs"]["token_logprobs"][0] < -1.0  # the logprobs stay the model's own
    refused = post(port, "/v1/completions", {**body, "logit_bias": {str(10**6): 5}})
    assert refused.status == 400 and refused.json()["error"]["param"] == "logit_bias"
    greedy = SamplingParams(max_tokens=4, temperature=0)
    with Client(address, timeout_s=60, api_key=KEY) as client:  # async scheduling on: placeholder rows
        (plain,) = client.generate(["Once upon a time"], greedy)
        ban = ((plain.token_ids[0], -100.0),)
        (banned,) = client.generate(["Once upon a time"], replace(greedy, logit_bias=ban))
        seeded = replace(greedy, temperature=0.7, seed=1, logit_bias=((1000, 100.0),))
        (sampled,) = client.generate(["Once upon a time"], seeded)
    assert banned.token_ids[0] != plain.token_ids[0] and sampled.token_ids == [1000] * 4


def test_min_tokens_keeps_the_end_token_from_being_drawn_until_they_are_out(system):
    port, _ = system
    eos = load_tokenizer(None).eos_token_ids[0]
    body = {"model": "tiny", "prompt": "Once upon a time", "max_tokens": 10, "temperature": 0,
            "logit_bias": {str(eos): 100}, "skip_special_tokens": False}
    ended = post(port, "/v1/completions", body).json()
    assert ended["usage"]["completion_tokens"] == 1 and ended["choices"][0]["finish_reason"] == "stop"
    held = post(port, "/v1/completions", {**body, "min_tokens": 3}).json()
    # three tokens of text, none of them the end token the bias favours, then the end
    assert held["usage"]["completion_tokens"] == 4 and held["choices"][0]["finish_reason"] == "stop"
    end = load_tokenizer(None).decode([eos])
    assert end not in held["choices"][0]["text"].removesuffix(end)


def test_the_openai_client_sends_logit_bias_and_continue_final_message_unmodified(system):
    openai = pytest.importorskip("openai")
    port, _ = system
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)
    forced = client.completions.create(model="tiny", prompt="Once upon a time", max_tokens=3, temperature=0,
                                       logit_bias={"1000": 100}, logprobs=0)
    assert forced.choices[0].logprobs.tokens == [load_tokenizer(None).decode([1000])] * 3
    chat = [*HELLO, {"role": "assistant", "content": "Hello! My name is"}]
    reply = client.chat.completions.create(
        model="tiny", messages=chat, max_tokens=2, temperature=0,
        extra_body={"continue_final_message": True, "add_generation_prompt": False})
    expected = load_tokenizer(None).encode(render_chatml(chat, False, continue_final_message=True))
    assert reply.usage.prompt_tokens == len(expected)
    with pytest.raises(openai.BadRequestError, match="logit_bias"):
        client.chat.completions.create(model="tiny", messages=HELLO, logit_bias={"5": 500})


def test_truncate_prompt_tokens_keeps_the_prompts_tail_and_stop_strings_can_stay(system):
    port, _ = system
    prompt = "one two three four five six seven eight nine ten"
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 8, "temperature": 0}
    tail = post(port, "/v1/completions", {**body, "truncate_prompt_tokens": 3}).json()
    assert tail["usage"]["prompt_tokens"] == 3
    last_three = load_tokenizer(None).encode(prompt)[-3:]
    alone = post(port, "/v1/completions", {**body, "prompt": last_three}).json()
    assert tail["choices"][0]["text"] == alone["choices"][0]["text"]  # greedy: the same prompt
    long_prompt = list(range(1000, 1000 + MAX_MODEL_LEN + 50))
    fitted = post(port, "/v1/completions", {**body, "prompt": long_prompt, "max_tokens": 1,
                                            "truncate_prompt_tokens": -1})
    assert fitted.status == 200 and fitted.json()["usage"]["prompt_tokens"] == MAX_MODEL_LEN - 1
    text = alone["choices"][0]["text"]
    stop = next(c for c in text[1:] if not c.isspace())  # a character the greedy text has after its first
    cut = post(port, "/v1/completions", {**body, "prompt": last_three, "stop": [stop]}).json()["choices"][0]
    kept = post(port, "/v1/completions", {**body, "prompt": last_three, "stop": [stop],
                                          "include_stop_str_in_output": True}).json()["choices"][0]
    assert cut["text"] == text[:text.index(stop)] and kept["text"] == cut["text"] + stop
    assert kept["finish_reason"] == cut["finish_reason"] == "stop"
