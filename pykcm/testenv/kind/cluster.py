"""`kind create cluster` from the offline node image (nodeimage.py), on the private Docker engine,
on a machine like the project's CI: no registry, cgroup v1, no CAP_SYS_RESOURCE, and no traffic
allowed off the machine.

The README's recipe (deploy/kind/kind-config.yaml) is applied as it is, plus what this machine needs:

- kind shells out to `docker`: a wrapper earlier on PATH points it at the private engine and
  rewrites the node's `docker run`. `--privileged` fails without CAP_SYS_RESOURCE, so it becomes
  every capability but that one, unconfined /proc and /sys paths and access to every device;
  its `docker exec --privileged` loses the flag (the process gets the node's capabilities);
  `--dns=127.0.0.1` keeps docker's embedded DNS from forwarding names off the machine; a boot
  script runs before kind's entrypoint (below); and /lib/modules is not mounted where the host has
  none (docker would create it on the host).
- The boot script remounts the cgroup hierarchies writable (docker mounts them read-only without
  `--privileged`; kind's entrypoint and systemd write them) and writes a ptp CNI config: kindnetd
  is not built here (`disableDefaultCNI`), each node's pods get 10.244.<last octet of its
  address>.0/24, and after creation every node gets a route to the others' pod subnets.
- kubelet v1.36 refuses cgroup v1 unless `failCgroupV1: false` (a KubeletConfiguration patch).
- kind's network is made here, before kind runs (kind reuses it): a bridge of a known name with no
  masquerading, and a host FORWARD rule that drops whatever the bridge would send anywhere but back
  to itself (before kube-proxy runs, pods' packets to Service addresses take the node's default
  route, the host). The engine runs with no iptables rules of its own (docker.py), so that rule
  is all this adds to the host, and delete() removes it with the network.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import shutil
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .. import hostnet
from ..docker import CGROUP_PARENT, DockerEngine, DockerError, docker_cli
from ..progress import Log, format_duration, run_with_progress
from . import nodeimage

RECIPE = Path(__file__).resolve().parents[3] / "deploy" / "kind" / "kind-config.yaml"
NETWORK = BRIDGE = "pykcm-kind"  # a bridge name is at most 15 characters
SUBNET = ipaddress.ip_network("172.29.0.0/24")
GUARD_CHAIN = "PYKCM-KIND"
POD_SUBNET = "10.244.{octet}.0/24"  # kind's podSubnet is 10.244.0.0/16
BOOT = "/kind/pykcm-boot"
KIND_CLUSTER_LABEL = "io.x-k8s.kind.cluster"
_LIB_MODULES = "/lib/modules"
# What `--privileged` gives a kind node, less CAP_SYS_RESOURCE (this machine has not got it).
PRIVILEGED = (
    "--cap-add=ALL", "--cap-drop=SYS_RESOURCE", "--security-opt=systempaths=unconfined",
    "--device-cgroup-rule=a *:* rwm", "--device=/dev/kmsg",
)
KUBELET_PATCH = """apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
"""
BOOT_SCRIPT = """#!/bin/bash
# Before kind's entrypoint (pykcm's docker wrapper for kind runs this; see pykcm/testenv/kind/cluster.py).
set -euo pipefail
# Without --privileged docker mounts the cgroup hierarchies read-only; kind's entrypoint and systemd write them.
awk '$2 ~ "^/sys/fs/cgroup" {print $2}' /proc/self/mounts | while read -r mount; do
  mount -o remount,bind,rw "$mount"
done
# No kindnetd: a ptp network whose pod subnet is named after the node's own address.
address=$(ip -4 -o addr show dev eth0 | awk '{print $4}' | cut -d/ -f1)
subnet="10.244.${address##*.}.0/24"
cat > /etc/cni/net.d/10-pykcm-ptp.conflist <<EOF
{"cniVersion": "0.4.0", "name": "pykcm-ptp", "plugins": [
  {"type": "ptp", "ipMasq": false, "mtu": 1500,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "$subnet"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
  {"type": "portmap", "capabilities": {"portMappings": true}}]}
EOF
exec /usr/local/bin/entrypoint /sbin/init "$@"
"""
# kind runs `docker`; this one runs the real CLI against the private engine, with the node's
# `docker run` rewritten (see the module's docstring).
WRAPPER = '''#!{python}
"""docker for kind, written by pykcm (pykcm/testenv/kind/cluster.py): the private engine, and
node containers without --privileged (this machine lacks CAP_SYS_RESOURCE)."""
import os, sys
args = sys.argv[1:]
if args[:1] == ["run"] and "--privileged" in args:
    rest, skip = [], False
    for i, arg in enumerate(args[1:]):
        if skip:
            skip = False
        elif arg == "--privileged":
            rest += {privileged!r}
        elif arg in ("-v", "--volume") and args[i + 2].startswith("{modules}:") and not os.path.isdir("{modules}"):
            skip = True
        elif arg.startswith("--volume={modules}:") and not os.path.isdir("{modules}"):
            pass
        else:
            rest.append(arg)
    args = ["run", "--dns=127.0.0.1", "--volume={boot}:{boot_target}:ro", "--entrypoint={boot_target}", *rest]
elif args[:1] == ["exec"]:
    args = [arg for arg in args if arg != "--privileged"]  # the process gets the node's capabilities
os.environ["DOCKER_HOST"] = {host!r}
os.execv({real!r}, [{real!r}, *args])
'''


def missing_prerequisites() -> list[str]:
    """One line per missing prerequisite: the node image's, and the host tools this module runs."""
    missing = nodeimage.missing_prerequisites()
    for tool, package in (("iptables", "iptables"), ("ip6tables", "iptables"), ("ip", "iproute2")):
        if shutil.which(tool) is None:
            missing.append(f"{tool} is not on PATH: apt-get install {package}")
    return missing


class KindError(DockerError):
    """A kind cluster could not be created or deleted."""


@dataclass
class KindCluster:
    name: str
    kubeconfig: Path
    directory: Path
    engine: DockerEngine = field(repr=False)
    kind: Path = field(repr=False)

    def env(self) -> dict[str, str]:
        """The environment kind runs in: the wrapper first on PATH, kind's network named."""
        path = f"{self.directory / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"
        return {**self.engine.env(), "PATH": path, "KIND_EXPERIMENTAL_DOCKER_NETWORK": NETWORK}

    def container_ids(self) -> list[str]:
        return self.engine.docker("ps", "--all", "--no-trunc", "--filter", f"label={KIND_CLUSTER_LABEL}={self.name}",
                                  "--format", "{{.ID}}").stdout.split()

    def nodes(self) -> dict[str, str]:
        """Node container -> its address on kind's network."""
        names = self.engine.docker("ps", "--filter", f"label={KIND_CLUSTER_LABEL}={self.name}",
                                   "--format", "{{.Names}}").stdout.split()
        return {name: self.engine.docker("inspect", "--format",
                                         f"{{{{(index .NetworkSettings.Networks \"{NETWORK}\").IPAddress}}}}",
                                         name).stdout.strip() for name in names}


def cluster_config(recipe: Path = RECIPE, kcm_controllers: str | None = None) -> dict[str, Any]:
    """The recipe plus this machine's workarounds (the module's docstring says why), with KCM's
    `--controllers` value replaced by `kcm_controllers` if given (a cluster whose KCM runs every
    controller, to compare with)."""
    config: dict[str, Any] = yaml.safe_load(recipe.read_text())
    config.setdefault("networking", {})["disableDefaultCNI"] = True
    config.setdefault("kubeadmConfigPatches", []).append(KUBELET_PATCH)
    if kcm_controllers is not None:
        _set_kcm_controllers(config, kcm_controllers)
    return config


def _set_kcm_controllers(config: dict[str, Any], value: str) -> None:
    """In place: the recipe's `controllers` entry of KCM's extraArgs set to `value` in each of its
    ClusterConfiguration patches (one per kubeadm config version: a v1beta4 list of name/value
    pairs, a v1beta3 map). Only that entry changes, in place rather than by a patch of its own, so
    the recipe's other entries (its hostpath flag) stay as they are whichever way kind merges."""
    replaced = 0
    for node in config.get("nodes", []):
        patches = node.get("kubeadmConfigPatches", [])
        for i, patch in enumerate(patches):
            document = yaml.safe_load(patch)
            if document.get("kind") != "ClusterConfiguration":
                continue
            extra = document.get("controllerManager", {}).get("extraArgs", [])
            if isinstance(extra, dict) and "controllers" in extra:
                extra["controllers"] = value
            elif entries := [a for a in extra if isinstance(a, dict) and a.get("name") == "controllers"]:
                entries[0]["value"] = value
            else:
                continue
            patches[i] = yaml.safe_dump(document, sort_keys=False)
            replaced += 1
    if not replaced:
        raise KindError("the kind recipe sets no --controllers for kube-controller-manager: nothing to replace")


def write_wrapper(directory: Path, engine: DockerEngine, real: str | None = None) -> None:
    """`directory/bin/docker` (the wrapper, running `real`, default the docker CLI) and the nodes' boot script."""
    (directory / "bin").mkdir(parents=True, exist_ok=True)
    boot = directory / "boot.sh"
    boot.write_text(BOOT_SCRIPT)
    boot.chmod(0o755)
    wrapper = directory / "bin" / "docker"
    wrapper.write_text(WRAPPER.format(python=sys.executable, privileged=list(PRIVILEGED), modules=_LIB_MODULES,
                                      boot=boot, boot_target=BOOT, host=engine.host, real=real or docker_cli()))
    wrapper.chmod(0o755)


def create(engine: DockerEngine, image: str, kind: Path, directory: Path, *, log: Log,
           name: str | None = None, kcm_controllers: str | None = None) -> KindCluster:
    """`kind create cluster` with the recipe (KCM's `--controllers` replaced by `kcm_controllers` if
    given); on failure, everything made is removed again."""
    config = cluster_config(kcm_controllers=kcm_controllers)
    name = name or config.get("name", "kind")
    cluster = KindCluster(name, directory / "kubeconfig", directory, engine, kind)
    if not engine.image_exists(image):  # kind would pull it from a registry
        raise KindError(f"{image} is not in the engine at {engine.directory}: build it with pykcm testenv kind-image")
    if _existing_clusters(engine):
        raise KindError(f"kind nodes already run on {engine.directory}: delete them (kind delete clusters --all "
                        f"with DOCKER_HOST={engine.host}) or use another engine directory")
    _check_bridge_is_ours(engine)
    _check_subnet_free()
    directory.mkdir(parents=True, exist_ok=True)  # only now: a refusal above leaves nothing behind
    write_wrapper(directory, engine)
    config_path = directory / "kind-config.yaml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    started = time.monotonic()
    try:
        _create_network(engine)
        _install_guard()
        argv = [str(kind), "create", "cluster", "--name", name, "--image", image, "--config", str(config_path),
                "--kubeconfig", str(cluster.kubeconfig), "--retain"]
        run_with_progress(argv, what="kind create cluster", log_path=directory / "kind-create.log", log=log,
                          env=cluster.env(), status=lambda: f"{len(cluster.nodes())} node containers")
        _route_pod_subnets(cluster)
    except BaseException:
        delete(cluster, log=log)
        raise
    log(f"kind cluster {name} created in {format_duration(time.monotonic() - started)} "
        f"(nodes {', '.join(cluster.nodes())}; kubeconfig {cluster.kubeconfig})")
    return cluster


def delete(cluster: KindCluster, *, log: Log) -> None:
    """`kind delete cluster`, then kind's network and the host rule: the host is as before create()."""
    started = time.monotonic()
    try:
        run_with_progress([str(cluster.kind), "delete", "cluster", "--name", cluster.name, "--kubeconfig",
                           str(cluster.kubeconfig)], what="kind delete cluster",
                          log_path=cluster.directory / "kind-delete.log", log=log, env=cluster.env())
    finally:
        cluster.engine.docker("network", "rm", NETWORK, check=False)
        dropped = _dropped_packets()
        _remove_guard()
    log(f"kind cluster {cluster.name} deleted in {format_duration(time.monotonic() - started)} "
        f"(the host rule stopped {dropped} packets bound off the machine)")


@contextlib.contextmanager
def running(engine: DockerEngine, image: str, kind: Path, directory: Path, *, log: Log,
            kcm_controllers: str | None = None) -> Iterator[KindCluster]:
    cluster = create(engine, image, kind, directory, log=log, kcm_controllers=kcm_controllers)
    try:
        yield cluster
    finally:
        delete(cluster, log=log)


def load_image_archives(cluster: KindCluster, archives: Sequence[Path], *, log: Log) -> None:
    """`kind load image-archive` of docker archives into every node's containerd (nothing can be
    pulled here: pods then find the images under their names)."""
    started = time.monotonic()
    run_with_progress([str(cluster.kind), "load", "image-archive", *map(str, archives), "--name", cluster.name],
                      what="kind load image-archive", log_path=cluster.directory / "kind-load.log", log=log,
                      env=cluster.env())
    log(f"loaded {', '.join(a.name for a in archives)} into kind cluster {cluster.name} "
        f"in {format_duration(time.monotonic() - started)}")


def host_traces(engine_directory: Path | None, container_ids: Iterable[str] = ()) -> list[str]:
    """What a kind cluster (of these node containers) and the engine may leave on the host: the
    bridge and the links on it, the host rule and any docker chain, mounts under the engine's
    directory (if given) or of the nodes, the nodes' cgroups. The same before create() and after
    delete(); the engine's own mounts go when it stops."""
    ids = tuple(container_ids)
    links = json.loads(hostnet.run(["ip", "-j", "link", "show"]).stdout or "[]")
    traces = [f"link {link['ifname']}" for link in links if BRIDGE in (link.get("ifname"), link.get("master"))]
    for family, ipt in hostnet.IPTABLES.items():
        saved = hostnet.run([f"{ipt}-save"]).stdout.splitlines()
        traces += [f"ipv{family} {line}" for line in saved if any(w in line for w in (GUARD_CHAIN, BRIDGE, "DOCKER"))]
    directory = str(engine_directory.resolve()) if engine_directory else None
    for line in Path("/proc/self/mounts").read_text().splitlines():
        point = line.split()[1]
        if (directory and point.startswith(directory)) or any(i in line for i in ids):
            traces.append(f"mount {point}")
    for hierarchy in Path("/sys/fs/cgroup").iterdir():
        traces += [f"cgroup {path}" for i in ids if (path := hierarchy / CGROUP_PARENT / i).exists()]
    return traces


def _existing_clusters(engine: DockerEngine) -> list[str]:
    return engine.docker("ps", "--all", "--filter", f"label={KIND_CLUSTER_LABEL}", "--format",
                         "{{.Names}}").stdout.split()


def _check_bridge_is_ours(engine: DockerEngine) -> None:
    """The bridge and the host rule are machine-wide: a bridge of that name that is not this engine's
    network is another engine's cluster's (or a crashed one's), and so is the rule guarding it. Refused
    before anything is made, so that the cleanup of a failed create() never removes them."""
    on_host = hostnet.run(["ip", "link", "show", BRIDGE], check=False).returncode == 0
    if on_host and engine.docker("network", "inspect", NETWORK, check=False).returncode != 0:
        raise KindError(f"the bridge {BRIDGE} exists but is no network of the engine at {engine.directory}: another "
                        f"private engine's kind cluster uses it (delete that cluster first), or a crashed one left it "
                        f"(ip link delete {BRIDGE})")


def _check_subnet_free() -> None:
    routes = json.loads(hostnet.run(["ip", "-j", "-4", "route", "show"]).stdout or "[]")
    for route in routes:
        dst = route.get("dst", "")
        if dst and dst != "default" and ipaddress.ip_network(dst, strict=False).overlaps(SUBNET) \
                and route.get("dev") != BRIDGE:
            raise KindError(f"{SUBNET} (kind's network here) overlaps the host's route {dst} dev {route.get('dev')}: "
                            "free it or change cluster.SUBNET")


def _create_network(engine: DockerEngine) -> None:
    engine.docker("network", "rm", NETWORK, check=False)  # a crashed run's
    gateway = next(SUBNET.hosts())
    engine.docker("network", "create", "--driver=bridge", f"--subnet={SUBNET}", f"--gateway={gateway}",
                  f"--opt=com.docker.network.bridge.name={BRIDGE}",
                  "--opt=com.docker.network.bridge.enable_ip_masquerade=false", NETWORK)


def _install_guard() -> None:
    for family in hostnet.IPTABLES:
        hostnet.install_chain(family, GUARD_CHAIN, [
            ["-i", BRIDGE, "-o", BRIDGE, "-j", "RETURN"],
            ["-i", BRIDGE, "-j", "DROP"],
        ])


def _dropped_packets() -> int:
    """Packets the guard dropped, both families."""
    total = 0
    for ipt in hostnet.IPTABLES.values():
        listing = hostnet.run([ipt, "-t", "filter", "-L", GUARD_CHAIN, "-v", "-n", "-x"], check=False).stdout
        total += sum(int(line.split()[0]) for line in listing.splitlines() if " DROP " in f" {line} ")
    return total


def _remove_guard() -> None:
    for family in hostnet.IPTABLES:
        hostnet.remove_chain(family, GUARD_CHAIN)


def _route_pod_subnets(cluster: KindCluster) -> None:
    """Every node routes each other node's pod subnet via that node (kindnetd's job, without it)."""
    nodes = cluster.nodes()
    for name in nodes:
        for other, address in nodes.items():
            if other != name:
                subnet = POD_SUBNET.format(octet=address.rsplit(".", 1)[-1])
                cluster.engine.docker("exec", name, "ip", "route", "replace", subnet, "via", address)
