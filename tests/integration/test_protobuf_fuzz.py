"""The protobuf pods watch against the JSON one on pods at the edges of every field client/protobuf.py
reads, from a seeded random.Random: strings of 0 to 16385 bytes (varint lengths of 1, 2 and 3 bytes),
multi-byte UTF-8, many labels and annotations, owner references with and without their flags, far times,
int32 and int64 extremes, pods held by a finalizer in deletion; then the smallest pods that once differed,
some written as protobuf as a Go client may (invalid UTF-8, times JSON cannot write)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import random
import urllib.request
from typing import Any

import pytest

from pykcm.client.errors import Invalid, NotFound
from pykcm.client.protobuf import MAGIC, PROTOBUF, UndecodableEvent, WatchDecoder, supports
from pykcm.client.resources import NAMESPACES, PODS
from pykcm.client.rest import MERGE_PATCH, RestClient
from pykcm.controllers.replicaset.controller import CONTROLLER_POD_FIELDS
from pykcm.informers.projection import project
from tests.integration.test_protobuf import WIDE, collect
from tests.protowire import field, number
from tests.support import admin_client, create_namespace

pytestmark = pytest.mark.integration

SEED = 20261126
PODS_COUNT = 36
SIZES = (0, 1, 63, 64, 65, 127, 128, 129, 16383, 16384, 16385)  # bytes: varint lengths of 1, 2 and 3 bytes
WHOLE = {  # the sub-messages SCHEMA marks COMPLETE kept whole, and the maps
    "kind": True, "apiVersion": True, "metadata": {"ownerReferences": True, "labels": True, "annotations": True,
                                                   "finalizers": True, "deletionGracePeriodSeconds": True,
                                                   "generation": True, "generateName": True},
    "status": {"conditions": True, "phase": True},
}
PICKY = {  # single keys of maps, single fields of repeated messages, fields that may be absent
    "metadata": {"labels": {"k0": True, "app": True}, "annotations": {"a0.example.com/k": True, "empty": True},
                 "ownerReferences": {"controller": True, "blockOwnerDeletion": True}, "deletionTimestamp": True},
    "spec": {"containers": {"name": True}, "initContainers": {"restartPolicy": True}},
    "status": {"conditions": {"lastProbeTime": True, "observedGeneration": True, "reason": True, "message": True},
               "containerStatuses": {"name": True}, "initContainerStatuses": {"restartCount": True}},
}
PROJECTIONS = {"CONTROLLER_POD_FIELDS": CONTROLLER_POD_FIELDS, "WIDE": WIDE, "WHOLE": WHOLE, "PICKY": PICKY}
TIMES = (
    "1970-01-01T00:00:00Z", "1970-01-01T00:00:01Z", "1969-12-31T23:59:59Z", "1960-02-29T12:34:56Z",
    "0001-01-01T00:00:00Z", "0001-01-01T00:00:01Z", "9999-12-31T23:59:59Z", "2038-01-19T03:14:08Z",
    "2026-06-01T10:00:00+05:30", "2001-09-09T01:46:40.999Z", "0000-01-01T00:00:00Z",
)
# Years 10000 and -1 in UTC: accepted once, but the apiserver cannot parse its own JSON of them, so
# no patch applies to such a pod after (not even dropping its finalizers): only on pods without any.
FAR_TIMES = ("9999-12-31T23:59:59-23:59", "0000-01-01T00:00:00+01:00")
WIDE_CHARS = "é中😀ß\u00a0\u2028Ω\x00"  # 2, 3 and 4 bytes of UTF-8, and characters JSON escapes
ASCII = "abcdefghijklmnopqrstuvwxyz0123456789 -_./:<>&\"'\\"


def text(rng: random.Random, size: int) -> str:
    """A string of exactly `size` bytes of UTF-8, multi-byte characters among ASCII ones."""
    out, used = [], 0
    while used < size:
        char = rng.choice(WIDE_CHARS if rng.random() < 0.3 else ASCII)
        char = char if used + len(char.encode()) <= size else "x"
        out.append(char)
        used += len(char.encode())
    return "".join(out)


def dns(rng: random.Random, size: int) -> str:
    """A DNS label of `size` characters, or with size > 63 a DNS subdomain of labels of 63."""
    if size > 63:
        return dns(rng, 63) + "." + dns(rng, size - 64) if size > 65 else dns(rng, 63)
    return ("a" + "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789-") for _ in range(size - 2)) + "z")[:size]


def make_pod(rng: random.Random, i: int) -> dict[str, Any]:
    name = {"generateName": dns(rng, rng.choice((1, 50, 58, 200))) + "-"} if i % 5 == 4 else {
        "name": f"p{i}-" + dns(rng, rng.choice((1, 10, 200)))}
    labels = {f"k{j}": rng.choice(("", "a", "A.b_c-D9", dns(rng, 63))) for j in range(rng.choice((0, 1, 3, 60)))}
    annotations = {"empty": ""} if rng.random() < 0.5 else {}
    annotations |= {f"a{j}.example.com/k": text(rng, rng.choice(SIZES[:8])) for j in range(rng.choice((0, 1, 4, 100)))}
    if i % 3 == 0:  # the longest key: a prefix of 253 characters, a name of 63
        annotations |= {dns(rng, 253) + "/" + dns(rng, 63): text(rng, rng.choice(SIZES)),
                        "big": text(rng, rng.choice(SIZES[-3:]))}
    owners: list[dict[str, Any]] = []
    for j in range(rng.choice((0, 1, 3))):
        owners.append({"apiVersion": rng.choice(("v1", "apps/v1", "example.com/v1beta1")), "kind": rng.choice("KR"),
                       "name": dns(rng, rng.choice((1, 63, 200))), "uid": f"00000000-0000-0000-0000-{i:06d}{j:06d}"})
        for flag in ("controller", "blockOwnerDeletion"):
            value = rng.choice((None, False, True))
            if value is not None and not (flag == "controller" and value and any(o.get(flag) for o in owners)):
                owners[-1][flag] = value
    containers = [{"name": f"c{j}-" + dns(rng, rng.choice((1, 59))), "image": "i"} for j in range(rng.choice((1, 3)))]
    sidecar = {"restartPolicy": "Always"}
    inits = [{"name": f"i{j}", "image": "i", **rng.choice((sidecar, {}))} for j in range(rng.choice((0, 0, 2)))]
    spec: dict[str, Any] = {"containers": containers, "initContainers": inits}
    if rng.random() < 0.5:
        spec["nodeName"] = dns(rng, rng.choice((1, 253)))
    finalizers = [f"example.com/f{j}" for j in range(rng.choice((0, 1, 2)))]
    meta = {**name, "labels": {**labels, "app": "fuzz"}, "annotations": annotations, "ownerReferences": owners,
            "finalizers": finalizers}
    return {"metadata": meta, "spec": spec}


def make_status(rng: random.Random, pod: dict[str, Any]) -> dict[str, Any]:
    def statuses(containers: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{"name": c["name"], "restartCount": rng.choice((0, 1, 2147483647)), "ready": False, "image": "i",
                 "imageID": "", "state": {"waiting": {}}} for c in containers]

    times = TIMES if pod["metadata"].get("finalizers") else TIMES + FAR_TIMES
    conditions, kinds = [], ("Ready", "PodScheduled", "ContainersReady", "Initialized", "example.com/c")
    for kind in rng.sample(kinds, rng.randint(0, 5)):
        conditions.append({"type": kind, "status": rng.choice(("True", "False", "Unknown")),
                           "lastTransitionTime": rng.choice(times), "reason": rng.choice(("", "R", dns(rng, 200))),
                           "message": text(rng, rng.choice(SIZES)), "observedGeneration": rng.choice((0, 1, 2**40)),
                           **({"lastProbeTime": rng.choice(times)} if rng.random() < 0.5 else {})})
    return {"phase": rng.choice(("", "Pending", "Running", "Succeeded", "Failed")), "conditions": conditions,
            "containerStatuses": statuses(pod["spec"]["containers"]),
            "initContainerStatuses": statuses(pod["spec"].get("initContainers", []))}


def first_difference(a: Any, b: Any, path: str = "") -> tuple[str, Any, Any] | None:
    """The first path where `a` and `b` differ, with both values there ("<absent>" for a missing key)."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b), key=str):
            if key not in a or key not in b:
                return f"{path}.{key}", a.get(key, "<absent>"), b.get(key, "<absent>")
            if found := first_difference(a[key], b[key], f"{path}.{key}"):
                return found
        return None
    if isinstance(a, list) and isinstance(b, list):
        for n, (x, y) in enumerate(zip(a, b, strict=False)):
            if found := first_difference(x, y, f"{path}[{n}]"):
                return found
        return None if len(a) == len(b) else (f"{path} (length)", len(a), len(b))
    return None if a == b and type(a) is type(b) else (path, a, b)


def shown(value: Any) -> str:
    return repr(value) if len(repr(value)) <= 300 else f"{repr(value)[:300]}... ({len(repr(value))} characters)"


async def differences(client: RestClient, ns: str, rv: str, projections: dict[str, Any], at: tuple = ()) -> list[str]:
    """The JSON watch since `rv` against the protobuf one with each projection: pod, field and both values
    where they differ; an event protobuf cannot decode is shown with the pod's JSON value `at` that path."""
    async def protobuf(projection: Any) -> list[dict] | UndecodableEvent:
        try:
            return await collect(client, ns, rv, WatchDecoder(projection))
        except UndecodableEvent as err:
            return err

    as_json, *as_protobuf = await asyncio.gather(collect(client, ns, rv, None), *map(protobuf, projections.values()))
    failures = []
    for name, events in zip(projections, as_protobuf, strict=True):
        if isinstance(events, UndecodableEvent):
            last = [e["object"] for e in as_json if e["object"]["metadata"]["name"] == events.key.split("/")[-1]][-1]
            value = functools.reduce(lambda v, k: v[k], at, last)
            failures.append(f"{name}: {events}; JSON has at .{'.'.join(map(str, at))}: {shown(value)}")
            continue
        assert [e["type"] for e in events] == [e["type"] for e in as_json], name
        for j, p in zip(as_json, events, strict=True):
            if found := first_difference(project(j["object"], projections[name]), p["object"]):
                path, want, got = found
                failures.append(f"{name}: pod {j['object']['metadata']['name']} ({j['type']}) at {path}: "
                                f"JSON {shown(want)} != protobuf {shown(got)}")
    return failures


async def cleanup(client: RestClient, ns: str) -> None:
    with contextlib.suppress(NotFound):
        for pod in (await client.list(PODS, ns))["items"]:
            with contextlib.suppress(NotFound, Invalid):  # Invalid: a time the apiserver cannot read back
                await client.patch(PODS, pod["metadata"]["name"], {"metadata": {"finalizers": None}}, ns,
                                   content_type=MERGE_PATCH)
        await client.delete_collection(PODS, ns, body={"gracePeriodSeconds": 0})
        await client.delete(NAMESPACES, ns)


COVERED = (  # edges the seed must reach, as the JSON watch writes them
    '"deletionGracePeriodSeconds":1000000000', '"deletionGracePeriodSeconds":0,', '"restartCount":2147483647',
    '"observedGeneration":1099511627776', '"blockOwnerDeletion":false', '"controller":true', '"generateName"',
    '"lastProbeTime":null', '"9999-12-31T23:59:59Z"', '"1960-02-29T12:34:56Z"', '"10000-01-01T23:58:59Z"',
    '"-0001-12-31T23:00:00Z"', '"restartPolicy":"Always"', '"empty":""', '\\u0000', '😀',
)


async def test_protobuf_watch_matches_the_json_watch_on_fuzzed_pods(control_plane):
    assert all(supports(p) for p in PROJECTIONS.values())
    client = admin_client(control_plane.kubeconfig)
    ns = await create_namespace(client, "pbfuzz")
    rng = random.Random(SEED)
    try:
        rv = (await client.list(PODS, ns))["metadata"]["resourceVersion"]
        for i in range(PODS_COUNT):
            name = (await client.create(PODS, pod := make_pod(rng, i), ns))["metadata"]["name"]
            if i % 4 != 3:
                await client.patch(PODS, name, {"status": make_status(rng, pod)}, ns, MERGE_PATCH, "status")
            if i % 3 == 1:  # with a finalizer, or bound to a node with a grace period: left with deletionTimestamp
                await client.delete(PODS, name, ns, body={"gracePeriodSeconds": rng.choice((0, 30, 10**9))})
        events = await collect(client, ns, rv, None)
        seen = json.dumps(events, ensure_ascii=False, separators=(",", ":"))
        assert [edge for edge in COVERED if edge not in seen] == []
        sizes = {len(v.encode()) for e in events for v in e["object"]["metadata"].get("annotations", {}).values()}
        assert {0, 127, 128, 16383, 16384} <= sizes
        failures = await differences(client, ns, rv, PROJECTIONS)
        assert not failures, "\n".join(failures[:20])
    finally:
        await cleanup(client, ns)
        await client.close()


async def send_protobuf(client: RestClient, method: str, path: str, pod: bytes) -> None:
    """A hand-encoded pod sent as protobuf, as a Go client may: JSON cannot carry what it holds."""
    body = MAGIC + field(1, field(1, b"v1") + field(2, b"Pod")) + field(2, pod)
    headers = {"Content-Type": PROTOBUF, "Accept": "application/json"}
    if token := client.config.token_source():
        headers["Authorization"] = token
    request = urllib.request.Request(client.config.host + path, body, headers, method=method)
    with await asyncio.to_thread(urllib.request.urlopen, request, context=client.config.ssl_context) as resp:
        assert resp.status < 300


SPEC = field(2, field(2, field(1, b"c") + field(2, b"i")))  # PodSpec{containers: [{name: c, image: i}]}
PLAIN = {"metadata": {"name": "u"}, "spec": {"containers": [{"name": "c", "image": "i"}]}}
CASES = {  # the smallest pods that once differed: an annotation (protobuf), or a condition (JSON or protobuf)
    "year-minus-1": (None, {"type": "Ready", "status": "True", "lastTransitionTime": "0000-01-01T00:00:00+01:00"}),
    "invalid-utf8": (b"\xff\xfeA\xe2\x82B\xed\xa0\x80\xc3", None),  # Go's JSON: one U+FFFD for each bad byte
    "year-beyond-2**31": (None, field(1, b"Ready") + field(2, b"True") + field(4, number(1, 1 << 60))),
}


@pytest.mark.parametrize("case", CASES)
async def test_the_smallest_pods_that_once_differed(control_plane, case):
    annotation, condition = CASES[case]
    client = admin_client(control_plane.kubeconfig)
    ns = await create_namespace(client, "pbmin")
    try:
        rv = (await client.list(PODS, ns))["metadata"]["resourceVersion"]
        if annotation is not None:
            meta = field(1, b"u") + field(12, field(1, b"note") + field(2, annotation))
            await send_protobuf(client, "POST", PODS.path(ns), field(1, meta) + SPEC)
        else:
            await client.create(PODS, PLAIN, ns)
            if isinstance(condition, dict):
                await client.patch(PODS, "u", {"status": {"conditions": [condition]}}, ns, MERGE_PATCH, "status")
            else:
                pod = field(1, field(1, b"u") + field(3, ns.encode())) + SPEC + field(3, field(2, condition))
                await send_protobuf(client, "PUT", PODS.path(ns, "u", "status"), pod)
        at = ("metadata", "annotations", "note") if annotation else ("status", "conditions", 0, "lastTransitionTime")
        failures = await differences(client, ns, rv, {"WIDE": WIDE}, at)
        assert not failures, "\n".join(failures)
    finally:
        await cleanup(client, ns)
        await client.close()
