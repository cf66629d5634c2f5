"""/configz: pykcm/app/configz.py's configuration against the built KCM v1.36.3's answer, and its route.

KCM_* below is what KCM answered (curl with the admin client certificate) when started with
--kubeconfig=/tmp/cz/kcm.kubeconfig --controllers=replicaset,namespace,serviceaccount
--leader-elect=false --use-service-account-credentials=true; pykcm's object for the same flags is
KCM's without the sections of controllers pykcm does not run.
"""

from __future__ import annotations

import json

import pytest

from pykcm.app.configz import GROUP, canonical_controllers, configz
from pykcm.app.options import ControllerInfo, Options
from pykcm.serving.authn import DelegatingAuthenticator
from pykcm.serving.authz import DelegatingAuthorizer
from pykcm.serving.server import SecureServer
from pykcm.serving.zpages import Component, go_json
from tests.support import free_port
from tests.unit.test_serving_http import exchange, get
from tests.unit.test_zpages import START

KNOWN = [ControllerInfo(f"{name}-controller", (name,)) for name in ("replicaset", "namespace", "serviceaccount")]
KCM_GENERIC = (
    '{"Port":0,"Address":"0.0.0.0","MinResyncPeriod":"12h0m0s","ClientConnection":{"kubeconfig":'
    '"/tmp/cz/kcm.kubeconfig","acceptContentTypes":"","contentType":"application/vnd.kubernetes.protobuf",'
    '"qps":20,"burst":30},"ControllerStartInterval":"0s","LeaderElection":{"leaderElect":false,"leaseDuration":'
    '"15s","renewDeadline":"10s","retryPeriod":"2s","resourceLock":"leases","resourceName":'
    '"kube-controller-manager","resourceNamespace":"kube-system"},"Controllers":["replicaset-controller",'
    '"namespace-controller","serviceaccount-controller"],"Debugging":{"enableProfiling":true,'
    '"enableContentionProfiling":false},"LeaderMigrationEnabled":false,"LeaderMigration":{"leaderName":"",'
    '"resourceLock":"","controllerLeaders":null}}'
)
KCM_NAMESPACE = '{"NamespaceSyncPeriod":"5m0s","ConcurrentNamespaceSyncs":10}'
KCM_REPLICASET = '{"ConcurrentRSSyncs":5}'


def test_the_configuration_is_kcms_for_the_same_flags() -> None:
    opts = Options(
        kubeconfig="/tmp/cz/kcm.kubeconfig",
        controllers=canonical_controllers(["replicaset", "namespace", "serviceaccount"], KNOWN),
        leader_elect=False,
        leader_elect_resource_name="kube-controller-manager",  # pykcm's own default is "pykcm"
        use_service_account_credentials=True,
    )
    config = configz(opts)[GROUP]
    assert list(config) == ["kind", "apiVersion", "Generic", "KubeCloudShared", "NamespaceController",
                            "ReplicaSetController"]  # KCM's order, without the controllers pykcm lacks
    assert (config["kind"], config["apiVersion"]) == ("KubeControllerManagerConfiguration", f"{GROUP}/v1alpha1")
    assert go_json(config["Generic"]).decode() == KCM_GENERIC
    assert go_json(config["NamespaceController"]).decode() == KCM_NAMESPACE
    assert go_json(config["ReplicaSetController"]).decode() == KCM_REPLICASET
    assert config["KubeCloudShared"] == {"UseServiceAccountCredentials": True}


def test_aliases_become_controller_names_and_the_rest_is_kept_as_given() -> None:
    spec = ["*", "-replicaset", "namespace-controller", "-serviceaccount-controller", "-"]
    assert canonical_controllers(spec, KNOWN) == [
        "*", "-replicaset-controller", "namespace-controller", "-serviceaccount-controller", "-"]


def test_numbers_and_durations_are_written_as_go_writes_them() -> None:
    opts = Options(kube_api_qps=0.5, kube_api_burst=1, namespace_sync_period=90.5, min_resync_period=3600)
    text = go_json(configz(opts)).decode()
    assert '"qps":0.5,"burst":1' in text and '"NamespaceSyncPeriod":"1m30.5s"' in text
    assert '"MinResyncPeriod":"1h0m0s"' in text and '"kubeconfig":""' in text
    assert '"qps":-1,' in go_json(configz(Options(kube_api_qps=-1))).decode()


async def test_configz_is_served_as_json_once_authorized() -> None:
    config = configz(Options(kubeconfig="/a<b>&c"))
    served = SecureServer(
        "127.0.0.1", free_port(), None,  # type: ignore[arg-type]
        lambda: [], DelegatingAuthenticator(None), DelegatingAuthorizer(None, ["/configz"]),
        component=Component(name="pykcm", start_time=START, binary_version="0.1.0", config=config),
    )
    unserved = SecureServer(
        "127.0.0.1", free_port(), None,  # type: ignore[arg-type]
        lambda: [], DelegatingAuthenticator(None), DelegatingAuthorizer(None, ["/configz"]),
        component=Component(name="pykcm", start_time=START, binary_version="0.1.0"),
    )
    await served.start()
    await unserved.start()
    try:
        status, headers, body, _ = await exchange(served.port, get("/configz", "Connection: close", method="POST"))
        assert status == "HTTP/1.1 200 OK"  # any method, as component-base's handler
        assert (headers["content-type"], headers["x-content-type-options"]) == ("application/json", "nosniff")
        assert body == go_json(config) and b'"/a\\u003cb\\u003e\\u0026c"' in body  # encoding/json's HTML escaping
        assert json.loads(body) == config
        status, _, body, _ = await exchange(unserved.port, get("/configz", "Connection: close"))
        assert (status, body) == ("HTTP/1.1 404 Not Found", b"404 page not found\n")
    finally:
        await served.stop()
        await unserved.stop()


async def test_flagz_and_statusz_are_not_served_with_their_gates_off() -> None:
    # component-base installs each only with its gate (ComponentFlagz, ComponentStatusz: beta and on).
    server = SecureServer(
        "127.0.0.1", free_port(), None,  # type: ignore[arg-type]
        lambda: [], DelegatingAuthenticator(None), DelegatingAuthorizer(None, ["/flagz", "/statusz"]),
        component=Component(name="pykcm", start_time=START, binary_version="0.1.0", flagz=False, statusz=False),
    )
    await server.start()
    try:
        for path in ("/flagz", "/statusz"):
            status, _, body, _ = await exchange(server.port, get(path, "Connection: close"))
            assert (status, body) == ("HTTP/1.1 404 Not Found", b"404 page not found\n")
    finally:
        await server.stop()


def test_the_controllers_left_to_kcm_are_shown_by_kcms_names(monkeypatch: pytest.MonkeyPatch) -> None:
    # The built KCM v1.36.3 shows them all; pykcm leaves them to KCM but names them the same way.
    from pykcm.app import cli

    runs: list = []
    monkeypatch.setattr(cli.logging_setup, "setup", lambda *_: None)
    monkeypatch.setattr(cli, "_run_manager", lambda options, classes, watch=None: runs.append((options, classes)))
    assert cli.main(["run", "--controllers=*,bootstrapsigner,tokencleaner,-serviceaccount"]) == 0
    options, classes = runs[0]
    assert options.controllers == ["*", "bootstrap-signer-controller", "token-cleaner-controller",
                                   "-serviceaccount-controller"]
    assert "serviceaccount-controller" not in [c.name for c in classes]
