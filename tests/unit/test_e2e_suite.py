"""The upstream e2e suite's inputs and outputs that need no cluster: the Go module that builds
e2e.test, the command line, the selection of tests, the JUnit report, and the README's list."""

from __future__ import annotations

import contextlib
import functools
import os
import re
import signal
import threading
import time
from pathlib import Path

import pytest

from pykcm.testenv import e2e, interrupts
from pykcm.testenv.build import GOMOD_DIR, KUBERNETES_VERSION
from pykcm.testenv.e2e import E2E_GOMOD_DIR, e2e_argv, go_regex_escape, parse_junit, run_e2e
from tests.e2e import runs
from tests.e2e.upstream import GROUPS, NOT_RUN, ON_REAL_NODE, RUN, TOKEN_ROTATION, exactly, focus_regex, skip_regex
from tests.support import process_alive, sigterm_as_each_process_starts

README = Path(__file__).parents[2] / "README.md"

JUNIT = """<?xml version="1.0" encoding="UTF-8"?>
<testsuites tests="4" disabled="0" errors="0" failures="1" time="40.5">
  <testsuite name="Kubernetes e2e suite" tests="4" skipped="1" failures="1" errors="0" time="40.5">
    <testcase name="[SynchronizedBeforeSuite]" classname="Kubernetes e2e suite" status="passed" time="30"/>
    <testcase name="[It] [sig-apps] ReplicaSet a [Conformance]" classname="Kubernetes e2e suite" status="passed"
      time="5.5"/>
    <testcase name="[It] [sig-apps] ReplicaSet b" classname="Kubernetes e2e suite" status="timedout" time="60">
      <failure message="context deadline exceeded&#xA;more" type="timedout">long text</failure>
    </testcase>
    <testcase name="[It] [sig-auth] ServiceAccounts c" classname="Kubernetes e2e suite" status="skipped" time="0">
      <skipped message="skipped"/>
    </testcase>
  </testsuite>
</testsuites>
"""


def test_the_e2e_module_has_the_control_planes_shape() -> None:
    """k8s.io/kubernetes at the control plane's version, every staging module replaced alike."""
    def replaces(gomod: Path) -> set[str]:
        return set(re.findall(r"^\s*(k8s\.io/\S+ => \S+ \S+)$", (gomod / "go.mod").read_text(), re.MULTILINE))

    e2e = (E2E_GOMOD_DIR / "go.mod").read_text()
    assert re.search(rf"^\s*(require )?k8s\.io/kubernetes {re.escape(KUBERNETES_VERSION)}$", e2e, re.MULTILINE)
    assert replaces(E2E_GOMOD_DIR) == replaces(GOMOD_DIR) != set()


def test_go_regex_escape_leaves_spaces_alone() -> None:
    assert go_regex_escape("[sig-apps] ReplicaSet (x) 90.5$") == r"\[sig-apps\] ReplicaSet \(x\) 90\.5\$"


def test_the_selection_covers_the_four_groups_once() -> None:
    assert not set(RUN) & set(NOT_RUN) and not set(RUN) & set(ON_REAL_NODE) and not set(NOT_RUN) & set(ON_REAL_NODE)
    assert all(any(name.startswith(group) for group in GROUPS) for name in (*RUN, *NOT_RUN, *ON_REAL_NODE))
    focus, skip = re.compile(focus_regex()), re.compile(skip_regex())
    assert all(focus.search(name) and not skip.search(name) for name in RUN)
    assert all(skip.search(name) for name in (*NOT_RUN, *ON_REAL_NODE))


def test_the_real_node_focus_selects_exactly_its_tests() -> None:
    focus = re.compile(exactly(sorted(ON_REAL_NODE)))
    assert [name for name in (*RUN, *NOT_RUN, *ON_REAL_NODE) if focus.search(name)] == list(ON_REAL_NODE)
    assert TOKEN_ROTATION in ON_REAL_NODE


def test_the_command_line_stays_on_the_cluster(tmp_path: Path) -> None:
    argv = e2e_argv(Path("/bin/e2e.test"), tmp_path / "kubeconfig", tmp_path, focus="f", skip="s", timeout=600)
    assert "--provider=skeleton" in argv and "--prepull-images=false" in argv and "--disable-log-dump" in argv
    assert not any(arg.startswith("--progress-report-url") for arg in argv)
    assert "--ginkgo.timeout=540s" in argv  # a minute before the hard limit, so Ginkgo still writes its report


def test_the_suite_gets_a_temporary_directory_of_its_own_removed_after_it(tmp_path: Path) -> None:
    """The suite leaves a directory in TMPDIR each time it starts (upstream's kuberc test); a run
    must not leave it in the machine's /tmp."""
    fake = tmp_path / "e2e.test"
    fake.write_text('#!/bin/sh\nmkdir "$TMPDIR/test-kuberc1" && echo "$TMPDIR" > seen-tmpdir\n')
    fake.chmod(0o755)
    report = tmp_path / "report"
    run = run_e2e(fake, tmp_path / "kubeconfig", report, focus="f", skip="s", timeout=60, log=lambda _: None)
    assert run.exit_code == 0
    seen = Path((report / "seen-tmpdir").read_text().strip())
    assert seen.name.startswith("e2e-tmp-") and not seen.exists()


def _fake_e2e_test(tmp_path: Path, body: str) -> Path:
    fake = tmp_path / "e2e.test"
    fake.write_text("#!/bin/sh\n" + body, encoding="utf-8")
    fake.chmod(0o755)
    return fake


class Raised(Exception):
    """Raised in the waiting thread as pytest-timeout's exception is (from a signal handler)."""


@pytest.mark.parametrize("ignores_sigint", [False, True])
def test_an_exception_while_waiting_ends_e2e_test_and_what_it_started(tmp_path, monkeypatch, ignores_sigint):
    """e2e.test must not run on against a cluster its caller then stops: SIGINT to its process group
    (Ginkgo reports and cleans up), SIGKILL after the grace (or at once for what SIGINT left), then the
    exception goes on. A background child of a shell ignores SIGINT: only the group's SIGKILL ends it."""
    monkeypatch.setattr(e2e, "INTERRUPT_GRACE", 1.0)
    trap = "trap '' INT\n" if ignores_sigint else ""
    fake = _fake_e2e_test(tmp_path, f"{trap}sleep 60 &\necho $$ $! > pids.tmp && mv pids.tmp pids\nwait\n")
    report = tmp_path / "report"

    groups: list[int] = []

    def send() -> None:
        deadline = time.monotonic() + 10
        while not (report / "pids").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        with contextlib.suppress(OSError, ValueError):
            groups.extend(os.getpgid(int(pid)) for pid in (report / "pids").read_text().split())
        os.kill(os.getpid(), signal.SIGUSR1)

    def on_signal(_signum, _frame):
        raise Raised("a test's timeout")

    previous = signal.signal(signal.SIGUSR1, on_signal)
    sender = threading.Thread(target=send)
    pids: list[int] = []
    try:
        sender.start()
        with pytest.raises(Raised):
            run_e2e(fake, tmp_path / "kubeconfig", report, focus="f", skip="s", timeout=60, log=lambda _: None)
        pids = [int(pid) for pid in (report / "pids").read_text().split()]
        assert groups == [pids[0], pids[0]]  # a group of its own, which the terminal's ^C does not reach
        assert not process_alive(pids[0])  # e2e.test itself: reaped
        deadline = time.monotonic() + 5  # its child was SIGKILLed, but is not ours to wait for
        while process_alive(pids[1]) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not process_alive(pids[1])
    finally:
        sender.join()
        signal.signal(signal.SIGUSR1, previous)
        for pid in pids:
            if process_alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_signal_in_the_main_thread_ends_the_e2e_test_runs_of_worker_threads(tmp_path, monkeypatch):
    """test_upstream runs both sides in worker threads (runs.at_once): ^C raises in the main thread only,
    and e2e.test, in a group of its own, does not get the terminal's; leaving the pool waited for both
    e2e.test runs to end by themselves (up to 30 minutes, against clusters left up meanwhile)."""
    monkeypatch.setattr(e2e, "INTERRUPT_GRACE", 1.0)
    fake = _fake_e2e_test(tmp_path, "echo $$ > pid.tmp && mv pid.tmp pid\nexec sleep 30\n")
    reports = [tmp_path / "kcm", tmp_path / "pykcm"]
    armed = True

    def on_sigint(_signum, _frame):  # ^C's KeyboardInterrupt, but never once the test has left its block
        if armed:
            raise KeyboardInterrupt

    def interrupt() -> None:  # once both have started, as a user would press ^C
        deadline = time.monotonic() + 10
        while not all((r / "pid").exists() for r in reports) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1)
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)

    def run(report: Path) -> e2e.E2ERun:
        return run_e2e(fake, tmp_path / "kubeconfig", report, focus="f", skip="s", timeout=60, log=lambda _: None)

    previous = signal.signal(signal.SIGINT, on_sigint)
    sender = threading.Thread(target=interrupt)
    started = time.monotonic()
    try:
        sender.start()
        with pytest.raises(KeyboardInterrupt):
            runs.at_once(*(functools.partial(run, r) for r in reports), log=lambda _: None)
        armed = False
        assert time.monotonic() - started < 1 + e2e.INTERRUPT_GRACE + 5
        pids = [int((r / "pid").read_text()) for r in reports]
        assert not any(process_alive(pid) for pid in pids)
        assert not e2e._running
    finally:
        armed = False
        sender.join()
        signal.signal(signal.SIGINT, previous)
        for r in reports:
            if (r / "pid").exists() and process_alive(pid := int((r / "pid").read_text())):
                os.kill(pid, signal.SIGKILL)


def test_a_signal_as_e2e_test_starts_still_ends_it(tmp_path, monkeypatch):
    """SIGTERM right after the fork, in an interruptible() block (the session's, in pytest): deferred
    until e2e.test is recorded, then raised where it is ended, not before (it ran on unseen)."""
    fake = _fake_e2e_test(tmp_path, "exec sleep 60\n")
    monkeypatch.setattr(e2e, "INTERRUPT_GRACE", 1.0)
    with sigterm_as_each_process_starts(monkeypatch) as started:
        with pytest.raises(interrupts.Interrupted), interrupts.interruptible():
            run_e2e(fake, tmp_path / "kubeconfig", tmp_path / "report", focus="f", skip="s", timeout=60,
                    log=lambda _: None)
        assert started[0].poll() is not None  # ended and reaped
        assert not e2e._running


def test_progress_says_how_many_specs_finished_while_e2e_test_runs(tmp_path, monkeypatch):
    """A run takes minutes: a line every PROGRESS_EVERY seconds, counting Ginkgo's result lines (a
    passed and a failed spec, one skipped at run time; the bare S's of specs left out do not count)."""
    monkeypatch.setattr(e2e, "PROGRESS_EVERY", 0.2)
    results = "• [1.200 seconds]\nSSSSSSSS\n• [FAILED] [60.000 seconds]\nS [SKIPPED] [0.100 seconds]\n"
    fake = _fake_e2e_test(tmp_path, f"printf '%s' '{results}'\nsleep 1\n")
    said: list[str] = []
    run = run_e2e(fake, tmp_path / "kubeconfig", tmp_path / "report", focus="f", skip="s", timeout=60,
                  log=said.append)
    assert run.exit_code == 0
    progress = [re.fullmatch(r"  e2e\.test: (\d+) specs finished, [0-9.]+s elapsed \(log: (.*)\)", line)
                for line in said if "specs finished" in line]
    assert len(progress) >= 2 and all(progress), said
    assert [int(m.group(1)) for m in progress if m][-2:] == [3, 3] and progress[-1].group(2) == str(run.log_path)


def test_a_report_left_by_an_earlier_run_is_not_this_runs(tmp_path):
    report = tmp_path / "report"
    report.mkdir()
    (report / "junit_01.xml").write_text(JUNIT)
    fake = _fake_e2e_test(tmp_path, "exit 1\n")  # dies before it writes a report
    run = run_e2e(fake, tmp_path / "kubeconfig", report, focus="f", skip="s", timeout=60, log=lambda _: None)
    assert (run.exit_code, run.results, run.junit_path.exists()) == (1, {}, False)


def test_a_report_cut_short_gives_no_results_and_says_where_the_log_is(tmp_path):
    """Ginkgo writes the report in place: a kill at the hard limit can leave half of it."""
    fake = _fake_e2e_test(tmp_path, f"cat > junit_01.xml <<'EOF'\n{JUNIT[:300]}\nEOF\nexit 1\n")
    said: list[str] = []
    run = run_e2e(fake, tmp_path / "kubeconfig", tmp_path / "report", focus="f", skip="s", timeout=60,
                  log=said.append)
    assert run.results == {} and run.exit_code == 1
    [unreadable] = [line for line in said if "unreadable JUnit report" in line]
    assert str(run.log_path) in unreadable


def test_junit_report_gives_each_spec_its_status_time_and_first_message_line(tmp_path: Path) -> None:
    path = tmp_path / "junit_01.xml"
    path.write_text(JUNIT)
    results = parse_junit(path)
    assert {name: (r.status, r.seconds, r.message) for name, r in results.items()} == {
        "[sig-apps] ReplicaSet a [Conformance]": ("passed", 5.5, ""),
        "[sig-apps] ReplicaSet b": ("failed", 60.0, "context deadline exceeded"),
        "[sig-auth] ServiceAccounts c": ("skipped", 0.0, "skipped"),
    }


def test_readme_lists_every_upstream_test_that_is_not_run_or_runs_on_the_real_node() -> None:
    text = README.read_text()
    missing = [name for name in (*NOT_RUN, *ON_REAL_NODE) if name not in text]
    assert missing == []
