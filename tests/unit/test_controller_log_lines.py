"""The lines the runtime logs for each controller: KCM's for the built-in ones (operators grep and
alert on them), generic ones naming the controller for a plugin."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import pytest

from pykcm.app.options import Options
from pykcm.client.errors import ServiceUnavailable
from pykcm.controller import KEY, Controller, ControllerContext, Line, LogLines, RequeueAfter
from pykcm.controller.podcontrol import PodControl
from pykcm.controllers.namespace.controller import NamespaceController
from pykcm.controllers.namespace.deleter import NoResourcesDiscovered
from pykcm.controllers.replicaset.controller import ReplicaSetController
from pykcm.controllers.serviceaccount import ServiceAccountController
from pykcm.informers.factory import SharedInformerFactory
from pykcm.util.log import JsonFormatter, KlogFormatter, kref
from tests.unit.replicaset_harness import FakeApi, FakeEvents

FAILURE = ServiceUnavailable(503, "ServiceUnavailable", "etcd is down")


class Plugin(Controller):
    name = "greeter-controller"

    async def sync(self, key: str) -> None:
        pass


def build(cls: type[Controller]) -> Controller:
    ctx = ControllerContext(client=None, informers=SharedInformerFactory(None), options=Options(), events=None)  # type: ignore[arg-type]
    return cls(ctx)


async def failed_sync(controller: Controller, key: str, caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """The records of one failing sync of `key`, in order."""

    async def sync(_key: str) -> None:
        raise FAILURE

    controller.sync = sync  # type: ignore[method-assign]
    with caplog.at_level(logging.INFO, logger="pykcm"):
        await controller._process(key)
    return [r for r in caplog.records if r.name == f"pykcm.{controller.queue_label()}"]


async def caches_synced() -> None:
    pass


def line(record: logging.LogRecord) -> tuple[str, dict[str, Any]]:
    kv = dict(record.kv)  # type: ignore[attr-defined]
    kv.pop("duration", None)  # a time: checked for presence below
    return record.getMessage(), kv


@pytest.mark.parametrize("verbosity", [4], indirect=True)
@pytest.mark.parametrize(("cls", "key", "failed", "finished"), [
    (NamespaceController, "gone",
     ("Deletion of namespace failed", {"logger": "UnhandledError", "namespace": "gone", "err": "etcd is down"}),
     ("Finished syncing namespace", {"namespace": "gone"})),
    (ServiceAccountController, "team-a",
     ("Service account work item failed", {"logger": "UnhandledError", "item": "team-a", "err": "etcd is down"}),
     ("Finished syncing namespace", {"namespace": "team-a"})),
    (ReplicaSetController, "ns/web",
     ("Unhandled Error", {"logger": "UnhandledError", "err": 'sync "ns/web" failed with etcd is down'}),
     ("Finished syncing", {"kind": "ReplicaSet", "key": "ns/web"})),
    (Plugin, "ns/x",
     ("Error syncing, requeuing", {"controller": "greeter-controller", "key": "ns/x", "err": "etcd is down"}),
     ("Finished syncing", {"controller": "greeter-controller", "key": "ns/x"})),
])
async def test_a_failed_sync_logs_kcms_finished_then_failure_lines(
    cls: type[Controller], key: str, failed: tuple, finished: tuple, verbosity: None,
    caplog: pytest.LogCaptureFixture
) -> None:
    controller = build(cls)
    records = await failed_sync(controller, key, caplog)
    assert [line(r) for r in records] == [finished, failed]  # in KCM's order: the sync's defer, then the worker
    assert "duration" in records[0].kv  # type: ignore[attr-defined]
    assert records[1].levelno == logging.ERROR
    assert controller.queue.num_requeues(key) == 1  # still retried with backoff


async def test_below_v4_a_failed_sync_logs_only_the_failure(caplog: pytest.LogCaptureFixture) -> None:
    records = await failed_sync(build(NamespaceController), "gone", caplog)
    assert [r.getMessage() for r in records] == ["Deletion of namespace failed"]


@pytest.mark.parametrize(("cls", "start", "stop"), [
    (ServiceAccountController, ("Starting service account controller", {}),
     ("Shutting down service account controller", {})),
    (ReplicaSetController, ("Starting controller", {"name": "replicaset"}),
     ("Shutting down controller", {"name": "replicaset"})),
    # Before the wait for caches, as KCM's: "Starting workers" would say what has not happened yet.
    (Plugin, ("Starting controller", {"controller": "greeter-controller", "workers": 1}),
     ("Shutting down controller", {"controller": "greeter-controller"})),
])
async def test_run_logs_kcms_start_and_stop_lines(
    cls: type[Controller], start: tuple, stop: tuple, caplog: pytest.LogCaptureFixture
) -> None:
    controller = build(cls)
    with caplog.at_level(logging.INFO, logger="pykcm"):
        runner = asyncio.create_task(controller.run_when_ready(caches_synced))
        await asyncio.sleep(0.01)
        controller.queue.shutdown()
        await asyncio.wait_for(runner, 1)
    assert [line(r) for r in caplog.records] == [start, stop]


@pytest.mark.parametrize("verbosity", [5], indirect=True)
async def test_the_namespace_controller_says_it_starts_its_workers_at_v5(
    verbosity: None, caplog: pytest.LogCaptureFixture
) -> None:
    controller = build(NamespaceController)

    async def no_discovery(_log: object) -> None:
        pass

    controller.deleter.init_op_cache = no_discovery  # type: ignore[method-assign]
    with caplog.at_level(logging.INFO, logger="pykcm"):
        runner = asyncio.create_task(controller.run_when_ready(caches_synced))
        await asyncio.sleep(0.01)
        runner.cancel()  # a stop cut short still says so, as KCM's deferred line does
        with pytest.raises(asyncio.CancelledError):
            await runner
    assert [r.getMessage() for r in caplog.records] == [
        "Starting namespace controller", "Starting workers of namespace controller",
        "Shutting down namespace controller"]


async def test_the_failure_line_reads_as_kcms_in_text_and_json(caplog: pytest.LogCaptureFixture) -> None:
    [record] = await failed_sync(build(NamespaceController), "gone", caplog)
    text = KlogFormatter().format(record)
    assert text.endswith('] "Deletion of namespace failed" err="etcd is down" logger="UnhandledError"'
                         ' namespace="gone"')
    entry = json.loads(JsonFormatter().format(record))
    assert {k: entry[k] for k in ("logger", "msg", "namespace", "err")} == {
        "logger": "UnhandledError", "msg": "Deletion of namespace failed", "namespace": "gone", "err": "etcd is down"}


class Timed(Plugin):
    # A plugin's own `duration` on its finished line: the runtime's comes last and wins, as klog's
    # last duplicate (a TypeError here ended the worker once -v reached 4).
    log_lines = LogLines(
        start=Line("Starting timed"), stop=Line("Shutting down timed"),
        failed=Line("Timed sync failed", key=KEY), finished=Line("Finished syncing", key=KEY, duration="declared"),
    )


@pytest.mark.parametrize("verbosity", [4], indirect=True)
async def test_a_plugins_finished_line_may_name_the_runtimes_keys(
    verbosity: None, caplog: pytest.LogCaptureFixture
) -> None:
    controller = build(Timed)
    with caplog.at_level(logging.INFO, logger="pykcm"):
        await controller._process("ns/x")
    [record] = caplog.records
    assert record.getMessage() == "Finished syncing" and record.kv["key"] == "ns/x"  # type: ignore[attr-defined]
    assert record.kv["duration"] != "declared" and record.kv["duration"].endswith("s")  # type: ignore[attr-defined]


@pytest.mark.parametrize("verbosity", [4], indirect=True)
async def test_pod_control_names_pods_as_klog_object_references(
    verbosity: None, caplog: pytest.LogCaptureFixture
) -> None:
    # controller_utils.go: "pod", klog.KObj(newPod) / klog.KRef(namespace, podID): {"name","namespace"} in JSON.
    api = FakeApi()
    control = PodControl(api, FakeEvents())  # type: ignore[arg-type]
    owner = {"metadata": {"name": "web", "namespace": "ns", "uid": "u1"}}
    ref = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web", "uid": "u1", "controller": True,
           "blockOwnerDeletion": True}
    template = {"metadata": {"labels": {"app": "web"}}, "spec": {}}
    with caplog.at_level(logging.INFO, logger="pykcm"):
        pod = await control.create_pod("ns", template, owner, ref)
        await control.delete_pod("ns", pod["metadata"]["name"], owner)
        with pytest.raises(Exception, match="not found"):
            await control.delete_pod("ns", "gone", owner)
    name = pod["metadata"]["name"]
    assert [line(r) for r in caplog.records] == [
        ("Controller created pod", {"controller": "web", "pod": kref("ns", name)}),
        ("Deleting pod", {"controller": "web", "pod": kref("ns", name)}),
        ("Deleting pod", {"controller": "web", "pod": kref("ns", "gone")}),
        ("Pod has already been deleted.", {"pod": kref("ns", "gone")}),
    ]
    assert json.loads(JsonFormatter().format(caplog.records[0]))["pod"] == {"name": name, "namespace": "ns"}


@pytest.mark.parametrize("verbosity", [4], indirect=True)
async def test_a_requeue_carrying_an_error_logs_the_failed_line_after_finished_but_backs_off_not(
    verbosity: None, caplog: pytest.LogCaptureFixture
) -> None:
    # KCM's stale-cache check returns an error (its worker logs it); pykcm looks again after a fixed delay.
    controller = build(Plugin)

    async def sync(_key: str) -> None:
        raise RequeueAfter(30, error="read version: 5 is not as new as written version: 7")

    controller.sync = sync  # type: ignore[method-assign]
    with caplog.at_level(logging.INFO, logger="pykcm"):
        await controller._process("ns/x")
    assert [line(r) for r in caplog.records] == [
        ("Finished syncing", {"controller": "greeter-controller", "key": "ns/x"}),
        ("Error syncing, requeuing", {"controller": "greeter-controller", "key": "ns/x",
                                      "err": "read version: 5 is not as new as written version: 7"})]
    assert controller.queue.num_requeues("ns/x") == 0


async def test_the_namespace_deleters_discovery_lines_come_from_the_controllers_named_logger(
    caplog: pytest.LogCaptureFixture
) -> None:
    # KCM's deleter discovers in the controller's constructor, with its named logger; the failure is
    # utilruntime.HandleErrorWithContext's, named "UnhandledError" under it.
    controller = build(NamespaceController)

    async def unavailable() -> None:
        raise FAILURE

    controller.deleter.discover = unavailable  # type: ignore[assignment]
    with caplog.at_level(logging.INFO, logger="pykcm"), pytest.raises(NoResourcesDiscovered):
        await controller.run()
    [record] = [r for r in caplog.records if r.getMessage() == "Unable to get all supported resources from server"]
    assert line(record) == ("Unable to get all supported resources from server",
                            {"logger": "namespace-controller.UnhandledError", "err": "etcd is down"})
    assert KlogFormatter().format(record).endswith(
        '"Unable to get all supported resources from server" err="etcd is down"'
        ' logger="namespace-controller.UnhandledError"')
