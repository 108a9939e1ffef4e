"""The official `openai` Python client against api/server.py (a real uvicorn on loopback, the fake
tokenizer behind it), as a user of the ecosystem's tools would call it: models.retrieve, vLLM's
extra fields through `extra_body`, per-chunk usage, and the SGLang runtime's model-info route that
routers ask for."""

from __future__ import annotations

import pytest
from api_fake_tokenizer import COMPLETION_REPLY, FakeTokenizer
from api_http import UvicornThread, get

from api.protocol import ServedModel
from api.server import ApiConfig, build_app
from core.generation_defaults import QWEN3_GENERATION_DEFAULTS

openai = pytest.importorskip("openai")

MODEL = ServedModel("qwen3-tiny", 4096, QWEN3_GENERATION_DEFAULTS)


@pytest.fixture(scope="module")
def servers():
    """One lenient server (the default) and one with strict request fields, on one fake tokenizer."""
    with FakeTokenizer() as fake, \
            UvicornThread(build_app(ApiConfig(MODEL, fake.address, timeout_s=10))) as lenient, \
            UvicornThread(build_app(ApiConfig(MODEL, fake.address, timeout_s=10,
                                              strict_request_fields=True))) as strict:
        yield lenient.port, strict.port


def client(port: int):
    return openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)


def test_models_retrieve_finds_the_served_model_and_404s_another(servers):
    api = client(servers[0])
    assert api.models.retrieve("qwen3-tiny").id == "qwen3-tiny"
    with pytest.raises(openai.NotFoundError):
        api.models.retrieve("gpt-4")


def test_unknown_fields_are_ignored_unless_the_server_is_strict(servers):
    lenient, strict = servers
    extra = {"no_stop_trim": False, "return_hidden_states": False}
    reply = client(lenient).completions.create(model="qwen3-tiny", prompt="hi", max_tokens=3,
                                               extra_body=extra)
    assert reply.choices[0].text == "".join(COMPLETION_REPLY[:3])
    with pytest.raises(openai.BadRequestError) as info:
        client(strict).completions.create(model="qwen3-tiny", prompt="hi", max_tokens=3, extra_body=extra)
    assert "no_stop_trim" in str(info.value)


def test_continuous_usage_stats_put_the_usage_so_far_in_every_chunk(servers):
    stream = client(servers[0]).completions.create(
        model="qwen3-tiny", prompt="hi", max_tokens=3, stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True})
    chunks = list(stream)
    with_text = [c for c in chunks if c.choices and c.choices[0].text]
    assert [c.usage.completion_tokens for c in with_text] == [1, 2, 3]
    assert all(c.usage.prompt_tokens == 2 for c in with_text)  # the fake's one token per character
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == 5


def test_chat_stream_with_include_usage_only_keeps_usage_for_the_last_chunk(servers):
    stream = client(servers[0]).chat.completions.create(
        model="qwen3-tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4, stream=True,
        stream_options={"include_usage": True})
    chunks = list(stream)
    assert all(c.usage is None for c in chunks[:-1])
    assert chunks[-1].usage.completion_tokens == 4


def test_the_sglang_model_info_route_names_the_served_model(servers):
    for path in ("/get_model_info", "/model_info", "/get_server_info", "/server_info"):
        info = get(servers[0], path).json()
        assert info["served_model_name"] == "qwen3-tiny"
        assert info["is_generation"] is True and info["max_model_len"] == 4096


def test_echo_puts_the_prompt_before_each_choice_whole_and_streamed(servers):
    api = client(servers[0])
    reply = api.completions.create(model="qwen3-tiny", prompt="Say:", max_tokens=2, n=2, echo=True)
    assert [c.text for c in reply.choices] == ["Say:" + "".join(COMPLETION_REPLY[:2])] * 2
    stream = api.completions.create(model="qwen3-tiny", prompt="Say:", max_tokens=2, echo=True, stream=True)
    assert "".join(c.choices[0].text for c in stream if c.choices) == "Say:" + "".join(COMPLETION_REPLY[:2])


def test_echo_with_logprobs_and_max_tokens_0_scores_the_prompt_alone(servers):
    reply = client(servers[0]).completions.create(model="qwen3-tiny", prompt="Say:", max_tokens=0, echo=True,
                                                  logprobs=1)
    choice = reply.choices[0]
    assert choice.text == "Say:" and choice.finish_reason == "length"
    assert choice.logprobs.tokens == ["S", "a", "y", ":"]
    assert choice.logprobs.token_logprobs == [None, -0.5, -1.0, -1.5]
    assert choice.logprobs.top_logprobs == [None, {"x": -0.1, "a": -0.5}, {"x": -0.1, "y": -1.0},
                                            {"x": -0.1, ":": -1.5}]
    assert choice.logprobs.text_offset == [0, 1, 2, 3]
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (4, 0)


def test_echo_with_logprobs_and_max_tokens_1_puts_the_prompt_before_the_token(servers):
    api = client(servers[0])
    reply = api.completions.create(model="qwen3-tiny", prompt="Say:", max_tokens=1, echo=True, logprobs=0)
    choice = reply.choices[0]
    assert choice.text == "Say:" + COMPLETION_REPLY[0]
    assert choice.logprobs.tokens == ["S", "a", "y", ":", COMPLETION_REPLY[0]]
    assert choice.logprobs.token_logprobs == [None, -0.5, -1.0, -1.5, -0.25]
    assert choice.logprobs.text_offset == [0, 1, 2, 3, 4]
    stream = list(api.completions.create(model="qwen3-tiny", prompt="Say:", max_tokens=1, echo=True,
                                         logprobs=0, stream=True))
    streamed = [c.choices[0] for c in stream if c.choices]
    assert "".join(c.text for c in streamed) == choice.text
    assert [t for c in streamed if c.logprobs for t in c.logprobs.tokens] == choice.logprobs.tokens


def test_prompt_logprobs_come_per_choice_the_vllm_way(servers):
    api = client(servers[0])
    reply = api.completions.create(model="qwen3-tiny", prompt="ab", max_tokens=1,
                                   extra_body={"prompt_logprobs": 1})
    entries = reply.choices[0].model_extra["prompt_logprobs"]
    assert entries == [None, {"7": {"logprob": -0.1, "rank": 1, "decoded_token": "x"},
                              str(ord("b")): {"logprob": -0.5, "rank": 1, "decoded_token": "b"}}]
    stream = list(api.completions.create(model="qwen3-tiny", prompt="ab", max_tokens=2, stream=True,
                                         extra_body={"prompt_logprobs": 1}))
    firsts = [c.choices[0].model_extra.get("prompt_logprobs") for c in stream if c.choices]
    assert firsts[0] == entries and all(f is None for f in firsts[1:])


def test_echo_of_a_token_id_prompt_echoes_its_decoded_text(servers):
    reply = client(servers[0]).completions.create(model="qwen3-tiny", prompt=[5, 6], max_tokens=1, echo=True)
    assert reply.choices[0].text == "<5><6>" + COMPLETION_REPLY[0]




def test_chat_prompt_logprobs_come_once_beside_the_choices_and_not_streamed(servers):
    api = client(servers[0])
    reply = api.chat.completions.create(model="qwen3-tiny", messages=[{"role": "user", "content": "ab"}],
                                        max_tokens=1, n=2, extra_body={"prompt_logprobs": 0})
    entries = reply.model_extra["prompt_logprobs"]
    assert entries[0] is None and len(entries) == reply.usage.prompt_tokens
    assert all(len(entry) == 1 and next(iter(entry.values()))["rank"] >= 1 for entry in entries[1:])
    assert all("prompt_logprobs" not in choice.model_extra for choice in reply.choices)
    with pytest.raises(openai.BadRequestError, match="prompt_logprobs"):
        api.chat.completions.create(model="qwen3-tiny", messages=[{"role": "user", "content": "ab"}],
                                    max_tokens=1, stream=True, extra_body={"prompt_logprobs": 0})


def test_return_token_ids_reach_the_official_client_as_extra_fields(servers):
    """vLLM's return_token_ids through `extra_body`, read as the client's extra fields (RL
    frameworks take them to skip re-tokenizing)."""
    api = client(servers[0])
    reply = api.completions.create(model="qwen3-tiny", prompt=[11, 12, 13], max_tokens=3,
                                   extra_body={"return_token_ids": True})
    choice = reply.choices[0].model_extra
    assert choice["prompt_token_ids"] == [11, 12, 13] and len(choice["token_ids"]) == 3
    stream = api.chat.completions.create(model="qwen3-tiny", messages=[{"role": "user", "content": "hi"}],
                                         max_tokens=4, stream=True, extra_body={"return_token_ids": True})
    chunks = list(stream)
    assert chunks[0].model_extra["prompt_token_ids"]  # the chat's rendered prompt, first chunk only
    assert sum(len(c.choices[0].model_extra.get("token_ids") or []) for c in chunks) == 4
