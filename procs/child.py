"""What every child process does first and last: name itself, log, obey signals, report READY.

Children ignore SIGINT (a Ctrl-C in the terminal reaches the whole process group; the launcher
alone decides the shutdown order) and turn SIGTERM into `Stopping`, which their loops let unwind
through their cleanup. It is raised once: a SIGTERM that lands inside a finalizer (a `__del__`,
where Python would print the exception and drop it, so the stop would be lost) is raised 10 ms
later from a SIGALRM instead, and a repeated SIGTERM does not interrupt the cleanup. Children
also ask the kernel for a signal when the launcher dies, so no child outlives a crashed launcher:
PARENT_DIED_SIGNAL, which stops them as SIGTERM does and lets `launcher_died` tell that nobody is
left to clean the run up (SIGTERM itself comes from the launcher's shutdown, or from an operator).
Last, a child whose actor closed exits without the interpreter's teardown (`exit_after_cleanup`).
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import os
import signal
import sys
from collections.abc import Callable
from multiprocessing.connection import Connection
from types import FrameType
from typing import Protocol

from ipc.codec import encode
from ipc.process_specs import Ready

_PR_SET_PDEATHSIG = 1
_FINALIZER_RETRY_S = 0.01
PARENT_DIED_SIGNAL = signal.SIGUSR2  # what the kernel sends a child when its launcher dies


class Stopping(Exception):  # noqa: N818 - a signal, not an error
    """SIGTERM arrived: leave the loop through its cleanup."""


def become(title: str) -> logging.Logger:
    """Set the process title (`cadence:scheduler`, ...), logging and signal handling."""
    logging.basicConfig(
        level=os.environ.get("CADENCE_LOG_LEVEL", "INFO"),
        format=f"%(asctime)s %(levelname)s [{title}] %(message)s",
        stream=sys.stderr,
        force=True,
    )
    try:
        import setproctitle
    except ImportError:  # a title is for ps and top; serving goes on without it
        logging.getLogger(title).warning("setproctitle is not installed: this process keeps its "
                                         "python title (pip install setproctitle)")
    else:
        setproctitle.setproctitle(title)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _raise_stopping)
    signal.signal(PARENT_DIED_SIGNAL, _parent_died)
    signal.signal(signal.SIGALRM, _raise_stopping)  # the retry of a SIGTERM that hit a finalizer
    _die_with_parent()
    return logging.getLogger(title)


class Actor(Protocol):
    """What a child process runs once it started: its loop, then its cleanup."""

    def loop(self) -> None: ...

    def close(self) -> None: ...


def run_actor(ready_conn: Connection, ready: Ready, log: logging.Logger, start: Callable[[], Actor]) -> None:
    """Start the child's actor and report READY (or the startup error, then exit 1), run its loop
    until it returns or SIGTERM arrives, close it, and exit 0 at once (`exit_after_cleanup`); a loop
    that raised exits through its traceback instead. `ready` names the child; an actor with a
    `num_pages` attribute (an executor) reports its KV pages."""
    try:
        actor = start()
    except Stopping:
        sys.exit(0)
    except BaseException as exc:  # noqa: BLE001 - the launcher prints it and exits non-zero
        log.exception("startup failed")
        report_ready(ready_conn, dataclasses.replace(ready, error=f"{type(exc).__name__}: {exc}"))
        sys.exit(1)
    report_ready(ready_conn, dataclasses.replace(ready, num_pages=getattr(actor, "num_pages", 0)))
    try:
        actor.loop()
    except Stopping:
        pass
    finally:
        actor.close()
    exit_after_cleanup()


def exit_after_cleanup() -> None:
    """Exit 0 without the interpreter's teardown, once the actor's own cleanup has run. An executor
    spends ~0.65 s there freeing torch's modules and tensors one by one (the lm_head's munmap alone
    is 0.1 s) and the tokenizer ~0.2 s its vocabulary's objects, time the launcher's stop waits for,
    where the kernel reclaims the same memory at exit in one go. What teardown would still have done
    is done here: the messages queued on ZeroMQ sockets leave within their linger, and the logs are
    flushed."""
    import zmq

    # The channels are closed and their queued messages leave within their LINGER; a socket left
    # open would make a plain term() wait for ever, so destroy() closes it with the same bound.
    zmq.Context.instance().destroy(linger=200)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def report_ready(conn: Connection, ready: Ready) -> None:
    """The READY handshake: one encoded Ready on the pipe the launcher reads, then close it."""
    try:
        conn.send_bytes(encode(ready))
    finally:
        conn.close()


class _StopSignal:
    raised = False  # Stopping went up once: later signals leave the cleanup alone
    parent_died = False  # the kernel said the launcher is gone


def launcher_died() -> bool:
    """Whether this child stops because its launcher died (PARENT_DIED_SIGNAL), not because it was
    asked to: then the launcher will not clean the run up."""
    return _StopSignal.parent_died


def _parent_died(signum: int, frame: FrameType | None) -> None:
    _StopSignal.parent_died = True
    _raise_stopping(signum, frame)


def _raise_stopping(signum: int, frame: FrameType | None) -> None:
    if _StopSignal.raised:
        return
    if _in_finalizer(frame):
        signal.setitimer(signal.ITIMER_REAL, _FINALIZER_RETRY_S)
        return
    _StopSignal.raised = True
    raise Stopping("SIGTERM")


def _in_finalizer(frame: FrameType | None) -> bool:
    while frame is not None:
        if frame.f_code.co_name == "__del__":
            return True
        frame = frame.f_back
    return False


def _die_with_parent() -> None:
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, PARENT_DIED_SIGNAL)
    except (OSError, AttributeError):
        pass  # the loops also notice a changed parent pid
    if os.getppid() == 1:  # the launcher died before prctl took effect
        _StopSignal.parent_died = True
        raise Stopping("the launcher is gone")


def parent_alive(original_ppid: int) -> bool:
    return os.getppid() == original_ppid
