"""Whether anything answers at a native client's address, checked once before the client waits on it.

A ZeroMQ DEALER connects in the background and queues what it sends, so a client given a wrong
address would wait out its whole timeout (two minutes) in silence. `check_answers` tries the address
once with a plain socket: an ipc path that does not exist, is not a socket or has no listener, or a
tcp port that refuses the connection or does not answer within a few seconds, raises ClientError
saying that nothing answers there. The connection is closed at once; the server's ZeroMQ socket
drops it like any peer that left before its handshake.
"""

from __future__ import annotations

import socket

from api.client_errors import ClientError

ANSWER_CHECK_S = 3.0  # how long a tcp address may take to accept a connection
_WHERE_TO_LOOK = ('a running server logs its native address once it is ready: '
                  '`native clients (api.client) connect with Client("...")`')


def check_answers(address: str, timeout_s: float = ANSWER_CHECK_S) -> None:
    """Raise ClientError unless something accepts a connection at `address` (ipc:// or tcp://; other
    transports are not checked)."""
    scheme, _, target = address.partition("://")
    try:
        if scheme == "ipc":
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
                probe.settimeout(timeout_s)
                probe.connect(target)
        elif scheme == "tcp":
            host, _, port = target.rpartition(":")
            with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
                pass
    except FileNotFoundError:
        raise ClientError(f"nothing answers at {address}: no such socket file; {_WHERE_TO_LOOK}") from None
    except ConnectionRefusedError:
        raise ClientError(f"nothing answers at {address}: connection refused (no server listens there); "
                          f"{_WHERE_TO_LOOK}") from None
    except TimeoutError:
        raise ClientError(f"nothing answers at {address}: no answer within {timeout_s:g} s") from None
    except (OSError, ValueError) as exc:
        cause = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ClientError(f"nothing answers at {address}: {cause}") from None
