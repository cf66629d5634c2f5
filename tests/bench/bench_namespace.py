"""Benchmark: pykcm against the real kube-controller-manager v1.36.3 on namespace work.

For each side a freshly started local control plane of its own (so etcd and the apiserver's
caches start out equal): pykcm (as a child process, exactly as deployed: `python -m pykcm.app.cli
run --controllers namespace,serviceaccount`) on one, the real KCM with the same controllers on
the other. Both serve their secure port (a free one; each makes its self-signed serving
certificate at start), run without leader election and act as each controller's ServiceAccount.
Once started (pykcm: "All controllers started"; KCM: /healthz ok) and the namespace filled:

- the time from deleting a namespace holding 1,000 pods, 100 ReplicaSets, 100 ConfigMaps and
  100 custom resources until the namespace object is gone (no ReplicaSet controller runs, so the
  ReplicaSets have no pods; unbound pods are removed by the API server without a kubelet);
- the time from creating 200 namespaces until each has its `default` ServiceAccount;
- the process's CPU seconds (utime + stime) over these two, from a baseline taken just before
  the deletion (start-up and the initial lists are not in it), and its peak RSS
  (/proc/PID/status VmHWM, over its whole life) at the end.

No file stays behind: the clusters' directories are removed at the end.

Run: python tests/bench/bench_namespace.py [--pods 1000 --replicasets 100 --configmaps 100
     --custom-resources 100 --namespaces 200 --pykcm-checkout DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a plain script from anywhere

from pykcm.client.resources import CONFIGMAPS, NAMESPACES, PODS, REPLICASETS, SERVICEACCOUNTS
from pykcm.client.rest import RestClient
from pykcm.testenv.controlplane import ControlPlane
from tests.bench.common import (
    add_checkout_argument,
    bounded,
    check_checkout_argument,
    cpu_seconds,
    on_fresh_cluster,
    one_line_failures,
    peak_rss_mib,
    pykcm_env,
    ratio,
    scratch_directory,
)
from tests.support import PykcmProcess, admin_client, create_namespace, ensure_crd, free_port, is_gone, wait_for

CONTROLLERS = "namespace,serviceaccount"
CREATE_CONCURRENCY = 64
TIMEOUT = 600.0


@dataclass
class Workload:
    pods: int
    replicasets: int
    configmaps: int
    custom_resources: int
    namespaces: int


@dataclass
class Result:
    delete_seconds: float = float("nan")
    service_accounts_seconds: float = float("nan")
    peak_rss_mib: float = float("nan")
    cpu_seconds: float = float("nan")
    notes: list[str] = field(default_factory=list)


def pod(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}}


def replicaset(name: str) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": name},
        "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels}, "spec": pod(name)["spec"]}},
    }


async def fill_namespace(client: RestClient, widgets: Any, work: Workload) -> str:
    ns = await create_namespace(client, "bench-del")
    creates: list[Awaitable[Any]] = []
    creates += [client.create(PODS, pod(f"pod-{i}"), ns) for i in range(work.pods)]
    creates += [client.create(REPLICASETS, replicaset(f"rs-{i}"), ns) for i in range(work.replicasets)]
    creates += [client.create(CONFIGMAPS, {"metadata": {"name": f"cm-{i}"}, "data": {"k": "v"}}, ns)
                for i in range(work.configmaps)]
    creates += [client.create(widgets, {"apiVersion": "pykcm.test/v1", "kind": "Widget",
                                        "metadata": {"name": f"w-{i}"}}, ns) for i in range(work.custom_resources)]
    await bounded(creates, CREATE_CONCURRENCY)
    return ns


async def time_namespace_deletion(client: RestClient, ns: str) -> float:
    start = time.monotonic()
    await client.delete(NAMESPACES, ns)
    await wait_for(lambda: is_gone(client, NAMESPACES, ns), TIMEOUT, 0.05, f"namespace {ns} gone")
    return time.monotonic() - start


async def time_default_service_accounts(client: RestClient, count: int) -> float:
    run = uuid.uuid4().hex[:6]
    names = {f"bench-sa-{run}-{i}" for i in range(count)}
    start = time.monotonic()
    await bounded((client.create(NAMESPACES, {"metadata": {"name": name}}) for name in names), CREATE_CONCURRENCY)

    async def all_have_default() -> bool:
        accounts = (await client.list(SERVICEACCOUNTS, fieldSelector="metadata.name=default"))["items"]
        return names <= {sa["metadata"]["namespace"] for sa in accounts}

    await wait_for(all_have_default, TIMEOUT, 0.05, f"{count} default service accounts")
    return time.monotonic() - start


async def measure(client: RestClient, widgets: Any, work: Workload, pid: int) -> Result:
    ns = await fill_namespace(client, widgets, work)
    cpu_before = cpu_seconds(pid)  # started and synced long since: the filling took seconds
    deletion = await time_namespace_deletion(client, ns)
    accounts = await time_default_service_accounts(client, work.namespaces)
    return Result(deletion, accounts, peak_rss_mib(pid), cpu_seconds(pid) - cpu_before)


async def run_pykcm(plane: ControlPlane, client: RestClient, widgets: Any, work: Workload, checkout: Path) -> Result:
    # Same set-up as the testenv's KCM: no leader election, each controller as its own ServiceAccount,
    # serving on a free port.
    env = pykcm_env(checkout)
    proc = PykcmProcess("--kubeconfig", str(plane.kubeconfig), "--controllers", CONTROLLERS, "--no-leader-elect",
                        "--use-service-account-credentials", f"--secure-port={free_port()}",
                        log_path=plane.logs_dir / "pykcm.log", env=env)
    try:
        await proc.wait_for_log("All controllers started", 60)  # each controller logs its own "Caches are synced"
        return await measure(client, widgets, work, proc.pid)
    finally:
        proc.signal()
        await proc.wait()


async def run_kcm(plane: ControlPlane, client: RestClient, widgets: Any, work: Workload) -> Result:
    kcm = await asyncio.to_thread(plane.start_kcm, CONTROLLERS)
    try:
        return await measure(client, widgets, work, kcm.pid)
    finally:
        await asyncio.to_thread(plane.stop_kcm, kcm)


async def bench_side(plane: ControlPlane, pykcm_side: bool, work: Workload, checkout: Path) -> Result:
    client = admin_client(plane.kubeconfig)
    try:
        widgets = await ensure_crd(client, "pykcm.test", "Widget", "widgets")
        if pykcm_side:
            return await run_pykcm(plane, client, widgets, work, checkout)
        return await run_kcm(plane, client, widgets, work)
    finally:
        await client.close()


def table(work: Workload, pykcm: Result, kcm: Result) -> str:
    rows: list[tuple[str, Callable[[Result], float], str]] = [
        (f"delete ns ({work.pods} pods, {work.replicasets} RS, {work.configmaps} CM, {work.custom_resources} CR)"
         " until gone", lambda r: r.delete_seconds, "s"),
        (f"{work.namespaces} new namespaces until each has `default`", lambda r: r.service_accounts_seconds, "s"),
        ("peak RSS (VmHWM)", lambda r: r.peak_rss_mib, "MiB"),
        ("CPU time (utime+stime), deletion and new namespaces", lambda r: r.cpu_seconds, "s"),
    ]
    width = max(len(name) for name, _, _ in rows)
    lines = [f"| {'metric':<{width}} | {'pykcm':>11} | {'KCM':>11} | {'pykcm/KCM':>9} |",
             f"|{'-' * (width + 2)}|{'-' * 13}|{'-' * 13}|{'-' * 11}|"]
    for name, value, unit in rows:
        mine, theirs = value(pykcm), value(kcm)
        lines.append(f"| {name:<{width}} | {f'{mine:.2f} {unit}':>11} | {f'{theirs:.2f} {unit}':>11} "
                     f"| {ratio(mine, theirs).rstrip('x'):>9} |")
    lines += [f"note: {note}" for note in pykcm.notes + kcm.notes]
    return "\n".join(lines)


def bench(work: Workload, checkout: Path) -> str:
    def side(pykcm_side: bool) -> Result:
        name = "pykcm" if pykcm_side else "kcm"
        return on_fresh_cluster(root / name, f"{name} side",
                                lambda plane: bench_side(plane, pykcm_side, work, checkout),
                                lambda note: Result(notes=[note]))

    with scratch_directory("pykcm-bench-namespace-") as root:
        pykcm, kcm = side(True), side(False)
    return table(work, pykcm, kcm)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--replicasets", type=int, default=100)
    parser.add_argument("--configmaps", type=int, default=100)
    parser.add_argument("--custom-resources", type=int, default=100)
    parser.add_argument("--namespaces", type=int, default=200)
    add_checkout_argument(parser)
    args = parser.parse_args()
    check_checkout_argument(parser, args)
    work = Workload(args.pods, args.replicasets, args.configmaps, args.custom_resources, args.namespaces)
    print(bench(work, args.pykcm_checkout))


if __name__ == "__main__":
    one_line_failures(main)
