"""Benchmark: pod churn as the Kubernetes 5,000-node load test drives it, KCM and pykcm side by side.

Not a test: a script that prints a table. For each side a fresh local cluster with `--nodes` kwok
nodes, kube-scheduler and the real kube-controller-manager: on the KCM side KCM runs every
controller (the ReplicaSet, Namespace and ServiceAccount ones included); on the pykcm side KCM
runs the others and `python -m pykcm.app.cli run` those three. Both with leader election on and
the same client limits (`--qps`, burst = qps).

`--replica-sets` ReplicaSets alternate between 0 and `--size` replicas: every second
`--rate` / (2 x `--size`) of them grow and as many shrink, so the controller makes `--rate` pod
changes a second, half creations and half deletions, for `--duration` seconds (each also costs a
status write and an Event: at the default 50 a second the client limit of 100 is nearly spent).
Over that window:

- work-queue latency p99 (`workqueue_queue_duration_seconds`, as the bucket it falls under) of
  the replicaset queue, and the worst p99 of the three queues;
- Lease transitions of the controller manager's own Lease and `/healthz` failures (polled every
  second);
- ReplicaSets seen (every second, during the churn and the drain after it) with more active pods
  than `--size`, the largest spec they ever have (over-creation: must be 0), and ReplicaSets seen
  with more active pods than the largest spec they had in the last `--settle` seconds (a shrink's
  deletes not yet issued by then; a pod marked for deletion, in its grace period, is not active);
- how long the backlog takes to drain once the churn stops, and pykcm's event-loop lag p99
  bucket (its max is the process's since it started: the metric is a lifetime maximum);
- CPU seconds (from the settled start of the churn to the end of the drain) and peak RSS of
  every controller manager: on the KCM side its one KCM; on the pykcm side pykcm, the KCM
  running the other controllers, and their total, the figure to compare with KCM's.

    python tests/bench/bench_churn.py [--duration 600 --rate 50 --qps 100 --nodes 20]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a plain script from anywhere

from pykcm.client.resources import PODS, REPLICASETS
from pykcm.client.rest import MERGE_PATCH, RestClient
from pykcm.testenv.build import KUBERNETES_VERSION
from pykcm.testenv.controlplane import ControlPlane
from pykcm.testenv.nodes import KCM_CONTROLLERS, KUBEADM_CONTROLLERS, PYKCM_CONTROLLERS
from tests.bench.common import (
    Figure,
    bounded,
    bucket_quantile,
    cpu_seconds,
    histogram_buckets,
    lag_figures,
    lease_transitions,
    on_fresh_cluster,
    peak_rss_mib,
    pykcm_env,
    side_by_side,
)
from tests.support import PykcmProcess, admin_client, create_namespace, free_port, https_get, replicaset_manifest

QUEUES = ("replicaset", "namespace", "serviceaccount")
QUEUE_DURATION = "workqueue_queue_duration_seconds_bucket"
REQUEST_CONCURRENCY = 50
SETTLE_TIMEOUT = 300.0


@dataclass
class Work:
    duration: float
    rate: int
    size: int
    replica_sets: int
    qps: int
    nodes: int
    settle: float
    grace: int


@dataclass
class Result:
    queue_p99: float | None = None
    worst_queue_p99: float | None = None
    lease_transitions: float = float("nan")
    healthz_failures: float = float("nan")
    over_created: float = float("nan")
    lagging: float = float("nan")
    drained: float = float("nan")
    cpu: float = float("nan")
    peak_rss: float = float("nan")
    other_cpu: float = float("nan")  # the pykcm side's KCM, running the other controllers
    other_rss: float = float("nan")
    lag_p99: float | None = None
    lag_max: float | None = None
    notes: list[str] = field(default_factory=list)


class Endpoint:
    """The controller manager's secure port, read with the admin's client certificate."""

    def __init__(self, plane: ControlPlane, port: int) -> None:
        self.base = f"https://127.0.0.1:{port}"
        self.cert = (plane.pki.admin_cert, plane.pki.admin_key)

    async def get(self, path: str) -> tuple[int, str]:
        try:
            return await https_get(self.base + path, cert=self.cert)
        except Exception as err:  # refused, reset, timed out: all count as a failed probe
            return 0, repr(err)


# -- the churn --------------------------------------------------------------------------------------


class Churn:
    """Drives the ReplicaSets and watches what the controller makes of them."""

    def __init__(self, api: RestClient, namespace: str, work: Work) -> None:
        self.api, self.namespace, self.work = api, namespace, work
        self.names = [f"churn-{i:03d}" for i in range(work.replica_sets)]
        self.spec = {name: work.size if i % 2 else 0 for i, name in enumerate(self.names)}
        self.history: dict[str, list[tuple[float, int]]] = {n: [(0.0, r)] for n, r in self.spec.items()}
        self.over_created: set[str] = set()
        self.lagging: set[str] = set()

    async def create(self) -> None:
        async def one(name: str) -> None:
            manifest = replicaset_manifest(name, self.spec[name])
            manifest["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = self.work.grace
            await self.api.create(REPLICASETS, manifest, namespace=self.namespace)

        await bounded((one(n) for n in self.names), REQUEST_CONCURRENCY)

    async def settled(self) -> None:
        deadline = time.monotonic() + SETTLE_TIMEOUT
        while time.monotonic() < deadline:
            active = await self.active_pods()
            if all(active.get(n, 0) == r for n, r in self.spec.items()):
                return
            await asyncio.sleep(1.0)
        raise TimeoutError(f"the ReplicaSets did not settle in {SETTLE_TIMEOUT:g}s")

    async def drive(self) -> None:
        per_tick = max(1, self.work.rate // (2 * self.work.size))
        started = time.monotonic()
        tick = 0
        while (now := time.monotonic()) - started < self.work.duration:
            small = [n for n in self.names if self.spec[n] == 0]
            large = [n for n in self.names if self.spec[n] == self.work.size]
            grow = [small[(tick * per_tick + i) % len(small)] for i in range(min(per_tick, len(small)))]
            shrink = [large[(tick * per_tick + i) % len(large)] for i in range(min(per_tick, len(large)))]
            changes = {**{n: self.work.size for n in grow}, **{n: 0 for n in shrink}}
            await bounded((self.scale(n, r, now) for n, r in changes.items()), REQUEST_CONCURRENCY)
            tick += 1
            await asyncio.sleep(max(0.0, started + tick - time.monotonic()))

    async def scale(self, name: str, replicas: int, now: float) -> None:
        await self.api.patch(REPLICASETS, name, {"spec": {"replicas": replicas}}, self.namespace,
                             content_type=MERGE_PATCH)
        self.spec[name] = replicas
        self.history[name].append((now, replicas))

    async def active_pods(self) -> collections.Counter[str]:
        pods = (await self.api.list(PODS, self.namespace))["items"]
        return collections.Counter(
            ref["name"] for p in pods if not p["metadata"].get("deletionTimestamp")
            and p.get("status", {}).get("phase") not in ("Succeeded", "Failed")
            for ref in p["metadata"].get("ownerReferences", []) if ref.get("controller")
        )

    async def watch_over_spec(self) -> None:
        """Every second: ReplicaSets above any spec they ever have, or above the largest spec
        they had within `settle` seconds."""
        while True:
            now = time.monotonic()
            for name, count in (await self.active_pods()).items():
                recent = [r for t, r in self.history.get(name, ()) if t >= now - self.work.settle]
                if count > self.work.size:
                    self.over_created.add(name)
                elif count > max([*recent, self.spec.get(name, 0)]):
                    self.lagging.add(name)
            await asyncio.sleep(1.0)


async def poll_healthz(endpoint: Endpoint, failures: list[str]) -> None:
    while True:
        status, body = await endpoint.get("/healthz")
        if status != 200:
            failures.append(f"{status} {body[:80]}")
        await asyncio.sleep(1.0)


def queue_p99s(before: str, after: str) -> dict[str, float | None]:
    return {
        queue: bucket_quantile(histogram_buckets(after, QUEUE_DURATION, {"name": queue}),
                               0.99, histogram_buckets(before, QUEUE_DURATION, {"name": queue}))
        for queue in QUEUES
    }


# -- one side ---------------------------------------------------------------------------------------


async def bench_side(plane: ControlPlane, pykcm_side: bool, work: Work, kcm_port: int | None) -> Result:
    result = Result()
    api = admin_client(plane.kubeconfig, qps=10_000, burst=10_000)
    limits = (f"--kube-api-qps={work.qps}", f"--kube-api-burst={work.qps}")
    proc = None
    if pykcm_side:
        port = free_port()
        proc = PykcmProcess("--kubeconfig", str(plane.kubeconfig), "--use-service-account-credentials",
                            f"--controllers={','.join(PYKCM_CONTROLLERS)}", *limits, f"--secure-port={port}",
                            "--leader-elect=true", log_path=plane.logs_dir / "pykcm.log", env=pykcm_env())
        pid, lease = proc.pid, "pykcm"
    else:
        assert kcm_port is not None
        port, pid, lease = kcm_port, plane.kcm_processes()[0].pid, "kube-controller-manager"
    other = plane.kcm_processes()[0].pid if pykcm_side else None  # KCM with every controller but pykcm's
    endpoint, failures = Endpoint(plane, port), []
    tasks: list[asyncio.Task[None]] = []
    try:
        namespace = await create_namespace(api, "churn", service_account=False)
        churn = Churn(api, namespace, work)
        await churn.create()
        await churn.settled()
        print(f"[bench]   {work.replica_sets} ReplicaSets settled; churning for {work.duration:g}s", flush=True)
        before, transitions, cpu = (await endpoint.get("/metrics"))[1], await lease_transitions(api, lease), \
            cpu_seconds(pid)
        other_cpu = cpu_seconds(other) if other is not None else 0.0
        tasks = [asyncio.create_task(churn.watch_over_spec()), asyncio.create_task(poll_healthz(endpoint, failures))]
        await churn.drive()
        stopped = time.monotonic()
        await churn.settled()
        result.drained = time.monotonic() - stopped
        status, after = await endpoint.get("/metrics")
        if status != 200:
            result.notes.append(f"metrics: {status} {after[:100]}")
        p99s = queue_p99s(before, after)
        result.queue_p99 = p99s["replicaset"]
        result.worst_queue_p99 = max((v for v in p99s.values() if v is not None), default=None)
        result.lease_transitions = await lease_transitions(api, lease) - transitions
        result.healthz_failures = len(failures)
        result.over_created, result.lagging = len(churn.over_created), len(churn.lagging)
        result.cpu, result.peak_rss = cpu_seconds(pid) - cpu, peak_rss_mib(pid)
        if other is not None:
            result.other_cpu, result.other_rss = cpu_seconds(other) - other_cpu, peak_rss_mib(other)
        if pykcm_side:
            result.lag_p99, result.lag_max = lag_figures(after, since=before)
        if failures:
            result.notes.append(f"{'pykcm' if pykcm_side else 'KCM'} /healthz: {failures[0]}")
    except TimeoutError as err:
        print(f"[bench]   {err}", flush=True)
        result.notes.append(str(err))
    finally:
        for task in tasks:
            task.cancel()
        await api.close()
        if proc is not None:
            proc.signal()
            await proc.wait(60)
    return result


def run_side(root: Path, pykcm_side: bool, work: Work) -> Result:
    name = "pykcm" if pykcm_side else "kcm"
    kcm_args = (f"--kube-api-qps={work.qps}", f"--kube-api-burst={work.qps}", "--leader-elect=true")

    async def bench(plane: ControlPlane) -> Result:
        return await bench_side(plane, pykcm_side, work, plane.kcm_processes()[0].port)

    return on_fresh_cluster(root / name, f"{name} side", bench, lambda note: Result(notes=[note]), nodes=work.nodes,
                            kcm_controllers=KCM_CONTROLLERS if pykcm_side else KUBEADM_CONTROLLERS, kcm_args=kcm_args)


def figures(kcm: Result, ours: Result) -> list[Figure]:
    return [
        Figure("replicaset queue latency p99 (s, bucket)", kcm.queue_p99, ours.queue_p99, "{:.3f}"),
        Figure("worst queue latency p99 (s, bucket)", kcm.worst_queue_p99, ours.worst_queue_p99, "{:.3f}"),
        Figure("lease transitions", kcm.lease_transitions, ours.lease_transitions, "{:.0f}"),
        Figure("/healthz failures", kcm.healthz_failures, ours.healthz_failures, "{:.0f}"),
        Figure("ReplicaSets over-created", kcm.over_created, ours.over_created, "{:.0f}"),
        Figure("ReplicaSets above spec after --settle", kcm.lagging, ours.lagging, "{:.0f}"),
        Figure("backlog drained after the churn (s)", kcm.drained, ours.drained),
        # The KCM side's one KCM runs every controller: only the pykcm side's total compares with it.
        Figure("CPU during churn: pykcm (s)", None, ours.cpu),
        Figure("CPU during churn: KCM (other controllers) (s)", None, ours.other_cpu),
        Figure("CPU during churn: KCM | KCM + pykcm (s)", kcm.cpu, ours.cpu + ours.other_cpu),
        Figure("peak RSS: pykcm (MiB)", None, ours.peak_rss, "{:.0f}"),
        Figure("peak RSS: KCM (other controllers) (MiB)", None, ours.other_rss, "{:.0f}"),
        Figure("peak RSS: KCM | KCM + pykcm, sum of peaks (MiB)", kcm.peak_rss, ours.peak_rss + ours.other_rss,
               "{:.0f}"),
        Figure("event-loop lag p99 (s, bucket)", None, ours.lag_p99, "{:.3f}"),
        Figure("event-loop lag max since start (s)", None, ours.lag_max, "{:.3f}"),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of churn")
    parser.add_argument("--rate", type=int, default=50, help="pods created plus pods deleted per second")
    parser.add_argument("--size", type=int, default=5, help="replicas of a grown ReplicaSet")
    parser.add_argument("--replica-sets", type=int, default=40, help="ReplicaSets scaled between 0 and --size")
    parser.add_argument("--qps", type=int, default=100, help="--kube-api-qps and --kube-api-burst of both sides")
    parser.add_argument("--nodes", type=int, default=20, help="kwok nodes (110 pods each)")
    parser.add_argument("--settle", type=float, default=10.0,
                        help="seconds a shrunk ReplicaSet may keep pods not yet marked for deletion")
    parser.add_argument("--grace", type=int, default=1, help="the pods' terminationGracePeriodSeconds")
    parser.add_argument("--only", choices=("kcm", "pykcm"), help="run one side only")
    args = parser.parse_args()
    work = Work(args.duration, args.rate, args.size, args.replica_sets, args.qps, args.nodes, args.settle, args.grace)
    root = Path(tempfile.mkdtemp(prefix="pykcm-bench-churn-"))
    kcm = run_side(root, False, work) if args.only != "pykcm" else Result()
    ours = run_side(root, True, work) if args.only != "kcm" else Result()
    print()
    print(f"Churn benchmark: {work.rate} pod creations plus deletions a second for {work.duration:g}s by scaling "
          f"{work.replica_sets} ReplicaSets between 0 and {work.size}, on {work.nodes} kwok nodes, kube-apiserver "
          f"{KUBERNETES_VERSION}; KCM with every controller vs KCM + pykcm's three; leader election on")
    print("\n".join(side_by_side([(f"qps/burst {work.qps}", figures(kcm, ours), kcm.notes + ours.notes)],
                                 figure_width=42)))
    print(f"clusters' logs (their etcd data and keys removed): {root}")


if __name__ == "__main__":
    main()
