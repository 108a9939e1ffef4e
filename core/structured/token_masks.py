"""TokenMasks: which tokens of the vocabulary a structured output's state allows next.

A token is allowed when the automaton (core/structured/automaton.py) accepts all its bytes from the
state. Walking 150k tokens byte by byte for every step would take seconds in Python, so:

* the automaton runs over all tokens at once, a byte position at a time (token_columns.py): each
  token carries a small state number through a numpy table, and only (state, byte) pairs not met
  before step the real automaton; tokens whose first byte no stack accepts are never read further;
* a state is a set of stacks and a token is allowed when some stack accepts it, so masks are
  computed and cached per stack (the same stack recurs all through an output);
* inside a string (the common case: most steps of a JSON output write a string's content) a
  token with no quote, backslash, control byte or broken UTF-8 leaves the stack as it was, so all
  those tokens (~96 % of Qwen's vocabulary) are allowed at once from a precomputed mask and only
  the others are walked: those without a quote by the string's own frame alone (they cannot close
  it, so what follows the string does not matter; cached per frame), only the ~1.3k with a quote
  with the whole stack; free text up to a terminator (a `<think>` block) likewise, with the
  tokens that cannot begin or go on with the terminator;
* transitions are memoized: inside a string most bytes map a stack to itself.

Masks are packed bits (np.packbits' order: the first token is the top bit of byte 0), 19 KB for
Qwen's vocabulary: the host ORs them and the GPU unpacks them (core/execution/sampler.py).
Where the output may end, the vocabulary's end-of-sequence tokens are allowed too. A state from
which nothing is allowed (the output hit a dead end, which the masks make impossible unless the
request's own stop conditions interfere) allows the end tokens, so the request ends rather than
sampling from an empty distribution.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from core.structured.automaton import STRING, TEXT, State
from core.structured.grammar import Grammar
from core.structured.pattern_frames import PATTERN, PATTERN_QUOTED
from core.structured.token_columns import TokenColumns, TokenSubset, Transitions

_CACHED_STACKS = 4096  # masks kept, ~19 KB each (packed bits)
_CACHED_TRANSITIONS = 1 << 16  # (grammar, state, byte) -> state; cleared when full
_CACHED_TABLES = 32  # grammars whose transition tables are kept, up to ~2 MB each


@dataclass(frozen=True)
class Vocabulary:
    """The tokens a structured output may use, sorted by their bytes, and the logits' width."""

    sorted_bytes: list[bytes]
    sorted_ids: np.ndarray  # int64, parallel to sorted_bytes
    width: int  # logits per row (a model's embedding may be wider than its tokenizer)
    end_ids: tuple[int, ...]  # end-of-sequence ids, allowed where the output may end
    token_bytes: tuple[bytes, ...]  # by id, b"" for ids the outputs never use

    @classmethod
    def build(cls, token_bytes: Iterable[bytes], width: int, end_ids: Iterable[int],
              excluded: Iterable[int] = ()) -> Vocabulary:
        """`token_bytes` by id; `excluded` (special tokens) are never allowed, except the end ids."""
        by_id = list(token_bytes)[:width]
        for token_id in excluded:
            if token_id < len(by_id):
                by_id[token_id] = b""
        order = sorted((data, token_id) for token_id, data in enumerate(by_id) if data)
        return cls([data for data, _ in order], np.array([token_id for _, token_id in order], np.int64),
                   width, tuple(i for i in end_ids if i < width), tuple(by_id))

    @classmethod
    def of_tokenizer(cls, tokenizer, width: int) -> Vocabulary:
        """The vocabulary of a core.tokenizer Tokenizer for logits `width` wide: its special tokens
        excluded, its end-of-sequence ids the end."""
        return cls.build((tokenizer.token_bytes(i) for i in range(tokenizer.vocab_size)), width,
                         tokenizer.eos_token_ids, tokenizer.special_token_ids)

    def subset(self, keep) -> tuple[list[bytes], np.ndarray, np.ndarray]:
        """(sorted bytes, their ids) of the tokens where `keep(bytes)` is false, and a mask [width]
        of those where it is true."""
        mask = np.zeros(self.width, bool)
        rest_bytes, rest_ids = [], []
        for data, token_id in zip(self.sorted_bytes, self.sorted_ids.tolist(), strict=True):
            if keep(data):
                mask[token_id] = True
            else:
                rest_bytes.append(data)
                rest_ids.append(token_id)
        return rest_bytes, np.array(rest_ids, np.int64), mask


def unpack(packed: np.ndarray, width: int) -> np.ndarray:
    """Bool [..., width] of packed masks."""
    return np.unpackbits(packed, axis=-1, count=width).view(bool)


def _is_string_content(data: bytes) -> bool:
    """Bytes that leave an open JSON string open and unchanged: whole UTF-8, no quote, backslash or
    control byte."""
    if b'"' in data or b"\\" in data or min(data) < 0x20:
        return False
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


class TokenMasks:
    """Allowed-token masks of structured outputs over one vocabulary, cached across requests."""

    def __init__(self, vocabulary: Vocabulary) -> None:
        self.vocabulary = vocabulary
        self._columns = TokenColumns(vocabulary.sorted_bytes, vocabulary.sorted_ids, vocabulary.width)
        self._all = self._columns.subset(vocabulary.sorted_ids)
        string_rest, string_ids, self._string_content = vocabulary.subset(_is_string_content)
        # the tokens that are not plain string content, by whether they can close a string
        self._unclosing = self._split(string_rest, string_ids, quoted=False)
        self._closing = self._split(string_rest, string_ids, quoted=True)
        # every token, by whether it holds a quote: a patterned string's frame alone reads the others
        self._quoted = self._split(vocabulary.sorted_bytes, vocabulary.sorted_ids, quoted=True)
        self._unquoted = self._split(vocabulary.sorted_bytes, vocabulary.sorted_ids, quoted=False)
        self._inside: OrderedDict[tuple[str, tuple], np.ndarray] = OrderedDict()  # per string frame
        # characters per string-content token, for strings whose length the schema bounds
        self._chars = np.zeros(vocabulary.width, np.int64)
        for data, token_id in zip(vocabulary.sorted_bytes, vocabulary.sorted_ids.tolist(), strict=True):
            self._chars[token_id] = sum(1 for byte in data if not 0x80 <= byte <= 0xBF)
        self._text: dict[tuple[bytes, int], tuple[TokenSubset, np.ndarray]] = {}
        self._masks: OrderedDict[tuple[str, tuple], np.ndarray] = OrderedDict()
        self._transitions: dict[tuple[str, State, int], State] = {}
        self._tables: OrderedDict[str, Transitions] = OrderedDict()  # per grammar, for the masks

    def _split(self, token_bytes: list[bytes], ids: np.ndarray, quoted: bool) -> TokenSubset:
        """The tokens of a subset with a quote in them (or without)."""
        keep = [i for i, data in enumerate(token_bytes) if (b'"' in data) == quoted]
        return self._columns.subset(ids[keep])

    def allowed(self, grammar: Grammar, state: State) -> np.ndarray:
        """Packed bits, uint8 [ceil(width / 8)]: the tokens allowed next from `state`."""
        packed = np.zeros(-(-self.vocabulary.width // 8), np.uint8)
        for stack in state:
            packed |= self._stack_mask(grammar, stack)
        if not packed.any() or grammar.automaton.can_end(state):
            for token_id in self.vocabulary.end_ids:
                packed[token_id >> 3] |= 0x80 >> (token_id & 7)
        return packed

    def advance(self, grammar: Grammar, state: State, token_id: int) -> State:
        """The state after a sampled token (empty when the grammar does not allow it)."""
        if token_id in self.vocabulary.end_ids:
            return state
        data = self.vocabulary.token_bytes[token_id] if token_id < len(self.vocabulary.token_bytes) else b""
        if not data:
            return frozenset()
        for byte in data:
            state = self._step(grammar, state, byte)
            if not state:
                break
        return state

    # --- one stack ------------------------------------------------------------------------------------
    def _stack_mask(self, grammar: Grammar, stack: tuple) -> np.ndarray:
        key = (grammar.key, stack)
        packed = self._masks.get(key)
        if packed is not None:
            self._masks.move_to_end(key)
            return packed
        packed = self._masks[key] = np.packbits(self._compute(grammar, stack))
        if len(self._masks) > _CACHED_STACKS:
            self._masks.popitem(last=False)
        return packed

    def _compute(self, grammar: Grammar, stack: tuple) -> np.ndarray:
        top = stack[-1] if stack else None
        if top is not None and top[0] == STRING and top[3] == 0 and top[4] == 0:
            mask = self._string_content.copy()
            node = grammar.nodes[top[1]] if top[1] >= 0 else None
            if node is not None and node.tracks_length and node.high >= 0:
                mask &= self._chars <= node.high - top[2]
            mask[self._inside_ids(grammar, top, self._unclosing)] = True
            rest = self._closing
        elif (top is not None and top[0] == PATTERN and top[4] == PATTERN_QUOTED and not top[3]
              and len(stack) > 1):
            # a patterned JSON string: only a quote can end it, so the tokens without one depend on
            # its frame alone
            mask = np.zeros(self.vocabulary.width, bool)
            mask[self._inside_ids(grammar, top, self._unquoted)] = True
            rest = self._quoted
        elif top is not None and top[0] == TEXT and top[1][0] not in top[1][1:]:
            rest, plain = self._text_subset(top[1], top[2])
            mask = plain.copy()
        else:
            rest = self._all
            mask = np.zeros(self.vocabulary.width, bool)
        mask[self._accepted(grammar, frozenset((stack,)), rest)] = True
        return mask

    def _inside_ids(self, grammar: Grammar, top: tuple, subset: TokenSubset) -> np.ndarray:
        """Ids of the tokens of `subset` (none with a quote) that the string frame `top` accepts
        without closing: what follows the string does not matter to them."""
        key = (grammar.key, top)
        ids = self._inside.get(key)
        if ids is None:
            ids = self._inside[key] = self._accepted(grammar, frozenset([(top,)]), subset)
            if len(self._inside) > _CACHED_STACKS:
                self._inside.popitem(last=False)
        return ids

    def _text_subset(self, terminator: bytes, matched: int) -> tuple[TokenSubset, np.ndarray]:
        """Tokens that leave free text `matched` bytes into its terminator back at no match (no
        byte of them starts the terminator, and the first does not go on with it; valid for
        terminators whose first byte does not recur): the others, and a mask of these."""
        key = (terminator, matched)
        if key not in self._text:
            first, going_on = terminator[0], terminator[matched] if matched else -1
            rest_bytes, rest_ids, plain = self.vocabulary.subset(
                lambda data: first not in data and data[0] != going_on)
            self._text[key] = (self._columns.subset(rest_ids), plain)
        return self._text[key]

    def _accepted(self, grammar: Grammar, state: State, tokens: TokenSubset) -> np.ndarray:
        """Ids of the tokens of `tokens` whose every byte `state` accepts."""
        table = self._tables.get(grammar.key)
        if table is None:
            table = self._tables[grammar.key] = Transitions(grammar.automaton.advance, capacity=2048)
            if len(self._tables) > _CACHED_TABLES:
                self._tables.popitem(last=False)
        self._tables.move_to_end(grammar.key)
        return self._columns.accepted(state, tokens, table)

    def _step(self, grammar: Grammar, state: State, byte: int) -> State:
        key = (grammar.key, state, byte)
        after = self._transitions.get(key)
        if after is None:
            after = grammar.automaton.advance(state, byte)
            if len(self._transitions) >= _CACHED_TRANSITIONS:
                self._transitions.clear()
            self._transitions[key] = after
        return after
