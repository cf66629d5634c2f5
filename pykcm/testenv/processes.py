"""Processes of the local cluster: started in their own sessions with logs that outlive the
starter, recorded by PID and kernel start time so that stopping never signals an unrelated
process that reused the PID; readiness waits; ports picked on loopback and re-picked on a clash.
Every process spawned here is remembered too (`strays`): one whose start was interrupted before
its cluster recorded it is still stopped with that cluster.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from .errors import ControlPlaneError
from .interrupts import deferred

LOOPBACK = "127.0.0.1"
STOP_TIMEOUT = 15.0
_PORT_ATTEMPTS = 3
_LOG_MARKER = "===== pykcm testenv: starting "
_PR_SET_PDEATHSIG = 1  # linux/prctl.h

_T = TypeVar("_T")


class PortInUse(ControlPlaneError):
    """A freshly picked free port was taken by someone else before the process bound it."""


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state, start time in clock ticks since boot) of a PID, or None if there is no such process."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name (field 2) may contain spaces and parentheses; fields after it are plain.
    rest = raw[raw.rindex(")") + 2 :].split()
    return rest[0], int(rest[19])


@dataclass
class ManagedProcess:
    """One process this testenv started; works from any process that reads the state file."""

    name: str
    pid: int
    start_time: int
    log_path: Path
    port: int | None = None
    _popen: subprocess.Popen[bytes] | None = field(default=None, repr=False, compare=False)

    def alive(self) -> bool:
        if self._popen is not None:
            return self._popen.poll() is None
        stat = _proc_stat(self.pid)
        if stat is None or stat[1] != self.start_time:
            return False
        # A zombie is dead, but if it is our child it must be reaped, and a multi-threaded
        # process is only reapable once all its threads are gone.
        return stat[0] != "Z" or not self._reaped()

    def _reaped(self) -> bool:
        try:
            pid, _ = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:  # not our child: its parent (or init) reaps it
            return True
        return pid != 0

    def send_signal(self, sig: int) -> None:
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the process to exit; False if it is still running after `timeout` seconds."""
        if self._popen is not None:
            try:
                self._popen.wait(timeout)
            except subprocess.TimeoutExpired:
                return False
            return True
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.alive():
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return True

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        self.terminate()
        if not self.wait(timeout):
            self.kill()
            self.wait(5.0)

    def log_tail(self, lines: int = 25) -> list[str]:
        """The last non-empty output lines of this run (each start appends after a marker line)."""
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return []
        current = text.rsplit(_LOG_MARKER, 1)[-1].splitlines()[1:]
        return [line for line in current if line.strip()][-lines:]

    def to_json(self) -> dict[str, Any]:
        return {"pid": self.pid, "start_time": self.start_time, "log": str(self.log_path), "port": self.port}

    @classmethod
    def from_json(cls, name: str, data: dict[str, Any]) -> ManagedProcess:
        return cls(name, data["pid"], data["start_time"], Path(data["log"]), data.get("port"))


_spawned: list[ManagedProcess] = []  # by this process, still running when last looked at
_die_with_starter = False  # see dying_with_this_process()


def spawn(name: str, argv: Sequence[str], log_dir: Path, port: int | None = None) -> ManagedProcess:
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}.log"
    _spawned[:] = [proc for proc in _spawned if proc.alive()]
    with open(log_path, "ab") as log_file:
        header = f"\n{_LOG_MARKER}{time.strftime('%Y-%m-%dT%H:%M:%S')}: {' '.join(argv)}\n"
        log_file.write(header.encode())
        log_file.flush()
        with deferred():  # an interruption inside Popen would leave the child known to no one
            popen = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=log_dir.parent,
                preexec_fn=_death_signal(),
            )
            stat = _proc_stat(popen.pid)
            proc = ManagedProcess(name, popen.pid, stat[1] if stat else 0, log_path, port, popen)
            _spawned.append(proc)
    return proc


def strays(directory: Path) -> list[ManagedProcess]:
    """Running processes this process spawned with their logs under `directory`."""
    return [proc for proc in _spawned if proc.log_path.is_relative_to(directory) and proc.alive()]


@contextlib.contextmanager
def dying_with_this_process() -> Iterator[None]:
    """Processes spawned in the block get SIGKILL when this process ends, even by SIGKILL (Linux's
    PR_SET_PDEATHSIG): for `run --local`, whose cluster is its own. Never for `testenv start`, whose
    cluster outlives it. The kernel ties it to the spawning thread, so only the main thread's count."""
    global _die_with_starter
    outer, _die_with_starter = _die_with_starter, True
    try:
        yield
    finally:
        _die_with_starter = outer


def _death_signal() -> Callable[[], None] | None:
    if not _die_with_starter or sys.platform != "linux" or threading.current_thread() is not threading.main_thread():
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before the fork
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def in_child() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent:  # the starter ended before prctl: the kernel will not tell
            os._exit(1)

    return in_child


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def wait_ready(proc: ManagedProcess, check: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if check():
            return
        if not proc.alive():
            tail = proc.log_tail()
            if any("address already in use" in line for line in tail):
                raise PortInUse(f"{proc.name} could not bind its port")
            raise startup_error(proc, "exited during startup", tail)
        if time.monotonic() >= deadline:
            proc.stop(timeout=5.0)
            raise startup_error(proc, f"was not ready after {timeout:.0f}s", proc.log_tail())
        time.sleep(0.2)


def startup_error(proc: ManagedProcess, what: str, tail: list[str]) -> ControlPlaneError:
    # First line for the user (the process's own last word is usually the reason), then context.
    last = tail[-1].strip() if tail else "no output"
    return ControlPlaneError(f"{proc.name} {what}: {last} (log: {proc.log_path})\n" + "\n".join(tail))


def http_get(url: str, context: ssl.SSLContext | None) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, context=context, timeout=3) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except (OSError, ssl.SSLError):
        return 0, b""


def unverified_context() -> ssl.SSLContext:
    # KCM serves a self-signed in-memory cert; /healthz is all we read from it.
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def write_private_file(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.touch(mode=0o600, exist_ok=True)
    tmp.write_text(text)
    os.replace(tmp, path)


def stop_all(processes: Sequence[ManagedProcess], timeout: float = STOP_TIMEOUT) -> None:
    for proc in processes:
        proc.terminate()
    deadline = time.monotonic() + timeout
    for proc in processes:
        if not proc.wait(max(0.0, deadline - time.monotonic())):
            proc.kill()
            proc.wait(5.0)


def process_trees(is_root: Callable[[list[bytes]], bool]) -> set[int]:
    """The PIDs of every process whose argv `is_root` accepts, and of all their descendants."""
    children: dict[int, list[int]] = {}
    roots = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            stat = (proc / "stat").read_text()
        except OSError:
            continue
        children.setdefault(int(stat[stat.rindex(")") + 2 :].split()[1]), []).append(int(proc.name))
        if is_root(argv):
            roots.append(int(proc.name))
    found: set[int] = set()
    while roots:
        pid = roots.pop()
        if pid not in found:
            found.add(pid)
            roots.extend(children.get(pid, ()))
    return found


def kill_trees(is_root: Callable[[list[bytes]], bool]) -> int:
    """SIGKILL the process_trees of `is_root`; returns how many were signalled. For daemons that
    left our sessions (containerd's shims) and what they parent (pods' containers): both outlive
    a starter that was killed."""
    doomed = process_trees(is_root)
    for pid in doomed:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return len(doomed)


def retry_on_port_clash(start: Callable[[], _T], repick: Callable[[], None]) -> _T:
    for attempt in range(_PORT_ATTEMPTS):
        try:
            return start()
        except PortInUse:
            if attempt == _PORT_ATTEMPTS - 1:
                raise
            repick()
    raise AssertionError("unreachable")
