"""A call of another API's dialect (OpenAI's Responses, Anthropic's Messages) served as a chat
completion: the ChatCall (api/openai_serving.py) runs it, and a subclass renders the reply's parts,
in order, as that API's items or blocks (api/responses_call.py, api/anthropic_call.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from api.openai_serving import ChatCall


def reply_parts(message_or_delta: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    """A chat message's (or streamed delta's) parts in order: ("reasoning", text), ("answer", text),
    then ("call", tool call) for each function call."""
    if message_or_delta.get("reasoning_content"):
        yield "reasoning", message_or_delta["reasoning_content"]
    if message_or_delta.get("content"):
        yield "answer", message_or_delta["content"]
    for call in message_or_delta.get("tool_calls") or []:
        yield "call", call


class ChatDialectCall:
    """What a dialect's call shares: the ChatCall it runs as, started, streamed and closed by it."""

    def __init__(self, chat: ChatCall) -> None:
        self.chat = chat

    @property
    def stream(self) -> bool:
        return self.chat.stream

    async def start(self) -> None:
        await self.chat.start()

    def close(self) -> None:
        self.chat.close()

    async def whole_reply(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The chat completion's one choice and its usage, once the reply is whole."""
        reply = await self.chat.collect()
        return reply["choices"][0], reply["usage"]
