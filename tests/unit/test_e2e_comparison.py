"""How the e2e tests read two runs (tests/e2e/runs.py) and how they end when stopped from outside, with
no e2e.test or cluster of their own: a comparison in which KCM passed nothing, a run killed at its time
limit, or a cluster that lost a process fails; SIGTERM or SIGHUP to pytest stops the local clusters
(tests/conftest.py), even after a test caught an interrupted block; the kind script ends in one line,
not a traceback."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from pykcm.testenv import interrupts
from pykcm.testenv.e2e import E2ERun, SpecResult
from pykcm.testenv.errors import BuildError, ControlPlaneError
from tests.e2e import runs
from tests.e2e import test_upstream_kind as kind_script
from tests.support import process_alive

CHECKOUT = Path(__file__).parents[2]
NAMES = ("[sig-apps] ReplicaSet a", "[sig-apps] ReplicaSet b", "[sig-auth] ServiceAccounts c")


def _run(tmp_path: Path, statuses: dict[str, str], exit_code: int | None = 0) -> E2ERun:
    junit = tmp_path / "junit_01.xml"
    junit.write_text("<testsuites/>")
    results = {name: SpecResult(name, status, 1.0, "" if status == "passed" else "connection refused")
               for name, status in statuses.items()}
    return E2ERun(results, exit_code, 10.0, tmp_path / "e2e.log", junit)


def test_a_comparison_in_which_kcm_passed_nothing_fails(tmp_path):
    """Both sides failing everything (a broken node image, a dead apiserver) is no regression, and
    no evidence either."""
    kcm = pykcm = _run(tmp_path, dict.fromkeys(NAMES, "failed"), exit_code=1)
    runs.assert_ran_exactly(kcm, NAMES)
    with pytest.raises(AssertionError, match="no test passed for KCM"):
        runs.assert_pykcm_passes_what_kcm_passes(kcm, pykcm, NAMES)


@pytest.mark.parametrize("pykcm_status", ["failed", "passed"])
def test_a_comparison_of_one_test_passes_if_kcm_failed_it(tmp_path, pykcm_status):
    """The one-test comparisons (the token rotation) pass "if KCM does": a KCM flake there is no
    failure of pykcm's."""
    names = NAMES[:1]
    kcm = _run(tmp_path, dict.fromkeys(names, "failed"), exit_code=1)
    pykcm = _run(tmp_path, dict.fromkeys(names, pykcm_status), exit_code=int(pykcm_status == "failed"))
    runs.assert_pykcm_passes_what_kcm_passes(kcm, pykcm, names)


def test_kcm_may_fail_one_test_if_pykcm_passes_what_it_passes(tmp_path):
    statuses = {**dict.fromkeys(NAMES, "passed"), NAMES[0]: "failed"}
    runs.assert_pykcm_passes_what_kcm_passes(_run(tmp_path, statuses, 1), _run(tmp_path, statuses, 1), NAMES)
    regressed = {**statuses, NAMES[1]: "failed"}
    with pytest.raises(AssertionError, match=r"passed for KCM, not for pykcm:\n\[sig-apps\] ReplicaSet b"):
        runs.assert_pykcm_passes_what_kcm_passes(_run(tmp_path, statuses, 1), _run(tmp_path, regressed, 1), NAMES)


def test_a_run_killed_at_its_time_limit_fails(tmp_path):
    killed = _run(tmp_path, dict.fromkeys(NAMES, "passed"), exit_code=None)
    with pytest.raises(AssertionError, match="killed at its time limit"):
        runs.assert_ran_exactly(killed, NAMES)


class DeadProcess:
    name, pid, log_path = "kube-apiserver", 4242, Path("/nowhere/kube-apiserver.log")

    def log_tail(self, lines: int = 25) -> list[str]:
        return ["etcdserver: request timed out"]


class FakePlane:
    kubeconfig = Path("/nowhere/kubeconfig")
    binaries = SimpleNamespace(kubectl=None)

    def __init__(self, dead: list) -> None:
        self.dead = dead

    def dead_processes(self) -> list:
        return self.dead


@pytest.mark.parametrize("dead", [[], [DeadProcess()]])
def test_a_cluster_that_lost_a_process_during_the_run_fails_it_naming_the_process(tmp_path, monkeypatch, dead):
    run = _run(tmp_path, dict.fromkeys(NAMES, "failed"), exit_code=1)

    @contextlib.contextmanager
    def running(directory: Path, **kwargs) -> Iterator[FakePlane]:
        yield FakePlane(dead)

    monkeypatch.setattr(runs, "running", running)
    monkeypatch.setattr(runs, "run_beside_pykcm", lambda *args, **kwargs: run)
    with pytest.raises(AssertionError) if dead else contextlib.nullcontext() as failed:
        assert runs.run_on_cluster(Path("e2e.test"), tmp_path, print, pykcm=False, focus="f", skip="",
                                   timeout=60) is run
    if dead:
        assert "lost kube-apiserver (pid 4242), last lines: etcdserver: request timed out" in str(failed.value)


# ----- stopped from outside

HELD_CLUSTER = textwrap.dedent("""
    import time
    from pathlib import Path
    from pykcm.testenv import cluster, processes
    from pykcm.testenv.build import Binaries
    from pykcm.testenv.controlplane import ControlPlane

    HERE = Path(__file__).parent

    def start(path, **kwargs):  # a cluster of one process, in a session of its own as etcd is
        proc = processes.spawn("etcd", ["sleep", "120"], path / "logs")
        return ControlPlane(path, Binaries(Path("kube-apiserver"), Path("etcd")),
                            {"apiserver": 1, "etcd_client": 2}, {"etcd": proc}, log=kwargs["log"])

    def test_holds_a_cluster(monkeypatch):
        monkeypatch.setattr(cluster, "start", start)
        with cluster.running(HERE / "cluster", log=print) as plane:  # as run_on_cluster does
            (HERE / "pid.tmp").write_text(str(plane.processes["etcd"].pid))
            (HERE / "pid.tmp").rename(HERE / "pid")
            time.sleep(120)
""")


@pytest.mark.parametrize(("signals", "sighup_ignored"), [
    ((signal.SIGTERM,), False),
    ((signal.SIGHUP,), False),
    ((signal.SIGHUP, signal.SIGTERM), True),  # under nohup, as CI runs: SIGHUP changes nothing
])
def test_sigterm_or_sighup_to_pytest_stops_the_local_clusters(tmp_path, signals, sighup_ignored):
    """A pytest session with tests/conftest.py in a running() block; the cluster's process lives in a
    session of its own, so only running()'s teardown stops it."""
    (tmp_path / "test_held.py").write_text(HELD_CLUSTER)
    # The child's SIGHUP as the case says, whatever this pytest inherited (CI runs under nohup).
    sighup = signal.SIG_IGN if sighup_ignored else signal.SIG_DFL
    ignore = lambda: signal.signal(signal.SIGHUP, sighup)  # noqa: E731
    session = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest",
         "--rootdir", str(tmp_path), str(tmp_path / "test_held.py")],
        cwd=CHECKOUT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, preexec_fn=ignore,
    )
    pid = 0
    try:
        pid = int(_wait_for(tmp_path / "pid", session))
        for signum in signals:
            time.sleep(0.5)  # SIGHUP first: had it ended pytest, the SIGTERM would find it gone
            assert session.poll() is None and process_alive(pid), signal.Signals(signum).name
            session.send_signal(signum)
        output, _ = session.communicate(timeout=20)
        deadline = time.monotonic() + 20
        while process_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not process_alive(pid), output
        assert session.returncode == pytest.ExitCode.INTERRUPTED, output
    finally:
        session.kill()
        session.communicate()
        if pid and process_alive(pid):
            os.kill(pid, signal.SIGKILL)


AFTER_AN_INTERRUPTED_BLOCK = textwrap.dedent("""
    import os
    import signal
    import time
    from pathlib import Path

    import pytest

    from pykcm.testenv import interrupts

    HERE = Path(__file__).parent

    def test_interrupts_a_block():  # as the unit tests of interruptible() do, in-process
        handlers = interrupts.saved()
        try:
            with pytest.raises(interrupts.Interrupted), interrupts.interruptible():
                signal.raise_signal(signal.SIGTERM)
                time.sleep(1)
        finally:
            interrupts.restore(handlers)

    def test_runs_on():
        (HERE / "pid.tmp").write_text(str(os.getpid()))
        (HERE / "pid.tmp").rename(HERE / "pid")
        time.sleep(60)
""")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_signal_to_pytest_still_ends_it_after_a_test_caught_an_interrupted_block(tmp_path, signum):
    """The session's SIGTERM and SIGHUP raise once for the session, whatever interruptible() blocks
    raised in earlier tests: they shared one flag, and the session ran on to its end (the e2e
    comparison, which runs last, could no longer be cancelled)."""
    (tmp_path / "test_after.py").write_text(AFTER_AN_INTERRUPTED_BLOCK)
    session = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest",
         "--rootdir", str(tmp_path), str(tmp_path / "test_after.py")],
        cwd=CHECKOUT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL),  # as in a terminal, not under nohup
    )
    try:
        _wait_for(tmp_path / "pid", session)
        time.sleep(0.5)
        session.send_signal(signum)
        output, _ = session.communicate(timeout=10)
        assert session.returncode == pytest.ExitCode.INTERRUPTED, output
        assert "1 passed" in output, output
    finally:
        session.kill()
        session.communicate()


def _wait_for(path: Path, session: subprocess.Popen[str], timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if session.poll() is not None or time.monotonic() > deadline:
            session.kill()
            pytest.fail(f"the session did not start its cluster:\n{session.communicate()[0]}")
        time.sleep(0.05)
    return path.read_text()


@pytest.fixture
def kind_main(tmp_path, monkeypatch):
    """The kind script up to run_both, which the test replaces; its temp dir under tmp_path."""
    monkeypatch.setattr(kind_script.cluster, "missing_prerequisites", list)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    handlers = interrupts.saved()
    signal.signal(signal.SIGTERM, lambda *_: None)  # not this session's handler: main must install its own
    yield lambda run_both: (monkeypatch.setattr(kind_script, "run_both", run_both), kind_script.main([]))[1]
    interrupts.restore(handlers)  # an interruption leaves them ignored: the script is ending


def _raises(error: BaseException):
    def run_both(*args, **kwargs):
        raise error

    return run_both


def _signalled(signum: int):
    def run_both(*args, **kwargs):
        signal.raise_signal(signum)
        time.sleep(1)
        pytest.fail("the signal did not interrupt the run")

    return run_both


@pytest.mark.parametrize(("run_both", "line"), [
    (_raises(BuildError("building e2e.test packages failed (exit 1): x.go:1:1: syntax error\nlog tail")),
     "error: building e2e.test packages failed (exit 1): x.go:1:1: syntax error"),
    (_raises(ControlPlaneError("kind create cluster failed")), "error: kind create cluster failed"),
    (_raises(OSError(28, "No space left on device", "/tmp/x")), "error: No space left on device: /tmp/x"),
    (_raises(KeyboardInterrupt()), "error: interrupted"),
    (_signalled(signal.SIGTERM), "error: interrupted"),
])
def test_the_kind_script_ends_in_one_line_not_a_traceback(kind_main, capsys, run_both, line):
    assert kind_main(run_both) == 1
    out = capsys.readouterr()
    assert out.out.splitlines()[0] == line and out.out.splitlines()[1].startswith("reports and logs: ")
    assert out.err == ""
