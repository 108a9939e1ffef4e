"""The tokenizer process's answers to TokenizerQuery: what the REST server's /tokenize, /detokenize
and /tokenizer_info return, in vLLM's field names (evaluation tools such as lm-evaluation-harness
use these routes as a "remote tokenizer" when they have no copy of the model's tokenizer).

* tokenize: {"count", "max_model_len", "tokens", "token_strs"}: the ids a GenerateRequest with the
  same prompt (or chat, rendered by the same template) would be served with, so `count` is the
  usage's prompt_tokens; `token_strs` (return_token_strs) each token's text, else null. No
  special tokens are added: Qwen3's tokenizer has no BOS.
* detokenize: {"prompt"}: the ids' text, special tokens included, as vLLM gives it. Ids outside
  the model's vocabulary are refused, naming the first.
* info: the tokenizer's identity and special tokens, `model_max_length` (the server's
  max_model_len) and `chat_template` (the checkpoint's Jinja template; null on the built-in
  vocabulary, whose Qwen3 template is built into the server rather than written in Jinja).
"""

from __future__ import annotations

from typing import Any

from core.tokenizer.tokenizer import Tokenizer
from ipc.messages import TokenizerAnswer, TokenizerQuery
from procs.prompt_checks import PromptError, chat_prompt_ids


def answer_query(tokenizer: Tokenizer, query: TokenizerQuery, max_model_len: int,
                 vocab_size: int) -> TokenizerAnswer:
    """The answer to `query`; what it cannot answer comes back as an error naming the field."""
    if query.kind == "info":
        return TokenizerAnswer(query.query_id, tokenizer_info(tokenizer, max_model_len, vocab_size))
    if query.kind == "detokenize":
        ids = query.token_ids or []
        bad = next((i for i in ids if not 0 <= i < vocab_size), None)
        if bad is not None:
            return TokenizerAnswer(query.query_id, error=f"token id {bad} is outside the model's vocabulary "
                                   f"of {vocab_size}", error_field="tokens")
        return TokenizerAnswer(query.query_id, {"prompt": tokenizer.decode(ids)})
    try:
        ids = (tokenizer.encode(query.prompt) if query.prompt is not None else
               chat_prompt_ids(tokenizer, query.messages or [], query.tools, query.enable_thinking,
                               query.add_generation_prompt, query.continue_final_message))
    except PromptError as exc:
        return TokenizerAnswer(query.query_id, error=str(exc), error_field=exc.field)
    strs = [tokenizer.decode([i]) for i in ids] if query.return_token_strs else None
    return TokenizerAnswer(query.query_id, {"count": len(ids), "max_model_len": max_model_len,
                                            "tokens": ids, "token_strs": strs})


def tokenizer_info(tokenizer: Tokenizer, max_model_len: int, vocab_size: int) -> dict[str, Any]:
    eos = tokenizer.decode([tokenizer.eos_token_ids[0]]) if tokenizer.eos_token_ids else None
    pad = tokenizer.decode([tokenizer.eos_token_ids[-1]]) if tokenizer.eos_token_ids else None
    return {"tokenizer_class": type(tokenizer).__name__, "eos_token": eos, "bos_token": None,
            "pad_token": pad, "model_max_length": max_model_len, "vocab_size": vocab_size,
            "chat_template": tokenizer.chat_template}
