"""The lean kubeconfig reader agrees with the `kubernetes` package, and leaves it what it cannot read."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest

from pykcm.client import config, kubeconfig
from pykcm.client.kubeconfig import Credentials, FileToken, KubeconfigError, load_kubeconfig, simple_kubeconfig
from pykcm.client.kubeconfigcheck import dump_yaml

PEM = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


def write(tmp_path: Path, cluster: dict[str, Any], user: dict[str, Any], **extra: Any) -> str:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": cluster}, {"name": "other", "cluster": {"server": "https://other:1"}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [
            {"name": "x", "context": {"cluster": "c", "user": "u", "namespace": "ns"}},
            {"name": "y", "context": {"cluster": "other", "user": "u"}},
        ],
        "current-context": "x",
        **extra,
    }
    path = tmp_path / "kubeconfig"
    with path.open("w") as f:
        dump_yaml(doc, f)  # as kubectl writes it: the context named y quoted, else Go reads a boolean
    return str(path)


def files(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "pki").mkdir(exist_ok=True)
    for name in ("ca.crt", "client.crt", "client.key", "token"):
        (tmp_path / "pki" / name).write_bytes(PEM if name != "token" else b"file-token")
    return {"ca": "pki/ca.crt", "crt": "pki/client.crt", "key": "pki/client.key", "token": "pki/token"}


def summary(creds: Credentials) -> tuple[Any, ...]:
    read = lambda p: Path(p).read_bytes() if p else None  # noqa: E731 - contents: a file's, or the inline bytes
    return (
        creds.host,
        creds.verify_tls,
        creds.ca_data or read(creds.ca_file),
        creds.cert_data or read(creds.cert_file),
        creds.key_data or read(creds.key_file),
        creds.token_source(),
    )


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


CASES: dict[str, Any] = {
    "relative files, token": lambda f: (
        {"server": "https://127.0.0.1:6443/", "certificate-authority": f["ca"]},
        {"client-certificate": f["crt"], "client-key": f["key"], "token": "t0k"},
    ),
    "inline data": lambda f: (
        {"server": "https://127.0.0.1:6443", "certificate-authority-data": b64(PEM)},
        {"client-certificate-data": b64(PEM), "client-key-data": b64(PEM)},
    ),
    "token file, insecure": lambda f: (
        {"server": "https://127.0.0.1:6443", "insecure-skip-tls-verify": True},
        {"tokenFile": f["token"]},
    ),
    "plain http": lambda f: ({"server": "http://127.0.0.1:8080"}, {}),
}


@pytest.mark.parametrize("case", CASES)
def test_agrees_with_the_package(tmp_path: Path, case: str) -> None:
    cluster, user = CASES[case](files(tmp_path))
    path = write(tmp_path, cluster, user)
    lean = simple_kubeconfig(path)
    assert lean is not None, "the lean reader should read this kubeconfig"
    assert summary(lean) == summary(config._package_credentials(path, None))


def test_context_is_chosen_by_name(tmp_path: Path) -> None:
    path = write(tmp_path, {"server": "https://127.0.0.1:6443"}, {"token": "t"})
    creds = simple_kubeconfig(path, context="y")
    assert creds is not None and creds.host == "https://other:1"


@pytest.mark.parametrize(
    ("cluster", "user"),
    [
        (
            {"server": "https://h:1"},
            {"exec": {"command": "get-token", "apiVersion": "client.authentication.k8s.io/v1"}},
        ),
        ({"server": "https://h:1"}, {"auth-provider": {"name": "oidc", "config": {}}}),
        ({}, {"token": "t"}),
    ],
)
def test_leaves_the_rest_to_the_package(tmp_path: Path, cluster: dict[str, Any], user: dict[str, Any]) -> None:
    assert simple_kubeconfig(write(tmp_path, cluster, user)) is None


@pytest.mark.parametrize(
    ("cluster", "user", "message"),
    [
        ({"server": "https://h:1", "certificate-authority": "missing.crt"}, {},
         "unable to read certificate-authority missing.crt for c due to No such file or directory"),
        ({"server": "https://h:1", "certificate-authority-data": "not base64!"}, {}, "Only base64 data is allowed"),
        ({"server": "https://h:1"}, {"client-certificate-data": b64(PEM)},
         "client-key-data or client-key must be specified for u to use the clientCert authentication method."),
        ({"server": "https://h:1", "certificate-authority-data": b64(PEM), "certificate-authority": "ca.crt"}, {},
         "certificate-authority-data and certificate-authority are both specified for c. "
         "certificate-authority-data will override."),
        ({"server": "https://h:1", "certificate-authority-data": b64(PEM), "insecure-skip-tls-verify": True}, {},
         "specifying a root certificates file with the insecure flag is not allowed"),
        ({"server": "https://h:1"}, {"token": "t", "username": "a", "password": "b"},
         "more than one authentication method found for u; found [token basicAuth], only one is allowed"),
        ({"server": "https://h:1"}, {"tokenFile": "empty"}, 'read empty token from file "'),
        ({"server": "https://h:1"}, {"as-groups": ["g"]},
         "requesting uid, groups or user-extra for u without impersonating a user"),
    ],
)
def test_what_client_go_refuses_is_one_line(tmp_path: Path, cluster: dict[str, Any], user: dict[str, Any],
                                            message: str) -> None:
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(kubeconfig.KubeconfigError) as err:
        simple_kubeconfig(write(tmp_path, cluster, user))
    assert message in str(err.value) and "\n" not in str(err.value)


NAMED_C = "clusters: [{name: c, cluster: {server: 'https://h:1'}}]\n"


@pytest.mark.parametrize(
    "text",
    [
        "contexts: [{name: no, context: {cluster: c}}]\n",  # YAML's false, which `or ""` let through
        "contexts: [{name: off, context: {cluster: c}}]\n",
        "contexts: [{name: y, context: {cluster: c}}]\n",  # a string to PyYAML, a boolean to Go's YAML
        "users: [{name: N, user: {}}]\n",
        "current-context: no\n",
    ],
)
def test_a_name_yaml_reads_as_a_boolean_is_refused_as_kubectl_refuses_it(tmp_path: Path, text: str) -> None:
    """kubectl: json: cannot unmarshal bool into Go struct field NamedContext.contexts.name of type string."""
    path = tmp_path / "kubeconfig"
    path.write_text(NAMED_C + text)
    with pytest.raises(KubeconfigError, match=r"must be a string, not a boolean$"):
        load_kubeconfig([str(path)])


def test_y_and_n_are_read_and_written_as_go_reads_them(tmp_path: Path) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text("clusters: [{name: c, cluster: {server: 'https://h:1', insecure-skip-tls-verify: y}},"
                    " {name: 'n', cluster: {server: 'https://h:2', insecure-skip-tls-verify: n}}]\n")
    loaded = load_kubeconfig([str(path)]).doc["clusters"]
    assert [(c["name"], c["cluster"]["insecure-skip-tls-verify"]) for c in loaded] == [("c", True), ("n", False)]
    with path.open("w") as f:
        dump_yaml({"contexts": [{"name": "y", "context": {"cluster": "c"}}]}, f)
    assert "name: 'y'" in path.read_text()  # bare, Go would read it back as true
    assert load_kubeconfig([str(path)]).doc["contexts"][0]["name"] == "y"


def test_a_token_file_wins_over_the_token_and_the_token_stands_in_when_it_cannot_be_read(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("from-file")
    creds = simple_kubeconfig(write(tmp_path, {"server": "https://h:1"}, {"token": "inline", "tokenFile": "token"}))
    assert creds is not None and creds.token_source() == "Bearer from-file"
    creds = simple_kubeconfig(write(tmp_path, {"server": "https://h:1"}, {"token": "inline", "tokenFile": "gone"}))
    assert creds is not None and creds.token_source() == "Bearer inline"
    (tmp_path / "empty").write_text("")
    creds = simple_kubeconfig(write(tmp_path, {"server": "https://h:1"}, {"token": "inline", "tokenFile": "empty"}))
    assert creds is not None and creds.token_source() == "Bearer inline"


def test_a_password_alone_is_no_basic_auth(tmp_path: Path) -> None:
    creds = simple_kubeconfig(write(tmp_path, {"server": "https://h:1"}, {"password": "p"}))
    assert creds is not None and creds.token_source() is None


def test_server_name_proxy_basic_auth_and_impersonation_are_read(tmp_path: Path) -> None:
    cluster = {"server": "https://10.0.0.1:6443", "tls-server-name": "kubernetes", "proxy-url": "http://p:3128",
               "disable-compression": True}
    user = {"username": "a", "password": "b", "as": "jane", "as-uid": "42", "as-groups": ["g1", "g2"],
            "as-user-extra": {"scopes/x%y": ["v1", "v2"]}}
    creds = simple_kubeconfig(write(tmp_path, cluster, user))
    assert creds is not None
    assert (creds.server_name, creds.proxy_url) == ("kubernetes", "http://p:3128")
    assert creds.token_source() == "Basic " + b64(b"a:b")
    assert creds.impersonate == (
        ("Impersonate-User", "jane"), ("Impersonate-Uid", "42"), ("Impersonate-Group", "g1"),
        ("Impersonate-Group", "g2"), ("Impersonate-Extra-scopes%2Fx%25y", "v1"),
        ("Impersonate-Extra-scopes%2Fx%25y", "v2"),
    )


def test_master_stands_in_for_a_cluster_without_a_server(tmp_path: Path) -> None:
    f = files(tmp_path)
    creds = simple_kubeconfig(write(tmp_path, {"certificate-authority": f["ca"]}, {"token": "t"}),
                              master="https://10.0.0.9:6443")
    assert creds is not None and creds.ca_file == str(tmp_path / "pki" / "ca.crt")


@pytest.mark.parametrize("content", ["", "not: [valid", "- a list", "current-context: missing\ncontexts: []\n"])
def test_unreadable_files_go_to_the_package(tmp_path: Path, content: str) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(content)
    assert simple_kubeconfig(str(path)) is None


def test_only_a_list_of_one_file_names_a_default_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("KUBECONFIG", f"{tmp_path}/a:{tmp_path}/b")
    assert kubeconfig.default_kubeconfig_path() is None
    monkeypatch.setenv("KUBECONFIG", f"{tmp_path}/a")
    assert kubeconfig.default_kubeconfig_path() == f"{tmp_path}/a"


def test_an_exec_plugin_still_loads_through_the_package(tmp_path: Path) -> None:
    plugin = tmp_path / "plugin.sh"
    status = '{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"token":"from-exec"}}'
    plugin.write_text(f"#!/bin/sh\necho '{status}'\n")
    plugin.chmod(0o755)
    exec_user = {"exec": {"command": str(plugin), "apiVersion": "client.authentication.k8s.io/v1"}}
    loaded = config.load_config(write(tmp_path, {"server": "https://127.0.0.1:6443"}, exec_user))
    assert loaded.token_source() == "Bearer from-exec"


def test_file_token_is_reread_after_its_period(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("one\n")  # trimmed, as client-go does (the package would send the newline)
    token = FileToken(str(path), period=0.0)
    assert token() == "Bearer one"
    path.write_text("two")
    assert token() == "Bearer two"
    path.unlink()
    assert token() == "Bearer two"  # a token file briefly missing during rotation keeps the last token


def test_in_cluster(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "token").write_text("sa-token")
    (tmp_path / "ca.crt").write_bytes(PEM)
    monkeypatch.setattr(kubeconfig, "SERVICE_ACCOUNT_DIR", str(tmp_path))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "fd00::1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    creds = kubeconfig.in_cluster()
    assert creds is not None
    assert (creds.host, creds.ca_file, creds.token_source()) == (
        "https://[fd00::1]:443",
        str(tmp_path / "ca.crt"),
        "Bearer sa-token",
    )
    monkeypatch.delenv("KUBERNETES_SERVICE_PORT")
    assert kubeconfig.in_cluster() is None
