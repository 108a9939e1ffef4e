"""ChoiceState: one choice of an OpenAI API call, what it has produced so far (api/openai_serving.py
renders it as a response, or chunk by chunk as a stream)."""

from __future__ import annotations

from typing import Any

from api.metrics import RequestTiming
from api.reasoning import ReasoningSplitter
from api.tool_call_parser import ToolCallParser
from ipc.messages import OutputDelta


class ChoiceState:
    """One choice of a call: what it has produced so far."""

    def __init__(self, index: int, timing: RequestTiming, split_reasoning: bool,
                 tool_parser: ToolCallParser | None = None):
        self.index = index
        self.timing = timing
        self.splitter = ReasoningSplitter() if split_reasoning else None
        self.tool_parser = tool_parser  # chat with tools: calls taken out of the content
        self.text: list[str] = []  # completions
        self.content: list[str] = []  # chat
        self.reasoning: list[str] = []  # chat
        self.tool_calls: list[dict[str, Any]] = []  # chat with tools
        self.logprobs: list[dict[str, Any]] = []  # per output, in the endpoint's shape
        self.text_offset = 0
        self.echoed = False  # completions with echo: the prompt went out before the first text
        self.prompt_logprobs: list[dict[str, Any] | None] | None = None  # its prompt_logprobs, when asked
        self.prompt_token_ids: list[int] | None = None  # from its first output, when asked
        self.token_ids: list[int] = []  # a whole response's, with return_token_ids
        self.num_prompt_tokens = 0
        self.num_output_tokens = 0
        self.num_cached_tokens = 0
        self.num_reasoning_tokens = 0  # chat: output tokens from <think> to </think>, both included
        self.finished = False
        self.finish_reason: str | None = None
        self.stop_reason: str | int | None = None
        self.error: str | None = None

    def update(self, output: OutputDelta, now_s: float) -> None:
        self.num_prompt_tokens = output.num_prompt_tokens
        self.num_output_tokens = output.num_output_tokens
        self.num_cached_tokens = output.num_cached_tokens
        if output.prompt_token_ids is not None:
            self.prompt_token_ids = output.prompt_token_ids
        if output.queue_time_s is not None:
            self.timing.on_queued(output.queue_time_s)
        self.timing.on_tokens(len(output.token_ids), now_s)
        if output.finished:
            self.finished = True
            self.finish_reason = output.finish_reason
            self.stop_reason = output.stop_reason
            self.error = output.error
            self.timing.on_finish(output.finish_reason, now_s)
