"""The one tokenizer interface of Cadence and its Hugging Face implementation.

The API layer encodes prompts and renders chats through a `Tokenizer`; the detokenizer turns
sampled ids back into text through `token_bytes`. Two implementations sit behind it: `HFTokenizer`
(a model directory's tokenizer.json, through transformers) here, and `QwenVocabTokenizer` (the
built-in Qwen vocabulary, for presets that ship no tokenizer files) in `qwen_vocab.py`;
`load_tokenizer` in `loader.py` picks one for a model.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from functools import cache
from pathlib import Path

from core.tokenizer.chat_template import flatten_contents, render_chatml
from core.tokenizer.jinja_template import JinjaChatTemplate


class TokenizerError(ValueError):
    """A tokenizer that cannot be loaded or an id it cannot handle; the message names which."""


class Tokenizer(ABC):
    """Text <-> token ids for one vocabulary, plus the chat format of its models.

    Contract shared by every implementation:
    - `encode` adds no BOS and turns special-token text ("<|im_start|>") into the special id.
    - when `has_token_bytes` is true, `decode(ids)` equals the UTF-8 decoding (errors replaced by
      U+FFFD) of the concatenated `token_bytes` of the ids, special ones dropped when skipped;
      the incremental detokenizer relies on that to work on bytes.
    - ids the vocabulary lacks (a model's padding rows past the tokenizer's ids) decode to nothing,
      as in Hugging Face tokenizers.
    """

    vocab_size: int  # ids 0..vocab_size-1 are the tokenizer's; a model's embedding may be larger
    eos_token_ids: tuple[int, ...]  # ids that end generation, most specific first
    special_token_ids: frozenset[int]  # ids that decode(skip_special_tokens=True) drops
    has_token_bytes: bool  # token_bytes is exact (see the contract above)
    # Whether `encode` may run on several threads at once, without the GIL (tiktoken); transformers'
    # tokenizers may reconfigure themselves inside encode, so they say no.
    encodes_concurrently: bool = False
    # The Jinja chat template in use: the operator's (set_chat_template), else the checkpoint's; None:
    # the built-in Qwen3 ChatML renderer.
    chat_template: str | None = None
    _override: JinjaChatTemplate | None = None

    @abstractmethod
    def encode(self, text: str) -> list[int]: ...

    @abstractmethod
    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str: ...

    @abstractmethod
    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for: possibly part of a UTF-8 character."""

    def apply_chat_template(
        self,
        messages: Sequence[Mapping],
        add_generation_prompt: bool = True,
        enable_thinking: bool = True,
        tools: Sequence[Mapping] | None = None,
        continue_final_message: bool = False,
    ) -> str:
        """The prompt text for a chat offering `tools`, in the built-in Qwen3 ChatML form unless a
        template was set; `continue_final_message` leaves the last (assistant) message open."""
        if self._override is not None:
            return self._override.render(flatten_contents(messages), add_generation_prompt, enable_thinking,
                                         tools, continue_final_message, self.special_tokens_map())
        return render_chatml(messages, add_generation_prompt, enable_thinking, tools, continue_final_message)

    def set_chat_template(self, source: str) -> None:
        """Render chats with `source` (`cadence serve --chat-template`) instead of the default."""
        self._override = JinjaChatTemplate(source)
        self.chat_template = source

    def special_tokens_map(self) -> dict[str, str | None]:
        """The special tokens a template may name (Qwen3's: no BOS; the end of a turn ends a reply)."""
        return {"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}


@cache
def _byte_of_char() -> dict[str, int]:
    """GPT-2's byte alphabet, inverted: byte-level BPE writes every byte as one printable char.

    Printable Latin-1 bytes stand for themselves; the other 68 (controls, space, 0x7f-0xa0, 0xad)
    are shifted, in byte order, to the chars from U+0100 on.
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    byte_of_char = {chr(b): b for b in printable}
    shifted = (b for b in range(256) if b not in byte_of_char.values())
    for offset, b in enumerate(shifted):
        byte_of_char[chr(256 + offset)] = b
    return byte_of_char


class HFTokenizer(Tokenizer):
    """A model directory's own tokenizer (tokenizer.json / tokenizer_config.json) via transformers."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self._template_origin = f"the chat template of {self.directory}"
        # transformers is heavy to import; presets on the built-in vocabulary never need it.
        from transformers import AutoTokenizer

        try:
            self._hf = AutoTokenizer.from_pretrained(str(self.directory))
        except Exception as exc:  # transformers and tokenizers raise many types, Rust errors included
            raise TokenizerError(f"cannot load the tokenizer in {self.directory}: {exc}") from exc
        backend = getattr(self._hf, "backend_tokenizer", None)
        if backend is None:
            raise TokenizerError(
                f"the tokenizer in {self.directory} is a slow (Python) tokenizer; Cadence needs a "
                f"tokenizer.json (a fast tokenizer)"
            )
        self._backend = backend
        added = self._hf.added_tokens_decoder  # {id: AddedToken}
        self._added_bytes = {i: t.content.encode("utf-8") for i, t in added.items()}
        self.vocab_size = len(self._hf)
        self.special_token_ids = frozenset(
            {i for i, t in added.items() if t.special} | set(self._hf.all_special_ids)
        )
        self.eos_token_ids = self._find_eos_ids()
        self.chat_template = self._hf.chat_template if isinstance(self._hf.chat_template, str) else None
        self.has_token_bytes = self._decodes_bytewise()
        self._bytes_cache: dict[int, bytes] = {}

    def _find_eos_ids(self) -> tuple[int, ...]:
        vocab = self._hf.get_vocab()
        found = [vocab[t] for t in ("<|im_end|>", "<|endoftext|>") if t in vocab]
        if self._hf.eos_token_id is not None:
            found.append(self._hf.eos_token_id)
        return tuple(dict.fromkeys(found))

    def _decodes_bytewise(self) -> bool:
        from tokenizers import decoders

        # Space clean-up rewrites decoded text, so bytes alone would not reproduce decode().
        return isinstance(self._backend.decoder, decoders.ByteLevel) and not getattr(
            self._hf, "clean_up_tokenization_spaces", False
        )

    def encode(self, text: str) -> list[int]:
        return self._hf.encode(text, add_special_tokens=False)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self._hf.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_bytes(self, token_id: int) -> bytes:
        cached = self._bytes_cache.get(token_id)
        if cached is not None:
            return cached
        if not self.has_token_bytes:
            raise TokenizerError(
                f"the tokenizer in {self.directory} is not byte-level BPE; token {token_id} has no bytes"
            )
        if token_id < 0:
            raise TokenizerError(f"token id {token_id} is negative")
        if token_id in self._added_bytes:
            # Added tokens decode as their literal content, not through the byte alphabet.
            data = self._added_bytes[token_id]
        else:
            piece = self._backend.id_to_token(token_id)
            data = b"" if piece is None else self._piece_bytes(token_id, piece)
        self._bytes_cache[token_id] = data
        return data

    def _piece_bytes(self, token_id: int, piece: str) -> bytes:
        byte_of_char = _byte_of_char()
        try:
            return bytes(byte_of_char[c] for c in piece)
        except KeyError as exc:
            raise TokenizerError(
                f"token {token_id} ({piece!r}) of the tokenizer in {self.directory} has the char "
                f"{exc.args[0]!r}, outside the byte-level alphabet"
            ) from exc

    def set_chat_template(self, source: str) -> None:
        JinjaChatTemplate(source)  # refused here, as for the built-in vocabulary, if it does not compile
        self._hf.chat_template = self.chat_template = source  # transformers renders it
        self._template_origin = "the --chat-template template"

    def apply_chat_template(
        self,
        messages: Sequence[Mapping],
        add_generation_prompt: bool = True,
        enable_thinking: bool = True,
        tools: Sequence[Mapping] | None = None,
        continue_final_message: bool = False,
    ) -> str:
        if self._hf.chat_template is None:
            return super().apply_chat_template(messages, add_generation_prompt, enable_thinking, tools,
                                               continue_final_message)
        flat = flatten_contents(messages)
        try:
            text = self._hf.apply_chat_template(
                flat,
                tools=list(tools) if tools else None,
                tokenize=False,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message,
                enable_thinking=enable_thinking,
            )
        except Exception as exc:  # jinja2 raises its own types, templates raise_exception(...)
            raise ValueError(f"{self._template_origin} rejected the messages: {exc}") from exc
        return text
