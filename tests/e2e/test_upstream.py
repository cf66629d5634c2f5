"""The upstream e2e tests of pykcm's three controllers (see upstream.py for which run), run with
the upstream e2e.test binary twice, each on a fresh local cluster with three kwok nodes: with
KCM running every controller, and with pykcm running its three as deployed (see runs.py).

Every test that passes for KCM must pass for pykcm. The two runs go at once, each on its own
cluster (they spend most of their time waiting for pods and conditions, so this halves the wall
time on 2 cores); each has a hard time limit, and their reports, e2e logs, pykcm's log and the clusters' logs stay
in the test's tmp dir. Run them alone with `python -m pytest -m e2e`.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from pykcm.testenv.e2e import E2ERun, ensure_e2e_test
from tests.e2e.runs import (
    ENV_BEFORE,
    Log,
    assert_pykcm_passes_what_kcm_passes,
    assert_ran_exactly,
    at_once,
    run_on_cluster,
    session_env,
    side_by_side,
)
from tests.e2e.upstream import NOT_RUN, ON_REAL_NODE, RUN, focus_regex, skip_regex

NODES = 3
E2E_TIMEOUT = 30 * 60  # hard limit of one e2e.test run, which takes about 4 minutes
BUILD_TIMEOUT = 30 * 60  # e2e.test from a cold Go build cache

# Late: e2e.test builds in the background meanwhile (tests/background_builds.py).
pytestmark = [pytest.mark.e2e, pytest.mark.late("e2e-test"), pytest.mark.timeout(BUILD_TIMEOUT + E2E_TIMEOUT + 5 * 60)]


@pytest.fixture(scope="module")
def e2e_binary(testenv_log: Log) -> Path:
    return ensure_e2e_test(testenv_log)


def _run(binary: Path, directory: Path, log: Log, *, pykcm: bool) -> E2ERun:
    return run_on_cluster(binary, directory, log, pykcm=pykcm, focus=focus_regex(), skip=skip_regex(),
                          timeout=E2E_TIMEOUT, nodes=NODES)


@pytest.fixture(scope="module")
def runs(e2e_binary: Path, tmp_path_factory: pytest.TempPathFactory, testenv_log: Log) -> tuple[E2ERun, E2ERun]:
    """Both runs, at once: KCM's and pykcm's."""
    kcm, pykcm = at_once(
        functools.partial(_run, e2e_binary, tmp_path_factory.mktemp("e2e-kcm"), testenv_log, pykcm=False),
        functools.partial(_run, e2e_binary, tmp_path_factory.mktemp("e2e-pykcm"), testenv_log, pykcm=True),
        log=testenv_log,
    )
    return kcm, pykcm


@pytest.fixture(scope="module")
def kcm_run(runs: tuple[E2ERun, E2ERun]) -> E2ERun:
    return runs[0]


@pytest.fixture(scope="module")
def pykcm_run(runs: tuple[E2ERun, E2ERun]) -> E2ERun:
    return runs[1]


def test_kcm_runs_exactly_the_selected_upstream_tests(kcm_run: E2ERun) -> None:
    assert_ran_exactly(kcm_run, RUN, excluded=(*NOT_RUN, *ON_REAL_NODE))


def test_pykcm_passes_every_upstream_test_that_kcm_passes(kcm_run: E2ERun, pykcm_run: E2ERun) -> None:
    assert_ran_exactly(pykcm_run, RUN, excluded=(*NOT_RUN, *ON_REAL_NODE))
    print(side_by_side(kcm_run, pykcm_run, RUN))
    assert_pykcm_passes_what_kcm_passes(kcm_run, pykcm_run, RUN)


def test_the_runs_leave_the_session_environment_as_they_found_it(kcm_run: E2ERun, pykcm_run: E2ERun) -> None:
    assert session_env() == ENV_BEFORE
