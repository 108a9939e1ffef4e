"""vLLM's return_tokens_as_token_ids: the tokens of an output's logprobs named by their ids."""

from __future__ import annotations

import dataclasses

from ipc.messages import OutputDelta, TopLogprob


def tokens_named_by_id(output: OutputDelta) -> OutputDelta:
    """The output with every token of its logprobs named "token_id:<id>" instead of by its text
    (vLLM's return_tokens_as_token_ids: tokens that are not whole UTF-8 stay identifiable)."""
    def named(token_id: int) -> str:
        return f"token_id:{token_id}"

    def renamed(tops: list[TopLogprob]) -> list[TopLogprob]:
        return [dataclasses.replace(t, token=named(t.token_id)) for t in tops]

    prompt = output.prompt_logprobs
    if prompt is not None and output.prompt_token_ids is not None:
        prompt = dataclasses.replace(prompt, tokens=[named(i) for i in output.prompt_token_ids],
                                     top_logprobs=[renamed(tops) for tops in prompt.top_logprobs])
    return dataclasses.replace(
        output, tokens=None if output.tokens is None else [named(i) for i in output.token_ids],
        top_logprobs=None if output.top_logprobs is None else [renamed(t) for t in output.top_logprobs],
        prompt_logprobs=prompt)
