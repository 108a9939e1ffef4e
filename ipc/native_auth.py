"""The API key on the tokenizer's front end, for native clients on other machines.

When `cadence serve --native-tcp HOST:PORT` runs with an API key, the front end's ROUTER takes
only connections that present the key, with ZeroMQ's PLAIN mechanism (user "cadence", password =
the key) checked by a ZAP handler thread in the tokenizer process (`start_key_check`). A
connection with a wrong key, or none, is refused in the handshake, before any message of it is
read. PLAIN sends the key as it is, as HTTP's Bearer header does without TLS: across an untrusted
network, tunnel it (docs/deploy.md).

Clients present the key (`present_key`) and watch their socket's handshakes (`HandshakeWatch`), so
that a refused key is an error at once, not a silence until the timeout.
"""

from __future__ import annotations

import contextlib
import itertools
import time

import zmq
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils.monitor import recv_monitor_message

PLAIN_USER = "cadence"
_ZAP_BIND_WAIT_S = 5.0
_WATCH_IDS = itertools.count()
_REFUSALS = {
    zmq.EVENT_HANDSHAKE_FAILED_AUTH: "refused the API key",
    zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL: "refused the connection: it requires an API key (or none), "
                                         "and this client's differs",
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL: "refused the connection in its handshake",
}


def start_key_check(api_key: str, context: zmq.Context | None = None) -> ThreadAuthenticator:
    """Start the ZAP handler that accepts PLAIN connections with `api_key`; stop() it at exit."""
    if not api_key:
        raise ValueError("the API key must not be empty")
    deadline = time.monotonic() + _ZAP_BIND_WAIT_S
    while True:
        auth = ThreadAuthenticator(context or zmq.Context.instance())
        try:
            auth.start()
            break
        except zmq.ZMQError as e:
            # the context's ZAP endpoint: a handler stopped a moment ago still holds it until
            # ZeroMQ's reaper has closed its socket
            if auth.zap_socket is not None:
                auth.zap_socket.close(0)
            if e.errno != zmq.EADDRINUSE or time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    auth.configure_plain(domain="*", passwords={PLAIN_USER: api_key})
    return auth


def require_key(socket: zmq.Socket) -> None:
    """Make a bound socket take only PLAIN connections (the ZAP handler checks the key)."""
    socket.plain_server = True


def present_key(socket: zmq.Socket, api_key: str) -> None:
    """Make a connecting socket present `api_key`; set before connect()."""
    socket.plain_username = PLAIN_USER.encode()
    socket.plain_password = api_key.encode()


class HandshakeWatch:
    """The handshake failures of one connecting socket (plain or asyncio), read without blocking;
    create it before the socket connects."""

    def __init__(self, socket: zmq.Socket) -> None:
        events = 0
        for event in _REFUSALS:
            events |= event
        address = f"inproc://cadence-handshakes-{next(_WATCH_IDS)}"
        self._socket = socket
        socket.monitor(address, events)
        # A plain PAIR on the socket's own context (inproc needs it), whatever the socket's kind.
        self._monitor = zmq.Context.shadow(socket.context.underlying).socket(zmq.PAIR)
        self._monitor.connect(address)

    def refusal(self) -> str | None:
        """Why the server refused this socket's connection ("refused the API key"), if it did."""
        while self._monitor.poll(0):
            event = recv_monitor_message(self._monitor)["event"]
            if event in _REFUSALS:
                return _REFUSALS[event]
        return None

    def close(self) -> None:
        """Stop the socket's monitor, then close our end. In that order: an event sent to a monitor
        whose reader is gone blocks the context's I/O thread, and every socket of the process with it."""
        if not self._socket.closed:
            with contextlib.suppress(zmq.ZMQError):
                self._socket.disable_monitor()
        self._monitor.close(linger=0)
