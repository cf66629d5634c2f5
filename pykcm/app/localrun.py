"""`pykcm run --local`: the manager on a local cluster of its own, started before it and stopped after
it, whatever ends the run: the manager's own end, a signal at any point (pykcm/testenv/interrupts.py),
an error, a process of the cluster that dies. The temp dir goes with the cluster unless one of its
processes failed (its logs say why).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from pykcm.serving.listen import dual_stack_socket, is_unspecified, listen_failure
from pykcm.util.log import get_logger

if TYPE_CHECKING:
    from pykcm.app.options import Options
    from pykcm.testenv.controlplane import ControlPlane

LOCAL_WATCH_PERIOD = 2.0  # how often `run --local` checks that its cluster's processes live

log = get_logger("cli")

RunManager = Callable[..., None]  # cli._run_manager(options, classes, watch=plane)
Say = Callable[[str, str], None]  # the last line: (text for a JSON log, plain line)


class LocalClusterFailed(Exception):
    def __init__(self, dead: list) -> None:
        names = ", ".join(f"{p.name} (log: {p.log_path})" for p in dead)
        super().__init__(f"the local cluster lost {names}; stopping")


class PortUnavailable(Exception):
    """The secure port cannot be had: said before the local cluster starts, in KCM's words."""


def run_local(options: Options, classes: list, nodes: int, run_manager: RunManager, say: Say) -> None:
    """Start the local cluster, run the manager on it, stop the cluster (see the module's doc)."""
    from pykcm.testenv import interrupts, processes
    from pykcm.testenv.cluster import running

    check_port(options.bind_address, options.secure_port)
    with (
        interrupted_exit(say),
        processes.dying_with_this_process(),
        running(log=lambda msg: print(msg, file=sys.stderr), nodes=nodes) as plane,
    ):
        print(try_this(plane, nodes), flush=True)
        options.kubeconfig = str(plane.kubeconfig)
        handlers = interrupts.saved()
        try:
            run_manager(options, classes, watch=plane)
        finally:  # the event loop leaves SIG_DFL behind: the teardown must not die of a signal
            interrupts.restore(handlers)


@contextlib.contextmanager
def interrupted_exit(say: Say) -> Iterator[None]:
    """The block interruptible (SIGTERM and SIGHUP as Ctrl-C); an interruption ends the command in
    one line with 128 + the signal's number."""
    import typer

    from pykcm.testenv import interrupts

    try:
        with interrupts.interruptible():
            yield
    except interrupts.Interrupted as err:
        say("interrupted", "pykcm: interrupted")
        raise typer.Exit(err.exit_code) from None


def check_port(host: str, port: int) -> None:
    """Bind the secure port as the manager will (then let it go), so that a taken one fails before the
    cluster starts: "failed to listen on 127.0.0.1:10257: address already in use", as KCM says it."""
    if not port:
        return
    try:
        if (sock := dual_stack_socket(port) if is_unspecified(host) else None) is not None:
            sock.close()
            return
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the manager's listener
            sock.bind((host or "0.0.0.0", port))
    except OSError as err:
        raise PortUnavailable(listen_failure(host, port, err)) from None


def try_this(plane: ControlPlane, nodes: int) -> str:
    kubectl = f"{plane.binaries.kubectl or 'kubectl'} --kubeconfig {plane.kubeconfig}"
    lines = [f"Local cluster is up. kubeconfig: {plane.kubeconfig}", "Try this:"]
    if nodes:
        lines += [
            f"  {kubectl} create deployment web --image=nginx --replicas=3",
            f"  {kubectl} get deployment,replicaset,pods -o wide",
            f"  {kubectl} scale deployment web --replicas=5",
            f"  {kubectl} delete deployment web",
        ]
    else:
        lines += [f"  {kubectl} create namespace demo", f"  {kubectl} get serviceaccounts -n demo"]
    return "\n".join(lines)


async def watch_cluster(plane: ControlPlane, stop: asyncio.Event) -> None:
    """`run --local` stops, saying which, when a process of its cluster dies: never hangs."""
    while not stop.is_set():
        await asyncio.sleep(LOCAL_WATCH_PERIOD)
        for proc in plane.dead_processes():
            log.error(None, "Local cluster process exited, shutting down", process=proc.name, log=str(proc.log_path))
            stop.set()
