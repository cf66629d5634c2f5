"""runc for the real node and the kind node image: v1.5.2 with seccomp, built from its Go module,
since Debian's 1.1.5 fails every pod sandbox here ("can't get final child's PID from pipe")."""

from __future__ import annotations

from pathlib import Path

from .gobuild import ensure_go_install, go_install_path, is_executable
from .progress import Log

RUNC_PACKAGE, RUNC_VERSION = "github.com/opencontainers/runc", "v1.5.2"
_TAGS = ("seccomp",)
# (Debian package, a file it installs) that the build needs, until runc is cached.
RUNC_BUILD_PACKAGES = (
    ("gcc", "/usr/bin/gcc"),
    ("libseccomp-dev", "/usr/include/seccomp.h"),
    ("pkg-config", "/usr/bin/pkg-config"),
)


def cri_runtime(runc: str | Path, *, systemd_cgroup: bool, name: str = "runc", base_runtime_spec: str = "") -> str:
    """The containerd (config version 2) CRI runtime `name` that runs `runc`, for either node."""
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    spec = f'\n  base_runtime_spec = "{base_runtime_spec}"' if base_runtime_spec else ""
    return f"""[{cri}.containerd.runtimes.{name}]
  runtime_type = "io.containerd.runc.v2"{spec}
[{cri}.containerd.runtimes.{name}.options]
  BinaryName = "{runc}"
  SystemdCgroup = {str(systemd_cgroup).lower()}
"""


def ensure_runc(log: Log) -> Path:
    return ensure_go_install(RUNC_PACKAGE, RUNC_VERSION, log=log, cgo=True, tags=_TAGS)


def cached_runc() -> bool:
    return is_executable(go_install_path(RUNC_PACKAGE, RUNC_VERSION, tags=_TAGS))
