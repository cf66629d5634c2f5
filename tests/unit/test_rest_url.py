"""A server URL with a path (a proxy such as Rancher's https://host/k8s/clusters/c-x) is the
prefix of every request, as client-go keeps rest.Config.Host's path: REST calls, watches,
discovery, reviews and the health probe all go under it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from pykcm.client.config import ClientConfig
from pykcm.client.discovery import server_preferred_resources
from pykcm.client.resources import CONFIGMAPS
from pykcm.client.rest import RestClient, request_url
from tests.support import loopback_server


@pytest.mark.parametrize(
    ("host", "path", "url"),
    [
        ("https://h:6443", "/api/v1/pods", "https://h:6443/api/v1/pods"),
        ("https://h:6443/", "/api", "https://h:6443/api"),
        ("https://h/k8s/clusters/c-x", "/api/v1/namespaces/a/pods", "https://h/k8s/clusters/c-x/api/v1/namespaces/a/pods"),
        ("https://h/k8s/clusters/c-x/", "/apis", "https://h/k8s/clusters/c-x/apis"),
        ("https://h/k8s/clusters/c-x", "/healthz", "https://h/k8s/clusters/c-x/healthz"),
        ("https://[::1]:6443/prefix", "/version", "https://[::1]:6443/prefix/version"),
        ("http://127.0.0.1:8001/a/b/c", "apis/apps/v1", "http://127.0.0.1:8001/a/b/c/apis/apps/v1"),
    ],
)
def test_request_url_keeps_the_server_path(host: str, path: str, url: str) -> None:
    assert request_url(host, path) == url


PREFIX = "/k8s/clusters/c-x"


@pytest.fixture
async def prefixed_server() -> AsyncIterator[tuple[str, list[str]]]:
    """A fake apiserver that answers only under PREFIX, and records every path asked for."""
    seen: list[str] = []

    async def handle(request: web.Request) -> web.StreamResponse:
        seen.append(request.path)
        if not request.path.startswith(PREFIX + "/"):
            return web.json_response({"kind": "Status", "code": 404, "reason": "NotFound"}, status=404)
        path = request.path.removeprefix(PREFIX)
        if request.query.get("watch") == "true":
            resp = web.StreamResponse()
            await resp.prepare(request)
            await resp.write(b'{"type":"ADDED","object":{"metadata":{"name":"a","resourceVersion":"2"}}}\n')
            return resp
        if path == "/api":
            return web.json_response({"kind": "APIVersions", "versions": ["v1"]})
        if path == "/apis":
            return web.json_response({"kind": "APIGroupList", "groups": []})
        if path == "/api/v1":
            return web.json_response({"kind": "APIResourceList", "groupVersion": "v1", "resources": [
                {"name": "configmaps", "namespaced": True, "kind": "ConfigMap", "verbs": ["list"]}]})
        return web.json_response({"kind": "ConfigMapList", "metadata": {"resourceVersion": "1"}, "items": []})

    async with loopback_server(handle) as url:
        yield f"{url}{PREFIX}", seen


async def test_every_kind_of_request_keeps_the_prefix(prefixed_server: tuple[str, list[str]]) -> None:
    host, seen = prefixed_server
    client = RestClient(ClientConfig(host=host, ssl_context=None))
    try:
        await client.request("GET", "/healthz", accept="text/plain")
        await client.list(CONFIGMAPS, namespace="ns")
        events = [e async for e in client.watch(CONFIGMAPS.path("ns"), {"resourceVersion": "1"})]
        assert events[0]["type"] == "ADDED"
        found = await server_preferred_resources(client)
        assert any(r.name == "configmaps" for rl in found.resources for r in rl.resources)
        await client.request("POST", "/apis/authentication.k8s.io/v1/tokenreviews", body={"spec": {}})
    finally:
        await client.close()
    assert seen and all(path.startswith(PREFIX + "/") for path in seen), seen


def test_kubeconfig_and_master_keep_the_server_path(tmp_path) -> None:
    from pykcm.client.config import load_config
    from tests.unit.test_client_config import write_kubeconfig

    kubeconfig = write_kubeconfig(tmp_path, {"token": "t"}, server="https://h/k8s/clusters/c-x/")
    assert load_config(kubeconfig).host == "https://h/k8s/clusters/c-x"
    assert load_config(kubeconfig, master="https://m/prefix").host == "https://m/prefix"
