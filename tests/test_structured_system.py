"""Structured outputs end to end: the official openai client against the REST server over the real
processes (qwen3-tiny, random weights, the real Qwen vocabulary, on the CPU). A model with random
weights would write anything; every reply must still be what the request asked for: JSON its schema
accepts, tool calls of the offered tools, one of the choices. Run on a TP 2 replica (only rank 0
masks; async scheduling on) and on two replicas with a pool small enough to preempt (the executor
finds a recomputed request's state again by replaying its output)."""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor

import pytest
from api_http import UvicornThread, get
from system_client import tiny_config
from test_structured_ebnf import SQL as SQL_GRAMMAR

from api.protocol import ServedModel
from api.server import ApiConfig, build_app
from benchmarks.lib.schema_check import conforms
from procs.launcher import Launcher, LaunchOptions

openai = pytest.importorskip("openai")

PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 10},
    "mood": {"enum": ["happy", "sad", None]},
    "pets": {"type": "array", "items": {"type": "string", "maxLength": 5}, "maxItems": 3},
    "verified": {"type": "boolean"},
}, "required": ["name", "verified"]}
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                     "unit": {"enum": ["C", "F"]}}, "required": ["city", "unit"]}}}
CLOCK = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"]}}}
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}
USER = [{"role": "user", "content": "Describe a person."}]


def serve(config):
    with Launcher(config, LaunchOptions(served_model_name="tiny", startup_timeout_s=240)) as launcher:
        model = ServedModel("tiny", config.max_model_len, config.model.generation)
        api = ApiConfig(model, launcher.endpoints.tokenizer_frontend, timeout_s=120)
        with UvicornThread(build_app(api)) as server:
            url = f"http://127.0.0.1:{server.port}/v1"
            yield openai.OpenAI(base_url=url, api_key="x", max_retries=0), server.port


@pytest.fixture(scope="module")
def tp2():
    yield from serve(tiny_config(tp=2, max_model_len=1024))


@pytest.fixture(scope="module")
def tight():
    # 2 replicas of 8 pages of 16 tokens: eight requests of ~50 tokens each on one cannot all stay
    yield from serve(tiny_config(dp=2, num_pages=8, max_model_len=128, block_size=16))


def person(client, max_tokens: int = 300, **fields):
    return client.chat.completions.create(
        model="tiny", messages=USER, max_tokens=max_tokens,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}},
        **fields)


@pytest.mark.parametrize("sampling", [{"temperature": 0}, {"seed": 7}, {}],
                         ids=["greedy", "seeded", "defaults"])
def test_json_schema_replies_conform(tp2, sampling):
    client, _ = tp2
    reply = person(client, extra_body=NO_THINKING, **sampling)
    choice = reply.choices[0]
    assert choice.finish_reason == "stop", choice
    assert conforms(json.loads(choice.message.content), PERSON), choice.message.content


def test_json_mode_with_thinking_puts_the_json_after_the_reasoning(tp2):
    client, _ = tp2
    reply = client.chat.completions.create(model="tiny", messages=USER, max_tokens=300, seed=3,
                                           response_format={"type": "json_object"},
                                           stop=None, frequency_penalty=0.5)
    content = reply.choices[0].message.content or ""
    if reply.choices[0].finish_reason == "stop":  # the random model may think for all 300 tokens
        assert isinstance(json.loads(content), dict), content


def test_streamed_tool_choice_required_gives_calls_of_the_offered_tools(tp2):
    client, _ = tp2
    stream = client.chat.completions.create(model="tiny", messages=USER, max_tokens=400,
                                            tools=[WEATHER, CLOCK], tool_choice="required", stream=True,
                                            seed=11, extra_body=NO_THINKING)
    calls: dict[int, dict] = {}
    finish = None
    for chunk in stream:
        for delta in chunk.choices[0].delta.tool_calls or []:
            call = calls.setdefault(delta.index, {"name": "", "arguments": ""})
            call["name"] += delta.function.name or ""
            call["arguments"] += delta.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls" and calls
    tools = {"get_weather": WEATHER, "get_time": CLOCK}
    for call in calls.values():
        schema = tools[call["name"]]["function"]["parameters"]
        assert conforms(json.loads(call["arguments"]), schema), call


def test_a_named_function_is_the_one_called_once(tp2):
    client, _ = tp2
    reply = client.chat.completions.create(
        model="tiny", messages=USER, max_tokens=400, tools=[WEATHER, CLOCK], parallel_tool_calls=False,
        tool_choice={"type": "function", "function": {"name": "get_time"}}, temperature=0,
        extra_body=NO_THINKING)
    calls = reply.choices[0].message.tool_calls
    assert len(calls) == 1 and calls[0].function.name == "get_time"
    assert json.loads(calls[0].function.arguments)["zone"] in ("UTC", "CET")


def test_guided_choice_on_completions_with_n(tp2):
    client, _ = tp2
    reply = client.completions.create(model="tiny", prompt="The answer is", max_tokens=10, n=6, seed=1,
                                      extra_body={"guided_choice": ["yes", "no", "maybe so"]})
    assert {c.text for c in reply.choices} <= {"yes", "no", "maybe so"}
    assert all(c.finish_reason == "stop" for c in reply.choices)


def test_structured_and_free_requests_share_steps(tp2):
    client, _ = tp2

    def one(i: int):
        if i % 2:
            return "free", client.completions.create(model="tiny", prompt=f"Story {i}", max_tokens=20, seed=i)
        return "json", person(client, seed=i, extra_body=NO_THINKING)

    with ThreadPoolExecutor(16) as pool:
        replies = list(pool.map(one, range(16)))
    for kind, reply in replies:
        if kind == "free":
            assert reply.usage.completion_tokens == 20
        else:
            assert conforms(json.loads(reply.choices[0].message.content), PERSON)


def test_an_unenforceable_schema_is_refused_and_the_server_serves_on(tp2):
    client, _ = tp2
    bad = {"type": "object", "properties": {"n": {"type": "number", "multipleOf": 0.5}}}
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="tiny", messages=USER, max_tokens=5, response_format={
            "type": "json_schema", "json_schema": {"name": "n", "schema": bad}})
    assert "multipleOf" in str(info.value) and "properties.n" in str(info.value)
    assert person(client, temperature=0, extra_body=NO_THINKING).choices[0].finish_reason == "stop"


def test_bounded_numbers_and_formats_come_back_within_them(tp2):
    """A schema with integer ranges (as pydantic writes conint(ge=..., le=...)), number ranges with
    whole and fractional bounds (confloat(ge=0, le=1), confloat(gt=0.25, le=0.75)) and a date and a
    uuid field, sampled, n=3."""
    client, _ = tp2
    schema = {"type": "object", "properties": {
        "month": {"type": "integer", "minimum": 1, "maximum": 12},
        "count": {"type": "integer", "exclusiveMinimum": -3, "exclusiveMaximum": 1000},
        "on": {"type": "string", "format": "date"}, "id": {"type": "string", "format": "uuid"},
        "share": {"type": "number", "minimum": 0, "maximum": 1},
        "ratio": {"type": "number", "exclusiveMinimum": 0.25, "maximum": 0.75},
    }, "required": ["month", "count", "on", "id", "share", "ratio"]}
    reply = client.chat.completions.create(
        model="tiny", messages=USER, max_tokens=120, n=3, temperature=1.0, seed=3, extra_body=NO_THINKING,
        response_format={"type": "json_schema", "json_schema": {"name": "when", "schema": schema}})
    for choice in reply.choices:
        assert choice.finish_reason == "stop"
        value = json.loads(choice.message.content)
        assert conforms(value, schema) and 1 <= value["month"] <= 12 and -3 < value["count"] < 1000, value
        assert 0 <= value["share"] <= 1 and 0.25 < value["ratio"] <= 0.75, value


def test_preempted_structured_requests_still_conform(tight):
    client, port = tight
    with ThreadPoolExecutor(16) as pool:
        replies = list(pool.map(lambda i: person(client, 100, seed=i, extra_body=NO_THINKING), range(16)))
    for reply in replies:
        assert reply.choices[0].finish_reason == "stop"
        assert conforms(json.loads(reply.choices[0].message.content), PERSON)
    metrics = get(port, "/metrics").body.decode()
    preemptions = sum(float(line.split()[-1]) for line in metrics.splitlines()
                      if line.startswith("cadence:num_preemptions"))
    assert preemptions > 0, "the pool was meant to be too small for all sixteen at once"


def test_guided_regex_and_a_schema_pattern(tp2):
    client, _ = tp2
    reply = client.completions.create(model="tiny", prompt="Answer:", max_tokens=40, n=3, seed=2,
                                      extra_body={"guided_regex": r"(yes|no), [a-z]{1,8}\."})
    for choice in reply.choices:
        assert choice.finish_reason == "stop" and re.fullmatch(r"(yes|no), [a-z]{1,8}\.", choice.text), choice
    coded = {"type": "object", "properties": {"code": {"type": "string", "pattern": r"^[A-Z]{2}-\d{3}$"}},
             "required": ["code"]}
    reply = client.chat.completions.create(
        model="tiny", messages=USER, max_tokens=200, temperature=0, extra_body=NO_THINKING,
        response_format={"type": "json_schema", "json_schema": {"name": "coded", "schema": coded}})
    assert conforms(json.loads(reply.choices[0].message.content), coded), reply.choices[0].message.content


@pytest.mark.parametrize("sampling", [{"temperature": 0}, {"seed": 5}], ids=["greedy", "seeded"])
def test_a_continued_final_message_and_its_continuation_make_one_conforming_reply(tp2, sampling):
    client, _ = tp2
    written = '{"name": "Ada'
    reply = client.chat.completions.create(
        model="tiny", messages=[*USER, {"role": "assistant", "content": written}], max_tokens=300,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}},
        extra_body={"continue_final_message": True, "add_generation_prompt": False}, **sampling)
    choice = reply.choices[0]
    assert choice.finish_reason == "stop", choice
    whole = written + choice.message.content
    assert conforms(json.loads(whole), PERSON), whole
    assert json.loads(whole)["name"].startswith("Ada")
    with pytest.raises(openai.BadRequestError) as info:  # a beginning the schema cannot have
        client.chat.completions.create(
            model="tiny", messages=[*USER, {"role": "assistant", "content": '{"age": 3'}], max_tokens=10,
            response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}},
            extra_body={"continue_final_message": True, "add_generation_prompt": False})
    assert "continue_final_message" in str(info.value)


def test_disable_any_whitespace_gives_compact_json(tp2):
    client, _ = tp2
    reply = client.completions.create(
        model="tiny", prompt="A person as JSON:", max_tokens=300, seed=4,
        extra_body={"structured_outputs": {"json": PERSON, "disable_any_whitespace": True}})
    text = reply.choices[0].text
    assert reply.choices[0].finish_reason == "stop" and conforms(json.loads(text), PERSON), text
    outside_strings = re.sub(r'"(?:[^"\\]|\\.)*"', '""', text)
    assert not re.search(r"\s", outside_strings), text


SQL_TEXT = r"SELECT col_[12]  from table_[12]  where col_[12] = [12] "


def test_guided_grammar_replies_are_what_the_grammar_derives(tp2):
    """vLLM's structured-output benchmark's SQL grammar, through guided_grammar and
    structured_outputs.grammar; a grammar that cannot be enforced gets a 400 and the server serves on."""
    client, _ = tp2
    reply = client.completions.create(model="tiny", prompt="SQL:", max_tokens=60, n=3, seed=3,
                                      extra_body={"guided_grammar": SQL_GRAMMAR})
    for choice in reply.choices:
        assert choice.finish_reason == "stop" and re.fullmatch(SQL_TEXT, choice.text), choice
    reply = client.chat.completions.create(
        model="tiny", messages=USER, max_tokens=60, temperature=0,
        extra_body={**NO_THINKING, "structured_outputs": {"grammar": SQL_GRAMMAR}})
    assert re.fullmatch(SQL_TEXT, reply.choices[0].message.content), reply.choices[0].message.content
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="tiny", prompt="SQL:", max_tokens=10,
                                  extra_body={"guided_grammar": 'expr ::= expr "+" "1" | "1"\nroot ::= expr'})
    assert "left-recursive" in str(info.value) and "guided_grammar" in str(info.value)
    again = client.completions.create(model="tiny", prompt="SQL:", max_tokens=60, temperature=0,
                                      extra_body={"guided_grammar": SQL_GRAMMAR})
    assert re.fullmatch(SQL_TEXT, again.choices[0].text), again.choices[0].text
