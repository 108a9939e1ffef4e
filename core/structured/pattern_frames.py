"""How the automaton (core/structured/automaton.py) steps a PATTERN frame: text a regular
expression (core/structured/regex.py) matches, a character at a time.

A frame is (PATTERN, regex index, states, partial, where): the regex's NFA states, the bytes of a
UTF-8 character begun and not finished, and where the text stands:
  PATTERN_WHOLE   the whole output (vLLM's guided_regex): it ends with the output;
  PATTERN_QUOTED  a JSON string's content (a schema's `pattern` or `format`): a quote ends it;
  PATTERN_BARE    a bare JSON value (a number's bounds, core/structured/numeric_ranges.py), ASCII
                  only: it ends at the first byte it cannot take, which the frame below then reads.
A character begun goes on only if some way to finish it matches, so no state is a dead end.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from core.structured.regex import Regex, code_point, utf8_span

PATTERN = 9  # the automaton's frame kind for a pattern (after its JSON kinds; RULE is 10)
PATTERN_WHOLE, PATTERN_QUOTED, PATTERN_BARE = 0, 1, 2


def step_pattern(regexes: Sequence[Regex], rest: tuple, top: tuple, c: int,
                 step_below: Callable[[tuple, int], list]) -> list[tuple]:
    """The stacks after byte `c` with the PATTERN frame `top` on `rest`; `step_below` steps `rest`."""
    _, index, states, partial, where = top
    regex = regexes[index]
    if where == PATTERN_BARE:
        after = regex.step(states, c) if c < 0x80 else frozenset()
        if after:
            return [rest + ((PATTERN, index, after, b"", where),)]
        return step_below(rest, c) if regex.accepts(states) else []
    if partial:
        if not 0x80 <= c <= 0xBF:
            return []
        partial += bytes((c,))
    elif where == PATTERN_QUOTED and c == 0x22:
        return [rest] if regex.accepts(states) else []
    elif c < 0x80:
        after = regex.step(states, c)
        return [rest + ((PATTERN, index, after, b"", where),)] if after else []
    elif 0xC2 <= c <= 0xF4:
        partial = bytes((c,))
    else:
        return []
    need = 2 if partial[0] <= 0xDF else 3 if partial[0] <= 0xEF else 4
    if len(partial) < need:  # a character begun: go on only if some way to finish it matches
        lo, hi = utf8_span(partial, need)
        if lo > hi or not regex.can_take(states, lo, hi):
            return []
        return [rest + ((PATTERN, index, states, partial, where),)]
    cp = code_point(partial)
    after = regex.step(states, cp) if cp is not None else frozenset()
    return [rest + ((PATTERN, index, after, b"", where),)] if after else []
