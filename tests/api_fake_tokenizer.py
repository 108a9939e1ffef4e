"""FakeTokenizer: a thread that plays the tokenizer process's ROUTER, for the api tests.

It speaks the clients' side of ipc/messages.py exactly as the real tokenizer does: it answers a
GenerateRequest with OutputDeltas (one per step when `stream`, else one at the end; the first
carries prompt_token_ids when the request asks for them; a request with notify_admitted hears
RequestAdmitted once taken), ends an aborted request with finish_reason "abort", fits max_tokens to the
context and refuses what does not fit as the real one does (procs/prompt_checks.py), and answers
ServerInfoQuery. What it generates is
scripted, one text piece per token:

* `reply(request)` gives the pieces (default: a thinking chat reply, a plain one when thinking is off,
  a few words for completions; a chat offering tools: a thought, a sentence, then a call of the
  first tool with {"city": "Paris"} in Qwen3's `<tool_call>` block); when they run out the request
  stops ("stop"), unless ignore_eos, then it repeats " more" until max_tokens ("length").
* a prompt with "HOLD_FIRST" produces nothing until `release_held` is set (a long prefill);
* a prompt with "FOREVER" generates until aborted or max_tokens; one with "ENGINE_ERROR" is ended
  by the "engine" after two tokens with an error; stop strings and stop_token_ids end a request as
  the real detokenizer does.
* "tokenization" is one token per character of the prompt (or of the ChatML-rendered chat); a
  prompt seen before reports all but its last token as prefix-cached. A token-id prompt "decodes"
  to "<id>" per token. Prompt logprobs are scripted: position p has logprob -0.5 * p and rank p,
  its top N are "x", "y", ... at -0.1, -0.2, ...
Every message received is kept in `received` for tests to check (aborts, seeds, params).
"""

from __future__ import annotations

import contextlib
import itertools
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from core.sampling_params import SamplingParams
from core.scheduling.scheduler_stats import SchedulerStats
from core.tokenizer.chat_template import render_chatml
from ipc.channels import ChannelError, RouterChannel
from ipc.messages import (
    AbortRequest,
    GenerateRequest,
    OutputDelta,
    PromptTokenLogprobs,
    ReplicaInfo,
    RequestAdmitted,
    RequestFailed,
    ServerInfo,
    ServerInfoQuery,
    TopLogprob,
)
from ipc.native_auth import start_key_check
from procs.prompt_checks import PromptError, fit_to_context, template_message

THINK_OPEN_ID, THINK_CLOSE_ID = 151667, 151668
THINKING_REPLY = ["<think>", "\n", "The user", " greets", " me", ".", "\n", "</think>", "\n\n", "Hello", "!",
                  " How", " can", " I", " help", "?"]
PLAIN_REPLY = ["Hello", "!", " How", " can", " I", " help", "?"]
COMPLETION_REPLY = [" one", " two", " three", " four", " five"]
ENGINE_ERROR = "executor dp=0 tp=0 failed in step 7: RuntimeError: boom"


def tool_reply(name: str) -> list[str]:
    return ["<think>", "\n", "A", " tool", ".", "\n", "</think>", "\n\n", "Let", " me", " check", ".", "\n",
            "<tool_call>", "\n", '{"name": "', name, '", "arguments": {"city": ', '"Paris"}}', "\n",
            "</tool_call>"]


def default_reply(request: GenerateRequest) -> list[str]:
    if request.tools:
        return tool_reply(request.tools[0]["function"]["name"])
    if request.messages is not None:
        return list(THINKING_REPLY if request.enable_thinking else PLAIN_REPLY)
    return list(COMPLETION_REPLY)


def default_stats(step_id: int = 42) -> SchedulerStats:
    return SchedulerStats(step_id=step_id, num_running=3, num_waiting=2, num_preempted=1, kv_usage=0.25,
                          num_free_pages=96, num_cached_pages=8, prefix_cache_query_tokens=1000,
                          prefix_cache_hit_tokens=400, num_preemptions=5, num_tokens_last_step=64,
                          num_prompt_tokens=1234, num_generation_tokens=5678)


@dataclass
class _Generation:
    identity: bytes
    request: GenerateRequest
    params: SamplingParams  # the request's, max_tokens fitted to the context
    prompt_ids: list[int]
    num_cached: int
    pieces: Iterator[str]
    text: str = ""  # everything generated so far, after stop strings
    token_ids: list[int] = field(default_factory=list)
    pending_text: list[str] = field(default_factory=list)  # not yet sent (stream=False)
    pending_ids: list[int] = field(default_factory=list)
    pending_lp: list[tuple[str, float, list[TopLogprob]]] = field(default_factory=list)
    sent_first: bool = False


def _prompt_text(request: GenerateRequest) -> str:
    return request.prompt or "".join(t.content for t in request.messages or [])


class _Stoppable:
    def __init__(self, key_check) -> None:
        self._key_check = key_check

    def close(self) -> None:
        if self._key_check is not None:
            self._key_check.stop()


class FakeTokenizer:
    def __init__(self, address: str | None = None, *, model: str = "qwen3-tiny", max_model_len: int = 4096,
                 reply: Callable[[GenerateRequest], list[str]] = default_reply,
                 step_s: float = 0.001, api_key: str | None = None) -> None:
        self._tmpdir = None
        self.api_key = api_key  # with a tcp address: clients must present it (ipc/native_auth.py)
        if address is None:
            self._tmpdir = tempfile.mkdtemp(prefix="cad-fake-")
            address = f"ipc://{self._tmpdir}/tok.sock"
        self.address = address
        self.model = model
        self.max_model_len = max_model_len
        self.reply = reply
        self.step_s = step_s
        self.serving = True
        self.refusal_prose: str | None = None  # replaces a context refusal's words, keeping its numbers
        self.release_held = threading.Event()  # lets HOLD_FIRST requests produce their tokens
        self.replicas = [
            ReplicaInfo(replica=0, alive=True, reason=None, num_pages=128, stats=default_stats(),
                        step_execute_s=2.5, step_wait_s=0.125),
            ReplicaInfo(replica=1, alive=False, reason="executor dp=1 tp=0 died", num_pages=128, stats=None),
        ]
        self.received: list[object] = []
        self._active: dict[tuple[bytes, str], _Generation] = {}
        self._seen_prompts: set[tuple[int, ...]] = set()
        self._vocab: dict[str, int] = {"<think>": THINK_OPEN_ID, "</think>": THINK_CLOSE_ID}
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="fake tokenizer", daemon=True)

    def __enter__(self) -> FakeTokenizer:
        self._thread.start()
        self._ready.wait(10)
        if self._error is not None:
            raise self._error
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)

    # --- what tests look at ------------------------------------------------------------------------

    def of_type(self, cls: type) -> list:
        return [m for m in list(self.received) if isinstance(m, cls)]

    def wait_for(self, predicate: Callable[[], bool], timeout_s: float = 5.0) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if predicate():
                return True
            time.sleep(0.005)
        return predicate()

    @property
    def num_active(self) -> int:
        return len(self._active)

    # --- the loop ----------------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            key_check = start_key_check(self.api_key) if self.api_key is not None else None
            router = RouterChannel.bind(self.address, name="fake tokenizer",
                                        key_required=key_check is not None)
        except BaseException as e:
            self._error = e
            self._ready.set()
            return
        self._ready.set()
        with router, contextlib.closing(_Stoppable(key_check)):
            next_step = time.monotonic()
            while not self._stop.is_set():
                wait = max(0.0, next_step - time.monotonic()) if self._active else 0.02
                routed = router.recv(wait)
                while routed is not None:
                    self.received.append(routed.message)
                    self._handle(router, routed.identity, routed.message)
                    routed = router.recv(0)
                if self._active and time.monotonic() >= next_step:
                    self._step(router)
                    next_step = time.monotonic() + self.step_s

    def _handle(self, router: RouterChannel, identity: bytes, message: object) -> None:
        if isinstance(message, ServerInfoQuery):
            self._send(router, identity, ServerInfo(model=self.model, max_model_len=self.max_model_len,
                                                    serving=self.serving, replicas=list(self.replicas),
                                                    status_age_s=0.01))
        elif isinstance(message, AbortRequest):
            gen = self._active.pop((identity, message.request_id), None)
            if gen is not None:
                self._finish(router, gen, "abort")
        elif isinstance(message, GenerateRequest):
            self._admit(router, identity, message)

    def _admit(self, router: RouterChannel, identity: bytes, request: GenerateRequest) -> None:
        if request.prompt_token_ids is not None:
            prompt_ids = list(request.prompt_token_ids)
        else:
            text = request.prompt if request.prompt is not None else render_chatml(
                [template_message(t) for t in request.messages or []],
                add_generation_prompt=request.add_generation_prompt, enable_thinking=request.enable_thinking,
                tools=request.tools)
            prompt_ids = [ord(c) % 100_000 for c in text]
        try:
            params = fit_to_context(request.params, len(prompt_ids), self.max_model_len,
                                    "messages" if request.messages is not None else "prompt")
        except PromptError as e:
            refusal = RequestFailed(request.request_id, self.refusal_prose or str(e), e.field,
                                    context=e.context)
            self._send(router, identity, refusal)
            return
        key = tuple(prompt_ids)
        num_cached = len(prompt_ids) - 1 if key in self._seen_prompts else 0
        self._seen_prompts.add(key)
        text = _prompt_text(request)
        if "FOREVER" in text:
            pieces: Iterator[str] = (f" w{i}" for i in itertools.count())
        else:
            pieces = iter(self.reply(request))
        self._active[(identity, request.request_id)] = _Generation(identity, request, params, prompt_ids,
                                                                   num_cached, pieces)
        if request.notify_admitted:
            self._send(router, identity, RequestAdmitted(request.request_id))

    def _step(self, router: RouterChannel) -> None:
        for key, gen in list(self._active.items()):
            if "GO_SILENT" in (gen.request.prompt or "") and len(gen.token_ids) >= 2:
                continue  # an engine that hangs mid-stream: the request gets nothing more
            if "HOLD_FIRST" in _prompt_text(gen.request) and not self.release_held.is_set():
                continue
            finish = self._advance(gen)
            if finish is not None:
                del self._active[key]
                self._finish(router, gen, *finish)
            elif gen.request.stream and not self._flush(router, gen):
                del self._active[key]

    def _advance(self, gen: _Generation) -> tuple[str, str | int | None] | None:
        """Generate one token; (finish_reason, stop_reason) when that ends the request."""
        params = gen.params
        if "ENGINE_ERROR" in _prompt_text(gen.request) and len(gen.token_ids) == 2:
            return ("abort", None)
        piece = next(gen.pieces, None)
        if piece is None:
            if not params.ignore_eos:
                return ("stop", None)
            piece = " more"
        token_id = self._vocab.setdefault(piece, 1000 + len(self._vocab))
        gen.token_ids.append(token_id)
        gen.pending_ids.append(token_id)
        if params.logprobs is not None:
            logprob = -0.25 * len(gen.token_ids)
            top = [TopLogprob(token_id, piece, logprob), TopLogprob(7, "x", logprob - 1.0),
                   TopLogprob(8, "y", logprob - 2.0)][: params.logprobs]
            gen.pending_lp.append((piece, logprob, top))
        if token_id in params.stop_token_ids:
            return ("stop", token_id)
        new_text = gen.text + piece
        for stop in params.stop:
            at = new_text.find(stop)
            if at >= 0:
                self._add_text(gen, new_text[:at])
                return ("stop", stop)
        self._add_text(gen, new_text)
        if len(gen.token_ids) >= params.max_tokens:
            return ("length", None)
        return None

    def _add_text(self, gen: _Generation, new_text: str) -> None:
        gen.pending_text.append(new_text[len(gen.text):])
        gen.text = new_text

    def _flush(self, router: RouterChannel, gen: _Generation, finish_reason: str | None = None,
               stop_reason: str | int | None = None, error: str | None = None) -> bool:
        request = gen.request
        lp = gen.pending_lp if request.params.logprobs is not None else None
        output = OutputDelta(
            request_id=request.request_id,
            text="".join(gen.pending_text) if request.detokenize else "",
            token_ids=list(gen.pending_ids),
            num_prompt_tokens=len(gen.prompt_ids),
            num_output_tokens=len(gen.token_ids),
            num_cached_tokens=gen.num_cached,
            finished=finish_reason is not None,
            finish_reason=finish_reason,
            stop_reason=stop_reason,
            error=error,
            tokens=[t for t, _, _ in lp] if lp is not None else None,
            logprobs=[v for _, v, _ in lp] if lp is not None else None,
            top_logprobs=[top for _, _, top in lp] if lp is not None else None,
            prompt_token_ids=(None if gen.sent_first or not request.return_prompt_token_ids
                              else list(gen.prompt_ids)),
            queue_time_s=None if gen.sent_first or not gen.pending_ids else 0.25,
            prompt_logprobs=None if gen.sent_first else _prompt_logprobs(gen),
            prompt_text=("".join(f"<{i}>" for i in gen.prompt_ids)
                         if request.return_prompt_text and not gen.sent_first else None),
        )
        gen.pending_text, gen.pending_ids, gen.pending_lp = [], [], []
        gen.sent_first = True
        return self._send(router, gen.identity, output)

    def _finish(self, router: RouterChannel, gen: _Generation, finish_reason: str,
                stop_reason: str | int | None = None) -> None:
        error = ENGINE_ERROR if "ENGINE_ERROR" in _prompt_text(gen.request) else None
        self._flush(router, gen, finish_reason, stop_reason, error)

    def _send(self, router: RouterChannel, identity: bytes, message: object) -> bool:
        try:
            router.send(identity, message)
            return True
        except ChannelError:
            return False  # the client went away


def _prompt_logprobs(gen: _Generation) -> PromptTokenLogprobs | None:
    """The scripted prompt logprobs of a request that asked for them."""
    num_top = gen.params.prompt_logprobs
    if num_top is None:
        return None
    tokens = [chr(i) if gen.request.prompt_token_ids is None else f"<{i}>" for i in gen.prompt_ids]
    top = [[TopLogprob(7 + k, "xyzuvw"[k % 6], -0.1 * (k + 1)) for k in range(num_top)] if p else []
           for p in range(len(tokens))]
    return PromptTokenLogprobs(tokens, [None] + [-0.5 * p for p in range(1, len(tokens))],
                               [None] + list(range(1, len(tokens))), top)
