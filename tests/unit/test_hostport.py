"""A server URL in messages, logs and metric labels: never its password."""

from __future__ import annotations

import pytest

from pykcm.util.hostport import host_of, join_host_port, redacted


@pytest.mark.parametrize(("url", "shown", "host"), [
    ("https://admin:S3CRET@10.0.0.1:6443", "https://admin:***@10.0.0.1:6443", "10.0.0.1:6443"),  # Go's URL.Redacted
    ("https://admin@[::1]:6443/prefix", "https://admin@[::1]:6443/prefix", "[::1]:6443"),  # no password: as it is
    ("https://127.0.0.1:6443", "https://127.0.0.1:6443", "127.0.0.1:6443"),
])
def test_a_password_in_a_server_url_is_not_shown(url: str, shown: str, host: str) -> None:
    assert redacted(url) == shown and host_of(url) == host


def test_an_ipv6_host_keeps_its_brackets() -> None:
    assert join_host_port("::1", 6443) == "[::1]:6443" and join_host_port("h", 1) == "h:1"
