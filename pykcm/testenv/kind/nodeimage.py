"""Assemble the kind node image offline, for air-gapped machines and CI: kind's own
`kind build node-image` pulls etcd, CoreDNS, pause and kindnetd from registries, which are not
reachable here. Where they are, the official node image (kindest/node) is the one to use.

Every input is built or found by what the project already has, each cached on its own: the
Kubernetes binaries from the control plane's Go module (build.py), runc (runc.py), CoreDNS and
pause (preload.py), the Debian root (noderoot.py, debootstrap), kind's node files from its Go
module (nodefiles.py). The image is tagged with a digest of all of them, so it is assembled only
when one changes, and only a finished image gets that tag: a failed build leaves nothing behind.

Assembly runs one container of the Debian root on the private Docker engine (host network, no
bridge): it copies the node's files in, starts the node's own containerd to import the preloaded
images into the `k8s.io` namespace (unpacked later, in the running node), writes containerd's
base OCI spec as kind does, and is committed with kind's entrypoint.
"""

from __future__ import annotations

import hashlib
import subprocess
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import baseimage, docker, images
from ..build import (
    APISERVER,
    ETCD,
    KCM,
    KUBE_PROXY,
    KUBEADM,
    KUBECTL,
    KUBELET,
    KUBERNETES_VERSION,
    SCHEDULER,
    ensure_components,
)
from ..docker import DockerEngine
from ..errors import BuildError
from ..gobuild import cache_dir, ensure_go_install, find_go, locked
from ..images import BUSYBOX, BUSYBOX_PACKAGE, is_static
from ..progress import Log, format_duration, run_with_progress
from ..runc import RUNC_BUILD_PACKAGES, cached_runc, ensure_runc
from . import noderoot, preload
from .nodefiles import (
    IMAGE_CHANGES,
    KIND_MODULE,
    KIND_VERSION,
    STOP_SIGNAL,
    NodeBinaries,
    containerd_config,
    kind_files_dir,
    write_node_files,
)

REPOSITORY = "pykcm-local/kind-node"
COMPONENTS = (APISERVER, KCM, SCHEDULER, KUBE_PROXY, ETCD, KUBEADM, KUBELET, KUBECTL)
# The code that lays out the node and its images: a change to it makes a new image.
# cluster.py runs clusters from the image and is no part of it.
SOURCES = (*sorted(p for p in Path(__file__).parent.glob("*.py") if p.name != "cluster.py"), Path(images.__file__))
IMPORT_DONE = "pykcm-imported "
LISTING = "pykcm-image "
_NODE_MOUNT, _PRELOAD_MOUNT = "/tmp/pykcm-node", "/tmp/pykcm-preload"  # /tmp: kind mounts a tmpfs over it
# Runs in the Debian root: the node's own containerd (without its CRI side) writes its image store.
_ASSEMBLE = f"""set -euo pipefail
cp -a {_NODE_MOUNT}/. /
printf 'version = 2\\ndisabled_plugins = ["io.containerd.grpc.v1.cri"]\\n' > /tmp/pykcm-import.toml
containerd --config /tmp/pykcm-import.toml > /tmp/pykcm-containerd.log 2>&1 &
containerd=$!
for _ in $(seq 100); do ctr version > /dev/null 2>&1 && break; sleep 0.2; done
ctr version > /dev/null || {{ tail -5 /tmp/pykcm-containerd.log; exit 1; }}
for archive in {_PRELOAD_MOUNT}/*.tar; do
  ctr -n k8s.io images import --no-unpack "$archive" > /dev/null
  echo "{IMPORT_DONE}$archive"
done
hook='{{"path": "/kind/bin/mount-product-files.sh"}}'
ctr oci spec | jq ".hooks.createContainer += [$hook] | del(.process.rlimits)" > /etc/containerd/cri-base.json
ctr -n k8s.io images ls -q | sed 's/^/{LISTING}/'
kill "$containerd"
wait "$containerd" || true
rm -rf /run/containerd /tmp/pykcm-import.toml /tmp/pykcm-containerd.log
"""


@dataclass(frozen=True)
class Inputs:
    base: str  # the Debian root's image
    rootfs_tar: Path
    binaries: Mapping[str, Path]
    runc: Path
    coredns: Path
    pause: Path
    kind_files: Path


def missing_prerequisites() -> list[str]:
    """One line per missing prerequisite, all checked before any long work: root and docker.io,
    debootstrap, a static busybox, Go (kind's files come from its module), and the Debian packages of
    the C builds until their results are cached (runc's, as the real node checks them, and pause's)."""
    missing = docker.missing_prerequisites() + baseimage.missing_prerequisites()
    if not BUSYBOX.exists() or not is_static(BUSYBOX):
        missing.append(f"{BUSYBOX} is not a static busybox (kube-proxy's image runs it): "
                       f"apt-get install {BUSYBOX_PACKAGE}")
    wanted = [] if cached_runc() else list(RUNC_BUILD_PACKAGES)
    if not preload.cached_pause():
        wanted += preload.PAUSE_BUILD_PACKAGES
    if packages := " ".join(dict.fromkeys(package for package, path in wanted if not Path(path).exists())):
        missing.append(f"building runc and pause needs the Debian packages {packages}: apt-get install {packages}")
    try:
        find_go()
    except BuildError as err:
        missing.append(str(err))
    return missing


def default_docker_directory() -> Path:
    """The private engine's directory for kind: not the default one, whose lock image tests take."""
    return docker.default_directory("kind")


def ensure_node_image(log: Log = print, engine: DockerEngine | None = None) -> str:
    """The reference of a current kind node image for KUBERNETES_VERSION in the private engine,
    assembling it if an input changed; `engine` defaults to one started in the kind directory."""
    if missing := missing_prerequisites():
        raise BuildError("; ".join(missing))
    if engine is not None:
        return _ensure(engine, log)
    with docker.running(default_docker_directory(), log=log) as started:
        return _ensure(started, log)


def ensure_kind(log: Log = print) -> Path:
    """The `kind` binary of the version whose node files the image holds, built from its module."""
    return ensure_go_install(KIND_MODULE, KIND_VERSION, log=log)


def image_size(engine: DockerEngine, reference: str) -> int:
    return int(engine.docker("image", "inspect", "--format", "{{.Size}}", reference).stdout.strip())


def gather_inputs(engine: DockerEngine, log: Log) -> Inputs:
    """Everything the image is made of, built where missing (each cached on its own)."""
    return Inputs(base=noderoot.ensure_base(engine, log=log), **build_inputs(log))


def build_inputs(log: Log) -> dict[str, Any]:
    """The inputs that need no engine (the Debian root's tarball, the Go and C builds, kind's
    files), built where missing: what a test session builds ahead, in the background. The
    Kubernetes binaries come last, so that a session's own build of them usually has their lock first."""
    return {
        "rootfs_tar": noderoot.rootfs_tarball(log),
        "coredns": ensure_go_install(preload.COREDNS_PACKAGE, preload.COREDNS_VERSION, log=log),
        "pause": preload.ensure_pause(log),
        "runc": ensure_runc(log),
        "kind_files": kind_files_dir(),
        "binaries": ensure_components(COMPONENTS, log),
    }


def input_parts(inputs: Inputs) -> dict[str, bytes]:
    """What identifies each input: the build stamps of the Kubernetes binaries (wrapper and
    modules), the cache paths of the tools (they name version and options), the content of
    kind's files, and this package's code (which writes the rest)."""
    parts = {name: _stamp(path) for name, path in inputs.binaries.items()}
    parts.update({
        "base": inputs.base.encode(),
        "runc": str(inputs.runc).encode(),
        "coredns": str(inputs.coredns).encode(),
        "pause": str(inputs.pause).encode(),
        "containerd.toml": containerd_config().encode(),  # partly rendered outside this package (runc.py)
    })
    parts.update({f"source:{path.name}": path.read_bytes() for path in SOURCES})
    for path in sorted(inputs.kind_files.rglob("*")):
        if path.is_file():
            parts[f"kind:{path.relative_to(inputs.kind_files)}"] = path.read_bytes()
    return parts


def input_digest(parts: Mapping[str, bytes]) -> str:
    sha = hashlib.sha256()
    for name in sorted(parts):
        sha.update(name.encode() + b"\0" + hashlib.sha256(parts[name]).digest())
    return sha.hexdigest()[:12]


def image_reference(digest: str, version: str = KUBERNETES_VERSION) -> str:
    """`pykcm-local/kind-node:v1.36.3-<digest>`: kind's `--image` takes it as it is."""
    return f"{REPOSITORY}:{version}-{digest}"


def _stamp(binary: Path) -> bytes:
    try:
        return binary.with_name(binary.name + ".stamp").read_bytes()
    except OSError:
        raise BuildError(f"{binary} has no build stamp; remove it to rebuild it") from None


def _ensure(engine: DockerEngine, log: Log) -> str:
    inputs = gather_inputs(engine, log)
    reference = image_reference(input_digest(input_parts(inputs)))
    if engine.image_exists(reference):
        log(f"kind node image {reference} is current")
        return reference
    work = cache_dir() / "kind"
    work.mkdir(parents=True, exist_ok=True)
    with locked(work / "node-image.lock", what="the kind node image", log=log):
        if not engine.image_exists(reference):
            _assemble(engine, inputs, reference, work, log)
    return reference


def _assemble(engine: DockerEngine, inputs: Inputs, reference: str, work: Path, log: Log) -> None:
    started = time.monotonic()
    log(f"assembling the kind node image {reference} (Kubernetes {KUBERNETES_VERSION}, kind {KIND_VERSION})")
    _check_kubeadm_images(inputs.binaries[KUBEADM])
    with tempfile.TemporaryDirectory(prefix=".build-", dir=work) as tmp:
        staging, preload_dir = Path(tmp) / "node", Path(tmp) / "preload"
        staging.mkdir()
        preload_dir.mkdir()
        node_binaries = NodeBinaries(inputs.binaries[KUBEADM], inputs.binaries[KUBELET], inputs.binaries[KUBECTL],
                                     inputs.runc)
        write_node_files(staging, node_binaries, inputs.kind_files)
        archives = [preload.write_archive(image, preload_dir)
                    for image in preload.all_images(inputs.binaries, inputs.coredns, inputs.pause, inputs.rootfs_tar)]
        log(f"  wrote the node's files and {len(archives)} images ({_size(Path(tmp)) / 2**20:.0f} MiB) "
            f"in {format_duration(time.monotonic() - started)}")
        container = engine.docker(
            # The container's stop signal is the committed image's.
            "create", "--network=host", f"--stop-signal={STOP_SIGNAL}", f"--volume={staging}:{_NODE_MOUNT}:ro",
            f"--volume={preload_dir}:{_PRELOAD_MOUNT}:ro", "--entrypoint=/bin/bash", inputs.base, "-c", _ASSEMBLE,
        ).stdout.strip()
        try:
            listed = _run_assembly(engine, container, len(archives), work / "node-image.assemble.log", log)
            if missing := sorted(set(preload.kubeadm_images()) - set(listed)):
                raise BuildError(f"the node's containerd lacks {', '.join(missing)} after the import")
            changes = [arg for change in (*IMAGE_CHANGES, f"LABEL io.pykcm.kind-node.inputs={reference}")
                       for arg in ("--change", change)]
            engine.docker("commit", *changes, container, reference, timeout=900)
        finally:
            engine.docker("rm", "--force", "--volumes", container, check=False)
    _remove_older(engine, reference, log)
    size = image_size(engine, reference)
    log(f"assembled {reference} ({size / 1e6:.0f} MB) in {format_duration(time.monotonic() - started)}")


def _check_kubeadm_images(kubeadm: Path) -> None:
    """The build preloads what kubeadm asks for: a new Kubernetes version must update preload.py."""
    argv = [str(kubeadm), "config", "images", "list", "--kubernetes-version", KUBERNETES_VERSION]
    wanted = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=60).stdout.split()
    if tuple(wanted) != preload.kubeadm_images():
        raise BuildError(f"kubeadm {KUBERNETES_VERSION} asks for {', '.join(wanted)}; preload.py makes "
                         f"{', '.join(preload.kubeadm_images())}: update preload.py's versions")


def _run_assembly(engine: DockerEngine, container: str, total: int, log_path: Path, log: Log) -> list[str]:
    imported: list[str] = []
    listed: list[str] = []

    def on_line(line: str) -> None:
        if line.startswith(IMPORT_DONE):
            imported.append(line)
        elif line.startswith(LISTING):
            listed.append(line[len(LISTING):].strip())

    # Interrupted, the CLI is killed at once: it forwards a SIGTERM to the container, whose PID 1 (bash)
    # ignores it; the container is removed after.
    run_with_progress([docker.docker_cli(), "start", "--attach", container], what="node image assembly",
                      log_path=log_path, log=log, env=engine.env(), on_line=on_line, stop_grace=0,
                      status=lambda: f"{len(imported)} of {total} images imported into the node's containerd")
    return listed


def _remove_older(engine: DockerEngine, keep: str, log: Log) -> None:
    """Drop node images of earlier inputs (about a gigabyte each)."""
    tags = engine.docker("image", "ls", REPOSITORY, "--format", "{{.Repository}}:{{.Tag}}").stdout.split()
    older = [tag for tag in tags if tag != keep]
    if older:
        engine.docker("rmi", *older, check=False)
        log(f"  removed older kind node images: {', '.join(older)}")


def _size(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file() and not p.is_symlink())

