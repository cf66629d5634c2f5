"""pykcm/testenv/interrupts.py and its users: a signal while a local cluster starts or stops never
leaves a process of it running (SIGTERM and SIGHUP raise as Ctrl-C does, once; a teardown is not
cut short but kills), processes spawned for a cluster are stopped with it even unrecorded, and
`run --local`'s own processes die with it (PR_SET_PDEATHSIG); the temp dir of `running()` goes
unless a process of the cluster failed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import pytest

from pykcm.testenv import cluster, interrupts, processes
from pykcm.testenv.errors import BuildError, ControlPlaneError
from tests.support import process_alive


@pytest.fixture(autouse=True)
def handlers_restored():
    before = interrupts.saved()
    yield
    interrupts.restore(before)


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGHUP, 129), (signal.SIGINT, 130)])
def test_a_signal_raises_once_and_a_later_one_does_not_cut_the_cleanup_short(signum, code):
    signal.signal(signum, signal.SIG_DFL)  # as in a terminal: under nohup (a CI runner's) SIGHUP is ignored
    before = signal.getsignal(signum)
    cleaned = False
    with pytest.raises(interrupts.Interrupted) as err, interrupts.interruptible():
        try:
            signal.raise_signal(signum)
            pytest.fail("the signal did not raise")
        finally:
            signal.raise_signal(signal.SIGTERM)  # again, during the cleanup: remembered, not raised
            cleaned = True
    assert cleaned and (err.value.signum, err.value.exit_code) == (signum, code)
    assert interrupts._state.again == signal.SIGTERM
    assert signal.getsignal(signum) == signal.SIG_IGN  # the command is ending: a third one must not end it
    signal.signal(signum, before)
    with interrupts.interruptible():
        pass
    assert signal.getsignal(signum) == before  # a block that ends without a signal puts them back


def test_no_signal_raises_between_a_fork_and_its_record():
    recorded = []
    with interrupts.interruptible(), pytest.raises(interrupts.Interrupted), interrupts.deferred():
        signal.raise_signal(signal.SIGTERM)
        time.sleep(0.01)
        recorded.append("child")
    assert recorded == ["child"]


def test_a_signal_the_session_deferred_raises_at_the_blocks_end_whatever_blocks_did_before(monkeypatch):
    """raise_on_termination()'s handler (pytest's) has a flag of its own, and a signal deferred under it
    is raised by it: an earlier interruptible() block's Interrupted (a test's) left the blocks' flag set,
    and the session's signal was then only remembered, never raised."""
    monkeypatch.setattr(interrupts._on_signal, "raised", True)  # as an earlier block left it
    monkeypatch.setattr(interrupts._on_session_signal, "raised", False)  # and put back: it is this session's
    interrupts.raise_on_termination()
    recorded = []
    with pytest.raises(interrupts.Interrupted), interrupts.deferred():
        signal.raise_signal(signal.SIGTERM)
        time.sleep(0.01)
        recorded.append("child")
    assert recorded == ["child"]


def test_an_ignored_sighup_stays_ignored_as_go_leaves_it():
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # nohup
    with interrupts.interruptible():
        signal.raise_signal(signal.SIGHUP)
        time.sleep(0.01)
        assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN


def test_off_the_main_thread_nothing_changes():
    errors = []

    def body() -> None:
        try:
            with interrupts.interruptible(), interrupts.killing_on_signal(list, print):
                pass
        except BaseException as err:  # signal.signal() raises ValueError off the main thread
            errors.append(err)

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    assert errors == []


class Fake:
    def __init__(self) -> None:
        self.kills = 0

    def kill(self) -> None:
        self.kills += 1


def test_a_teardown_is_not_interrupted_a_signal_kills_its_processes_once():
    # As in a terminal: a CI runner's background job may have SIGINT ignored, and Python keeps that.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    procs, said = [Fake(), Fake()], []
    with interrupts.killing_on_signal(lambda: procs, said.append, "stopping the local cluster"):
        signal.raise_signal(signal.SIGINT)
        signal.raise_signal(signal.SIGTERM)
        time.sleep(0.01)
    assert [p.kills for p in procs] == [1, 1]
    assert said == ["stopping the local cluster", "SIGINT: killing the local cluster's processes"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_signal_during_the_cleanup_before_the_teardown_makes_it_kill_at_once():
    procs, said = [Fake()], []
    with pytest.raises(interrupts.Interrupted), interrupts.interruptible():
        try:
            signal.raise_signal(signal.SIGTERM)
        finally:
            signal.raise_signal(signal.SIGINT)  # the user presses Ctrl-C while the start unwinds
            with interrupts.killing_on_signal(lambda: procs, said.append, "stopping the local cluster"):
                pass
    assert procs[0].kills == 1
    assert said == ["stopping the local cluster", "SIGINT: killing the local cluster's processes"]


def test_a_process_spawned_for_a_cluster_but_not_recorded_is_a_stray_of_its_directory(tmp_path):
    proc = processes.spawn("sleeper", ["sleep", "60"], tmp_path / "cluster" / "logs")
    try:
        assert proc in processes.strays(tmp_path / "cluster")
        assert processes.strays(tmp_path / "other") == []
    finally:
        proc.kill()
        proc.wait(5)
    assert processes.strays(tmp_path / "cluster") == []


SPAWNER = textwrap.dedent("""
    import contextlib, sys, time
    from pathlib import Path
    from pykcm.testenv import processes
    tied = contextlib.nullcontext() if sys.argv[1] == "free" else processes.dying_with_this_process()
    with tied:
        proc = processes.spawn("sleeper", ["sleep", "60"], Path(sys.argv[2]))
    print(proc.pid, flush=True)
    time.sleep(60)
""")


@pytest.mark.parametrize(("mode", "survives"), [("tied", False), ("free", True)])
def test_run_locals_processes_die_with_it_even_by_sigkill_testenv_starts_do_not(tmp_path, mode, survives):
    spawner = subprocess.Popen([sys.executable, "-c", SPAWNER, mode, str(tmp_path / "logs")], stdout=subprocess.PIPE,
                               text=True, cwd=Path(__file__).parents[2])
    child = 0
    try:
        child = int(spawner.stdout.readline())
        spawner.kill()  # SIGKILL: no cleanup runs
        spawner.wait()
        deadline = time.monotonic() + 5
        while process_alive(child) and time.monotonic() < deadline and not survives:
            time.sleep(0.05)
        if survives:
            time.sleep(0.3)
        assert process_alive(child) == survives
    finally:
        spawner.kill()
        if child and process_alive(child):
            os.kill(child, signal.SIGKILL)


class FakePlane:
    def __init__(self, dead: list | None = None) -> None:
        self.dead = dead or []
        self._log = print

    def dead_processes(self) -> list:
        return self.dead


@pytest.fixture
def temp_dirs(tmp_path, monkeypatch):
    """running() makes its temp dirs under tmp_path; _stop_cluster is recorded, not run."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    stopped: list = []
    monkeypatch.setattr(cluster, "_stop_cluster", lambda plane, **kw: stopped.append(plane))
    return tmp_path, stopped


def _fake_start(error: BaseException | None = None, plane: FakePlane | None = None):
    def start(path: Path, **kwargs) -> FakePlane:
        (path / "logs").mkdir()  # the cluster's processes were started and wrote logs
        if error is not None:
            raise error  # start() stops what it started before it raises
        return plane or FakePlane()

    return start


@pytest.mark.parametrize("error", [interrupts.Interrupted(signal.SIGTERM), KeyboardInterrupt(),
                                   BuildError("go build failed")])
def test_an_interrupted_or_unbuilt_start_leaves_no_temp_dir(temp_dirs, monkeypatch, error):
    tmp_path, _ = temp_dirs
    monkeypatch.setattr(cluster, "start", _fake_start(error))
    said: list[str] = []
    with pytest.raises(type(error)), cluster.running(log=said.append):
        pytest.fail("the block ran")
    assert list(tmp_path.iterdir()) == [] and said == []


def test_a_start_that_failed_in_a_process_keeps_the_temp_dir_for_its_logs_and_says_so(temp_dirs, monkeypatch):
    tmp_path, _ = temp_dirs
    monkeypatch.setattr(cluster, "start", _fake_start(ControlPlaneError("kube-apiserver exited during startup")))
    said: list[str] = []
    with pytest.raises(ControlPlaneError), cluster.running(log=said.append):
        pass
    [kept] = list(tmp_path.iterdir())
    assert said == [f"keeping {kept} for its logs"]


@pytest.mark.parametrize(("error", "dead", "kept"), [
    (OSError("failed to listen"), [], False),  # pykcm's own error: its logs are not the cluster's
    (SystemExit(1), [], False),  # a second Ctrl-C while the manager stopped (exit 1, as KCM)
    (RuntimeError("the local cluster lost kube-scheduler"), ["kube-scheduler"], True),
])
def test_after_the_start_the_temp_dir_is_kept_only_when_a_process_of_the_cluster_died(
    temp_dirs, monkeypatch, error, dead, kept
):
    tmp_path, stopped = temp_dirs
    plane = FakePlane(dead)
    monkeypatch.setattr(cluster, "start", _fake_start(plane=plane))
    said: list[str] = []
    with pytest.raises(type(error)), cluster.running(log=said.append):
        raise error
    assert stopped == [plane]
    assert bool(list(tmp_path.iterdir())) == kept and bool(said) == kept
