"""A plugin's failures once it is built: each names the controller, the exception's type and, for a
built-in one, where it was raised; a requeue with no delay left backs off instead of spinning."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from pykcm.app.manager import Manager, ManagerError
from pykcm.app.options import Options
from pykcm.client.config import ClientConfig
from pykcm.controller import Controller, ControllerContext, RequeueAfter
from pykcm.informers.factory import SharedInformerFactory

NOWHERE = ClientConfig(host="http://127.0.0.1:1", ssl_context=None)


class Mirror(Controller):
    name = "mirror-controller"

    async def sync(self, key: str) -> None:
        return None


class CrashesInRun(Mirror):
    name = "crash-controller"

    async def run(self) -> None:
        {}["spec"]  # the bug a plugin ships: a KeyError


class WrongWorkersOption(Mirror):
    workers_option = "concurrent_mirror_syncs"  # not a pykcm flag: plugins cannot add any


class FailsToBuild(Mirror):
    def __init__(self, ctx: Any) -> None:
        raise KeyError("MIRROR_REQUIRED_SETTING")


async def test_a_controller_that_crashes_is_named_with_type_and_place(caplog: pytest.LogCaptureFixture) -> None:
    manager = Manager(Options(), NOWHERE, [Mirror, CrashesInRun])  # the one that crashed is named, not the first
    with caplog.at_level(logging.INFO, logger="pykcm"), pytest.raises(ManagerError) as err:
        await asyncio.wait_for(manager._run_controllers(asyncio.Event()), 10)
    described = f"KeyError: 'spec' (at test_plugin_runtime.py:{line_of('{}[')} in run)"
    assert str(err.value) == f"controller 'crash-controller' stopped unexpectedly: {described}"
    messages = [r.getMessage() for r in caplog.records]
    crashed = messages.index("Controller stopped unexpectedly")  # logged as it happens, before the shutdown it causes
    assert crashed < messages.index("Shutting down controllers")
    assert caplog.records[crashed].kv == {"controller": "crash-controller", "err": described}  # type: ignore[attr-defined]
    await manager.client.close()


def line_of(text: str) -> int:
    """The line of this file where `text` first appears in code."""
    with open(__file__) as source:
        return next(n for n, line in enumerate(source, 1) if line.lstrip().startswith(text))


async def test_a_workers_option_pykcm_lacks_fails_the_build_naming_the_controller() -> None:
    manager = Manager(Options(), NOWHERE, [WrongWorkersOption])
    with pytest.raises(ManagerError) as err:
        await manager._build_controllers()
    assert str(err.value) == ("controller 'mirror-controller' cannot be built: its workers_option "
                              "'concurrent_mirror_syncs' is not a pykcm option (see `pykcm run --help`)")
    assert manager.controllers == []  # nothing built, no worker started
    await manager.client.close()


async def test_a_constructor_error_has_its_type_and_place() -> None:
    manager = Manager(Options(), NOWHERE, [FailsToBuild])
    with pytest.raises(ManagerError) as err:
        await manager._build_controllers()
    assert str(err.value) == ("controller 'mirror-controller' cannot be built: KeyError: 'MIRROR_REQUIRED_SETTING' "
                              f"(at test_plugin_runtime.py:{line_of('raise KeyError')} in __init__)")
    await manager.client.close()


def build(cls: type[Controller]) -> Controller:
    ctx = ControllerContext(client=None, informers=SharedInformerFactory(None), options=Options(), events=None)  # type: ignore[arg-type]
    return cls(ctx)


@pytest.mark.parametrize("seconds", [0, -3.5])
async def test_requeue_after_no_delay_backs_off(seconds: float) -> None:
    controller = build(Mirror)
    delays: list[float] = []
    controller.queue.add_after = lambda key, delay: delays.append(delay)  # type: ignore[method-assign]

    async def sync(key: str) -> None:
        raise RequeueAfter(seconds)  # a deadline that has passed

    controller.sync = sync  # type: ignore[method-assign]
    for _ in range(4):
        await controller._process("demo/a")
    # The rate limiter's backoff, not an instant re-add.
    assert [round(d, 3) for d in delays] == [0.005, 0.01, 0.02, 0.04]
    assert controller.queue.num_requeues("demo/a") == 4


async def test_requeue_after_a_delay_waits_that_long() -> None:
    controller = build(Mirror)
    delays: list[float] = []
    controller.queue.add_after = lambda key, delay: delays.append(delay)  # type: ignore[method-assign]

    async def sync(key: str) -> None:
        raise RequeueAfter(30)

    controller.sync = sync  # type: ignore[method-assign]
    await controller._process("demo/a")
    assert delays == [30] and controller.queue.num_requeues("demo/a") == 0
