"""Rules: a context-free grammar in GBNF (llama.cpp's EBNF, the form vLLM's `guided_grammar` takes;
a lark grammar, vLLM's other form, is read by lark_parser.py into the same rules, from `start`),
compiled to one NFA a rule over Unicode code points and calls of other rules, which the automaton
(core/structured/automaton.py, its RULE frames) walks one byte at a time with a stack of calls.

The syntax (anything else is an EbnfError that names the line and column):

    root ::= greeting " " name ("!" | ".")?     # `root` is where the output starts
    greeting ::= "hello" | "hi"
    name ::= [A-Z] [a-z]* | "world"

rules `name ::= body` (a name of letters, digits, `_` and `-`; a rule runs until the next
`name ::=`, so its alternatives may span lines); double-quoted strings with the escapes `\\n \\t \\r
\\\\ \\" \\xHH \\uHHHH \\UHHHHHHHH`; classes `[...]` and `[^...]` with ranges and those escapes; `.`
for any character; groups `( )`; alternatives `|`; the repetitions `* + ? {n} {n,} {n,m}`; comments
from `#` to the end of a line.

Refused at compile time, each with the rule named: a rule that is used and never defined, no `root`,
a rule reachable from `root` that can derive no finite text (`a ::= "x" a`), and left recursion
(`expr ::= expr "+" term`, or through rules that may match nothing first): stepping it would call
the same rule again before reading a byte. Write such rules with repetition
(`expr ::= term ("+" term)*`).

States are frozensets of NFA states, epsilon-closed; a call of a rule that may match nothing also
closes over the state after the call, so a freshly called rule never returns without reading a
byte. Only states from which their rule's end can be reached are kept, so no state is a dead end.
"""

from __future__ import annotations

from core.structured.ebnf_parser import EbnfError, called_rules, parse_rules
from core.structured.lark_parser import START, looks_like_lark, parse_lark_rules
from core.structured.thompson import ThompsonNfa

MAX_GRAMMAR_BYTES = 64 * 1024
MAX_STATES = 20_000  # NFA states all rules may expand to ({n,m} copies its operand)
ROOT = "root"
_NEVER = 1 << 30  # frames needed where the end cannot be reached


class Rules(ThompsonNfa):
    """Compiled rules: `start` (the root's initial states), `step(states, code_point)`,
    `can_take(states, lo, hi)`, `calls(states)`, `accepts(states)` and `is_end(states)`."""


    def __init__(self, text: str) -> None:
        if len(text.encode()) > MAX_GRAMMAR_BYTES:
            raise EbnfError(f"the grammar is {len(text.encode())} bytes; at most {MAX_GRAMMAR_BYTES} "
                            "are served")
        bodies, root = (parse_lark_rules(text), START) if looks_like_lark(text) else (parse_rules(text), ROOT)
        if root not in bodies:
            raise EbnfError(f"the grammar has no '{root}' rule (where the output starts)")
        for name, body in bodies.items():
            for called in called_rules(body):
                if called not in bodies:
                    raise EbnfError(f"rule '{name}' uses rule '{called}', which is never defined")
        super().__init__(MAX_STATES)
        self.names = list(bodies)
        self._index = {name: i for i, name in enumerate(self.names)}
        self._calls: list[list[tuple[int, int]]] = []  # (rule, state after the call)
        self._first: list[int] = []
        self._final: list[int] = []
        self._owner: list[int] = []  # each state's rule: a rule's states are built one after another
        for rule, name in enumerate(self.names):
            first, final = self._build(bodies[name])
            self._first.append(first)
            self._final.append(final)
            self._owner += [rule] * (len(self._edges) - len(self._owner))
        self._finals = frozenset(self._final)
        reachable = self._reachable(self._index[root])
        self.nullable = self._nullable()
        productive = self._productive()
        for rule in sorted(reachable):
            if not productive[rule]:
                raise EbnfError(f"rule '{self.names[rule]}' can derive no finite text (every way through it "
                                "calls a rule that never ends)")
        self._live = frozenset(self._reaching(productive))
        self._check_left_recursion(reachable)
        self._need = self._frames_needed()
        self._memo: dict[tuple[frozenset, int], frozenset] = {}
        self._calls_memo: dict[frozenset, tuple[tuple[frozenset, frozenset], ...]] = {}
        self.start = self.closure({self._first[self._index[root]]})
        if not self.start:
            raise EbnfError(f"rule '{root}' matches no text")

    # --- stepping ---------------------------------------------------------------------------------
    def step(self, states: frozenset, cp: int) -> frozenset:
        """The states after the character `cp` (empty: it cannot come next in this rule)."""
        key = (states, cp)
        after = self._memo.get(key)
        if after is None:
            targets = {to for s in states for charset, to in self._edges[s] if cp in charset}
            after = self.closure(targets) if targets else frozenset()
            if len(self._memo) > 1 << 16:
                self._memo.clear()
            self._memo[key] = after
        return after

    def can_take(self, states: frozenset, lo: int, hi: int, most_frames: int = _NEVER) -> bool:
        """Whether some code point in lo..hi (a UTF-8 character begun, not finished) goes on, to a
        state whose end needs at most `most_frames` frames above it (frames_needed)."""
        return any(to in self._live and self._need[to] <= most_frames and charset.meets(lo, hi, False)
                   for s in states for charset, to in self._edges[s])

    def calls(self, states: frozenset) -> tuple[tuple[frozenset, frozenset], ...]:
        """Per rule these states may call: (its initial states, the caller's states after it)."""
        found = self._calls_memo.get(states)
        if found is None:
            pairs = ((self.closure({self._first[rule]}), self.closure({after}))
                     for s in sorted(states) for rule, after in self._calls[s])
            # a call with no way on after it (or into a rule that never ends) is no way on
            found = tuple(dict.fromkeys((first, back) for first, back in pairs if first and back))
            if len(self._calls_memo) > 1 << 14:
                self._calls_memo.clear()
            self._calls_memo[states] = found
        return found

    def accepts(self, states: frozenset) -> bool:
        """Whether the rule these states are in may end here."""
        return not self._finals.isdisjoint(states)

    def is_end(self, states: frozenset) -> bool:
        """Whether nothing can follow in the rule: its end and no way on (a call there needs no frame
        to return to: a tail call)."""
        return self.accepts(states) and all(not self._edges[s] and not self._calls[s] for s in states)

    def frames_needed(self, states: frozenset) -> int:
        """How many frames above this rule's own its end needs at the least: its frame at depth i
        can still end in a stack of at most N frames only if i + this < N (rule_frames.py)."""
        return min((self._need[s] for s in states), default=_NEVER)

    def closure(self, states: set[int]) -> frozenset:
        """Epsilon-closed and live; a call of a rule that may match nothing also leads past it."""
        seen, todo = set(states), list(states)
        while todo:
            s = todo.pop()
            nexts = list(self._eps[s])
            nexts += [after for rule, after in self._calls[s] if self.nullable[rule]]
            for nxt in nexts:
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return frozenset(seen) & self._live

    # --- analysis -----------------------------------------------------------------------------------
    def _reachable(self, root: int) -> set[int]:
        """The rules `root` may come to call."""
        called_by: dict[int, set[int]] = {}
        for s, calls in enumerate(self._calls):
            called_by.setdefault(self._owner[s], set()).update(rule for rule, _ in calls)
        seen, todo = {root}, [root]
        while todo:
            for called in called_by.get(todo.pop(), ()):
                if called not in seen:
                    seen.add(called)
                    todo.append(called)
        return seen

    def _nullable(self) -> list[bool]:
        """Per rule: whether it may match the empty text (a fixed point over the calls)."""
        nullable = [False] * len(self._first)
        changed = True
        while changed:
            changed = False
            for rule, first in enumerate(self._first):
                if nullable[rule]:
                    continue
                seen, todo = {first}, [first]
                while todo:
                    s = todo.pop()
                    for nxt in [*self._eps[s], *(to for r, to in self._calls[s] if nullable[r])]:
                        if nxt not in seen:
                            seen.add(nxt)
                            todo.append(nxt)
                if self._final[rule] in seen:
                    nullable[rule] = changed = True
        return nullable

    def _productive(self) -> list[bool]:
        """Per rule: whether it derives some finite text: its end reachable from its first state over
        characters and calls of productive rules (a fixed point)."""
        productive = [False] * len(self._first)
        while True:
            reach = self._reaching(productive)
            now = [first in reach for first in self._first]
            if now == productive:
                return productive
            productive = now

    def _reaching(self, productive: list[bool]) -> set[int]:
        """The states from which their rule's end is reachable over epsilons, characters and calls of
        productive rules."""
        back: list[list[tuple[int, int]]] = [[] for _ in self._edges]  # (from, the rule it calls or -1)
        for s in range(len(self._edges)):
            for t in self._eps[s]:
                back[t].append((s, -1))
            for _, t in self._edges[s]:
                back[t].append((s, -1))
            for rule, t in self._calls[s]:
                back[t].append((s, rule))
        reach, todo = set(self._final), list(self._final)
        while todo:
            for s, rule in back[todo.pop()]:
                if s not in reach and (rule < 0 or productive[rule]):
                    reach.add(s)
                    todo.append(s)
        return reach

    def _frames_needed(self) -> list[int]:
        """Per state, the fewest frames that must stand above its rule's frame on some way to its end
        (a fixed point): a character or an epsilon needs what the next state needs; a call needs one
        frame more than the callee needs, or (nothing after it in the caller: a tail call, the callee
        in the caller's place) what the callee needs; a call of a rule that may match nothing may
        also be passed over."""
        need = [_NEVER] * len(self._edges)
        for final in self._final:
            need[final] = 0
        tail = [self.is_end(self.closure({s})) for s in range(len(self._edges))]
        changed = True
        while changed:
            changed = False
            for s in range(len(self._edges)):
                best = min([need[s], *(need[t] for t in self._eps[s]), *(need[t] for _, t in self._edges[s])])
                for rule, after in self._calls[s]:
                    callee = need[self._first[rule]]
                    if self.nullable[rule]:
                        best = min(best, need[after])
                    best = min(best, callee if tail[after] else max(callee + 1, need[after]))
                if best < need[s]:
                    need[s] = best
                    changed = True
        return need

    def _check_left_recursion(self, reachable: set[int]) -> None:
        """A rule that can call itself again before reading a byte would make stepping loop forever."""
        first_calls = {rule: {r for s in self.closure({self._first[rule]}) for r, _ in self._calls[s]}
                       for rule in reachable}
        for rule in sorted(reachable):
            path, seen, todo = {rule: [rule]}, set(), [rule]
            while todo:
                at = todo.pop()
                for called in first_calls.get(at, ()):
                    if called == rule:
                        chain = " -> ".join(self.names[r] for r in [*path[at], rule])
                        raise EbnfError(f"rule '{self.names[rule]}' is left-recursive ({chain} before a "
                                        "character is read); write it with repetition, e.g. "
                                        "`list ::= item (\",\" item)*`")
                    if called not in seen:
                        seen.add(called)
                        path[called] = [*path[at], called]
                        todo.append(called)

    # --- Thompson construction (regex.ThompsonNfa), with the rule calls ----------------------------
    def _too_many(self) -> ValueError:
        return EbnfError(f"the grammar expands to more than {MAX_STATES} states")

    def _state(self) -> int:
        state = super()._state()
        self._calls.append([])
        return state

    def _build_other(self, node: tuple, start: int, end: int) -> None:
        assert node[0] == "call", node
        self._calls[start].append((self._index[node[1]], end))
