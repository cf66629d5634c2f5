"""A controller waits for its own informers only; while one cannot sync it says why, now and
then, and fails its /healthz check; once they sync it runs."""

from __future__ import annotations

import asyncio
import gc
import logging
import re
from dataclasses import dataclass

import pytest

from pykcm.app import runner as runner_module
from pykcm.app.options import Options
from pykcm.app.runner import ControllerRunner
from pykcm.client.errors import Forbidden
from pykcm.client.resources import NAMESPACES, SERVICEACCOUNTS, Resource
from pykcm.controller import Controller, ControllerContext
from pykcm.informers.delta_queue import DeltaQueue
from pykcm.informers.factory import SharedInformerFactory
from pykcm.informers.reflector import Reflector
from pykcm.serving.healthz import checks_for, evaluate
from tests.unit.test_reflector import RecordingBackoff, ScriptedClient, page


@dataclass
class FakeInformer:
    resource: Resource
    synced: bool = False
    error: str | None = None

    def has_synced(self) -> bool:
        return self.synced

    async def wait_synced(self) -> None:
        while not self.synced:
            await asyncio.sleep(0.01)

    def sync_error(self) -> str | None:
        return None if self.synced else self.error


class Noop(Controller):
    name = "runner-test-controller"

    async def sync(self, key: str) -> None:
        return None


def controller() -> Noop:
    ctx = ControllerContext(client=None, informers=SharedInformerFactory(None), options=Options(), events=None)  # type: ignore[arg-type]
    return Noop(ctx)


def status(runner: ControllerRunner, endpoint: str) -> int:
    return evaluate(endpoint, checks_for(endpoint, runner.health_checks()), [], verbose=False).status


async def test_blocked_controller_reports_periodically_then_runs_once_synced(monkeypatch, caplog) -> None:
    caplog.set_level(logging.INFO, logger="pykcm")
    monkeypatch.setattr(runner_module, "SYNC_POLL", 0.01)
    monkeypatch.setattr(runner_module, "REPORT_EVERY", 0.2)
    namespaces = FakeInformer(NAMESPACES, synced=True)
    accounts = FakeInformer(SERVICEACCOUNTS, error="serviceaccounts is forbidden: cannot list")
    runner = ControllerRunner(controller(), [namespaces, accounts])  # type: ignore[list-item]
    task = asyncio.create_task(runner.run())
    await asyncio.sleep(0.5)
    lines = [r for r in caplog.records if r.getMessage() == "Informer cannot sync, controller not started"]
    assert 2 <= len(lines) <= 4  # at once, then every REPORT_EVERY: not once per poll
    assert lines[0].kv == {  # type: ignore[attr-defined]
        "controller": "runner-test-controller", "resource": "serviceaccounts",
        "reason": "serviceaccounts is forbidden: cannot list",
    }
    reason = "informer for serviceaccounts has not synced: serviceaccounts is forbidden: cannot list"
    assert runner.cannot_start() == reason
    assert (status(runner, "livez"), status(runner, "healthz"), status(runner, "readyz")) == (200, 500, 500)
    assert not runner.started.is_set()

    accounts.synced = True
    await asyncio.wait_for(runner.started.wait(), 1)
    assert runner.cannot_start() is None
    assert (status(runner, "livez"), status(runner, "healthz"), status(runner, "readyz")) == (200, 200, 200)
    runner.controller.queue.shutdown()
    await asyncio.wait_for(task, 1)


async def test_slow_but_healthy_sync_is_not_a_failure(monkeypatch) -> None:
    monkeypatch.setattr(runner_module, "SYNC_POLL", 0.01)
    runner = ControllerRunner(controller(), [FakeInformer(NAMESPACES)])  # type: ignore[list-item]
    task = asyncio.create_task(runner.run())
    await asyncio.sleep(0.05)
    assert runner.cannot_start() is None and status(runner, "healthz") == 200
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_reflector_remembers_why_it_cannot_list_and_logs_repeats_quietly(caplog) -> None:
    forbidden = Forbidden(403, "Forbidden", 'serviceaccounts is forbidden: User "x" cannot list')
    client = ScriptedClient([forbidden, forbidden, forbidden, page([], "5")])
    queue = DeltaQueue()
    reflector = Reflector(client, SERVICEACCOUNTS, queue, backoff=RecordingBackoff(), watch_list=False)
    errors: list[str | None] = []
    original = reflector._list

    async def spy() -> None:
        errors.append(reflector.last_error)
        await original()

    reflector._list = spy  # type: ignore[method-assign]
    task = asyncio.create_task(reflector.run())
    await asyncio.wait_for(queue.pop(), 5)
    task.cancel()
    assert errors == [None, forbidden.message, forbidden.message, forbidden.message]
    assert reflector.last_error is None  # the list succeeded
    logged = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(logged) == 1  # the same failure three times: one error line


def test_the_factory_records_what_each_controller_asked_for() -> None:
    factory = SharedInformerFactory(None)  # type: ignore[arg-type]
    shared = factory.informer(NAMESPACES)
    with factory.recording() as first:
        factory.informer(NAMESPACES)
        factory.informer(SERVICEACCOUNTS)
        factory.informer(NAMESPACES)
    with factory.recording() as second:
        factory.informer(NAMESPACES)
    assert first == [shared, factory.informer(SERVICEACCOUNTS)]
    assert second == [shared]


async def test_on_shutdown_the_in_flight_sync_finishes_and_queued_keys_are_left() -> None:
    # client-go's Get still hands out queued keys after ShutDown; KCM's cancelled context stops its
    # workers instead. Draining a backlog on SIGTERM once took past a pod's 30 s grace period.
    started, release, synced = asyncio.Event(), asyncio.Event(), []

    class Slow(Noop):
        async def sync(self, key: str) -> None:
            started.set()
            await release.wait()
            synced.append(key)

    ctx = ControllerContext(client=None, informers=SharedInformerFactory(None), options=Options(), events=None)  # type: ignore[arg-type]
    slow = Slow(ctx)
    slow.workers = 1
    for key in ("a", "b", "c"):
        slow.queue.add(key)
    running = asyncio.create_task(slow.run())
    await started.wait()
    slow.queue.shutdown()
    release.set()
    await asyncio.wait_for(running, 5)
    assert synced == ["a"]


async def cancelled_while_waiting_for_caches(runner: ControllerRunner) -> None:
    """Run `runner` and cancel it while it waits for caches that never sync."""
    task = asyncio.create_task(runner.run())
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_controller_cancelled_while_it_waits_for_caches_leaves_no_unretrieved_error(caplog) -> None:
    # The gather over the informers' waits finished with its children's CancelledError as an
    # exception, and asyncio printed "exception was never retrieved" with a traceback at exit.
    await cancelled_while_waiting_for_caches(ControllerRunner(controller(), [FakeInformer(NAMESPACES)]))  # type: ignore[list-item]
    await asyncio.sleep(0)
    gc.collect()
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]


async def test_a_built_in_exception_from_sync_is_logged_with_its_type_and_place(caplog) -> None:
    class Buggy(Noop):
        async def sync(self, key: str) -> None:
            raise KeyError("spec")

    ctx = ControllerContext(client=None, informers=SharedInformerFactory(None), options=Options(), events=None)  # type: ignore[arg-type]
    buggy = Buggy(ctx)
    with caplog.at_level(logging.ERROR, logger="pykcm"):
        await buggy._process("ns/x")
    [line] = [r for r in caplog.records if r.getMessage() == "Error syncing, requeuing"]
    assert re.fullmatch(r"KeyError: 'spec' \(at test_runner\.py:\d+ in sync\)", line.kv["err"])  # type: ignore[attr-defined]
    assert line.kv["key"] == "ns/x"  # type: ignore[attr-defined]


async def test_the_start_line_comes_before_the_wait_for_caches_and_the_stop_line_after_a_cut_wait(
    monkeypatch, caplog
) -> None:
    # KCM's order (replica_set.go Run): "Starting controller", then WaitForNamedCacheSync's lines; its
    # deferred "Shutting down controller" is written even when the wait is cut short.
    monkeypatch.setattr(runner_module, "SYNC_POLL", 0.01)
    caplog.set_level(logging.INFO, logger="pykcm")
    namespaces = FakeInformer(NAMESPACES)
    runner = ControllerRunner(controller(), [namespaces])  # type: ignore[list-item]
    task = asyncio.create_task(runner.run())
    await asyncio.sleep(0.05)
    namespaces.synced = True
    await asyncio.wait_for(runner.started.wait(), 1)
    runner.controller.queue.shutdown()
    await asyncio.wait_for(task, 1)
    await cancelled_while_waiting_for_caches(ControllerRunner(controller(), [FakeInformer(NAMESPACES)]))  # type: ignore[list-item]
    assert [r.getMessage() for r in caplog.records] == [
        "Starting controller", "Waiting for caches to sync", "Caches are synced", "Shutting down controller",
        "Starting controller", "Waiting for caches to sync", "Shutting down controller"]
