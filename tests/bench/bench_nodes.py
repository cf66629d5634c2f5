"""Benchmark with Ready pods: KCM alone against KCM + pykcm on a cluster with (kwok) nodes.

Not a test: a script that prints a table. For each client limit (--kube-api-qps/--kube-api-burst)
and each side, a fresh local cluster with nodes (etcd, kube-apiserver, kube-scheduler, kwok nodes
whose pods become Running and Ready):

- KCM side: kube-controller-manager runs every controller (as kubeadm: KUBEADM_CONTROLLERS);
- pykcm side: KCM runs every controller but pykcm's three (KCM_CONTROLLERS: the Deployment
  controller, the garbage collector ... stay in KCM) and pykcm runs those three as a child process
  (`python -m pykcm.app.cli run`). Both with the client limit under test and each controller
  acting as its own ServiceAccount.

Timed phases, from the first create/patch/delete request until the condition is seen (polled):

1. 100 ReplicaSets x 10 replicas created -> every one reports availableReplicas 10 (and replicas
   10) at its current generation;
2. they are deleted (the garbage collector deletes their pods) -> no pod left: the ReplicaSet
   controller's part is small here, so this row is shown but says little about it;
3. 100 Deployments x 10 created -> every one complete; then all rolled to a new image -> every one
   complete again: observedGeneration current, updatedReplicas == replicas == availableReplicas
   == 10 and the Progressing condition's reason NewReplicaSetAvailable.

CPU seconds (utime+stime, /proc) of KCM and pykcm over the three phases and their peak RSS; the
pods' own timestamps in phase 1 (how long creating them took, when the last was bound); and the
occurrences the ReplicaSet controller's Events record: one per pod created or deleted, so
(ReplicaSets + 3 x Deployments) x replicas (4,000 by default) less what a recorder dropped (KCM
drops silently once 1,000 are queued; pykcm logs each drop, which becomes a note).

    python tests/bench/bench_nodes.py [--replica-sets 100 --replicas 10 --deployments 100
                                       --limits 20/30,1000/1000 --nodes 20 --timeout 3600]
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import enum
import re
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a plain script from anywhere

from pykcm.client.resources import DEPLOYMENTS, EVENTS, NODES, PODS, REPLICASETS, Resource
from pykcm.client.rest import RestClient
from pykcm.testenv.build import KUBERNETES_VERSION
from pykcm.testenv.controlplane import ControlPlane
from pykcm.testenv.kwok import FAKE_NODE_LABEL
from pykcm.testenv.nodes import KCM_CONTROLLERS, KUBEADM_CONTROLLERS
from pykcm.util.apitime import parse_time
from tests.bench.common import Figure, bounded, cpu_seconds, on_fresh_cluster, peak_rss_mib, pykcm_env, side_by_side
from tests.support import PykcmProcess, admin_client, create_namespace, replicaset_manifest

NEW_IMAGE = "registry.k8s.io/pause:3.10.1"  # never pulled: kwok plays the kubelet
# Pods take kwok's graceful way out (Terminating, then deleted once the period is over) without
# the default 30 s that would only pad the deletion phase.
GRACE_SECONDS = 1
REQUEST_CONCURRENCY = 50  # the benchmark's own creates, patches and deletes
POLL = 0.5  # each poll lists every ReplicaSet or Deployment of the namespace
PROGRESS_EVERY = 15.0
PHASE_TIMEOUT = 900.0
READY_TIMEOUT = 120.0
EVENTS_SETTLE = 60.0
# What an event recorder logs when its queue is full: pykcm's (at most once a minute, with the
# number dropped since its last line), and client-go's (KCM: one line per event).
PYKCM_DROPPED = re.compile(r'"Dropping events, queue full" dropped=(\d+)')
KCM_DROPPED_LINE = "too many queued events"


class Side(enum.Enum):
    KCM = "KCM"
    PYKCM = "pykcm"


class PhaseTimeout(Exception):
    pass


@dataclass
class Work:
    replica_sets: int
    replicas: int
    deployments: int
    nodes: int


@dataclass
class Result:
    """One side's figures; NaN where a phase did not finish."""

    rs_available: float = float("nan")
    pods_created: float = float("nan")  # first to last pod creationTimestamp (1 s resolution)
    pods_bound: float = float("nan")  # first pod created to last PodScheduled
    rs_deleted: float = float("nan")
    deployments_complete: float = float("nan")
    rollout_complete: float = float("nan")
    rs_events: float = float("nan")  # occurrences the ReplicaSet controller's Events record
    kcm_cpu: float = float("nan")
    kcm_rss: float = float("nan")
    pykcm_cpu: float | None = None
    pykcm_rss: float | None = None
    notes: list[str] = field(default_factory=list)


# -- what "done" means -------------------------------------------------------------------------------


def rs_available(rs: dict, replicas: int) -> bool:
    status = rs.get("status") or {}
    return (status.get("observedGeneration", 0) >= rs["metadata"]["generation"]
            and status.get("replicas", 0) == replicas and status.get("availableReplicas", 0) == replicas)


def deployment_complete(dep: dict, replicas: int) -> bool:
    status = dep.get("status") or {}
    progressing = next((c for c in status.get("conditions") or [] if c.get("type") == "Progressing"), {})
    return (status.get("observedGeneration", 0) >= dep["metadata"]["generation"]
            and status.get("updatedReplicas", 0) == replicas and status.get("replicas", 0) == replicas
            and status.get("availableReplicas", 0) == replicas
            and progressing.get("reason") == "NewReplicaSetAvailable")


def rs_summary(rs: dict) -> str:
    s = rs.get("status") or {}
    return (f"{rs['metadata']['name']}: replicas {s.get('replicas', 0)} ready {s.get('readyReplicas', 0)} "
            f"available {s.get('availableReplicas', 0)} observedGeneration {s.get('observedGeneration')}"
            f"/{rs['metadata']['generation']}")


def deployment_summary(dep: dict) -> str:
    s = dep.get("status") or {}
    conditions = ", ".join(f"{c['type']}={c['status']}/{c.get('reason')}" for c in s.get("conditions") or [])
    return (f"{dep['metadata']['name']}: replicas {s.get('replicas', 0)} updated {s.get('updatedReplicas', 0)} "
            f"available {s.get('availableReplicas', 0)} observedGeneration {s.get('observedGeneration')}"
            f"/{dep['metadata']['generation']} [{conditions}]")


Check = Callable[[], Awaitable[tuple[bool, str]]]


def all_of(api: RestClient, ns: str, res: Resource, count: int, done: Callable[[dict], bool],
           summary: Callable[[dict], str]) -> Check:
    """A check that lists `res` in `ns`: done once `count` objects exist and all are `done`;
    otherwise says how many are and shows the first that is not."""

    async def check() -> tuple[bool, str]:
        items = (await api.list(res, ns))["items"]
        waiting = [o for o in items if not done(o)]
        if len(items) == count and not waiting:
            return True, ""
        first = f"; first waiting: {summary(waiting[0])}" if waiting else ""
        return False, f"{len(items) - len(waiting)}/{count} done{first}"

    return check


def no_pods(api: RestClient, ns: str) -> Check:
    async def check() -> tuple[bool, str]:
        page = await api.list(PODS, ns, limit=1)  # a count without transferring every pod
        left = len(page["items"]) + int(page["metadata"].get("remainingItemCount") or 0)
        return left == 0, f"{left} pods left"

    return check


async def wait_until(check: Check, what: str, started: float, deadline: float) -> float:
    """Seconds from `started` until `check` passes; PhaseTimeout after PHASE_TIMEOUT or at `deadline`."""
    give_up = min(started + PHASE_TIMEOUT, deadline)
    reported = time.monotonic()
    while True:
        done, progress = await check()
        now = time.monotonic()
        if done:
            return now - started
        if now > give_up:
            raise PhaseTimeout(f"{what}: not done after {now - started:.0f}s: {progress}")
        if now - reported > PROGRESS_EVERY:
            print(f"[bench]   {what}: {now - started:.0f}s, {progress}", flush=True)
            reported = now
        await asyncio.sleep(POLL)


async def pod_spans(api: RestClient, ns: str) -> tuple[float, float]:
    """From the pods' own timestamps: how long the ReplicaSet controller took to create them all
    (first to last creation) and until the scheduler had bound the last (first creation to last
    PodScheduled); separates the controller's pace from the scheduler's and kwok's."""
    created: list[float] = []
    bound: list[float] = []
    for pod in (await api.list(PODS, ns))["items"]:
        created.append(parse_time(pod["metadata"]["creationTimestamp"]) or float("nan"))
        conditions = (pod.get("status") or {}).get("conditions") or []
        scheduled = next((c for c in conditions if c.get("type") == "PodScheduled"), {})
        bound.append(parse_time(scheduled.get("lastTransitionTime")) or float("nan"))
    if not created:
        return float("nan"), float("nan")
    return max(created) - min(created), max(bound) - min(created)


async def settled_event_count(api: RestClient, ns: str) -> float:
    """Occurrences (sum of `count`) of the ReplicaSet controller's Events in `ns`, once the number
    has stopped growing (Events trail the actions; bounded by EVENTS_SETTLE). Every pod created or
    deleted is one (SuccessfulCreate/SuccessfulDelete), so it shows how many a recorder dropped."""
    counts: list[float] = []
    give_up = time.monotonic() + EVENTS_SETTLE
    while time.monotonic() < give_up and (len(counts) < 3 or counts[-1] != counts[-3]):
        events = (await api.list(EVENTS, ns, fieldSelector="source=replicaset-controller"))["items"]
        counts.append(sum(e.get("count") or 1 for e in events))
        await asyncio.sleep(2.0)
    return counts[-1]


# -- the workload -----------------------------------------------------------------------------------


def workload_manifest(kind: str, name: str, replicas: int) -> dict:
    manifest = replicaset_manifest(name, replicas)  # a Deployment's spec has the same shape
    manifest["kind"] = kind
    manifest["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = GRACE_SECONDS
    return manifest


def new_image(manifest: dict) -> dict:
    patch = copy.deepcopy({"spec": {"template": {"spec": manifest["spec"]["template"]["spec"]}}})
    patch["spec"]["template"]["spec"]["containers"][0]["image"] = NEW_IMAGE
    return patch


async def run_phases(api: RestClient, ns: str, work: Work, result: Result, deadline: float) -> None:
    n = work.replicas
    sets = [workload_manifest("ReplicaSet", f"rs-{i:03d}", n) for i in range(work.replica_sets)]
    started = time.monotonic()
    await bounded((api.create(REPLICASETS, rs, ns) for rs in sets), REQUEST_CONCURRENCY)
    check = all_of(api, ns, REPLICASETS, len(sets), lambda rs: rs_available(rs, n), rs_summary)
    result.rs_available = await wait_until(check, "ReplicaSets available", started, deadline)
    print(f"[bench]   {len(sets)} ReplicaSets x {n} available after {result.rs_available:.1f}s", flush=True)
    result.pods_created, result.pods_bound = await pod_spans(api, ns)

    started = time.monotonic()
    await api.delete_collection(REPLICASETS, ns, body={"propagationPolicy": "Background"})
    result.rs_deleted = await wait_until(no_pods(api, ns), "ReplicaSets' pods gone", started, deadline)
    print(f"[bench]   ReplicaSets deleted, pods gone after {result.rs_deleted:.1f}s", flush=True)

    deps = [workload_manifest("Deployment", f"dep-{i:03d}", n) for i in range(work.deployments)]
    started = time.monotonic()
    await bounded((api.create(DEPLOYMENTS, d, ns) for d in deps), REQUEST_CONCURRENCY)
    check = all_of(api, ns, DEPLOYMENTS, len(deps), lambda d: deployment_complete(d, n), deployment_summary)
    result.deployments_complete = await wait_until(check, "Deployments complete", started, deadline)
    print(f"[bench]   {len(deps)} Deployments x {n} complete after {result.deployments_complete:.1f}s", flush=True)

    started = time.monotonic()
    await bounded((api.patch(DEPLOYMENTS, d["metadata"]["name"], new_image(d), ns) for d in deps),
                  REQUEST_CONCURRENCY)
    result.rollout_complete = await wait_until(check, "rollout complete", started, deadline)
    print(f"[bench]   rollout to {NEW_IMAGE} complete after {result.rollout_complete:.1f}s", flush=True)


# -- one side on its own cluster --------------------------------------------------------------------


async def wait_nodes_schedulable(api: RestClient, nodes: int) -> None:
    async def check() -> tuple[bool, str]:
        found = (await api.list(NODES, labelSelector=f"{FAKE_NODE_LABEL}=fake"))["items"]
        untainted = [n for n in found if not n["spec"].get("taints")]
        return len(untainted) == nodes, f"{len(untainted)}/{nodes} nodes untainted"

    await wait_until(check, "nodes schedulable", time.monotonic(), time.monotonic() + READY_TIMEOUT)


def start_pykcm(plane: ControlPlane, qps: int, burst: int) -> PykcmProcess:
    return PykcmProcess(
        "--kubeconfig", str(plane.kubeconfig), "--use-service-account-credentials",
        "--kube-api-qps", str(qps), "--kube-api-burst", str(burst),
        log_path=plane.logs_dir / "pykcm.log", env=pykcm_env(),
    )


async def bench_side(plane: ControlPlane, side: Side, qps: int, burst: int, work: Work, deadline: float) -> Result:
    result = Result()
    api = admin_client(plane.kubeconfig, qps=10_000, burst=10_000)
    [kcm] = plane.kcm_processes()
    pykcm = start_pykcm(plane, qps, burst) if side is Side.PYKCM else None
    try:
        await wait_nodes_schedulable(api, work.nodes)
        if pykcm:
            await pykcm.wait_for_log("All controllers started", READY_TIMEOUT)  # each logs "Caches are synced"
        ns = await create_namespace(api, "bench")
        kcm_before = cpu_seconds(kcm.pid)
        pykcm_before = cpu_seconds(pykcm.pid) if pykcm else 0.0
        try:
            await run_phases(api, ns, work, result, deadline)
        except PhaseTimeout as timeout:
            print(f"[bench]   {side.value}: {timeout}", flush=True)
            result.notes.append(f"{side.value}: {timeout}")
        result.kcm_cpu, result.kcm_rss = cpu_seconds(kcm.pid) - kcm_before, peak_rss_mib(kcm.pid)
        if pykcm:
            result.pykcm_cpu, result.pykcm_rss = cpu_seconds(pykcm.pid) - pykcm_before, peak_rss_mib(pykcm.pid)
        result.rs_events = await settled_event_count(api, ns)  # after the CPU figures: not a phase
    finally:
        await api.close()
        if pykcm:
            pykcm.signal()
            await pykcm.wait(60)
    logs = {"KCM": kcm.log_path.read_text(errors="replace"), "pykcm": pykcm.log() if pykcm else ""}
    for who, text in logs.items():
        if dropped := dropped_events(text):
            result.notes.append(f"{side.value} side: {who} logged {dropped} dropped events (recorder queue full)")
    return result


def dropped_events(log_text: str) -> int:
    """Events a controller manager's log says its recorder dropped."""
    return sum(int(n) for n in PYKCM_DROPPED.findall(log_text)) + log_text.count(KCM_DROPPED_LINE)


def run_side(root: Path, side: Side, qps: int, burst: int, work: Work, deadline: float) -> Result:
    """One side at one client limit, on a fresh cluster; a side that gets no time left is a note."""
    if time.monotonic() > deadline:
        return Result(notes=[f"{side.value}: skipped, --timeout reached"])
    controllers = KUBEADM_CONTROLLERS if side is Side.KCM else KCM_CONTROLLERS
    kcm_args = ("--use-service-account-credentials=true", f"--kube-api-qps={qps}", f"--kube-api-burst={burst}")
    return on_fresh_cluster(
        root / f"{side.value.lower()}-{qps}-{burst}", f"qps {qps}/burst {burst}: {side.value} side",
        lambda plane: bench_side(plane, side, qps, burst, work, deadline), lambda note: Result(notes=[note]),
        nodes=work.nodes, kcm_controllers=controllers, kcm_args=kcm_args,
    )


# -- report -----------------------------------------------------------------------------------------


def figures(kcm: Result, ours: Result, work: Work) -> list[Figure]:
    def total(r: Result) -> float:
        return r.kcm_cpu + (r.pykcm_cpu or 0.0)

    return [
        Figure(f"{work.replica_sets} RS x {work.replicas} available (s)", kcm.rs_available, ours.rs_available),
        Figure("  pods: first to last created (s)", kcm.pods_created, ours.pods_created, "{:.0f}"),
        Figure("  pods: first created to last bound (s)", kcm.pods_bound, ours.pods_bound, "{:.0f}"),
        Figure("RS deleted, pods gone (s)", kcm.rs_deleted, ours.rs_deleted),
        Figure(f"{work.deployments} Deploy x {work.replicas} complete (s)", kcm.deployments_complete,
               ours.deployments_complete),
        Figure("rollout new image complete (s)", kcm.rollout_complete, ours.rollout_complete),
        Figure("RS controller Events (occurrences)", kcm.rs_events, ours.rs_events, "{:.0f}"),
        Figure("CPU KCM, phases 1-3 (s)", kcm.kcm_cpu, ours.kcm_cpu),
        Figure("CPU pykcm, phases 1-3 (s)", None, ours.pykcm_cpu),
        Figure("CPU KCM + pykcm (s)", total(kcm), total(ours)),
        Figure("peak RSS KCM (MiB)", kcm.kcm_rss, ours.kcm_rss, "{:.0f}"),
        Figure("peak RSS pykcm (MiB)", None, ours.pykcm_rss, "{:.0f}"),
    ]


def print_table(rows: list[tuple[str, Result, Result]], work: Work) -> None:
    print()
    print(f"Ready pods benchmark: {work.replica_sets} ReplicaSets and {work.deployments} Deployments x "
          f"{work.replicas} replicas, {work.nodes} kwok nodes, kube-apiserver {KUBERNETES_VERSION}")
    print("KCM = kube-controller-manager with every controller; pykcm = KCM without replicaset, namespace and "
          "serviceaccount + pykcm running them")
    print("\n".join(side_by_side([(limits, figures(kcm, ours, work), kcm.notes + ours.notes)
                                  for limits, kcm, ours in rows])))


def parse_limits(text: str) -> list[tuple[int, int]]:
    pairs = [tuple(int(x) for x in item.split("/")) for item in text.split(",")]
    if any(len(p) != 2 for p in pairs):
        raise argparse.ArgumentTypeError(f"--limits wants qps/burst pairs, comma separated, not {text!r}")
    return [(p[0], p[1]) for p in pairs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replica-sets", type=int, default=100)
    parser.add_argument("--replicas", type=int, default=10)
    parser.add_argument("--deployments", type=int, default=100)
    parser.add_argument("--limits", type=parse_limits, default=parse_limits("20/30,1000/1000"),
                        help="qps/burst pairs, comma separated (default 20/30,1000/1000)")
    parser.add_argument("--nodes", type=int, default=20, help="kwok nodes, 110 pods each")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds for the whole run")
    args = parser.parse_args()
    work = Work(args.replica_sets, args.replicas, args.deployments, args.nodes)
    # A rollout surges 25% and Terminating pods hold their node slot for GRACE_SECONDS.
    if (needed := int(max(work.replica_sets, work.deployments) * work.replicas * 1.3)) > work.nodes * 110:
        parser.error(f"{work.nodes} nodes hold {work.nodes * 110} pods; this run needs about {needed}")
    deadline = time.monotonic() + args.timeout
    root = Path(tempfile.mkdtemp(prefix="pykcm-bench-nodes-"))
    rows = []
    for qps, burst in args.limits:
        kcm = run_side(root, Side.KCM, qps, burst, work, deadline)
        ours = run_side(root, Side.PYKCM, qps, burst, work, deadline)
        rows.append((f"qps {qps}/burst {burst}", kcm, ours))
    print_table(rows, work)
    print(f"clusters' logs (their etcd data and keys removed): {root}")


if __name__ == "__main__":
    main()
