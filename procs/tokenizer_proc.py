"""The tokenizer process: the only place that knows text.

    receive (clients: requests, aborts, info queries) -> tokenize -> forward to the scheduler
    receive (scheduler: outputs, rejections, status)  -> detokenize, stop strings -> stream to clients
    cache flushes: client -> scheduler -> the client's answer

Clients (the api process, `api.client`) connect DEALER sockets to this process's ROUTER; a
request id is the client's own, kept apart per client. A chat arrives as its messages and becomes
ChatML here, once. A request that left max_tokens out (None) gets max_model_len minus its prompt
tokens; one that cannot fit is refused with the numbers (procs/prompt_checks.py). A burst of new
requests is tokenized on a few threads at once when the tokenizer allows it (the built-in
vocabulary does), then forwarded in arrival order. A stop string found in the streamed text ends
the request with finish_reason "stop" and tells the scheduler to abort it, so its pages are freed
at once. A client that has gone away (its socket is no longer connected) has its requests aborted
the same way. With `--native-tcp` the ROUTER listens on a tcp address too, for native clients on
other machines; with an API key as well, every client must present it (ipc/native_auth.py).
"""

from __future__ import annotations

import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from multiprocessing.connection import Connection
from pathlib import Path

from core.scheduling.request import TokenDelta
from core.tokenizer import IncrementalDetokenizer, StopStringMatcher, Tokenizer, load_tokenizer
from ipc.channels import (
    BadFrame,
    ChannelError,
    ChannelTimeout,
    PullChannel,
    PushChannel,
    RouterChannel,
    wait_readable,
)
from ipc.codec import decode
from ipc.messages import (
    AbortRequest,
    Admitted,
    CacheFlushed,
    ContextOverflow,
    FlushCache,
    GenerateRequest,
    OutputDelta,
    Rejected,
    RequestAdmitted,
    RequestFailed,
    SchedulerStatus,
    ServerInfo,
    ServerInfoQuery,
    TokenDeltas,
    TokenizedRequest,
    TokenizerAnswer,
    TokenizerQuery,
)
from ipc.native_auth import start_key_check
from ipc.process_specs import Ready, TokenizerSpec
from ipc.run_lock import remove_once_ended
from procs.child import become, launcher_died, parent_alive, run_actor
from procs.output_stream import Stream
from procs.problem_log import ProblemLog
from procs.prompt_checks import PromptError, chat_prompt_ids, fit_to_context, prompt_for_params
from procs.tokenizer_queries import answer_query

_IDLE_WAIT_S = 0.5
_CLIENT_SEND_TIMEOUT_S = 1.0
_RECEIVE_BUDGET_S = 0.005
_MAX_BATCH = 64  # new requests tokenized in one loop turn
_ENCODER_THREADS = max(1, min(8, os.cpu_count() or 1))
# The scheduler reports every 0.2 s; this much silence means its loop is not turning.
STATUS_STALE_S = 5.0
# How long a tokenizer whose launcher died waits for the kernel to release the launcher's run lock.
_RUN_END_WAIT_S = 5.0


def run_tokenizer(spec_bytes: bytes, ready_conn: Connection) -> None:
    """Process entry point (multiprocessing spawn target)."""
    spec: TokenizerSpec = decode(spec_bytes)
    log = become("cadence:tokenizer")
    def start() -> TokenizerProcess:
        tokenizer = load_tokenizer(spec.tokenizer_path)
        if spec.chat_template is not None:
            tokenizer.set_chat_template(spec.chat_template)
        return TokenizerProcess(spec, tokenizer, log)

    run_actor(ready_conn, Ready("tokenizer", os.getpid()), log, start)


class TokenizerProcess:
    def __init__(self, spec: TokenizerSpec, tokenizer: Tokenizer, log: logging.Logger) -> None:
        self.spec = spec
        self.tokenizer = tokenizer
        self.log = log
        self.max_model_len = spec.config.max_model_len
        self.vocab_size = spec.config.model.vocab_size
        # Listening on tcp with an API key: every client presents it, the api process's too.
        self.key_check = start_key_check(spec.api_key) if spec.frontend_tcp and spec.api_key else None
        self.frontend = RouterChannel.bind(spec.frontend, name="tokenizer frontend",
                                           send_timeout_s=_CLIENT_SEND_TIMEOUT_S,
                                           key_required=self.key_check is not None)
        if spec.frontend_tcp:
            self.frontend.also_bind(spec.frontend_tcp)
        self.to_scheduler = PushChannel.connect(spec.to_scheduler, name="requests to the scheduler")
        self.from_scheduler = PullChannel.bind(spec.from_scheduler, name="scheduler outputs",
                                               types=(TokenDeltas, Admitted, Rejected, SchedulerStatus,
                                                      CacheFlushed))
        self.streams: dict[str, Stream] = {}  # by internal id
        self.flushes: dict[str, tuple[bytes, str]] = {}  # FlushCache sent on: (client, its query id)
        self.status: SchedulerStatus | None = None
        self.status_s = time.monotonic()
        self._ppid = os.getppid()
        self.problems = ProblemLog(log)
        # Encoders for a burst of new requests (tokenizers that encode without the GIL).
        self._encoders = ThreadPoolExecutor(_ENCODER_THREADS, thread_name_prefix="cadence-encode")

    def loop(self) -> None:
        while True:
            ready = wait_readable([self.frontend, self.from_scheduler], _IDLE_WAIT_S)
            if not ready and not parent_alive(self._ppid):
                self.log.warning("the launcher is gone; exiting")
                return
            self.receive_from_clients()
            self.receive_from_scheduler()
            if self.flushes:
                self.give_up_flushes()

    # --- clients -> scheduler -------------------------------------------------------------------

    def receive_from_clients(self) -> None:
        """Take what clients sent, for at most _RECEIVE_BUDGET_S or _MAX_BATCH new requests, and
        forward it in arrival order: a burst of long prompts must not hold back the outputs of
        running requests (the rest is taken next turn)."""
        deadline = time.monotonic() + _RECEIVE_BUDGET_S
        batch: list[tuple[bytes, GenerateRequest]] = []
        while time.monotonic() < deadline and len(batch) < _MAX_BATCH:
            try:
                routed = self.frontend.recv(0)
            except BadFrame as exc:
                self.refuse_bad_client_message(exc)
                continue
            if routed is None:
                break
            msg = routed.message
            if isinstance(msg, GenerateRequest):
                batch.append((routed.identity, msg))
                continue
            self.submit_all(batch)  # what came before this message goes first
            batch = []
            if isinstance(msg, AbortRequest):
                self.abort(_internal_id(routed.identity, msg.request_id))
            elif isinstance(msg, ServerInfoQuery):
                self._send(routed.identity, self.server_info())
            elif isinstance(msg, TokenizerQuery):
                self._send(routed.identity, answer_query(self.tokenizer, msg, self.max_model_len,
                                                         self.vocab_size))
            elif isinstance(msg, FlushCache):
                self.flush_cache(routed.identity, msg.query_id)
            else:
                self.log.warning("ignored a %s from a client", type(msg).__name__)
        self.submit_all(batch)

    def submit_all(self, batch: list[tuple[bytes, GenerateRequest]]) -> None:
        """Tokenize new requests, several at once on the encoder threads when the tokenizer allows
        it, and forward them in order; a failure costs its own request only."""
        if len(batch) > 1 and self.tokenizer.encodes_concurrently:
            prompts = list(self._encoders.map(self._tokenize_or_error, (request for _, request in batch)))
        else:
            prompts = [None] * len(batch)  # tokenized in submit(), with no thread hop
        for (identity, request), prompt in zip(batch, prompts, strict=True):
            try:
                self.submit(identity, request, prompt)
            except Exception as exc:  # a bug must cost one request, not the server
                self.log.exception("request %r failed", request.request_id)
                self.streams.pop(_internal_id(identity, request.request_id), None)
                self._fail(identity, request.request_id, f"internal error: {exc}", None, status=500)

    def submit(self, identity: bytes, request: GenerateRequest,
               prompt: list[int] | Exception | None = None) -> None:
        """Open the request's stream and forward it; `prompt` is its tokenization (ids or the error it
        raised) when done beforehand, None to tokenize here."""
        internal_id = _internal_id(identity, request.request_id)
        if internal_id in self.streams:
            self._fail(identity, request.request_id, f"request id {request.request_id!r} is already in use",
                       "request_id")
            return
        try:
            prompt_ids = self.tokenize(request) if prompt is None else prompt
            if isinstance(prompt_ids, Exception):
                raise prompt_ids
            params = fit_to_context(request.params, len(prompt_ids), self.max_model_len,
                                    "prompt" if request.messages is None else "messages")
        except PromptError as exc:
            self._fail(identity, request.request_id, str(exc), exc.field, context=exc.context)
            return
        detokenizer = (IncrementalDetokenizer(self.tokenizer, request.skip_special_tokens)
                       if request.detokenize else None)
        stop = StopStringMatcher(params.stop) if params.stop and request.detokenize else None
        self.streams[internal_id] = Stream(identity, request, len(prompt_ids), detokenizer, stop, prompt_ids)
        self.to_scheduler.send(TokenizedRequest(internal_id, prompt_ids, params, time.monotonic(),
                                                request.notify_admitted))

    def _tokenize_or_error(self, request: GenerateRequest) -> list[int] | Exception:
        try:
            return self.tokenize(request)
        except Exception as exc:  # re-raised in submit(), in the loop's thread
            return exc

    def tokenize(self, request: GenerateRequest) -> list[int]:
        """The prompt's token ids (a chat rendered by the tokenizer's template), or PromptError."""
        if request.prompt_token_ids is not None:
            ids, where = list(request.prompt_token_ids), "prompt"
        elif request.prompt is not None:
            ids, where = self.tokenizer.encode(request.prompt), "prompt"
        else:
            ids = chat_prompt_ids(self.tokenizer, request.messages or [], request.tools,
                                  request.enable_thinking, request.add_generation_prompt,
                                  request.continue_final_message)
            where = "messages"
        if not ids:
            raise PromptError(where, "the prompt is empty")
        if min(ids) < 0 or max(ids) >= self.vocab_size:
            bad = next(i for i in ids if not 0 <= i < self.vocab_size)
            raise PromptError(where, f"token id {bad} is outside the model's vocabulary of {self.vocab_size}")
        return prompt_for_params(ids, request.params, self.vocab_size, self.max_model_len,
                                 self.spec.config.scheduler.max_logprobs)

    def refuse_bad_client_message(self, exc: BadFrame) -> None:
        """A client's message that does not decode: the request or query it names (if it names one) is
        answered with what was wrong, so the client hears of it instead of waiting; the rest is only
        logged."""
        request_id, query_id = exc.names.get("request_id"), exc.names.get("query_id")
        if exc.identity is not None and exc.type_name == "FlushCache" and isinstance(query_id, str):
            self._send(exc.identity, CacheFlushed(query_id, False, error=f"invalid message: {exc}"))
        elif exc.identity is not None and exc.type_name == "TokenizerQuery" and isinstance(query_id, str):
            self._send(exc.identity, TokenizerAnswer(query_id, error=f"invalid message: {exc}"))
        elif exc.identity is not None and isinstance(request_id, str) and request_id:
            if exc.type_name == "AbortRequest":
                self.abort(_internal_id(exc.identity, request_id))
            else:
                self._fail(exc.identity, request_id, f"invalid request: {exc}", None)
        self.problems.warning("bad message from a client", str(exc))

    def flush_cache(self, identity: bytes, query_id: str) -> None:
        """Forward a client's FlushCache to the scheduler, which answers; at once if it is silent."""
        age = time.monotonic() - self.status_s
        if self.status is None or age >= STATUS_STALE_S:
            self._send(identity, CacheFlushed(query_id, False, error=(
                f"the scheduler has not reported for {age:.1f} s: the cache was not flushed"), status=503))
            return
        internal_id = _internal_id(identity, query_id)
        self.flushes[internal_id] = (identity, query_id)
        self.to_scheduler.send(FlushCache(internal_id))

    def give_up_flushes(self) -> None:
        """Answer the flushes forwarded to a scheduler that has since gone silent (503, as when it was
        silent before), rather than keep them until it speaks again."""
        age = time.monotonic() - self.status_s
        if age < STATUS_STALE_S:
            return
        for identity, query_id in self.flushes.values():
            self._send(identity, CacheFlushed(query_id, False, error=(
                f"the scheduler has not reported for {age:.1f} s since the flush was asked for: whether "
                "the cache was flushed is unknown"), status=503))
        self.flushes.clear()

    def abort(self, internal_id: str) -> None:
        if internal_id in self.streams:
            self.to_scheduler.send(AbortRequest(internal_id))

    # --- scheduler -> clients -------------------------------------------------------------------

    def receive_from_scheduler(self) -> None:
        while True:
            try:
                msg = self.from_scheduler.recv(0)
            except BadFrame as exc:  # whatever it was about ends with the error; nothing else does
                request_id = exc.names.get("request_id")
                if isinstance(request_id, str):
                    self.end_with_error(request_id, f"the scheduler sent an invalid message for it: {exc}")
                self.problems.warning("bad message from the scheduler", str(exc))
                continue
            if msg is None:
                self.problems.flush()
                return
            if isinstance(msg, TokenDeltas):
                for out in msg.outputs:
                    try:
                        self.emit(out)
                    except Exception as exc:  # a bug must cost one request, not the server
                        self.log.exception("output of %s failed", out.request_id)
                        self.end_with_error(out.request_id, f"internal error: {type(exc).__name__}: {exc}")
                for bad in msg.invalid_outputs:  # each fails its own stream only
                    if isinstance(bad.key, str):
                        self.end_with_error(bad.key, f"the scheduler sent an invalid output: {bad.error}")
                    self.problems.warning("bad output from the scheduler", bad.error)
            elif isinstance(msg, Admitted):
                for request_id in msg.request_ids:
                    stream = self.streams.get(request_id)
                    if stream is not None:
                        self._send(stream.identity, RequestAdmitted(stream.request.request_id))
            elif isinstance(msg, Rejected):
                stream = self.streams.pop(msg.request_id, None)
                if stream is not None:
                    self._fail(stream.identity, stream.request.request_id, msg.message, None,
                               status=msg.status)
            elif isinstance(msg, CacheFlushed):
                asked = self.flushes.pop(msg.query_id, None)
                if asked is not None:
                    self._send(asked[0], replace(msg, query_id=asked[1]))
            else:
                self.status, self.status_s = msg, time.monotonic()

    def emit(self, out: TokenDelta) -> None:
        stream = self.streams.get(out.request_id)
        if stream is None:
            return  # ended here already (a stop string), the scheduler's abort echo follows
        delta, stopped_early = stream.advance(out, self.tokenizer)
        if stopped_early:  # a stop string ended it before the engine did: free its pages at once
            self.to_scheduler.send(AbortRequest(out.request_id))
        if delta is None:
            return  # a whole response, not finished yet
        if delta.finished:
            del self.streams[out.request_id]
        self._send(stream.identity, delta, abort_on_failure=None if delta.finished else out.request_id)

    def end_with_error(self, request_id: str, error: str) -> None:
        """End a stream with `error` (finish_reason "abort") and free what it holds in the scheduler."""
        stream = self.streams.pop(request_id, None)
        if stream is None:
            return
        self.to_scheduler.send(AbortRequest(request_id))
        self._send(stream.identity, OutputDelta(
            stream.request.request_id, "", [], stream.num_prompt_tokens, stream.num_output_tokens,
            finished=True, finish_reason="abort", error=error))

    def server_info(self) -> ServerInfo:
        age = time.monotonic() - self.status_s
        status = self.status
        serving = status is not None and status.serving and age < STATUS_STALE_S
        return ServerInfo(self.spec.served_model_name, self.max_model_len, serving,
                          [] if status is None else status.replicas, age)

    # --- helpers --------------------------------------------------------------------------------

    def _send(self, identity: bytes, msg: object, abort_on_failure: str | None = None) -> None:
        try:
            self.frontend.send(identity, msg)
        except (ChannelError, ChannelTimeout) as exc:
            self.log.info("client %s is gone: %s", identity.hex(), exc)
            if abort_on_failure is not None:
                self.streams.pop(abort_on_failure, None)
                self.to_scheduler.send(AbortRequest(abort_on_failure))

    def _fail(self, identity: bytes, request_id: str, message: str, field_name: str | None, *,
              status: int = 400, context: ContextOverflow | None = None) -> None:
        self._send(identity, RequestFailed(request_id, message, field_name, status, context))

    def close(self) -> None:
        self._encoders.shutdown(wait=False, cancel_futures=True)
        self.frontend.close()
        self.to_scheduler.close()
        self.from_scheduler.close()
        if self.key_check is not None:
            self.key_check.stop()
        if self.spec.run_dir and (launcher_died() or not parent_alive(self._ppid)):
            # The launcher was SIGKILLed (no chance to clean up) and every child is on its way out:
            # the one child that lives from start to end removes the run's sockets.
            remove_once_ended(Path(self.spec.run_dir), _RUN_END_WAIT_S)


def _internal_id(identity: bytes, request_id: str) -> str:
    return f"{identity.hex()}/{request_id}"
