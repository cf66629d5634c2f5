"""Benchmark: pykcm's ReplicaSet controller against the real kube-controller-manager.

Not a test: a script that prints a table. On one freshly started local control plane (the
apiserver's ceiling below is measured on it too), for each client limit
(--kube-api-qps/--kube-api-burst), KCM (only its replicaset controller) and pykcm (`python -m
pykcm.app.cli run --controllers replicaset`, a child process), one after the other and the first
of them alternating from one limit to the next (KCM first at the first), each get a fresh
namespace, removed with everything in it (its Events too) before the next side starts, and:

1. scale up: 100 ReplicaSets x 10 replicas are created; time until every status has settled
   (replicas == fullyLabeledReplicas == 10, observedGeneration current) and 1,000 pods exist;
2. scale down: all scaled to 0; time until every status says 0 at the new generation.

Both run their controller as its ServiceAccount (--use-service-account-credentials), as a
cluster's KCM does: an admin client certificate would cost the apiserver a chain verification
per request, about 15 % more of its CPU in this benchmark. For the controller-manager process:
peak RSS (VmHWM) and CPU seconds (utime+stime) over both phases, from /proc, the apiserver's CPU
seconds meanwhile, and the events it wrote (2,000 recorded: one per pod created or deleted).
Finally the apiserver's own ceiling: the sustained pods/s (between the 10th and the 90th
percentile of creations, as a watch sees them arrive) a fast client with 64 creates in flight
reaches as the same ServiceAccount, and that client's CPU share (well under a core: the
apiserver, not the client, sets it). Beside it, each controller manager's sustained pods/s in
its scale up, measured the same way, and its CPU share meanwhile. With KCM's default of 5
concurrent ReplicaSet syncs and its slow-start batches (1, 2, 4, ... creates, each batch
awaited) neither side keeps more than about 20 creates in flight, so the ceiling is out of
reach by design; `--concurrent-syncs` raises both sides' worker count. A controller's client
limit binds too: at --kube-api-qps 1000 its pod creates, events and status writes share 1,000
requests/s.

`--apiserver-cpus N` pins the apiserver and etcd to N CPUs: a control plane short of CPU, where
what each request costs the apiserver decides the times. The controller managers and this
process are not pinned then: the kernel may run them on any CPU, the apiserver's included.
`--controllers-share-cpus` pins each controller manager to the apiserver's CPUs too: a small
control-plane node, where a controller's own CPU is taken from the apiserver and etcd.
`--kcm-content-type json` runs KCM on JSON as pykcm is (its --kube-api-content-type; protobuf by
default) and `--kcm-http1` on HTTP/1.1 as pykcm is (client-go's DISABLE_HTTP2), to tell the
wire's share of the apiserver's CPU from the rest. `--pykcm-content-type json` has pykcm read its
pods watch as JSON too (its --kube-api-content-type; by default protobuf, for the pods watch
only).

The cluster's directory (etcd's data, keys, logs) is removed at the end.
Run: python tests/bench/bench_replicaset.py [--replica-sets 100 --replicas 10 --limits 20/30,1000/1000
     --concurrent-syncs 5 --apiserver-cpus N --controllers-share-cpus --kcm-content-type protobuf|json
     --kcm-http1 --pykcm-content-type protobuf|json --pykcm-checkout DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pykcm.app.clientbuilder import ServiceAccountClientBuilder
from pykcm.client.protobuf import WatchDecoder
from pykcm.client.resources import CONFIGMAPS, EVENTS, NAMESPACES, PODS, REPLICASETS, SERVICEACCOUNTS
from pykcm.client.rest import MERGE_PATCH, RestClient
from pykcm.testenv.cluster import running
from pykcm.testenv.controlplane import APISERVER, ETCD, ControlPlane
from tests.bench.common import (
    Figure,
    add_checkout_argument,
    add_pinning_arguments,
    bounded,
    check_checkout_argument,
    check_pinning_arguments,
    cpu_seconds,
    one_line_failures,
    peak_rss_mib,
    pin_to_cpus,
    pykcm_env,
    scratch_directory,
    side_by_side,
)
from tests.support import (
    PAUSE_IMAGE,
    PykcmProcess,
    admin_client,
    create_namespace,
    is_gone,
    replicaset_manifest,
    wait_for,
)

KCM_ARGS = ("--use-service-account-credentials=true",)
OBSERVER = WatchDecoder({"metadata": {"resourceVersion": True}})  # PodCreations reads no more of a pod
KCM_CONTENT_TYPES = {"protobuf": "application/vnd.kubernetes.protobuf", "json": "application/json"}
CONTROLLER_ACCOUNT = "replicaset-controller"  # kube-system/<this>: both sides' ReplicaSet controller
POLL = 0.25
CREATE_CONCURRENCY = 50
PHASE_TIMEOUT = 900.0
CATCH_UP_TIMEOUT = 30.0  # for the pods watch to see the last creations
CLEANUP_TIMEOUT = 120.0


# -- workload ---------------------------------------------------------------------------------------


class PodCreations:
    """Watches a namespace's pods and times their arrival: the sustained pod-create rate, the
    pods/s between the 10th and the 90th percentile of `expected` creations (the head and tail of
    a scale up are start-up and status writes, not creating). It reads protobuf, as a cluster's
    other pod watchers do (the scheduler, kubelets, KCM's other controllers): the apiserver
    encodes an event once per wire format for all its watchers, so a JSON-reading observer would
    share its encoding with a JSON-reading controller manager and spare it a cost KCM pays."""

    def __init__(self, api: RestClient, ns: str, expected: int) -> None:
        self.api, self.ns, self.expected = api, ns, expected
        self.arrivals: list[float] = []
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> PodCreations:
        listed = await self.api.list(PODS, self.ns, limit=1)
        self._task = asyncio.create_task(self._watch(listed["metadata"]["resourceVersion"]))
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        # A watch event follows its create's response: when the creates are awaited directly (the
        # ceiling), the watch has not seen the last ones yet, and cancelling it then left the 90th
        # percentile unseen (the rate nan). Wait for it, a bounded time.
        deadline = time.monotonic() + (CATCH_UP_TIMEOUT if exc[0] is None else 0)  # none after a failure
        while len(self.arrivals) < self.expected and not self._task.done() and time.monotonic() < deadline:
            await asyncio.sleep(POLL)
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)

    async def _watch(self, resource_version: str) -> None:
        while True:  # the apiserver closes a watcher that falls behind: resume where it ended
            params = {"resourceVersion": resource_version, "allowWatchBookmarks": "true"}
            async for event in self.api.watch(PODS.path(self.ns), params, decoder=OBSERVER):
                if event["type"] == "ERROR":
                    return  # the version expired: too late to resume, the rate shows nan
                resource_version = event["object"]["metadata"]["resourceVersion"]
                if event["type"] == "ADDED":
                    self.arrivals.append(time.monotonic())

    def sustained_rate(self) -> float:
        first, last = int(0.1 * self.expected), int(0.9 * self.expected) - 1
        if last >= len(self.arrivals) or last <= first:
            return float("nan")
        return (last - first) / (self.arrivals[last] - self.arrivals[first])


@dataclass
class Result:
    scale_up: float = float("nan")
    create_rate: float = float("nan")  # sustained pods/s, as PodCreations measures it
    scale_down: float = float("nan")
    cpu_up: float = float("nan")  # CPU seconds of the scale up alone
    cpu: float = float("nan")
    apiserver_cpu: float = float("nan")  # what the controller's requests cost the apiserver, both phases
    rss: float = float("nan")
    events: float = float("nan")
    notes: list[str] = field(default_factory=list)


async def wait_settled(api: RestClient, ns: str, count: int, replicas: int) -> float:
    start = time.monotonic()
    while time.monotonic() - start < PHASE_TIMEOUT:
        items = (await api.list(REPLICASETS, ns))["items"]
        if len(items) == count and all(settled(rs, replicas) for rs in items):
            return time.monotonic()
        await asyncio.sleep(POLL)
    raise TimeoutError(f"{ns}: ReplicaSets did not settle at {replicas} within {PHASE_TIMEOUT:.0f}s")


def settled(rs: dict, replicas: int) -> bool:
    status = rs.get("status") or {}
    return (
        status.get("replicas", 0) == replicas
        and status.get("fullyLabeledReplicas", 0) == replicas
        and status.get("observedGeneration", 0) == rs["metadata"]["generation"]
    )


async def run_workload(api: RestClient, ns: str, count: int, replicas: int, pid: int, apiserver_pid: int,
                       cpus: int = 0) -> Result:
    """Scale up, then down; with `cpus`, the controller manager first pinned to the apiserver's CPUs."""
    if cpus:
        pin_to_cpus((pid,), cpus)
    result = Result()
    cpu_before, apiserver_cpu_before = cpu_seconds(pid), cpu_seconds(apiserver_pid)
    started = time.monotonic()
    names = [f"rs-{i:03d}" for i in range(count)]
    async with PodCreations(api, ns, count * replicas) as creations:
        await bounded([api.create(REPLICASETS, replicaset_manifest(n, replicas), namespace=ns) for n in names],
                      CREATE_CONCURRENCY)
        result.scale_up = await wait_settled(api, ns, count, replicas) - started
        result.cpu_up = cpu_seconds(pid) - cpu_before  # before the watch's catch-up, which is not the scale up
    result.create_rate = creations.sustained_rate()
    pods = (await api.list(PODS, ns))["items"]
    if len(pods) != count * replicas:
        result.notes.append(f"{len(pods)} pods after scale-up, expected {count * replicas}")
    started = time.monotonic()
    await bounded([api.patch(REPLICASETS, n, {"spec": {"replicas": 0}}, ns, content_type=MERGE_PATCH)
                   for n in names], CREATE_CONCURRENCY)
    result.scale_down = await wait_settled(api, ns, count, 0) - started
    result.cpu = cpu_seconds(pid) - cpu_before
    result.apiserver_cpu = cpu_seconds(apiserver_pid) - apiserver_cpu_before
    result.rss = peak_rss_mib(pid)
    result.events = await events_recorded(api, ns)
    return result


async def events_recorded(api: RestClient, ns: str) -> float:
    """Occurrences the controller wrote as Events (a repeat counts once more on its Event): a
    controller that drops events under load does less work than one that writes them all."""
    await asyncio.sleep(2.0)  # let a sender queue drain after the last status settled
    return float(sum(e.get("count") or 1 for e in (await api.list(EVENTS, ns))["items"]))


async def cleanup(api: RestClient, ns: str) -> None:
    """Remove `ns` and all in it, its Events too, and wait until it is gone, so the next side starts
    on the same apiserver and etcd contents. No namespace controller runs on this cluster (and
    neither controller manager by now): the benchmark empties the namespace and finalizes it."""
    await api.delete_collection(REPLICASETS, ns)
    await api.delete_collection(PODS, ns, body={"gracePeriodSeconds": 0})
    for resource in (EVENTS, CONFIGMAPS, SERVICEACCOUNTS):
        await api.delete_collection(resource, ns)
    await api.delete(NAMESPACES, ns)
    namespace = await api.get(NAMESPACES, ns)
    namespace["spec"]["finalizers"] = []
    await api.update(NAMESPACES, namespace, subresource="finalize")
    await wait_for(lambda: is_gone(api, NAMESPACES, ns), CLEANUP_TIMEOUT, POLL, f"namespace {ns} gone")


# -- the two controller managers --------------------------------------------------------------------


async def bench_kcm(plane: ControlPlane, api: RestClient, qps: int, burst: int, count: int, replicas: int,
                    workers: int, content_type: str = "protobuf", cpus: int = 0) -> Result:
    ns = await create_namespace(api, "bench-kcm")
    args = (*KCM_ARGS, f"--kube-api-qps={qps}", f"--kube-api-burst={burst}", f"--concurrent-replicaset-syncs={workers}",
            f"--kube-api-content-type={KCM_CONTENT_TYPES[content_type]}")
    proc = await asyncio.to_thread(plane.start_kcm, "replicaset", args)
    try:
        await asyncio.sleep(1.0)  # healthz is up; give the informers their initial list
        return await run_workload(api, ns, count, replicas, proc.pid, plane.processes[APISERVER].pid, cpus)
    finally:
        await asyncio.to_thread(plane.stop_kcm)
        await cleanup(api, ns)


async def bench_pykcm(plane: ControlPlane, api: RestClient, qps: int, burst: int, count: int, replicas: int,
                      workers: int, log_dir: Path, checkout: Path, cpus: int = 0,
                      content_type: str = "protobuf") -> Result:
    ns = await create_namespace(api, "bench-pykcm")
    # A checkout from before the flag (--pykcm-checkout) speaks JSON and knows no such flag.
    wire = ("--kube-api-content-type", KCM_CONTENT_TYPES[content_type]) if knows_content_type(checkout) else ()
    proc = PykcmProcess(
        "--kubeconfig", str(plane.kubeconfig), "--controllers", "replicaset", "--use-service-account-credentials",
        "--kube-api-qps", str(qps), "--kube-api-burst", str(burst), "--concurrent-replicaset-syncs", str(workers),
        *wire, log_path=log_dir / f"pykcm-{qps}-{uuid.uuid4().hex[:4]}.log", env=pykcm_env(checkout),
    )
    try:
        await proc.wait_for_log("Caches are synced")
        return await run_workload(api, ns, count, replicas, proc.pid, plane.processes[APISERVER].pid, cpus)
    finally:
        proc.signal()
        await proc.wait(60)
        await cleanup(api, ns)


def knows_content_type(checkout: Path) -> bool:
    """Whether pykcm in `checkout` has --kube-api-content-type (earlier commits read JSON only)."""
    return "kube_api_content_type" in (checkout / "pykcm" / "app" / "options.py").read_text()


@dataclass
class Ceiling:
    pods_per_second: float
    client_busy: float  # the measuring client's CPU share of one core: well under 1, the apiserver is the limit


async def apiserver_ceiling(api: RestClient, pods: int = 2000, concurrency: int = 64) -> Ceiling:
    """Sustained pods/s one fast client reaches creating `pods` pods with `concurrency` requests in flight,
    as the ServiceAccount both controller managers' ReplicaSet controllers are: the apiserver
    authenticates a token from its cache, where a client certificate's chain is verified anew
    on every request, and authorizes it by RBAC, so the ceiling costs what a controller's create does."""
    ns = await create_namespace(api, "bench-ceiling")
    accounts = ServiceAccountClientBuilder(api)
    client = await accounts.client_for(CONTROLLER_ACCOUNT, 10_000, 10_000)
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"generateName": "p-"},
            "spec": {"containers": [{"name": "c", "image": PAUSE_IMAGE}]}}
    try:
        async with PodCreations(api, ns, pods) as creations:
            started, cpu_before = time.monotonic(), time.process_time()
            await bounded([client.create(PODS, body, namespace=ns) for _ in range(pods)], concurrency)
            # Not after the watch's catch-up below, which is not the creating (still in: the watch's own CPU).
            elapsed, busy = time.monotonic() - started, time.process_time() - cpu_before
    finally:
        await client.close()
        await accounts.close()
    ceiling = Ceiling(creations.sustained_rate(), busy / elapsed)
    await cleanup(api, ns)
    return ceiling


# -- report -----------------------------------------------------------------------------------------


def print_table(rows: list[tuple[str, Result, Result]], ceiling: Ceiling, args: argparse.Namespace) -> None:
    count, replicas = args.replica_sets, args.replicas
    print()
    print(f"ReplicaSet controller benchmark: {count} ReplicaSets x {replicas} replicas "
          f"({count * replicas} pods), {args.concurrent_syncs} concurrent syncs, local kube-apiserver v1.36.3")
    pinned = f"pinned to {args.apiserver_cpus} CPU(s)" if args.apiserver_cpus else "not pinned"
    if args.controllers_share_cpus:
        pinned += ", each controller manager with them"
    elif args.apiserver_cpus:
        pinned += ", the controller managers not pinned"
    kcm_http = "HTTP/1.1" if args.kcm_http1 else "HTTP/2"
    ours = "json" if args.pykcm_content_type == "json" else "protobuf for its pods watch, json for the rest,"
    print(f"apiserver and etcd {pinned}; KCM on {args.kcm_content_type} over {kcm_http}, pykcm on {ours} over HTTP/1.1")
    groups = [
        (limits, [
            Figure("scale up (s)", kcm.scale_up, ours.scale_up),
            Figure("scale down (s)", kcm.scale_down, ours.scale_down),
            Figure("pods created/s (sustained)", kcm.create_rate, ours.create_rate, "{:.0f}"),
            Figure("  % of the apiserver's ceiling", 100 * kcm.create_rate / ceiling.pods_per_second,
                   100 * ours.create_rate / ceiling.pods_per_second, "{:.0f}"),
            Figure("CPU busy in scale up (% of a core)", 100 * kcm.cpu_up / kcm.scale_up,
                   100 * ours.cpu_up / ours.scale_up, "{:.0f}"),
            Figure("CPU, both phases (s)", kcm.cpu, ours.cpu),
            Figure("apiserver CPU, both phases (s)", kcm.apiserver_cpu, ours.apiserver_cpu),
            Figure("peak RSS (MiB)", kcm.rss, ours.rss, "{:.0f}"),
            Figure("events written", kcm.events, ours.events, "{:.0f}"),
        ], kcm.notes + ours.notes)
        for limits, kcm, ours in rows
    ]
    print("\n".join(side_by_side(groups)))
    print(f"apiserver ceiling: {ceiling.pods_per_second:.0f} pods/s sustained (one client, 64 creates in flight, "
          f"the client busy {100 * ceiling.client_busy:.0f}% of a core)")


async def main_async(args: argparse.Namespace) -> None:
    settings = [tuple(int(x) for x in s.split("/")) for s in args.limits.split(",")]
    with scratch_directory("pykcm-bench-replicaset-") as root, \
            running(root / "cluster", log=lambda m: print(f"[testenv] {m}")) as plane:
        if args.apiserver_cpus:
            pin_to_cpus((plane.processes[APISERVER].pid, plane.processes[ETCD].pid), args.apiserver_cpus)
        if args.kcm_http1:  # read by client-go in the KCM this process starts; the apiserver is up already
            os.environ["DISABLE_HTTP2"] = "1"
        api = admin_client(plane.kubeconfig, qps=10_000, burst=10_000)
        try:
            rows = []
            workload = (args.replica_sets, args.replicas, args.concurrent_syncs)
            shared = args.apiserver_cpus if args.controllers_share_cpus else 0
            for index, (qps, burst) in enumerate(settings):
                results: dict[str, Result] = {}
                # Alternating which side goes first spreads what running second means (etcd's
                # revisions until the next compaction, warm caches) over both.
                for side in ("kcm", "pykcm") if index % 2 == 0 else ("pykcm", "kcm"):
                    print(f"[bench] qps {qps}/burst {burst}: {side} ...", flush=True)
                    results[side] = await (
                        bench_kcm(plane, api, qps, burst, *workload, args.kcm_content_type, shared) if side == "kcm"
                        else bench_pykcm(plane, api, qps, burst, *workload, plane.logs_dir, args.pykcm_checkout,
                                         shared, args.pykcm_content_type))
                rows.append((f"qps {qps}/burst {burst}", results["kcm"], results["pykcm"]))
            print("[bench] apiserver ceiling ...", flush=True)
            ceiling = await apiserver_ceiling(api)
        finally:
            await api.close()
    print_table(rows, ceiling, args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replica-sets", type=int, default=100, help="ReplicaSets created by each side")
    parser.add_argument("--replicas", type=int, default=10, help="replicas of each ReplicaSet")
    parser.add_argument("--limits", default="20/30,1000/1000", help="qps/burst pairs, comma separated")
    parser.add_argument("--concurrent-syncs", type=int, default=5,
                        help="--concurrent-replicaset-syncs of both sides (5: KCM's default)")
    add_pinning_arguments(parser)
    parser.add_argument("--kcm-content-type", choices=sorted(KCM_CONTENT_TYPES), default="protobuf",
                        help="KCM's --kube-api-content-type")
    parser.add_argument("--kcm-http1", action="store_true",
                        help="KCM on HTTP/1.1, as pykcm (client-go's DISABLE_HTTP2)")
    parser.add_argument("--pykcm-content-type", choices=sorted(KCM_CONTENT_TYPES), default="protobuf",
                        help="pykcm's --kube-api-content-type (protobuf: its pods watch)")
    add_checkout_argument(parser)
    args = parser.parse_args()
    check_pinning_arguments(parser, args)
    check_checkout_argument(parser, args)
    if args.pykcm_content_type != "json" and not knows_content_type(args.pykcm_checkout):
        parser.error(f"pykcm in {args.pykcm_checkout} reads JSON only: add --pykcm-content-type json")
    asyncio.run(main_async(args))


if __name__ == "__main__":
    one_line_failures(main)
