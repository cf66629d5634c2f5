"""The files a kind node image adds to its Debian root, laid out in a staging directory.

kind's own node files come from its Go module (`images/base/files/`, read after `go mod download`):
the entrypoint that prepares mounts and cgroups before systemd, the createContainer hook and the
cgroup helpers, and the systemd units of kubelet, containerd and the mount clean-up. Only those
are taken; containerd's config is pykcm's (restrict_oom_score_adj, runc v1.5.2, no
fuse-overlayfs). Beside them: kubeadm, kubelet and kubectl where kind's units expect them,
runc, the CNI plugins where containerd looks for them, and /kind/version, which kind reads.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ..build import KUBEADM, KUBECTL, KUBELET, KUBERNETES_VERSION
from ..errors import BuildError
from ..gobuild import find_go
from ..runc import cri_runtime
from .preload import PAUSE_IMAGE

KIND_MODULE, KIND_VERSION = "sigs.k8s.io/kind", "v0.33.0"
RUNC = "/usr/local/sbin/runc"  # before Debian's /usr/sbin/runc on PATH, as in kind's image
CRI_BASE_SPEC = "/etc/containerd/cri-base.json"
CNI_PLUGINS = ("ptp", "bridge", "host-local", "loopback", "portmap")
DEBIAN_CNI_DIR = "/usr/lib/cni"
# kind's node files taken as they are: path in the module's images/base/files -> mode.
KIND_FILES = {
    "usr/local/bin/entrypoint": 0o755,
    "kind/bin/mount-product-files.sh": 0o755,
    "kind/bin/undo-mount-hacks.sh": 0o755,
    "kind/bin/create-kubelet-cgroup-v2.sh": 0o755,
    "etc/systemd/system/containerd.service": 0o644,
    "etc/systemd/system/kubelet.service": 0o644,
    "etc/systemd/system/kubelet.slice": 0o644,
    "etc/systemd/system/undo-mount-hacks.service": 0o644,
    "etc/systemd/system/kubelet.service.d/10-kubeadm.conf": 0o644,
    "etc/systemd/system/kubelet.service.d/11-kind.conf": 0o644,
    "etc/sysctl.d/10-network-magic.conf": 0o644,
    "etc/sysctl.d/10-network-security.conf": 0o644,
    "etc/default/kubelet": 0o644,
    "etc/crictl.yaml": 0o644,
}
ENABLED_UNITS = ("containerd.service", "kubelet.service", "undo-mount-hacks.service")
MASKED_UNITS = ("systemd-binfmt.service",)  # it would register binary formats kernel-wide
STOP_SIGNAL = "SIGRTMIN+3"  # systemd halts on it (SIGTERM makes it re-execute); `docker commit` cannot set it
IMAGE_CHANGES = (  # the rest of the node image's config, as kind's base image sets it
    "ENV container=docker",  # systemd's container interface
    'ENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]',
    "CMD []",
)


@dataclass(frozen=True)
class NodeBinaries:
    kubeadm: Path
    kubelet: Path
    kubectl: Path
    runc: Path


def kind_files_dir() -> Path:
    """kind's images/base/files in the Go module cache, downloaded if it is not there yet."""
    result = subprocess.run([find_go(), "mod", "download", "-json", f"{KIND_MODULE}@{KIND_VERSION}"],
                            capture_output=True, text=True, cwd="/")
    try:
        info = json.loads(result.stdout)
    except ValueError:
        info = {"Error": (result.stderr.strip() or "no output").splitlines()[-1]}
    if "Dir" not in info:
        raise BuildError(f"go mod download {KIND_MODULE}@{KIND_VERSION} failed: {info.get('Error')} (give this "
                         "machine access to the Go module proxy, or set GOPROXY to a mirror)")
    return Path(info["Dir"]) / "images" / "base" / "files"


def containerd_config() -> str:
    """The node's /etc/containerd/config.toml. Its `snapshotter = "overlayfs"` line is the one
    kind's entrypoint rewrites for filesystems overlayfs cannot sit on."""
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    runtimes = "".join(cri_runtime(RUNC, systemd_cgroup=True, name=name, base_runtime_spec=CRI_BASE_SPEC)
                       for name in ("runc", "test-handler"))  # test-handler: the RuntimeClass e2e tests ask for
    return f"""version = 2

[{cri}]
  sandbox_image = "{PAUSE_IMAGE}"
  tolerate_missing_hugepages_controller = true
  # Nodes may lack CAP_SYS_RESOURCE (no --privileged): containers then keep containerd's
  # oom_score_adj or higher instead of failing to lower it.
  restrict_oom_score_adj = true

[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"
{runtimes}[{cri}.cni]
  bin_dir = "/opt/cni/bin"
  conf_dir = "/etc/cni/net.d"
"""


def node_links() -> dict[str, str]:
    """Symlinks of the node: path -> target."""
    links = {
        "usr/local/bin/containerd": "/usr/bin/containerd",  # kind's containerd.service runs this path
        **{f"opt/cni/bin/{plugin}": f"{DEBIAN_CNI_DIR}/{plugin}" for plugin in CNI_PLUGINS},
        **{f"etc/systemd/system/multi-user.target.wants/{unit}": f"/etc/systemd/system/{unit}"
           for unit in ENABLED_UNITS},
        **{f"etc/systemd/system/{unit}": "/dev/null" for unit in MASKED_UNITS},
    }
    return links


def write_node_files(staging: Path, binaries: NodeBinaries, kind_files: Path) -> None:
    """Lay out the node's files under `staging` (a directory that becomes the image's `/`)."""
    staging.chmod(0o755)  # becomes `/`
    files: dict[str, tuple[bytes, int]] = {
        f"usr/bin/{KUBEADM}": (binaries.kubeadm.read_bytes(), 0o755),
        f"usr/bin/{KUBELET}": (binaries.kubelet.read_bytes(), 0o755),
        f"usr/bin/{KUBECTL}": (binaries.kubectl.read_bytes(), 0o755),
        RUNC.lstrip("/"): (binaries.runc.read_bytes(), 0o755),
        "etc/containerd/config.toml": (containerd_config().encode(), 0o644),
        "kind/version": (KUBERNETES_VERSION.encode(), 0o644),
    }
    for relative, mode in KIND_FILES.items():
        source = kind_files / relative
        if not source.is_file():
            raise BuildError(f"{source} is missing from {KIND_MODULE}@{KIND_VERSION}")
        files[relative] = (source.read_bytes(), mode)
    _write_tree(staging, files, node_links(), dirs=("etc/kubernetes/manifests", "etc/cni/net.d"))


def _write_tree(root: Path, files: Mapping[str, tuple[bytes, int]], links: Mapping[str, str],
                dirs: tuple[str, ...]) -> None:
    for relative in dirs:
        (root / relative).mkdir(mode=0o755, parents=True, exist_ok=True)
    for relative, (content, mode) in files.items():
        path = root / relative
        path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        path.write_bytes(content)
        os.chmod(path, mode)
    for relative, target in links.items():
        path = root / relative
        path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        path.symlink_to(target)
