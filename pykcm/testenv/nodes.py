"""A local cluster with nodes: beside pykcm, the real kube-controller-manager runs every
controller pykcm does not (the split the kind recipe uses too), kube-scheduler binds pods, and
kwok plays the nodes, so pods really become Running and Ready.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import ControlPlaneError
from .gobuild import Log
from .kwok import MAX_NODES, create_nodes, start_kwok
from .processes import LOOPBACK, free_port, http_get, retry_on_port_clash, unverified_context

if TYPE_CHECKING:
    from .controlplane import ControlPlane

# The controllers pykcm runs in place of KCM's; a unit test keeps this equal to the built-ins.
PYKCM_CONTROLLERS = ("replicaset-controller", "namespace-controller", "serviceaccount-controller")
# What kubeadm runs KCM with (a worker's join needs the bootstrap signer): every controller.
KUBEADM_CONTROLLERS = "*,bootstrap-signer-controller,token-cleaner-controller"
# The same with pykcm's three taken out. deploy/kind uses this value.
KCM_CONTROLLERS = ",".join((KUBEADM_CONTROLLERS, *(f"-{name}" for name in PYKCM_CONTROLLERS)))
SCHEDULER = "kube-scheduler"
SCHEDULER_READY_TIMEOUT = 60.0


def check_node_count(nodes: int) -> None:
    if not 0 <= nodes <= MAX_NODES:
        raise ControlPlaneError(f"a local cluster has 0 to {MAX_NODES} simulated nodes, not {nodes}")


def start_simulated_nodes(
    plane: ControlPlane, count: int, kcm_controllers: str, kcm_args: Sequence[str], log: Log
) -> None:
    """Start KCM, the scheduler and kwok on `plane`, then create `count` nodes and wait until
    they are Ready (KCM's node-lifecycle controller then lifts the not-ready taint)."""
    start_node_services(plane, kcm_controllers, kcm_args)
    kwok = start_kwok(plane.kubeconfig, plane.directory, log=log)
    plane.adopt(kwok)
    asyncio.run(create_nodes(plane.kubeconfig, count, kwok=kwok))
    log(f"{count} simulated nodes Ready (kwok); kube-scheduler and kube-controller-manager running")


def start_node_services(plane: ControlPlane, kcm_controllers: str, kcm_args: Sequence[str]) -> None:
    """What every cluster with nodes runs: KCM (once) and the scheduler."""
    if not plane.kcm_processes():
        plane.start_kcm(kcm_controllers, kcm_args)
    if SCHEDULER not in plane.processes:
        start_scheduler(plane)


def start_scheduler(plane: ControlPlane) -> None:
    assert plane.binaries.scheduler is not None, "ensure_binaries(need_scheduler=True) first"
    scheduler = plane.binaries.scheduler

    def start_once() -> None:
        port = free_port()  # picked again if another process takes it first
        url, context = f"https://{LOOPBACK}:{port}/healthz", unverified_context()

        def ready() -> bool:
            return http_get(url, context)[0] == 200

        argv = scheduler_argv(scheduler, plane.scheduler_kubeconfig, port)
        plane.start_component(SCHEDULER, argv, ready, SCHEDULER_READY_TIMEOUT, port)

    retry_on_port_clash(start_once, lambda: None)


def scheduler_argv(binary: Path, kubeconfig: Path, port: int) -> list[str]:
    return [
        str(binary),
        f"--kubeconfig={kubeconfig}",
        # Delegated authn/authz as in a real cluster; /healthz is always allowed.
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--leader-elect=false",
        f"--bind-address={LOOPBACK}",
        f"--secure-port={port}",
    ]
