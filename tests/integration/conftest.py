"""The ReplicaSet scenario tests' fixtures (test_replicaset*.py): an admin client, a namespace
emptied and deleted afterwards, and pykcm in-process running only the replicaset controller."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from pykcm.app.manager import Manager
from pykcm.client.rest import RestClient
from tests.integration.replicaset_support import clean_namespace
from tests.support import admin_client, create_namespace, running_manager


@pytest.fixture
async def api(control_plane) -> AsyncIterator[RestClient]:
    client = admin_client(control_plane.kubeconfig)
    yield client
    await client.close()


@pytest.fixture
async def ns(api: RestClient) -> AsyncIterator[str]:
    name = await create_namespace(api, "rs")
    yield name
    await clean_namespace(api, name)


@pytest.fixture
async def pykcm(control_plane) -> AsyncIterator[Manager]:
    async with running_manager(control_plane.kubeconfig, controllers="replicaset", kube_api_qps=1000,
                               kube_api_burst=1000) as manager:
        yield manager
