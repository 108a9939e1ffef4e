"""A chat template the operator gives (`cadence serve --chat-template`), in place of the checkpoint's.

vLLM's flag of the same name: a file, or the template itself when the text holds Jinja. It is
compiled at start, so a template that does not parse is refused before any process starts, with
Jinja's line and reason. A tokenizer with Hugging Face files hands it to transformers, which renders
checkpoint templates; the built-in vocabulary renders it here the way transformers does: Jinja in a
sandbox with trim_blocks and lstrip_blocks, loop controls, `raise_exception` and `strftime_now`, the
variables `messages`, `tools`, `add_generation_prompt`, `enable_thinking` and the special tokens;
`continue_final_message` renders the chat closed and cuts it after the last message's content.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any


class ChatTemplateError(ValueError):
    """A template that cannot be read, compiled or rendered; the message says which and why."""


def read_chat_template(value: str) -> str:
    """`--chat-template`'s value as template text: a file's contents, or the value itself when it
    holds Jinja; compiled once here so that a broken template fails now."""
    path = Path(value).expanduser()
    if path.is_file():
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ChatTemplateError(f"--chat-template {value}: cannot read the file: {exc}") from None
    elif "{{" in value or "{%" in value:
        text = value
    else:
        raise ChatTemplateError(f"--chat-template {value!r} is neither a file nor a Jinja template "
                                "(a template holds '{{' or '{%')")
    JinjaChatTemplate(text, "--chat-template")
    return text


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(f"the chat template refused the messages: {message}")


def _strftime_now(date_format: str) -> str:
    return datetime.now().strftime(date_format)


class JinjaChatTemplate:
    def __init__(self, source: str, origin: str = "the chat template") -> None:
        from jinja2 import TemplateSyntaxError
        from jinja2.ext import loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                    extensions=[loopcontrols])
        environment.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now)
        try:
            self._template = environment.from_string(source)
        except TemplateSyntaxError as exc:
            raise ChatTemplateError(f"{origin} does not compile: line {exc.lineno}: {exc.message}") from None
        self.source = source

    def render(self, messages: Sequence[Mapping], add_generation_prompt: bool = True,
               enable_thinking: bool = True, tools: Sequence[Mapping] | None = None,
               continue_final_message: bool = False, special_tokens: Mapping[str, Any] | None = None) -> str:
        from jinja2 import TemplateError

        if continue_final_message and (not messages or not isinstance(messages[-1].get("content"), str)):
            raise ChatTemplateError("continue_final_message needs a last message with text content")
        try:
            text = self._template.render(
                messages=list(messages), tools=list(tools) if tools else None,
                add_generation_prompt=add_generation_prompt and not continue_final_message,
                enable_thinking=enable_thinking, **(special_tokens or {}))
        except ChatTemplateError:
            raise
        except TemplateError as exc:
            raise ChatTemplateError(f"the chat template failed on the messages: {exc}") from None
        if continue_final_message:
            final = messages[-1]["content"].strip()
            end = text.rfind(final)
            if not final or end < 0:
                raise ChatTemplateError("continue_final_message: the chat template's output does not "
                                        "hold the last message's content")
            text = text[: end + len(final)]
        return text
