"""The upstream e2e tests of pykcm's three controllers (see upstream.py for which run), run with
the upstream e2e.test binary twice, each on a fresh local cluster with three kwok nodes:

- KCM: the real kube-controller-manager runs every controller (kubeadm's set);
- pykcm: KCM runs every controller but pykcm's three, and `pykcm run` runs those as deployed:
  with deploy/'s ServiceAccount and RBAC, each controller as its own ServiceAccount.

Every test that passes for KCM must pass for pykcm. The two runs go at once, each on its own
cluster (they spend most of their time waiting for pods and conditions, so this halves the wall
time on 2 cores); each has a hard time limit, and their reports, e2e logs, pykcm's log and the clusters' logs stay
in the test's tmp dir. Run them alone with `python -m pytest -m e2e`.
"""

from __future__ import annotations

import concurrent.futures
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from pykcm.testenv.cluster import running
from pykcm.testenv.controlplane import ControlPlane
from pykcm.testenv.e2e import E2ERun, ensure_e2e_test, run_e2e
from pykcm.testenv.nodes import PYKCM_CONTROLLERS
from tests.deploy_credentials import install_deploy_credentials
from tests.e2e.upstream import NOT_RUN, RUN, focus_regex, skip_regex
from tests.support import CONTROLLER_KUBECONFIG_ENV, SA_CREDENTIALS_ENV, PykcmProcess

NODES = 3
ALL_KCM_CONTROLLERS = "*,bootstrap-signer-controller,token-cleaner-controller"  # kubeadm's value
E2E_TIMEOUT = 30 * 60  # hard limit of one e2e.test run, which takes about 4 minutes
BUILD_TIMEOUT = 30 * 60  # e2e.test from a cold Go build cache

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(BUILD_TIMEOUT + E2E_TIMEOUT + 5 * 60)]

Log = Callable[[str], None]
# The in-process managers of later tests read these; the runs here must leave them as they were
# (a run once left them pointing at its stopped cluster, and every integration test after it failed).
SESSION_ENV = (CONTROLLER_KUBECONFIG_ENV, SA_CREDENTIALS_ENV)
ENV_BEFORE = {name: os.environ.get(name) for name in SESSION_ENV}


@pytest.fixture(scope="module")
def e2e_binary(testenv_log: Log) -> Path:
    return ensure_e2e_test(testenv_log)


def _run(binary: Path, directory: Path, log: Log, *, pykcm: bool) -> E2ERun:
    controllers = {} if pykcm else {"kcm_controllers": ALL_KCM_CONTROLLERS}
    with running(directory / "cluster", nodes=NODES, log=log, **controllers) as plane:
        manager = None
        if pykcm:
            manager = PykcmProcess("--kubeconfig", str(_deploy_credentials(plane)), "--use-service-account-credentials",
                                   log_path=directory / "pykcm.log")
            _wait_for_caches(manager)
        try:
            return run_e2e(binary, plane.kubeconfig, directory / "report", focus=focus_regex(), skip=skip_regex(),
                           timeout=E2E_TIMEOUT, kubectl=plane.binaries.kubectl, log=log)
        finally:
            if manager is not None:
                _stop(manager)


def _deploy_credentials(plane: ControlPlane) -> Path:
    """pykcm as deployed: deploy/'s ServiceAccount and RBAC, each controller as its own
    ServiceAccount (the KCM of these clusters runs with --use-service-account-credentials too).
    Only this run's pykcm gets the kubeconfig: the tests after this module must not inherit it."""
    return install_deploy_credentials(plane, "deploy-sa-credentials")


def _wait_for_caches(manager: PykcmProcess, timeout: float = 60.0) -> None:
    """Until each of pykcm's controllers has synced its informers (each starts on its own)."""
    synced = [f'"Caches are synced" controller="{name}"' for name in PYKCM_CONTROLLERS]
    deadline = time.monotonic() + timeout
    while not all(line in manager.log() for line in synced):
        if manager.proc.poll() is not None or time.monotonic() > deadline:
            manager.kill()
            raise AssertionError(f"pykcm did not sync its caches:\n{manager.log()[-3000:]}")
        time.sleep(0.2)


def _stop(manager: PykcmProcess) -> None:
    """Stop pykcm; fail if it had died during the run (its results would not be pykcm's)."""
    died = manager.proc.poll()
    manager.signal()
    try:
        manager.proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        manager.kill()
    assert died is None, f"pykcm exited with {died} during the e2e run:\n{manager.log()[-3000:]}"


@pytest.fixture(scope="module")
def runs(e2e_binary: Path, tmp_path_factory: pytest.TempPathFactory, testenv_log: Log) -> tuple[E2ERun, E2ERun]:
    """Both runs, at once: KCM's and pykcm's."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="e2e") as pool:
        kcm = pool.submit(_run, e2e_binary, tmp_path_factory.mktemp("e2e-kcm"), testenv_log, pykcm=False)
        pykcm = pool.submit(_run, e2e_binary, tmp_path_factory.mktemp("e2e-pykcm"), testenv_log, pykcm=True)
        return kcm.result(), pykcm.result()


@pytest.fixture(scope="module")
def kcm_run(runs: tuple[E2ERun, E2ERun]) -> E2ERun:
    return runs[0]


@pytest.fixture(scope="module")
def pykcm_run(runs: tuple[E2ERun, E2ERun]) -> E2ERun:
    return runs[1]


def test_kcm_runs_exactly_the_selected_upstream_tests(kcm_run: E2ERun) -> None:
    _assert_ran_the_selection(kcm_run)


def test_pykcm_passes_every_upstream_test_that_kcm_passes(kcm_run: E2ERun, pykcm_run: E2ERun) -> None:
    _assert_ran_the_selection(pykcm_run)
    print(side_by_side(kcm_run, pykcm_run))
    regressions = sorted(kcm_run.with_status("passed") - pykcm_run.with_status("passed"))
    details = [f"{name}: {pykcm_run.results[name].message}" for name in regressions]
    assert regressions == [], "passed for KCM, not for pykcm:\n" + "\n".join(details) + f"\n(see {pykcm_run.log_path})"


def test_the_runs_leave_the_session_environment_as_they_found_it(kcm_run: E2ERun, pykcm_run: E2ERun) -> None:
    assert {name: os.environ.get(name) for name in SESSION_ENV} == ENV_BEFORE


def _assert_ran_the_selection(run: E2ERun) -> None:
    """Every selected test ran (none skipped, none missing: a renamed upstream test shows here),
    and the tests that need a container did not run."""
    assert run.junit_path.exists(), f"no JUnit report; see {run.log_path}"
    ran = {name for name, result in run.results.items() if result.status != "skipped"}
    assert sorted(ran) == sorted(RUN), f"see {run.log_path}"
    assert not set(NOT_RUN) & ran


def side_by_side(kcm: E2ERun, pykcm: E2ERun) -> str:
    rows = [("test", "KCM", "pykcm", "KCM s", "pykcm s")]
    for name in RUN:
        k, p = kcm.results.get(name), pykcm.results.get(name)
        rows.append((name, k.status if k else "-", p.status if p else "-",
                     f"{k.seconds:.0f}" if k else "", f"{p.seconds:.0f}" if p else ""))
    rows.append((f"e2e.test wall time (exit {kcm.exit_code} / {pykcm.exit_code})", "", "",
                 f"{kcm.seconds:.0f}", f"{pykcm.seconds:.0f}"))
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    return "\n" + "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in rows)
