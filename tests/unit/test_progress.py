"""run_with_progress when interrupted: the command is stopped (SIGTERM first, so that its exit traps
run; SIGKILL after STOP_GRACE), not left running unseen; and so it is when its log cannot be written."""

from __future__ import annotations

import errno
import os
import threading
import time
from pathlib import Path

import pytest

from pykcm.testenv import interrupts, progress
from pykcm.testenv.errors import BuildError
from tests.support import sigterm_as_each_process_starts


class Interrupted(Exception):
    pass


def test_an_interrupted_command_is_killed_and_its_log_closed_cleanly(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(progress, "PROGRESS_EVERY", 0.1)
    pid_file = tmp_path / "pid"

    def interrupt(_message: str) -> None:  # the first progress line stands for a test's timeout
        raise Interrupted

    with pytest.raises(Interrupted):
        progress.run_with_progress(["sh", "-c", f"echo $$ > {pid_file}; echo started; exec sleep 60"],
                                   what="sleep", log_path=tmp_path / "sleep.log", log=interrupt)
    pid = int(pid_file.read_text())
    assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()
    assert "started" in (tmp_path / "sleep.log").read_text()


def test_an_interrupted_command_gets_sigterm_first_and_is_waited_for(tmp_path: Path, monkeypatch) -> None:
    """So that its exit traps run (debootstrap's unmount /proc and /sys in its target)."""
    monkeypatch.setattr(progress, "PROGRESS_EVERY", 0.1)
    ready, trapped = tmp_path / "ready", tmp_path / "trapped"

    def interrupt(_message: str) -> None:
        if ready.exists():
            raise Interrupted

    script = f"trap 'sleep 0.3; echo TERM > {trapped}; exit 143' TERM; touch {ready}; while :; do sleep 0.05; done"
    with pytest.raises(Interrupted):
        progress.run_with_progress(["sh", "-c", script], what="sh", log_path=tmp_path / "sh.log", log=interrupt)
    assert trapped.read_text() == "TERM\n"


def test_a_command_ignoring_sigterm_is_killed_after_the_grace(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(progress, "PROGRESS_EVERY", 0.1)
    monkeypatch.setattr(progress, "STOP_GRACE", 0.5)
    ready = tmp_path / "ready"

    def interrupt(_message: str) -> None:
        if ready.exists():
            raise Interrupted

    started = time.monotonic()
    with pytest.raises(Interrupted):
        progress.run_with_progress(["sh", "-c", f"trap '' TERM; touch {ready}; while :; do sleep 0.05; done"],
                                   what="sh", log_path=tmp_path / "sh.log", log=interrupt)
    assert 0.5 <= time.monotonic() - started < 10


class _FailingAfter:
    """A log file whose writes fail with ENOSPC after `lines` of them, as on a full disk."""

    def __init__(self, path: Path, lines: int) -> None:
        self._file, self._left = open(path, "w"), lines  # noqa: SIM115 - closed by close()

    def write(self, text: str) -> int:
        if self._left <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self._left -= 1
        return self._file.write(text)

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> _FailingAfter:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def test_a_log_that_cannot_be_written_ends_the_command_with_one_error(tmp_path: Path, monkeypatch) -> None:
    """Not a dead reader thread and a command blocked for ever on its full pipe."""
    monkeypatch.setattr(progress, "PROGRESS_EVERY", 0.1)
    monkeypatch.setattr(progress, "open", lambda path, mode: _FailingAfter(path, 10), raising=False)
    thread_errors: list[object] = []
    monkeypatch.setattr(threading, "excepthook", thread_errors.append)
    pid_file, log_path = tmp_path / "pid", tmp_path / "chatty.log"
    started = time.monotonic()

    def too_long(_message: str) -> None:  # a progress line: still running, so stop a test that would hang
        if time.monotonic() - started > 10:
            raise Interrupted

    # 200k lines (far more than a pipe holds), then it goes on running: only its end stops it.
    script = f"echo $$ > {pid_file}; seq 200000; exec sleep 60"
    with pytest.raises(BuildError) as err:
        progress.run_with_progress(["sh", "-c", script], what="chatty", log_path=log_path, log=too_long)
    assert str(err.value) == f"chatty stopped: cannot write its log {log_path}: No space left on device"
    assert time.monotonic() - started < 10
    assert thread_errors == []
    pid = int(pid_file.read_text())
    assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()


def test_a_signal_as_the_command_starts_still_stops_it(tmp_path: Path, monkeypatch) -> None:
    """SIGTERM right after the fork, before run_with_progress holds the child: it is deferred until it
    does, so the child is stopped, not left running unseen."""
    with sigterm_as_each_process_starts(monkeypatch) as started:
        with pytest.raises(interrupts.Interrupted), interrupts.interruptible():
            progress.run_with_progress(["sleep", "60"], what="sleep", log_path=tmp_path / "sleep.log",
                                       log=lambda _: None)
        assert started[0].poll() is not None  # ended and reaped
