"""The wheel's package list (explicit, because controllers/ installs as pykcm.controllers) must
name every Python package of the checkout, and no top-level `controllers` package."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).parents[2]


def _packages_on_disk() -> set[str]:
    found = set()
    for top, name in ((ROOT / "pykcm", "pykcm"), (ROOT / "controllers", "pykcm.controllers")):
        for init in top.rglob("__init__.py"):
            parts = init.parent.relative_to(top).parts
            found.add(".".join((name, *parts)))
    return found


def test_every_package_is_installed_under_pykcm() -> None:
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert set(setuptools["packages"]) == _packages_on_disk()
    assert setuptools["package-dir"] == {"pykcm.controllers": "controllers"}
    assert not any(p == "controllers" or p.startswith("controllers.") for p in setuptools["packages"])
