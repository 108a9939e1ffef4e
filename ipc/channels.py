"""Typed ZMQ channels: sockets that send and receive codec messages.

Every channel has a name used in its errors, a LINGER of a fraction of a second so closing never
hangs on an absent peer, and works as a context manager. A channel belongs to one thread (ZMQ
sockets are not thread-safe).

Receiving, the contract a process loop relies on:
* `recv(timeout_s)` returns the message, or None when nothing arrived within `timeout_s` (a loop
  that times out is normal, not an error). `expect(timeout_s)` raises `ChannelTimeout` naming the
  channel instead, for a reply that must come.
* A frame that does not decode raises `BadFrame`, a CodecError (its message names the channel)
  *after* the frame has been consumed, so the loop can answer whom it names (`names`, and a
  ROUTER's `identity`) and call `recv` again to get the next good message.
* `types=` restricts what a channel accepts; any other registered type raises CodecError too.

Sending blocks at most `send_timeout_s` (a PUSH with no peer would otherwise block forever) and then
raises `ChannelTimeout`. Any message may carry extra raw frames after its envelope (`frames=`),
sent without copying, for bulk payloads; `recv_with_frames` returns them as memoryviews.

A RouterChannel may require the API key of the DealerChannels that connect (ipc/native_auth.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import zmq

from ipc.codec import CodecError, decode, encode, type_name
from ipc.native_auth import HandshakeWatch, present_key, require_key

Buffer = bytes | bytearray | memoryview

_DEFAULT_LINGER_S = 0.2
_DEFAULT_SEND_TIMEOUT_S = 10.0


class ChannelTimeout(TimeoutError):
    """Nothing arrived (or could be sent) on a channel in the time asked."""


class BadFrame(CodecError):
    """A received frame that does not decode, consumed already. Beyond CodecError's `names` it keeps
    the frames the socket type put before the envelope: a ROUTER's `identity` of the sender."""

    def __init__(self, message: str, type_name: str | None = None, names: dict | None = None,
                 prefix: Sequence[bytes] = ()) -> None:
        super().__init__(message, type_name, names)
        self.prefix = tuple(prefix)

    @property
    def identity(self) -> bytes | None:
        return self.prefix[0] if self.prefix else None


class ChannelError(RuntimeError):
    """A socket-level failure, e.g. a ROUTER sending to an identity that is not connected."""


class Delivery(NamedTuple):
    message: Any
    frames: tuple[memoryview, ...]  # raw frames after the envelope, zero-copy views


class Routed(NamedTuple):
    identity: bytes  # the sending DEALER's routing id; pass it to RouterChannel.send to reply
    message: Any
    frames: tuple[memoryview, ...] = ()


class Channel:
    """One ZMQ socket, bound or connected to one address."""

    socket_type: int = -1
    # Frames before the envelope that the socket type adds (ROUTER identity, PUB topic).
    _num_prefix_frames = 0

    def __init__(
        self,
        address: str,
        *,
        bind: bool,
        name: str | None = None,
        context: zmq.Context | None = None,
        types: Sequence[type] | None = None,
        linger_s: float = _DEFAULT_LINGER_S,
        send_timeout_s: float | None = _DEFAULT_SEND_TIMEOUT_S,
    ) -> None:
        self.address = address
        self.name = name or address
        self._types = tuple(types) if types is not None else None
        self._socket = (context or zmq.Context.instance()).socket(self.socket_type)
        self._socket.linger = int(linger_s * 1000)
        self._socket.sndtimeo = -1 if send_timeout_s is None else int(send_timeout_s * 1000)
        self._send_timeout_s = send_timeout_s
        self._configure(self._socket)
        try:
            if bind:
                self._socket.bind(address)
            else:
                self._socket.connect(address)
        except zmq.ZMQError as e:
            self._socket.close(linger=0)
            verb = "bind" if bind else "connect"
            raise ChannelError(f"channel {self.name}: cannot {verb} {address}: {e}") from e

    @classmethod
    def bind(cls, address: str, **kwargs: Any) -> Any:
        return cls(address, bind=True, **kwargs)

    @classmethod
    def connect(cls, address: str, **kwargs: Any) -> Any:
        return cls(address, bind=False, **kwargs)

    def _configure(self, socket: zmq.Socket) -> None:
        """Socket options particular to a channel type, set before bind/connect."""

    def close(self) -> None:
        self._socket.close()

    @property
    def closed(self) -> bool:
        return self._socket.closed

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, {self.address!r})"

    # --- sending ---------------------------------------------------------------------------------

    def _send_parts(self, prefix: Sequence[bytes], msg: object, frames: Sequence[Buffer]) -> None:
        if self._types is not None and not isinstance(msg, self._types):
            raise TypeError(f"channel {self.name} sends {self._types_str()}, not {type(msg).__qualname__}")
        parts: list[Buffer] = [*prefix, encode(msg), *frames]
        try:
            self._socket.send_multipart(parts, copy=not frames)
        except zmq.Again as e:
            raise ChannelTimeout(
                f"channel {self.name}: could not send {type_name(msg)} within "
                f"{self._send_timeout_s} s (no peer, or the peer is not reading)"
            ) from e
        except zmq.ZMQError as e:
            raise ChannelError(f"channel {self.name}: sending {type_name(msg)} failed: {e}") from e

    # --- receiving -------------------------------------------------------------------------------

    def _recv_parts(self, timeout_s: float) -> tuple[list[zmq.Frame], Delivery] | None:
        """Wait up to timeout_s for one multipart message; consume it, then decode its envelope."""
        if timeout_s < 0:
            raise ValueError(f"channel {self.name}: timeout_s must be >= 0, got {timeout_s}")
        if not self._socket.poll(int(timeout_s * 1000), zmq.POLLIN):
            return None
        parts = self._socket.recv_multipart(copy=False)
        n = self._num_prefix_frames
        prefix = [p.bytes for p in parts[:n]]
        if len(parts) <= n:
            raise BadFrame(f"channel {self.name}: expected an envelope frame, got {len(parts)} frame(s)",
                           prefix=prefix)
        try:
            msg = decode(parts[n].buffer)
        except CodecError as e:
            raise BadFrame(f"channel {self.name}: {e}", e.type_name, e.names, prefix) from e
        if self._types is not None and not isinstance(msg, self._types):
            raise BadFrame(f"channel {self.name}: expected {self._types_str()}, got {type_name(msg)}",
                           type_name(msg), prefix=prefix)
        return parts[:n], Delivery(msg, tuple(p.buffer for p in parts[n + 1 :]))

    def _types_str(self) -> str:
        return " | ".join(t.__qualname__ for t in self._types or ())


class _Receiver(Channel):
    def recv(self, timeout_s: float) -> Any | None:
        """The next message, or None if none arrives within timeout_s. Raises CodecError for a bad
        frame, which is consumed: calling recv again gets the next message."""
        got = self._recv_parts(timeout_s)
        return None if got is None else got[1].message

    def recv_with_frames(self, timeout_s: float) -> Delivery | None:
        got = self._recv_parts(timeout_s)
        return None if got is None else got[1]

    def expect(self, timeout_s: float) -> Any:
        """Like recv, but raises ChannelTimeout when nothing arrives."""
        msg = self.recv(timeout_s)
        if msg is None:
            raise ChannelTimeout(f"channel {self.name}: no message within {timeout_s} s")
        return msg


class _Sender(Channel):
    def send(self, msg: object, frames: Sequence[Buffer] = ()) -> None:
        self._send_parts((), msg, frames)


class PushChannel(_Sender):
    socket_type = zmq.PUSH


class PullChannel(_Receiver):
    socket_type = zmq.PULL


class PubChannel(Channel):
    """Broadcasts to every subscriber; never blocks (a slow subscriber loses messages past its HWM).
    Each message is [topic, envelope, *frames]; subscribers filter on the topic prefix."""

    socket_type = zmq.PUB

    def send(self, msg: object, topic: bytes = b"", frames: Sequence[Buffer] = ()) -> None:
        self._send_parts((topic,), msg, frames)


class SubChannel(_Receiver):
    socket_type = zmq.SUB
    _num_prefix_frames = 1

    def __init__(self, address: str, *, topics: Sequence[bytes] = (b"",), **kwargs: Any) -> None:
        self._topics = tuple(topics)
        super().__init__(address, **kwargs)

    def _configure(self, socket: zmq.Socket) -> None:
        for topic in self._topics:
            socket.subscribe(topic)


class DealerChannel(_Sender, _Receiver):
    """The peer of a RouterChannel; `identity` is the routing id the router sees (random if None).
    With `api_key` it presents the key to a router that requires one (ipc/native_auth.py); with a
    key or over tcp, `handshakes` tells whether the router refused the connection."""

    socket_type = zmq.DEALER

    def __init__(self, address: str, *, identity: bytes | None = None, api_key: str | None = None,
                 **kwargs: Any) -> None:
        self._identity = identity
        self._api_key = api_key
        self.handshakes: HandshakeWatch | None = None
        super().__init__(address, **kwargs)

    def _configure(self, socket: zmq.Socket) -> None:
        if self._identity is not None:
            socket.routing_id = self._identity
        if self._api_key is not None:
            present_key(socket, self._api_key)
        if self._api_key is not None or self.address.startswith("tcp://"):
            self.handshakes = HandshakeWatch(socket)

    def close(self) -> None:
        if self.handshakes is not None:
            self.handshakes.close()
        super().close()


class RouterChannel(Channel):
    """Receives (identity, message) from many dealers and replies to one by identity. Sending to an
    identity that is not connected raises ChannelError instead of silently dropping the message."""

    socket_type = zmq.ROUTER
    _num_prefix_frames = 1

    def __init__(self, address: str, *, key_required: bool = False, **kwargs: Any) -> None:
        """`key_required`: take only connections that present the API key (ipc/native_auth.py; the
        process must run its start_key_check)."""
        self._key_required = key_required
        super().__init__(address, **kwargs)

    def _configure(self, socket: zmq.Socket) -> None:
        socket.router_mandatory = True
        if self._key_required:
            require_key(socket)

    def also_bind(self, address: str) -> None:
        """Listen on a second address too (the tokenizer's front end: ipc and tcp)."""
        try:
            self._socket.bind(address)
        except zmq.ZMQError as e:
            raise ChannelError(f"channel {self.name}: cannot bind {address}: {e}") from e

    def recv(self, timeout_s: float) -> Routed | None:
        """The next (identity, message), or None on timeout; CodecError (frame consumed) if bad."""
        got = self._recv_parts(timeout_s)
        if got is None:
            return None
        prefix, delivery = got
        return Routed(prefix[0].bytes, delivery.message, delivery.frames)

    def expect(self, timeout_s: float) -> Routed:
        routed = self.recv(timeout_s)
        if routed is None:
            raise ChannelTimeout(f"channel {self.name}: no message within {timeout_s} s")
        return routed

    def send(self, identity: bytes, msg: object, frames: Sequence[Buffer] = ()) -> None:
        try:
            self._send_parts((identity,), msg, frames)
        except ChannelError as e:
            raise ChannelError(
                f"channel {self.name}: cannot send {type_name(msg)} to identity {identity!r} "
                f"(not connected?): {e.__cause__}"
            ) from e


def wait_readable(channels: Sequence[Channel], timeout_s: float) -> list[Channel]:
    """The channels that have a message waiting, blocking up to `timeout_s` for the first one.

    A process loop that serves several sockets waits here, then drains each ready channel with
    `recv(0)`: no busy loop, and no socket starves another.
    """
    poller = zmq.Poller()
    for channel in channels:
        poller.register(channel._socket, zmq.POLLIN)
    ready = dict(poller.poll(max(0, int(timeout_s * 1000))))
    return [c for c in channels if c._socket in ready]
