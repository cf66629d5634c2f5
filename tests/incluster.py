"""What the in-cluster tests check of pykcm deployed from deploy/, wherever its pods run: on the
real node (tests/integration/test_incluster.py) or on a kind cluster's control-plane node
(tests/integration/test_kind_incluster.py). A `Node` is how a test reaches the node that runs the
pods: its containerd (`ctr`), its /proc, and a signal to a process there.

The standby: deploy/'s DaemonSet runs one pod per control-plane node, and both clusters have one
such node, where a second pod of it could not run (host network, host port 10357). So the tests
add the same DaemonSet renamed `pykcm-standby`, serving on 10358: the same image, ServiceAccount,
flags, security context and probes, made by the same DaemonSet controller, which is what a second
control-plane node would run. Deleting the leader pod, whichever of the two it is, then shows the
other take the Lease, timed against deploy/'s lease duration + retry period (the deleted pod
releases the Lease on SIGTERM). A crash releases nothing, so the test then SIGKILLs the new
leader's process: the Lease must expire first, and a standby notices a renewal up to one jittered
retry (retry x 2.2) late and retries as late again, so that bound is lease duration + 2 x 2.2 x
retry period.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pykcm.app.options import LEADER_ELECTION_JITTER, Options
from pykcm.client.resources import DEPLOYMENTS, LEASES, NAMESPACES, PODS, SERVICEACCOUNTS
from pykcm.client.rest import RestClient
from pykcm.testenv.progress import format_duration
from tests.support import create_namespace, is_gone, is_ready, wait_for

CONTROL_PLANE_LABEL = "node-role.kubernetes.io/control-plane"
NAME_LABEL = "app.kubernetes.io/name"
STANDBY, STANDBY_PORT = "pykcm-standby", 10358
NONROOT = 65532
IDENTITY = re.compile(r'"Attempting to acquire leader lease\.\.\.".* identity="([^"]+)"')
ACQUIRED = '"Successfully acquired lease"'
READY_TIMEOUT = 180.0
Log = Callable[[str], None]


class Kubectl:
    """kubectl with one kubeconfig: `kubectl(*args)` returns its output and fails the test on an error."""

    def __init__(self, binary: Path, kubeconfig: Path) -> None:
        self.binary = binary
        self.argv = [str(binary), f"--kubeconfig={kubeconfig}"]

    def __call__(self, *args: str | Path, stdin: str | None = None, check: bool = True) -> str:
        done = subprocess.run([*self.argv, *map(str, args)], input=stdin, capture_output=True, text=True, timeout=300)
        assert not check or done.returncode == 0, f"kubectl {' '.join(map(str, args))}: {done.stderr.strip()}"
        return done.stdout

    def json(self, *args: str) -> dict[str, Any]:
        return json.loads(self(*args, "-o", "json"))


@dataclass(frozen=True)
class Node:
    """The node running pykcm's pods, as the test reaches it: `run(argv)` runs a command where the
    node's containerd and processes are (the host for the real node, the node container for kind)."""

    name: str
    run: Callable[[Sequence[str]], str]
    containerd_socket: str

    def ctr(self, *args: str) -> str:
        """`ctr` against the node's containerd, in the kubelet's namespace."""
        return self.run(["ctr", f"--address={self.containerd_socket}", "-n", "k8s.io", *args])

    def container_pid(self, pod: dict[str, Any]) -> int:
        """The PID (as the node sees it) of the pod's first container."""
        container_id = pod["status"]["containerStatuses"][0]["containerID"].removeprefix("containerd://")
        pids = [int(line.split()[1]) for line in self.ctr("tasks", "ls").splitlines()[1:]
                if line.split()[0] == container_id]
        assert pids, f"no task for container {container_id}"
        return pids[0]

    def process_view(self, pid: int) -> dict[str, str]:
        """What the kernel says about a process: ids, capabilities, seccomp, and its root mount's options."""
        status = dict(line.split(":", 1) for line in self.run(["cat", f"/proc/{pid}/status"]).splitlines())
        root = next(line.split() for line in self.run(["cat", f"/proc/{pid}/mountinfo"]).splitlines()
                    if line.split()[4] == "/")
        view = {key: " ".join(status[key].split()) for key in ("Uid", "Gid", "CapEff", "CapPrm", "CapBnd",
                                                               "Seccomp", "NoNewPrivs")}
        view["root"] = root[5].split(",")[0]
        view["cmdline"] = self.run(["cat", f"/proc/{pid}/cmdline"]).replace("\0", " ")
        return view

    def kill(self, pid: int) -> None:
        self.run(["kill", "-KILL", str(pid)])


def host_command(argv: Sequence[str]) -> str:
    return subprocess.run(list(argv), capture_output=True, text=True, check=True, timeout=60).stdout


def standby_daemonset(daemonset: dict[str, Any]) -> dict[str, Any]:
    """deploy/'s DaemonSet as rendered, renamed and moved to another host port (see the docstring)."""
    standby = json.loads(json.dumps(daemonset))
    standby["metadata"] = {"name": STANDBY, "namespace": daemonset["metadata"]["namespace"]}
    standby["spec"]["selector"] = {"matchLabels": {NAME_LABEL: STANDBY}}
    standby["spec"]["template"]["metadata"]["labels"] = {NAME_LABEL: STANDBY}
    container = standby["spec"]["template"]["spec"]["containers"][0]
    container["args"] = [re.sub(r"^--secure-port=\d+$", f"--secure-port={STANDBY_PORT}", a) for a in container["args"]]
    assert f"--secure-port={STANDBY_PORT}" in container["args"]
    container["ports"][0]["containerPort"] = STANDBY_PORT
    return standby


# ----- the pods, seen through the API and on their node


async def ready_pods(client: RestClient, name: str) -> list[dict[str, Any]]:
    pods = (await client.list(PODS, "kube-system", labelSelector=f"{NAME_LABEL}={name}"))["items"]
    return [p for p in pods if is_ready(p) and not p["metadata"].get("deletionTimestamp")]


async def one_ready_pod(client: RestClient, name: str) -> dict[str, Any]:
    async def one() -> dict[str, Any] | None:
        pods = await ready_pods(client, name)
        return pods[0] if len(pods) == 1 else None

    return await wait_for(one, timeout=READY_TIMEOUT, interval=0.5, message=f"the {name} pod Ready")


def pod_log(kubectl: Kubectl, pod: dict[str, Any]) -> str:
    return kubectl("logs", "-n", "kube-system", pod["metadata"]["name"])


def identity_of(log: str) -> str | None:
    match = IDENTITY.search(log)
    return match[1] if match else None


def assert_hardened_as_deploy_says(node: Node, pod: dict[str, Any], daemonset: dict[str, Any], image: str) -> None:
    template = daemonset["spec"]["template"]["spec"]
    assert pod["spec"]["nodeName"] == node.name
    assert pod["spec"]["securityContext"] == template["securityContext"]
    container = pod["spec"]["containers"][0]
    assert container["securityContext"] == template["containers"][0]["securityContext"]
    assert container["image"] == image and container["imagePullPolicy"] == "IfNotPresent"
    view = node.process_view(node.container_pid(pod))
    ids = " ".join([str(NONROOT)] * 4)
    assert (view["Uid"], view["Gid"]) == (ids, ids), view
    assert view["CapEff"] == view["CapPrm"] == view["CapBnd"] == "0000000000000000", view
    assert (view["Seccomp"], view["NoNewPrivs"], view["root"]) == ("2", "1", "ro"), view  # 2: a filter
    assert " run " in view["cmdline"] and "--kubeconfig" not in view["cmdline"], view


def assert_in_cluster_config(pod: dict[str, Any], log: str) -> None:
    """No kubeconfig anywhere: pykcm took the projected token the kubelet mounted."""
    mounts = {m["mountPath"] for m in pod["spec"]["containers"][0]["volumeMounts"]}
    assert "/var/run/secrets/kubernetes.io/serviceaccount" in mounts
    assert "Using the in-cluster configuration" in log, log[-2000:]
    assert "Traceback" not in log, log[-4000:]


async def the_one_leader(
    client: RestClient, kubectl: Kubectl, pods: list[dict[str, Any]]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Exactly one pod holds the `pykcm` Lease and says so; the other stands by. Returns (leader, standby)."""
    async def held() -> str | None:
        return (await client.get(LEASES, "pykcm", "kube-system"))["spec"].get("holderIdentity") or None

    holder = await wait_for(held, timeout=60, interval=0.5, message="a holder of kube-system/pykcm")
    logs = [pod_log(kubectl, p) for p in pods]
    identities = [identity_of(log) for log in logs]
    assert holder in identities, (holder, identities)
    leader = identities.index(holder)
    assert [ACQUIRED in log for log in logs] == [i == leader for i in range(len(pods))], logs
    return pods[leader], pods[1 - leader]


async def user_deployment_gets_ready_pods(
    client: RestClient, pod_spec: dict[str, Any], node: str, log: Log, what: str
) -> None:
    """KCM's Deployment controller makes the ReplicaSet; its 2 pods (`pod_spec`, on `node`) can
    only come from pykcm, which also gives the namespace its `default` ServiceAccount and, deleted,
    empties and removes it."""
    started = time.monotonic()
    namespace = await create_namespace(client, "user", service_account=False)
    try:
        async def default_account() -> bool:  # pykcm's ServiceAccount controller; pods wait for it
            return not await is_gone(client, SERVICEACCOUNTS, "default", namespace)

        await wait_for(default_account, timeout=60, interval=0.5, message="the default ServiceAccount")
        deployment = {
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
            "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
                     "template": {"metadata": {"labels": {"app": "web"}}, "spec": pod_spec}},
        }
        await client.create(DEPLOYMENTS, deployment, namespace=namespace)

        async def ready() -> bool:
            status = (await client.get(DEPLOYMENTS, "web", namespace)).get("status", {})
            return status.get("readyReplicas") == 2

        await wait_for(ready, timeout=120, interval=0.5, message="the Deployment's 2 pods Ready")
        pods = (await client.list(PODS, namespace, labelSelector="app=web"))["items"]
        for pod in pods:
            assert pod["spec"]["nodeName"] == node and is_ready(pod)
            assert pod["metadata"]["ownerReferences"][0]["kind"] == "ReplicaSet"
            assert {f["manager"] for f in pod["metadata"]["managedFields"] if f["operation"] == "Update"
                    and not f.get("subresource")} == {"pykcm"}, pod["metadata"]["managedFields"]
        log(f"DURATION [{what}] namespace + Deployment -> 2 pods Ready: {format_duration(time.monotonic() - started)}")
    finally:
        # pykcm's namespace controller empties and removes it: delete it while pykcm still runs.
        await client.delete(NAMESPACES, namespace)
        await wait_for(lambda: is_gone(client, NAMESPACES, namespace), timeout=120, interval=0.5,
                       message=f"namespace {namespace} removed by pykcm")


def lease_timing(daemonset: dict[str, Any]) -> tuple[float, float]:
    """deploy/'s lease duration and retry period (pykcm's defaults unless its args set them)."""
    args = dict(a.split("=", 1) for a in daemonset["spec"]["template"]["spec"]["containers"][0]["args"] if "=" in a)
    defaults = Options()
    for flag in ("--leader-elect-lease-duration", "--leader-elect-retry-period"):
        assert flag not in args, f"{flag} set in deploy/: parse it here"
    return defaults.leader_elect_lease_duration, defaults.leader_elect_retry_period


async def leader_pod_deletion_hands_over(
    client: RestClient, kubectl: Kubectl, node: Node, daemonset: dict[str, Any],
    leader: dict[str, Any], standby: dict[str, Any], log: Log, what: str,
) -> None:
    """Deleting the leader pod hands the Lease over within lease duration + retry period; killing
    the new leader's process, within the crash bound (see the docstring)."""
    lease_duration, retry_period = lease_timing(daemonset)
    deposed = identity_of(pod_log(kubectl, leader))
    started = time.monotonic()
    kubectl("delete", "pod", "-n", "kube-system", leader["metadata"]["name"], "--wait=false")

    # The leader releases the Lease on SIGTERM; the standby and the DaemonSet's replacement pod race
    # for it, and either winning is a hand-over.
    async def taken_over() -> str | None:
        holder = (await client.get(LEASES, "pykcm", "kube-system"))["spec"].get("holderIdentity")
        return holder if holder not in (None, "", deposed) else None

    successor = await wait_for(taken_over, timeout=lease_duration + 4 * retry_period, interval=0.1,
                               message="another replica to take the Lease")
    takeover = time.monotonic() - started
    name = leader["metadata"]["labels"][NAME_LABEL]
    recreated = await one_ready_pod(client, name)  # the DaemonSet controller's new pod
    replicas = {identity_of(pod_log(kubectl, p)): p for p in (standby, recreated)}
    assert successor in replicas, (successor, list(replicas))
    log(f"DURATION [{what}] leader pod deleted -> the other replica leads: {format_duration(takeover)} "
        f"(bound: lease duration {lease_duration:g}s + retry period {retry_period:g}s); new holder "
        f"{'the standby' if replicas[successor] is standby else 'the recreated pod'}")
    assert takeover <= lease_duration + retry_period
    # A crash releases nothing: kill the new leader's process; the Lease must expire first.
    # The other replica notices a renewal up to one jittered retry late and tries again a jittered retry later.
    other = next(identity for identity in replicas if identity != successor)
    new_leader = await client.get(PODS, replicas[successor]["metadata"]["name"], "kube-system")
    started = time.monotonic()
    node.kill(node.container_pid(new_leader))

    async def expired_and_taken() -> bool:
        return (await client.get(LEASES, "pykcm", "kube-system"))["spec"].get("holderIdentity") not in (successor, "")

    bound = lease_duration + 2 * retry_period * (1 + LEADER_ELECTION_JITTER)
    await wait_for(expired_and_taken, timeout=bound + 30, interval=0.1, message="a new holder after the crash")
    crash = time.monotonic() - started
    holder = (await client.get(LEASES, "pykcm", "kube-system"))["spec"]["holderIdentity"]
    log(f"DURATION [{what}] leader process killed -> a standby leads: {format_duration(crash)} "
        f"(lease duration {lease_duration:g}s; bound with jittered retries {bound:g}s); new holder "
        f"{'the other replica' if holder == other else 'the restarted container'}")
    assert lease_duration - retry_period * (1 + LEADER_ELECTION_JITTER) <= crash <= bound
