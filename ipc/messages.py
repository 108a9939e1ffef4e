"""Every message the processes exchange, as frozen dataclasses for ipc.codec.

Three conversations, each one-way in its types:

* clients (the api process, `api.client`) <-> tokenizer, over the tokenizer's ROUTER:
  GenerateRequest, AbortRequest, ServerInfoQuery, TokenizerQuery and FlushCache in; OutputDelta,
  RequestAdmitted, RequestFailed, ServerInfo, TokenizerAnswer and CacheFlushed out. Request and
  query ids are the client's own; the tokenizer keeps them apart per client.
* tokenizer <-> scheduler: TokenizedRequest, AbortRequest and FlushCache in; TokenDeltas, Admitted,
  Rejected, SchedulerStatus and CacheFlushed out. The launcher also sends ReplicaDown and Shutdown
  to the scheduler.
* scheduler <-> executors: StepReady, Ping and Stop on a replica's doorbell (the plan itself is in
  the shared-memory ring, or in a frame after StepReady when it does not fit a slot); StepDone and
  Pong back. StepDone carries its arrays as raw frames (see ipc/step_frames.py).

How a child process starts (its spec, and the Ready it answers with) is ipc/process_specs.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from core.sampling_params import SamplingParams
from core.scheduling.request import TokenDelta
from core.scheduling.scheduler_stats import SchedulerStats
from ipc.codec import InvalidItem, items_fail_alone, message

# --- clients <-> tokenizer --------------------------------------------------------------------------


@message
@dataclass(frozen=True)
class ToolCallTurn:
    """A function call an earlier assistant turn made, as the chat template renders it."""

    name: str
    arguments: str  # the arguments as JSON text, as the client sent them


@message
@dataclass(frozen=True)
class ChatTurn:
    """One message of a chat, as the client sent it; the tokenizer process renders the chat."""

    role: str  # "system", "developer" (rendered as system), "user", "assistant" or "tool"
    content: str  # an assistant turn's answer only: its reasoning, if given, is in reasoning_content
    reasoning_content: str | None = None  # an assistant turn's reasoning, for the chat template
    tool_calls: list[ToolCallTurn] | None = None  # an assistant turn's function calls


@message
@dataclass(frozen=True)
class GenerateRequest:
    """One prompt to complete: exactly one of `prompt`, `prompt_token_ids` and `messages`."""

    request_id: str  # the client's own id; unique among its unfinished requests
    params: SamplingParams  # max_tokens None: up to the context, counted by the tokenizer process
    prompt: str | None = None
    prompt_token_ids: list[int] | None = None
    messages: list[ChatTurn] | None = None
    tools: list[dict[str, Any]] | None = None  # chat only: the functions the model may call (OpenAI's form)
    enable_thinking: bool = True  # chat only: Qwen3's thinking switch
    add_generation_prompt: bool = True  # chat only
    continue_final_message: bool = False  # chat only: the last (assistant) message left open
    stream: bool = True  # one OutputDelta per step; False: one at the end with everything
    detokenize: bool = True  # False: token ids only (batch jobs that decode themselves)
    skip_special_tokens: bool = True
    return_prompt_text: bool = False  # the first output carries the prompt as text (echo of token ids)
    # The first output carries the prompt's token ids; the REST server, which has a token-id prompt
    # already and needs a text prompt's ids only for prompt logprobs, asks for them only then.
    return_prompt_token_ids: bool = True
    # The client hears RequestAdmitted once the scheduler has taken the request: a streamed REST call
    # starts its response then, while the prefill runs, instead of after the first token.
    notify_admitted: bool = False

    def __post_init__(self) -> None:
        given = [n for n in ("prompt", "prompt_token_ids", "messages") if getattr(self, n) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of prompt, prompt_token_ids, messages; got {given or 'none'}")
        if not self.request_id:
            raise ValueError("request_id must not be empty")


@message
@dataclass(frozen=True)
class AbortRequest:
    request_id: str


@message
@dataclass(frozen=True)
class ServerInfoQuery:
    pass


@message
@dataclass(frozen=True)
class TokenizerQuery:
    """A question for the tokenizer alone (the REST server's /tokenize, /detokenize and
    /tokenizer_info): `kind` "tokenize" takes exactly one of `prompt` and `messages` (a chat, rendered
    by the chat template as a GenerateRequest's would be); "detokenize" takes `token_ids`; "info"
    nothing. The answer is one TokenizerAnswer with the same query_id."""

    query_id: str
    kind: str  # "tokenize", "detokenize" or "info"
    prompt: str | None = None
    messages: list[ChatTurn] | None = None
    tools: list[dict[str, Any]] | None = None
    enable_thinking: bool = True
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    token_ids: list[int] | None = None
    return_token_strs: bool = False

    def __post_init__(self) -> None:
        if self.kind not in ("tokenize", "detokenize", "info"):
            raise ValueError(f"kind must be tokenize, detokenize or info, got {self.kind!r}")
        if self.kind == "tokenize" and (self.prompt is None) == (self.messages is None):
            raise ValueError("a tokenize query takes exactly one of prompt and messages")
        if self.kind == "detokenize" and self.token_ids is None:
            raise ValueError("a detokenize query takes token_ids")


@message
@dataclass(frozen=True)
class TokenizerAnswer:
    """The answer to a TokenizerQuery: `body` (the JSON the REST server returns: vLLM's fields for
    each route), or `error` naming `error_field` (a 400 for the client)."""

    query_id: str
    body: dict[str, Any] | None = None
    error: str | None = None
    error_field: str | None = None


@message
@dataclass(frozen=True)
class FlushCache:
    """Drop every live replica's prefix cache (the REST server's /flush_cache and /reset_prefix_cache):
    done only while no request runs or waits on any replica, so that afterwards nothing is cached.
    The tokenizer forwards it to the scheduler; the answer is one CacheFlushed with the same query_id."""

    query_id: str


@message
@dataclass(frozen=True)
class CacheFlushed:
    """The answer to FlushCache: `flushed` with the pages freed, or `error` saying why not (requests
    still running or waiting, named by replica: status 400; a scheduler that does not report: 503)."""

    query_id: str
    flushed: bool
    freed_pages: int = 0
    error: str | None = None
    status: int = 400  # the HTTP status of a refusal


@message
@dataclass(frozen=True)
class TopLogprob:
    token_id: int
    token: str
    logprob: float


@message
@dataclass(frozen=True)
class PromptTokenLogprobs:
    """Every prompt token of a request that asked for prompt logprobs: its text, its logprob under
    the model (None for the first token, which nothing precedes) and the top N at its position."""

    tokens: list[str]
    logprobs: list[float | None]
    ranks: list[int | None]  # 1 + how many tokens the model found likelier (None for the first)
    top_logprobs: list[list[TopLogprob]]


@message
@dataclass(frozen=True)
class OutputDelta:
    """What a request produced since its last OutputDelta, as its client sees it (text, token ids,
    logprobs); `finished` marks its last one. Clients merge them: api.generation.GenerationBuilder
    into a Generation, the REST server per choice (api/openai_serving.py ChoiceState)."""

    request_id: str
    text: str  # new text (stop strings cut, held-back partial matches not yet included)
    token_ids: list[int]  # new token ids
    num_prompt_tokens: int
    num_output_tokens: int  # so far
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache
    finished: bool = False
    finish_reason: str | None = None  # "stop", "length" or "abort"
    stop_reason: str | int | None = None  # the stop string or stop token id that ended it
    error: str | None = None  # why the server (not the client) ended it
    # Per new token when the request asked for logprobs: its text, its logprob, and the top N.
    tokens: list[str] | None = None
    logprobs: list[float] | None = None
    top_logprobs: list[list[TopLogprob]] | None = None
    prompt_token_ids: list[int] | None = None  # in the first output only
    queue_time_s: float | None = None  # in the output with the first token: arrival to first admission
    prompt_logprobs: PromptTokenLogprobs | None = None  # in the first output, when asked for
    prompt_text: str | None = None  # in the first output, when the request set return_prompt_text


@dataclass(frozen=True)
class ContextOverflow:
    """The numbers of a request that does not fit the model's context: its prompt alone, or its
    prompt and the output it asks for."""

    max_model_len: int
    num_prompt_tokens: int
    max_tokens: int | None  # as asked; None: left out (up to the context)
    min_tokens: int = 0  # as asked; what a request without max_tokens needs room for

    def __post_init__(self) -> None:
        needed = self.max_tokens if self.max_tokens is not None else max(1, self.min_tokens)
        if self.num_prompt_tokens + needed <= self.max_model_len:
            raise ValueError(f"{self.num_prompt_tokens} prompt tokens and {needed} output tokens fit "
                             f"max_model_len {self.max_model_len}: no overflow")

    def describe(self) -> str:
        """The refusal in words, for clients and the API's error object."""
        head = (f"This model's maximum context length is {self.max_model_len} tokens; the request has "
                f"{self.num_prompt_tokens} prompt tokens")
        if self.max_tokens is not None:
            return f"{head} and asks for {self.max_tokens} more"
        if self.num_prompt_tokens < self.max_model_len:
            return f"{head} and asks for at least {self.min_tokens} more"
        return f"{head}, which leaves no room for output"


@message
@dataclass(frozen=True)
class RequestAdmitted:
    """The scheduler has taken the request (it asked with notify_admitted): from here on it ends
    with outputs, not with a RequestFailed."""

    request_id: str


@message
@dataclass(frozen=True)
class RequestFailed:
    """A request refused before it ran; `field` names the offending request field when one did, and
    `context` carries the numbers when it does not fit the context (`message` is then its describe())."""

    request_id: str
    message: str
    field: str | None = None
    status: int = 400
    context: ContextOverflow | None = None


@message
@dataclass(frozen=True)
class ReplicaInfo:
    replica: int
    alive: bool
    reason: str | None  # why it is down
    num_pages: int
    stats: SchedulerStats | None
    # Since start, from TP rank 0's step timings: seconds running steps, and seconds waiting for the
    # next plan between back-to-back steps (the scheduler had work all along; the GPU sat idle).
    step_execute_s: float = 0.0
    step_wait_s: float = 0.0
    routed_load_tokens: int = 0  # the DP router's count of work routed here and not finished


@message
@dataclass(frozen=True)
class ServerInfo:
    model: str
    max_model_len: int
    serving: bool  # some replica alive and the scheduler's loop turning
    replicas: list[ReplicaInfo]
    status_age_s: float  # since the scheduler last reported; large means its loop is stuck


# --- tokenizer <-> scheduler ------------------------------------------------------------------------


@message
@dataclass(frozen=True)
class TokenizedRequest:
    request_id: str  # the tokenizer's internal id
    prompt_token_ids: list[int]
    params: SamplingParams  # max_tokens always set: the tokenizer fills in what was left to the context
    arrival_s: float  # time.monotonic() when the tokenizer received it
    notify_admitted: bool = False  # the scheduler names it in Admitted once a replica has taken it

    def __post_init__(self) -> None:
        if self.params.max_tokens is None:
            raise ValueError(f"request {self.request_id}: max_tokens must be set before it is scheduled")


@message
@dataclass(frozen=True)
class TokenDeltas:
    """The TokenDeltas of one scheduler loop turn, for the tokenizer to stream. An output that
    does not decode is left out of `outputs` and listed in `invalid_outputs` (with its request id
    where readable), so it fails its own stream and no other."""

    outputs: list[TokenDelta] = field(metadata=items_fail_alone("invalid_outputs", "request_id"))
    invalid_outputs: list[InvalidItem] = field(default_factory=list)


@message
@dataclass(frozen=True)
class Admitted:
    """The requests (that asked with notify_admitted) the scheduler placed on a replica this turn."""

    request_ids: list[str]


@message
@dataclass(frozen=True)
class Rejected:
    request_id: str
    message: str
    status: int = 400  # 503 when no replica is serving


@message
@dataclass(frozen=True)
class SchedulerStatus:
    serving: bool
    replicas: list[ReplicaInfo]


@message
@dataclass(frozen=True)
class ReplicaDown:
    replica: int
    reason: str


@message
@dataclass(frozen=True)
class Shutdown:
    reason: str = "asked to shut down"


# --- scheduler <-> executors ------------------------------------------------------------------------


@message
@dataclass(frozen=True)
class StepReady:
    step_id: int
    slot: int  # ring slot holding the plan; -1: the plan is the frame after this envelope


@message
@dataclass(frozen=True)
class Ping:
    replica: int
    nonce: int


@message
@dataclass(frozen=True)
class Pong:
    replica: int
    rank: int
    nonce: int


@message
@dataclass(frozen=True)
class Stop:
    pass


@message
@dataclass(frozen=True)
class StepDone:
    replica: int
    rank: int
    step_id: int
    error: str | None = None
    has_logprobs: bool = False  # frames: sampled ids, then (if set) logprobs, top ids, top logprobs
    num_top: int = 0
    # frames after those: prompt logprob starts, logprobs, ranks, top ids, top logprobs (ipc/step_frames)
    has_prompt_logprobs: bool = False
    num_prompt_top: int = 0
    timings_ms: dict[str, float] = field(default_factory=dict)
