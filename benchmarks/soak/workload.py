"""The soak's calls: shot i of a seeded mix of good requests (completions and chats, and one in five
through OpenAI's Responses or Anthropic's Messages API, streamed and whole, short prompts and long
shared prefixes, greedy and sampled, n=2, stop strings, logit bias, structured outputs),
streams the client drops after a chunk or two (10 %), and bad requests the server must refuse (5 %).

benchmarks/soak/run.py fires them; benchmarks/soak/calls.py judges what comes back.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import orjson

COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"
RESPONSES, MESSAGES = "/v1/responses", "/v1/messages"  # built as a chat, then restated (_restated)
_NAMES = {COMPLETIONS: "completion", CHAT: "chat", RESPONSES: "responses", MESSAGES: "messages"}
MAX_MODEL_LEN = 1024  # the soaked server's --max-model-len: the bad requests are sized against it
_MAX_ORDINARY_ID = 151_000  # below Qwen's special tokens, as in benchmarks/lib/datasets.py
_WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo",
          "lima", "mike", "november", "oscar", "papa", "quebec", "romeo", "sierra", "tango", "uniform",
          "victor", "whiskey", "xray", "yankee", "zulu")
_TOKENS_PER_WORD = 1.7  # of _WORDS with a leading space, in Qwen's vocabulary
_STOPS = (["\n"], ["."], [",", "!"], ["e"], ["the", "\n\n"])



@dataclass(frozen=True)
class Shot:
    """One HTTP call of the soak and what it must get back."""

    index: int
    kind: str  # "good", "disconnect" or "bad"
    label: str  # its shape ("chat stream n=2 sampled") or what is wrong with it
    path: str
    body: bytes
    stream: bool = False
    n: int = 1
    max_tokens: int = 1
    usage: bool = False  # a stream asked for the usage chunk
    chunks_before_drop: int = 0  # disconnect: data events read before closing the connection


class Workload:
    """Shot i, the same for a seed on every run; 10 % drop mid-stream, 5 % are bad, interleaved."""

    def __init__(self, model: str, seed: int, max_tokens: int, max_prompt_tokens: int) -> None:
        self.model = model
        self.seed = seed
        self.max_tokens = max_tokens
        self.max_prompt_tokens = max_prompt_tokens
        rng = random.Random(seed)
        prefix_len = max_prompt_tokens * 2 // 3
        self.prefix_ids = [[rng.randrange(_MAX_ORDINARY_ID) for _ in range(prefix_len)] for _ in range(4)]
        self.prefix_texts = [_words(rng, prefix_len) for _ in range(4)]

    def shot(self, index: int) -> Shot:
        rng = random.Random(self.seed * 1_000_003 + index)
        if index % 20 == 7:
            return self._bad(index, rng)
        if index % 10 == 3:
            return self._good(index, rng, disconnect=True)
        return self._good(index, rng, disconnect=False)

    def _good(self, index: int, rng: random.Random, disconnect: bool) -> Shot:
        draw = rng.random()
        api = COMPLETIONS if draw < 0.4 else CHAT if draw < 0.8 else RESPONSES if draw < 0.9 else MESSAGES
        path = COMPLETIONS if api == COMPLETIONS else CHAT
        stream = disconnect or rng.random() < 0.5
        n = 2 if api in (COMPLETIONS, CHAT) and rng.random() < 0.1 else 1
        max_tokens = self.max_tokens if disconnect else rng.randint(1, self.max_tokens)
        body: dict[str, Any] = {"model": self.model, "max_tokens": max_tokens, "n": n, "stream": stream}
        labels = [_NAMES[api], "stream" if stream else "whole"]
        usage = stream and (api != path or rng.random() < 0.5)  # the agent APIs' last event has it
        if usage and api == path:
            body["stream_options"] = {"include_usage": True}
        labels.append(self._sampling(body, rng))
        if rng.random() < 0.15:
            body["stop"] = rng.choice(_STOPS)
            labels.append("stop")
        if api != MESSAGES and rng.random() < 0.08:  # tokens pushed up or down (the eager sampler's path)
            body["logit_bias"] = {str(rng.randrange(_MAX_ORDINARY_ID)): rng.choice((-100, -5, 5, 100))
                                  for _ in range(rng.randint(1, 8))}
            labels.append("bias")
        if rng.random() < 0.06:  # a structured output (masked tokens, the eager sampler's path)
            body.update(_structured(path, rng))
            labels.append("structured")
        labels.append(self._prompt(body, path, rng))
        if n == 2:
            labels.append("n=2")
        if api != path:
            body = _restated(api, body)
        return Shot(index, "disconnect" if disconnect else "good", " ".join(labels), api, orjson.dumps(body),
                    stream, n, max_tokens, usage, rng.randint(1, 2) if disconnect else 0)

    @staticmethod
    def _sampling(body: dict[str, Any], rng: random.Random) -> str:
        draw = rng.random()
        if draw < 0.4:
            body["temperature"] = 0.0
            return "greedy"
        if draw < 0.9:
            body.update(temperature=0.6, top_p=0.95)
            if rng.random() < 0.5:
                body["seed"] = rng.randrange(2**31)
                return "seeded"
            return "sampled"
        return "defaults"  # the checkpoint's generation defaults

    def _prompt(self, body: dict[str, Any], path: str, rng: random.Random) -> str:
        draw = rng.random()
        shared = draw < 0.25
        if shared:
            length, label = rng.randint(8, self.max_prompt_tokens // 3), "shared-prefix"
        elif draw < 0.55:
            length, label = rng.randint(2, 16), "short"
        elif draw < 0.85:
            length, label = rng.randint(16, 200), "medium"
        else:
            length, label = rng.randint(200, self.max_prompt_tokens), "long"
        group = rng.randrange(len(self.prefix_ids))
        if path == COMPLETIONS and rng.random() < 0.5:
            ids = [rng.randrange(_MAX_ORDINARY_ID) for _ in range(length)]
            body["prompt"] = self.prefix_ids[group] + ids if shared else ids
            return label + " ids"
        text = _words(rng, length)
        if shared:
            text = self.prefix_texts[group] + text
        if path == COMPLETIONS:
            body["prompt"] = text
        else:
            body["messages"] = [{"role": "user", "content": text}]
            if rng.random() < 0.5:
                body["chat_template_kwargs"] = {"enable_thinking": False}
        return label

    def _bad(self, index: int, rng: random.Random) -> Shot:
        over = [rng.randrange(_MAX_ORDINARY_ID) for _ in range(MAX_MODEL_LEN + 76)]
        almost = over[: MAX_MODEL_LEN - 4]
        chat = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
        cases: list[tuple[str, str, Any]] = [
            ("max_tokens=-1", COMPLETIONS, {"prompt": "hello", "max_tokens": -1}),
            ("prompt over the context", COMPLETIONS, {"prompt": over, "max_tokens": 4}),
            ("prompt + max_tokens over the context", COMPLETIONS, {"prompt": almost, "max_tokens": 24}),
            ("chat over the context", CHAT, {**chat, "messages": [{"role": "user", "content": _words(
                rng, MAX_MODEL_LEN + 200)}]}),
            ("n is a string", COMPLETIONS, {"prompt": "hello", "max_tokens": 4, "n": "2"}),
            ("temperature 'hot'", CHAT, {**chat, "temperature": "hot"}),
            ("top_p 1.5", COMPLETIONS, {"prompt": "hello", "max_tokens": 4, "top_p": 1.5}),
            ("unknown model", CHAT, {**chat, "model": "gpt-nonexistent"}),
            # (an unknown field is ignored, as vLLM does: not a bad request unless --strict-request-fields)
            ("stop_token_ids a string", COMPLETIONS, {"prompt": "hello", "max_tokens": 4,
                                                     "stop_token_ids": "7"}),
            ("messages is a string", CHAT, {**chat, "messages": "hello"}),
            ("logit_bias outside the vocabulary", COMPLETIONS, {"prompt": "hello", "max_tokens": 4,
                                                               "logit_bias": {"999999": 5}}),
            ("logit_bias 500", CHAT, {**chat, "logit_bias": {"5": 500}}),
            ("response_format with a lookahead", CHAT, {**chat, "response_format": {"type": "json_schema",
                                                                               "json_schema": {"schema": {
                                                                                   "type": "string",
                                                                                   "pattern": "(?=a)b"}}}}),
            ("a left-recursive guided_grammar", COMPLETIONS, {"prompt": "hello", "max_tokens": 4,
                                                             "guided_grammar": 'root ::= root "x" | "x"'}),
            ("responses with previous_response_id", RESPONSES, {"input": "hello", "max_output_tokens": 4,
                                                                 "previous_response_id": "resp_1"}),
            ("responses with max_tokens", RESPONSES, {"input": "hello", "max_tokens": 4}),
            ("messages without max_tokens", MESSAGES, {"messages": [{"role": "user", "content": "hello"}]}),
            ("messages with a system turn", MESSAGES, {"max_tokens": 4, "messages": [
                {"role": "system", "content": "be brief"}]}),
            ("malformed JSON", CHAT, None),
            ("empty body", COMPLETIONS, b""),
        ]
        label, path, body = rng.choice(cases)
        if body is None:
            raw = b'{"messages": [{"role": "user", "content": "hello"}], "max_tokens": 4'
        elif isinstance(body, bytes):
            raw = body
        else:
            stream = rng.random() < 0.5  # a refusal must come before a stream starts
            raw = orjson.dumps({**body, "stream": stream})
        return Shot(index, "bad", label, path, raw)


# A recursive GBNF grammar (guided_grammar): rule calls pushed and popped on the automaton's stacks.
_GRAMMAR = '''root ::= "(" root ")" | word (" " word){0,3}
word ::= [a-z]{1,5}'''


def _structured(path: str, rng: random.Random) -> dict[str, Any]:
    """The fields of a structured output: JSON mode or a small schema, or (completions) a choice or
    a grammar."""
    draw = rng.random()
    if path == COMPLETIONS and draw < 0.25:
        return {"guided_choice": list(_WORDS[: rng.randint(2, 6)])}
    if path == COMPLETIONS and draw < 0.4:
        return {"guided_grammar": _GRAMMAR}
    if draw < 0.7:
        schema = {"type": "object", "properties": {"word": {"enum": list(_WORDS[:5])}, "note": {
            "type": "string", "maxLength": 12}, "ok": {"type": "boolean"},
            "n": {"type": "integer", "minimum": -5, "maximum": 99},
            "on": {"type": "string", "format": "date"}}, "required": ["word", "ok"]}
        return {"response_format": {"type": "json_schema", "json_schema": {"name": "w", "schema": schema}}}
    return {"response_format": {"type": "json_object"}}


def _restated(api: str, chat: dict[str, Any]) -> dict[str, Any]:
    """A chat body (n=1) in the terms of OpenAI's Responses API or Anthropic's Messages API."""
    body = {k: v for k, v in chat.items() if k not in ("messages", "max_tokens", "n", "response_format")}
    form = (chat.get("response_format") or {})
    schema = form["json_schema"]["schema"] if form.get("type") == "json_schema" else {"type": "object"}
    if api == RESPONSES:
        body.update(input=chat["messages"], max_output_tokens=chat["max_tokens"])
        if form:
            body["text"] = {"format": {"type": "json_schema", "name": "w", "schema": schema}
                            if form["type"] == "json_schema" else {"type": "json_object"}}
        return body
    body.update(messages=chat["messages"], max_tokens=chat["max_tokens"])
    if "stop" in body:
        body["stop_sequences"] = body.pop("stop")
    if body.pop("chat_template_kwargs", None):
        body["thinking"] = {"type": "disabled"}
    if form:
        body["output_config"] = {"format": {"type": "json_schema", "schema": schema}}
    return body


def _words(rng: random.Random, num_tokens: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(max(1, round(num_tokens / _TOKENS_PER_WORD))))
