"""run_with_progress when interrupted: the command is stopped (SIGTERM first, so that its exit traps
run; SIGKILL after STOP_GRACE), not left running unseen."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from pykcm.testenv import progress


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
