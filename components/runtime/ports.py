"""Loopback ports held for the process that will listen on them, never probed and released.

Why: "bind port 0, close, hand the number on" leaves a window in which any other process may be
given the same port, a flaky `address already in use` on a loaded machine. A `ReservedPort` keeps
its socket bound (SO_REUSEADDR, never listening) until the server has taken the port over. While
it is bound, Linux hands that port to no other `bind(port 0)` and to no outgoing connection, and
refuses an explicit bind without SO_REUSEADDR; a server that sets SO_REUSEADDR before binding
(etcd and every Go listener, torch's TCPStore, libuv) binds and listens on it normally.

    with ReservedPort() as port:       # 127.0.0.1:<port> is ours
        start_server(port)             # the server binds it with SO_REUSEADDR
        wait_until_listening(port)
    # released: the server now holds it
"""

from __future__ import annotations

import socket
from types import TracebackType

LOOPBACK = "127.0.0.1"


class ReservedPort:
    """A free TCP port on `host`, reserved until `release()` (or the end of a `with` block).

    Args:
        host: the address the server will listen on.
    """

    def __init__(self, host: str = LOOPBACK) -> None:
        self.host = host
        self._sock: socket.socket | None = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, 0))
        self.port = int(self._sock.getsockname()[1])

    @property
    def endpoint(self) -> str:
        """`host:port`, as torchrun's --rdzv-endpoint and etcd clients take it."""
        return f"{self.host}:{self.port}"

    def release(self) -> None:
        """Stop holding the port (once the server listens on it, or when it is no longer needed)."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def __enter__(self) -> int:
        return self.port

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()
