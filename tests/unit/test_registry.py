"""Controller plugins that are broken or clash are one-line errors, before anything runs."""

from __future__ import annotations

from typing import Any

import pytest

from pykcm.app.manager import Manager, ManagerError
from pykcm.app.options import Options
from pykcm.client.config import ClientConfig
from pykcm.controller import Controller, PluginError, registry


class Plain(Controller):
    name = "plain-controller"
    aliases = ("plain",)

    async def sync(self, key: str) -> None:
        return None


class Nameless(Controller):  # forgot `name`
    async def sync(self, key: str) -> None:
        return None


class Squatter(Plain):
    name = "squatter-controller"
    aliases = ("plain",)  # another controller's alias: install order would decide what --controllers means


class FailsToBuild(Plain):
    name = "fails-controller"

    def __init__(self, ctx: Any) -> None:
        raise RuntimeError("no config map")


class NoSync(Controller):  # sync() left abstract
    name = "nosync-controller"


class EntryPoint:
    def __init__(self, cls: type) -> None:
        self.name, self.value, self._cls = cls.__name__.lower(), f"example:{cls.__name__}", cls

    def load(self) -> type:
        return self._cls


@pytest.mark.parametrize(
    ("classes", "message"),
    [
        ([Nameless], r"^controller plugin 'nameless' \(example:Nameless\) has no controller name"),
        ([Plain, Squatter], r"^controller plugin 'squatter' \(example:Squatter\): 'plain' already names "
                            r"controller 'plain-controller' of controller plugin 'plain' \(example:Plain\)$"),
    ],
)
def test_broken_or_clashing_plugins_are_named(monkeypatch: pytest.MonkeyPatch, classes: list, message: str) -> None:
    monkeypatch.setattr(registry, "entry_points", lambda group: [EntryPoint(c) for c in classes])
    with pytest.raises(PluginError, match=message):
        registry.discover_controllers()


def test_distinct_plugins_register(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "entry_points", lambda group: [EntryPoint(Plain), EntryPoint(Plain)])
    assert registry.discover_controllers() == {"plain-controller": Plain}  # the same class twice is one


@pytest.mark.parametrize(
    ("cls", "message"),
    [
        (FailsToBuild, "controller 'fails-controller' cannot be built: RuntimeError: no config map"),
        (NoSync, "controller 'nosync-controller' cannot be built: TypeError: Can't instantiate abstract class"),
    ],
)
async def test_a_controller_that_cannot_be_built_is_one_line(cls: type[Controller], message: str) -> None:
    manager = Manager(Options(), ClientConfig(host="http://127.0.0.1:1", ssl_context=None), [cls])
    with pytest.raises(ManagerError) as err:
        await manager._build_controllers()
    assert str(err.value).startswith(message) and "\n" not in str(err.value)
    await manager.client.close()
