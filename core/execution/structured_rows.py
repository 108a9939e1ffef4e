"""StructuredRows: the allowed-token masks of a step's rows that sample with a structured output.

Rank 0 of a replica calls `masks(plan, rows)` between queuing the step's forward and its sampling,
so the host works out the masks while the GPU computes the logits. A request's spec and its output
so far travel in every plan it samples in (core/plan.py), so nothing here is needed for
correctness between steps: the automaton state reached after each output is memoized by a digest
of (spec, output ids), and a request that comes back after a preemption or from another replica
finds its state by replaying its output once. The vocabulary (the tokenizer's bytes per id) is
built on first use, so a server that never serves structured outputs never loads it.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable

import numpy as np

from core.plan import StepPlan
from core.structured.automaton import State
from core.structured.grammar import Grammar, compile_spec
from core.structured.token_masks import TokenMasks, Vocabulary

_REMEMBERED_STATES = 8192  # (spec, output) digests whose state is kept


class StructuredRows:
    def __init__(self, load_vocabulary: Callable[[], Vocabulary]) -> None:
        self._load_vocabulary = load_vocabulary
        self._masks: TokenMasks | None = None
        self._states: OrderedDict[bytes, State] = OrderedDict()

    @property
    def token_masks(self) -> TokenMasks:
        if self._masks is None:
            self._masks = TokenMasks(self._load_vocabulary())
        return self._masks

    def masks(self, plan: StepPlan, rows: np.ndarray, previous_tokens: Callable[[], np.ndarray]
              ) -> tuple[np.ndarray, np.ndarray] | None:
        """(positions in `rows` that sample with a structured output, packed bits uint8 [M, width / 8]
        of the tokens each may draw), or None when none does. `previous_tokens()`: the tokens sampled per
        request of the replica's previous step (waiting for it), which a request decoding from a
        placeholder has not yet seen in its history."""
        starts = plan.grammar_start
        constrained = np.flatnonzero(starts[rows + 1] > starts[rows])
        if not len(constrained):
            return None
        token_masks = self.token_masks
        allowed = np.zeros((len(constrained), -(-token_masks.vocabulary.width // 8)), np.uint8)
        previous = None
        for i, position in enumerate(constrained.tolist()):
            row = int(rows[position])
            spec = plan.grammar_spec[starts[row] : starts[row + 1]].tobytes()
            history = plan.history_ids[plan.history_start[row] : plan.history_start[row + 1]]
            output = history[plan.history_prompt_len[row] :]
            if plan.prev_row[row] >= 0:  # its last output is the previous step's, still on its way
                previous = previous_tokens() if previous is None else previous
                output = np.append(output, previous[plan.prev_row[row]])
            if len(output) != plan.output_pos[row]:
                raise ValueError(f"step {plan.step_id}: request {row} has {len(output)} output tokens in "
                                 f"its history, its position says {plan.output_pos[row]}")
            grammar = compile_spec(spec.decode())
            allowed[i] = token_masks.allowed(grammar, self._state(grammar, spec, output))
        return constrained, allowed

    def _state(self, grammar: Grammar, spec: bytes, output: np.ndarray) -> State:
        """The automaton state after `output`: from the memo, one token past a memoized state, or
        replayed from the start."""
        key = _digest(spec, output)
        state = self._states.get(key)
        if state is not None:
            self._states.move_to_end(key)
            return state
        token_masks = self.token_masks
        before = self._states.get(_digest(spec, output[:-1])) if len(output) else None
        if before is not None:
            state = token_masks.advance(grammar, before, int(output[-1]))
        else:
            state = grammar.initial
            for token_id in output.tolist():
                state = token_masks.advance(grammar, state, token_id)
                if not state:
                    break
        self._states[key] = state
        if len(self._states) > _REMEMBERED_STATES:
            self._states.popitem(last=False)
        return state


def _digest(spec: bytes, output: np.ndarray) -> bytes:
    hasher = hashlib.blake2b(spec, digest_size=16)
    hasher.update(np.ascontiguousarray(output, np.int32).tobytes())
    return hasher.digest()
