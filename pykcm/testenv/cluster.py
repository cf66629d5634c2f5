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

from .build import KUBERNETES_VERSION, ensure_binaries
from .controlplane import ControlPlane, Log
from .errors import ControlPlaneError
from .nodes import KCM_CONTROLLERS, check_node_count, start_simulated_nodes
from .processes import STOP_TIMEOUT, free_port


def start(
    directory: Path,
    kcm_controllers: str | None = None,
    kcm_args: Sequence[str] = (),
    log: Log = print,
    apiserver_args: Sequence[str] = (),
    nodes: int = 0,
) -> ControlPlane:
    """Start etcd and kube-apiserver (and kube-controller-manager when `kcm_controllers` is
    given) with state in `directory`; return once the apiserver is ready. `apiserver_args` are
    appended to the kube-apiserver command line (later flags win) and kept across restarts.

    `nodes` > 0 makes it a cluster with nodes: the real kube-controller-manager running every
    controller pykcm does not (KCM_CONTROLLERS, unless `kcm_controllers` says otherwise),
    kube-scheduler, and that many simulated nodes played by kwok."""
    check_node_count(nodes)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    _refuse_if_running(directory)
    binaries = ensure_binaries(need_kcm=bool(kcm_controllers or nodes), need_scheduler=nodes > 0, log=log)
    ports = {"etcd_client": free_port(), "etcd_peer": free_port(), "apiserver": free_port()}
    plane = ControlPlane(directory, binaries, ports, log=log, apiserver_args=apiserver_args)
    started = time.monotonic()
    try:
        plane.boot(None if nodes else kcm_controllers, kcm_args)
        if nodes:
            start_simulated_nodes(plane, nodes, kcm_controllers or KCM_CONTROLLERS, kcm_args, log)
    except BaseException:
        plane.stop(timeout=5.0)
        raise
    plane._save()
    what = f"local cluster with {nodes} nodes" if nodes else "local control plane"
    log(f"{what} {KUBERNETES_VERSION} ready at {plane.apiserver_url} in {time.monotonic() - started:.1f}s")
    return plane


def _refuse_if_running(directory: Path) -> None:
    try:
        previous = ControlPlane.from_state(directory)
    except ControlPlaneError:
        return
    alive = [p for p in previous.processes.values() if p.alive()]
    if alive:
        names = ", ".join(f"{p.name} (pid {p.pid})" for p in alive)
        raise ControlPlaneError(f"a control plane is already running in {directory}: {names}; stop it first")


def stop(directory: Path, timeout: float = STOP_TIMEOUT) -> None:
    """Stop the control plane recorded in `directory`; only PIDs whose start time still
    matches are signalled, so calling it twice (or after a reboot) is harmless."""
    ControlPlane.from_state(Path(directory)).stop(timeout)


@contextlib.contextmanager
def running(directory: Path | None = None, **kwargs: Any) -> Iterator[ControlPlane]:
    """Start a control plane (in a fresh temp dir unless `directory` is given) and stop it at exit.
    A temp dir is removed afterwards unless the block failed (its logs help debugging)."""
    owned = directory is None
    path = Path(tempfile.mkdtemp(prefix="pykcm-testenv-")) if directory is None else Path(directory)
    plane = start(path, **kwargs)
    try:
        yield plane
    except BaseException:
        if owned:
            plane._log(f"keeping {path} for its logs")
        owned = False
        raise
    finally:
        plane.stop()
        if owned:
            shutil.rmtree(path, ignore_errors=True)
