"""The ReplicaSet controller (KCM's `replicaset-controller`)."""

from .controller import ReplicaSetController

__all__ = ["ReplicaSetController"]
