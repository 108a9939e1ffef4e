"""ReasoningSplitter: a Qwen3 chat reply, fed as text deltas, split into reasoning and content.

Qwen3 thinks first: a reply that starts with `<think>` carries its reasoning up to `</think>`, then
the answer. The chat endpoint (api/openai_serving.py) feeds each text delta of a choice to one
splitter and sends the two parts as `reasoning_content` and `content`, streaming or not; the same
splitter serves both, so a streamed reply concatenates to exactly the non-streamed one.

What it does with the text:
* a reply that does not start with `<think>` (after leading whitespace) is all content: thinking
  disabled, or a model that does not think;
* the tags are dropped, so are the newlines that Qwen3 puts right after `<think>`, right before
  `</think>` and right after `</think>`;
* a reply cut off inside its reasoning (max_tokens) has reasoning and no content.
Text that might still turn out to be a tag (`<thi`), or newlines that might precede `</think>`, is
held back until the next delta decides it, or until `finish()`.
"""

from __future__ import annotations

from typing import NamedTuple

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


class Split(NamedTuple):
    reasoning: str
    content: str


class ReasoningSplitter:
    def __init__(self) -> None:
        self._state = "start"  # "start" -> "reasoning" -> "answer"; or "start" -> "content"
        self._held = ""
        self._reasoning_started = False  # newlines are dropped until reasoning text begins
        self._answer_started = False  # likewise for the answer after </think>

    @property
    def thinking(self) -> bool:
        """Inside the think block: text fed now is reasoning."""
        return self._state == "reasoning"

    def feed(self, text: str) -> Split:
        if self._state == "start":
            self._held += text
            head = self._held.lstrip()
            if head.startswith(THINK_OPEN):
                self._state, self._held = "reasoning", ""
                return self._feed_reasoning(head[len(THINK_OPEN):])
            if THINK_OPEN.startswith(head):
                return Split("", "")  # still possibly the opening tag
            self._state, held, self._held = "content", self._held, ""
            return Split("", held)
        if self._state == "reasoning":
            return self._feed_reasoning(text)
        if self._state == "answer":
            return Split("", self._answer(text))
        return Split("", text)

    def finish(self) -> Split:
        """Whatever is held back, once no more text will come."""
        held, self._held = self._held, ""
        if self._state == "start":
            self._state = "content"
            return Split("", held)
        if self._state == "reasoning":
            return Split(held if self._reasoning_started else held.lstrip("\n"), "")
        return Split("", "")

    def _feed_reasoning(self, text: str) -> Split:
        buffer = self._held + text
        end = buffer.find(THINK_CLOSE)
        if end >= 0:
            reasoning = buffer[:end].rstrip("\n")
            if not self._reasoning_started:
                reasoning = reasoning.lstrip("\n")
            self._state, self._held = "answer", ""
            return Split(reasoning, self._answer(buffer[end + len(THINK_CLOSE):]))
        cut = len(buffer) - partial_suffix(buffer, THINK_CLOSE)
        while cut > 0 and buffer[cut - 1] == "\n":
            cut -= 1  # newlines right before </think> are not reasoning
        emitted, self._held = buffer[:cut], buffer[cut:]
        if not self._reasoning_started:
            emitted = emitted.lstrip("\n")
            self._reasoning_started = bool(emitted)
        return Split(emitted, "")

    def _answer(self, text: str) -> str:
        if not self._answer_started:
            text = text.lstrip("\n")
            self._answer_started = bool(text)
        return text


def partial_suffix(text: str, tag: str) -> int:
    """The length of the longest suffix of `text` that is a proper prefix of `tag`."""
    for length in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-length:]):
            return length
    return 0
