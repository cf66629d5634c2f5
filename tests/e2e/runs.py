"""One e2e.test run on a fresh local cluster, with KCM alone or with pykcm as deployed, and how
two such runs are compared: the helpers of test_upstream.py (kwok nodes),
test_upstream_containers.py (the real node) and test_upstream_kind.py (kind clusters, whose
e2e.test runs go through run_beside_pykcm).

- KCM: the real kube-controller-manager runs every controller (kubeadm's set);
- pykcm: KCM runs every controller but pykcm's three, and `pykcm run` runs those as deployed:
  with deploy/'s ServiceAccount and RBAC, each controller as its own ServiceAccount.
"""

from __future__ import annotations

import concurrent.futures
import os
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pykcm.testenv.cluster import running
from pykcm.testenv.controlplane import ControlPlane
from pykcm.testenv.e2e import E2ERun, end_all, run_e2e
from pykcm.testenv.nodes import KUBEADM_CONTROLLERS, PYKCM_CONTROLLERS
from tests.deploy_credentials import install_deploy_credentials
from tests.support import CONTROLLER_KUBECONFIG_ENV, SA_CREDENTIALS_ENV, PykcmProcess

# pykcm as deployed: deploy/'s ServiceAccount and RBAC, each controller as its own ServiceAccount
# (the KCM of these clusters runs with --use-service-account-credentials too).
DEPLOY_MODE = "deploy-sa-credentials"

Log = Callable[[str], None]
# The in-process managers of later tests read these; the runs here must leave them as they were
# (a run once left them pointing at its stopped cluster, and every integration test after it failed).
SESSION_ENV = (CONTROLLER_KUBECONFIG_ENV, SA_CREDENTIALS_ENV)
ENV_BEFORE = {name: os.environ.get(name) for name in SESSION_ENV}


def session_env() -> dict[str, str | None]:
    return {name: os.environ.get(name) for name in SESSION_ENV}


def run_on_cluster(
    binary: Path, directory: Path, log: Log, *, pykcm: bool, focus: str, skip: str, timeout: float,
    prepare: Callable[[ControlPlane], None] | None = None, **cluster: Any,
) -> E2ERun:
    """Start a cluster (`cluster` are `running`'s arguments), call `prepare` on it, and run
    e2e.test with `focus` and `skip` on it (beside pykcm if asked)."""
    controllers = {} if pykcm else {"kcm_controllers": KUBEADM_CONTROLLERS}
    with running(directory / "cluster", log=log, **controllers, **cluster) as plane:
        if prepare is not None:
            prepare(plane)
        # Only this run's pykcm gets the kubeconfig: the tests after this module must not inherit it.
        credentials = install_deploy_credentials(plane, DEPLOY_MODE) if pykcm else None
        run = run_beside_pykcm(binary, plane.kubeconfig, plane.binaries.kubectl, directory, log, credentials,
                               focus=focus, skip=skip, timeout=timeout)
        assert_cluster_lived(plane, run)
        return run


def at_once(*runs: Callable[[], E2ERun], log: Log) -> tuple[E2ERun, ...]:
    """Each of `runs` (run_on_cluster, say) in a worker thread of its own; their results, in order."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(runs), thread_name_prefix="e2e") as pool:
        try:
            futures = [pool.submit(run) for run in runs]
            return tuple(future.result() for future in futures)
        except BaseException:
            # ^C, SIGTERM or a test's timeout reach this thread only, and e2e.test, in a process group of
            # its own, no longer gets the terminal's ^C: leaving the pool would wait for the workers'
            # e2e.test to end by itself (up to its time limit). A run that failed ends the other too.
            end_all(log=log)
            raise


def assert_cluster_lived(plane: ControlPlane, run: E2ERun) -> None:
    """A process of the cluster that died during the run (etcd, the apiserver, kwok ...) failed its
    specs for a reason that is neither KCM's nor pykcm's: the comparison would mean nothing."""
    dead = plane.dead_processes()
    lost = "; ".join(f"{p.name} (pid {p.pid}), last lines: {' | '.join(p.log_tail(5))} (log: {p.log_path})"
                     for p in dead)
    assert not dead, f"the cluster lost {lost} during the e2e run (see {run.log_path})"


def run_beside_pykcm(
    binary: Path, kubeconfig: Path, kubectl: Path | None, directory: Path, log: Log, pykcm_kubeconfig: Path | None,
    *, focus: str, skip: str, timeout: float,
) -> E2ERun:
    """e2e.test on a running cluster, with `pykcm run` from outside if `pykcm_kubeconfig` is given
    (deploy/'s credentials, see install_deploy_credentials) until e2e.test is done."""
    manager = None
    if pykcm_kubeconfig is not None:
        manager = PykcmProcess("--kubeconfig", str(pykcm_kubeconfig), "--use-service-account-credentials",
                               log_path=directory / "pykcm.log")
        _wait_for_caches(manager)
    try:
        return run_e2e(binary, kubeconfig, directory / "report", focus=focus, skip=skip, timeout=timeout,
                       kubectl=kubectl, log=log)
    finally:
        if manager is not None:
            _stop(manager)


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


def assert_ran_exactly(run: E2ERun, selected: Sequence[str], excluded: Sequence[str] = ()) -> None:
    """Every selected test ran (none skipped, none missing: a renamed upstream test shows here),
    and none of `excluded` did."""
    assert run.exit_code is not None, f"e2e.test was killed at its time limit; see {run.log_path}"
    assert run.junit_path.exists(), f"no JUnit report; see {run.log_path}"
    ran = {name for name, result in run.results.items() if result.status != "skipped"}
    assert sorted(ran) == sorted(selected), f"see {run.log_path}"
    assert not set(excluded) & ran


def assert_pykcm_passes_what_kcm_passes(kcm: E2ERun, pykcm: E2ERun, selected: Sequence[str]) -> None:
    """Every test that passed for KCM passed for pykcm; and of several `selected`, KCM passed some (KCM
    may flake on one, but none passing means its side broke, say its cluster or images, and then nothing
    was compared). A comparison of one test passes if KCM failed it: its contract is "if KCM does"."""
    assert len(selected) < 2 or kcm.with_status("passed"), (
        f"no test passed for KCM, so nothing was compared; see {kcm.log_path}")
    regressions = sorted(kcm.with_status("passed") - pykcm.with_status("passed"))
    details = [f"{name}: {pykcm.results[name].message}" for name in regressions]
    assert regressions == [], "passed for KCM, not for pykcm:\n" + "\n".join(details) + f"\n(see {pykcm.log_path})"


def side_by_side(kcm: E2ERun, pykcm: E2ERun, names: Sequence[str]) -> str:
    rows = [("test", "KCM", "pykcm", "KCM s", "pykcm s")]
    for name in names:
        k, p = kcm.results.get(name), pykcm.results.get(name)
        rows.append((name, k.status if k else "-", p.status if p else "-",
                     f"{k.seconds:.0f}" if k else "", f"{p.seconds:.0f}" if p else ""))
    rows.append((f"e2e.test wall time (exit {kcm.exit_code} / {pykcm.exit_code})", "", "",
                 f"{kcm.seconds:.0f}", f"{pykcm.seconds:.0f}"))
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    return "\n" + "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in rows)
