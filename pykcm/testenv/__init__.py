"""The real local control plane (etcd, kube-apiserver, optionally kube-controller-manager) for
tests and `pykcm run --local`."""

from .build import Binaries, BuildError, ControlPlaneError, ensure_binaries
from .controlplane import ControlPlane, ManagedProcess, running, start, stop

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
