"""A real node beside the local cluster's simulated ones: containerd (its own config, socket,
root and state, not docker's), runc v1.5.2, Debian's CNI plugins, and kubelet and kube-proxy
built from the control plane's Go module.

Pods reach the apiserver through the `kubernetes` Service: the apiserver binds and advertises
NODE_IP, an address on a dummy interface of this host (see hostnet.py), and kube-proxy (iptables
mode) sends the Service's ClusterIP there. Pods get addresses in POD_CIDR from a ptp conflist;
a guard chain keeps their traffic on this machine. One real node runs per machine at a time:
kube-proxy's chains are host-wide. `teardown` removes everything again.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from . import hostnet, processes
from .build import ensure_kubelet_and_proxy
from .certs import Pki, issue_client_cert, kubeconfig
from .errors import ControlPlaneError
from .gobuild import Log
from .images import BUSYBOX, BUSYBOX_PACKAGE, PAUSE_IMAGE, is_static, write_node_images
from .processes import LOOPBACK, ManagedProcess, free_port, http_get, kill_trees, unverified_context, write_private_file
from .runc import RUNC_BUILD_PACKAGES, cached_runc, cri_runtime, ensure_runc

if TYPE_CHECKING:
    from .controlplane import ControlPlane

NODE_NAME = "pykcm-real-node"
NODE_IP = "10.200.0.1"  # outside the Service range (10.0.0.0/24) and kwok's fake pod IPs (10.240.0.0/12)
POD_CIDR = "10.200.1.0/24"
SERVICE_ACCOUNT_ISSUER = "https://10.0.0.1"  # the `kubernetes` Service's ClusterIP, port 443
RUNTIME_DIR = Path("/run/pykcm-realnode")  # short: a unix socket path has at most 107 bytes
OWNER_FILE = RUNTIME_DIR / "owner"
KUBELET_ROOT = RUNTIME_DIR / "kubelet"
STATE_FILE = "realnode.json"
CONTAINERD, KUBELET, KUBE_PROXY = "containerd", "kubelet", "kube-proxy"
CNI_BIN_DIR = Path("/usr/lib/cni")
START_TIMEOUT = 60.0
READY_TIMEOUT = 120.0

# (Debian package, a file it installs); runc's build needs more until runc is cached (runc.py).
RUNTIME_PACKAGES = (
    ("containerd", "/usr/bin/containerd"),
    ("containerd", "/usr/bin/containerd-shim-runc-v2"),
    ("containerd", "/usr/bin/ctr"),
    ("containernetworking-plugins", str(CNI_BIN_DIR / "ptp")),
    ("containernetworking-plugins", str(CNI_BIN_DIR / "host-local")),
    ("containernetworking-plugins", str(CNI_BIN_DIR / "loopback")),
    ("iptables", "/usr/sbin/iptables"),
    ("iptables", "/usr/sbin/ip6tables"),
    ("iproute2", "/usr/sbin/ip"),
    (BUSYBOX_PACKAGE, str(BUSYBOX)),
)


def apiserver_args(pki: Pki) -> tuple[str, ...]:
    return (
        "--authorization-mode=Node,RBAC",  # the kubelet acts as system:node:<name>, as in kubeadm clusters
        "--enable-admission-plugins=NodeRestriction",
        # Logs, exec and port-forward: the apiserver calls the kubelet at its InternalIP (its
        # hostname would be looked up in DNS, off this machine) as an admin.
        "--kubelet-preferred-address-types=InternalIP",
        f"--kubelet-client-certificate={pki.admin_cert}",
        f"--kubelet-client-key={pki.admin_key}",
        # Pods have no DNS: an issuer they reach by address (the `kubernetes` Service, in the
        # serving certificate) lets them fetch its OIDC discovery document and keys.
        f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
        f"--service-account-jwks-uri={SERVICE_ACCOUNT_ISSUER}/openid/v1/jwks",
    )


def check_prerequisites() -> None:
    """Root, and Debian's packages: one line naming what is missing."""
    if os.geteuid() != 0:
        raise ControlPlaneError("a real node needs root (containerd, mounts, network interfaces, iptables)")
    wanted = list(RUNTIME_PACKAGES)
    if not cached_runc():
        wanted += RUNC_BUILD_PACKAGES
    missing = dict.fromkeys(pkg for pkg, path in wanted if not Path(path).exists())
    if Path(BUSYBOX).exists() and not is_static(Path(BUSYBOX)):
        missing[BUSYBOX_PACKAGE] = None
    if missing:
        names = " ".join(missing)
        raise ControlPlaneError(f"a real node needs the Debian packages {names}: apt-get install {names}")


@dataclass(frozen=True)
class NodeBinaries:
    runc: Path
    kubelet: Path
    kube_proxy: Path


def ensure_node_binaries(log: Log) -> NodeBinaries:
    """runc (Debian's 1.1.5 fails every sandbox here) and kubelet + kube-proxy, built once."""
    runc = ensure_runc(log)
    kubelet, kube_proxy = ensure_kubelet_and_proxy(log)
    return NodeBinaries(runc, kubelet, kube_proxy)


# ----- host preparation (before the apiserver binds NODE_IP)


def prepare_host(directory: Path, log: Log) -> None:
    """Claim the machine's one real node for `directory`, remember what to restore, and add the
    node's address and the guard chain."""
    _claim(directory)
    state = {
        "ip_forward": hostnet.ip_forward(),
        "chains": {str(family): {t: sorted(c) for t, c in hostnet.chains(family).items()} for family in (4, 6)},
    }
    write_private_file(directory / STATE_FILE, json.dumps(state, indent=1) + "\n")
    hostnet.add_dummy_address(NODE_IP)
    hostnet.install_forward_guard(POD_CIDR)
    log(f"real node: address {NODE_IP} on {hostnet.DUMMY_INTERFACE}, pods in {POD_CIDR}")


def claimant() -> Path | None:
    """The directory of the cluster whose real node this machine holds, if any."""
    try:
        owner = Path(OWNER_FILE.read_text().strip())
    except FileNotFoundError:
        return None
    return owner if (owner / STATE_FILE).exists() else None


def _claim(directory: Path) -> None:
    RUNTIME_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
    owner = claimant()
    if owner is not None and owner != directory:
        raise ControlPlaneError(
            f"a real node of the cluster in {owner} is using this machine; "
            f"stop it first (pykcm testenv stop --dir {owner})"
        )
    OWNER_FILE.write_text(f"{directory}\n")


# ----- node start


def node_dir(plane: ControlPlane) -> Path:
    return plane.directory / "node"


def start_node(plane: ControlPlane, binaries: NodeBinaries, log: Log) -> None:
    """containerd, the images, kubelet and kube-proxy; returns once the Node is Ready."""
    started = time.monotonic()
    root = node_dir(plane)
    _update_state(plane.directory, kube_proxy=str(binaries.kube_proxy))
    for sub in ("containerd", "cni", "images"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    socket = RUNTIME_DIR / "containerd.sock"
    _write_cni_config(root)
    config = _write_containerd_config(root, socket, binaries.runc)
    plane.start_component(
        CONTAINERD, ["/usr/bin/containerd", f"--config={config}"], lambda: _ctr_ok(socket), START_TIMEOUT
    )
    import_images(write_node_images(root / "images"))
    kubelet_kubeconfig = _client_kubeconfig(plane, KUBELET, f"system:node:{NODE_NAME}", "system:nodes")
    proxy_kubeconfig = _client_kubeconfig(plane, KUBE_PROXY, "system:kube-proxy")
    healthz = free_port()
    argv = _kubelet_argv(plane, binaries.kubelet, kubelet_kubeconfig, socket, healthz)
    plane.start_component(KUBELET, argv, lambda: _node_exists(plane), START_TIMEOUT, healthz)
    port = free_port()
    proxy_argv = [str(binaries.kube_proxy), f"--config={_write_proxy_config(root, proxy_kubeconfig, port)}", "--v=2"]
    plane.start_component(KUBE_PROXY, proxy_argv, lambda: _healthy(f"http://{LOOPBACK}:{port}/healthz"),
                          START_TIMEOUT, port)
    _wait_node_ready(plane, plane.processes[KUBELET])
    log(f"real node {NODE_NAME} Ready (containerd, kubelet, kube-proxy) in {time.monotonic() - started:.1f}s")


def import_image(archive: Path) -> None:
    """Import a docker-archive tarball into the node's containerd, where the kubelet's pods find it."""
    socket = RUNTIME_DIR / "containerd.sock"
    hostnet.run(["ctr", f"--address={socket}", "-n", "k8s.io", "images", "import", str(archive)])


def import_images(archives: list[Path]) -> None:
    for archive in archives:
        import_image(archive)


def _ctr_ok(socket: Path) -> bool:
    return socket.exists() and hostnet.run(["ctr", f"--address={socket}", "version"], check=False).returncode == 0


def _healthy(url: str) -> bool:
    return http_get(url, unverified_context())[0] == 200


def _node(plane: ControlPlane) -> dict[str, Any] | None:
    status, body = http_get(f"{plane.apiserver_url}/api/v1/nodes/{NODE_NAME}", plane.ssl_context())
    return json.loads(body) if status == 200 else None


def _node_exists(plane: ControlPlane) -> bool:
    return _node(plane) is not None


def _wait_node_ready(plane: ControlPlane, kubelet: ManagedProcess) -> None:
    deadline = time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline and kubelet.alive():
        node = _node(plane) or {}
        conditions = node.get("status", {}).get("conditions", [])
        if any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions):
            return
        time.sleep(0.5)
    tail = kubelet.log_tail(1)
    raise ControlPlaneError(
        f"real node {NODE_NAME} not Ready after {READY_TIMEOUT:.0f}s: {tail[-1] if tail else 'no output'}"
        f" (log: {kubelet.log_path})"
    )


def _client_kubeconfig(plane: ControlPlane, name: str, user: str, group: str | None = None) -> Path:
    cert, key = issue_client_cert(plane.pki, name, user, group)
    path = plane.directory / f"{name}.kubeconfig"
    write_private_file(path, yaml.safe_dump(kubeconfig(plane.apiserver_url, plane.pki.ca_cert, cert, key, user)))
    return path


def _write_cni_config(root: Path) -> None:
    conflist = {
        "cniVersion": "0.4.0",
        "name": "pykcm-realnode",
        "plugins": [
            {
                "type": "ptp",
                "ipMasq": False,  # nothing leaves this machine, so nothing needs masquerading
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": POD_CIDR}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": str(root / "cni-ipam"),
                },
            }
        ],
    }
    (root / "cni" / "10-pykcm.conflist").write_text(json.dumps(conflist, indent=1) + "\n")


def _write_containerd_config(root: Path, socket: Path, runc: Path) -> Path:
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    text = f"""version = 2
root = "{root / 'containerd' / 'root'}"
state = "{RUNTIME_DIR / 'state'}"

[grpc]
  address = "{socket}"
[ttrpc]
  address = ""
[debug]
  address = ""
[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "{root / 'containerd' / 'opt'}"

[{cri}]
  sandbox_image = "{PAUSE_IMAGE}"
  # No CAP_SYS_RESOURCE here: containers may not lower their oom_score_adj below ours.
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  disable_apparmor = true
  stream_server_address = "{LOOPBACK}"
  stream_server_port = "0"
[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"
{cri_runtime(runc, systemd_cgroup=False)}[{cri}.cni]
  bin_dir = "{CNI_BIN_DIR}"
  conf_dir = "{root / 'cni'}"
  max_conf_num = 1
"""
    path = root / "containerd" / "config.toml"
    path.write_text(text)
    return path


def _kubelet_argv(plane: ControlPlane, binary: Path, kubeconfig_path: Path, socket: Path, healthz: int) -> list[str]:
    root = node_dir(plane)
    (root / "resolv.conf").write_text("nameserver 127.0.0.1\n")  # no DNS query leaves the machine
    config = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": NODE_IP,
        "port": free_port(),
        "readOnlyPort": 0,
        "healthzBindAddress": LOOPBACK,
        "healthzPort": healthz,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(plane.pki.ca_cert)},
        },
        "authorization": {"mode": "Webhook"},
        "containerRuntimeEndpoint": f"unix://{socket}",
        "cgroupDriver": "cgroupfs",
        "failCgroupV1": False,
        "failSwapOn": False,
        "cgroupsPerQOS": False,
        "enforceNodeAllocatable": [],
        "localStorageCapacityIsolation": False,
        "evictionHard": {"memory.available": "1Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
        "oomScoreAdj": 0,  # lowering it needs CAP_SYS_RESOURCE
        "resolvConf": str(root / "resolv.conf"),
        "podLogsDir": str(root / "pod-logs"),
        "volumePluginDir": str(root / "volume-plugins"),
        "serializeImagePulls": False,
    }
    path = root / "kubelet-config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return [
        str(binary),
        f"--config={path}",
        f"--kubeconfig={kubeconfig_path}",
        # Under the short runtime dir: the kubelet makes unix sockets in it (at most 107 bytes).
        f"--root-dir={KUBELET_ROOT}",
        f"--hostname-override={NODE_NAME}",
        f"--node-ip={NODE_IP}",
        "--v=2",
    ]


def _write_proxy_config(root: Path, kubeconfig_path: Path, healthz: int) -> Path:
    config = {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig_path)},
        "hostnameOverride": NODE_NAME,
        "mode": "iptables",
        "bindAddress": NODE_IP,
        "healthzBindAddress": f"{LOOPBACK}:{healthz}",
        "metricsBindAddress": f"{LOOPBACK}:{free_port()}",
        "clusterCIDR": POD_CIDR,
        "nodePortAddresses": [f"{NODE_IP}/32"],  # never on this machine's own interfaces
        "iptables": {"localhostNodePorts": False},  # would set route_localnet host-wide
        # Leave the host's conntrack sysctls and its own OOM score as they are.
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
        "oomScoreAdj": 0,
    }
    path = root / "kube-proxy-config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def _update_state(directory: Path, **values: Any) -> None:
    path = directory / STATE_FILE
    write_private_file(path, json.dumps({**json.loads(path.read_text()), **values}, indent=1) + "\n")


# ----- teardown


def teardown(plane: ControlPlane, log: Log) -> None:
    """Remove the real node of `plane`, if it has one: its pods' containers, containerd, kubelet
    and kube-proxy, the mounts under its dirs, its interfaces and iptables chains; restore
    ip_forward. Safe to call twice, and after a start that failed half way. That is all the machine's:
    a directory whose node is gone while another's holds the machine only drops its record of it."""
    path = plane.directory / STATE_FILE
    try:
        state = json.loads(path.read_text())
    except FileNotFoundError:
        return
    if (other := _machine_held_elsewhere(plane)) is not None:
        path.unlink()
        log(f"real node record of {plane.directory} dropped, the machine left alone: {other}")
        return
    socket = RUNTIME_DIR / "containerd.sock"
    if kubelet := plane.processes.get(KUBELET):
        kubelet.stop()
    containers = _remove_containers(socket) if (c := plane.processes.get(CONTAINERD)) and c.alive() else 0
    _kill_shims()
    for name in (CONTAINERD, KUBE_PROXY):
        if proc := plane.processes.get(name):
            proc.stop()
    if state.get("kube_proxy"):
        hostnet.run([state["kube_proxy"], "--cleanup"], check=False)  # kube-proxy's own rules and chains
    mounts = hostnet.unmount_all(node_dir(plane), RUNTIME_DIR)
    for stale in (KUBELET_ROOT, RUNTIME_DIR / "state"):  # the next node starts afresh
        shutil.rmtree(stale, ignore_errors=True)
    for leftover in (socket, socket.with_name(socket.name + ".ttrpc")):  # containerd leaves them
        leftover.unlink(missing_ok=True)
    links = hostnet.remove_interfaces(POD_CIDR)
    chains = [c for family in (4, 6) for c in hostnet.remove_chains(family, state["chains"][str(family)])]
    hostnet.restore_ip_forward(state["ip_forward"])
    for name in (KUBELET, CONTAINERD, KUBE_PROXY):
        plane.processes.pop(name, None)
    plane._save(running=False)
    path.unlink()
    if OWNER_FILE.exists() and OWNER_FILE.read_text().strip() == str(plane.directory):
        OWNER_FILE.unlink()
    log(
        f"real node {NODE_NAME} removed: {containers} containers, {len(mounts)} mounts, "
        f"interfaces {', '.join(links) or 'none'}, {len(chains)} iptables chains"
    )


def _machine_held_elsewhere(plane: ControlPlane) -> str | None:
    """Why the machine's real node is not `plane`'s to remove (None if it is): another directory
    claims it, or no one does but a node's kubelet or shim runs that is not this cluster's."""
    owner = claimant()
    if owner == plane.directory:
        return None
    if owner is not None:
        return f"it holds the real node of the cluster in {owner}"
    if any((proc := plane.processes.get(name)) and proc.alive() for name in (KUBELET, CONTAINERD, KUBE_PROXY)):
        return None  # its own node, running with its claim lost
    if running := processes.process_trees(lambda argv: is_shim(argv) or is_node_kubelet(argv)):
        return f"a real node runs on it without a claim ({len(running)} processes: kubelet, shims, pods)"
    return None


def _remove_containers(socket: Path) -> int:
    """Kill and delete every container of the node's containerd (pods and their sandboxes)."""
    ctr = ["ctr", f"--address={socket}", "-n", "k8s.io"]
    tasks = hostnet.run([*ctr, "tasks", "ls", "-q"], check=False).stdout.split()
    for task in tasks:
        hostnet.run([*ctr, "tasks", "kill", "-a", "-s", "SIGKILL", task], check=False)
    for task in tasks:
        hostnet.run([*ctr, "tasks", "delete", "-f", task], check=False)
    containers = hostnet.run([*ctr, "containers", "ls", "-q"], check=False).stdout.split()
    for container in containers:
        hostnet.run([*ctr, "containers", "delete", container], check=False)
    return len(containers)


def is_shim(argv: list[bytes]) -> bool:
    return argv[0].endswith(b"containerd-shim-runc-v2") and str(RUNTIME_DIR / "containerd.sock").encode() in argv


def is_node_kubelet(argv: list[bytes]) -> bool:
    return f"--root-dir={KUBELET_ROOT}".encode() in argv


def _kill_shims() -> int:
    """Shims outlive containerd by design, and pods' processes outlive a killed shim: kill any
    shim serving this node's containerd, with the processes it parents."""
    return kill_trees(is_shim)
