"""The ReplicaSet controller against a kube-apiserver started with
`--feature-gates=DeploymentReplicaSetTerminatingReplicas=false`, pykcm with the same gate off: the
apiserver drops status.terminatingReplicas from every write, so a count written anyway never matches
what comes back and every sync became a status PUT (a differential run against KCM measured 24 writes
to its 11). With the gate honoured, a steady ReplicaSet with a terminating pod is written no more."""

from __future__ import annotations

import asyncio

import pytest

from pykcm.client.resources import PODS, Resource
from pykcm.client.rest import MERGE_PATCH, RestClient
from pykcm.testenv.controlplane import ControlPlane
from tests.integration.replicaset_support import clean_namespace, create_rs, owned, rs_controller, wait_status
from tests.support import create_namespace, running_manager, wait_for

pytestmark = pytest.mark.integration

GATE_OFF = "DeploymentReplicaSetTerminatingReplicas=false"
APISERVER_ARGS = [f"--feature-gates={GATE_OFF}"]  # for own_plane
FINALIZER = "pykcm.test/hold"  # keeps a deleted pod terminating: no kubelet here to finish it
NUDGES = 5  # pod updates, each a sync of the ReplicaSet


async def test_a_steady_replicaset_with_a_terminating_pod_is_not_rewritten(
    own_plane: ControlPlane, own_client: RestClient
) -> None:
    api = own_client
    ns = await create_namespace(api, "rs-gates")
    try:
        async with running_manager(own_plane.kubeconfig, controllers="replicaset",
                                   feature_gates={"DeploymentReplicaSetTerminatingReplicas": False}) as manager:
            client = rs_controller(manager).client
            status_writes: list[dict] = []
            update = client.update

            async def counting_update(res: Resource, body: dict, subresource: str | None = None) -> dict:
                if subresource == "status":
                    status_writes.append(body["status"])
                return await update(res, body, subresource)

            client.update = counting_update  # type: ignore[method-assign]
            rs = await create_rs(api, ns, "web", 2)
            await wait_status(api, ns, "web", 30, replicas=2, observedGeneration=1)
            leaving = (await owned(api, ns, rs))[0]["metadata"]["name"]
            await api.patch(PODS, leaving, {"metadata": {"finalizers": [FINALIZER]}}, ns, content_type=MERGE_PATCH)
            await api.delete(PODS, leaving, ns)

            async def replaced() -> bool:
                return len(await owned(api, ns, rs)) == 2 and len(await owned(api, ns, rs, active=False)) == 3

            await wait_for(replaced, 30, 0.1, "a replacement beside the terminating pod")
            status = await wait_status(api, ns, "web", 30, replicas=2)
            assert "terminatingReplicas" not in status
            await asyncio.sleep(1.0)  # the replacement's own events and status write settle
            before = len(status_writes)
            for i in range(NUDGES):  # each update of an owned pod syncs the ReplicaSet
                await api.patch(PODS, leaving, {"metadata": {"annotations": {"nudge": str(i)}}}, ns,
                                content_type=MERGE_PATCH)
                await asyncio.sleep(0.2)
            await asyncio.sleep(1.0)
            assert status_writes[before:] == []
            assert all("terminatingReplicas" not in written for written in status_writes)
    finally:
        await clean_namespace(api, ns)
