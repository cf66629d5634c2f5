"""Find or build the real Kubernetes binaries of the local cluster.

`KUBEBUILDER_ASSETS` (the envtest convention) wins for what it holds; everything else is built
from the Go module shipped in `gomod/` (one `go build` for all that is missing, so they share
compiled packages) into a user-cache directory per Kubernetes version, where each binary is kept
while its wrapper and the modules it links are unchanged (see buildcache.py). The core
(kube-apiserver, etcd, kube-controller-manager, kubectl) is built on first use; kube-scheduler
only once a cluster with nodes is asked for; kubelet and kube-proxy only for a real node; kubeadm
only for the kind node image (kind/nodeimage.py), which takes all of them.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .buildcache import adopt_legacy, is_current, selected_modules, wrapper_hash, write_stamp
from .errors import BuildError
from .gobuild import build_dir, cache_dir, find_go, format_duration, is_executable, locked, publish, run_go

KUBERNETES_VERSION = "v1.36.3"
GOMOD_DIR = Path(__file__).parent / "gomod"
APISERVER, KCM, ETCD, KUBECTL = "kube-apiserver", "kube-controller-manager", "etcd", "kubectl"
SCHEDULER = "kube-scheduler"
KUBELET, KUBE_PROXY = "kubelet", "kube-proxy"
KUBEADM = "kubeadm"
NODE = (KUBELET, KUBE_PROXY)
CORE = (APISERVER, KCM, ETCD, KUBECTL)
EVERY = (*CORE, SCHEDULER, *NODE, KUBEADM)
LDFLAGS = " ".join(
    [
        "-s -w",
        f"-X k8s.io/component-base/version.gitVersion={KUBERNETES_VERSION}",
        "-X k8s.io/component-base/version.gitMajor=1",
        "-X k8s.io/component-base/version.gitMinor=36",
        f"-X k8s.io/client-go/pkg/version.gitVersion={KUBERNETES_VERSION}",
    ]
)


@dataclass(frozen=True)
class Binaries:
    apiserver: Path
    etcd: Path
    kcm: Path | None = None
    kubectl: Path | None = None
    scheduler: Path | None = None


def ensure_binaries(
    need_kcm: bool = False,
    log: Callable[[str], None] = print,
    need_kubectl: bool = False,
    need_scheduler: bool = False,
) -> Binaries:
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    if assets:
        return _from_assets(Path(assets), need_kcm, need_kubectl, need_scheduler, log)
    built = _ensure_built((*CORE, SCHEDULER) if need_scheduler else CORE, log)
    return Binaries(
        apiserver=built / APISERVER,
        etcd=built / ETCD,
        kcm=built / KCM,
        kubectl=built / KUBECTL,
        scheduler=built / SCHEDULER if need_scheduler else None,
    )


def _from_assets(
    assets: Path, need_kcm: bool, need_kubectl: bool, need_scheduler: bool, log: Callable[[str], None]
) -> Binaries:
    missing = [name for name in (APISERVER, ETCD) if not is_executable(assets / name)]
    if missing:
        raise BuildError(f"KUBEBUILDER_ASSETS={assets} has no executable {' or '.join(missing)}")
    # envtest assets hold kubectl at most, never the KCM or the scheduler: build what is needed and missing.
    wanted = {KCM: need_kcm, KUBECTL: need_kubectl, SCHEDULER: need_scheduler}
    to_build = tuple(name for name, needed in wanted.items() if needed and not is_executable(assets / name))
    built = _ensure_built(to_build, log) if to_build else None

    def optional(name: str) -> Path | None:
        if is_executable(assets / name):
            return assets / name
        return built / name if built is not None and name in to_build else None

    return Binaries(
        apiserver=assets / APISERVER,
        etcd=assets / ETCD,
        kcm=optional(KCM),
        kubectl=optional(KUBECTL),
        scheduler=optional(SCHEDULER),
    )


def cache_root() -> Path:
    return cache_dir() / "controlplane"


def _ensure_built(components: tuple[str, ...], log: Callable[[str], None]) -> Path:
    """The cache directory holding current builds of at least `components`, building what it lacks."""
    target = cache_root() / KUBERNETES_VERSION
    if not _missing(target, components):
        return target
    with locked(target.with_name(target.name + ".lock"), what=", ".join(components), log=log):
        # Another process may have built some of them while we waited for the lock.
        if missing := _missing(target, components, adopt=True):
            _build(target, missing, log)
    return target


def ensure_kubelet_and_proxy(log: Callable[[str], None] = print) -> tuple[Path, Path]:
    """kubelet and kube-proxy of a real node, built from the control plane's Go module."""
    built = _ensure_built(NODE, log)
    return built / KUBELET, built / KUBE_PROXY


def ensure_components(components: tuple[str, ...], log: Callable[[str], None] = print) -> dict[str, Path]:
    """Any of the module's binaries (names from EVERY) by name, building what is missing in one go."""
    if unknown := set(components) - set(EVERY):
        raise BuildError(f"no wrapper in {GOMOD_DIR} for {', '.join(sorted(unknown))}")
    built = _ensure_built(components, log)
    return {name: built / name for name in components}


def _missing(directory: Path, components: tuple[str, ...], adopt: bool = False) -> tuple[str, ...]:
    selection = selected_modules((GOMOD_DIR / "go.mod").read_text())
    missing = []
    for name in components:
        wrapper = wrapper_hash(GOMOD_DIR, name)
        if is_current(directory / name, wrapper, selection):
            continue
        if adopt and adopt_legacy(directory, name, wrapper, selection):
            continue
        missing.append(name)
    return tuple(missing)


def _build(target: Path, components: tuple[str, ...], log: Callable[[str], None]) -> None:
    go = find_go()
    log_path = target.with_name(target.name + ".build.log")
    names = ", ".join(components)
    log(
        f"building {names} {KUBERNETES_VERSION} from k8s.io/kubernetes: a one-time cost of several minutes "
        f"(about 10 on 2 cores for the control plane); log: {log_path}"
    )
    started = time.monotonic()
    target.mkdir(parents=True, exist_ok=True)
    with build_dir(target) as tmp:
        src, out = tmp / "src", tmp / "bin"
        # The installed package may be read-only and `go build -mod=mod` may rewrite go.sum.
        shutil.copytree(GOMOD_DIR, src)
        argv = [go, "build", "-v", "-trimpath", "-o", f"{out}/", "-ldflags", LDFLAGS, *(f"./{c}" for c in components)]
        run_go(argv, what=names, cwd=src, temp=tmp, log_path=log_path, log=log, env={"GOFLAGS": "-mod=mod"})
        if missing := [name for name in components if not is_executable(out / name)]:
            raise BuildError(f"go build finished without producing {', '.join(missing)}; see {log_path}")
        for name in components:
            publish(out / name, target / name)  # on disk before its stamp
            write_stamp(target / name, wrapper_hash(GOMOD_DIR, name))
    log(f"built {names} {KUBERNETES_VERSION} in {format_duration(time.monotonic() - started)} -> {target}")
