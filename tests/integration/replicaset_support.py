"""Helpers for the ReplicaSet controller's scenario tests against the real kube-apiserver:
playing the scheduler and the kubelet, reading what the controller did, and spying on its syncs."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

from pykcm.app.manager import Manager
from pykcm.app.options import Options
from pykcm.client.errors import NotFound
from pykcm.client.events import EventRecorder
from pykcm.client.resources import EVENTS, NAMESPACES, PODS, REPLICASETS
from pykcm.client.rest import MERGE_PATCH, RestClient
from pykcm.controller import ControllerContext
from pykcm.controller.expectations import ControllerExpectations
from pykcm.controllers.replicaset import ReplicaSetController
from pykcm.informers.factory import SharedInformerFactory
from pykcm.informers.store import object_key
from pykcm.util.apitime import format_time
from tests.support import PAUSE_IMAGE, controller_of, replicaset_manifest, wait_for

RS_CONTROLLER = "replicaset-controller"


def rs_controller(manager: Manager) -> ReplicaSetController:
    ctrl = controller_of(manager, RS_CONTROLLER)
    assert isinstance(ctrl, ReplicaSetController)
    return ctrl


async def clean_namespace(api: RestClient, ns: str) -> None:
    """Leave nothing for later managers to sync: RSs gone, pods gone (finalizers dropped first)."""
    with contextlib.suppress(NotFound):
        await api.delete_collection(REPLICASETS, ns)
        for pod in (await api.list(PODS, ns))["items"]:
            if pod["metadata"].get("finalizers"):
                with contextlib.suppress(NotFound):
                    await api.patch(PODS, pod["metadata"]["name"], {"metadata": {"finalizers": None}}, ns,
                                    content_type=MERGE_PATCH)
        await api.delete_collection(PODS, ns, body={"gracePeriodSeconds": 0})
        await api.delete(NAMESPACES, ns)


async def create_rs(api: RestClient, ns: str, name: str, replicas: int, **kw: Any) -> dict:
    return await api.create(REPLICASETS, replicaset_manifest(name, replicas, **kw), namespace=ns)


async def create_pod(api: RestClient, ns: str, name: str, labels: dict[str, str], **meta: Any) -> dict:
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels, **meta},
            "spec": {"containers": [{"name": "c", "image": PAUSE_IMAGE}]}}
    return await api.create(PODS, body, namespace=ns)


async def scale(api: RestClient, ns: str, name: str, replicas: int) -> None:
    await api.patch(REPLICASETS, name, {"spec": {"replicas": replicas}}, ns, content_type=MERGE_PATCH)


async def pods(api: RestClient, ns: str) -> list[dict]:
    return (await api.list(PODS, ns))["items"]


def owner_uid(pod: dict) -> str | None:
    refs = [r for r in pod["metadata"].get("ownerReferences") or () if r.get("controller")]
    return refs[0]["uid"] if refs else None


async def owned(api: RestClient, ns: str, rs: dict, *, active: bool = True) -> list[dict]:
    uid = rs["metadata"]["uid"]
    return [p for p in await pods(api, ns)
            if owner_uid(p) == uid and (not active or p["metadata"].get("deletionTimestamp") is None)]


async def rs_status(api: RestClient, ns: str, name: str) -> dict:
    return (await api.get(REPLICASETS, name, ns)).get("status") or {}


async def wait_status(api: RestClient, ns: str, name: str, timeout: float = 30, **expected: Any) -> dict:
    async def check() -> dict | None:
        status = await rs_status(api, ns, name)
        return status if all(status.get(k, 0) == v for k, v in expected.items()) else None

    return await wait_for(check, timeout, 0.1, f"{ns}/{name} status {expected}")


async def wait_owned(api: RestClient, ns: str, rs: dict, count: int, timeout: float = 30) -> list[dict]:
    async def check() -> list[dict] | None:
        found = await owned(api, ns, rs)
        return found if len(found) == count else None

    return await wait_for(check, timeout, 0.1, f"{count} pods owned by {rs['metadata']['name']}")


async def bind(api: RestClient, ns: str, pod: str, node: str) -> None:
    """Play the scheduler: pods/binding sets spec.nodeName (the node need not exist)."""
    body = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": pod},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
    await api.request("POST", PODS.path(ns, pod, "binding"), body=body)


async def set_pod_status(api: RestClient, ns: str, pod: str, phase: str, ready: bool | None = None,
                         ready_since: float | None = None) -> None:
    """Play the kubelet: phase and the Ready condition (with its lastTransitionTime)."""
    status: dict[str, Any] = {"phase": phase}
    if ready is not None:
        since = format_time(ready_since if ready_since is not None else time.time())
        status["conditions"] = [{"type": "Ready", "status": "True" if ready else "False",
                                 "lastTransitionTime": since}]
    await api.patch(PODS, pod, {"status": status}, ns, content_type=MERGE_PATCH, subresource="status")


async def make_ready(api: RestClient, ns: str, pod: dict, node: str = "node-a", since: float | None = None) -> None:
    name = pod["metadata"]["name"]
    if not pod["spec"].get("nodeName"):
        await bind(api, ns, name, node)
    await set_pod_status(api, ns, name, "Running", ready=True, ready_since=since)


async def events_for(api: RestClient, ns: str, name: str) -> list[dict]:
    items = (await api.list(EVENTS, ns))["items"]
    return [e for e in items if e["involvedObject"].get("name") == name and e["involvedObject"]["kind"] == "ReplicaSet"]


def condition(status: dict, cond_type: str = "ReplicaFailure") -> dict | None:
    return next((c for c in status.get("conditions") or () if c["type"] == cond_type), None)


async def cached(ctrl: ReplicaSetController, ns: str, name: str) -> None:
    """Wait until the controller's pod cache has the pod, so its RS sees it on the first sync."""

    async def seen() -> bool:
        return ctrl.pods.indexer.get_by(ns, name) is not None

    await wait_for(seen, 15, 0.05, f"pod {ns}/{name} in pykcm's cache")


class CreateSpy:
    """Counts pod creates per sync of one ReplicaSet key, and the errors of failed creates."""

    def __init__(self, ctrl: ReplicaSetController, key: str) -> None:
        self.per_sync: list[int] = []
        self.errors: list[str] = []
        self.total = 0
        self._current = 0
        create, sync = ctrl.pod_control.create_pod, ctrl.sync

        async def spy_create(namespace: str, template: dict, owner: dict, ref: dict) -> dict:
            mine = object_key(owner) == key
            if mine:
                self._current += 1
            try:
                created = await create(namespace, template, owner, ref)
            except Exception as err:
                if mine:
                    self.errors.append(str(err))
                raise
            if mine:
                self.total += 1
            return created

        async def spy_sync(k: str) -> None:
            if k != key:
                return await sync(k)
            self._current = 0
            try:
                await sync(k)
            finally:
                self.per_sync.append(self._current)

        ctrl.pod_control.create_pod = spy_create  # type: ignore[method-assign]
        ctrl.sync = spy_sync  # type: ignore[method-assign]

    def creating_syncs(self) -> list[int]:
        return [n for n in self.per_sync if n]


async def stays(check, seconds: float, interval: float = 0.2) -> None:
    """Assert `check()` holds for the whole period (for "nothing happens" claims)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert await check()
        await asyncio.sleep(interval)




@contextlib.asynccontextmanager
async def hand_fed_controller(api: RestClient, clock=None) -> AsyncIterator[ReplicaSetController]:
    """A controller on the real API whose caches are never started: the test fills them."""
    events = EventRecorder(api, RS_CONTROLLER)
    ctx = ControllerContext(client=api, informers=SharedInformerFactory(api), options=Options(), events=events)
    ctrl = ReplicaSetController(ctx)
    if clock is not None:
        ctrl.expectations = ControllerExpectations(clock=clock)
    try:
        yield ctrl
    finally:
        ctrl.queue.shutdown()
        await events.close()
