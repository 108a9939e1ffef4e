"""Structured outputs, the token level: the allowed-token masks (core/structured/token_masks.py)
against a byte-by-byte check of every token, outputs drawn through them against an independent
schema check, the executor's per-request states (core/execution/structured_rows.py) and the
sampler's masking (core/execution/sampler.py), all over the real Qwen vocabulary."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch
from background_children import in_child, run_in_background_child, skip_in_parent
from test_sampler import make_plan
from test_structured_ebnf import JSON_GRAMMAR, SQL

from benchmarks.lib.schema_check import conforms
from core.execution.sampler import Sampler, SamplingTensors
from core.execution.structured_rows import StructuredRows
from core.structured.grammar import compile_spec
from core.structured.specs import (
    choice_spec,
    compact_spec,
    grammar_spec,
    json_object_spec,
    json_schema_spec,
    regex_spec,
    tool_calls_spec,
)
from core.structured.token_columns import TokenColumns, Transitions
from core.structured.token_masks import TokenMasks, Vocabulary, unpack
from core.tokenizer.qwen_vocab import QwenVocabTokenizer

WIDTH = 151936  # Qwen3's logits: wider than its tokenizer's 151,669 ids

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 6},
    "score": {"type": "number"},
    "level": {"enum": ["low", "high", 3]},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 3}, "maxItems": 2},
    "inner": {"anyOf": [{"type": "null"}, {"type": "object", "properties": {"ok": {"type": "boolean"}},
                                           "required": ["ok"]}]},
}, "required": ["name", "level"]}
WEATHER = {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                 "required": ["city"]}}
PATTERNED = {"type": "object", "properties": {"code": {"type": "string", "pattern": r"^[A-Z]{2}\d{2,4}$"},
                                             "word": {"pattern": "^[a-zé ]{1,8}$"}}, "required": ["code"]}
# A recursive GBNF grammar (nested arrays of numbers and strings, JSON's syntax); SQL is vLLM's
# structured-output benchmark's grammar (tests/test_structured_ebnf.py).
NESTED = '''root ::= "[" ws (item ("," ws item)*)? "]"
item ::= "0" | [1-9] [0-9]{0,5} | "\\"" [a-zé ]* "\\"" | root
ws ::= " "?'''
# Ranges (pydantic's conint(ge=..., le=...), confloat(ge=-1, le=1), confloat(gt=0.25, le=2.75)):
# tokens of several digits must stay inside them.
BOUNDED = {"type": "object", "properties": {
    "month": {"type": "integer", "minimum": 1, "maximum": 12},
    "offsets": {"type": "array", "items": {"type": "integer", "minimum": -250, "exclusiveMaximum": 1000},
                "maxItems": 4},
    "score": {"type": "number", "minimum": -1, "maximum": 1},
    "ratio": {"type": "number", "exclusiveMinimum": 0.25, "maximum": 2.75},
}, "required": ["month", "offsets", "score", "ratio"]}
# String formats (pydantic's date, time, datetime, UUID, IPv4Address, EmailStr fields).
FORMATS = ("date", "time", "date-time", "uuid", "ipv4", "email")
FORMATTED = {"type": "object", "properties": {name: {"type": "string", "format": name} for name in FORMATS},
             "required": list(FORMATS)}
SPECS = [json_schema_spec(SCHEMA), json_object_spec(), json_object_spec(reasoning=True),
         choice_spec(["positive", "negative", "neutral"]), tool_calls_spec([WEATHER], max_calls=2),
         json_schema_spec(PATTERNED), regex_spec(r"(yes|no|maybe)(, [a-z]{1,6}){0,3}\."),
         compact_spec(json_schema_spec(SCHEMA)), grammar_spec(NESTED), grammar_spec(SQL),
         json_schema_spec(BOUNDED), json_schema_spec(FORMATTED)]


@pytest.fixture(autouse=True)
def _runs_in_a_background_child(request):
    skip_in_parent(request)


def test_module_in_a_background_child():
    """The module is pure computation (~50 s on one core): it runs beside the system tests."""
    if in_child():
        pytest.skip("this is the child")
    run_in_background_child(__file__)


@pytest.fixture(scope="module")
def qwen():
    return QwenVocabTokenizer()


@pytest.fixture(scope="module")
def masks(qwen):
    return TokenMasks(Vocabulary.of_tokenizer(qwen, WIDTH))


def brute_force(masks: TokenMasks, spec: str, state, token_ids: np.ndarray) -> np.ndarray:
    """Which of `token_ids` the automaton accepts whole from `state`, byte by byte."""
    grammar = compile_spec(spec)
    vocabulary = masks.vocabulary
    allowed = np.array([bool(vocabulary.token_bytes[i]) and bool(grammar.automaton.advance_bytes(
        state, vocabulary.token_bytes[i])) for i in token_ids.tolist()])
    return allowed


def draw(masks: TokenMasks, spec: str, rng: np.random.Generator, max_steps: int = 400,
         closing: float = 0.7) -> tuple[list[int], list]:
    """An output drawn through the masks (with probability `closing` a token that closes something,
    a quote, bracket or brace in it, so outputs end), and the states along it."""
    grammar = compile_spec(spec)
    closers = np.array([any(b in data for b in b'"]}>') for data in masks.vocabulary.token_bytes]
                       + [False] * (masks.vocabulary.width - len(masks.vocabulary.token_bytes)))
    state, output, states = grammar.initial, [], []
    for _ in range(max_steps):
        states.append(state)
        allowed = np.flatnonzero(unpack(masks.allowed(grammar, state), WIDTH))
        ends = [i for i in allowed.tolist() if i in masks.vocabulary.end_ids]
        if ends:
            return output, states
        closing_ones = allowed[closers[allowed]]
        pool = closing_ones if len(closing_ones) and rng.random() < closing else allowed
        token = int(rng.choice(pool))
        output.append(token)
        state = masks.advance(grammar, state, token)
        assert state, f"the masks allowed token {token}, which the grammar then refused"
    raise AssertionError(f"no end within {max_steps} tokens: {output}")


@pytest.mark.parametrize("spec", SPECS,
                         ids=["schema", "json_object", "reasoning", "choice", "tools", "pattern", "regex",
                              "compact", "grammar", "sql", "integer ranges", "formats"])
def test_masks_equal_the_byte_by_byte_check_of_every_sampled_token(masks, spec):
    rng = np.random.default_rng(0)
    vocabulary = masks.vocabulary
    # every token with a byte that matters to JSON, and a random sample of the rest
    special = np.flatnonzero(~masks._string_content[: len(vocabulary.token_bytes)])
    sample = np.concatenate([special, rng.choice(len(vocabulary.token_bytes), 3000, replace=False)])
    grammar = compile_spec(spec)
    _, states = draw(masks, spec, rng)
    for state in states[:: max(1, len(states) // 12)]:
        mask = unpack(masks.allowed(grammar, state), WIDTH)
        expected = brute_force(masks, spec, state, sample)
        ends = np.isin(sample, vocabulary.end_ids)
        assert np.array_equal(mask[sample] & ~ends, expected & ~ends), state
        assert mask[list(vocabulary.end_ids)].all() == grammar.automaton.can_end(state)
        assert not mask[len(vocabulary.token_bytes):].any()  # the logits' padding ids never


def test_outputs_drawn_through_the_masks_conform_to_the_schema(masks, qwen):
    rng = np.random.default_rng(1)
    for spec, schema in ((SPECS[0], SCHEMA), (SPECS[5], PATTERNED), (SPECS[10], BOUNDED),
                         (SPECS[11], FORMATTED)):
        for _ in range(12):
            output, _ = draw(masks, spec, rng)
            value = json.loads(qwen.decode(output))
            assert conforms(value, schema), value


def test_guided_regex_outputs_match_whole(masks, qwen):
    rng = np.random.default_rng(5)
    for _ in range(12):
        text = qwen.decode(draw(masks, SPECS[6], rng, closing=0.0)[0])
        assert re.fullmatch(r"(yes|no|maybe)(, [a-z]{1,6}){0,3}\.", text), text


def test_guided_grammar_outputs_are_what_the_grammar_derives(masks, qwen):
    rng = np.random.default_rng(6)
    for _ in range(12):
        text = qwen.decode(draw(masks, SPECS[8], rng)[0])
        assert _nested_numbers_and_words(json.loads(text)), text  # JSON's syntax: an independent parse
    for _ in range(6):
        text = qwen.decode(draw(masks, SPECS[9], rng, closing=0.0)[0])
        assert re.fullmatch(r"SELECT col_[12]  from table_[12]  where col_[12] = [12] ", text), text
    for _ in range(8):  # JSON written as a grammar: json.loads must take every output
        json.loads(qwen.decode(draw(masks, grammar_spec(JSON_GRAMMAR), rng)[0]))


def _nested_numbers_and_words(value) -> bool:
    if isinstance(value, list):
        return all(_nested_numbers_and_words(item) for item in value)
    if isinstance(value, str):
        return re.fullmatch("[a-zé ]*", value) is not None
    return isinstance(value, int) and 0 <= value < 10**6


def test_json_mode_outputs_parse_as_objects_and_reasoning_comes_first(masks, qwen):
    rng = np.random.default_rng(2)
    for spec in SPECS[1:3]:
        for _ in range(8):
            text = qwen.decode(draw(masks, spec, rng)[0])
            if text.startswith("<think>"):
                text = text[text.index("</think>\n\n") + len("</think>\n\n"):]
            assert isinstance(json.loads(text), dict), text


def test_tool_call_outputs_are_qwen3_blocks(masks, qwen):
    rng = np.random.default_rng(3)
    for _ in range(8):
        text = qwen.decode(draw(masks, SPECS[4], rng)[0])
        blocks = text.split("\n<tool_call>\n")
        assert 1 <= len(blocks) <= 2, text
        for block in blocks:
            body = block.removeprefix("<tool_call>\n").removesuffix("\n</tool_call>")
            call = json.loads(body)
            assert call["name"] == "get_weather" and isinstance(call["arguments"]["city"], str)


def test_a_string_mask_takes_the_plain_tokens_without_walking_them(masks):
    grammar = compile_spec(json_schema_spec({"type": "string"}))
    state = grammar.automaton.advance_bytes(grammar.initial, b'"')
    mask = unpack(masks.allowed(grammar, state), WIDTH)
    assert mask.sum() > 0.95 * len(masks.vocabulary.sorted_bytes)
    bounded = compile_spec(json_schema_spec({"type": "string", "maxLength": 2}))
    state = bounded.automaton.advance_bytes(bounded.initial, b'"a')
    mask = unpack(masks.allowed(bounded, state), WIDTH)
    ids = {text: masks.vocabulary.token_bytes.index(text.encode()) for text in ("b", "bc", '"', '",', "é")}
    assert mask[ids["b"]] and mask[ids['"']] and mask[ids["é"]]
    assert not mask[ids["bc"]]  # a third character
    assert not mask[ids['",']]  # the string is the whole value: nothing may follow it


def test_token_columns_run_an_automaton_over_every_token_as_a_byte_loop_would():
    rng = np.random.default_rng(3)
    tokens = sorted({bytes(rng.integers(0, 6, rng.integers(1, 9)).tolist()) for _ in range(3000)})
    ids = rng.permutation(5000)[: len(tokens)]
    columns = TokenColumns(tokens, ids, 5000)

    def step(state, byte):  # a counter of bytes below 4 that dies at 5 or on a 5
        if byte == 5:
            return 0
        after = state + (byte < 4)
        return after if after <= 5 else 0

    for subset in (ids, ids[::3], ids[:0]):
        accepted = set(columns.accepted(1, columns.subset(subset), Transitions(step, capacity=4)).tolist())
        expected = set()
        for data, token_id in zip(tokens, ids.tolist(), strict=True):
            state = 1
            for byte in data:
                state = step(state, byte) if state else 0
            if state and token_id in set(subset.tolist()):
                expected.add(token_id)
        assert accepted == expected


@pytest.mark.parametrize("spec, prefix", [
    (json_schema_spec(PATTERNED), b'{"code": "AB1'),  # inside a pattern: the string frame's tokens
    (json_schema_spec(PATTERNED), b'{"code": "AB12", "word": "ab'),
    (regex_spec("[a-z ]{1,64}"), b"the cat"),  # a whole-output pattern: the whole vocabulary
    (json_object_spec(), b'{"'),  # a key: most tokens go on
    (json_object_spec(), b'{"a": 1'),  # after a number: few do
])
def test_masks_of_states_that_let_most_tokens_on_equal_the_byte_by_byte_check(masks, spec, prefix):
    grammar = compile_spec(spec)
    state = grammar.automaton.advance_bytes(grammar.initial, prefix)
    assert state
    vocabulary = masks.vocabulary
    # the tokens whose first byte the state takes (those the walk reads on), and a few others
    firsts = [i for i, data in enumerate(vocabulary.token_bytes)
              if data and grammar.automaton.advance(state, data[0])]
    rng = np.random.default_rng(1)
    sample = np.unique(np.concatenate([rng.choice(firsts, min(len(firsts), 6000), replace=False),
                                       rng.choice(len(vocabulary.token_bytes), 1000, replace=False)]))
    mask = unpack(masks.allowed(grammar, state), WIDTH)
    ends = np.isin(sample, vocabulary.end_ids)
    expected = brute_force(masks, spec, state, sample)
    assert expected.sum() > 0
    assert np.array_equal(mask[sample] & ~ends, expected & ~ends)


def structured_plan(spec: str, outputs: list[list[int]], prompt: list[int], **sampling):
    """A decode step of requests with `spec`, each with its output so far."""
    plan = make_plan(len(outputs), history=[(prompt, output) for output in outputs],
                     output_pos=[len(output) for output in outputs], **sampling)
    encoded = np.frombuffer(spec.encode(), np.uint8)
    return type(plan)(**{**{f: getattr(plan, f) for f in plan.__dataclass_fields__},
                         "grammar_start": np.arange(len(outputs) + 1, dtype=np.int32) * len(encoded),
                         "grammar_spec": np.tile(encoded, len(outputs))})


def no_previous_step() -> np.ndarray:
    raise AssertionError("no placeholder here")


def test_the_executor_finds_a_requests_state_by_replay_or_from_the_step_before(masks, qwen):
    rows = StructuredRows(lambda: masks.vocabulary)
    rows._masks = masks
    spec = SPECS[0]
    output = qwen.encode('{"name": "ab", "level": "lo')
    fresh = rows.masks(structured_plan(spec, [output], [1, 2]), np.array([0]), no_previous_step)
    grammar = compile_spec(spec)
    state = grammar.automaton.advance_bytes(grammar.initial, qwen.decode(output).encode())
    assert np.array_equal(fresh[1][0], masks.allowed(grammar, state))
    stepped = StructuredRows(lambda: masks.vocabulary)
    stepped._masks = masks
    for n in range(len(output) + 1):  # one token at a time, as a request decodes
        result = stepped.masks(structured_plan(spec, [output[:n]], [1, 2]), np.array([0]), no_previous_step)
    assert np.array_equal(result[1][0], fresh[1][0])


def test_a_placeholders_token_comes_from_the_step_before(masks, qwen):
    rows = StructuredRows(lambda: masks.vocabulary)
    rows._masks = masks
    spec = SPECS[0]
    output = qwen.encode('{"name": "ab", "level": "hi')
    whole = rows.masks(structured_plan(spec, [output], [1]), np.array([0]), no_previous_step)
    short = structured_plan(spec, [output[:-1]], [1])  # the history lacks the token in flight
    fields = {f: getattr(short, f) for f in short.__dataclass_fields__}
    placeholder = type(short)(**{**fields, "prev_row": np.array([3], np.int32),
                                 "output_pos": np.array([len(output)], np.int32)})
    previous = np.zeros(5, np.int32)
    previous[3] = output[-1]
    fresh = StructuredRows(lambda: masks.vocabulary)
    fresh._masks = masks
    assert np.array_equal(fresh.masks(placeholder, np.array([0]), lambda: previous)[1], whole[1])
    wrong = type(short)(**{**fields, "output_pos": np.array([len(output)], np.int32)})
    with pytest.raises(ValueError, match="output tokens in its history"):
        fresh.masks(wrong, np.array([0]), no_previous_step)


def test_the_sampler_draws_only_allowed_tokens_and_reports_raw_logprobs(masks, qwen):
    rows = StructuredRows(lambda: masks.vocabulary)
    rows._masks = masks
    spec = choice_spec(["yes", "no"])
    plan = structured_plan(spec, [[], []], [5], temperature=[0.0, 1.0], num_logprobs=1)
    plan = type(plan)(**{**{f: getattr(plan, f) for f in plan.__dataclass_fields__},
                         "grammar_start": np.array([0, 0, plan.grammar_start[2] // 2], np.int32),
                         "grammar_spec": plan.grammar_spec[: plan.grammar_start[2] // 2]})
    allowed = rows.masks(plan, plan.sampled_rows, no_previous_step)
    assert allowed[0].tolist() == [1]  # only the second request has a structured output
    logits = torch.randn(2, WIDTH, generator=torch.Generator().manual_seed(0))
    out = Sampler()(logits, SamplingTensors.from_plan(plan, plan.sampled_rows, "cpu", allowed))
    assert out.token_ids[0] == logits[0].argmax()  # the free row is untouched
    token = int(out.token_ids[1])
    assert qwen.decode([token]) in ("y", "ye", "yes", "n", "no")
    raw = torch.log_softmax(logits, dim=-1)
    assert torch.allclose(out.sampled_logprobs[1], raw[1, token])


def test_packed_masks_unpack_on_the_device_in_numpys_bit_order():
    from core.execution.sampler import apply_masks

    allowed = np.random.default_rng(4).random((3, 21)) < 0.5
    logits = torch.zeros(5, 21)
    masked = apply_masks(logits, torch.tensor([0, 2, 4]), torch.from_numpy(np.packbits(allowed, axis=-1)))
    assert torch.equal(torch.isfinite(masked[[0, 2, 4]]), torch.from_numpy(allowed))
    assert torch.isfinite(masked[[1, 3]]).all() and torch.isfinite(logits).all()  # a copy
