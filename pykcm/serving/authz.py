"""Delegated authorization: privileged groups and the always-allowed paths pass, everything else
asks the apiserver with a SubjectAccessReview (answers cached for 10 s). Each decision and each
SubjectAccessReview is counted as KCM counts them (pykcm.serving.metrics)."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from pykcm.client.errors import ApiError, TransportError
from pykcm.client.rest import RestClient
from pykcm.serving import metrics
from pykcm.serving.authn import REVIEW_CACHE_TTL, UserInfo
from pykcm.serving.reviews import REVIEW_TIMEOUT, send_review
from pykcm.util.ttlcache import TTLCache

PRIVILEGED_GROUPS = ("system:masters",)  # KCM's --authorization-always-allow-groups default


@dataclass(frozen=True)
class Decision:
    allowed: bool
    reason: str = ""
    denied: bool = False  # said so, where not allowed is otherwise no opinion (RBAC's answer)

    @property
    def result(self) -> str:
        """The authorization filter's `result` label."""
        return "allowed" if self.allowed else "denied" if self.denied else "no-opinion"


class DelegatingAuthorizer:
    """Privileged groups, then always-allowed paths, then a SubjectAccessReview."""

    def __init__(
        self,
        client: RestClient | None,
        always_allow_paths: Iterable[str],
        always_allow_groups: Iterable[str] = PRIVILEGED_GROUPS,
        cache_ttl: float = REVIEW_CACHE_TTL,
    ) -> None:
        self.client = client
        self.always_allow_paths = tuple(always_allow_paths)
        self.always_allow_groups = frozenset(always_allow_groups)
        self._cache: TTLCache[bytes, Decision] = TTLCache(cache_ttl)

    async def authorize(self, user: UserInfo, verb: str, path: str) -> Decision:
        """The decision, or the review's ApiError/TransportError; counted as apiserver's
        authorization filter counts (every authorizer of the union, the first two included)."""
        start = time.monotonic()
        try:
            decision = await self._authorize(user, verb, path)
        except (ApiError, TransportError):
            metrics.record_authorization("error", time.monotonic() - start)
            raise
        metrics.record_authorization(decision.result, time.monotonic() - start)
        return decision

    async def _authorize(self, user: UserInfo, verb: str, path: str) -> Decision:
        if self.always_allow_groups.intersection(user.groups):
            return Decision(True)
        if path_allowed(path, self.always_allow_paths):
            return Decision(True)
        if self.client is None:
            return Decision(False, "no authorization configured")
        spec = {
            "user": user.name,
            "uid": user.uid,
            "groups": list(user.groups),
            "extra": user.extra,
            "nonResourceAttributes": {"path": path, "verb": verb},
        }
        # Keyed by a digest, as the token cache: a path may be 1 MiB, and 4096 of those would stay
        # cached (Go's webhook keys by the whole spec, with 8192 entries and no memory limit).
        key = hashlib.sha256(orjson.dumps(spec, option=orjson.OPT_SORT_KEYS)).digest()
        return await self._cache.get_or_load(key, lambda: self._subject_access_review(spec))

    async def _subject_access_review(self, spec: dict[str, Any]) -> Decision:
        assert self.client is not None
        body = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec}
        review = await send_review(self.client, "/apis/authorization.k8s.io/v1/subjectaccessreviews", body,
                                   metrics.record_access_review, each=REVIEW_TIMEOUT)
        status = review.get("status") or {}
        denied = bool(status.get("denied"))
        return Decision(bool(status.get("allowed")) and not denied, status.get("reason", ""), denied)


def path_allowed(path: str, patterns: Sequence[str]) -> bool:
    """apiserver's path authorizer (authorization/path): a leading / is optional on the patterns and
    the path alike; a pattern matches exactly, or ending in `*` as a prefix (`*` alone: every path)."""
    path = path.removeprefix("/")
    for pattern in patterns:
        pattern = pattern.removeprefix("/")
        if pattern.endswith("*"):
            if path.startswith(pattern[:-1]):
                return True
        elif path == pattern:
            return True
    return False


def misplaced_star(patterns: Iterable[str]) -> str | None:
    """The first pattern (without its leading /) that the path authorizer refuses: a `*` not at its end."""
    for pattern in patterns:
        trimmed = pattern.removeprefix("/")
        if "*" in trimmed[:-1]:
            return trimmed
    return None
