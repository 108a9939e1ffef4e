"""Thompson's construction of an NFA from a parse tree, shared by the regular expressions
(core/structured/regex.py) and the grammars' rules (core/structured/ebnf.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from core.structured.regex import CharSet


class ThompsonNfa:
    """Thompson's construction of an NFA from a parse tree: ("set", CharSet) an edge, ("seq", [...]),
    ("alt", [...]) and ("repeat", item, low, high) (high -1: unbounded) epsilons, `_edges` and
    `_eps` per state. A subclass builds other kinds of node in `_build_other` (the grammars' rule
    calls) and says what too many states is an error of in `_too_many`."""

    def __init__(self, max_states: int) -> None:
        self._edges: list[list[tuple[CharSet, int]]] = []
        self._eps: list[list[int]] = []
        self.max_states = max_states  # ({n,m} copies its operand)

    def _too_many(self) -> ValueError:
        return ValueError(f"the NFA expands to more than {self.max_states} states")

    def _state(self) -> int:
        if len(self._edges) >= self.max_states:
            raise self._too_many()
        self._edges.append([])
        self._eps.append([])
        return len(self._edges) - 1

    def _build_other(self, node: tuple, start: int, end: int) -> None:
        raise ValueError(f"no NFA for a {node[0]!r} node")

    def _build(self, node: tuple) -> tuple[int, int]:
        """The node's (first state, last state)."""
        kind = node[0]
        start, end = self._state(), self._state()
        if kind == "set":
            self._edges[start].append((node[1], end))
        elif kind == "seq":
            at = start
            for item in node[1]:
                first, last = self._build(item)
                self._eps[at].append(first)
                at = last
            self._eps[at].append(end)
        elif kind == "alt":
            for option in node[1]:
                first, last = self._build(option)
                self._eps[start].append(first)
                self._eps[last].append(end)
        elif kind == "repeat":  # high -1: unbounded
            _, item, low, high = node
            at = start
            for _ in range(low):
                first, last = self._build(item)
                self._eps[at].append(first)
                at = last
            if high < 0:
                first, last = self._build(item)
                self._eps[at] += [first, end]
                self._eps[last] += [first, end]
            else:
                for _ in range(high - low):
                    first, last = self._build(item)
                    self._eps[at] += [first, end]
                    at = last
            self._eps[at].append(end)
        else:
            self._build_other(node, start, end)
        return start, end
