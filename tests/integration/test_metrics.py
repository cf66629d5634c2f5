"""/metrics as Prometheus scrapes it: client-go names, labels and buckets, and values that move."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from pykcm.client.errors import NotFound
from pykcm.client.resources import NAMESPACES, REPLICASETS, SERVICEACCOUNTS
from pykcm.client.rest import RestClient
from pykcm.testenv.controlplane import ControlPlane
from tests.support import (
    admin_client,
    create_namespace,
    free_port,
    https_get,
    replicaset_manifest,
    running_manager,
    sample,
    wait_for,
)

pytestmark = pytest.mark.integration

# KCM's, as scraped: Go's ExponentialBuckets(10e-9, 10, 10) multiplies, so two bounds are a bit under a power of ten.
WORKQUEUE_BUCKETS = ["1e-08", "1e-07", "1e-06", "9.999999999999999e-06", "9.999999999999999e-05", "0.001", "0.01",
                     "0.1", "1", "10", "+Inf"]
REST_BUCKETS = ["0.005", "0.025", "0.1", "0.25", "0.5", "1", "2", "4", "8", "15", "30", "60", "+Inf"]


@pytest.fixture
async def client(control_plane: ControlPlane) -> AsyncIterator[RestClient]:
    client = admin_client(control_plane.kubeconfig)
    yield client
    await client.close()


def buckets(text: str, histogram: str, labels: dict[str, str]) -> list[str]:
    for family in text_string_to_metric_families(text):
        if family.name == histogram:
            return [
                s.labels["le"] for s in family.samples
                if s.name == f"{histogram}_bucket" and all(s.labels.get(k) == v for k, v in labels.items())
            ]
    return []


def help_of(text: str, family: str) -> str | None:
    prefix = f"# HELP {family} "
    return next((line[len(prefix):] for line in text.splitlines() if line.startswith(prefix)), None)


async def service_account_token(client: RestClient, namespace: str) -> str:
    """A token of the namespace's `default` service account, once the serviceaccount controller made it."""
    async def made() -> bool:
        try:
            await client.get(SERVICEACCOUNTS, "default", namespace)
        except NotFound:
            return False
        return True

    await wait_for(made, timeout=20, message="default service account")
    request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}}
    answer = await client.request("POST", SERVICEACCOUNTS.path(namespace, "default", "token"), body=request)
    return answer["status"]["token"]


def label_values(text: str) -> set[str]:
    return {v for family in text_string_to_metric_families(text) for s in family.samples for v in s.labels.values()}


async def test_scenario_47_metrics_have_client_go_names_labels_and_buckets(
    control_plane: ControlPlane, client: RestClient
) -> None:
    port, lease = free_port(), f"pykcm-{uuid.uuid4().hex[:8]}"
    url, cert = f"https://127.0.0.1:{port}/metrics", (control_plane.pki.admin_cert, control_plane.pki.admin_key)
    namespace = await create_namespace(client, "metrics")
    names = [f"web-{uuid.uuid4().hex[:6]}" for _ in range(3)]
    try:
        async with running_manager(
            control_plane.kubeconfig, "replicaset,serviceaccount", leader_elect=True, leader_elect_resource_name=lease,
            secure_port=port, bind_address="127.0.0.1",
        ):
            status, before = await https_get(url, cert=cert)
            assert status == 200
            adds_before = sample(before, "workqueue_adds_total", {"name": "replicaset"}) or 0.0
            for name in names:
                await client.create(REPLICASETS, replicaset_manifest(name, 0), namespace=namespace)

            async def scraped_after_work() -> str | None:
                text = (await https_get(url, cert=cert))[1]
                adds = sample(text, "workqueue_adds_total", {"name": "replicaset"}) or 0.0
                done = sample(text, "workqueue_work_duration_seconds_count", {"name": "replicaset"}) or 0.0
                return text if adds >= adds_before + len(names) and done >= len(names) else None  # added and synced

            text = await wait_for(scraped_after_work, timeout=20, interval=0.5, message="replicaset queue adds")
            # The secure port's own metrics, with the apiserver's TokenReview and SubjectAccessReview.
            token = await service_account_token(client, namespace)
            assert (await https_get(url, token=token))[0] == 403  # authenticated, then RBAC has no opinion
            assert (await https_get(url, token=f"{token}x"))[0] == 401
            auth = (await https_get(url, cert=cert))[1]
            slis = (await https_get(url.replace("/metrics", "/metrics/slis"), cert=cert))[1]
    finally:
        with contextlib.suppress(Exception):
            await client.delete(NAMESPACES, namespace)

    # Work queue (BETA, label `name` = queue name).
    for metric in ("workqueue_depth", "workqueue_retries_total", "workqueue_unfinished_work_seconds",
                   "workqueue_longest_running_processor_seconds"):
        assert sample(text, metric, {"name": "replicaset"}) is not None, metric
    assert sample(text, "workqueue_adds_total", {"name": "serviceaccount"}) is not None
    assert sample(text, "workqueue_work_duration_seconds_count", {"name": "replicaset"}) >= len(names)
    assert buckets(text, "workqueue_queue_duration_seconds", {"name": "replicaset"}) == WORKQUEUE_BUCKETS
    assert buckets(text, "workqueue_work_duration_seconds", {"name": "replicaset"}) == WORKQUEUE_BUCKETS

    # REST client: code/method/host counters, verb/host histograms.
    host = control_plane.apiserver_url.removeprefix("https://")
    assert sample(text, "rest_client_requests_total", {"code": "200", "method": "GET", "host": host}) > 0
    assert sample(text, "rest_client_requests_total", {"code": "200", "method": "PUT", "host": host}) > 0  # lease
    assert buckets(text, "rest_client_request_duration_seconds", {"verb": "GET", "host": host}) == REST_BUCKETS
    assert buckets(text, "rest_client_rate_limiter_duration_seconds", {"verb": "GET", "host": host}) == REST_BUCKETS
    for histogram in ("rest_client_request_size_bytes", "rest_client_response_size_bytes"):  # 64 B to 16 MiB
        assert len(buckets(text, histogram, {"verb": "POST", "host": host})) == 12, histogram
        assert sample(text, f"{histogram}_sum", {"verb": "POST", "host": host}) > 0, histogram
    assert sample(text, "rest_client_request_size_bytes_sum", {"verb": "GET", "host": host}) == 0  # no body

    # client-go's informer families (ALPHA, KCM's name label is "kube-controller-manager").
    replicasets = {"name": "pykcm", "group": "apps", "version": "v1", "resource": "replicasets"}
    assert sample(text, "informer_queued_items", replicasets) is not None  # 0 but for events in flight
    assert sample(text, "informer_processing_latency_seconds_count", replicasets) >= len(names)
    assert len(buckets(text, "informer_processing_latency_seconds", replicasets)) == 13
    pods = {"name": "pykcm", "group": "", "version": "v1", "resource": "pods"}
    assert sample(text, "informer_store_resource_version", pods) > 0

    # Leader election and the manager.
    assert sample(text, "leader_election_master_status", {"name": lease}) == 1
    assert sample(text, "leader_election_slowpath_total", {"name": lease}) is not None
    running = {"name": "replicaset-controller", "manager": "pykcm"}
    assert sample(text, "running_managed_controllers", running) == 1
    assert sample(text, "pykcm_controller_sync_duration_seconds_count", {"controller": "replicaset-controller"}) > 0

    # Process metrics from prometheus_client's default collectors.
    assert sample(text, "process_resident_memory_bytes") is not None

    # HELP as KCM prints it: component-base's stability level first, for the families KCM has.
    assert help_of(text, "workqueue_adds_total") == "[BETA] Total number of adds handled by workqueue"
    assert help_of(text, "rest_client_requests_total") == (
        "[ALPHA] Number of HTTP requests, partitioned by status code, method, and host.")
    assert help_of(slis, "kubernetes_healthcheck") == "[STABLE] This metric records the result of a single healthcheck."
    assert help_of(slis, "process_start_time_seconds") == (
        "[ALPHA] Start time of the process since unix epoch in seconds.")  # /metrics' (Go's collector's) has none
    assert not help_of(text, "process_start_time_seconds").startswith("[")  # type: ignore[union-attr]
    assert not help_of(text, "pykcm_controller_sync_duration_seconds").startswith("[")  # type: ignore[union-attr]
    assert help_of(text, "kubernetes_feature_enabled") is not None

    # Delegated authentication and authorization, as KCM counts them: one review each for the token,
    # one TokenReview for the bad token (a 201 saying "not authenticated", an error to the filter).
    def delta(name: str, labels: dict[str, str]) -> float:
        return (sample(auth, name, labels) or 0.0) - (sample(before, name, labels) or 0.0)

    assert delta("apiserver_delegated_authn_request_total", {"code": "201"}) == 2
    assert delta("apiserver_delegated_authn_request_duration_seconds_count", {"code": "201"}) == 2
    assert delta("apiserver_delegated_authz_request_total", {"code": "201"}) == 1
    # Go names this counter without `_total`, and so does the text; prometheus_client's parser adds it.
    assert 'authentication_attempts{result="error"} ' in auth and "authentication_attempts_total" not in auth
    assert delta("authentication_attempts_total", {"result": "error"}) == 1
    assert delta("authorization_attempts_total", {"result": "no-opinion"}) == 1
    assert delta("authentication_attempts_total", {"result": "success"}) >= 2  # the scrapes' admin certificate too
    assert delta("authorization_attempts_total", {"result": "allowed"}) >= 2  # system:masters

    # Bounded cardinality: no label value is an object's name.
    assert not ({namespace, *names} & label_values(text))
