"""How the automaton (core/structured/automaton.py) steps a RULE frame: one rule of a GBNF grammar
(core/structured/ebnf.py, vLLM's guided_grammar), a character at a time.

A frame is (RULE, states, partial): the rule's NFA states and the bytes of a UTF-8 character begun
and not finished. A byte is read by the rule itself, by a rule it calls (a RULE frame pushed above
it, or in its place where nothing follows the call in the caller: a tail call, so a right-recursive
rule's stack does not grow), or, where the rule may end, by the frame below. A frame just pushed
does not end before it has read a byte: its rule matching nothing is already a way on in the
caller's states (`Rules.closure`), and ending at once would loop.
"""

from __future__ import annotations

from collections.abc import Callable

from core.structured.ebnf import Rules
from core.structured.regex import code_point, utf8_span

RULE = 10  # the automaton's frame kind for a grammar rule (after its JSON kinds)
# The most frames a grammar's calls may stack: nesting deeper than this is not generated. A step that
# would leave a frame unable to end within it (its rule's end needs more frames above it than are
# left: Rules.frames_needed) is not taken, so the limit never strands an output in a dead end.
MAX_RULE_DEPTH = 64


def step_rule(rules: Rules, rest: tuple, top: tuple, c: int, step_below: Callable[[tuple, int], list],
              fresh: bool = False) -> list[tuple]:
    """The stacks after byte `c` with the RULE frame `top` on `rest`; `step_below` steps `rest`."""
    _, states, partial = top
    depth = len(rest)  # this frame's place in the stack
    if partial:
        if not 0x80 <= c <= 0xBF:
            return []
        partial += bytes((c,))
        need = _utf8_length(partial[0])
        if len(partial) < need:
            lo, hi = utf8_span(partial, need)
            goes_on = lo <= hi and rules.can_take(states, lo, hi, MAX_RULE_DEPTH - 1 - depth)
            return [rest + ((RULE, states, partial),)] if goes_on else []
        cp = code_point(partial)
        after = rules.step(states, cp) if cp is not None else frozenset()
        fits = after and depth + rules.frames_needed(after) < MAX_RULE_DEPTH
        return [rest + ((RULE, after, b""),)] if fits else []
    out: list[tuple] = []
    if c < 0x80:
        after = rules.step(states, c)
        if after and depth + rules.frames_needed(after) < MAX_RULE_DEPTH:
            out.append(rest + ((RULE, after, b""),))
    elif 0xC2 <= c <= 0xF4:
        begun = bytes((c,))
        lo, hi = utf8_span(begun, _utf8_length(c))
        if lo <= hi and rules.can_take(states, lo, hi, MAX_RULE_DEPTH - 1 - depth):
            out.append(rest + ((RULE, states, begun),))
    for first, back in rules.calls(states):
        if rules.is_end(back):  # a tail call: the callee takes this frame's place
            below = rest
        elif depth + max(rules.frames_needed(back), 1 + rules.frames_needed(first)) < MAX_RULE_DEPTH:
            below = rest + ((RULE, back, b""),)
        else:
            continue
        out.extend(step_rule(rules, below, (RULE, first, b""), c, step_below, fresh=True))
    if not fresh and rules.accepts(states):
        out.extend(step_below(rest, c))
    return out


def rule_may_end(rules: Rules, top: tuple) -> bool:
    """Whether the RULE frame may end without another byte."""
    return not top[2] and rules.accepts(top[1])


def _utf8_length(lead: int) -> int:
    return 2 if lead <= 0xDF else 3 if lead <= 0xEF else 4
