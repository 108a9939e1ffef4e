"""Regular expressions for structured outputs (core/structured/regex.py): JSON schema's `pattern`
inside strings and vLLM's guided_regex over the whole output, against Python's `re` on the same
texts, and the subset's refusals."""

from __future__ import annotations

import json
import re

import pytest
from test_structured_grammar import verdict

from core.structured.grammar import GrammarError, compile_spec
from core.structured.regex import Regex, RegexError
from core.structured.specs import json_schema_spec, regex_spec

PATTERNS = [r"^[a-z]+$", r"^\d{3}-\d{4}$", r"^(foo|bar)+$", r"ab", r"^ab", r"^a.c$", r"^[^0-9]*$",
            r"^\w+@\w+\.com$", r"^x{2,3}$", r"^x{2,}$", r"^(?:ab)?c$", r"^\u00e9+\d?$", r"^[\w\-. ]{1,4}$",
            r"^(?P<year>\d{4})-(0[1-9]|1[0-2])$", r"^[A-F\d]{2}(:[A-F\d]{2}){2}$", r"colou?r", r"^\s*\S+$"]
TEXTS = ["abc", "abC", "555-1234", "55-1234", "foobarfoo", "fob", "xxabyy", "xxab", "a-c", "a\nc", "a1",
         "me@x.com", "xx", "xxxx", "c", "abc", "éé5", "é", "a-.b", "2026-12", "2026-13", "0A:1B:2C",
         "my colour", "color", "  x", " ", ""]


def matches(regex: Regex, text: str) -> bool:
    states = regex.initial
    for ch in text:
        states = regex.step(states, ord(ch))
        if not states:
            return False
    return regex.accepts(states)


@pytest.mark.parametrize("pattern", PATTERNS)
def test_matches_what_python_re_matches(pattern):
    regex = Regex(pattern, json=False)
    for text in TEXTS:
        expected = re.search(pattern, text, re.ASCII) is not None
        assert matches(regex, text) == expected, (pattern, text)


@pytest.mark.parametrize("pattern, words", [
    (r"(a)\1", r"\1 is not supported"), (r"(?=a)b", "lookaround"), (r"(?i)a", "lookaround"),
    (r"a\b", r"\b is not supported"), (r"a(b", "without its ')'"), (r"a)b", "unbalanced"),
    (r"*a", "nothing to repeat"), (r"a**", "after a quantifier"), (r"a^b", "only first or last"),
    (r"[z-a]", "below its start"), (r"a{3,1}", "maximum below its minimum"), (r"x{5000}", "states"),
    (r"[abc", "without its ']'"), ("\\", "at the end"),
])
def test_outside_the_subset_is_refused_with_what_and_where(pattern, words):
    with pytest.raises(RegexError, match=re.escape(words)):
        Regex(pattern, json=False)


def test_in_a_json_string_only_characters_that_need_no_escape_match():
    regex = Regex(r'^[a"\\]+$', json=True)
    assert matches(regex, "aaa") and not matches(regex, 'a"') and not matches(regex, "a\\")
    with pytest.raises(RegexError, match="unescaped in a JSON string"):
        Regex(r'^"$', json=True)
    # a state from which only a quote would go on is dropped: no dead end to be stuck in
    regex = Regex(r'^a(b|")$', json=True)
    assert regex.step(regex.initial, ord("a")) and matches(regex, "ab")


def test_a_schema_pattern_constrains_the_strings_content():
    properties = {"zip": {"type": "string", "pattern": r"^\d{5}$"}, "tag": {"pattern": "^[a-zé]+$"}}
    spec = json_schema_spec({"type": "object", "properties": properties})
    assert verdict(spec, '{"zip": "12345", "tag": "café"}') == "complete"
    assert verdict(spec, '{"zip": "1234"}') == "rejected"
    assert verdict(spec, '{"zip": "12345", "tag": "Cafe"}') == "rejected"
    assert verdict(spec, '{"zip": "12\\u0033') == "rejected"  # no escapes in a patterned string
    # a character split across tokens goes on only if some way to finish it matches
    assert verdict(spec, b'{"zip": "12345", "tag": "caf\xc3') == "prefix"
    assert verdict(spec, b'{"zip": "12345", "tag": "caf\xe4') == "rejected"  # U+4000..: no letter here


def test_guided_regex_matches_the_whole_output():
    spec = regex_spec(r"(yes|no), because [a-z ]+\.")
    assert verdict(spec, "yes, because it is.") == "complete"
    assert verdict(spec, "no, because x") == "prefix"
    assert verdict(spec, "so yes, because it is.") == "rejected"  # whole: nothing before the match
    assert verdict(spec, "yes, because it is. ") == "rejected"
    assert verdict(regex_spec("a+|b"), "aaa") == "complete"
    with pytest.raises(GrammarError, match="pattern"):
        compile_spec(json.dumps({"type": "regex", "pattern": "(?<=a)"}))
