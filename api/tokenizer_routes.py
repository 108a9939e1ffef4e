"""POST /tokenize, POST /detokenize and GET /tokenizer_info: the served model's tokenizer over HTTP, in
vLLM's request and response fields, answered by the tokenizer process (procs/tokenizer_queries.py).

What clients use them for: counting a prompt's tokens as the server will (a chat too, rendered by
the same template: `count` equals the chat completion's usage.prompt_tokens), and a "remote
tokenizer" for tools without the model's tokenizer files (lm-evaluation-harness's
local-completions detects these three routes and tokenizes through them).

* /tokenize: `prompt` (a string) or `messages` (a chat, with the chat endpoint's `tools`,
  `add_generation_prompt`, `continue_final_message` and `chat_template_kwargs`), plus
  `return_token_strs`;
  `add_special_tokens` is accepted and changes nothing (Qwen3's tokenizer adds no BOS).
* /detokenize: `tokens`, an array of token ids (empty gives "").
* /tokenizer_info: no body.
Every bad field gets a 400 naming it; a `model` other than the served one a 404; an engine that
does not answer a 503. Like vLLM's, they are outside /v1/ and need no API key.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Coroutine
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from api.body_fields import BodyFields, describe, is_token_id
from api.chat_messages import parse_continue_final_message, parse_messages, parse_template_kwargs
from api.client_errors import ClientError
from api.errors import SERVER_ERROR, ApiError, error_object, invalid
from api.json_response import JSONResponse
from api.protocol import ServedModel, parse_json_body
from api.tool_fields import parse_tool_fields
from ipc.messages import TokenizerQuery

TOKENIZE_FIELDS = frozenset({"model", "prompt", "messages", "add_special_tokens", "return_token_strs",
                             "add_generation_prompt", "continue_final_message", "chat_template_kwargs",
                             "tools", "tool_choice", "parallel_tool_calls"})
DETOKENIZE_FIELDS = frozenset({"model", "tokens"})


def parse_tokenize(body: Any, model: ServedModel, query_id: str, strict: bool) -> TokenizerQuery:
    fields = BodyFields(body, TOKENIZE_FIELDS, "/tokenize", strict=strict)
    _check_model(fields, model)
    fields.bool("add_special_tokens", True)  # Qwen3's tokenizer adds no special tokens either way
    return_strs = fields.bool("return_token_strs", False)
    prompt, messages = fields.get("prompt"), fields.get("messages")
    if (prompt is None) == (messages is None):
        raise invalid("prompt", "give exactly one of 'prompt' (text) and 'messages' (a chat)")
    if prompt is not None:
        if not isinstance(prompt, str):
            raise invalid("prompt", f"'prompt' must be a string, got {describe(prompt)}")
        return TokenizerQuery(query_id, "tokenize", prompt=prompt, return_token_strs=return_strs)
    turns = parse_messages(messages)
    add_generation_prompt = fields.bool("add_generation_prompt", True)
    return TokenizerQuery(query_id, "tokenize", messages=turns, tools=parse_tool_fields(fields).tools,
                          enable_thinking=parse_template_kwargs(fields),
                          add_generation_prompt=add_generation_prompt,
                          continue_final_message=parse_continue_final_message(fields, turns,
                                                                              add_generation_prompt),
                          return_token_strs=return_strs)


def parse_detokenize(body: Any, model: ServedModel, query_id: str, strict: bool) -> TokenizerQuery:
    fields = BodyFields(body, DETOKENIZE_FIELDS, "/detokenize", strict=strict)
    _check_model(fields, model)
    tokens = fields.get("tokens", required=True)
    if not isinstance(tokens, list):
        raise invalid("tokens", f"'tokens' must be an array of token ids, got {describe(tokens)}")
    bad = next((i for i, t in enumerate(tokens) if not is_token_id(t)), None)
    if bad is not None:
        raise invalid("tokens", f"'tokens[{bad}]' must be a non-negative integer token id, got "
                      f"{describe(tokens[bad])}")
    return TokenizerQuery(query_id, "detokenize", token_ids=[int(t) for t in tokens])


def _check_model(fields: BodyFields, model: ServedModel) -> None:
    name = fields.str("model")
    if name is not None and name != model.name:
        raise ApiError(404, f"the model {name!r} does not exist; this server serves {model.name!r}", "model")



Handler = Callable[[Request], Coroutine[Any, Any, Response]]


def tokenizer_routes(server: Any) -> list[Route]:
    """The three routes, for an ApiServer (its config, client and body reader)."""

    async def ask(query: TokenizerQuery) -> Response:
        try:
            answer = await server.client.ask_tokenizer(query, server.config.info_timeout_s)
        except ClientError as e:
            return JSONResponse(error_object(f"the tokenizer did not answer: {e}", SERVER_ERROR), 503)
        if answer.error is not None:
            raise invalid(answer.error_field, answer.error)
        return JSONResponse(answer.body)

    def body_route(parse: Callable[[Any, ServedModel, str, bool], TokenizerQuery]) -> Handler:
        async def handle(request: Request) -> Response:
            body = parse_json_body(await server.read_body(request))
            config = server.config
            return await ask(parse(body, config.model, uuid.uuid4().hex, config.strict_request_fields))
        return handle

    async def info(request: Request) -> Response:
        return await ask(TokenizerQuery(uuid.uuid4().hex, "info"))

    return [Route("/tokenize", body_route(parse_tokenize), methods=["POST"]),
            Route("/detokenize", body_route(parse_detokenize), methods=["POST"]),
            Route("/tokenizer_info", info, methods=["GET"])]
