"""Free TCP ports on 127.0.0.1 for tests: for a server a test starts on a port it names, or a
URL that must find nothing listening."""

from __future__ import annotations

import socket


def free_ports(count: int) -> list[int]:
    """`count` distinct free TCP ports on 127.0.0.1 (all held until all are known)."""
    socks = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            socks.append(sock)
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago: nothing listens there."""
    (port,) = free_ports(1)
    return port
