"""Find or build the real kube-apiserver, kube-controller-manager, etcd and kubectl binaries.

`KUBEBUILDER_ASSETS` (the envtest convention) wins; otherwise the Go module shipped in
`gomod/` is built once per content hash into the user cache.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

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


class ControlPlaneError(Exception):
    """Any local control plane failure; the message's first line is meant for the user."""


class BuildError(ControlPlaneError):
    """The binaries could not be found or built."""


@dataclass(frozen=True)
class Binaries:
    apiserver: Path
    etcd: Path
    kcm: Path | None = None
    kubectl: Path | None = None


def ensure_binaries(
    need_kcm: bool = False, log: Callable[[str], None] = print, need_kubectl: bool = False
) -> Binaries:
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    if assets:
        return _from_assets(Path(assets), need_kcm, need_kubectl, log)
    built = _ensure_built(log)
    return Binaries(apiserver=built / APISERVER, etcd=built / ETCD, kcm=built / KCM, kubectl=built / KUBECTL)


def _from_assets(assets: Path, need_kcm: bool, need_kubectl: bool, log: Callable[[str], None]) -> Binaries:
    missing = [name for name in (APISERVER, ETCD) if not _is_executable(assets / name)]
    if missing:
        raise BuildError(f"KUBEBUILDER_ASSETS={assets} has no executable {' or '.join(missing)}")

    def optional(name: str, needed: bool) -> Path | None:
        # envtest assets usually hold kubectl but never the KCM; build what is needed and missing.
        if _is_executable(assets / name):
            return assets / name
        return _ensure_built(log) / name if needed else None

    return Binaries(
        apiserver=assets / APISERVER,
        etcd=assets / ETCD,
        kcm=optional(KCM, need_kcm),
        kubectl=optional(KUBECTL, need_kubectl),
    )


def _is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "pykcm" / "controlplane"


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
    root.mkdir(parents=True, exist_ok=True)
    with _locked(target.with_name(target.name + ".lock")):
        # Another process may have finished the build while we waited for the lock.
        if not _complete(target):
            _build(target, log)
    return target


def _complete(directory: Path) -> bool:
    return all(_is_executable(directory / name) for name in COMPONENTS)


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _build(target: Path, log: Callable[[str], None]) -> None:
    go = shutil.which("go")
    if go is None:
        raise BuildError(
            "the Go toolchain (go >= 1.26) is not on PATH: install it, or set KUBEBUILDER_ASSETS "
            "to a directory holding kube-apiserver and etcd"
        )
    log_path = target.with_name(target.name + ".build.log")
    log(
        f"building {', '.join(COMPONENTS)} {KUBERNETES_VERSION} from k8s.io/kubernetes "
        f"(first run, takes a while)... log: {log_path}"
    )
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=".build-", dir=target.parent) as tmp:
        src, out = Path(tmp) / "src", Path(tmp) / "bin"
        # The installed package may be read-only and `go build -mod=mod` may rewrite go.sum.
        shutil.copytree(GOMOD_DIR, src)
        _run_go(go, src, out, log_path)
        if not _complete(out):
            raise BuildError(f"go build finished without producing all of {', '.join(COMPONENTS)}; see {log_path}")
        os.replace(out, target)
    log(f"built {KUBERNETES_VERSION} control plane in {_duration(time.monotonic() - started)} -> {target}")


def _run_go(go: str, src: Path, out: Path, log_path: Path) -> None:
    cmd = [go, "build", "-trimpath", "-o", f"{out}/", "-ldflags", _LDFLAGS, *(f"./{c}" for c in COMPONENTS)]
    env = {**os.environ, "GOFLAGS": "-mod=mod"}
    with open(log_path, "w") as log_file:
        log_file.write(" ".join(cmd) + "\n")
        log_file.flush()
        result = subprocess.run(cmd, cwd=src, env=env, stdout=log_file, stderr=subprocess.STDOUT, check=False)
    if result.returncode != 0:
        raise BuildError(
            f"go build of the control plane failed (exit {result.returncode}): {_last_line(log_path)}; "
            f"full output in {log_path}"
        )


def _last_line(path: Path) -> str:
    lines = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{seconds:.1f}s"
