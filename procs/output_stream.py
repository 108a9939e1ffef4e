"""Stream: one client request in the tokenizer process, between its arrival and its last output,
and how each of the scheduler's TokenDeltas for it becomes the client's OutputDelta: detokenized,
cut at a stop string, its logprobs' tokens as text, the first output with what the request asked
for about its prompt (ids, text, prompt logprobs), a whole response gathered until it finishes."""

from __future__ import annotations

from dataclasses import dataclass, field

from core.scheduling.request import TokenDelta
from core.tokenizer import IncrementalDetokenizer, StopStringMatcher, Tokenizer
from ipc.messages import GenerateRequest, OutputDelta, PromptTokenLogprobs, TopLogprob


@dataclass
class Stream:
    """One client request between its arrival and its last output."""

    identity: bytes
    request: GenerateRequest
    num_prompt_tokens: int
    detokenizer: IncrementalDetokenizer | None
    stop: StopStringMatcher | None
    prompt_token_ids: list[int] | None  # sent with the first output, then dropped
    num_output_tokens: int = 0
    queue_time_s: float | None = None  # from the scheduler's first token, until it is sent
    prompt_logprobs: PromptTokenLogprobs | None = None  # from the scheduler's first token, until sent
    # Accumulated for a request that does not stream.
    text: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    tokens: list[str] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[list[TopLogprob]] = field(default_factory=list)

    def advance(self, out: TokenDelta, tokenizer: Tokenizer) -> tuple[OutputDelta | None, bool]:
        """The client's OutputDelta for `out` (None: a whole response, not finished yet), and whether
        a stop string ended the request before the engine did (the scheduler is to abort it)."""
        request = self.request
        self.num_output_tokens += len(out.new_token_ids)
        text = ""
        if self.detokenizer is not None:
            text = self.detokenizer.push(out.new_token_ids)
            if out.finished:
                text += self.detokenizer.finish()
        finished, finish_reason, stop_reason = out.finished, out.finish_reason, out.stop_reason
        stopped_early = False
        if self.stop is not None:
            check = self.stop.push(text)
            text = check.text
            if check.stopped:
                text += self.stop.matched if request.params.include_stop_str_in_output else ""
                stopped_early = not finished
                finished, finish_reason, stop_reason = True, "stop", self.stop.matched
            elif finished:
                text += self.stop.flush()
        tokens = top = None
        if out.logprobs is not None:
            tokens = [tokenizer.decode([i]) for i in out.new_token_ids]
            top = [[TopLogprob(i, tokenizer.decode([i]), lp) for i, lp in pairs]
                   for pairs in (out.top_logprobs or [[] for _ in out.new_token_ids])]
        if out.queue_time_s is not None:
            self.queue_time_s = out.queue_time_s
        if out.prompt_logprobs is not None:
            self.prompt_logprobs = _prompt_logprobs(out, self.prompt_token_ids or [], tokenizer)
        if not request.stream:
            self.text.append(text)
            self.token_ids += out.new_token_ids
            if tokens is not None:
                self.tokens += tokens
                self.logprobs += out.logprobs
                self.top_logprobs += top
            if not finished:
                return None, stopped_early
            text, new_ids = "".join(self.text), self.token_ids
            if self.tokens:
                tokens, logprobs, top = self.tokens, self.logprobs, self.top_logprobs
            else:
                logprobs = None
        else:
            new_ids, logprobs = out.new_token_ids, out.logprobs
        prompt_ids, self.prompt_token_ids = self.prompt_token_ids, None
        prompt_text = None
        if prompt_ids is not None and request.return_prompt_text:
            prompt_text = tokenizer.decode(prompt_ids)
        queue_time_s, self.queue_time_s = self.queue_time_s, None
        prompt_logprobs, self.prompt_logprobs = self.prompt_logprobs, None
        return OutputDelta(
            request.request_id, text, list(new_ids), self.num_prompt_tokens, self.num_output_tokens,
            out.num_cached_tokens, finished, finish_reason, stop_reason, out.error, tokens,
            None if logprobs is None else list(logprobs), top,
            prompt_ids if request.return_prompt_token_ids else None, queue_time_s, prompt_logprobs,
            prompt_text,
        ), stopped_early


def _prompt_logprobs(out: TokenDelta, prompt_ids: list[int], tokenizer: Tokenizer) -> PromptTokenLogprobs:
    decode = tokenizer.decode
    top = [[TopLogprob(i, decode([i]), lp) for i, lp in pairs] for pairs in out.prompt_top_logprobs or []]
    return PromptTokenLogprobs([decode([i]) for i in prompt_ids], list(out.prompt_logprobs),
                               list(out.prompt_ranks or []), top)
