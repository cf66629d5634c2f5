"""Find or build the real kube-apiserver, kube-controller-manager, etcd and kubectl binaries.

`KUBEBUILDER_ASSETS` (the envtest convention) wins; otherwise the Go module shipped in
`gomod/` is built once per content hash into the user cache.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .errors import BuildError
from .gobuild import cache_dir, find_go, format_duration, is_executable, locked, run_go

KUBERNETES_VERSION = "v1.36.3"
GOMOD_DIR = Path(__file__).parent / "gomod"
APISERVER, KCM, ETCD, KUBECTL = "kube-apiserver", "kube-controller-manager", "etcd", "kubectl"
COMPONENTS = (APISERVER, KCM, ETCD, KUBECTL)
_LDFLAGS = " ".join(
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


def ensure_binaries(need_kcm: bool = False, log: Callable[[str], None] = print, need_kubectl: bool = False) -> Binaries:
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    if assets:
        return _from_assets(Path(assets), need_kcm, need_kubectl, log)
    built = _ensure_built(log)
    return Binaries(apiserver=built / APISERVER, etcd=built / ETCD, kcm=built / KCM, kubectl=built / KUBECTL)


def _from_assets(assets: Path, need_kcm: bool, need_kubectl: bool, log: Callable[[str], None]) -> Binaries:
    missing = [name for name in (APISERVER, ETCD) if not is_executable(assets / name)]
    if missing:
        raise BuildError(f"KUBEBUILDER_ASSETS={assets} has no executable {' or '.join(missing)}")

    def optional(name: str, needed: bool) -> Path | None:
        # envtest assets usually hold kubectl but never the KCM; build what is needed and missing.
        if is_executable(assets / name):
            return assets / name
        return _ensure_built(log) / name if needed else None

    return Binaries(
        apiserver=assets / APISERVER,
        etcd=assets / ETCD,
        kcm=optional(KCM, need_kcm),
        kubectl=optional(KUBECTL, need_kubectl),
    )


def cache_root() -> Path:
    return cache_dir() / "controlplane"


def _source_files() -> list[Path]:
    files = [GOMOD_DIR / "go.mod", GOMOD_DIR / "go.sum", *GOMOD_DIR.glob("*/*.go")]
    return sorted(files)


def source_hash() -> str:
    digest = hashlib.sha256()
    for path in _source_files():
        digest.update(path.relative_to(GOMOD_DIR).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def _ensure_built(log: Callable[[str], None]) -> Path:
    root = cache_root()
    target = root / f"{KUBERNETES_VERSION}-{source_hash()}"
    if _complete(target):
        return target
    with locked(target.with_name(target.name + ".lock")):
        # Another process may have finished the build while we waited for the lock.
        if not _complete(target):
            _build(target, log)
    return target


def _complete(directory: Path) -> bool:
    return all(is_executable(directory / name) for name in COMPONENTS)


def _build(target: Path, log: Callable[[str], None]) -> None:
    go = find_go()
    log_path = target.with_name(target.name + ".build.log")
    log(
        f"building {', '.join(COMPONENTS)} {KUBERNETES_VERSION} from k8s.io/kubernetes: a one-time cost of "
        f"several minutes (about 9 on 2 cores); log: {log_path}"
    )
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=".build-", dir=target.parent) as tmp:
        src, out = Path(tmp) / "src", Path(tmp) / "bin"
        # The installed package may be read-only and `go build -mod=mod` may rewrite go.sum.
        shutil.copytree(GOMOD_DIR, src)
        argv = [go, "build", "-v", "-trimpath", "-o", f"{out}/", "-ldflags", _LDFLAGS, *(f"./{c}" for c in COMPONENTS)]
        run_go(argv, what="the control plane", cwd=src, log_path=log_path, log=log, env={"GOFLAGS": "-mod=mod"})
        if not _complete(out):
            raise BuildError(f"go build finished without producing all of {', '.join(COMPONENTS)}; see {log_path}")
        os.replace(out, target)
    log(f"built {KUBERNETES_VERSION} control plane in {format_duration(time.monotonic() - started)} -> {target}")
