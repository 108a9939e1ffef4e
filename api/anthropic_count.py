"""POST /v1/messages/count_tokens (Anthropic's): the prompt tokens of a Messages body, counted as
/v1/messages will count them (the same chat, template, tools and thinking switch) without running
it. Claude Code asks it to decide when to compact a conversation.

The body is a Messages body without `max_tokens` (one sent anyway is ignored);
the answer is `{"input_tokens": N}`, the whole prompt (on /v1/messages the cached share of it is
reported apart, as `cache_read_input_tokens`). Counted by the tokenizer process, as /tokenize is.
"""

from __future__ import annotations

from typing import Any

from api.anthropic_request import parse_messages_body
from api.body_fields import describe
from api.errors import invalid
from api.protocol import ServedModel
from api.tokenizer_routes import parse_tokenize
from ipc.messages import TokenizerQuery

# The chat body's fields that shape its prompt (the rest sample or constrain the reply).
_PROMPT_FIELDS = ("model", "messages", "tools", "tool_choice", "parallel_tool_calls", "chat_template_kwargs")


def parse_count_tokens_body(body: Any, model: ServedModel, query_id: str) -> TokenizerQuery:
    """The tokenizer query that counts the body's prompt, or ApiError naming its first bad field."""
    if not isinstance(body, dict):
        raise invalid(None, f"the request body must be a JSON object, got {describe(body)}")
    chat = parse_messages_body({**body, "max_tokens": 1}).chat_body  # a max_tokens sent changes no count
    return parse_tokenize({k: chat[k] for k in _PROMPT_FIELDS if k in chat}, model, query_id, strict=False)
