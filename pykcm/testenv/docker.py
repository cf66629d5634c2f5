"""A private Docker engine for building and running pykcm's image on a dev machine or in CI.

It never touches a system docker: containerd and dockerd run with their own root, state, pidfile
and unix sockets under one directory (default: the pykcm cache), with no default bridge and no
iptables rules, so builds and containers use the host's network (`--network host`). A bridge
network made on purpose still works (kind's, kind/cluster.py): without iptables its published
ports go through docker-proxy on the address they name, and nothing is masqueraded. The directory is
locked while the engine runs; an engine left behind by a crashed run is stopped by PID and kernel
start time (never by name) before a new one starts. Images persist in the directory, which is
what makes a second build warm.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from .errors import ControlPlaneError
from .gobuild import cache_dir
from .processes import ManagedProcess, spawn, stop_all, wait_ready
from .progress import Log, format_duration

START_TIMEOUT = 60.0
CGROUP_PARENT = "pykcm-docker"  # every container's cgroup is below this one, in each hierarchy
_SOCKET_PATH_MAX = 100  # sun_path is 108 bytes; dockerd and containerd add suffixes to their sockets

# The containerd under dockerd needs none of the CRI (kubelet) side.
_CONTAINERD_CONFIG = """version = 2
root = "{root}"
state = "{state}"
disabled_plugins = ["io.containerd.grpc.v1.cri"]

[grpc]
  address = "{socket}"

[ttrpc]
  address = "{socket}.ttrpc"
"""


class DockerError(ControlPlaneError):
    """The private Docker engine could not start, or a docker command failed."""


def missing_prerequisites() -> list[str]:
    """One line per missing prerequisite of the private engine (root, the docker.io package)."""
    missing = []
    if os.geteuid() != 0:
        missing.append("the private Docker engine needs root (dockerd runs as root)")
    for binary in ("dockerd", "containerd", "docker"):
        if shutil.which(binary) is None:
            missing.append(f"{binary} is not on PATH: apt-get install docker.io")
    return missing


@dataclass
class DockerEngine:
    """A running private engine; `docker(...)` runs the docker CLI against it."""

    directory: Path
    processes: list[ManagedProcess]
    _lock: IO[str] | None = field(default=None, repr=False)

    @property
    def host(self) -> str:
        return f"unix://{_run_dir(self.directory) / 'docker.sock'}"

    @property
    def containerd_address(self) -> str:
        """The private containerd's socket (for `ctr --address`)."""
        return str(_run_dir(self.directory) / "containerd.sock")

    def env(self) -> dict[str, str]:
        """The environment for docker CLI commands against this engine (legacy builder: the CLI's
        BuildKit needs the buildx plugin, which Debian's docker.io does not bring)."""
        return {**os.environ, "DOCKER_HOST": self.host, "DOCKER_BUILDKIT": "0"}

    def docker(self, *args: str, timeout: float = 300.0, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run `docker ARGS` and return its output; a failure raises DockerError with its last line."""
        argv = [docker_cli(), *args]
        try:
            result = subprocess.run(argv, env=self.env(), capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise DockerError(f"docker {args[0]} did not finish in {timeout:.0f}s") from None
        if check and result.returncode != 0:
            last = (result.stderr.strip() or result.stdout.strip() or "no output").splitlines()[-1]
            raise DockerError(f"docker {' '.join(args[:2])} failed (exit {result.returncode}): {last}")
        return result

    def image_exists(self, name: str) -> bool:
        return self.docker("image", "inspect", name, check=False).returncode == 0

    def stop(self) -> None:
        # dockerd first: it stops its containers and then lets go of containerd.
        stop_all(self.processes)
        _remove_run_dir(_run_dir(self.directory))
        _state_file(self.directory).unlink(missing_ok=True)
        if self._lock is not None:
            fcntl.flock(self._lock, fcntl.LOCK_UN)
            self._lock.close()
            self._lock = None


def default_directory() -> Path:
    return cache_dir() / "docker"


def start(directory: Path | None = None, *, log: Log, wait: float = 0.0) -> DockerEngine:
    """Start containerd and dockerd under `directory`; raise DockerError with one line if not possible.

    If another run's engine holds the directory, wait up to `wait` seconds for it to finish."""
    missing = missing_prerequisites()
    if missing:
        raise DockerError("; ".join(missing))
    directory = (directory or default_directory()).resolve()
    run_dir = _run_dir(directory)
    if len(str(run_dir / "containerd.sock.ttrpc")) > _SOCKET_PATH_MAX:
        raise DockerError(f"{directory} is too long a path for the engine's unix sockets; pass a shorter directory")
    engine = DockerEngine(directory, [], _take_lock(directory, wait, log))
    try:
        _stop_leftovers(directory, log)
        _remove_run_dir(run_dir)  # exec-root and sockets of a previous run
        run_dir.mkdir(parents=True)
        engine.processes.append(_start_containerd(directory, run_dir))
        _save_state(engine)
        engine.processes.insert(0, _start_dockerd(directory, run_dir, engine))
        _save_state(engine)
        version = engine.docker("version", "--format", "{{.Server.Version}}").stdout.strip()
    except BaseException:
        engine.stop()
        raise
    log(f"started a private Docker engine {version} (data: {directory / 'data'}, socket: {engine.host})")
    return engine


@contextlib.contextmanager
def running(directory: Path | None = None, *, log: Log, wait: float = 0.0) -> Iterator[DockerEngine]:
    engine = start(directory, log=log, wait=wait)
    try:
        yield engine
    finally:
        engine.stop()
        log("stopped the private Docker engine")


def docker_cli() -> str:
    cli = shutil.which("docker")
    if cli is None:
        raise DockerError("docker is not on PATH: apt-get install docker.io")
    return cli


def _run_dir(directory: Path) -> Path:
    return directory / "run"


def _state_file(directory: Path) -> Path:
    return directory / "engine.json"


def _take_lock(directory: Path, wait: float, log: Log) -> IO[str]:
    directory.mkdir(parents=True, exist_ok=True)
    lock = open(directory / "engine.lock", "w")  # noqa: SIM115 - held open for the engine's lifetime
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return lock
        except BlockingIOError:
            if time.monotonic() >= deadline:
                lock.close()
                raise DockerError(
                    f"another private Docker engine is running in {directory}; stop it or pass another directory"
                ) from None
        if wait:
            log(f"waiting up to {format_duration(wait)} for the private Docker engine in {directory} "
                "(another run is using it)")
            wait = 0.0  # say it once
        time.sleep(1.0)


def _remove_run_dir(run_dir: Path) -> None:
    """Remove the engine's runtime directory, first unmounting what dockerd leaves mounted there
    (its default network namespace stays bind-mounted after it exits)."""
    mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
    below = [m for m in mounts if m == str(run_dir) or m.startswith(f"{run_dir}/")]
    for mount in sorted(below, key=len, reverse=True):
        subprocess.run(["umount", "--lazy", mount], capture_output=True, check=False)
    shutil.rmtree(run_dir, ignore_errors=True)


def _save_state(engine: DockerEngine) -> None:
    state = {proc.name: proc.to_json() for proc in engine.processes}
    _state_file(engine.directory).write_text(json.dumps(state, indent=2))


def _stop_leftovers(directory: Path, log: Log) -> None:
    """Stop what a crashed run left running here (we hold the lock, so its owner is gone)."""
    try:
        state = json.loads(_state_file(directory).read_text())
    except (FileNotFoundError, ValueError):
        return
    leftovers = [ManagedProcess.from_json(name, data) for name, data in state.items()]
    alive = [proc for proc in leftovers if proc.alive()]
    if alive:
        log(f"stopping a private Docker engine left running in {directory}: "
            + ", ".join(f"{p.name} (pid {p.pid})" for p in alive))
        stop_all(alive)
    _state_file(directory).unlink(missing_ok=True)


def _start_containerd(directory: Path, run_dir: Path) -> ManagedProcess:
    socket = run_dir / "containerd.sock"
    config = run_dir / "containerd.toml"
    config.write_text(_CONTAINERD_CONFIG.format(
        root=directory / "containerd", state=run_dir / "containerd", socket=socket
    ))
    proc = spawn("containerd", ["containerd", "--config", str(config)], directory / "logs")
    _wait(proc, socket.is_socket)
    return proc


def _start_dockerd(directory: Path, run_dir: Path, engine: DockerEngine) -> ManagedProcess:
    argv: Sequence[str] = [
        "dockerd",
        f"--data-root={directory / 'data'}",
        f"--exec-root={run_dir / 'exec'}",
        f"--pidfile={run_dir / 'dockerd.pid'}",
        f"--host={engine.host}",
        f"--containerd={engine.containerd_address}",
        "--containerd-namespace=pykcm-moby",
        "--containerd-plugins-namespace=pykcm-plugins",
        # No docker0 bridge, no iptables or sysctl changes: the host's network stays as it was.
        "--bridge=none",
        "--iptables=false",
        "--ip6tables=false",
        "--ip-forward=false",
        "--ip-masq=false",
        "--storage-driver=overlay2",
        "--exec-opt=native.cgroupdriver=cgroupfs",
        f"--cgroup-parent={CGROUP_PARENT}",
    ]
    proc = spawn("dockerd", argv, directory / "logs")

    def ready() -> bool:
        return engine.docker("version", check=False, timeout=10).returncode == 0

    _wait(proc, ready)
    return proc


def _wait(proc: ManagedProcess, check: Callable[[], bool]) -> None:
    try:
        wait_ready(proc, check, START_TIMEOUT)
    except ControlPlaneError as err:
        raise DockerError(str(err).splitlines()[0]) from None
