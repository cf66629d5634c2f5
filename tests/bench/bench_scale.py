"""Benchmark at scale: KCM and pykcm starting on a cluster that already holds many pods.

Not a test: a script that prints a table. For each side a fresh control plane (etcd and
kube-apiserver): `--pods` realistic pods (two containers, env, probes, resources, labels,
annotations), each bound to one of `--nodes` node names and owned by one of `--pods /
--pods-per-rs` ReplicaSets, spread over `--namespaces` namespaces, are created first; only then
does the controller manager measured start. The node names have no Node objects unless `--kwok`:
then the cluster has that many kwok nodes, which run the pods before the clock starts, and
kube-scheduler and KCM with every other controller run too, as in a cluster with nodes. 5,000
kwok nodes hold here, but kwok runs the pods at about 50 a second with the apiserver saturated
(17 minutes for 50,000 pods on 2 cores, per side), hence not the default.

- KCM side: kube-controller-manager running the ReplicaSet, Namespace and ServiceAccount
  controllers;
- pykcm side: `python -m pykcm.app.cli run` running the same three.

Both with the same client limits (`--qps`, burst = qps), leader election on and each controller
as its own ServiceAccount. Figures, from the controller manager's start:

1. caches synced (KCM: its three "Caches are synced" log lines; pykcm: "All controllers started");
2. every ReplicaSet's status written (replicas at the current generation);
3. RSS right then ("after initial sync");
4. `--scale-up` more pods (spread over the ReplicaSets) -> every status shows them;
5. forced relist: etcd compacted and the apiserver restarted, so every watch resumes with 410
   and relists; after `--relist-settle` seconds, RSS and the pod count (no over-creation);
6. lease transitions (and a note if the process exited: both exit when they cannot renew within
   the renew deadline, set past the time the apiserver's restart takes);
7. peak RSS (VmHWM), CPU seconds, and pykcm's event-loop lag (p99 from the histogram
   `pykcm_event_loop_lag_seconds`, max from `pykcm_event_loop_lag_max_seconds`).

    python tests/bench/bench_scale.py [--pods 50000 --pods-per-rs 100 --namespaces 10
                                       --qps 500 --nodes 5000 --scale-up 2000 --kwok
                                       --pykcm-content-type protobuf|json]
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a plain script from anywhere

from pykcm.client.resources import PODS, REPLICASETS
from pykcm.client.rest import RestClient
from pykcm.testenv.build import KUBERNETES_VERSION
from pykcm.testenv.controlplane import ControlPlane
from tests.bench.bench_replicaset import KCM_CONTENT_TYPES
from tests.bench.common import (
    Figure,
    bounded,
    cpu_seconds,
    lag_figures,
    lease_transitions,
    on_fresh_cluster,
    peak_rss_mib,
    pykcm_env,
    rss_mib,
    running_still,
    side_by_side,
)
from tests.support import PykcmProcess, admin_client, create_namespace, free_port, https_get

CONTROLLERS = "replicaset-controller,namespace-controller,serviceaccount-controller"
# KCM's controllers log their start, then "Waiting for caches to sync" and "Caches are synced" once
# each (as do its serving certificate controllers), without naming the controller.
KCM_STARTED = ('"Starting controller" name="replicaset"', "Starting namespace controller",
               "Starting service account controller")
REQUEST_CONCURRENCY = 100
POLL = 0.5  # the figures are read to this resolution
SAMPLE_EVERY = 0.2
PHASE_TIMEOUT = 900.0
PROGRESS_EVERY = 15.0

# Leader election on both sides, with a renew deadline past the forced relist's apiserver restart
# (it is down while it reloads every pod from etcd); anything longer is the process's own stall.
LEADER_ELECTION = ("--leader-elect=true", "--leader-elect-lease-duration=120s", "--leader-elect-renew-deadline=100s")

Check = Callable[[], Awaitable[tuple[bool, str]]]


@dataclass
class Work:
    pods: int
    pods_per_rs: int
    namespaces: int
    nodes: int
    qps: int
    scale_up: int
    kwok: bool
    relist_settle: float
    pykcm_content_type: str = "protobuf"  # pykcm's --kube-api-content-type (protobuf: its pods watch)

    @property
    def replica_sets(self) -> int:
        return max(1, self.pods // self.pods_per_rs)


@dataclass
class Result:
    populate: float = float("nan")
    synced: float = float("nan")
    status_written: float = float("nan")
    rss_synced: float = float("nan")
    scaled: float = float("nan")
    relist_rss: float = float("nan")
    relist_peak: float = float("nan")
    pods_after_relist: float = float("nan")
    lease_transitions: float = float("nan")
    peak_rss: float = float("nan")
    cpu: float = float("nan")
    lag_p99: float | None = None
    lag_max: float | None = None
    notes: list[str] = field(default_factory=list)


# -- the workload -----------------------------------------------------------------------------------


def container(name: str, port: int) -> dict:
    return {
        "name": name,
        "image": f"registry.k8s.io/{name}:1.2.3",
        "ports": [{"name": "http", "containerPort": port, "protocol": "TCP"}],
        "env": [{"name": f"ENV_{i}", "value": f"value-{i}-{name}"} for i in range(6)]
        + [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "256Mi"}},
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": port}, "periodSeconds": 10},
        "readinessProbe": {"httpGet": {"path": "/ready", "port": port}, "initialDelaySeconds": 5},
        "volumeMounts": [{"name": "config", "mountPath": "/etc/config"}],
    }


def replicaset(name: str, replicas: int) -> dict:
    labels = {"app": name, "tier": "backend", "pod-template-hash": "5d8f9c7b6", "team": "payments"}
    return {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name, "pod-template-hash": labels["pod-template-hash"]}},
            "template": {
                "metadata": {
                    "labels": labels,
                    "annotations": {"prometheus.io/scrape": "true", "prometheus.io/port": "8080",
                                    "example.com/revision": "17", "example.com/owner": "team-payments"},
                },
                "spec": {
                    "containers": [container("app", 8080), container("sidecar", 9090)],
                    "volumes": [{"name": "config", "configMap": {"name": "app-config"}}],
                    "terminationGracePeriodSeconds": 1,
                },
            },
        },
    }


def pod_for(rs: dict, index: int, node: str) -> dict:
    """A pod as the ReplicaSet controller would create it, already bound to `node`."""
    meta = rs["metadata"]
    template = copy.deepcopy(rs["spec"]["template"])
    ref = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": meta["name"], "uid": meta["uid"],
           "controller": True, "blockOwnerDeletion": True}
    template["metadata"].update(name=f"{meta['name']}-{index:05d}", ownerReferences=[ref])
    template["spec"]["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", **template}


async def populate(api: RestClient, work: Work) -> list[str]:
    """The namespaces, ReplicaSets and their pods; returns the namespaces."""
    namespaces = [await create_namespace(api, "scale") for _ in range(work.namespaces)]
    specs = [(namespaces[i % len(namespaces)], replicaset(f"rs-{i:04d}", work.pods_per_rs))
             for i in range(work.replica_sets)]
    created = await bounded((api.create(REPLICASETS, rs, ns) for ns, rs in specs), REQUEST_CONCURRENCY)
    counter = iter(range(10**9))

    def pods() -> Iterator[Awaitable[dict]]:
        for (ns, _), rs in zip(specs, created, strict=True):
            for j in range(work.pods_per_rs):
                yield api.create(PODS, pod_for(rs, j, node_name(next(counter) % work.nodes, work.kwok)), ns)

    started, total = time.monotonic(), work.replica_sets * work.pods_per_rs
    done = 0
    batch = []
    for coro in pods():
        batch.append(coro)
        if len(batch) == 5000:
            await bounded(batch, REQUEST_CONCURRENCY)
            done += len(batch)
            batch = []
            print(f"[bench]   {done}/{total} pods created in {time.monotonic() - started:.0f}s", flush=True)
    await bounded(batch, REQUEST_CONCURRENCY)
    if work.kwok:  # kwok plays each pod (Running, an IP, Ready): let it finish before the clock starts
        await wait_until(all_pods_running(api), "kwok running the pods", time.monotonic())
    return namespaces


def node_name(index: int, kwok: bool) -> str:
    return f"kwok-node-{index}" if kwok else f"node-{index:05d}"  # kwok's: create_nodes' default names


# -- watching the controller manager ----------------------------------------------------------------


class RssSampler:
    """RSS of one process every SAMPLE_EVERY seconds; `peak_since(t)` is the highest since `t`."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.samples: list[tuple[float, float]] = []
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            self.samples.append((time.monotonic(), rss_mib(self.pid)))
            await asyncio.sleep(SAMPLE_EVERY)

    def peak_since(self, since: float) -> float:
        return max((rss for t, rss in self.samples if t >= since), default=float("nan"))

    def stop(self) -> None:
        self._task.cancel()


async def wait_until(check: Check, what: str, started: float) -> float:
    reported = time.monotonic()
    while True:
        done, progress = await check()
        now = time.monotonic()
        if done:
            return now - started
        if now - started > PHASE_TIMEOUT:
            raise TimeoutError(f"{what}: not done after {now - started:.0f}s: {progress}")
        if now - reported > PROGRESS_EVERY:
            print(f"[bench]   {what}: {now - started:.0f}s, {progress}", flush=True)
            reported = now
        await asyncio.sleep(POLL)


def all_status_written(api: RestClient) -> Check:
    async def check() -> tuple[bool, str]:
        items = (await api.list(REPLICASETS))["items"]
        waiting = [rs for rs in items if (rs.get("status") or {}).get("replicas", 0) != rs["spec"]["replicas"]
                   or (rs.get("status") or {}).get("observedGeneration", 0) != rs["metadata"]["generation"]]
        return not waiting, f"{len(items) - len(waiting)}/{len(items)} ReplicaSets' status written"

    return check


def all_pods_running(api: RestClient) -> Check:
    async def check() -> tuple[bool, str]:
        page = await api.list(PODS, fieldSelector="status.phase!=Running", limit=1)
        left = len(page["items"]) + int(page["metadata"].get("remainingItemCount") or 0)
        return not page["items"], f"{left or 'some'} pods not Running yet"

    return check


def log_lines_seen(path: Path, needles: tuple[str, ...]) -> Check:
    async def check() -> tuple[bool, str]:
        text = path.read_text(errors="replace") if path.exists() else ""
        seen = [n for n in needles if n in text]
        return len(seen) == len(needles), f"{len(seen)}/{len(needles)} synced"

    return check


def kcm_synced(path: Path) -> Check:
    """Every controller started and every cache it waits for synced."""
    async def check() -> tuple[bool, str]:
        text = path.read_text(errors="replace") if path.exists() else ""
        started = sum(n in text for n in KCM_STARTED)
        waiting, synced = text.count('"Waiting for caches to sync"'), text.count('"Caches are synced"')
        return started == len(KCM_STARTED) and synced >= waiting, f"{synced}/{waiting} caches synced"

    return check


async def pod_count(api: RestClient) -> int:
    page = await api.list(PODS, limit=1)
    return len(page["items"]) + int(page["metadata"].get("remainingItemCount") or 0)


async def scale_up(api: RestClient, work: Work) -> int:
    """Spread `scale_up` more replicas over the ReplicaSets; returns how many were added."""
    items = (await api.list(REPLICASETS))["items"]
    extra = [work.scale_up // len(items) + (1 if i < work.scale_up % len(items) else 0) for i in range(len(items))]
    await bounded((api.patch(REPLICASETS, rs["metadata"]["name"], {"spec": {"replicas": rs["spec"]["replicas"] + n}},
                             rs["metadata"]["namespace"], content_type="application/merge-patch+json")
                   for rs, n in zip(items, extra, strict=True) if n), REQUEST_CONCURRENCY)
    return sum(extra)


# -- one side ---------------------------------------------------------------------------------------


async def bench_side(plane: ControlPlane, pykcm_side: bool, work: Work) -> Result:
    result = Result()
    api = admin_client(plane.kubeconfig, qps=10_000, burst=10_000)
    started = time.monotonic()
    await populate(api, work)
    result.populate = time.monotonic() - started
    print(f"[bench]   populated in {result.populate:.0f}s", flush=True)
    limits = (f"--kube-api-qps={work.qps}", f"--kube-api-burst={work.qps}", *LEADER_ELECTION)
    port = free_port()
    env = pykcm_env() if pykcm_side else {}  # its compileall is the benchmark's, not pykcm's start-up
    started = time.monotonic()
    if pykcm_side:
        proc = PykcmProcess("--kubeconfig", str(plane.kubeconfig), "--use-service-account-credentials",
                            f"--controllers={CONTROLLERS}", *limits, f"--secure-port={port}",
                            f"--kube-api-content-type={KCM_CONTENT_TYPES[work.pykcm_content_type]}",
                            log_path=plane.logs_dir / "pykcm.log", env=env)
        pid, synced = proc.pid, log_lines_seen(plane.logs_dir / "pykcm.log", ("All controllers started",))
        lease = "pykcm"
    else:
        kcm = await asyncio.to_thread(plane.start_kcm, CONTROLLERS, limits)
        pid, synced = kcm.pid, kcm_synced(kcm.log_path)
        lease = "kube-controller-manager"
    sampler = RssSampler(pid)
    try:
        result.synced = await wait_until(synced, "caches synced", started)
        result.status_written = await wait_until(all_status_written(api), "status written", started)
        result.rss_synced = rss_mib(pid)
        print(f"[bench]   synced {result.synced:.1f}s, status {result.status_written:.1f}s, "
              f"RSS {result.rss_synced:.0f} MiB", flush=True)

        added = await scale_up(api, work)
        began = time.monotonic()
        result.scaled = await wait_until(all_status_written(api), f"+{added} pods", began)
        expected = await pod_count(api)

        began = time.monotonic()
        await asyncio.to_thread(plane.compact_etcd)
        await asyncio.to_thread(plane.restart_apiserver)
        print(f"[bench]   apiserver restarted: down {time.monotonic() - began:.1f}s", flush=True)
        await wait_until(all_status_written(api), "status after relist", began)
        await asyncio.sleep(work.relist_settle)
        result.relist_rss, result.relist_peak = rss_mib(pid), sampler.peak_since(began)
        result.pods_after_relist = await pod_count(api)
        if result.pods_after_relist != expected:
            result.notes.append(f"{'pykcm' if pykcm_side else 'KCM'}: {expected} pods before the relist, "
                                f"{result.pods_after_relist:.0f} after")
        result.peak_rss, result.cpu = peak_rss_mib(pid), cpu_seconds(pid)
        # A controller manager that cannot renew its Lease exits; one that got it back counts a transition.
        result.lease_transitions = await lease_transitions(api, lease)
        if not running_still(pid):
            result.notes.append(f"{'pykcm' if pykcm_side else 'KCM'} exited during the run (its lease lost?)")
        if pykcm_side:
            cert = (plane.pki.admin_cert, plane.pki.admin_key)
            status, text = await https_get(f"https://127.0.0.1:{port}/metrics", cert=cert)
            if status == 200:
                result.lag_p99, result.lag_max = lag_figures(text)
    except TimeoutError as err:
        print(f"[bench]   {err}", flush=True)
        result.notes.append(str(err))
    finally:
        sampler.stop()
        await api.close()
        if pykcm_side:
            proc.signal()
            await proc.wait(60)
    return result


def run_side(root: Path, pykcm_side: bool, work: Work) -> Result:
    """With kwok nodes, both sides' clusters also run KCM with every other controller (node
    lifecycle, garbage collector, ...), the scheduler and kwok, as a cluster with nodes does; the
    controller manager measured runs beside them."""
    name = "pykcm" if pykcm_side else "kcm"
    return on_fresh_cluster(root / name, f"{name} side", lambda plane: bench_side(plane, pykcm_side, work),
                            lambda note: Result(notes=[note]), nodes=work.nodes if work.kwok else 0)


# -- report -----------------------------------------------------------------------------------------


def figures(kcm: Result, ours: Result, work: Work) -> list[Figure]:
    return [
        Figure("start -> caches synced (s)", kcm.synced, ours.synced),
        Figure("start -> every RS status written (s)", kcm.status_written, ours.status_written),
        Figure(f"+{work.scale_up} pods converged (s)", kcm.scaled, ours.scaled),
        Figure("RSS after initial sync (MiB)", kcm.rss_synced, ours.rss_synced, "{:.0f}"),
        Figure("peak RSS during relist (MiB)", kcm.relist_peak, ours.relist_peak, "{:.0f}"),
        Figure("RSS after relist (MiB)", kcm.relist_rss, ours.relist_rss, "{:.0f}"),
        Figure("peak RSS (MiB)", kcm.peak_rss, ours.peak_rss, "{:.0f}"),
        Figure("CPU (s)", kcm.cpu, ours.cpu),
        Figure("pods after relist", kcm.pods_after_relist, ours.pods_after_relist, "{:.0f}"),
        Figure("lease transitions", kcm.lease_transitions, ours.lease_transitions, "{:.0f}"),
        Figure("event-loop lag p99 (s, bucket)", None, ours.lag_p99, "{:.3f}"),
        Figure("event-loop lag max (s)", None, ours.lag_max, "{:.3f}"),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=50_000)
    parser.add_argument("--pods-per-rs", type=int, default=100)
    parser.add_argument("--namespaces", type=int, default=10)
    parser.add_argument("--nodes", type=int, default=5000, help="node names the pods are bound to")
    parser.add_argument("--kwok", action="store_true",
                        help="kwok nodes that run the pods (with the scheduler and KCM's other controllers)")
    parser.add_argument("--qps", type=int, default=500, help="--kube-api-qps and --kube-api-burst of both sides")
    parser.add_argument("--scale-up", type=int, default=2000)
    parser.add_argument("--relist-settle", type=float, default=20.0)
    parser.add_argument("--only", choices=("kcm", "pykcm"), help="run one side only")
    parser.add_argument("--pykcm-content-type", choices=sorted(KCM_CONTENT_TYPES), default="protobuf",
                        help="pykcm's --kube-api-content-type (protobuf: its pods watch, the initial state included)")
    args = parser.parse_args()
    work = Work(args.pods, args.pods_per_rs, args.namespaces, args.nodes, args.qps, args.scale_up, args.kwok,
                args.relist_settle, args.pykcm_content_type)
    root = Path(tempfile.mkdtemp(prefix="pykcm-bench-scale-"))
    kcm = run_side(root, False, work) if args.only != "pykcm" else Result()
    ours = run_side(root, True, work) if args.only != "kcm" else Result()
    nodes = (f"{work.nodes} kwok nodes (KCM's other controllers and the scheduler running)" if work.kwok
             else f"{work.nodes} node names without Node objects (no kwok)")
    print()
    print(f"Scale benchmark: {work.replica_sets * work.pods_per_rs} pods in {work.replica_sets} ReplicaSets over "
          f"{work.namespaces} namespaces, bound to {nodes}, kube-apiserver {KUBERNETES_VERSION}; KCM and pykcm each "
          "run the ReplicaSet, Namespace and ServiceAccount controllers on a fresh control plane; pykcm's pods "
          f"watch on {work.pykcm_content_type}")
    print("\n".join(side_by_side([(f"qps/burst {work.qps}", figures(kcm, ours, work), kcm.notes + ours.notes)],
                                 figure_width=38)))
    print(f"clusters' logs (their etcd data and keys removed): {root}")


if __name__ == "__main__":
    main()
