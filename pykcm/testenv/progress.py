"""Run one long dev-tooling command (a Go build, debootstrap, `docker build`) with its output in a
log file and a progress line every PROGRESS_EVERY seconds, so a cold first run is visibly moving."""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from pykcm.util.errors import os_error_message

from .errors import BuildError
from .interrupts import deferred

Log = Callable[[str], None]

PROGRESS_EVERY = 10.0  # seconds between progress lines
STOP_GRACE = 20.0  # seconds an interrupted command gets to undo what it did (debootstrap's unmounts)
WRITE_CHECK = 0.5  # seconds between looks at whether the log could still be written


def run_with_progress(
    argv: Sequence[str],
    *,
    what: str,
    log_path: Path,
    log: Log,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    on_line: Callable[[str], None] | None = None,
    status: Callable[[], str] | None = None,
    action: str | None = None,
    stop_grace: float | None = None,
) -> None:
    """Run `argv` to completion, every output line into `log_path` (and to `on_line`, which may
    count them); every PROGRESS_EVERY seconds log `status()` and the elapsed time. A non-zero
    exit raises BuildError naming `action` (default `what`) and the command's last output line.
    Interrupted, the command gets SIGTERM and `stop_grace` seconds (default STOP_GRACE) to end, then SIGKILL;
    so does it when its log cannot be written (disk full), which raises BuildError naming the log."""
    started = time.monotonic()
    full_env = {**os.environ, **(env or {})}
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_file = _LogFile(log_path)
    grace = STOP_GRACE if stop_grace is None else stop_grace
    proc: subprocess.Popen[str] | None = None
    reader: threading.Thread | None = None
    try:
        log_file.write(" ".join(argv) + "\n")
        with deferred():  # a signal inside Popen would leave the child unknown: it raises here, in the try
            proc = subprocess.Popen(
                list(argv), cwd=cwd, env=full_env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, text=True, errors="replace",
            )
            reader = threading.Thread(target=_copy_lines, args=(proc, log_file, on_line), daemon=True)
            reader.start()
        next_line = started + PROGRESS_EVERY
        while True:
            try:
                proc.wait(timeout=max(0.0, min(WRITE_CHECK, next_line - time.monotonic())))
                break
            except subprocess.TimeoutExpired:
                if log_file.error is not None:
                    # Its output would be lost and its result an error anyway: no need to let it run on.
                    _end(proc, grace)
                    break
                if time.monotonic() >= next_line:
                    done = f"{status()}, " if status else ""
                    log(f"  {what}: {done}{format_duration(time.monotonic() - started)} elapsed (log: {log_path})")
                    next_line = time.monotonic() + PROGRESS_EVERY
    except BaseException:
        # Interrupted (a test's timeout, ^C, SIGTERM): the command must not run on unseen, nor its
        # output be copied into a closed log. SIGTERM, not SIGKILL: debootstrap's exit traps
        # unmount the /proc and /sys it mounted into its target.
        if proc is not None:
            _end(proc, grace)
        raise
    finally:
        if reader is not None:
            reader.join()
        log_file.close()
    if log_file.error is not None:
        reason = os_error_message(log_file.error)
        raise BuildError(f"{action or what} stopped: cannot write its log {log_path}: {reason}")
    if proc.returncode != 0:
        raise BuildError(
            f"{action or what} failed (exit {proc.returncode}): {last_line(log_path)}; full output in {log_path}"
        )


class _LogFile:
    """The command's log. A write that fails (disk full, quota, file size limit) is remembered, not
    raised, and later lines are dropped: the command's output must still be read to its end, or the
    command would block on a full pipe and never end."""

    def __init__(self, path: Path) -> None:
        self._file = open(path, "w")  # noqa: SIM115 - closed by close()
        self.error: OSError | None = None

    def write(self, text: str) -> None:
        if self.error is None:
            try:
                self._file.write(text)
                self._file.flush()
            except OSError as err:
                self.error = err

    def close(self) -> None:
        try:
            self._file.close()  # flushes again what a failed flush left buffered
        except OSError as err:
            self.error = self.error or err


def _end(proc: subprocess.Popen[str], grace: float) -> None:
    """SIGTERM the command, wait up to `grace` seconds, then SIGKILL it (also if this wait is
    itself interrupted). Only the command: it stays in this process group, so that the terminal's
    Ctrl-C and a kill of the group reach it and its children directly, as before."""
    try:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(grace)
    finally:
        proc.kill()  # nothing once it has been reaped
        proc.wait()


def _copy_lines(proc: subprocess.Popen[str], log_file: _LogFile, on_line: Callable[[str], None] | None) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        log_file.write(line)  # flushed: the log shows how far the command is
        if on_line is not None:
            on_line(line)


def last_line(path: Path) -> str:
    lines = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


def format_duration(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{seconds:.1f}s"
