"""The HTTP address of `cadence serve`, checked and bound before the engine starts.

Loading a 14B model takes minutes; a port out of range, an address this machine does not have or a
port another server listens on must be refused before that, in one line that names the address and
the cause (`AddressUnavailable`). `bind_http_socket` binds the socket at once, with uvicorn's own
option (SO_REUSEADDR), and `cadence serve` hands it to uvicorn, so the port found free stays this
server's while the engine loads. uvicorn makes it listen once the engine is ready: until then a
client's connection is refused rather than left waiting.
"""

from __future__ import annotations

import errno
import socket

_CAUSES = {
    errno.EADDRINUSE: "the port is already in use (another server listens there; choose another --port)",
    errno.EACCES: "permission denied (ports below 1024 need privileges; choose a port above 1023)",
    errno.EADDRNOTAVAIL: "no interface of this machine has that address (see --host)",
}


class AddressUnavailable(OSError):
    """The HTTP server cannot listen where it was asked to; the message names the address and why."""


def display_address(host: str, port: int) -> str:
    """host:port, with an IPv6 host in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def bind_http_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to host:port (port 0: any free port), not yet listening; AddressUnavailable
    if it cannot be."""
    where = display_address(host, port)
    if not 0 <= port <= 65535:
        raise AddressUnavailable(f"cannot listen on {where}: port {port} is outside 0-65535")
    try:
        family, kind, proto, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                              flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as exc:
        raise AddressUnavailable(f"cannot listen on {where}: {host!r} is not a known address "
                                 f"({exc.strerror})") from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(sockaddr)
    except OSError as exc:
        sock.close()
        cause = _CAUSES.get(exc.errno, exc.strerror or str(exc))
        raise AddressUnavailable(f"cannot listen on {where}: {cause}") from None
    return sock
