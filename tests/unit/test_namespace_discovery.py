"""Unit tests for pykcm.client.discovery: preferred versions, partial failures, both document formats."""

from __future__ import annotations

from typing import Any

import pytest

from pykcm.client.discovery import (
    AGGREGATED_KIND,
    APIResource,
    APIResourceList,
    GroupDiscoveryFailed,
    GroupVersion,
    GroupVersionResource,
    StaleGroupVersion,
    filtered_by,
    group_version_resources,
    server_preferred_namespaced_resources,
    server_preferred_resources,
)
from pykcm.client.errors import NotFound, ServiceUnavailable, TransportError

ALL_VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]


class FakeDiscoveryClient:
    """Answers GETs from a path -> document (or exception) table and records the paths."""

    def __init__(self, docs: dict[str, Any]) -> None:
        self.docs = docs
        self.paths: list[str] = []
        self.options: list[dict[str, Any]] = []  # each request's keyword arguments

    async def request(self, method: str, path: str, **options: Any) -> Any:
        assert method == "GET"
        self.paths.append(path)
        self.options.append(options)
        answer = self.docs.get(path, NotFound(404, "NotFound", f"{path} not found"))
        if isinstance(answer, Exception):
            raise answer
        return answer


def agg_resource(name: str, kind: str, namespaced: bool = True, verbs: list[str] | None = None,
                 subresources: tuple[str, ...] = ()) -> dict[str, Any]:
    return {
        "resource": name,
        "responseKind": {"group": "", "version": "", "kind": kind},
        "scope": "Namespaced" if namespaced else "Cluster",
        "verbs": ALL_VERBS if verbs is None else verbs,
        "subresources": [
            {"subresource": s, "responseKind": {"group": "", "version": "", "kind": kind}, "verbs": ["get"]}
            for s in subresources
        ],
    }


def agg_group(name: str, *versions: tuple[str, list[dict[str, Any]], str]) -> dict[str, Any]:
    return {
        "metadata": {"name": name} if name else {},
        "versions": [{"version": v, "resources": res, "freshness": fresh} for v, res, fresh in versions],
    }


def agg_list(*groups: dict[str, Any]) -> dict[str, Any]:
    return {"kind": AGGREGATED_KIND, "apiVersion": "apidiscovery.k8s.io/v2", "items": list(groups)}


def aggregated_server(*apis_groups: dict[str, Any]) -> FakeDiscoveryClient:
    core = agg_group(
        "",
        ("v1", [agg_resource("pods", "Pod", subresources=("status",)), agg_resource("nodes", "Node", False),
                agg_resource("bindings", "Binding", verbs=["create"])], "Current"),
    )
    return FakeDiscoveryClient({"/api": agg_list(core), "/apis": agg_list(*apis_groups)})


def names(lists: list[APIResourceList]) -> dict[str, list[str]]:
    return {rl.group_version: sorted(r.name for r in rl.resources) for rl in lists}


async def test_aggregated_discovery_uses_two_requests_and_skips_subresources() -> None:
    client = aggregated_server(agg_group("apps", ("v1", [agg_resource("replicasets", "ReplicaSet")], "Current")))
    found = await server_preferred_resources(client)  # type: ignore[arg-type]
    assert client.paths == ["/api", "/apis"]
    assert found.error is None and found.failed == {}
    assert names(found.resources) == {"v1": ["bindings", "nodes", "pods"], "apps/v1": ["replicasets"]}


async def test_discovery_asks_as_client_go_does_and_reads_v2beta1_as_v2() -> None:
    client = aggregated_server(agg_group("apps", ("v1", [agg_resource("replicasets", "ReplicaSet")], "Current")))
    client.docs = {path: {**doc, "apiVersion": "apidiscovery.k8s.io/v2beta1"} for path, doc in client.docs.items()}
    found = await server_preferred_resources(client)  # type: ignore[arg-type]
    assert names(found.resources) == {"v1": ["bindings", "nodes", "pods"], "apps/v1": ["replicasets"]}
    assert client.paths == ["/api", "/apis"]
    # client-go's Accept order (discovery_client.go acceptDiscoveryFormats) and its 32 s timeout.
    assert [o["accept"] for o in client.options] == [
        "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,"
        "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json"] * 2
    assert {o["timeout"].total for o in client.options} == {32}


async def test_namespaced_filter_drops_cluster_scoped_resources() -> None:
    cluster_roles = agg_resource("clusterroles", "ClusterRole", namespaced=False)
    client = aggregated_server(agg_group("rbac", ("v1", [cluster_roles], "Current")))
    found = await server_preferred_namespaced_resources(client)  # type: ignore[arg-type]
    assert names(found.resources) == {"v1": ["bindings", "pods"]}  # the emptied rbac list is dropped


async def test_preferred_version_wins_and_other_versions_keep_their_own_resources() -> None:
    client = aggregated_server(
        agg_group(
            "autoscaling",
            ("v2", [agg_resource("horizontalpodautoscalers", "HPA")], "Current"),
            ("v1", [agg_resource("horizontalpodautoscalers", "HPA"), agg_resource("legacyonly", "L")], "Current"),
        )
    )
    found = await server_preferred_resources(client)  # type: ignore[arg-type]
    result = names(found.resources)
    assert result["autoscaling/v2"] == ["horizontalpodautoscalers"]
    assert result["autoscaling/v1"] == ["legacyonly"]  # served only there, so its first version counts


async def test_stale_group_version_is_reported_and_the_rest_returned() -> None:
    client = aggregated_server(
        agg_group("metrics.example.com", ("v1", [], "Stale")),
        agg_group("apps", ("v1", [agg_resource("replicasets", "ReplicaSet")], "Current")),
    )
    found = await server_preferred_namespaced_resources(client)  # type: ignore[arg-type]
    assert "apps/v1" in names(found.resources)
    assert isinstance(found.error, GroupDiscoveryFailed)
    gv = GroupVersion("metrics.example.com", "v1")
    assert list(found.failed) == [gv] and isinstance(found.failed[gv], StaleGroupVersion)
    assert str(found.error) == (
        "unable to retrieve the complete list of server APIs: "
        "metrics.example.com/v1: stale GroupVersion discovery: metrics.example.com/v1"
    )


async def test_stale_version_is_not_the_preferred_one() -> None:
    client = aggregated_server(
        agg_group("x.io", ("v2", [], "Stale"), ("v1", [agg_resource("things", "Thing")], "Current"))
    )
    found = await server_preferred_resources(client)  # type: ignore[arg-type]
    assert names(found.resources)["x.io/v1"] == ["things"]


async def test_resource_without_kind_is_dropped() -> None:
    nameless = agg_resource("ghosts", "")
    nameless["responseKind"] = {"group": "", "version": "", "kind": ""}
    client = aggregated_server(agg_group("x.io", ("v1", [nameless, agg_resource("things", "Thing")], "Current")))
    found = await server_preferred_resources(client)  # type: ignore[arg-type]
    assert names(found.resources)["x.io/v1"] == ["things"]


def legacy_server(extra: dict[str, Any] | None = None) -> FakeDiscoveryClient:
    docs: dict[str, Any] = {
        "/api": {"kind": "APIVersions", "versions": ["v1"]},
        "/apis": {
            "kind": "APIGroupList",
            "groups": [
                {"name": "apps", "versions": [{"groupVersion": "apps/v1", "version": "v1"}],
                 "preferredVersion": {"groupVersion": "apps/v1", "version": "v1"}},
                {"name": "metrics.k8s.io",
                 "versions": [{"groupVersion": "metrics.k8s.io/v1beta1", "version": "v1beta1"}],
                 "preferredVersion": {"groupVersion": "metrics.k8s.io/v1beta1", "version": "v1beta1"}},
            ],
        },
        "/api/v1": {"kind": "APIResourceList", "groupVersion": "v1", "resources": [
            {"name": "pods", "namespaced": True, "kind": "Pod", "verbs": ALL_VERBS},
            {"name": "pods/log", "namespaced": True, "kind": "Pod", "verbs": ["get"]},
        ]},
        "/apis/apps/v1": {"kind": "APIResourceList", "groupVersion": "apps/v1", "resources": [
            {"name": "replicasets", "namespaced": True, "kind": "ReplicaSet", "verbs": ALL_VERBS},
        ]},
        "/apis/metrics.k8s.io/v1beta1": ServiceUnavailable(503, "ServiceUnavailable",
                                                            "the server is currently unable to handle the request"),
    }
    docs.update(extra or {})
    return FakeDiscoveryClient(docs)


async def test_legacy_discovery_fetches_each_group_version_and_collects_failures() -> None:
    client = legacy_server()
    found = await server_preferred_namespaced_resources(client)  # type: ignore[arg-type]
    assert sorted(client.paths[2:]) == ["/api/v1", "/apis/apps/v1", "/apis/metrics.k8s.io/v1beta1"]
    assert {o["timeout"].total for o in client.options} == {32}  # a hanging group version fails after 32 s
    assert names(found.resources) == {"v1": ["pods"], "apps/v1": ["replicasets"]}
    assert str(found.error) == (
        "unable to retrieve the complete list of server APIs: "
        "metrics.k8s.io/v1beta1: the server is currently unable to handle the request"
    )


async def test_failure_of_the_root_documents_raises() -> None:
    client = legacy_server({"/apis": TransportError("GET /apis: connection refused")})
    with pytest.raises(TransportError):
        await server_preferred_resources(client)  # type: ignore[arg-type]


async def test_missing_core_group_is_tolerated() -> None:
    client = FakeDiscoveryClient({"/apis": agg_list(agg_group("x.io", ("v1", [agg_resource("t", "T")], "Current")))})
    found = await server_preferred_resources(client)  # type: ignore[arg-type]
    assert names(found.resources) == {"x.io/v1": ["t"]}


def test_group_version_parsing_and_formatting() -> None:
    assert GroupVersion.parse("v1") == GroupVersion("", "v1")
    assert GroupVersion.parse("apps/v1") == GroupVersion("apps", "v1")
    assert str(GroupVersion("", "v1")) == "v1" and str(GroupVersion("apps", "v1")) == "apps/v1"
    with pytest.raises(ValueError, match="unexpected GroupVersion string: a/b/c"):
        GroupVersion.parse("a/b/c")
    assert str(GroupVersionResource("", "v1", "pods")) == "/v1, Resource=pods"
    assert GroupVersionResource("apps", "v1", "replicasets").as_resource().path("ns") == (
        "/apis/apps/v1/namespaces/ns/replicasets"
    )


def test_filtered_by_and_group_version_resources() -> None:
    lists = [
        APIResourceList("v1", [APIResource("pods", "Pod", True, frozenset({"delete", "list"})),
                               APIResource("bindings", "Binding", True, frozenset({"create"}))]),
        APIResourceList("apps/v1", [APIResource("x", "X", True, frozenset({"create"}))]),
    ]
    deletable = filtered_by(lambda _gv, r: r.supports("delete"), lists)
    assert [rl.group_version for rl in deletable] == ["v1"]
    assert list(group_version_resources(deletable)) == [GroupVersionResource("", "v1", "pods")]
    with pytest.raises(ValueError):
        group_version_resources([APIResourceList("a/b/c", [APIResource("x")])])
