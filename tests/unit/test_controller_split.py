"""KCM runs every controller pykcm does not: one split, used by the local cluster and the kind recipe."""

from __future__ import annotations

from pykcm.controller import discover_controllers
from pykcm.testenv.nodes import KCM_CONTROLLERS, PYKCM_CONTROLLERS
from tests.unit.test_deploy_manifests import controller_manager_args, kind_cluster_configuration_patches


def test_the_split_names_exactly_the_built_in_controllers() -> None:
    built_in = {c.name for c in discover_controllers().values() if c.__module__.startswith("pykcm.controllers.")}
    assert set(PYKCM_CONTROLLERS) == built_in
    assert KCM_CONTROLLERS.split(",")[-len(PYKCM_CONTROLLERS) :] == [f"-{name}" for name in PYKCM_CONTROLLERS]


def test_the_kind_recipe_uses_the_same_split() -> None:
    """In its patch for each kubeadm config version (tests/unit/test_deploy_manifests.py)."""
    patches = kind_cluster_configuration_patches()
    assert patches and {controller_manager_args(p)["controllers"] for p in patches} == {KCM_CONTROLLERS}
