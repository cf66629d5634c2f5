"""run_with_progress when interrupted: the command is stopped, not left running unseen."""

from __future__ import annotations

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
