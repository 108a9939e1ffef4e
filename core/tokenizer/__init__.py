"""Tokenization for Cadence: the Tokenizer interface, the chat template, streaming detokenization."""

from core.tokenizer.chat_template import ChatMessage, parse_messages, render_chatml
from core.tokenizer.detokenizer import IncrementalDetokenizer
from core.tokenizer.loader import load_tokenizer
from core.tokenizer.qwen_vocab import QWEN3_SPECIAL_TOKENS, QwenVocabTokenizer
from core.tokenizer.stop_strings import StopCheck, StopStringMatcher
from core.tokenizer.tokenizer import HFTokenizer, Tokenizer, TokenizerError

__all__ = [
    "QWEN3_SPECIAL_TOKENS",
    "ChatMessage",
    "HFTokenizer",
    "IncrementalDetokenizer",
    "QwenVocabTokenizer",
    "StopCheck",
    "StopStringMatcher",
    "Tokenizer",
    "TokenizerError",
    "load_tokenizer",
    "parse_messages",
    "render_chatml",
]
