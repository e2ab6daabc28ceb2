"""Is a task up: one TCP connect (the PS coordinator and servers, a MultiWorkerMirrored
worker waiting for its leader, and the leader waiting for the others to exit)."""

from __future__ import annotations

import socket


def reachable(address: str, timeout_s: float = 1.0) -> bool:
    """True when a TCP connection to `address` ("host:port") succeeds."""
    host, _, port = address.rpartition(":")
    try:  # an IPv6 host comes in brackets: "[::1]:2222"
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            return True
    except OSError:
        return False
