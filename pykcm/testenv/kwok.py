"""Simulated nodes for the local cluster: kwok (sigs.k8s.io/kwok) playing pykcm's own Stages.

kwok watches Nodes carrying MANAGED_ANNOTATION and the pods bound to them (it does not
schedule: a pod needs `spec.nodeName`), and patches their status as a kubelet would, from
the Stages in kwok-stages.yaml. Every address it hands out is fake and never routed: node
IPs are on loopback (so an apiserver asking a "kubelet" for logs stays on this machine) and
pod IPs come from each node's podCIDR inside POD_CIDR. kwok's own server listens on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import shutil
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from pykcm.client.config import load_config
from pykcm.client.errors import AlreadyExists, NotFound
from pykcm.client.resources import LEASES, NODES
from pykcm.client.rest import RestClient

from .build import KUBERNETES_VERSION
from .errors import ControlPlaneError
from .gobuild import Log, ensure_go_install
from .processes import LOOPBACK, STOP_TIMEOUT, ManagedProcess, free_port, http_get, spawn

KWOK_PACKAGE = "sigs.k8s.io/kwok/cmd/kwok"
KWOK_VERSION = "v0.8.0"
STAGES_FILE = Path(__file__).with_name("kwok-stages.yaml")
STATE_FILE = "kwok.json"
KWOK = "kwok"

MANAGED_ANNOTATION = "kwok.x-k8s.io/node"
MANAGED_VALUE = "fake"
FAKE_NODE_LABEL = MANAGED_ANNOTATION  # the same key as a label, so clients can list fake nodes
POD_CIDR = ipaddress.ip_network("10.240.0.0/12")  # 1M fake pod IPs; also kwok's --cidr fallback
NODE_CIDR_PREFIX = 25  # 126 pod IPs per node, above its 110-pod capacity; 8,192 nodes fit
NODE_IPS = ipaddress.ip_network("127.1.0.0/16")  # loopback: see the module docstring
MAX_NODES = 2 ** (NODE_CIDR_PREFIX - POD_CIDR.prefixlen)  # 8192: the 5,000-node scale tests fit
NODE_LEASE_SECONDS = 40  # the kubelet's default; kwok renews every quarter of it (0: no Leases)
READY_TIMEOUT = 30.0

# kwok ignores unknown keys without a word: a typo in `matchExpressions` makes a stage match
# every object, and a stage whose `selector` is misspelt is dropped.
_STAGE_SPEC_KEYS = {"resourceRef", "selector", "weight", "weightFrom", "delay", "next", "immediateNextStage", "steps"}
_SELECTOR_KEYS = {"matchLabels", "matchAnnotations", "matchExpressions"}
_STEP_KEYS = {"patch", "event", "finalizers", "delete", "apply"}


def ensure_kwok(log: Log = print) -> Path:
    """The kwok binary, built once from its own Go module into the user cache (about 5 min cold)."""
    return ensure_go_install(KWOK_PACKAGE, KWOK_VERSION, log=log)


# ----- node manifests


def node_pod_cidr(index: int) -> str:
    """The podCIDR of the index-th fake node: consecutive /25s of POD_CIDR (10.240.0.0/25, ...)."""
    if not 0 <= index < MAX_NODES:
        raise ValueError(f"node index {index} is outside 0..{MAX_NODES - 1} "
                         f"({POD_CIDR} holds {MAX_NODES} /{NODE_CIDR_PREFIX}s)")
    size = 2 ** (32 - NODE_CIDR_PREFIX)
    return f"{POD_CIDR.network_address + index * size}/{NODE_CIDR_PREFIX}"


def node_ip(index: int) -> str:
    """The index-th fake node's InternalIP, on loopback (127.1.0.1, 127.1.0.2, ...)."""
    node_pod_cidr(index)  # same bounds
    return str(NODE_IPS.network_address + 1 + index)


def node_manifest(
    name: str,
    index: int,
    *,
    labels: Mapping[str, str] | None = None,
    cpu: str = "32",
    memory: str = "256Gi",
    pods: int = 110,
    ephemeral_storage: str = "1Ti",
) -> dict[str, Any]:
    """A Node as a kubelet would register it, for kwok to manage. No taints: note that the
    apiserver's TaintNodesByCondition admission still adds node.kubernetes.io/not-ready, which
    KCM's node-lifecycle controller removes once the node is Ready."""
    capacity = {"cpu": cpu, "memory": memory, "pods": str(pods), "ephemeral-storage": ephemeral_storage}
    capacity |= {"hugepages-1Gi": "0", "hugepages-2Mi": "0"}
    cidr = node_pod_cidr(index)
    system_uuid = str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{name}.kwok.pykcm"))
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"}
            | {FAKE_NODE_LABEL: MANAGED_VALUE, **(labels or {})},
            "annotations": {MANAGED_ANNOTATION: MANAGED_VALUE},
        },
        "spec": {"podCIDR": cidr, "podCIDRs": [cidr]},
        "status": {
            "capacity": capacity,
            "allocatable": dict(capacity),
            "addresses": [{"type": "InternalIP", "address": node_ip(index)}, {"type": "Hostname", "address": name}],
            "nodeInfo": {
                "architecture": "amd64", "operatingSystem": "linux", "kubeletVersion": KUBERNETES_VERSION,
                "containerRuntimeVersion": f"kwok://{KWOK_VERSION}", "kernelVersion": "simulated",
                "osImage": "kwok simulated node", "machineID": system_uuid.replace("-", ""),
                "systemUUID": system_uuid, "bootID": system_uuid,
            },
        },
    }


# ----- the kwok process


def check_stages(path: Path) -> None:
    """Refuse what kwok would accept silently (unknown keys, a stage without a selector).
    Anything kwok itself rejects is left to kwok, whose message is clearer."""
    try:
        docs = [d for d in yaml.safe_load_all(Path(path).read_text()) if d is not None]
    except (OSError, yaml.YAMLError):
        return
    for doc in docs:
        if not isinstance(doc, dict) or doc.get("kind") != "Stage":
            continue
        name, spec = (doc.get("metadata") or {}).get("name", "?"), doc.get("spec") or {}
        parts = [("spec", spec, _STAGE_SPEC_KEYS), ("spec.selector", spec.get("selector") or {}, _SELECTOR_KEYS)]
        parts += [(f"spec.steps[{i}]", step, _STEP_KEYS) for i, step in enumerate(spec.get("steps") or [])]
        unknown = [f"{where}.{key}" for where, part, known in parts for key in part if key not in known]
        if unknown or "selector" not in spec:
            problem = f"has unknown field {unknown[0]} (kwok ignores it)" if unknown else "has no spec.selector"
            raise ControlPlaneError(f"kwok stages {path}: stage {name!r} {problem}")


def kwok_argv(
    binary: Path, kubeconfig: Path, stages: Path, workdir: Path, port: int, log_level: str, lease_seconds: int
) -> list[str]:
    return [
        # KWOK_WORKDIR keeps kwok from also loading ~/.kwok/kwok.yaml; env execs, so the PID is kwok's.
        shutil.which("env") or "/usr/bin/env",
        f"KWOK_WORKDIR={workdir}",
        str(binary),
        f"--kubeconfig={kubeconfig}",
        f"--config={stages}",
        "--manage-all-nodes=false",
        f"--manage-nodes-with-annotation-selector={MANAGED_ANNOTATION}={MANAGED_VALUE}",
        f"--cidr={POD_CIDR}",
        f"--node-ip={LOOPBACK}",  # InternalIP for a managed node created without addresses
        f"--node-lease-duration-seconds={lease_seconds}",
        # Without an address kwok serves nothing; with one it serves /healthz and /metrics.
        f"--server-address={LOOPBACK}:{port}",
        f"--v={log_level}",
    ]


def start_kwok(
    kubeconfig: Path | str,
    directory: Path | str,
    *,
    stages: Path | str = STAGES_FILE,
    log_level: str = "WARN",
    node_lease_seconds: int = NODE_LEASE_SECONDS,
    log: Log = print,
) -> ManagedProcess:
    """Start kwok against `kubeconfig`, with its log in DIR/logs/kwok.log and its PID in
    DIR/kwok.json; return once it serves /healthz. Raises a one-line ControlPlaneError (kwok's
    own reason and the log path) if it exits, e.g. because it rejects a stage.
    Node Leases (5,000 nodes measured: every Lease renewed within 11 s, the apiserver busy 0.72
    of a core, etcd 0.17, kwok 0.20) cost about 0.2 of a core per 1,000 nodes; without them
    (`node_lease_seconds=0`) KCM's node-lifecycle would find nodes stale between heartbeats."""
    directory = Path(directory).resolve()
    stages = Path(stages).resolve()
    check_stages(stages)
    binary = ensure_kwok(log)
    stop_kwok(directory)  # a kwok left behind by an earlier run in this directory
    workdir = directory / KWOK
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    argv = kwok_argv(binary, Path(kubeconfig).resolve(), stages, workdir, port, log_level, node_lease_seconds)
    proc = spawn(KWOK, argv, directory / "logs", port)
    (directory / STATE_FILE).write_text(json.dumps(proc.to_json(), indent=2) + "\n")
    deadline = time.monotonic() + READY_TIMEOUT
    try:
        while http_get(f"http://{LOOPBACK}:{port}/healthz", None)[0] != 200:
            if not proc.alive():
                raise ControlPlaneError(f"kwok exited during startup: {last_error(proc)} (log: {proc.log_path})")
            if time.monotonic() > deadline:
                raise ControlPlaneError(f"kwok was not ready after {READY_TIMEOUT:.0f}s (log: {proc.log_path})")
            time.sleep(0.1)
    except BaseException:
        proc.stop(timeout=5.0)
        raise
    return proc


def last_error(proc: ManagedProcess) -> str:
    """kwok's last ERROR from its JSON log, as one line ("msg: err (stage ...)")."""
    tail = proc.log_tail(50)
    for line in reversed(tail):
        with contextlib.suppress(ValueError):
            entry = json.loads(line)
            if isinstance(entry, dict) and entry.get("level") == "ERROR":
                text = f"{entry.get('msg')}: {entry['err']}" if entry.get("err") else str(entry.get("msg"))
                return text + (f" (stage {entry['stage']})" if entry.get("stage") else "")
    # No JSON error: a crash or a flag error prints plain text.
    plain = [line.strip() for line in tail if not line.lstrip().startswith("{")]
    return plain[-1] if plain else "no error logged"


def stop_kwok(directory: Path | str, timeout: float = STOP_TIMEOUT) -> None:
    """Stop the kwok recorded in DIR/kwok.json (only if its PID's start time still matches)."""
    path = Path(directory) / STATE_FILE
    with contextlib.suppress(FileNotFoundError, ValueError, KeyError):
        ManagedProcess.from_json(KWOK, json.loads(path.read_text())).stop(timeout)


# ----- nodes


def _client(target: RestClient | Path | str) -> tuple[RestClient, bool]:
    if isinstance(target, RestClient):
        return target, False
    return RestClient(load_config(str(target)).with_limits(1000, 1000), "kwok-nodes"), True


def _is_ready(node: dict[str, Any]) -> bool:
    conditions = node.get("status", {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


async def create_nodes(
    target: RestClient | Path | str,
    count: int,
    *,
    prefix: str = "kwok-node",
    concurrency: int = 32,
    timeout: float | None = None,
    kwok: ManagedProcess | None = None,
) -> list[str]:
    """Create `prefix-0` .. `prefix-{count-1}` (existing ones are kept) and wait until all are
    Ready. `target` is a client or a kubeconfig path; pass `kwok` for its reason in a timeout."""
    if count:
        node_pod_cidr(count - 1)  # too many nodes: fail before creating any
    client, owned = _client(target)
    names = [f"{prefix}-{i}" for i in range(count)]
    limit = asyncio.Semaphore(concurrency)

    async def create(index: int, name: str) -> None:
        async with limit:
            with contextlib.suppress(AlreadyExists):
                await client.create(NODES, node_manifest(name, index))

    try:
        await asyncio.gather(*(create(i, n) for i, n in enumerate(names)))
        await _wait_ready(client, set(names), 60.0 + count / 50 if timeout is None else timeout, kwok)
    finally:
        if owned:
            await client.close()
    return names


async def _wait_ready(client: RestClient, names: set[str], timeout: float, kwok: ManagedProcess | None) -> None:
    deadline = time.monotonic() + timeout
    while True:
        # resourceVersion=0: from the apiserver's cache, cheap enough to poll for thousands of nodes.
        found = await client.list(NODES, labelSelector=f"{FAKE_NODE_LABEL}={MANAGED_VALUE}", resourceVersion="0")
        nodes = found["items"]
        ready = {n["metadata"]["name"] for n in nodes if _is_ready(n)} & names
        if ready == names:
            return
        if kwok is not None and not kwok.alive():
            raise ControlPlaneError(f"kwok exited: {last_error(kwok)} (log: {kwok.log_path})")
        if time.monotonic() > deadline:
            why = f"; kwok's last error: {last_error(kwok)} (log: {kwok.log_path})" if kwok else ""
            raise ControlPlaneError(f"{len(ready)} of {len(names)} fake nodes Ready after {timeout:.0f}s{why}")
        await asyncio.sleep(0.5)


async def delete_nodes(target: RestClient | Path | str, names: list[str], *, concurrency: int = 32) -> None:
    """Delete fake nodes and their Leases (no garbage collector may be running to do it)."""
    client, owned = _client(target)
    limit = asyncio.Semaphore(concurrency)

    async def delete(name: str) -> None:
        async with limit:
            for res, namespace in ((NODES, None), (LEASES, "kube-node-lease")):
                with contextlib.suppress(NotFound):
                    await client.delete(res, name, namespace)

    try:
        await asyncio.gather(*(delete(n) for n in names))
    finally:
        if owned:
            await client.close()
