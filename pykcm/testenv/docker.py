"""A private Docker engine for building and running pykcm's image on a dev machine or in CI.

It never touches a system docker: containerd and dockerd run with their own root, state, pidfile
and unix sockets under one directory (default: the pykcm cache), with no default bridge and no
iptables rules, so builds and containers use the host's network (`--network host`). A bridge
network made on purpose still works (kind's, kind/cluster.py): without iptables its published
ports go through docker-proxy on the address they name, and nothing is masqueraded.

The engine removes and unmounts below its directory, so that directory is pykcm's alone: a new or
empty one gets a marker file (MARKER); one holding anything else without it is refused, and so are
`/` and a system docker's or containerd's directories, with whatever is inside or above them.
The directory is locked while the engine runs; an engine left behind by a crashed run is stopped
by PID and kernel start time (never by name), dockerd before containerd, before a new one starts.
Images persist in the directory, which is what makes a second build warm.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import time
import tomllib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from . import hostnet
from .errors import ControlPlaneError
from .gobuild import cache_dir
from .processes import ManagedProcess, spawn, stop_all, wait_ready
from .progress import Log, format_duration

START_TIMEOUT = 60.0
CGROUP_PARENT = "pykcm-docker"  # every container's cgroup is below this one, in each hierarchy
_SOCKET_PATH_MAX = 100  # sun_path is 108 bytes; dockerd and containerd add suffixes to their sockets
MARKER = "pykcm-docker-engine"  # written by pykcm into each engine directory it takes
_MARKER_TEXT = ("A private Docker engine's directory, made by pykcm (pykcm testenv image / kind-image): its images,\n"
                "containerd root, logs and, while it runs, sockets. pykcm removes and unmounts below it.\n")
# What earlier pykcm versions put in an engine directory, before the marker: such a directory is adopted.
_ENGINE_ENTRIES = frozenset({"engine.lock", "engine.json", "data", "containerd", "logs", "run", MARKER})
# A system docker's and containerd's own directories (data, state, config): an engine directory is
# never one of them, inside one or above one (its data/, containerd/ and run/ would be theirs).
_SYSTEM_PATHS = ("/var/lib/docker", "/var/lib/containerd", "/run/docker", "/run/containerd", "/var/run/docker",
                 "/var/run/containerd", "/etc/docker", "/etc/containerd")
_DOCKER_CONFIG, _CONTAINERD_CONFIG_FILE = Path("/etc/docker/daemon.json"), Path("/etc/containerd/config.toml")

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
        try:
            _stop_dockerd_first(self.processes)
            with contextlib.suppress(OSError, ControlPlaneError):  # the next start removes it or says why not
                _remove_run_dir(_run_dir(self.directory))
            _state_file(self.directory).unlink(missing_ok=True)
        finally:
            if self._lock is not None:
                fcntl.flock(self._lock, fcntl.LOCK_UN)
                self._lock.close()
                self._lock = None


def default_directory(purpose: str = "") -> Path:
    """The engine's directory in the pykcm cache: `docker`, or `docker-PURPOSE` (kind's has its own)."""
    return cache_dir() / (f"docker-{purpose}" if purpose else "docker")


def claim_directory(directory: Path) -> None:
    """Take `directory` (resolved) for an engine, or refuse it in one line: it must be new, empty,
    marked as pykcm's (MARKER), an engine directory of an earlier pykcm, or the pykcm cache's; and
    never a system docker's or containerd's path, nor inside or above one."""
    for system in _system_paths():
        if directory == system or directory.is_relative_to(system) or system.is_relative_to(directory):
            raise DockerError(f"{directory} cannot be a private Docker engine's directory: it is, holds or is "
                              f"inside {system}, a system docker's or containerd's; pass a directory of its own")
    if (directory / MARKER).is_file():
        return
    if directory.exists() and not directory.is_dir():
        raise DockerError(f"{directory} is not a directory: pass a new or empty one for the private Docker engine")
    entries = {entry.name for entry in directory.iterdir()} if directory.exists() else set()
    earlier = "engine.lock" in entries and entries <= _ENGINE_ENTRIES
    in_cache = directory.parent == cache_dir().resolve() and directory.name.startswith("docker")
    if entries and not earlier and not in_cache:
        raise DockerError(f"{directory} is not empty and is no private Docker engine's directory (it has no {MARKER} "
                          "file): pass a new or empty directory")
    directory.mkdir(parents=True, exist_ok=True)
    (directory / MARKER).write_text(_MARKER_TEXT)


def _system_paths() -> list[Path]:
    """_SYSTEM_PATHS, and the data and state directories this machine's docker and containerd are
    configured with (resolved: /var/run is /run)."""
    paths = [Path(p) for p in _SYSTEM_PATHS]
    with contextlib.suppress(OSError, ValueError, AttributeError, TypeError):  # no or an odd config: the defaults
        docker_config = json.loads(_DOCKER_CONFIG.read_text())
        paths += [Path(docker_config[key]) for key in ("data-root", "exec-root") if docker_config.get(key)]
    with contextlib.suppress(OSError, ValueError, AttributeError, TypeError):
        containerd_config = tomllib.loads(_CONTAINERD_CONFIG_FILE.read_text())
        paths += [Path(containerd_config[key]) for key in ("root", "state") if containerd_config.get(key)]
    return [path.resolve() for path in paths if path.is_absolute()]


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
    claim_directory(directory)  # before anything is written, removed or unmounted there
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
    hostnet.remove_tree(run_dir)


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
        _stop_dockerd_first(alive)
    _state_file(directory).unlink(missing_ok=True)


# dockerd gives its containers this long to stop before it kills them (its default, 15 s, is our
# whole wait for it); then it needs a few seconds more for the shims, mounts and cgroups.
CONTAINER_STOP_TIMEOUT = 10
DOCKERD_STOP_WAIT = 30.0


def _stop_dockerd_first(processes: Sequence[ManagedProcess]) -> None:
    """dockerd alone first, waited for: it stops its containers through containerd, which must still
    run (stopped together, dockerd times out on each and leaves its shim, mounts and cgroups), and
    kills those that ignore their stop signal after its --shutdown-timeout, well before our wait ends."""
    stop_all([proc for proc in processes if proc.name == "dockerd"], DOCKERD_STOP_WAIT)
    stop_all([proc for proc in processes if proc.name != "dockerd"])


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
        f"--shutdown-timeout={CONTAINER_STOP_TIMEOUT}",
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
