"""Lark grammars, the other form vLLM's `guided_grammar` takes (vLLM turns one it recognizes into
GBNF): text -> {rule name: body} in ebnf_parser.py's AST, `start` the rule an output starts from.

The subset: rules and terminals `name: ...` (a leading `?` or `!` and a `.priority` are accepted and
change nothing here); alternatives `|`, also at the start of a continued line; strings "..."
(GBNF's escapes; with the `i` flag: either case); character ranges "a".."z"; regular expressions
/.../ (core/structured/regex.py's subset, matched whole; no flags); names; groups `( )`; optional
`[ ]`; `? * +`; `~ n` and `~ n..m`; comments `//` to the end of a line. Directives (`%import`,
`%ignore`, `%declare`, ...) are refused: `%ignore` lets text stand between any two symbols, which
this compiles to nothing.
Errors name the line and column.
"""

from __future__ import annotations

import re

from core.structured.ebnf_parser import MAX_REPEAT, EbnfError, TextParser
from core.structured.regex import CharSet, RegexError, pattern_tree

START = "start"
_NAME = re.compile(r"[?!]?([A-Za-z_][A-Za-z0-9_]*)(\.-?\d+)?\s*:(?!:)")
_DEFINITION = re.compile(r"^[ \t]*[?!]?[A-Za-z_][A-Za-z0-9_]*(\.-?\d+)?[ \t]*:(?![:=])", re.MULTILINE)
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_COUNT = re.compile(r"(\d+)(?:\.\.(\d+))?")
_FLAGS = re.compile(r"[a-z]*")


def looks_like_lark(text: str) -> bool:
    """No GBNF `::=`, and a line that defines `name:` (vLLM's test of the same)."""
    return "::=" not in text and _DEFINITION.search(_strip_comments(text)) is not None


def parse_lark_rules(text: str) -> dict[str, tuple]:
    return _LarkParser(text).rules()


def _strip_comments(text: str) -> str:
    return re.sub(r"//[^\n]*", "", text)


class _LarkParser(TextParser):
    COMMENT = "//"
    CLOSERS = ("", "|", ")", "]")
    LABEL = "lark grammar"

    def rules(self) -> dict[str, tuple]:
        rules: dict[str, tuple] = {}
        self._space()
        while self.at < len(self.text):
            if self.text[self.at] == "%":
                directive = self.text[self.at :].split(None, 1)[0]
                raise self._error(f"the directive {directive!r} is not supported (a lark grammar's "
                                  "%ignore would let text stand between any two symbols)")
            where = self._where()
            found = _NAME.match(self.text, self.at)
            if not found:
                raise self._error("expected a rule or terminal definition `name: ...`")
            name = found.group(1)
            self.at = found.end()
            if name in rules:
                raise EbnfError(f"rule '{name}' is defined twice (the second at {where})")
            rules[name] = self._alternatives(top=True)
        return rules

    def _rule_ends_here(self) -> bool:
        """A directive, or a `name:` opening its line."""
        if self.text.startswith("%", self.at):
            return True
        line_start = self.text.rfind("\n", 0, self.at) + 1
        return not self.text[line_start : self.at].strip() and _NAME.match(self.text, self.at) is not None

    def _primary(self) -> tuple:
        c = self._peek()
        if c == '"':
            return self._string()
        if c == "/":
            return self._regex()
        if c in ("(", "["):
            self.at += 1
            body = self._alternatives()
            close = ")" if c == "(" else "]"
            if self._peek() != close:
                raise self._error(f"a group {c!r} without its {close!r}")
            self.at += 1
            return body if c == "(" else ("repeat", body, 0, 1)
        found = _IDENTIFIER.match(self.text, self.at)
        if found:
            self.at = found.end()
            return ("call", found.group())
        raise self._error(f"unexpected {c!r}")

    def _quantified(self, item: tuple) -> tuple:
        while True:
            c = self._peek_on_line()  # a `?` opening the next line is a rule's prefix, not this
            if c in ("?", "*", "+"):
                self.at += 1
                low, high = {"?": (0, 1), "*": (0, -1), "+": (1, -1)}[c]
                item = ("repeat", item, low, high)
            elif c == "~":
                self.at += 1
                self._space()
                found = _COUNT.match(self.text, self.at)
                if not found:
                    raise self._error("'~' needs a count: ~ n or ~ n..m")
                self.at = found.end()
                low = int(found.group(1))
                high = int(found.group(2)) if found.group(2) else low
                if high < low or high > MAX_REPEAT:
                    raise self._error(f"a repetition ~ {found.group()} runs backwards or over {MAX_REPEAT}")
                item = ("repeat", item, low, high)
            else:
                return item

    def _string(self) -> tuple:
        first = self._quoted()
        if self.text.startswith("..", self.at):  # "a".."z": a range of characters
            self.at += 2
            self._space()
            if self._peek() != '"':
                raise self._error('a range ".." needs a second string')
            last = self._quoted()
            if len(first) != 1 or len(last) != 1 or ord(last) < ord(first):
                raise self._error(f'a range "{first}".."{last}" must join two single characters in order')
            return ("set", CharSet(((ord(first), ord(last)),)))
        fold = self.text.startswith("i", self.at) and not self.text[self.at + 1 : self.at + 2].isalnum()
        if fold:
            self.at += 1
        sets = []
        for c in first:
            cases = {x for x in (c, c.lower(), c.upper()) if len(x) == 1} if fold else {c}
            sets.append(("set", CharSet(tuple((ord(x), ord(x)) for x in sorted(cases)))))
        return ("seq", sets)

    def _regex(self) -> tuple:
        start = self.at + 1
        at = start
        while at < len(self.text) and self.text[at] != "/":
            if self.text[at] == "\n":
                break
            at += 2 if self.text[at] == "\\" else 1
        if at >= len(self.text) or self.text[at] != "/":
            raise self._error("a regular expression /.../ without its closing '/'")
        pattern = self.text[start:at]
        self.at = at + 1
        flags = _FLAGS.match(self.text, self.at).group()
        if flags:
            raise self._error(f"regular expression flags {flags!r} are not supported")
        try:
            node = pattern_tree(pattern)
        except RegexError as e:
            raise self._error(str(e)) from None
        return node

    def _peek_on_line(self) -> str:
        while self.at < len(self.text) and self.text[self.at] in " \t":
            self.at += 1
        return self.text[self.at] if self.at < len(self.text) else ""
