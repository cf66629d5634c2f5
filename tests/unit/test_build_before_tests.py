"""tests/conftest.py builds what the collected tests' clusters need before the first test, outside
every test's time limit: from their markers, the KCM for `kcm` and `nodes` tests (envtest's assets,
KUBEBUILDER_ASSETS, have none), kube-scheduler and kwok for `nodes` ones; a failure is one line."""

from __future__ import annotations

from typing import Any

import pytest

from pykcm.testenv.errors import BuildError
from tests import conftest


@pytest.fixture
def builds(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, dict[str, Any]]]:
    """What _build_control_plane asked for, in order, nothing built."""
    asked: list[tuple[str, dict[str, Any]]] = []
    monkeypatch.setattr(conftest, "ensure_binaries", lambda **kwargs: asked.append(("binaries", kwargs)))
    monkeypatch.setattr(conftest, "ensure_kwok", lambda log: asked.append(("kwok", {})))
    return asked


def _needs(asked: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, dict[str, bool]]]:
    return [(what, {k: v for k, v in kwargs.items() if k.startswith("need_")}) for what, kwargs in asked]


@pytest.mark.parametrize(("marks", "need_kcm", "nodes"), [
    ([{"integration"}, {"parametrize"}], False, False),
    ([{"integration"}, {"integration", "kcm"}], True, False),
    ([{"integration", "nodes"}], True, True),
    ([{"e2e", "late"}, {"integration", "realnode", "kcm"}, {"integration", "nodes"}], True, True),
], ids=["integration", "kcm", "nodes", "e2e-kcm-nodes"])
def test_the_collected_tests_markers_say_what_is_built_before_the_first_test(builds, marks, need_kcm, nodes):
    conftest._build_control_plane(marks, lambda _line: None)
    expected = [("binaries", {"need_kcm": need_kcm, "need_kubectl": True, "need_scheduler": nodes})]
    assert _needs(builds) == expected + ([("kwok", {})] if nodes else [])


def test_a_unit_only_run_builds_nothing(builds):
    conftest._build_control_plane([set(), {"parametrize"}, {"late"}], lambda _line: None)
    assert builds == []


@pytest.mark.parametrize("error", [BuildError("building kube-scheduler failed (exit 1)\nlog tail"),
                                   OSError(28, "No space left on device", "/root/.cache/x")])
def test_a_failed_build_is_one_line_and_the_next_one_still_runs(monkeypatch, error):
    def fail(**_kwargs: Any) -> None:
        raise error

    said: list[str] = []
    kwok: list[str] = []
    monkeypatch.setattr(conftest, "ensure_binaries", fail)
    monkeypatch.setattr(conftest, "ensure_kwok", lambda log: kwok.append("built"))
    conftest._build_control_plane([{"integration", "nodes"}], said.append)
    reason = str(error).splitlines()[0] if isinstance(error, BuildError) else "No space left on device: /root/.cache/x"
    assert said == [f"building the control plane failed: {reason}"] and kwok == ["built"]
