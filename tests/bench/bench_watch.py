"""Benchmark: what a controller manager's pods watch costs the apiserver, KCM and pykcm side by side.

Not a test: a script that prints a table. In a cluster most pod changes are not the controller
manager's: kubelets write pod statuses all day, and every change reaches its pods watch. The
apiserver encodes a watch event once per wire format for all its watchers; the scheduler and the
kubelets read pods as protobuf, so a controller manager reading them as JSON costs the apiserver
an encoding of every pod change of its own, on top of writing it out.

On one local control plane: `--pods` pods (two containers with env, probes and resources, no
owner, so no controller acts on them) in one namespace, and a client playing the kubelets that
patches their statuses (the Ready condition flips, as a readiness probe's would) at `--rate` a
second, while a watcher reads every pod change as protobuf, as the scheduler does. Each phase
runs that load for `--duration` seconds with one of: no controller manager (the baseline), KCM
(its ReplicaSet controller), pykcm reading its pods watch as protobuf, pykcm reading it as JSON
(both its ReplicaSet controller); `--rounds` rounds, the phases' order rotated each round. Both
as the replicaset-controller ServiceAccount, as in bench_replicaset.py.

Figures, medians over the rounds: the apiserver's CPU serving watches in the phase less the
baseline's (the protobuf watcher's), from its own CPU profile (`/debug/pprof/profile` over the
phase): the samples under `WatchServer.HandleHTTP`, where an event is encoded for its wire format
(once per format) and, over HTTP/1.1, written out, plus those of the HTTP/2 connections' own
goroutines, which write out HTTP/2 responses (only KCM speaks HTTP/2 here); the apiserver's whole
CPU less the baseline's (the status patches cost it about a hundred times what a watcher does, so
this one is noisy; the controller writes nothing here); and the controller manager's own CPU
seconds. The profile is read with `go tool pprof`, from the Go toolchain that built the control
plane (looked for before anything starts). A controller manager that is no longer running at
the end of its phase, or a pykcm that fell back to reading its pods watch as JSON in a protobuf
phase, becomes a note under the table. The cluster's directory is removed at the end.

    python tests/bench/bench_watch.py [--pods 2000 --rate 100 --duration 30 --rounds 3 --apiserver-cpus N
                                       --controllers-share-cpus]
"""

from __future__ import annotations

import argparse
import asyncio
import re
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a plain script from anywhere

from pykcm.client.resources import PODS
from pykcm.client.rest import MERGE_PATCH, RestClient
from pykcm.testenv.build import KUBERNETES_VERSION
from pykcm.testenv.cluster import running
from pykcm.testenv.controlplane import APISERVER, ETCD, ControlPlane
from pykcm.testenv.gobuild import find_go
from tests.bench.bench_replicaset import KCM_ARGS, KCM_CONTENT_TYPES, OBSERVER
from tests.bench.bench_scale import replicaset
from tests.bench.common import (
    Figure,
    add_pinning_arguments,
    bounded,
    check_pinning_arguments,
    cpu_seconds,
    one_line_failures,
    pin_to_cpus,
    pykcm_env,
    running_still,
    scratch_directory,
    side_by_side,
)
from tests.support import PykcmProcess, admin_client, create_namespace

BASELINE, KCM, PYKCM_PROTOBUF, PYKCM_JSON = "baseline", "kcm", "pykcm-protobuf", "pykcm-json"
PHASES = (BASELINE, KCM, PYKCM_PROTOBUF, PYKCM_JSON)
CLIENT_LIMIT = 1000  # both sides' --kube-api-qps and burst: the watch does not spend it
SETTLE = 3.0  # after a controller manager's caches synced: its lists answered, its watches open
TICK = 0.1  # the status patches are paced per tick
PATCH_CONCURRENCY = 32
CREATE_CONCURRENCY = 50
# Serving a watch: its handler, and for HTTP/2 the connection's goroutines (separate from it).
WATCH_SERVING = ("k8s.io/apiserver/pkg/endpoints/handlers.(*WatchServer).HandleHTTP",
                 "golang.org/x/net/http2.(*serverConn).serve", "golang.org/x/net/http2.(*serverConn).writeFrameAsync")
JSON_FALLBACK = "Reading the watch as JSON from now on"  # pykcm's reflector, on a pod it cannot decode
PPROF_CUM = re.compile(r"^\s*\S+\s+\S+\s+\S+\s+([0-9.]+)(ms|s)\s")  # the cum column of `pprof -top`


@dataclass(frozen=True)
class Sample:
    """One phase: the apiserver's CPU seconds serving watches and in all, the controller
    manager's, the statuses patched and the watch events the protobuf watcher saw."""

    watch_serving: float
    apiserver_cpu: float
    own_cpu: float
    patched: int
    seen: int
    notes: list[str] = field(default_factory=list)


def pod(index: int) -> dict:
    """A pod as a Deployment's would look (bench_scale's template), with no owner."""
    template = replicaset("web", 0)["spec"]["template"]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {**template["metadata"], "name": f"web-{index:05d}"},
            "spec": template["spec"]}


async def kubelets(api: RestClient, ns: str, names: list[str], rate: int, duration: float) -> int:
    """Patch pod statuses at `rate` a second for `duration` seconds, round robin over `names`:
    the Ready condition flips with a new transition time. Returns how many were patched."""
    per_tick, done, ready = max(1, round(rate * TICK)), 0, False
    started = time.monotonic()
    while time.monotonic() - started < duration:
        batch = [names[(done + i) % len(names)] for i in range(per_tick)]
        ready = not ready
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        status = {"status": {"conditions": [{"type": "Ready", "status": str(ready), "lastTransitionTime": now}]}}
        await bounded([api.patch(PODS, name, status, ns, content_type=MERGE_PATCH, subresource="status")
                       for name in batch], PATCH_CONCURRENCY)
        done += len(batch)
        await asyncio.sleep(max(0.0, (done / rate) - (time.monotonic() - started)))
    return done


async def observe(api: RestClient, seen: list[int]) -> None:
    """Every pod change of the cluster read as protobuf, as the scheduler reads them."""
    resource_version = (await api.list(PODS, limit=1))["metadata"]["resourceVersion"]
    while True:  # the apiserver ends a watch after a while: resume where it ended
        params = {"resourceVersion": resource_version, "allowWatchBookmarks": "true"}
        async for event in api.watch(PODS.path(), params, decoder=OBSERVER):
            if event["type"] == "ERROR":
                resource_version = (await api.list(PODS, limit=1))["metadata"]["resourceVersion"]
                break
            resource_version = event["object"]["metadata"]["resourceVersion"]
            seen[0] += 1


def watch_serving_seconds(plane: ControlPlane, seconds: int, directory: Path, go: str) -> float:
    """CPU seconds the apiserver spends serving watches over the next `seconds` (at least 1: 0 is
    net/http/pprof's 30 s default), from its profile, read with the toolchain `go`."""
    url = f"{plane.apiserver_url}/debug/pprof/profile?seconds={seconds}"
    with urllib.request.urlopen(url, context=plane.ssl_context(), timeout=seconds + 60) as response:
        path = directory / f"apiserver-{time.monotonic_ns()}.pprof"
        path.write_bytes(response.read())
    top = subprocess.run([go, "tool", "pprof", "-top", "-cum", "-unit=ms", "-nodecount=1000000", str(path)],
                         capture_output=True, text=True, check=True).stdout
    cumulative = (PPROF_CUM.match(line) for line in top.splitlines() if line.rstrip().endswith(WATCH_SERVING))
    return sum(float(match[1]) / (1000 if match[2] == "ms" else 1) for match in cumulative if match)


# -- the controller managers ------------------------------------------------------------------------


@asynccontextmanager
async def controller_manager(plane: ControlPlane, phase: str, cpus: int) -> AsyncIterator[tuple[int, Path | None]]:
    """The phase's controller manager, started and synced; yields its pid (0: the baseline, none)
    and pykcm's log."""
    if phase == BASELINE:
        yield 0, None
        return
    limits = (f"--kube-api-qps={CLIENT_LIMIT}", f"--kube-api-burst={CLIENT_LIMIT}")
    if phase == KCM:
        args = (*KCM_ARGS, *limits, f"--kube-api-content-type={KCM_CONTENT_TYPES['protobuf']}")
        proc = await asyncio.to_thread(plane.start_kcm, "replicaset", args)
        try:
            await asyncio.sleep(SETTLE)
            if cpus:
                pin_to_cpus((proc.pid,), cpus)
            yield proc.pid, None
        finally:
            await asyncio.to_thread(plane.stop_kcm)
        return
    content_type = KCM_CONTENT_TYPES["protobuf" if phase == PYKCM_PROTOBUF else "json"]
    log = plane.logs_dir / f"{phase}-{time.monotonic_ns()}.log"
    ours = PykcmProcess(
        "--kubeconfig", str(plane.kubeconfig), "--controllers", "replicaset", "--use-service-account-credentials",
        *limits, f"--kube-api-content-type={content_type}", log_path=log, env=pykcm_env(),
    )
    try:
        await ours.wait_for_log("Caches are synced")
        await asyncio.sleep(SETTLE)
        if cpus:
            pin_to_cpus((ours.pid,), cpus)
        yield ours.pid, log
    finally:
        ours.signal()
        await ours.wait(60)


async def run_phase(plane: ControlPlane, api: RestClient, ns: str, names: list[str], phase: str,
                    args: argparse.Namespace) -> Sample:
    """One phase's figures."""
    apiserver = plane.processes[APISERVER].pid
    seen = [0]
    shared = args.apiserver_cpus if args.controllers_share_cpus else 0
    notes: list[str] = []
    async with controller_manager(plane, phase, shared) as (pid, log):
        watcher = asyncio.create_task(observe(api, seen))
        await asyncio.sleep(1.0)  # the watcher's list and watch are not the phase's
        seen[0] = 0
        apiserver_before, manager_before = cpu_seconds(apiserver), cpu_seconds(pid) if pid else 0.0
        profile = asyncio.create_task(
            asyncio.to_thread(watch_serving_seconds, plane, args.duration, plane.logs_dir, args.go))
        patched = await kubelets(api, ns, names, args.rate, args.duration)
        apiserver_cpu = cpu_seconds(apiserver) - apiserver_before
        own_cpu = cpu_seconds(pid) - manager_before if pid else float("nan")
        watching = await profile
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
        # A crashed controller manager would pass for a cheap one, a fallen-back pykcm for protobuf.
        if pid and not running_still(pid):
            notes.append(f"{phase}: the controller manager was no longer running at the end of the phase")
        if phase == PYKCM_PROTOBUF and log is not None and JSON_FALLBACK in log.read_text(errors="replace"):
            notes.append(f"{phase}: pykcm fell back to reading its pods watch as JSON")
    return Sample(watching, apiserver_cpu, own_cpu, patched, seen[0], notes)


# -- report -----------------------------------------------------------------------------------------


def print_table(results: dict[str, list[Sample]], args: argparse.Namespace) -> None:
    def median(phase: str, figure: str) -> float:
        return statistics.median(getattr(sample, figure) for sample in results[phase])

    def over_baseline(phase: str, figure: str) -> float:
        return median(phase, figure) - median(BASELINE, figure)

    print()
    print(f"Pods watch benchmark: {args.pods} pods, their statuses patched {args.rate}/s for {args.duration} s "
          f"a phase, {args.rounds} round(s), local kube-apiserver {KUBERNETES_VERSION}")
    pinned = f"pinned to {args.apiserver_cpus} CPU(s)" if args.apiserver_cpus else "not pinned"
    print(f"apiserver and etcd {pinned}; KCM on protobuf over HTTP/2, pykcm over HTTP/1.1; medians over the rounds")
    notes = sorted({note for samples in results.values() for sample in samples for note in sample.notes})
    groups = [
        (label, [
            Figure("apiserver CPU serving watches, over the baseline (s)",
                   over_baseline(KCM, "watch_serving"), over_baseline(phase, "watch_serving"), "{:.2f}"),
            Figure("apiserver CPU, over the baseline (s)",
                   over_baseline(KCM, "apiserver_cpu"), over_baseline(phase, "apiserver_cpu"), "{:.2f}"),
            Figure("controller manager CPU (s)", median(KCM, "own_cpu"), median(phase, "own_cpu"), "{:.2f}"),
        ], [note for note in notes if note.startswith((f"{KCM}:", f"{phase}:"))])
        for phase, label in ((PYKCM_PROTOBUF, "pykcm's pods watch: protobuf"), (PYKCM_JSON, "pykcm's pods watch: JSON"))
    ]
    print("\n".join(side_by_side(groups, label_width=30, label_header="")))
    print(f"baseline (the protobuf watcher alone): apiserver CPU serving watches "
          f"{median(BASELINE, 'watch_serving'):.2f} s, "
          f"in all {median(BASELINE, 'apiserver_cpu'):.2f} s; {median(BASELINE, 'patched'):.0f} statuses patched "
          f"and {median(BASELINE, 'seen'):.0f} watch events seen a phase")
    for phase in PHASES:
        rounds = ", ".join(f"{s.watch_serving:.2f}/{s.apiserver_cpu:.1f}" for s in results[phase])
        print(f"  {phase}: apiserver CPU serving watches/in all, by round: {rounds}")


async def main_async(args: argparse.Namespace) -> None:
    with scratch_directory("pykcm-bench-watch-") as root, \
            running(root / "cluster", log=lambda m: print(f"[testenv] {m}")) as plane:
        if args.apiserver_cpus:
            pin_to_cpus((plane.processes[APISERVER].pid, plane.processes[ETCD].pid), args.apiserver_cpus)
        api = admin_client(plane.kubeconfig, qps=10_000, burst=10_000)
        try:
            ns = await create_namespace(api, "bench-watch")
            print(f"[bench] creating {args.pods} pods ...", flush=True)
            await bounded([api.create(PODS, pod(i), namespace=ns) for i in range(args.pods)], CREATE_CONCURRENCY)
            names = [f"web-{i:05d}" for i in range(args.pods)]
            results: dict[str, list[Sample]] = {phase: [] for phase in PHASES}
            for round_ in range(args.rounds):
                order = PHASES[round_ % len(PHASES):] + PHASES[:round_ % len(PHASES)]
                for phase in order:
                    print(f"[bench] round {round_ + 1}/{args.rounds}: {phase} ...", flush=True)
                    results[phase].append(await run_phase(plane, api, ns, names, phase, args))
                    sample = results[phase][-1]
                    print(f"[bench]   apiserver CPU serving watches {sample.watch_serving:.2f} s, "
                          f"in all {sample.apiserver_cpu:.1f} s", flush=True)
        finally:
            await api.close()
    print_table(results, args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=2000, help="pods whose statuses are patched")
    parser.add_argument("--rate", type=int, default=100, help="pod status patches a second")
    parser.add_argument("--duration", type=int, default=30,
                        help="seconds of load a phase, whole (the apiserver's profile covers whole seconds)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the four phases, their order rotated")
    add_pinning_arguments(parser)
    args = parser.parse_args()
    check_pinning_arguments(parser, args)
    if min(args.pods, args.rate, args.rounds, args.duration) < 1:
        parser.error("--pods, --rate, --rounds and --duration must be at least 1")
    args.go = find_go()  # before the cluster and the pods: without it no phase can be read
    asyncio.run(main_async(args))


if __name__ == "__main__":
    one_line_failures(main)
