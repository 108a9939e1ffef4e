"""A port on the loopback interface that nothing listens on, for tests that start servers."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picked it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_tcp_address() -> str:
    """A ZeroMQ tcp address on a free port of 127.0.0.1."""
    return f"tcp://127.0.0.1:{free_port()}"
