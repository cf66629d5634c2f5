"""Loading controller plugins: each entry point on its own, so a broken plugin nobody enabled is a
warning, and every error names the entry point, its package, and what is wrong, on one line."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pykcm.app import cli
from pykcm.app.options import resolve_controllers
from pykcm.controller import Controller, PluginError, controllers_for, find_controllers, registry


class Plain(Controller):
    name = "plain-controller"
    aliases = ("plain",)

    async def sync(self, key: str) -> None:
        return None


class Impostor(Plain):  # another package's class under an existing controller name
    name = "plain-controller"


class NoSync(Controller):  # sync() left abstract: caught before any Lease is taken
    name = "nosync-controller"


class EntryPoint:
    def __init__(self, name: str, value: str, dist: str, load: Any) -> None:
        self.name, self.value, self.dist, self._load = name, value, SimpleNamespace(name=dist), load

    def load(self) -> Any:
        return self._load()


def of(cls: type, dist: str = "pykcm") -> EntryPoint:
    return EntryPoint(cls.__name__.lower(), f"example:{cls.__name__}", dist, lambda: cls)


@pytest.fixture
def mirror(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> EntryPoint:
    """A plugin whose module reads a setting at import that is not there: a KeyError two lines in."""
    (tmp_path / "mirrorplug.py").write_text('import os\nSETTING = os.environ["MIRROR_REQUIRED_SETTING"]\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("MIRROR_REQUIRED_SETTING", raising=False)
    monkeypatch.delitem(sys.modules, "mirrorplug", raising=False)
    from importlib.metadata import EntryPoint as RealEntryPoint

    real = RealEntryPoint("mirror-controller", "mirrorplug:MirrorController", registry.ENTRY_POINT_GROUP)
    return EntryPoint(real.name, real.value, "pykcm-mirror", real.load)


def installed(monkeypatch: pytest.MonkeyPatch, *eps: EntryPoint) -> None:
    monkeypatch.setattr(registry, "entry_points", lambda group: list(eps))


MIRROR_ERROR = ("controller plugin 'mirror-controller' (mirrorplug:MirrorController in pykcm-mirror) failed to load: "
                "KeyError: 'MIRROR_REQUIRED_SETTING' (at mirrorplug.py:2 in <module>)")

NOSYNC_ERROR = ("controller plugin 'nosync' (example:NoSync in pykcm-bad) has no sync(key) method: "
                "NoSync must define `async def sync(self, key)`")


def test_a_load_error_has_its_type_package_and_plugin_line(monkeypatch: pytest.MonkeyPatch, mirror: EntryPoint) -> None:
    installed(monkeypatch, of(Plain), mirror)
    plugins = find_controllers()
    assert plugins.controllers == {"plain-controller": Plain}  # the others still load
    [bad] = plugins.broken
    assert (bad.entry_point, bad.distribution, bad.error) == ("mirror-controller", "pykcm-mirror", MIRROR_ERROR)


def test_a_plugin_without_sync_is_refused_at_discovery(monkeypatch: pytest.MonkeyPatch) -> None:
    installed(monkeypatch, of(NoSync, "pykcm-bad"))
    [bad] = find_controllers().broken
    assert bad.error == NOSYNC_ERROR


def test_two_plugins_with_one_name_are_both_named(monkeypatch: pytest.MonkeyPatch) -> None:
    installed(monkeypatch, of(Plain, "pykcm"), of(Impostor, "pykcm-mirror"))
    with pytest.raises(PluginError) as err:
        find_controllers()
    assert str(err.value) == ("controller plugin 'impostor' (example:Impostor in pykcm-mirror) registers controller "
                              "'plain-controller', already registered by "
                              "controller plugin 'plain' (example:Plain in pykcm)")


@pytest.mark.parametrize("spec", [["mirror-controller"], ["*"], ["plain", "*"], ["*", "-plain"],
                                  ["mirror-controller", "-mirror-controller"]])  # the first entry naming it wins
def test_a_broken_plugin_the_run_would_enable_is_an_error(monkeypatch: pytest.MonkeyPatch, mirror: EntryPoint,
                                                          spec: list[str]) -> None:
    installed(monkeypatch, of(Plain), mirror)
    with pytest.raises(PluginError) as err:
        controllers_for(spec)
    assert str(err.value) == MIRROR_ERROR


@pytest.mark.parametrize("spec", [["plain"], ["*", "-mirror-controller"], ["-mirror-controller", "*"]])
def test_a_broken_plugin_left_off_is_one_warning(monkeypatch: pytest.MonkeyPatch, mirror: EntryPoint, spec: list[str],
                                                 caplog: pytest.LogCaptureFixture) -> None:
    installed(monkeypatch, of(Plain), mirror)
    with caplog.at_level(logging.INFO, logger="pykcm"):
        controllers, kept = controllers_for(spec)
    assert controllers == {"plain-controller": Plain}
    assert resolve_controllers(kept, controllers.values()) == ["plain-controller"]  # `-mirror-controller` gone
    [record] = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert record.getMessage() == "Skipping a controller plugin that failed to load"
    assert record.kv == {"entryPoint": "mirror-controller", "distribution": "pykcm-mirror",  # type: ignore[attr-defined]
                         "err": MIRROR_ERROR.split(") ", 1)[1]}


def test_listing_shows_the_others_and_each_broken_plugin(monkeypatch: pytest.MonkeyPatch, mirror: EntryPoint,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    installed(monkeypatch, of(Plain), mirror, of(NoSync, "pykcm-bad"))
    assert cli.main(["controllers"]) == 1
    out, err = capsys.readouterr()
    assert out == "plain-controller\ton (aliases: plain)\n"
    assert err.splitlines() == [f"pykcm: error: {MIRROR_ERROR}", f"pykcm: error: {NOSYNC_ERROR}"]


def test_listing_without_broken_plugins_succeeds(monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    installed(monkeypatch, of(Plain))
    assert cli.main(["controllers"]) == 0
    assert capsys.readouterr() == ("plain-controller\ton (aliases: plain)\n", "")


def test_a_plugin_whose_module_is_missing_is_named_without_importlibs_frame(monkeypatch: pytest.MonkeyPatch) -> None:
    from importlib.metadata import EntryPoint as RealEntryPoint

    real = RealEntryPoint("gone-controller", "nothere_module:Gone", registry.ENTRY_POINT_GROUP)
    installed(monkeypatch, EntryPoint(real.name, real.value, "pykcm-gone", real.load))
    [bad] = find_controllers().broken
    assert bad.reason == "failed to load: ModuleNotFoundError: No module named 'nothere_module'"
