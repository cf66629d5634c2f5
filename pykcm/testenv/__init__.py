"""Dev tooling: the local cluster for tests and `pykcm run --local` — etcd and kube-apiserver,
optionally with nodes (kube-controller-manager running every controller pykcm does not,
kube-scheduler, kwok), all built from their Go modules; and pykcm's container image, built by a
private Docker engine on a local Debian base (docker.py, baseimage.py, image.py)."""

from .build import Binaries, ensure_binaries
from .cluster import running, start, stop
from .controlplane import ControlPlane
from .errors import BuildError, ControlPlaneError
from .processes import ManagedProcess

__all__ = [
    "Binaries",
    "BuildError",
    "ControlPlane",
    "ControlPlaneError",
    "ManagedProcess",
    "ensure_binaries",
    "running",
    "start",
    "stop",
]
