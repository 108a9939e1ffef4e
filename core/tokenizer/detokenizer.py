"""IncrementalDetokenizer: sampled token ids in, the text they add out, one request at a time.

The output process feeds each request's new ids as they arrive and streams what comes back. The
contract: nothing returned ever holds half a UTF-8 character, and after `finish()` the pieces
joined equal `tokenizer.decode(all_ids, skip_special_tokens=...)`.

Two strategies, picked from the tokenizer:
- `ByteStream` (byte-level vocabularies: the built-in Qwen one, byte-level BPE tokenizer.json):
  concatenates token bytes through an incremental UTF-8 decoder, which holds back an unfinished
  character; O(new tokens) per call.
- `WindowedRedecode` (any other tokenizer): re-decodes a short window of recent ids and emits the
  difference, waiting while the window ends in U+FFFD (vLLM's prefix/read offsets); O(window).
"""

from __future__ import annotations

import codecs
from collections.abc import Iterable

from core.tokenizer.tokenizer import Tokenizer

REPLACEMENT_CHAR = "\ufffd"


class ByteStream:
    """Token bytes through an incremental UTF-8 decoder."""

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool) -> None:
        self._tokenizer = tokenizer
        self._skipped = tokenizer.special_token_ids if skip_special_tokens else frozenset()
        # errors="replace" matches decode(): invalid bytes become U+FFFD once they cannot be
        # the start of a character any more; an unfinished tail waits for the next bytes.
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_ids: Iterable[int]) -> str:
        data = b"".join(self._tokenizer.token_bytes(i) for i in token_ids if i not in self._skipped)
        return self._utf8.decode(data)

    def finish(self) -> str:
        return self._utf8.decode(b"", final=True)


class WindowedRedecode:
    """Decode ids[prefix_offset:] and emit what it adds past ids[prefix_offset:read_offset].

    Decoding from a few tokens back, rather than from the new ids alone, keeps context-dependent
    decoders (SentencePiece's leading space) right.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool) -> None:
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        self._ids: list[int] = []
        self._prefix_offset = 0  # start of the decoded window
        self._read_offset = 0  # ids before this are already emitted

    def push(self, token_ids: Iterable[int]) -> str:
        self._ids.extend(token_ids)
        prefix_text, window_text = self._decode_window()
        if len(window_text) <= len(prefix_text) or window_text.endswith(REPLACEMENT_CHAR):
            return ""  # nothing new, or a character still cut in half
        self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
        return window_text[len(prefix_text) :]

    def finish(self) -> str:
        prefix_text, window_text = self._decode_window()
        self._prefix_offset = self._read_offset = len(self._ids)
        return window_text[len(prefix_text) :]

    def _decode_window(self) -> tuple[str, str]:
        def decode(ids: list[int]) -> str:
            return self._tokenizer.decode(ids, skip_special_tokens=self._skip_special_tokens)

        prefix_text = decode(self._ids[self._prefix_offset : self._read_offset])
        return prefix_text, decode(self._ids[self._prefix_offset :])


class IncrementalDetokenizer:
    """Streams one request's text: `push(ids)` per step, `finish()` once at the end."""

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = False) -> None:
        strategy = ByteStream if tokenizer.has_token_bytes else WindowedRedecode
        self._strategy = strategy(tokenizer, skip_special_tokens)
        self._finished = False

    def push(self, token_ids: Iterable[int]) -> str:
        """The text that the new ids complete; holds back an unfinished character."""
        if self._finished:
            raise RuntimeError("IncrementalDetokenizer.push after finish(): the request is over")
        return self._strategy.push(token_ids)

    def finish(self) -> str:
        """What was held back (an unfinished character comes out as U+FFFD, as decode() does)."""
        if self._finished:
            return ""
        self._finished = True
        return self._strategy.finish()
