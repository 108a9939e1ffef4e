"""Regex: the regular expressions of JSON schemas' `pattern` and vLLM's `guided_regex`, compiled to
an NFA over Unicode code points that the automaton steps one character at a time.

The subset (anything else is a GrammarError that names it): literals and escaped punctuation;
`.` (any character but a newline); classes `[...]` and `[^...]` with ranges and the escapes below;
`\\d \\D \\w \\W \\s \\S`, `\\n \\t \\r \\f \\v`, `\\xHH`, `\\uHHHH`; groups `( )`, `(?: )` and named
ones; alternation `|`; the quantifiers `* + ? {n} {n,} {n,m}` (a lazy `?` after one changes nothing
here: the set of matches is the same); `^` first and `$` last. A pattern is matched whole; one
without `^` (or `$`) may have anything before (or after) its match, as JSON schema's unanchored
`pattern` allows. Not supported: backreferences, lookaround, `\\b`, flags.

States are frozensets of NFA state numbers (epsilon-closed), hashable, so the automaton's stacks
hold them as they are. `code_point` and `utf8_span` turn the automaton's bytes into code points: a
whole UTF-8 character, and the range a character begun but not finished may still become.
"""

from __future__ import annotations

from typing import NamedTuple

from core.structured.thompson import ThompsonNfa

MAX_STATES = 4096  # NFA states one pattern may expand to ({n,m} copies its operand)
_MAX_CODE_POINT = 0x10FFFF
_DIGIT = ((0x30, 0x39),)
_WORD = ((0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A))
_SPACE = ((0x09, 0x0D), (0x20, 0x20))
_CLASS_ESCAPES = {"d": (_DIGIT, False), "D": (_DIGIT, True), "w": (_WORD, False), "W": (_WORD, True),
                  "s": (_SPACE, False), "S": (_SPACE, True)}
_CHAR_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v", "0": "\0"}


class RegexError(ValueError):
    """A pattern outside the subset, or malformed; the message says what and where."""


class CharSet(NamedTuple):
    ranges: tuple[tuple[int, int], ...]
    negated: bool = False

    def __contains__(self, cp: int) -> bool:
        inside = any(lo <= cp <= hi for lo, hi in self.ranges)
        return inside != self.negated

    def meets(self, lo: int, hi: int, json: bool) -> bool:
        """Whether some code point in lo..hi is in the set (and, `json`, may stand unescaped in a
        JSON string: not a quote, a backslash or a control character)."""
        for a, b in _allowed_spans(lo, hi, json):
            if not self.negated:
                if any(r_lo <= b and a <= r_hi for r_lo, r_hi in self.ranges):
                    return True
            else:  # some point of a..b outside every range
                at = a
                for r_lo, r_hi in sorted(self.ranges):
                    if r_hi < at or r_lo > b:
                        continue
                    if r_lo > at:
                        return True
                    at = r_hi + 1
                if at <= b:
                    return True
        return False


def _allowed_spans(lo: int, hi: int, json: bool) -> list[tuple[int, int]]:
    """lo..hi less, in a JSON string, the code points that need an escape there."""
    if not json:
        return [(lo, hi)]
    spans, at = [], max(lo, 0x20)
    for banned in (0x22, 0x5C):
        if at <= banned <= hi:
            if at < banned:
                spans.append((at, banned - 1))
            at = banned + 1
    if at <= hi:
        spans.append((at, hi))
    return spans


ANY = CharSet(((0x0A, 0x0A),), negated=True)
EVERYTHING = CharSet((), negated=True)


class Regex(ThompsonNfa):
    """A compiled pattern: `initial`, `step(states, code_point)`, `accepts(states)`, `can_take`.

    `json`: the pattern constrains a JSON string's content, which here holds no escapes, so a
    character that would need one (a quote, a backslash, a control character) never matches, and
    states that could only go on with one are dropped, so no state is a dead end. `whole`: the
    match is the whole text even without `^` and `$` (vLLM's guided_regex)."""

    def __init__(self, pattern: str, json: bool, whole: bool = False) -> None:
        super().__init__(MAX_STATES)
        self.pattern = pattern
        self.json = json
        parser = _Parser(pattern)
        ast, anchored_start, anchored_end = parser.parse()
        if not anchored_start and not whole:
            ast = ("seq", [("repeat", ("set", EVERYTHING), 0, -1), ast])
        if not anchored_end and not whole:
            ast = ("seq", [ast, ("repeat", ("set", EVERYTHING), 0, -1)])
        start, self._final = self._build(ast)
        self._live = self._live_states()
        self.initial = self._closure({start}) & self._live
        if not self.initial:
            raise RegexError(f"pattern {pattern!r} matches no text that can be written"
                             + (" unescaped in a JSON string" if json else ""))
        self._memo: dict[tuple[frozenset, int], frozenset] = {}

    def step(self, states: frozenset, cp: int) -> frozenset:
        key = (states, cp)
        after = self._memo.get(key)
        if after is None:
            if self.json and (cp < 0x20 or cp in (0x22, 0x5C)):
                targets = set()
            else:
                targets = {to for s in states for charset, to in self._edges[s] if cp in charset}
            after = self._closure(targets) & self._live if targets else frozenset()
            if len(self._memo) > 1 << 16:
                self._memo.clear()
            self._memo[key] = after
        return after

    def accepts(self, states: frozenset) -> bool:
        return self._final in states

    def _too_many(self) -> ValueError:
        return RegexError(f"the pattern expands to more than {MAX_STATES} states")

    def can_take(self, states: frozenset, lo: int, hi: int) -> bool:
        """Whether some code point in lo..hi (a UTF-8 character begun, not finished) goes on."""
        return any(to in self._live and charset.meets(lo, hi, self.json)
                   for s in states for charset, to in self._edges[s])

    def _live_states(self) -> frozenset:
        """The NFA states from which the final one is reachable over characters that may be written."""
        live = {self._final}
        changed = True
        while changed:
            changed = False
            for s in range(len(self._edges)):
                if s in live:
                    continue
                if any(t in live for t in self._eps[s]) or any(
                        to in live and charset.meets(0, _MAX_CODE_POINT, self.json)
                        for charset, to in self._edges[s]):
                    live.add(s)
                    changed = True
        return frozenset(live)

    def _closure(self, states: set[int]) -> frozenset:
        seen, todo = set(states), list(states)
        while todo:
            for nxt in self._eps[todo.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return frozenset(seen)


class _Parser:
    """Recursive descent over the pattern; nodes are ("set", CharSet), ("seq", [...]),
    ("alt", [...]) and ("repeat", node, low, high)."""

    def __init__(self, pattern: str) -> None:
        self.text = pattern
        self.pos = 0

    def fail(self, what: str) -> RegexError:
        return RegexError(f"pattern {self.text!r}: {what} at position {self.pos}")

    def parse(self) -> tuple[tuple, bool, bool]:
        anchored_start = self.text.startswith("^")
        if anchored_start:
            self.pos = 1
        end = len(self.text)
        anchored_end = self.text.endswith("$") and not self.text.endswith("\\$") and end > self.pos
        self.end = end - 1 if anchored_end else end
        node = self._alternation()
        if self.pos != self.end:
            raise self.fail("unbalanced ')'" if self.text[self.pos] == ")" else f"{self.text[self.pos]!r}")
        return node, anchored_start, anchored_end

    def _peek(self) -> str | None:
        return self.text[self.pos] if self.pos < self.end else None

    def _alternation(self) -> tuple:
        options = [self._sequence()]
        while self._peek() == "|":
            self.pos += 1
            options.append(self._sequence())
        return options[0] if len(options) == 1 else ("alt", options)

    def _sequence(self) -> tuple:
        items = []
        while self._peek() not in (None, "|", ")"):
            items.append(self._quantified(self._atom()))
        return ("seq", items)

    def _quantified(self, atom: tuple) -> tuple:
        c = self._peek()
        if c in ("*", "+", "?"):
            self.pos += 1
            low, high = {"*": (0, -1), "+": (1, -1), "?": (0, 1)}[c]
        elif c == "{" and self._counted():
            low, high = self._counts()
        else:
            return atom
        if self._peek() == "?":
            self.pos += 1  # lazy: the same set of matches
        if self._peek() in ("*", "+", "?") or (self._peek() == "{" and self._counted()):
            raise self.fail("a quantifier after a quantifier")
        return ("repeat", atom, low, high)

    def _counted(self) -> bool:
        close = self.text.find("}", self.pos)
        inner = self.text[self.pos + 1 : close] if close > 0 else ""
        return bool(inner) and all(part.isdigit() or part == "" for part in inner.split(",", 1)) and \
            inner[0].isdigit()

    def _counts(self) -> tuple[int, int]:
        close = self.text.index("}", self.pos)
        inner = self.text[self.pos + 1 : close]
        self.pos = close + 1
        if "," not in inner:
            return int(inner), int(inner)
        low, high = inner.split(",", 1)
        if high and int(high) < int(low):
            raise self.fail(f"{{{inner}}} has its maximum below its minimum")
        return int(low), int(high) if high else -1

    def _atom(self) -> tuple:
        c = self.text[self.pos]
        self.pos += 1
        if c == "(":
            if self.text.startswith("?:", self.pos):
                self.pos += 2
            elif self.text.startswith(("?P<", "?<"), self.pos) and not self.text.startswith(("?<=", "?<!"),
                                                                                              self.pos):
                self.pos = self.text.index(">", self.pos) + 1
            elif self._peek() == "?":
                raise self.fail("lookaround and inline flags are not supported")
            node = self._alternation()
            if self._peek() != ")":
                raise self.fail("a '(' without its ')'")
            self.pos += 1
            return node
        if c == "[":
            return ("set", self._class())
        if c == ".":
            return ("set", ANY)
        if c == "\\":
            return ("set", self._escape(in_class=False))
        if c in "*+?":
            raise self.fail(f"{c!r} with nothing to repeat")
        if c in "^$":
            raise self.fail(f"{c!r} inside the pattern (only first or last)")
        return ("set", CharSet(((ord(c), ord(c)),)))

    def _escape(self, in_class: bool) -> CharSet:
        if self.pos >= len(self.text):
            raise self.fail("a '\\' at the end")
        c = self.text[self.pos]
        self.pos += 1
        if c in _CLASS_ESCAPES:
            ranges, negated = _CLASS_ESCAPES[c]
            return CharSet(ranges, negated)
        if c in _CHAR_ESCAPES:
            cp = ord(_CHAR_ESCAPES[c])
        elif c in "xu":
            digits = 2 if c == "x" else 4
            hex_text = self.text[self.pos : self.pos + digits]
            if len(hex_text) != digits or any(h not in "0123456789abcdefABCDEF" for h in hex_text):
                raise self.fail(f"\\{c} needs {digits} hex digits")
            self.pos += digits
            cp = int(hex_text, 16)
        elif c.isalnum():
            raise self.fail(f"\\{c} is not supported")
        else:
            cp = ord(c)  # escaped punctuation stands for itself
        return CharSet(((cp, cp),))

    def _class(self) -> CharSet:
        negated = self._peek() == "^"
        if negated:
            self.pos += 1
        ranges: list[tuple[int, int]] = []
        first = True
        while True:
            if self.pos >= len(self.text):
                raise self.fail("a '[' without its ']'")
            c = self.text[self.pos]
            if c == "]" and not first:
                self.pos += 1
                break
            first = False
            self.pos += 1
            if c == "\\":
                part = self._escape(in_class=True)
                if part.negated:
                    raise self.fail("a negated class escape inside [...]")
                if len(part.ranges) != 1 or part.ranges[0][0] != part.ranges[0][1]:
                    ranges.extend(part.ranges)
                    continue
                lo = part.ranges[0][0]
            else:
                lo = ord(c)
            if self.text.startswith("-", self.pos) and self.pos + 1 < len(self.text) and \
                    self.text[self.pos + 1] != "]":
                self.pos += 1
                c = self.text[self.pos]
                self.pos += 1
                hi = self._escape(in_class=True).ranges[0][0] if c == "\\" else ord(c)
                if hi < lo:
                    raise self.fail("a range whose end is below its start")
                ranges.append((lo, hi))
            else:
                ranges.append((lo, lo))
        return CharSet(tuple(ranges), negated)


def pattern_tree(pattern: str) -> tuple:
    """A pattern's parse, matched whole (anchors change nothing), in the tree form the grammars'
    parsers share: ("set", CharSet), ("seq", [...]), ("alt", [...]), ("repeat", item, low, high)."""
    return _Parser(pattern).parse()[0]


def utf8_span(partial: bytes, need: int) -> tuple[int, int]:
    """The code points a UTF-8 character of `need` bytes that begins with `partial` may be."""
    lead_bits = partial[0] & (0xFF >> (need + 1))
    lo = hi = lead_bits
    for i in range(1, need):
        byte = partial[i] if i < len(partial) else None
        lo = (lo << 6) | ((byte if byte is not None else 0x80) & 0x3F)
        hi = (hi << 6) | ((byte if byte is not None else 0xBF) & 0x3F)
    smallest = {2: 0x80, 3: 0x800, 4: 0x10000}[need]
    lo, hi = max(lo, smallest), min(hi, 0x10FFFF)
    # UTF-8 encodes no surrogates: a character begun \xED\xA0-\xBF can never be finished (lo > hi)
    if 0xD800 <= lo <= 0xDFFF:
        lo = 0xE000
    if 0xD800 <= hi <= 0xDFFF:
        hi = 0xD7FF
    return lo, hi


def code_point(data: bytes) -> int | None:
    """The one character `data` encodes in UTF-8, or None."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return ord(text) if len(text) == 1 else None
