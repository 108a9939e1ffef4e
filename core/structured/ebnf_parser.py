"""The GBNF syntax core/structured/ebnf.py compiles (its docstring lists it): text -> {rule name: body},
a body an AST of ("set", CharSet), ("call", name), ("seq", [...]), ("alt", [...]) and
("repeat", item, low, high) (high -1: unbounded), the forms core/structured/regex.py's parser makes
too. Errors name the line and column."""

from __future__ import annotations

from core.structured.regex import EVERYTHING, CharSet

_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "[": "[", "]": "]", "-": "-",
            "^": "^", "/": "/"}
_HEX_DIGITS = {"x": 2, "u": 4, "U": 8}
MAX_REPEAT = 1000


class EbnfError(ValueError):
    """A grammar outside the syntax, or one that cannot be enforced; the message says what and where."""


def parse_rules(text: str) -> dict[str, tuple]:
    return _Parser(text).rules()


def called_rules(node: tuple) -> list[str]:
    """The rule names a body calls."""
    kind = node[0]
    if kind == "call":
        return [node[1]]
    if kind in ("seq", "alt"):
        return [name for item in node[1] for name in called_rules(item)]
    if kind == "repeat":
        return called_rules(node[1])
    return []


class TextParser:
    """What the grammar syntaxes' parsers share: a place in the text, alternatives of sequences,
    comments skipped, errors naming the line and column. A subclass gives `_primary`, `_quantified`
    and `_rule_ends_here` (where a top-level sequence meets the next rule's definition)."""

    COMMENT = "#"  # a comment runs from this to the end of its line
    CLOSERS = ("", "|", ")")  # what ends a sequence
    LABEL = "grammar"  # what errors call the text

    def __init__(self, text: str) -> None:
        self.text = text
        self.at = 0

    def _alternatives(self, top: bool = False) -> tuple:
        options = [self._sequence(top)]
        while self._peek() == "|":
            self.at += 1
            options.append(self._sequence(top))
        return options[0] if len(options) == 1 else ("alt", options)

    def _sequence(self, top: bool) -> tuple:
        items = []
        while True:
            self._space()
            if self._peek() in self.CLOSERS or (top and self._rule_ends_here()):
                break
            items.append(self._quantified(self._primary()))
        return items[0] if len(items) == 1 else ("seq", items)

    def _primary(self) -> tuple:
        raise NotImplementedError

    def _quantified(self, item: tuple) -> tuple:
        raise NotImplementedError

    def _rule_ends_here(self) -> bool:
        raise NotImplementedError

    def _quoted(self) -> str:
        """A double-quoted string's characters, its escapes read (`_char`); on one line."""
        self.at += 1
        chars = []
        while True:
            if self.at >= len(self.text) or self.text[self.at] == "\n":
                raise self._error("a string without its closing '\"'")
            if self.text[self.at] == '"':
                self.at += 1
                return "".join(chars)
            chars.append(self._char())

    def _char(self) -> str:
        c = self.text[self.at]
        self.at += 1
        if c != "\\":
            return c
        if self.at >= len(self.text):
            raise self._error("a '\\' at the end of the grammar")
        e = self.text[self.at]
        self.at += 1
        if e in _ESCAPES:
            return _ESCAPES[e]
        if e in _HEX_DIGITS:
            digits = self.text[self.at : self.at + _HEX_DIGITS[e]]
            if len(digits) != _HEX_DIGITS[e] or any(d not in "0123456789abcdefABCDEF" for d in digits):
                raise self._error(f"'\\{e}' needs {_HEX_DIGITS[e]} hex digits")
            self.at += len(digits)
            value = int(digits, 16)
            if value > 0x10FFFF or 0xD800 <= value <= 0xDFFF:
                raise self._error(f"'\\{e}{digits}' is not a character")
            return chr(value)
        raise self._error(f"unknown escape '\\{e}'")

    def _space(self) -> None:
        while self.at < len(self.text):
            if self.text[self.at] in " \t\r\n":
                self.at += 1
            elif self.text.startswith(self.COMMENT, self.at):
                end = self.text.find("\n", self.at)
                self.at = len(self.text) if end < 0 else end + 1
            else:
                return

    def _peek(self, skip_space: bool = True) -> str:
        if skip_space:
            self._space()
        return self.text[self.at] if self.at < len(self.text) else ""

    def _where(self) -> str:
        line = self.text.count("\n", 0, self.at) + 1
        column = self.at - (self.text.rfind("\n", 0, self.at) + 1) + 1
        return f"line {line}, column {column}"

    def _error(self, what: str) -> EbnfError:
        return EbnfError(f"{what} ({self.LABEL} {self._where()})")


class _Parser(TextParser):
    """GBNF text -> {rule name: body}."""

    def rules(self) -> dict[str, tuple]:
        rules: dict[str, tuple] = {}
        self._space()
        if self.at >= len(self.text):
            raise EbnfError("the grammar is empty")
        while self.at < len(self.text):
            where = self._where()
            name = self._name()
            self._space()
            if not self.text.startswith("::=", self.at):
                raise self._error(f"expected '::=' after the rule name '{name}'")
            self.at += 3
            if name in rules:
                raise EbnfError(f"rule '{name}' is defined twice (the second at {where})")
            rules[name] = self._alternatives(top=True)
        return rules

    def _rule_ends_here(self) -> bool:
        """Whether a `name ::=` begins here (where the rule before it ends)."""
        end = self.at
        while end < len(self.text) and self.text[end] in _NAME_CHARS:
            end += 1
        if end == self.at:
            return False
        rest = end
        while rest < len(self.text) and self.text[rest] in " \t\r\n":
            rest += 1
        return self.text.startswith("::=", rest)

    def _primary(self) -> tuple:
        c = self._peek()
        if c == '"':
            return self._string()
        if c == "[":
            return ("set", self._class())
        if c == ".":
            self.at += 1
            return ("set", EVERYTHING)
        if c == "(":
            self.at += 1
            body = self._alternatives()
            self._space()
            if self._peek() != ")":
                raise self._error("a group '(' without its ')'")
            self.at += 1
            return body
        if c in _NAME_CHARS:
            return ("call", self._name())
        raise self._error(f"unexpected {c!r}")

    def _quantified(self, item: tuple) -> tuple:
        while True:
            c = self._peek()
            if c == "*":
                item = ("repeat", item, 0, -1)
            elif c == "+":
                item = ("repeat", item, 1, -1)
            elif c == "?":
                item = ("repeat", item, 0, 1)
            elif c == "{":
                item = self._braces(item)
                continue
            else:
                return item
            self.at += 1

    def _braces(self, item: tuple) -> tuple:
        close = self.text.find("}", self.at)
        inside = self.text[self.at + 1 : close] if close > 0 else ""
        low, comma, high = inside.replace(" ", "").partition(",")
        if close < 0 or not low.isdigit() or (high and not high.isdigit()):
            raise self._error("a repetition '{' must read {n}, {n,} or {n,m}")
        lo = int(low)
        hi = lo if not comma else int(high) if high else -1
        if 0 <= hi < lo:
            raise self._error(f"a repetition {{{inside}}} whose maximum is below its minimum")
        if max(lo, hi) > MAX_REPEAT:
            raise self._error(f"a repetition {{{inside}}} over {MAX_REPEAT}")
        self.at = close + 1
        return ("repeat", item, lo, hi)

    def _string(self) -> tuple:
        return ("seq", [("set", CharSet(((ord(c), ord(c)),))) for c in self._quoted()])

    def _class(self) -> CharSet:
        self.at += 1
        negated = self._peek(skip_space=False) == "^"
        if negated:
            self.at += 1
        ranges = []
        while True:
            if self.at >= len(self.text):
                raise self._error("a class '[' without its ']'")
            if self.text[self.at] == "]":
                self.at += 1
                break
            lo = self._char()
            hi = lo
            if self.text.startswith("-", self.at) and not self.text.startswith("-]", self.at):
                self.at += 1
                hi = self._char()
            if ord(hi) < ord(lo):
                raise self._error(f"a class range {lo!r}-{hi!r} that runs backwards")
            ranges.append((ord(lo), ord(hi)))
        return CharSet(tuple(ranges), negated)

    def _name(self) -> str:
        start = self.at
        while self.at < len(self.text) and self.text[self.at] in _NAME_CHARS:
            self.at += 1
        if self.at == start:
            raise self._error("expected a rule name")
        return self.text[start : self.at]
