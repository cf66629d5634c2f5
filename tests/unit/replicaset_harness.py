"""An in-memory API and hand-fed caches for driving syncReplicaSet and the event handlers.

The caches are filled directly (no watch), so each test decides exactly what the controller
"has seen"; `deliver_created` plays the watch for pods the fake API created.
"""

from __future__ import annotations

import copy
import itertools
import time
from typing import Any

from pykcm.app.options import Options
from pykcm.client.errors import Invalid, NotFound
from pykcm.client.resources import Resource
from pykcm.controller import ControllerContext
from pykcm.controllers.replicaset import ReplicaSetController
from pykcm.informers.delta_queue import Delta, DeltaType
from pykcm.informers.factory import SharedInformerFactory
from pykcm.util.apitime import format_time

NS = "ns"


class FakeEvents:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, str]] = []

    def record(self, obj: dict, type_: str, reason: str, message: str) -> None:
        self.events.append((type_, reason, message))

    def reasons(self) -> list[str]:
        return [reason for _, reason, _ in self.events]


class FakeApi:
    """The few RestClient calls the controller makes, over an in-memory object map."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str, Any]] = []
        self.objects: dict[tuple[str, str, str], dict] = {}
        self._rv = itertools.count(1000)
        self._names = itertools.count(1)
        self.fail: dict[str, Exception | None] = {}  # verb -> error to raise (once if in fail_once)
        self.fail_once: set[str] = set()

    def _maybe_fail(self, verb: str) -> None:
        err = self.fail.get(verb)
        if err is not None:
            if verb in self.fail_once:
                self.fail[verb] = None
            raise err

    def verbs(self, verb: str, plural: str = "pods") -> list[Any]:
        return [c[3] for c in self.calls if c[0] == verb and c[1] == plural]

    def put(self, plural: str, obj: dict) -> dict:
        obj["metadata"]["resourceVersion"] = str(next(self._rv))
        self.objects[(plural, obj["metadata"]["namespace"], obj["metadata"]["name"])] = obj
        return copy.deepcopy(obj)

    async def create(self, res: Resource, body: dict, namespace: str | None = None) -> dict:
        self.calls.append(("create", res.plural, namespace or "", body))
        self._maybe_fail("create")
        obj = copy.deepcopy(body)
        meta = obj["metadata"]
        meta.setdefault("name", f"{meta.pop('generateName', 'x-')}{next(self._names):05d}")
        meta.update(namespace=namespace, uid=f"uid-{meta['name']}", creationTimestamp=format_time(time.time()))
        return self.put(res.plural, obj)

    async def delete(self, res: Resource, name: str, namespace: str | None = None, **_: Any) -> dict:
        self.calls.append(("delete", res.plural, namespace or "", name))
        self._maybe_fail("delete")
        obj = self.objects.pop((res.plural, namespace or "", name), None)
        if obj is None:
            raise NotFound(404, "NotFound", f'{res.plural} "{name}" not found')
        return obj

    async def patch(self, res: Resource, name: str, body: dict, namespace: str | None = None, **_: Any) -> dict:
        self.calls.append(("patch", res.plural, namespace or "", body))
        self._maybe_fail("patch")
        obj = self.objects.get((res.plural, namespace or "", name))
        if obj is None:
            raise NotFound(404, "NotFound", f'{res.plural} "{name}" not found')
        refs = obj["metadata"].setdefault("ownerReferences", [])
        for ref in body["metadata"]["ownerReferences"]:
            if ref.get("$patch") == "delete":
                refs[:] = [r for r in refs if r["uid"] != ref["uid"]]
            elif ref.get("controller") and any(r.get("controller") for r in refs):
                raise Invalid(422, "Invalid", "Only one reference can have Controller set to true")
            else:
                refs.append(ref)
        return self.put(res.plural, obj)

    async def update(self, res: Resource, body: dict, subresource: str | None = None) -> dict:
        self.calls.append(("update", res.plural, subresource or "", copy.deepcopy(body)))
        self._maybe_fail("update")
        return self.put(res.plural, copy.deepcopy(body))

    async def get(self, res: Resource, name: str, namespace: str | None = None, subresource: str | None = None) -> dict:
        self.calls.append(("get", res.plural, namespace or "", name))
        obj = self.objects.get((res.plural, namespace or "", name))
        if obj is None:
            raise NotFound(404, "NotFound", f'{res.plural} "{name}" not found')
        return copy.deepcopy(obj)


def make_rs(name: str = "web", replicas: int = 2, uid: str | None = None, **spec: Any) -> dict:
    rs = {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": name, "namespace": NS, "uid": uid or f"uid-{name}", "generation": 1,
                     "resourceVersion": "1"},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [{"name": "c", "image": "i"}]}},
            **spec,
        },
        "status": {"replicas": 0},
    }
    return rs


def make_pod(name: str, labels: dict | None = None, owner: dict | None = None, **extra: Any) -> dict:
    meta: dict[str, Any] = {"name": name, "namespace": NS, "uid": f"uid-{name}", "resourceVersion": "5",
                            "labels": labels if labels is not None else {"app": "web"},
                            "creationTimestamp": format_time(time.time() - 100)}
    if owner is not None:
        meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": owner["metadata"]["name"],
                                    "uid": owner["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}]
    meta.update(extra.pop("meta", {}))
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": extra.pop("spec", {"nodeName": "n1"}),
            "status": extra.pop("status", {"phase": "Running"})}


def ready_status(seconds_ago: float = 3600) -> dict:
    since = format_time(time.time() - seconds_ago)
    return {"phase": "Running", "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": since}]}


class Harness:
    def __init__(self, feature_gates: dict[str, bool] | None = None) -> None:
        """`feature_gates` as `--feature-gates` sets them (Options.feature_gates)."""
        self.api = FakeApi()
        self.events = FakeEvents()
        options = Options(feature_gates=dict(feature_gates or {}))
        ctx = ControllerContext(client=self.api, informers=SharedInformerFactory(self.api),  # type: ignore[arg-type]
                                options=options, events=self.events)  # type: ignore[arg-type]
        self.ctrl = ReplicaSetController(ctx)
        self.after: list[tuple[str, float]] = []
        original = self.ctrl.queue.add_after
        self.ctrl.queue.add_after = lambda key, delay: (self.after.append((key, delay)), original(key, delay))[1]

    def add_rs(self, rs: dict) -> dict:
        self.api.put("replicasets", copy.deepcopy(rs))
        self.ctrl.replica_sets.indexer.upsert(rs)
        return rs

    def add_pod(self, pod: dict) -> dict:
        self.api.objects[("pods", NS, pod["metadata"]["name"])] = copy.deepcopy(pod)
        self.ctrl.pods.indexer.upsert(pod)
        return pod

    def deliver_created(self) -> int:
        """Play the watch: every pod the API has but the cache doesn't, as an add event."""
        n = 0
        for (plural, _, _), obj in list(self.api.objects.items()):
            if plural == "pods" and self.ctrl.pods.indexer.get_by(NS, obj["metadata"]["name"]) is None:
                pod = copy.deepcopy(obj)
                self.ctrl.pods._apply(Delta(DeltaType.ADDED, pod, pod["metadata"]["resourceVersion"]))
                n += 1
        return n

    def refresh_rs(self, name: str = "web") -> dict:
        """Play the watch for the ReplicaSet: cache = what the API has now."""
        rs = copy.deepcopy(self.api.objects[("replicasets", NS, name)])
        self.ctrl.replica_sets._apply(Delta(DeltaType.UPDATED, rs, rs["metadata"]["resourceVersion"]))
        return rs

    async def sync(self, name: str = "web") -> None:
        await self.ctrl.sync(f"{NS}/{name}")

    def last_status(self) -> dict:
        return self.api.verbs("update", "replicasets")[-1]["status"]
