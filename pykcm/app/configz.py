"""What /configz shows: KCM's KubeControllerManagerConfiguration, for what pykcm is configured with.

KCM registers its whole component configuration (v1alpha1) under its group name; the secure port
serves it as JSON (pykcm/serving/zpages.py). pykcm fills the sections it acts on: Generic (the
client connection, leader election, the controllers list, profiling), KubeCloudShared (only its
UseServiceAccountCredentials), and the Namespace and ReplicaSet controllers' settings. The
sections of controllers pykcm does not run are left out rather than shown with values nothing reads.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pykcm.app.options import Options, RegisteredController
from pykcm.util.durations import go_duration

GROUP = "kubecontrollermanager.config.k8s.io"  # KCM's ConfigzName, its component config's group


def configz(opts: Options) -> dict[str, Any]:
    """{group: configuration}, keys in the order of KCM's Go structs."""
    return {
        GROUP: {
            "kind": "KubeControllerManagerConfiguration",
            "apiVersion": f"{GROUP}/v1alpha1",
            "Generic": {
                "Port": 0,  # the insecure port's, long gone: KCM shows its zero values too
                "Address": "0.0.0.0",
                "MinResyncPeriod": go_duration(opts.min_resync_period),
                "ClientConnection": {
                    "kubeconfig": opts.kubeconfig or "",
                    "acceptContentTypes": "",
                    "contentType": opts.kube_api_content_type,
                    "qps": _go_number(opts.kube_api_qps),
                    "burst": opts.kube_api_burst,
                },
                "ControllerStartInterval": "0s",
                "LeaderElection": {
                    "leaderElect": opts.leader_elect,
                    "leaseDuration": go_duration(opts.leader_elect_lease_duration),
                    "renewDeadline": go_duration(opts.leader_elect_renew_deadline),
                    "retryPeriod": go_duration(opts.leader_elect_retry_period),
                    "resourceLock": opts.leader_elect_resource_lock,
                    "resourceName": opts.leader_elect_resource_name,
                    "resourceNamespace": opts.leader_elect_resource_namespace,
                },
                "Controllers": opts.controllers,
                "Debugging": {"enableProfiling": opts.profiling, "enableContentionProfiling": False},
                "LeaderMigrationEnabled": False,
                "LeaderMigration": {"leaderName": "", "resourceLock": "", "controllerLeaders": None},
            },
            "KubeCloudShared": {"UseServiceAccountCredentials": opts.use_service_account_credentials},
            "NamespaceController": {
                "NamespaceSyncPeriod": go_duration(opts.namespace_sync_period),
                "ConcurrentNamespaceSyncs": opts.concurrent_namespace_syncs,
            },
            "ReplicaSetController": {"ConcurrentRSSyncs": opts.concurrent_replicaset_syncs},
        }
    }


def canonical_controllers(spec: Iterable[str], known: Iterable[RegisteredController],
                          other_aliases: Mapping[str, str] | None = None) -> list[str]:
    """The --controllers entries with each alias replaced by its controller's name, `-` kept, as
    KCM's options become its configuration (GenericControllerManagerConfigurationOptions.ApplyTo);
    `other_aliases` names the controllers pykcm leaves to KCM."""
    canonical = dict(other_aliases or {})
    canonical.update({alias: info.name for info in known for alias in (info.name, *info.aliases)})
    names = []
    for entry in spec:
        name = entry.removeprefix("-")
        names.append(entry[: len(entry) - len(name)] + canonical.get(name, name))
    return names


def _go_number(value: float) -> float | int:
    """Go's JSON writes a whole float as 20, Python's as 20.0."""
    return int(value) if value == int(value) else value
