"""Reflector decisions with a scripted API: pagination fallback, bookmarks, 410 handling."""

import asyncio

import pytest

from pykcm.client.config import ClientConfig
from pykcm.client.errors import Gone
from pykcm.client.resources import CONFIGMAPS
from pykcm.client.rest import RestClient
from pykcm.informers.delta_queue import DeltaQueue, DeltaType
from pykcm.informers.reflector import PAGE_SIZE, Reflector


def cm(name: str, rv: str, **meta) -> dict:
    return {"metadata": {"name": name, "namespace": "ns", "resourceVersion": rv, **meta}}


class ScriptedClient(RestClient):
    def __init__(self, responses: list, watches: list | None = None) -> None:
        super().__init__(ClientConfig(host="https://127.0.0.1:1", ssl_context=None))
        self.responses = responses
        self.watches = watches or []
        self.requests: list[dict] = []
        self.watch_params: list[dict] = []

    async def request(self, method, path, **kw):
        self.requests.append(dict(kw.get("params") or {}))
        answer = self.responses.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def watch(self, path, params):
        self.watch_params.append(params)
        events = self.watches.pop(0) if self.watches else []
        for event in events:
            yield event
        if not self.watches:
            await asyncio.Event().wait()  # the last scripted watch stays open


def page(items: list, rv: str, cont: str = "") -> dict:
    return {"kind": "ConfigMapList", "metadata": {"resourceVersion": rv, "continue": cont}, "items": items}


async def run_until(reflector: Reflector, queue: DeltaQueue, count: int) -> list:
    task = asyncio.create_task(reflector.run())
    deltas = []
    try:
        for _ in range(count):
            deltas.append(await asyncio.wait_for(queue.pop(), 5))
    finally:
        task.cancel()
    return deltas


async def test_expired_continue_token_falls_back_to_one_full_list():
    client = ScriptedClient([
        page([cm("a", "1")], "10", cont="tok"),
        Gone(410, "Expired", "continue token expired"),
        page([cm("a", "1"), cm("b", "2")], "12"),
    ])
    queue = DeltaQueue()
    reflector = Reflector(client, CONFIGMAPS, queue)
    [replaced] = await run_until(reflector, queue, 1)
    assert replaced.type is DeltaType.REPLACED
    assert [o["metadata"]["name"] for o in replaced.payload] == ["a", "b"]
    assert client.requests[0] == {"limit": PAGE_SIZE}
    assert client.requests[1] == {"limit": PAGE_SIZE, "continue": "tok"}
    assert "continue" not in client.requests[2] and "limit" not in client.requests[2]
    assert reflector.last_resource_version == "12"


async def test_watch_resumes_from_list_rv_with_bookmarks_and_strips_managed_fields():
    client = ScriptedClient(
        [page([cm("a", "1", managedFields=[{"manager": "x"}])], "10")],
        watches=[[
            {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "15"}}},
            {"type": "ADDED", "object": cm("b", "16", managedFields=[{}])},
        ]],
    )
    queue = DeltaQueue()
    reflector = Reflector(client, CONFIGMAPS, queue)
    replaced, bookmark, added = await run_until(reflector, queue, 3)
    assert "managedFields" not in replaced.payload[0]["metadata"]
    assert added.type is DeltaType.ADDED and "managedFields" not in added.payload["metadata"]
    # Each delta says where the cache stands once applied, bookmarks included.
    assert [replaced.resource_version, bookmark.resource_version, added.resource_version] == ["10", "15", "16"]
    assert bookmark.type is DeltaType.BOOKMARK
    params = client.watch_params[0]
    assert params["resourceVersion"] == "10" and params["allowWatchBookmarks"] == "true"
    assert 300 <= params["timeoutSeconds"] < 600
    assert reflector.last_resource_version == "16"


async def test_watch_error_410_relists_and_the_next_watch_starts_from_the_new_list():
    client = ScriptedClient(
        [page([cm("a", "1")], "10"), page([cm("b", "30")], "30")],
        watches=[[{"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired"}}], []],
    )
    queue = DeltaQueue()
    reflector = Reflector(client, CONFIGMAPS, queue)
    first, second = await run_until(reflector, queue, 2)
    assert first.type is second.type is DeltaType.REPLACED
    assert [o["metadata"]["name"] for o in second.payload] == ["b"]
    await asyncio.sleep(0)  # let the reflector open its next watch
    assert client.watch_params[-1]["resourceVersion"] == "30"


@pytest.mark.parametrize("rv", ["", "abc"])
def test_non_numeric_resource_versions_are_kept_but_not_exported(rv):
    reflector = Reflector(ScriptedClient([]), CONFIGMAPS, DeltaQueue())
    reflector._set_resource_version(rv)
    assert reflector.last_resource_version == rv
