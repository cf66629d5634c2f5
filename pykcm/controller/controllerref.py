"""Controller references: who controls an object, and claiming (adopt/release) pods.

From apimachinery's controller_ref.go and KCM's controller_ref_manager.go / controller_utils.go:

- an object's controller is its first ownerReference with `controller: true`;
- pods are indexed by their controller (`namespace/Kind/name/uid`), orphans by `namespace`, so
  an owner finds its own pods and its adoption candidates without scanning the namespace;
- `PodControllerRefManager.claim_pods` keeps pods the owner controls and still selects,
  releases those it no longer selects and adopts matching orphans. Before the first adoption
  of a pass it runs `can_adopt` once (an uncached GET of the owner): if the owner is gone,
  recreated or being deleted, every adoption of that pass fails.

Claiming and filtering read every pod of the owner (10,000 for a large ReplicaSet) and hand the
event loop back as they go, as KCM's run on a worker goroutine beside its informers.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from pykcm.client.errors import Invalid, NotFound
from pykcm.controller.podutil import filter_pods
from pykcm.controller.selectors import Selector
from pykcm.informers.store import Indexer, Obj
from pykcm.util.errors import aggregate
from pykcm.util.log import get_logger, kobj
from pykcm.util.timeslice import TimeSlice

POD_CONTROLLER_INDEX = "podController"

log = get_logger("controllerref")

PatchPod = Callable[[str, str, dict[str, Any]], Awaitable[Any]]
CanAdopt = Callable[[], Awaitable[None]]


def get_controller_of(obj: Obj) -> dict[str, Any] | None:
    for ref in obj.get("metadata", {}).get("ownerReferences") or ():
        if ref.get("controller") is True:
            return ref
    return None


def is_controlled_by(obj: Obj, owner: Obj) -> bool:
    ref = get_controller_of(obj)
    return ref is not None and ref.get("uid") == owner["metadata"].get("uid")


def new_controller_ref(owner: Obj, api_version: str, kind: str) -> dict[str, Any]:
    meta = owner["metadata"]
    return {
        "apiVersion": api_version,
        "kind": kind,
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def validate_controller_ref(ref: dict[str, Any] | None) -> None:
    """Refuse to create a dependent with a half-filled controller ref (ValueError)."""
    if ref is None:
        raise ValueError("controllerRef is nil")
    if not ref.get("apiVersion"):
        raise ValueError("controllerRef has empty APIVersion")
    if not ref.get("kind"):
        raise ValueError("controllerRef has empty Kind")
    if ref.get("controller") is not True:
        raise ValueError("controllerRef.Controller is not set to true")
    if ref.get("blockOwnerDeletion") is not True:
        raise ValueError("controllerRef.BlockOwnerDeletion is not set")


def adopt_patch(owner: Obj, api_version: str, kind: str, dependent_uid: str) -> dict[str, Any]:
    """Strategic-merge patch adding us as controller. `uid` makes the patch fail if the
    dependent was recreated; the apiserver rejects it if another controller ref exists."""
    return {"metadata": {"ownerReferences": [new_controller_ref(owner, api_version, kind)], "uid": dependent_uid}}


def release_patch(dependent_uid: str, owner_uids: Iterable[str]) -> dict[str, Any]:
    """Strategic-merge patch deleting our ownerReference(s), keyed by uid."""
    refs = [{"$patch": "delete", "uid": uid} for uid in owner_uids]
    return {"metadata": {"uid": dependent_uid, "ownerReferences": refs}}


# -- the pod index ----------------------------------------------------------------------------------


def pod_controller_index_key(namespace: str, ref: dict[str, Any] | None) -> str:
    if ref is None:
        return namespace
    return f"{namespace}/{ref.get('kind', '')}/{ref.get('name', '')}/{ref.get('uid', '')}"


def pod_controller_index(pod: Obj) -> list[str]:
    """Index function: one key per pod, its controller's or its namespace's orphan key."""
    return [pod_controller_index_key(pod["metadata"].get("namespace", ""), get_controller_of(pod))]


def pods_by_owner(indexer: Indexer, owner: Obj, kind: str, include_orphans: bool) -> list[Obj]:
    """Pods controlled by `owner` plus, optionally, the orphans of its namespace."""
    meta = owner["metadata"]
    namespace = meta["namespace"]
    keys = [pod_controller_index_key(namespace, {"kind": kind, "name": meta["name"], "uid": meta["uid"]})]
    if include_orphans:
        keys.append(pod_controller_index_key(namespace, None))
    return [pod for key in keys for pod in indexer.by_index(POD_CONTROLLER_INDEX, key)]


async def filter_claimed_pods(owner: Obj, selector: Selector, pods: Iterable[Obj]) -> list[Obj]:
    """Pods controlled by `owner` that its selector still matches."""

    def claimed(pod: Obj) -> bool:
        return is_controlled_by(pod, owner) and selector.matches(pod["metadata"].get("labels"))

    return await filter_pods(pods, claimed)


# -- claiming ---------------------------------------------------------------------------------------


class PodControllerRefManager:
    """One claim pass for one owner; build a new one per sync so `can_adopt` runs again."""

    def __init__(
        self,
        owner: Obj,
        selector: Selector,
        api_version: str,
        kind: str,
        patch_pod: PatchPod,
        can_adopt: CanAdopt,
    ) -> None:
        self.owner = owner
        self.selector = selector
        self.api_version = api_version
        self.kind = kind
        self._patch_pod = patch_pod
        self._can_adopt = can_adopt
        self._can_adopt_result: BaseException | None = None
        self._can_adopt_checked = False

    async def claim_pods(self, pods: Iterable[Obj]) -> tuple[list[Obj], BaseException | None]:
        """(pods we now control, the aggregated error of failed adoptions/releases or None)."""
        claimed, errors = [], []
        time_slice = TimeSlice()
        for pod in pods:
            try:
                if await self._claim(pod):
                    claimed.append(pod)
            except Exception as err:
                errors.append(err)
            if time_slice.over():
                await time_slice.pause()
        return claimed, aggregate(errors)

    def _being_deleted(self) -> bool:
        return self.owner["metadata"].get("deletionTimestamp") is not None

    def _matches(self, pod: Obj) -> bool:
        return self.selector.matches(pod["metadata"].get("labels"))

    async def _claim(self, pod: Obj) -> bool:
        ref = get_controller_of(pod)
        if ref is not None:
            if ref.get("uid") != self.owner["metadata"]["uid"]:
                return False  # someone else's
            if self._matches(pod):
                return True  # ours and still selected; allowed even while we are being deleted
            if self._being_deleted():
                return False
            await self._release(pod)
            return False
        if not self._can_adopt_orphan(pod):
            return False
        try:
            await self._adopt(pod)
        except NotFound:
            return False  # the pod is gone
        return True

    def _can_adopt_orphan(self, pod: Obj) -> bool:
        meta = pod["metadata"]
        if self._being_deleted() or not self._matches(pod):
            return False
        if meta.get("deletionTimestamp") is not None:
            return False
        owner_namespace = self.owner["metadata"].get("namespace")
        return not owner_namespace or owner_namespace == meta.get("namespace")

    async def _ensure_can_adopt(self) -> None:
        if not self._can_adopt_checked:
            self._can_adopt_checked = True
            try:
                await self._can_adopt()
            except Exception as err:
                self._can_adopt_result = err
        if self._can_adopt_result is not None:
            raise self._can_adopt_result

    async def _adopt(self, pod: Obj) -> None:
        meta = pod["metadata"]
        try:
            await self._ensure_can_adopt()
        except Exception as err:
            raise AdoptionError(
                f"can't adopt Pod {meta.get('namespace')}/{meta['name']} ({meta.get('uid')}): {err}"
            ) from err
        patch = adopt_patch(self.owner, self.api_version, self.kind, meta["uid"])
        await self._patch_pod(meta["namespace"], meta["name"], patch)

    async def _release(self, pod: Obj) -> None:
        meta = pod["metadata"]
        if (v2 := log.v(2)).enabled():  # gvk: Go's GroupVersionKind.String(), "apps/v1, Kind=ReplicaSet"
            group_version = self.api_version if "/" in self.api_version else f"/{self.api_version}"
            v2.info("Patching pod to remove its controllerRef", pod=kobj(pod), gvk=f"{group_version}, Kind={self.kind}",
                    controller=self.owner["metadata"]["name"])
        patch = release_patch(meta["uid"], [self.owner["metadata"]["uid"]])
        try:
            await self._patch_pod(meta["namespace"], meta["name"], patch)
        except (NotFound, Invalid):
            # Gone, or recreated under the same name (uid mismatch), or no longer has our ref.
            return


class AdoptionError(Exception):
    """The pre-adoption recheck of the owner failed; no adoption happens in this pass."""
