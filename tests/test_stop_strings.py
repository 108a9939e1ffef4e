"""StopStringMatcher: stop strings found inside and across deltas, partial tails held back."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.tokenizer import StopCheck, StopStringMatcher


def feed(matcher, deltas):
    """Every StopCheck in order, stopping at the first stop, as the output process does."""
    checks = []
    for delta in deltas:
        checks.append(matcher.push(delta))
        if checks[-1].stopped:
            break
    return checks


def test_stop_string_inside_one_delta_emits_the_text_before_it():
    matcher = StopStringMatcher(["STOP"])
    assert matcher.push("Hello STOP world") == StopCheck("Hello ", stopped=True)
    assert matcher.matched == "STOP"


def test_stop_string_across_deltas_is_found_and_not_emitted():
    matcher = StopStringMatcher(["STOP"])
    assert feed(matcher, ["Hel", "lo S", "T", "OP and more"]) == [
        StopCheck("Hel", False),
        StopCheck("lo ", False),
        StopCheck("", False),
        StopCheck("", True),
    ]


def test_partial_prefix_is_held_back_then_released_when_it_diverges():
    matcher = StopStringMatcher(["STOP"])
    assert matcher.push("abc ST") == StopCheck("abc ", False)
    assert matcher.push("ART") == StopCheck("START", False)
    assert matcher.flush() == ""


def test_overlapping_prefix_releases_only_what_cannot_start_a_match():
    matcher = StopStringMatcher(["abcd"])
    assert matcher.push("aba") == StopCheck("ab", False)  # the last "a" may still start "abcd"
    assert matcher.push("bcd") == StopCheck("", True)


def test_of_several_stop_strings_the_first_to_complete_wins():
    matcher = StopStringMatcher(["world", "lo w", "\n\n"])
    assert matcher.push("hello world\n\n") == StopCheck("hel", True)
    assert matcher.matched == "lo w"
    # "c" completes before "abcd" does, so token-by-token streaming would stop there too.
    matcher = StopStringMatcher(["abcd", "c"])
    assert matcher.push("xabcd") == StopCheck("xab", True)
    assert matcher.matched == "c"


def test_held_tail_is_the_longest_prefix_of_any_stop_string():
    matcher = StopStringMatcher(["</answer>", "###"])
    assert matcher.push("x </ans") == StopCheck("x ", False)
    assert matcher.push("wer## ") == StopCheck("</answer## ", False)  # no ">": released
    assert matcher.push("#") == StopCheck("", False)
    assert matcher.flush() == "#"


def test_flush_returns_the_held_tail_when_the_request_ends_otherwise():
    matcher = StopStringMatcher(["<|user|>"])
    assert matcher.push("bye <|us") == StopCheck("bye ", False)
    assert matcher.flush() == "<|us"
    assert matcher.flush() == ""


def test_no_stop_strings_passes_text_through():
    matcher = StopStringMatcher([])
    assert matcher.push("anything") == StopCheck("anything", False)
    assert matcher.flush() == ""


def test_empty_stop_string_is_rejected():
    with pytest.raises(ValueError, match="non-empty"):
        StopStringMatcher(["ok", ""])


def test_push_after_stop_is_an_error():
    matcher = StopStringMatcher(["x"])
    assert matcher.push("ax").stopped
    with pytest.raises(RuntimeError, match="'x'"):
        matcher.push("more")


@settings(max_examples=200, deadline=None)
@given(
    text=st.text(alphabet="abxy", max_size=30),
    stops=st.lists(st.text(alphabet="abxy", min_size=1, max_size=4), min_size=1, max_size=3),
    cuts=st.lists(st.integers(0, 30), max_size=8),
)
def test_emitted_text_is_the_same_however_the_text_is_split(text, stops, cuts):
    bounds = sorted({0, len(text), *(c for c in cuts if c <= len(text))})
    deltas = [text[a:b] for a, b in zip(bounds, bounds[1:])]
    matcher = StopStringMatcher(stops)
    checks = feed(matcher, deltas)
    emitted = "".join(c.text for c in checks)
    # Expected: cut before the stop string whose first occurrence ends first (the longer on a tie).
    matches = sorted((text.find(s) + len(s), text.find(s)) for s in stops if s in text)
    if not matches:
        assert not matcher.stopped and emitted + matcher.flush() == text
    else:
        assert matcher.stopped and emitted == text[: matches[0][1]]
