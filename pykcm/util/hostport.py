"""Go's net.JoinHostPort: an IPv6 host in brackets, so the port stays apart from its colons."""

from __future__ import annotations


def join_host_port(host: str, port: int | str) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
