"""Resource descriptors and URL paths. Objects themselves stay plain JSON dicts."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Resource:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def name(self) -> str:
        """`plural.group` (`pods`, `replicasets.apps`): a bounded label value and a readable id."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    def path(self, namespace: str | None = None, name: str | None = None, subresource: str | None = None) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        parts = [base]
        if self.namespaced and namespace:
            parts.append(f"namespaces/{namespace}")
        parts.append(self.plural)
        if name:
            parts.append(name)
            if subresource:
                parts.append(subresource)
        return "/".join(parts)


PODS = Resource("", "v1", "pods", "Pod")
NAMESPACES = Resource("", "v1", "namespaces", "Namespace", namespaced=False)
SERVICEACCOUNTS = Resource("", "v1", "serviceaccounts", "ServiceAccount")
CONFIGMAPS = Resource("", "v1", "configmaps", "ConfigMap")
SECRETS = Resource("", "v1", "secrets", "Secret")
EVENTS = Resource("", "v1", "events", "Event")
RESOURCEQUOTAS = Resource("", "v1", "resourcequotas", "ResourceQuota")
REPLICASETS = Resource("apps", "v1", "replicasets", "ReplicaSet")
DEPLOYMENTS = Resource("apps", "v1", "deployments", "Deployment")
LEASES = Resource("coordination.k8s.io", "v1", "leases", "Lease")
SERVICES = Resource("", "v1", "services", "Service")
NODES = Resource("", "v1", "nodes", "Node", namespaced=False)
JOBS = Resource("batch", "v1", "jobs", "Job")
CUSTOMRESOURCEDEFINITIONS = Resource(
    "apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", namespaced=False
)
APISERVICES = Resource("apiregistration.k8s.io", "v1", "apiservices", "APIService", namespaced=False)
CLUSTERROLES = Resource("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", namespaced=False)
CLUSTERROLEBINDINGS = Resource(
    "rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", namespaced=False
)
