"""The byte-level automaton that structured outputs are checked with: which bytes may come next.

A grammar (core/structured/grammar.py) compiles a JSON schema, JSON mode or a set of tools into a
table of nodes; this module walks that table one byte at a time. Its state is a set of stacks
(alternatives of an `anyOf`, of an `enum`, or of a number that may end or go on, live side by side
until a byte tells them apart); a stack is a tuple of frames, its top last, and a frame is a small
tuple whose first entry says its kind. States are immutable and hashable, so the token masks of
core/structured/token_masks.py cache them.

What a frame accepts:
  VALUE  a value of one node, after optional whitespace
  OBJECT an object's structure: `{`, keys in the schema's order (optional ones may be skipped,
         keys not in the schema are refused), `:`, `,`, `}`; with no properties, any keys whose
         values match `additionalProperties` (any JSON when it is absent or true)
  KEY    the quoted name of one of the properties that may come next
  ARRAY  `[`, items, `,`, `]` within minItems..maxItems
  STRING a string's content after its opening quote: escapes, valid UTF-8 (no overlong forms, no
         surrogates, nothing above U+10FFFF), no control bytes, minLength..maxLength characters where
         the schema bounds them
  NUMBER a JSON number (an integer: no fraction, no exponent); it ends at the first byte that
         cannot extend it, which the frame below then reads
  LITERAL one of a few byte strings (true, false, null, enum and const values, tool-call tags)
  TEXT   free text up to a terminator (a reasoning block up to `</think>`)
  CALLS  one or more `<tool_call>` blocks, up to a maximum
  PATTERN text a regular expression matches (core/structured/regex.py), a character at a time:
         a JSON string's content (no escapes; its closing quote where the pattern may end), a
         bounded number, or, for vLLM's guided_regex, the whole output (pattern_frames.py)
  RULE   one rule of a GBNF grammar (core/structured/ebnf.py, vLLM's guided_grammar), a character
         at a time; a call of another rule pushes a RULE frame for it above the caller's (none
         where nothing follows the call in the caller: a tail call), which returns to the caller
         once it has read a byte and may end
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from core.structured.ebnf import Rules
from core.structured.pattern_frames import PATTERN, PATTERN_BARE, PATTERN_QUOTED, step_pattern
from core.structured.regex import Regex
from core.structured.rule_frames import RULE, rule_may_end, step_rule

# Frame kinds (a frame's first entry).
VALUE, OBJECT, KEY, ARRAY, STRING, NUMBER, LITERAL, TEXT, CALLS = range(9)  # PATTERN, RULE: *_frames.py
# Node kinds (a node's first entry; see Node).
N_OBJECT, N_ARRAY, N_STRING, N_NUMBER, N_LITERAL, N_ANY_OF = range(6)
# OBJECT phases: after `{`, after a key (before `:`), after a value, after `,`.
O_FIRST, O_COLON, O_NEXT, O_COMMA = range(4)
# ARRAY phases: after `[`, after an item, after `,`.
A_FIRST, A_NEXT, A_COMMA = range(3)
# NUMBER phases: after `-`, a leading 0, integer digits, `.`, fraction digits, `e`, the exponent's
# sign, exponent digits.
N_MINUS, N_ZERO, N_INT, N_DOT, N_FRAC, N_E, N_ESIGN, N_EXP = range(8)
_NUMBER_ENDS = frozenset((N_ZERO, N_INT, N_FRAC, N_EXP))

# The most stacks a state keeps. Alternatives that share a long prefix (anyOf of similar objects,
# nested) multiply stacks, and every stack costs each mask; past this many, the first in sorted
# order are kept: fewer ways to go on, but each kept one still leads to a valid output.
MAX_STACKS = 64
# Whitespace between tokens of JSON: nothing, one space, or a newline and up to MAX_INDENT spaces or
# tabs (as llama.cpp's JSON grammar has it): room for compact and indented JSON, none for a model
# that would pad forever. A frame counts its gap's bytes: 0 none, 1 one space, 2 + k a newline and
# k indent bytes.
MAX_INDENT = 20
WHITESPACE = frozenset(b" \t\n")
_DIGITS = frozenset(b"0123456789")
_HEX = frozenset(b"0123456789abcdefABCDEF")
_ESCAPES = frozenset(b'"\\/bfnrt')
# Leads whose first continuation byte is narrower than 0x80-0xBF: E0 and F0 (no overlong forms),
# ED (no surrogates, U+D800-DFFF), F4 (nothing above U+10FFFF).
_FIRST_CONTINUATION = {0xE0: (0xA0, 0xBF), 0xED: (0x80, 0x9F), 0xF0: (0x90, 0xBF), 0xF4: (0x80, 0x8F)}


class Node(NamedTuple):
    """One schema node. Which fields mean something depends on `kind`:
    N_OBJECT: `keys` (each property's name as quoted JSON bytes), `children` (their nodes),
              `required` (per property), `extra` (node of additional properties' values, -1: none);
    N_ARRAY: `extra` (the items' node), `low`/`high` (minItems, maxItems; -1: unbounded);
    N_STRING: `low`/`high` (minLength, maxLength; -1: unbounded), or `regex` (its pattern's index
              in the grammar's regexes; -1: none);
    N_NUMBER: `integer`, and `regex` for an integer with bounds (core/structured/numeric_ranges.py);
    N_LITERAL: `keys` (the byte strings it may be);
    N_ANY_OF: `children` (the alternatives)."""

    kind: int
    keys: tuple[bytes, ...] = ()
    children: tuple[int, ...] = ()
    required: tuple[bool, ...] = ()
    extra: int = -1
    low: int = 0
    high: int = -1
    integer: bool = False
    regex: int = -1

    @property
    def tracks_length(self) -> bool:
        return self.kind == N_STRING and (self.low > 0 or self.high >= 0)


Stack = tuple  # of frames, the top last
State = frozenset  # of stacks


class Automaton:
    """Steps stacks of frames over one grammar's nodes, a byte at a time."""

    def __init__(self, nodes: list[Node], regexes: Sequence[Regex] = (), compact: bool = False,
                 rules: Rules | None = None) -> None:
        self.nodes = nodes
        self.regexes = regexes
        self.rules = rules
        self.compact = compact  # no whitespace between JSON tokens (vLLM's disable_any_whitespace)

    def advance(self, state: State, byte: int) -> State:
        """The state after `byte`; empty when no stack accepts it."""
        out: set[Stack] = set()
        for stack in state:
            out.update(self.step(stack, byte))
        if len(out) > MAX_STACKS:
            return frozenset(sorted(out)[:MAX_STACKS])
        return frozenset(out)

    def advance_bytes(self, state: State, data: bytes) -> State:
        for byte in data:
            if not state:
                break
            state = self.advance(state, byte)
        return state

    def can_end(self, state: State) -> bool:
        """Whether the output may end here: some stack is complete once its open numbers end."""
        return any(self._ended(stack) for stack in state)

    # --- one stack, one byte ------------------------------------------------------------------------
    def _gap(self, gap: int, c: int) -> int:
        return -1 if self.compact else _space(gap, c)

    def step(self, stack: Stack, c: int) -> list[Stack]:
        if not stack:
            return []  # the document is complete: nothing may follow
        top, rest = stack[-1], stack[:-1]
        kind = top[0]
        if kind == STRING:
            return self._string(rest, top, c)
        if kind == VALUE:
            if c in WHITESPACE:
                gap = self._gap(top[2], c)
                return [rest + ((VALUE, top[1], gap),)] if gap >= 0 else []
            return self.start_value(rest, top[1], c)
        if kind == OBJECT:
            return self._object(rest, top, c)
        if kind == ARRAY:
            return self._array(rest, top, c)
        if kind == KEY:
            return self._key(rest, top, c)
        if kind == NUMBER:
            return self._number(rest, top, c)
        if kind == LITERAL:
            return _literal(rest, top[1], top[2], c)
        if kind == TEXT:
            return _text(rest, top, c)
        if kind == PATTERN:
            return step_pattern(self.regexes, rest, top, c, self.step)
        if kind == RULE:
            return step_rule(self.rules, rest, top, c, self.step)
        return self._calls(rest, top, c)

    def start_value(self, rest: Stack, index: int, c: int) -> list[Stack]:
        """The stacks after `c` begins a value of node `index` on top of `rest`."""
        node = self.nodes[index]
        kind = node.kind
        if kind == N_ANY_OF:
            out: list[Stack] = []
            for child in node.children:
                out.extend(self.start_value(rest, child, c))
            return out
        if kind == N_STRING:
            if c != 0x22:
                return []
            if node.regex >= 0:
                initial = self.regexes[node.regex].initial
                return [rest + ((PATTERN, node.regex, initial, b"", PATTERN_QUOTED),)]
            return [rest + ((STRING, index, 0, 0, 0),)]
        if kind == N_OBJECT:
            return [rest + ((OBJECT, index, 0, O_FIRST, 0),)] if c == 0x7B else []
        if kind == N_ARRAY:
            return [rest + ((ARRAY, index, 0, A_FIRST, 0),)] if c == 0x5B else []
        if kind == N_NUMBER and node.regex >= 0:  # an integer with bounds: its pattern, bare
            regex = self.regexes[node.regex]
            after = regex.step(regex.initial, c) if c < 0x80 else frozenset()
            return [rest + ((PATTERN, node.regex, after, b"", PATTERN_BARE),)] if after else []
        if kind == N_NUMBER:
            phase = N_MINUS if c == 0x2D else N_ZERO if c == 0x30 else N_INT if c in _DIGITS else -1
            return [rest + ((NUMBER, node.integer, phase),)] if phase >= 0 else []
        return _literal(rest, node.keys, 0, c)

    def _object(self, rest: Stack, top: tuple, c: int) -> list[Stack]:
        _, index, prop, phase, spaces = top
        node = self.nodes[index]
        if c in WHITESPACE:
            gap = self._gap(spaces, c)
            return [rest + ((OBJECT, index, prop, phase, gap),)] if gap >= 0 else []
        if phase == O_COLON:
            if c != 0x3A:
                return []
            value = node.extra if not node.keys else node.children[prop]
            after = prop if not node.keys else prop + 1
            return [rest + ((OBJECT, index, after, O_NEXT, 0), (VALUE, value, 0))]
        if phase == O_NEXT:
            if c == 0x7D:
                return [rest] if not any(node.required[prop:]) else []
            more = prop < len(node.keys) if node.keys else node.extra >= 0
            return [rest + ((OBJECT, index, prop, O_COMMA, 0),)] if c == 0x2C and more else []
        # O_FIRST or O_COMMA: a key, or (right after `{`) the end
        if c == 0x7D and phase == O_FIRST:
            return [rest] if not any(node.required) else []
        if c != 0x22:
            return []
        if not node.keys:  # any key: a plain string, then the additional properties' value
            if node.extra < 0:
                return []
            return [rest + ((OBJECT, index, prop, O_COLON, 0), (STRING, -1, 0, 0, 0))]
        candidates = []
        for j in range(prop, len(node.keys)):
            candidates.append(j)
            if node.required[j]:
                break  # a required property cannot be skipped
        return [rest + (top, (KEY, index, tuple(candidates), 1))] if candidates else []

    def _key(self, rest: Stack, top: tuple, c: int) -> list[Stack]:
        _, index, candidates, pos = top
        keys = self.nodes[index].keys
        out: list[Stack] = []
        going_on = []
        for j in candidates:
            if keys[j][pos] == c:
                if pos + 1 == len(keys[j]):  # the closing quote: this is the key
                    out.append(rest[:-1] + ((OBJECT, index, j, O_COLON, 0),))
                else:
                    going_on.append(j)
        if going_on:
            out.append(rest + ((KEY, index, tuple(going_on), pos + 1),))
        return out

    def _array(self, rest: Stack, top: tuple, c: int) -> list[Stack]:
        _, index, count, phase, spaces = top
        node = self.nodes[index]
        if c in WHITESPACE:
            gap = self._gap(spaces, c)
            return [rest + ((ARRAY, index, count, phase, gap),)] if gap >= 0 else []
        if phase == A_NEXT:
            if c == 0x5D:
                return [rest] if count >= node.low else []
            if c == 0x2C and (node.high < 0 or count < node.high):
                return [rest + ((ARRAY, index, count, A_COMMA, 0),)]
            return []
        if c == 0x5D and phase == A_FIRST:
            return [rest] if node.low == 0 else []
        if node.high >= 0 and count >= node.high:
            return []
        return self.start_value(rest + ((ARRAY, index, count + 1, A_NEXT, 0),), node.extra, c)

    def _string(self, rest: Stack, top: tuple, c: int) -> list[Stack]:
        _, index, length, pending, escape = top
        if pending:  # inside a multi-byte UTF-8 character; `escape` holds a lead that narrows the next byte
            lo, hi = _FIRST_CONTINUATION.get(escape, (0x80, 0xBF))
            return [rest + ((STRING, index, length, pending - 1, 0),)] if lo <= c <= hi else []
        if escape == 1:  # after a backslash
            if c == 0x75:  # \uXXXX
                return [rest + ((STRING, index, length, 0, 14),)]
            return self._grow(rest, index, length, 0) if c in _ESCAPES else []
        if escape:  # 10 + hex digits still to come
            if c not in _HEX:
                return []
            return self._grow(rest, index, length, 0) if escape == 11 else [
                rest + ((STRING, index, length, 0, escape - 1),)]
        if c == 0x22:
            return [rest] if index < 0 or length >= self.nodes[index].low else []
        if c == 0x5C:
            return self._room(rest, index, length, (STRING, index, length, 0, 1))
        if c < 0x20:
            return []
        if c < 0x80:
            return self._grow(rest, index, length, 0)
        more = 1 if 0xC2 <= c <= 0xDF else 2 if 0xE0 <= c <= 0xEF else 3 if 0xF0 <= c <= 0xF4 else 0
        return self._grow(rest, index, length, more, c if c in _FIRST_CONTINUATION else 0) if more else []

    def _grow(self, rest: Stack, index: int, length: int, pending: int, lead: int = 0) -> list[Stack]:
        """One more character in a string (its first byte read, `pending` continuation bytes to come;
        `lead`, where it narrows the first of them, kept in the frame's escape slot until then)."""
        if index < 0 or not self.nodes[index].tracks_length:
            return [rest + ((STRING, index, 0, pending, lead),)]
        high = self.nodes[index].high
        if high >= 0 and length + 1 > high:
            return []
        return [rest + ((STRING, index, length + 1, pending, lead),)]

    def _room(self, rest: Stack, index: int, length: int, frame: tuple) -> list[Stack]:
        """`frame` if the string may hold one more character."""
        if index >= 0 and self.nodes[index].tracks_length:
            high = self.nodes[index].high
            if high >= 0 and length + 1 > high:
                return []
        return [rest + (frame,)]

    def _number(self, rest: Stack, top: tuple, c: int) -> list[Stack]:
        _, integer, phase = top
        digit = c in _DIGITS
        after = -1
        if phase == N_MINUS:
            after = N_ZERO if c == 0x30 else N_INT if digit else -1
        elif phase in (N_ZERO, N_INT):
            if digit and phase == N_INT:
                after = N_INT
            elif not integer and c == 0x2E:
                after = N_DOT
            elif not integer and c in (0x65, 0x45):
                after = N_E
        elif phase in (N_DOT, N_FRAC):
            after = N_FRAC if digit else N_E if phase == N_FRAC and c in (0x65, 0x45) else -1
        elif phase == N_E:
            after = N_ESIGN if c in (0x2B, 0x2D) else N_EXP if digit else -1
        else:  # N_ESIGN, N_EXP
            after = N_EXP if digit else -1
        if after >= 0:
            return [rest + ((NUMBER, integer, after),)]
        # The byte cannot extend the number: the number ends (if it may) and the frame below reads it.
        return self.step(rest, c) if phase in _NUMBER_ENDS else []

    def _ended(self, stack: Stack) -> bool:
        """Whether the stack is complete once the frames that may end without another byte end."""
        while stack:
            top = stack[-1]
            kind = top[0]
            if kind == PATTERN:
                ends = top[4] != PATTERN_QUOTED and not top[3] and self.regexes[top[1]].accepts(top[2])
            else:
                ends = (kind == NUMBER and top[2] in _NUMBER_ENDS) or (kind == CALLS and top[2] >= 1) or (
                    kind == RULE and rule_may_end(self.rules, top))
            if ends:
                stack = stack[:-1]
            else:
                return False
        return True

    def _calls(self, rest: Stack, top: tuple, c: int) -> list[Stack]:
        _, index, count, most = top
        if count >= most:
            return []
        opening = b"<tool_call>\n" if count == 0 else b"\n<tool_call>\n"
        block = ((LITERAL, (b"\n</tool_call>",), 0), (VALUE, index, 0), (LITERAL, (opening,), 0))
        return self.step(rest + ((CALLS, index, count + 1, most),) + block, c)


def _space(gap: int, c: int) -> int:
    """A gap's count after the whitespace byte `c`, or -1 where the gap may not hold it."""
    if gap == 0:
        return 1 if c == 0x20 else 2 if c == 0x0A else -1
    return gap + 1 if gap >= 2 and c != 0x0A and gap < 2 + MAX_INDENT else -1


def _literal(rest: Stack, literals: tuple[bytes, ...], pos: int, c: int) -> list[Stack]:
    out: list[Stack] = []
    going_on = []
    for literal in literals:
        if literal[pos] == c:
            if pos + 1 == len(literal):
                out.append(rest)
            else:
                going_on.append(literal)
    if going_on:
        out.append(rest + ((LITERAL, tuple(going_on), pos + 1),))
    return out


def _text(rest: Stack, top: tuple, c: int) -> list[Stack]:
    _, terminator, matched = top
    if terminator[matched] == c:
        return [rest] if matched + 1 == len(terminator) else [rest + ((TEXT, terminator, matched + 1),)]
    seen = terminator[:matched] + bytes((c,))
    # the longest end of what was seen that begins the terminator again
    again = next((k for k in range(min(len(seen), len(terminator) - 1), 0, -1)
                  if seen.endswith(terminator[:k])), 0)
    return [rest + ((TEXT, terminator, again),)]
