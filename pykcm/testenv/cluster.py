"""Start, stop and use a local cluster: the control plane, and with nodes the rest of a cluster
(KCM's other controllers, kube-scheduler, kwok nodes). State lives in a directory, so `stop` works
from any process and never signals a process that merely reused a recorded PID."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from . import kwok, realnode
from .build import KUBERNETES_VERSION, ensure_binaries
from .certs import Pki
from .controlplane import PORTS, STATE_FILE, ControlPlane, Log
from .errors import BuildError, ControlPlaneError
from .gobuild import try_lock
from .interrupts import killing_on_signal
from .nodes import KCM_CONTROLLERS, check_node_count, start_node_services, start_simulated_nodes
from .processes import LOOPBACK, STOP_TIMEOUT, free_port, stop_all, strays

LOCK_FILE = "testenv.lock"
# What a start writes into its directory (and *.kubeconfig): found there without STATE_FILE, they are
# someone else's files, which a start would overwrite (pki/ca.key, kubeconfig) or adopt (etcd/).
WRITTEN = (STATE_FILE, "pki", "etcd", "logs", "kubeconfig", kwok.KWOK, kwok.STATE_FILE, "node", realnode.STATE_FILE)


class DirectoryBusy(ControlPlaneError):
    """Another process is starting or stopping the cluster of this directory."""


def start(
    directory: Path,
    kcm_controllers: str | None = None,
    kcm_args: Sequence[str] = (),
    log: Log = print,
    apiserver_args: Sequence[str] = (),
    nodes: int = 0,
    real_node: bool = False,
) -> ControlPlane:
    """Start etcd and kube-apiserver (and kube-controller-manager when `kcm_controllers` is
    given) with state in `directory`; return once the apiserver is ready. `apiserver_args` are
    appended to the kube-apiserver command line (later flags win) and kept across restarts.

    `nodes` > 0 makes it a cluster with nodes: the real kube-controller-manager running every
    controller pykcm does not (KCM_CONTROLLERS, unless `kcm_controllers` says otherwise),
    kube-scheduler, and that many simulated nodes played by kwok.

    `real_node` adds a real node beside them (containerd, kubelet, kube-proxy; root only, see
    realnode.py); the apiserver then binds that node's address instead of 127.0.0.1."""
    check_node_count(nodes)
    if real_node:
        realnode.check_prerequisites()
    directory = Path(directory).resolve()
    directory.mkdir(parents=True, exist_ok=True)
    _refuse_foreign(directory)
    with exclusive(directory):
        return _start_locked(directory, kcm_controllers, kcm_args, log, apiserver_args, nodes, real_node)


def _start_locked(
    directory: Path, kcm_controllers: str | None, kcm_args: Sequence[str], log: Log, apiserver_args: Sequence[str],
    nodes: int, real_node: bool,
) -> ControlPlane:
    _refuse_if_running(directory)
    if real_node:
        remove_abandoned_real_node(log, held=directory)
    with_nodes = nodes > 0 or real_node
    binaries = ensure_binaries(need_kcm=bool(kcm_controllers or with_nodes), need_scheduler=with_nodes, log=log)
    node_binaries = realnode.ensure_node_binaries(log) if real_node else None
    ports = {name: free_port() for name in PORTS}
    host, extra_args = (LOOPBACK, ())
    if real_node:
        host, extra_args = realnode.NODE_IP, realnode.apiserver_args(Pki.at(directory / "pki"))
    plane = ControlPlane(directory, binaries, ports, log=log, apiserver_args=(*extra_args, *apiserver_args), host=host)
    plane._save(running=False)  # marks the directory as a testenv's before anything else is written into it
    started = time.monotonic()
    try:
        if real_node:
            realnode.prepare_host(directory, log)
        plane.boot(None if with_nodes else kcm_controllers, kcm_args)
        if with_nodes:
            start_node_services(plane, kcm_controllers or KCM_CONTROLLERS, kcm_args)
        if nodes:
            start_simulated_nodes(plane, nodes, kcm_controllers or KCM_CONTROLLERS, kcm_args, log)
        if node_binaries:
            realnode.start_node(plane, node_binaries, log)
    except BaseException:
        _stop_cluster(plane, timeout=5.0, announce=True)
        raise
    plane._save()
    what = f"local cluster with {nodes} nodes" if nodes else "local control plane"
    if real_node:
        what = f"local cluster with {nodes} simulated nodes and a real node"
    log(f"{what} {KUBERNETES_VERSION} ready at {plane.apiserver_url} in {time.monotonic() - started:.1f}s")
    return plane


@contextlib.contextmanager
def exclusive(directory: Path) -> Iterator[None]:
    """Held for the whole of a start or stop of `directory`'s cluster (its lock file, flock: the kernel
    lets go when this process ends, however), so that two never interleave: a second start would
    write its own state over the first's, whose processes then run unrecorded."""
    with open(directory / LOCK_FILE, "a") as lock:
        if not try_lock(lock):
            raise DirectoryBusy(f"another testenv start or stop is using {directory}")
        yield


def _refuse_foreign(directory: Path) -> None:
    if (directory / STATE_FILE).exists():
        return
    found = sorted(p.name for p in directory.iterdir() if p.name in WRITTEN or p.name.endswith(".kubeconfig"))
    if found:
        raise ControlPlaneError(
            f"{directory} holds {', '.join(found)} but no {STATE_FILE}, so it is not a testenv directory: "
            "refusing to write over them; use a new or empty directory"
        )


def _refuse_if_running(directory: Path) -> None:
    try:
        previous = ControlPlane.from_state(directory)
    except ControlPlaneError:
        return
    alive = [p for p in previous.processes.values() if p.alive()]
    if alive:
        names = ", ".join(f"{p.name} (pid {p.pid})" for p in alive)
        raise ControlPlaneError(f"a control plane is already running in {directory}: {names}; stop it first")


def remove_abandoned_real_node(log: Log, held: Path | None = None) -> None:
    """A cluster whose processes were killed without a teardown (SIGKILL, a restarted machine or
    container) still holds the machine's real node: its claim, mounts, interfaces and iptables
    rules. Tear that down when none of its processes runs; a running one keeps its claim, and so
    does one being started or stopped right now (`held`: the directory whose lock we hold)."""
    owner = realnode.claimant()
    if owner is None:
        return
    with contextlib.ExitStack() as stack:
        try:
            if owner != held:
                stack.enter_context(exclusive(owner))
            previous = ControlPlane.from_state(owner, log)
        except (ControlPlaneError, OSError):  # being started or stopped, no readable state, or gone
            return
        if any(p.alive() for p in previous.processes.values()):
            return
        log(f"removing the real node left by the cluster in {owner}: none of its processes is running")
        _stop_cluster(previous, timeout=5.0)


def stop(directory: Path, timeout: float = STOP_TIMEOUT) -> None:
    """Stop the control plane recorded in `directory`; only PIDs whose start time still
    matches are signalled, so calling it twice (or after a reboot) is harmless."""
    directory = Path(directory).resolve()
    ControlPlane.from_state(directory)  # no state: says so, without leaving a lock file in that directory
    with exclusive(directory):
        _stop_cluster(ControlPlane.from_state(directory), timeout)


def _stop_cluster(plane: ControlPlane, timeout: float = STOP_TIMEOUT, announce: bool = False) -> None:
    """The real node first (its teardown needs containerd and iptables in order), then the rest, and
    what was spawned for the cluster but not yet recorded when its start was interrupted. A signal
    meanwhile does not cut this short: it kills them all."""

    def everything() -> list:
        return [*plane.processes.values(), *strays(plane.directory)]

    with killing_on_signal(everything, plane._log, "stopping the local cluster" if announce else None):
        realnode.teardown(plane, plane._log)
        kwok.stop_kwok(plane.directory, timeout)  # recorded in kwok.json before the cluster adopts it
        plane.stop(timeout)
        stop_all(strays(plane.directory), timeout)


@contextlib.contextmanager
def running(directory: Path | None = None, **kwargs: Any) -> Iterator[ControlPlane]:
    """Start a control plane (in a fresh temp dir unless `directory` is given) and stop it at exit.
    A temp dir is removed afterwards, unless a process of the cluster failed: it is kept for their
    logs, and said so (not for an error of the block's own, nor for an interruption)."""
    owned = directory is None
    path = Path(tempfile.mkdtemp(prefix="pykcm-testenv-")) if directory is None else Path(directory)
    log: Log = kwargs.get("log", print)
    plane: ControlPlane | None = None
    keep = False
    try:
        plane = start(path, **kwargs)  # stops what it started if it fails
        yield plane
    except BaseException as err:
        keep = owned and _cluster_failed(err, plane, path)
        raise
    finally:
        if plane is not None:
            _stop_cluster(plane, announce=True)
        if keep:
            log(f"keeping {path} for its logs")
        elif owned:
            shutil.rmtree(path, ignore_errors=True)


def _cluster_failed(err: BaseException, plane: ControlPlane | None, path: Path) -> bool:
    """Whether the cluster itself failed (a process that did not start, or died), so that its logs tell
    why: not a build, an interruption, or an error of pykcm's own."""
    if plane is not None and plane.dead_processes():
        return True
    return isinstance(err, ControlPlaneError) and not isinstance(err, BuildError) and (path / "logs").is_dir()
