"""`load_tokenizer`: the tokenizer a model gets, its directory's own or the built-in Qwen3 vocabulary."""

from __future__ import annotations

from pathlib import Path

from core.tokenizer.qwen_vocab import QwenVocabTokenizer
from core.tokenizer.tokenizer import HFTokenizer, Tokenizer, TokenizerError

# Any of these in a directory means it carries its own tokenizer.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json")


def _has_tokenizer_files(directory: Path) -> bool:
    return any((directory / name).is_file() for name in TOKENIZER_FILES)


def load_tokenizer(model_path: str | Path | None) -> Tokenizer:
    """A model directory's own tokenizer, or the built-in Qwen3 vocabulary when it has none.

    None (a preset with dummy weights) and a directory without tokenizer files get the built-in
    vocabulary; a path that is not a directory is an error rather than a silent fallback.
    """
    if model_path is not None:
        directory = Path(model_path)
        if not directory.is_dir():
            raise TokenizerError(f"model path {directory} is not a directory")
        if _has_tokenizer_files(directory):
            return HFTokenizer(directory)
    return QwenVocabTokenizer()
