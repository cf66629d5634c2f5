"""The example plugin authors copy logs as KCM does: nothing at the default verbosity for a
ServiceAccount it creates (KCM's serviceaccounts_controller.go logs none), the key at V(4)."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from pykcm.app.options import Options
from pykcm.controller import ControllerContext
from pykcm.controllers.serviceaccount import ServiceAccountController
from pykcm.informers.factory import SharedInformerFactory


class CreatingClient:
    def __init__(self) -> None:
        self.created: list[tuple[str, str]] = []

    async def create(self, resource: Any, body: dict, namespace: str) -> dict:
        self.created.append((namespace, body["metadata"]["name"]))
        return body


async def created_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    client = CreatingClient()
    ctx = ControllerContext(client=client, informers=SharedInformerFactory(None), options=Options(), events=None)  # type: ignore[arg-type]
    controller = ServiceAccountController(ctx)
    controller.namespaces.indexer.upsert({"metadata": {"name": "team-a"}, "status": {"phase": "Active"}})
    with caplog.at_level(logging.DEBUG, logger="pykcm"):
        await controller.sync("team-a")
    assert client.created == [("team-a", "default")]
    return [r for r in caplog.records if r.getMessage() == "Created service account"]


async def test_a_create_is_not_logged_at_the_default_verbosity(caplog: pytest.LogCaptureFixture) -> None:
    assert await created_lines(caplog) == []


@pytest.mark.parametrize("verbosity", [4], indirect=True)
async def test_a_create_is_logged_at_v4_with_its_key(verbosity: None, caplog: pytest.LogCaptureFixture) -> None:
    [record] = await created_lines(caplog)
    assert record.kv == {"serviceAccount": "team-a/default"}  # type: ignore[attr-defined]
