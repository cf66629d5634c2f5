"""Go's net.JoinHostPort, and a server URL as Go's url.URL prints it."""

from __future__ import annotations

from urllib.parse import urlsplit


def join_host_port(host: str, port: int | str) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def redacted(url: str) -> str:
    """`url` with a password in it as Go's URL.Redacted writes it (user:***@host): for messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    return parts._replace(netloc=f"{parts.username}:***@{parts.netloc.rpartition('@')[2]}").geturl()


def host_of(url: str) -> str:
    """host:port of `url` without its user info, as Go's URL.Host (a metric label, say)."""
    return urlsplit(url).netloc.rpartition("@")[2]
