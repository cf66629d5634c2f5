"""Fixtures shared by the unit tests."""

from __future__ import annotations

import logging
import ssl
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from aiohttp import web

from pykcm.testenv.certs import Pki, ensure_pki
from pykcm.util.log import set_verbosity
from tests.support import loopback_server


@pytest.fixture
def verbosity(request: pytest.FixtureRequest) -> Iterator[None]:
    """Log at -v=N for the test, N given by `@pytest.mark.parametrize("verbosity", [N], indirect=True)`."""
    set_verbosity(request.param)
    yield
    set_verbosity(0)


@pytest.fixture(autouse=True)
def _pykcm_logging_restored() -> Iterator[None]:
    """A test that runs `cli.main` in-process lets it set up logging (a stderr handler, propagation
    off, a root handler for other loggers, Python's warnings captured) process-wide: put it all
    back, so later tests' caplog sees their records."""
    logger, root = logging.getLogger("pykcm"), logging.getLogger()
    saved = logger.handlers[:], logger.propagate, logger.level
    saved_root = root.handlers[:]
    yield
    logger.handlers[:], logger.propagate, logger.level = saved
    root.handlers[:] = saved_root
    logging.captureWarnings(False)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return ensure_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
async def mtls_server(pki: Pki) -> AsyncIterator[str]:
    """Answers with the common name of the client certificate it was shown."""

    async def whoami(request: web.Request) -> web.Response:
        peer = request.transport.get_extra_info("peercert") if request.transport else None
        subject = dict(pair[0] for pair in (peer or {}).get("subject", ()))
        return web.json_response({"cn": subject.get("commonName")})

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(pki.apiserver_cert, pki.apiserver_key)
    ctx.load_verify_locations(cafile=pki.ca_cert)
    ctx.verify_mode = ssl.CERT_REQUIRED
    async with loopback_server(whoami, ctx) as url:
        yield url


@pytest.fixture
def started_options(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The Options each `cli.main(["run", ...])` of the test would start the manager with (it is not
    started, nor is logging set up)."""
    from pykcm.app import cli

    runs: list[Any] = []
    monkeypatch.setattr(cli.logging_setup, "setup", lambda *_: None)
    monkeypatch.setattr(cli, "_run_manager", lambda options, classes, watch=None: runs.append(options))
    return runs
