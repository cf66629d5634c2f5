"""ServiceAccount controller against the real kube-apiserver: scenarios 35-39 (spec/scenarios.md).

pykcm runs in this event loop with only the serviceaccount controller. What the controller asks
of the API server is observed by recording the calls its client makes (client name
`service-account-controller`), installed before the manager starts so nothing is missed.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from pykcm.client.resources import NAMESPACES, SERVICEACCOUNTS, Resource
from pykcm.client.rest import RestClient
from pykcm.controllers.serviceaccount import ServiceAccountController
from pykcm.testenv.controlplane import ControlPlane
from tests.support import (
    controller_of,
    create_namespace,
    is_gone,
    running_manager,
    wait_for,
)

pytestmark = pytest.mark.integration

CLIENT_NAME = ServiceAccountController.client_name
WRITES = ("create", "update", "patch", "delete")


class Recorder:
    """The controller's writes (verb, namespace, outcome) and the keys it finished syncing."""

    def __init__(self) -> None:
        self.writes: list[tuple[str, str | None, str]] = []
        self.synced: list[str] = []

    def writes_in(self, namespace: str) -> list[tuple[str, str]]:
        return [(verb, outcome) for verb, ns, outcome in self.writes if ns == namespace]

    def sync_count(self, key: str) -> int:
        return self.synced.count(key)


@pytest.fixture
def recorder(monkeypatch: pytest.MonkeyPatch) -> Recorder:
    recorded = Recorder()
    for verb in WRITES:
        monkeypatch.setattr(RestClient, verb, _recording(getattr(RestClient, verb), verb, recorded))
    original_sync = ServiceAccountController.sync

    async def recording_sync(self: ServiceAccountController, key: str) -> None:
        try:
            await original_sync(self, key)
        finally:
            recorded.synced.append(key)

    monkeypatch.setattr(ServiceAccountController, "sync", recording_sync)
    return recorded


def _recording(method: Any, verb: str, recorded: Recorder) -> Any:
    async def call(self: RestClient, res: Resource, *args: Any, **kwargs: Any) -> Any:
        if self.name != CLIENT_NAME or res != SERVICEACCOUNTS:
            return await method(self, res, *args, **kwargs)
        namespace = kwargs.get("namespace") or _namespace_of(args)
        try:
            result = await method(self, res, *args, **kwargs)
        except Exception as err:
            recorded.writes.append((verb, namespace, type(err).__name__))
            raise
        recorded.writes.append((verb, namespace, "ok"))
        return result

    return call


def _namespace_of(args: tuple[Any, ...]) -> str | None:
    body = next((a for a in args if isinstance(a, dict)), {})
    return body.get("metadata", {}).get("namespace")


async def get_default(client: RestClient, namespace: str) -> dict[str, Any] | None:
    items = (await client.list(SERVICEACCOUNTS, namespace=namespace))["items"]
    return next((sa for sa in items if sa["metadata"]["name"] == "default"), None)


async def label_namespace(client: RestClient, namespace: str, value: str) -> None:
    """Any namespace update makes the controller look at the namespace again."""
    await client.patch(NAMESPACES, namespace, {"metadata": {"labels": {"pykcm.test/touch": value}}})


async def test_scenario_35_new_namespace_gets_default_service_account(
    control_plane: ControlPlane, client: RestClient, recorder: Recorder
) -> None:
    async with running_manager(control_plane.kubeconfig, controllers="serviceaccount"):
        ns = await create_namespace(client, "sa35", service_account=False)
        account = await wait_for(lambda: get_default(client, ns), 10, 0.1, "SA default created")
    # Exactly KCM's object: a name and nothing else the controller chose.
    meta = account["metadata"]
    assert "labels" not in meta and "annotations" not in meta
    assert "secrets" not in account and "automountServiceAccountToken" not in account
    assert recorder.writes_in(ns) == [("create", "ok")]


async def test_scenario_36_deleted_default_is_recreated(
    control_plane: ControlPlane, client: RestClient, recorder: Recorder
) -> None:
    async with running_manager(control_plane.kubeconfig, controllers="serviceaccount"):
        ns = await create_namespace(client, "sa36", service_account=False)
        first = await wait_for(lambda: get_default(client, ns), 10, 0.1, "SA default created")
        await client.delete(SERVICEACCOUNTS, "default", ns)

        async def recreated() -> dict[str, Any] | None:
            account = await get_default(client, ns)
            return account if account and account["metadata"]["uid"] != first["metadata"]["uid"] else None

        await wait_for(recreated, 10, 0.1, "SA default re-created")
    assert recorder.writes_in(ns) == [("create", "ok"), ("create", "ok")]


async def test_scenario_37_terminating_namespace_gets_nothing(
    control_plane: ControlPlane, client: RestClient, recorder: Recorder
) -> None:
    # Deleted before the controller runs; with no namespace controller it stays Terminating.
    ns = await create_namespace(client, "sa37", service_account=False)
    await client.delete(NAMESPACES, ns)
    assert (await client.get(NAMESPACES, ns))["status"]["phase"] == "Terminating"
    async with running_manager(control_plane.kubeconfig, controllers="serviceaccount"):
        await wait_for(lambda: _synced(recorder, ns, 1), 10, 0.1, "initial sync")
        await label_namespace(client, ns, "again")  # and once more on an update
        await wait_for(lambda: _synced(recorder, ns, 2), 10, 0.1, "sync after the update")
    assert recorder.writes_in(ns) == []
    assert await get_default(client, ns) is None
    # Tidy up as the namespace controller would: nothing in it, so release the finalizer.
    namespace = await client.get(NAMESPACES, ns)
    namespace["spec"]["finalizers"] = []
    await client.update(NAMESPACES, namespace, subresource="finalize")
    await wait_for(lambda: is_gone(client, NAMESPACES, ns), 10)


async def _synced(recorder: Recorder, key: str, count: int) -> bool:
    return recorder.sync_count(key) >= count


async def test_scenario_38_already_exists_on_create_is_success(
    control_plane: ControlPlane, client: RestClient, recorder: Recorder, caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(logging.getLogger("pykcm"), "propagate", True)  # the CLI may have turned it off
    async with running_manager(control_plane.kubeconfig, controllers="serviceaccount") as manager:
        controller = controller_of(manager, "serviceaccount-controller")
        ns = await create_namespace(client, "sa38", service_account=False)
        await wait_for(lambda: get_default(client, ns), 10, 0.1, "SA default created")
        await wait_for(lambda: _cached(controller, ns), 10, 0.1, "SA default in the cache")
        # The race: the account exists but the controller's cache has not seen it yet.
        controller.service_accounts.indexer.delete(f"{ns}/default")
        synced = recorder.sync_count(ns)
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="pykcm"):
            controller.queue.add(ns)
            await wait_for(lambda: _synced(recorder, ns, synced + 1), 10, 0.1, "sync during the race")
    assert recorder.writes_in(ns)[-1] == ("create", "AlreadyExists")
    assert controller.queue.num_requeues(ns) == 0  # success: no backoff, no retry
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []


async def _cached(controller: ServiceAccountController, namespace: str) -> bool:
    return controller.service_accounts.indexer.get_by(namespace, "default") is not None


async def test_scenario_39_user_changes_to_default_are_left_alone(
    control_plane: ControlPlane, client: RestClient, recorder: Recorder
) -> None:
    ns = await create_namespace(client, "sa39")  # the test creates `default` itself
    patch = {"metadata": {"labels": {"team": "payments"}}, "secrets": [{"name": "my-token"}],
             "automountServiceAccountToken": False}
    changed = await client.patch(SERVICEACCOUNTS, "default", patch, ns)
    async with running_manager(control_plane.kubeconfig, controllers="serviceaccount"):
        await wait_for(lambda: _synced(recorder, ns, 1), 10, 0.1, "initial sync")
        await label_namespace(client, ns, "again")
        await wait_for(lambda: _synced(recorder, ns, 2), 10, 0.1, "sync after the update")
    assert recorder.writes_in(ns) == []
    account = await get_default(client, ns)
    assert account is not None
    assert account["metadata"]["resourceVersion"] == changed["metadata"]["resourceVersion"]
    assert account["metadata"]["labels"] == {"team": "payments"} and account["secrets"] == [{"name": "my-token"}]
