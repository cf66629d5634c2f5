"""KCM runs every controller pykcm does not: one split, used by the local cluster and the kind recipe."""

from __future__ import annotations

from pathlib import Path

import yaml

from pykcm.controller import discover_controllers
from pykcm.testenv.nodes import KCM_CONTROLLERS, PYKCM_CONTROLLERS

KIND_CONFIG = Path(__file__).parents[2] / "deploy" / "kind" / "kind-config.yaml"


def test_the_split_names_exactly_the_built_in_controllers() -> None:
    built_in = {c.name for c in discover_controllers().values() if c.__module__.startswith("pykcm.controllers.")}
    assert set(PYKCM_CONTROLLERS) == built_in
    assert KCM_CONTROLLERS.split(",")[-len(PYKCM_CONTROLLERS) :] == [f"-{name}" for name in PYKCM_CONTROLLERS]


def test_the_kind_recipe_uses_the_same_split() -> None:
    config = yaml.safe_load(KIND_CONFIG.read_text())
    [control_plane] = [node for node in config["nodes"] if node["role"] == "control-plane"]
    patches = [yaml.safe_load(patch) for patch in control_plane["kubeadmConfigPatches"]]
    args = {a["name"]: a["value"] for p in patches for a in p.get("controllerManager", {}).get("extraArgs", [])}
    assert args["controllers"] == KCM_CONTROLLERS
