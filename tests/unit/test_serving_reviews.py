"""TokenReviews and SubjectAccessReviews as KCM's delegated auth sends them (pykcm.serving.reviews):
a real reset tried again, the deadlines that bound them, and which answers the token cache keeps."""

from __future__ import annotations

import asyncio
import socket
import struct
import time
from typing import Any

import pytest

from pykcm.client.config import ClientConfig
from pykcm.client.errors import TooManyRequests, TransportError
from pykcm.client.rest import RestClient
from pykcm.serving import reviews
from pykcm.serving.authn import DelegatingAuthenticator, Unauthenticated
from pykcm.serving.messages import Headers, Query, Request
from tests.unit.test_http import ok, raw_server, read_request


async def test_a_review_whose_connection_the_apiserver_resets_is_tried_again(monkeypatch: pytest.MonkeyPatch) -> None:
    # apiserver's DefaultShouldRetry: utilnet.IsConnectionReset, found inside the transport's error.
    monkeypatch.setattr(reviews, "FIRST_WAIT", 0.0)
    tries = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal tries
        while await read_request(reader):
            tries += 1
            if tries == 1:  # SO_LINGER 0: the close is a RST
                writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                                           struct.pack("ii", 1, 0))
                writer.transport.abort()
                return
            writer.write(ok(b'{"status":{"allowed":true}}'))
            await writer.drain()

    codes: list[str] = []
    async with raw_server(handle) as url:
        client = RestClient(ClientConfig(host=url, ssl_context=None))
        try:
            answer = await reviews.send_review(client, "/x", {}, lambda code, _: codes.append(code))
        finally:
            await client.close()
    assert answer == {"status": {"allowed": True}} and tries == 2 and codes == ["<error>", "201"]


class Throttled:
    """Every review refused with a 429 after `delay` seconds."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.tries = 0

    async def request(self, method: str, path: str, body: Any = None, **_: Any) -> dict:
        self.tries += 1
        await asyncio.sleep(self.delay)
        raise TooManyRequests(429, "TooManyRequests", "too many requests, please try again later")


async def test_a_token_review_gives_up_at_its_deadline_tries_and_waits_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    # KCM's TokenRequestTimeout bounds the whole review; a 429 answer would otherwise be tried five
    # times, each try with the REST client's own Retry-After waits (55 s and 55 POSTs in a review).
    monkeypatch.setattr(reviews, "FIRST_WAIT", 0.05)
    codes: list[str] = []
    started = time.monotonic()
    with pytest.raises(TransportError, match="context deadline exceeded"):
        await reviews.send_review(Throttled(0.1), "/x", {}, lambda code, _: codes.append(code),  # type: ignore[arg-type]
                                  total=0.3)
    assert time.monotonic() - started < 0.5
    assert codes[:-1] == ["429"] * (len(codes) - 1) and codes[-1] in ("429", "<error>")


async def test_each_access_review_try_has_its_own_deadline_and_is_not_tried_again_past_it() -> None:
    apiserver = Throttled(1.0)
    codes: list[str] = []
    with pytest.raises(TransportError, match="context deadline exceeded"):
        await reviews.send_review(apiserver, "/x", {}, lambda code, _: codes.append(code), each=0.1)  # type: ignore[arg-type]
    assert apiserver.tries == 1 and codes == ["<error>"]


class TokenReviews:
    """`expired` fails in the apiserver's authenticator (status.error), `unknown` is rejected."""

    def __init__(self) -> None:
        self.reviews = 0

    async def request(self, method: str, path: str, body: Any = None, **_: Any) -> dict:
        self.reviews += 1
        if body["spec"]["token"] == "expired":
            return {"status": {"authenticated": False, "error": "service account token has expired"}}
        return {"status": {"authenticated": False}}


async def test_a_review_the_apiserver_answers_with_an_error_is_not_cached_a_rejection_is() -> None:
    # Go's cached token authenticator (cacheErrs false) keeps ok=false without an error only.
    apiserver = TokenReviews()
    authenticator = DelegatingAuthenticator(apiserver)  # type: ignore[arg-type]
    for token, reviews_made in (("expired", 2), ("unknown", 1)):
        apiserver.reviews = 0
        for _ in range(2):
            with pytest.raises(Unauthenticated):
                headers = Headers({"authorization": f"Bearer {token}"})
                await authenticator.authenticate(Request("GET", "/metrics", Query(), headers, "HTTP/1.1", None))
        assert apiserver.reviews == reviews_made, token
