"""The real local control plane (etcd, kube-apiserver, optionally kube-controller-manager) for
tests and `pykcm run --local`."""

from .build import Binaries, ensure_binaries
from .controlplane import ControlPlane, running, start, stop
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
