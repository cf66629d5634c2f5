"""API discovery: which resources the server serves, at which preferred version, with which verbs.

client-go's ``discovery`` package for the calls controllers make (the namespace controller
today; the garbage collector and quota controllers need the same):

- ``server_preferred_resources`` / ``server_preferred_namespaced_resources`` mirror
  ``ServerPreferredResources`` / ``ServerPreferredNamespacedResources``: every resource (no
  subresources) at its group's preferred version, CRDs and aggregated APIs included.
- Aggregated discovery (``apidiscovery.k8s.io/v2``, or ``v2beta1``, on ``/api`` and ``/apis``, two
  requests) is used when the server offers it; otherwise each group version is fetched on its own.
  Each request may take 32 s, as client-go's.
- A group version that cannot be discovered (marked stale in aggregated discovery, e.g. an
  APIService whose backend is down, or an error when fetched) does not fail the call: the result
  carries everything that was found *and* a ``GroupDiscoveryFailed`` naming the failed group
  versions, like client-go's ``ErrGroupDiscoveryFailed``. Only a failure of ``/api`` or ``/apis``
  themselves raises (the client's ``ApiError``/``TransportError``).
- ``filtered_by`` and ``group_version_resources`` are client-go's ``FilteredBy`` and
  ``GroupVersionResources``.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from pykcm.client.errors import ApiError, NotFound, TransportError
from pykcm.client.resources import Resource
from pykcm.client.rest import JSON, REQUEST_TIMEOUT, RestClient

AGGREGATED_DISCOVERY_V2 = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
# Same schema as v2, so read alike (by kind); asked for after v2 as client-go does.
AGGREGATED_DISCOVERY_V2BETA1 = "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList"
# Aggregated first; a server without it answers with the legacy documents.
DISCOVERY_ACCEPT = f"{AGGREGATED_DISCOVERY_V2},{AGGREGATED_DISCOVERY_V2BETA1},{JSON}"
# client-go's discovery timeout (its config sets none for KCM): a hanging group fails sooner than 60 s.
DISCOVERY_TIMEOUT = dataclasses.replace(REQUEST_TIMEOUT, total=32)
AGGREGATED_KIND = "APIGroupDiscoveryList"
STALE = "Stale"


@dataclass(frozen=True, order=True)
class GroupVersion:
    group: str
    version: str

    def __str__(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @classmethod
    def parse(cls, text: str) -> GroupVersion:
        """apimachinery's ParseGroupVersion: `v1` is the core group, `apps/v1` a named one."""
        if text in ("", "/"):
            return cls("", "")
        if text.count("/") > 1:
            raise ValueError(f"unexpected GroupVersion string: {text}")
        group, _, version = text.rpartition("/")
        return cls(group, version)


@dataclass(frozen=True, order=True)
class GroupVersionResource:
    group: str
    version: str
    resource: str

    def __str__(self) -> str:
        # apimachinery's format, which KCM puts into messages: "/v1, Resource=pods"
        return f"{self.group}/{self.version}, Resource={self.resource}"

    def as_resource(self, kind: str = "", namespaced: bool = True) -> Resource:
        """A client Resource for building request paths."""
        return Resource(self.group, self.version, self.resource, kind, namespaced)


@dataclass(frozen=True)
class APIResource:
    name: str  # plural, or `plural/subresource`
    kind: str = ""
    namespaced: bool = False
    verbs: frozenset[str] = frozenset()

    def supports(self, *verbs: str) -> bool:
        return all(verb in self.verbs for verb in verbs)


@dataclass
class APIResourceList:
    group_version: str
    resources: list[APIResource] = field(default_factory=list)


class StaleGroupVersion(Exception):
    """Aggregated discovery marked this group version stale: its server could not be reached."""

    def __init__(self, gv: GroupVersion) -> None:
        super().__init__(f"stale GroupVersion discovery: {gv}")
        self.gv = gv


class GroupDiscoveryFailed(Exception):
    """Some group versions could not be discovered; the message lists them like client-go's."""

    def __init__(self, groups: dict[GroupVersion, BaseException]) -> None:
        self.groups = dict(groups)
        listed = sorted(f"{gv}: {err}" for gv, err in self.groups.items())
        super().__init__(f"unable to retrieve the complete list of server APIs: {', '.join(listed)}")


@dataclass
class DiscoveryResult:
    """What was discovered, and which group versions failed (None when all succeeded)."""

    resources: list[APIResourceList]
    error: GroupDiscoveryFailed | None = None

    @property
    def failed(self) -> dict[GroupVersion, BaseException]:
        return self.error.groups if self.error else {}


@dataclass
class _Group:
    name: str
    versions: list[str] = field(default_factory=list)
    preferred: str = ""


@dataclass
class _Discovered:
    groups: list[_Group]
    resources: dict[GroupVersion, APIResourceList] | None  # None: legacy format, fetch per version
    failed: dict[GroupVersion, BaseException]


# -- public API ---------------------------------------------------------------------------------------


async def server_preferred_resources(client: RestClient) -> DiscoveryResult:
    """All resources, each at its group's preferred version (or the first version serving it)."""
    found = await _groups_and_maybe_resources(client)
    resources, failed = found.resources, dict(found.failed)
    if resources is None:
        resources, fetch_failed = await _fetch_group_version_resources(client, found.groups)
        failed.update(fetch_failed)
    return DiscoveryResult(_preferred(found.groups, resources), GroupDiscoveryFailed(failed) if failed else None)


async def server_preferred_namespaced_resources(client: RestClient) -> DiscoveryResult:
    found = await server_preferred_resources(client)
    return DiscoveryResult(filtered_by(lambda _gv, r: r.namespaced, found.resources), found.error)


def filtered_by(
    predicate: Callable[[str, APIResource], bool], lists: Iterable[APIResourceList]
) -> list[APIResourceList]:
    """Keep the resources matching `predicate(group_version, resource)`; drop emptied lists."""
    result = []
    for rl in lists:
        kept = [r for r in rl.resources if predicate(rl.group_version, r)]
        if kept:
            result.append(APIResourceList(rl.group_version, kept))
    return result


def group_version_resources(lists: Iterable[APIResourceList]) -> dict[GroupVersionResource, APIResource]:
    """Resource lists as GVRs (in discovery order). A malformed group version raises ValueError."""
    gvrs: dict[GroupVersionResource, APIResource] = {}
    for rl in lists:
        gv = GroupVersion.parse(rl.group_version)
        for res in rl.resources:
            gvrs[GroupVersionResource(gv.group, gv.version, res.name)] = res
    return gvrs


# -- preferred-version selection ----------------------------------------------------------------------


def _preferred(groups: list[_Group], resources: dict[GroupVersion, APIResourceList]) -> list[APIResourceList]:
    """client-go's ServerPreferredResources selection: per group/resource the first version that
    serves it, replaced only by the group's preferred version; subresources are left out."""
    result: list[APIResourceList] = []
    by_gv: dict[GroupVersion, APIResourceList] = {}
    chosen: dict[tuple[str, str], tuple[GroupVersion, APIResource]] = {}
    for group in groups:
        for version in group.versions:
            gv = GroupVersion(group.name, version)
            served = resources.get(gv)
            if served is None:
                continue
            by_gv[gv] = APIResourceList(str(gv))
            result.append(by_gv[gv])
            for res in served.resources:
                if "/" in res.name:
                    continue
                key = (group.name, res.name)
                if key in chosen and version != group.preferred:
                    continue
                chosen[key] = (gv, res)
    for gv, res in chosen.values():
        by_gv[gv].resources.append(res)
    return result


# -- fetching -----------------------------------------------------------------------------------------


async def _groups_and_maybe_resources(client: RestClient) -> _Discovered:
    core = await _get_discovery(client, "/api", tolerate_not_found=True)
    apis = await _get_discovery(client, "/apis")
    groups: list[_Group] = []
    resources: dict[GroupVersion, APIResourceList] = {}
    failed: dict[GroupVersion, BaseException] = {}
    aggregated = True
    for doc, legacy_parse in ((core, _legacy_core_groups), (apis, _legacy_groups)):
        if doc.get("kind") == AGGREGATED_KIND:
            _split_aggregated(doc, groups, resources, failed)
        else:
            aggregated = False
            groups.extend(legacy_parse(doc))
    # As client-go: resources only count when both documents carried them.
    return _Discovered(groups, resources if aggregated else None, failed)


async def _get_discovery(client: RestClient, path: str, tolerate_not_found: bool = False) -> dict[str, Any]:
    try:
        doc = await client.request("GET", path, accept=DISCOVERY_ACCEPT, timeout=DISCOVERY_TIMEOUT)
    except NotFound:
        if tolerate_not_found:  # aggregated API servers may not serve /api
            return {"kind": AGGREGATED_KIND, "items": []}
        raise
    return doc if isinstance(doc, dict) else {}


def _split_aggregated(
    doc: dict[str, Any],
    groups: list[_Group],
    resources: dict[GroupVersion, APIResourceList],
    failed: dict[GroupVersion, BaseException],
) -> None:
    for item in doc.get("items") or []:
        group = _Group((item.get("metadata") or {}).get("name", ""))
        for version in item.get("versions") or []:
            gv = GroupVersion(group.name, version.get("version", ""))
            if version.get("freshness") == STALE:
                failed[gv] = StaleGroupVersion(gv)
                continue
            group.versions.append(gv.version)
            group.preferred = group.preferred or gv.version  # the first fresh version is preferred
            resources[gv] = APIResourceList(str(gv), list(_aggregated_resources(version.get("resources") or [])))
        groups.append(group)


def _aggregated_resources(entries: list[dict[str, Any]]) -> Iterable[APIResource]:
    for entry in entries:
        parent = APIResource(
            name=entry.get("resource", ""),
            kind=(entry.get("responseKind") or {}).get("kind", ""),
            namespaced=entry.get("scope") == "Namespaced",
            verbs=frozenset(entry.get("verbs") or ()),
        )
        if _has_kind(entry):  # client-go drops a resource without a GVK but keeps its subresources
            yield parent
        for sub in entry.get("subresources") or []:
            if _has_kind(sub):
                yield APIResource(
                    f"{parent.name}/{sub.get('subresource', '')}",
                    sub["responseKind"].get("kind", ""),
                    parent.namespaced,
                    frozenset(sub.get("verbs") or ()),
                )


def _has_kind(entry: dict[str, Any]) -> bool:
    kind = entry.get("responseKind") or {}
    return any(kind.get(k) for k in ("group", "version", "kind"))


def _legacy_core_groups(doc: dict[str, Any]) -> list[_Group]:
    versions = list(doc.get("versions") or [])
    return [_Group("", versions, versions[0])] if versions else [_Group("")]


def _legacy_groups(doc: dict[str, Any]) -> list[_Group]:
    groups = []
    for item in doc.get("groups") or []:
        versions = [v.get("version", "") for v in item.get("versions") or []]
        preferred = (item.get("preferredVersion") or {}).get("version", "")
        groups.append(_Group(item.get("name", ""), versions, preferred))
    return groups


async def _fetch_group_version_resources(
    client: RestClient, groups: list[_Group]
) -> tuple[dict[GroupVersion, APIResourceList], dict[GroupVersion, BaseException]]:
    """Legacy discovery: one GET per group version, all at once; failures are collected."""
    gvs = [GroupVersion(g.name, v) for g in groups for v in g.versions]
    answers = await asyncio.gather(*(_fetch_one(client, gv) for gv in gvs), return_exceptions=True)
    resources: dict[GroupVersion, APIResourceList] = {}
    failed: dict[GroupVersion, BaseException] = {}
    for gv, answer in zip(gvs, answers, strict=True):
        if isinstance(answer, APIResourceList):
            resources[gv] = answer
        elif isinstance(answer, ApiError | TransportError | ValueError):
            failed[gv] = answer
        elif isinstance(answer, BaseException):
            raise answer
    return resources, failed


async def _fetch_one(client: RestClient, gv: GroupVersion) -> APIResourceList:
    path = f"/apis/{gv}" if gv.group else f"/api/{gv.version}"
    try:
        doc = await client.request("GET", path, timeout=DISCOVERY_TIMEOUT)
    except NotFound:
        if gv == GroupVersion("", "v1"):  # client-go tolerates a missing core/v1
            return APIResourceList(str(gv))
        raise
    if not isinstance(doc, dict):
        raise ValueError(f"unexpected discovery document for {gv}")
    return APIResourceList(
        str(gv),
        [
            APIResource(
                r.get("name", ""), r.get("kind", ""), bool(r.get("namespaced")), frozenset(r.get("verbs") or ())
            )
            for r in doc.get("resources") or []
        ],
    )
