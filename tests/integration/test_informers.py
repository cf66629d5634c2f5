"""Informers against the real apiserver: events, pagination, 410 relist with tombstones, sharing."""

from __future__ import annotations

import asyncio
import base64
import json
import urllib.request
from collections.abc import AsyncIterator
from typing import Any

import pytest

from pykcm.client.resources import CONFIGMAPS, PODS, Resource
from pykcm.client.rest import RestClient
from pykcm.informers.factory import SharedInformerFactory
from pykcm.informers.store import DeletedFinalStateUnknown
from tests.support import admin_client, create_namespace, wait_for

pytestmark = pytest.mark.integration


class SpyClient(RestClient):
    """A real client that also remembers the LIST and WATCH calls reflectors make."""

    def __init__(self, base: RestClient) -> None:
        super().__init__(base.config, "spy")
        self.lists: list[tuple[str, dict[str, Any]]] = []
        self.watches: list[tuple[str, dict[str, Any]]] = []

    async def request(self, method: str, path: str, **kw: Any) -> Any:
        if method == "GET":
            self.lists.append((path, dict(kw.get("params") or {})))
        return await super().request(method, path, **kw)

    def watch(self, path: str, params: dict[str, Any], decoder: Any = None) -> AsyncIterator[dict[str, Any]]:
        self.watches.append((path, dict(params)))
        return super().watch(path, params, decoder)


class Events:
    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self.seen: list[tuple[str, str, Any]] = []

    def _mine(self, obj: Any) -> bool:
        o = obj.obj if isinstance(obj, DeletedFinalStateUnknown) else obj
        return o["metadata"].get("namespace") == self.namespace

    def add(self, obj: dict) -> None:
        if self._mine(obj):
            self.seen.append(("add", obj["metadata"]["name"], obj))

    def update(self, old: dict, new: dict) -> None:
        if self._mine(new):
            self.seen.append(("update", new["metadata"]["name"], new))

    def delete(self, obj: Any) -> None:
        if self._mine(obj):
            name = (obj.obj if isinstance(obj, DeletedFinalStateUnknown) else obj)["metadata"]["name"]
            self.seen.append(("delete", name, obj))

    def has(self, kind: str, name: str) -> bool:
        return any(k == kind and n == name for k, n, _ in self.seen)


async def synced_factory(client: RestClient, *resources: Resource, watch_list: bool = True) -> SharedInformerFactory:
    factory = SharedInformerFactory(client, min_resync_period=0, watch_list=watch_list)
    for res in resources:
        factory.informer(res)
    factory.start()
    assert await factory.wait_for_cache_sync(timeout=30)
    return factory


def pod(name: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "x"}},
        "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]},
    }


async def test_informer_sees_configmap_and_pod_add_update_delete(control_plane):
    client = admin_client(control_plane.kubeconfig)
    ns = await create_namespace(client, "inf")
    factory = await synced_factory(client, CONFIGMAPS, PODS)
    cms, pods = Events(ns), Events(ns)
    factory.informer(CONFIGMAPS).add_event_handler(cms.add, cms.update, cms.delete)
    factory.informer(PODS).add_event_handler(pods.add, pods.update, pods.delete)
    try:
        await client.create(CONFIGMAPS, {"metadata": {"name": "c1"}, "data": {"k": "v1"}}, namespace=ns)
        await wait_for(lambda: _true(cms.has("add", "c1")), message="configmap add")
        await client.patch(CONFIGMAPS, "c1", {"data": {"k": "v2"}}, namespace=ns)
        await wait_for(lambda: _true(cms.has("update", "c1")), message="configmap update")
        cached = factory.informer(CONFIGMAPS).indexer.get_by(ns, "c1")
        assert cached["data"] == {"k": "v2"}
        assert "managedFields" not in cached["metadata"]  # stripped before caching
        await client.delete(CONFIGMAPS, "c1", namespace=ns)
        await wait_for(lambda: _true(cms.has("delete", "c1")), message="configmap delete")
        assert factory.informer(CONFIGMAPS).indexer.get_by(ns, "c1") is None

        await client.create(PODS, pod("p1"), namespace=ns)
        await wait_for(lambda: _true(pods.has("add", "p1")), message="pod add")
        await client.patch(PODS, "p1", {"metadata": {"labels": {"app": "y"}}}, namespace=ns)
        await wait_for(lambda: _true(pods.has("update", "p1")), message="pod update")
        await client.delete(PODS, "p1", namespace=ns)  # unscheduled pods go at once
        await wait_for(lambda: _true(pods.has("delete", "p1")), message="pod delete")
        assert factory.informer(PODS).indexer.in_namespace(ns) == []
    finally:
        await factory.shutdown()
        await client.close()


async def make_configmaps(client: RestClient, prefix: str, count: int) -> str:
    ns = await create_namespace(client, prefix)
    sem = asyncio.Semaphore(32)

    async def make(i: int) -> None:
        async with sem:
            await client.create(CONFIGMAPS, {"metadata": {"name": f"cm-{i:04d}"}}, namespace=ns)

    await asyncio.gather(*(make(i) for i in range(count)))
    return ns


async def test_initial_state_of_over_1000_objects_is_streamed_not_listed(control_plane):
    """As client-go 1.36 (WatchListClient on): one watch sends every object, then the bookmark
    that ends the initial events; no LIST is made, and the same watch goes on."""
    client = admin_client(control_plane.kubeconfig)
    ns = await make_configmaps(client, "stream", 1100)
    spy = SpyClient(client)
    factory = await synced_factory(spy, CONFIGMAPS)
    try:
        assert not [p for path, p in spy.lists if path == CONFIGMAPS.path()]
        [(_, params)] = [(path, p) for path, p in spy.watches if path == CONFIGMAPS.path()]
        assert params["sendInitialEvents"] == "true" and params["resourceVersionMatch"] == "NotOlderThan"
        informer = factory.informer(CONFIGMAPS)
        assert len(informer.indexer.in_namespace(ns)) == 1100
        await client.create(CONFIGMAPS, {"metadata": {"name": "after"}}, namespace=ns)
        await wait_for(lambda: _true(informer.indexer.get_by(ns, "after") is not None))
        assert len(spy.watches) == 1  # the stream that listed is the one that watches
    finally:
        await factory.shutdown()
        await spy.close()
        await client.close()


async def test_initial_list_of_over_1000_objects_is_paginated_with_watch_list_off(control_plane):
    client = admin_client(control_plane.kubeconfig)
    ns = await make_configmaps(client, "page", 1100)
    spy = SpyClient(client)
    factory = await synced_factory(spy, CONFIGMAPS, watch_list=False)
    try:
        pages = [params for path, params in spy.lists if path == CONFIGMAPS.path()]
        assert len(pages) >= 3, pages
        assert all(p.get("limit") == 500 and not p.get("resourceVersion") for p in pages)
        assert all("continue" in p for p in pages[1:])
        mine = factory.informer(CONFIGMAPS).indexer.in_namespace(ns)
        assert len(mine) == 1100
    finally:
        await factory.shutdown()
        await spy.close()
        await client.close()


async def test_relist_after_410_matches_server_and_delivers_tombstones(control_plane):
    """A configmap vanishes while the apiserver is down (deleted straight from etcd) and history is
    compacted: the watch resumes with a too-old resourceVersion, gets 410, relists, and the delete
    handler receives a DeletedFinalStateUnknown carrying the last known object."""
    client = admin_client(control_plane.kubeconfig)
    ns = await create_namespace(client, "gone")
    for name in ("stays", "vanishes"):
        await client.create(CONFIGMAPS, {"metadata": {"name": name}, "data": {"who": name}}, namespace=ns)
    factory = await synced_factory(client, CONFIGMAPS)
    events = Events(ns)
    informer = factory.informer(CONFIGMAPS)
    informer.add_event_handler(events.add, events.update, events.delete)
    try:
        await wait_for(lambda: _true(informer.indexer.get_by(ns, "vanishes") is not None))
        await asyncio.to_thread(control_plane.stop_apiserver)
        _etcd(control_plane.etcd_url, "/v3/kv/deleterange", {"key": _b64(f"/registry/configmaps/{ns}/vanishes")})
        await asyncio.to_thread(control_plane.compact_etcd)
        await asyncio.to_thread(control_plane.start_apiserver)

        await wait_for(lambda: _true(events.has("delete", "vanishes")), timeout=60, message="tombstone")
        _, _, tomb = next(e for e in events.seen if e[0] == "delete")
        assert isinstance(tomb, DeletedFinalStateUnknown)
        assert tomb.key == f"{ns}/vanishes" and tomb.obj["data"] == {"who": "vanishes"}
        server = await client.list(CONFIGMAPS, namespace=ns)
        server_names = sorted(o["metadata"]["name"] for o in server["items"])
        cached_names = sorted(o["metadata"]["name"] for o in informer.indexer.in_namespace(ns))
        assert cached_names == server_names and "vanishes" not in cached_names
    finally:
        await factory.shutdown()
        await client.close()


async def test_one_reflector_serves_two_controllers(control_plane):
    client = admin_client(control_plane.kubeconfig)
    ns = await create_namespace(client, "share")
    spy = SpyClient(client)
    factory = SharedInformerFactory(spy, min_resync_period=0)
    first, second = factory.informer(CONFIGMAPS), factory.informer(CONFIGMAPS)
    assert first is second
    a, b = Events(ns), Events(ns)
    first.add_event_handler(on_add=a.add)
    second.add_event_handler(on_add=b.add)
    factory.start()
    try:
        assert await factory.wait_for_cache_sync(timeout=30)
        await client.create(CONFIGMAPS, {"metadata": {"name": "both"}}, namespace=ns)
        await wait_for(lambda: _true(a.has("add", "both") and b.has("add", "both")))
        # One watch (whose initial events are the list) however many handlers.
        assert len([p for path, p in spy.watches if path == CONFIGMAPS.path()]) == 1
        assert not [p for path, p in spy.lists if path == CONFIGMAPS.path()]
    finally:
        await factory.shutdown()
        await spy.close()
        await client.close()


async def _true(value: bool) -> bool:
    return value


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _etcd(base: str, path: str, body: dict) -> dict:
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(), method="POST")
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())
