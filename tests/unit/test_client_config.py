"""Credentials from kubeconfig files, as the `kubernetes` package loads them."""

import re
import stat
import sys
import time

import pytest
import yaml

from pykcm.client.config import (
    ClientConfig,
    ConfigError,
    PluginToken,
    bearer_token_config,
    load_config,
    server_url,
    tls_context,
)
from pykcm.client.rest import RestClient
from pykcm.util import log
from tests.unit.test_http import ok, raw_server, read_request


def write_kubeconfig(tmp_path, user: dict, server: str = "https://127.0.0.1:6443") -> str:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": server, "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def test_bearer_token_is_sent(tmp_path):
    config = load_config(write_kubeconfig(tmp_path, {"token": "s3cret"}))
    assert config.token_source() == "Bearer s3cret"
    assert config.host == "https://127.0.0.1:6443"


def test_master_overrides_the_server(tmp_path):
    config = load_config(write_kubeconfig(tmp_path, {"token": "t"}), master="https://10.0.0.9:443")
    assert config.host == "https://10.0.0.9:443"


def test_bearer_token_config_swaps_credentials(tmp_path):
    base = load_config(write_kubeconfig(tmp_path, {"token": "admin"}))
    derived = bearer_token_config(base, lambda: "Bearer sa-token")
    assert derived.token_source() == "Bearer sa-token" and derived.host == base.host


@pytest.mark.parametrize("content", ["not: [valid", "apiVersion: v1\nkind: Config\n"])
def test_broken_kubeconfig_is_one_line_config_error(tmp_path, content):
    path = tmp_path / "kubeconfig"
    path.write_text(content)
    with pytest.raises(ConfigError) as err:
        load_config(str(path))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("- a\n- b\n", "the file holds a YAML list, not a mapping"),
        ("root:x:0:0:root:/root:/bin/bash\n", "the file holds a YAML string, not a mapping"),
        ("clusters: 5\n", "'clusters' must be a list of mappings"),
        ("users: [{name: u, user: token}]\n", "each 'users' entry's 'user' must be a mapping"),
        ("current-context: [a]\n", "'current-context' must be a string"),
        (b"\x7fELF\x02\x01", "not YAML: unacceptable character"),
    ],
)
def test_a_file_that_is_no_kubeconfig_is_named_with_what_is_wrong(tmp_path, content, problem):
    # The package fails on these with Python's own words ("'str' object does not support item
    # assignment"); KCM says "error loading config file" and why.
    path = tmp_path / "kubeconfig"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(ConfigError) as err:
        load_config(str(path))
    message = str(err.value)
    assert message.startswith(f"error loading config file {str(path)!r}: ") and problem in message
    assert "\n" not in message


def test_a_directory_as_kubeconfig_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match=r"error loading config file .*: Is a directory$"):
        load_config(str(tmp_path))


def test_a_broken_file_in_a_kubeconfig_list_is_named(tmp_path, monkeypatch):
    good = write_kubeconfig(tmp_path, {"token": "t"})
    broken = tmp_path / "broken"
    broken.write_text("- a\n")
    monkeypatch.setenv("KUBECONFIG", f"{good}:{broken}")
    with pytest.raises(ConfigError, match=rf"error loading config file '{broken}': not a kubeconfig"):
        load_config()


@pytest.mark.parametrize(
    ("server", "tls", "url"),
    [
        ("https://127.0.0.1:6443/", False, "https://127.0.0.1:6443"),
        ("http://proxy/prefix/", False, "http://proxy/prefix"),
        ("127.0.0.1:8080", False, "http://127.0.0.1:8080"),  # a bare host:port: the scheme TLS implies
        ("[::1]:6443", True, "https://[::1]:6443"),
    ],
)
def test_server_address_as_client_go_reads_it(server, tls, url):
    assert server_url(server, tls) == url


@pytest.mark.parametrize(
    ("server", "message"),
    [
        ("https://[::1", "host must be a URL or a host:port pair: 'https://[::1'"),
        ("https://a:99999", "host must be a URL or a host:port pair"),
        ("ftp://x", "unsupported protocol scheme 'ftp'"),
    ],
)
def test_a_bad_server_address_is_one_line_at_start(tmp_path, server, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(write_kubeconfig(tmp_path, {"token": "t"}, server=server))


def test_tls_files_that_are_not_pem_are_named(tmp_path):
    not_pem = tmp_path / "hostname"
    not_pem.write_text("my-host\n")
    user = {"client-certificate": str(not_pem), "client-key": str(not_pem)}
    client_certificate = rf"^invalid TLS configuration: client certificate: no PEM certificate in {not_pem}$"
    with pytest.raises(ConfigError, match=client_certificate):
        load_config(write_kubeconfig(tmp_path, user))
    authority = r"^invalid TLS configuration: certificate authority: .*no certificate or crl found$"
    with pytest.raises(ConfigError, match=authority):
        tls_context(str(not_pem))


def test_no_configuration_at_all_says_where_pykcm_looks(tmp_path, monkeypatch):
    for name in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.kube/config
    with pytest.raises(ConfigError) as err:
        load_config()
    assert str(err.value).startswith("invalid configuration: no configuration has been provided: give --kubeconfig")


@pytest.mark.parametrize(
    ("qps", "burst", "limits"),
    [(20.0, 30, (20.0, 30)), (0.0, 0, (5.0, 10)), (0.0, 50, (5.0, 50)), (-1.0, 0, None), (-1.0, -1, None)],
)
def test_a_rest_clients_limits_are_read_as_client_go_reads_them(
    qps: float, burst: int, limits: tuple[float, int] | None
) -> None:
    """0 takes client-go's default (5 QPS, burst 10), a negative QPS means no client-side limit."""
    client = RestClient(ClientConfig(host="https://127.0.0.1:1", ssl_context=None, qps=qps, burst=burst))
    limiter = client._limiter
    assert (limiter and (limiter.qps, limiter.burst)) == limits


# An exec credential plugin that takes a second and hands out token-1, token-2, ...; its tokens
# expire within the package's 5 minutes' margin, so every ask runs it again.
EXEC_PLUGIN = """#!{python}
import datetime, json, pathlib, time
counter = pathlib.Path({counter!r})
n = int(counter.read_text() or 0) + 1 if counter.exists() else 1
counter.write_text(str(n))
time.sleep(1)
expiry = (datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(minutes=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
print(json.dumps({{"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential",
                  "status": {{"token": f"token-{{n}}", "expirationTimestamp": expiry}}}}))
"""


def test_an_exec_plugins_token_is_refreshed_off_the_callers_thread(tmp_path, monkeypatch):
    plugin = tmp_path / "plugin"
    plugin.write_text(EXEC_PLUGIN.format(python=sys.executable, counter=str(tmp_path / "runs")))
    plugin.chmod(plugin.stat().st_mode | stat.S_IEXEC)
    user = {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": str(plugin),
                     "interactiveMode": "Never"}}
    monkeypatch.setattr(PluginToken.__init__, "__defaults__", (0.0,))  # ask again on every call
    config = load_config(write_kubeconfig(tmp_path, user))  # start-up waits for the plugin, as KCM's does
    start = time.monotonic()
    first = config.token_source()
    assert first and first.startswith("Bearer token-")
    assert config.token_source() == first  # the refresh runs on a thread: no 1 s wait here
    assert config.token_source() == first  # and one refresh at a time
    assert time.monotonic() - start < 0.5
    deadline = time.monotonic() + 20
    while config.token_source() == first and time.monotonic() < deadline:
        time.sleep(0.05)
    assert config.token_source() == f"Bearer token-{int(first.removeprefix('Bearer token-')) + 1}"


def test_a_quoted_false_is_not_a_boolean(tmp_path):
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:6443",
                                               "insecure-skip-tls-verify": "false"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}], "current-context": "x",
    }))
    with pytest.raises(ConfigError, match=r"cluster 'c': 'insecure-skip-tls-verify' must be a boolean, not a string"):
        load_config(str(path))  # Python's truthiness read "false" as true: no TLS verification


@pytest.mark.parametrize("master", [None, "http://127.0.0.1:8080"])
def test_credentials_never_go_over_plain_http(tmp_path, master):
    server = "http://127.0.0.1:8080" if master is None else "https://127.0.0.1:6443"
    user = {"token": "s3cret", "as": "jane"}
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}], "current-context": "x",
    }))
    config = load_config(str(path), master=master)
    assert config.host == "http://127.0.0.1:8080"
    assert config.token_source() is None  # impersonation client-go keeps: it is no credential
    assert config.impersonate == (("Impersonate-User", "jane"),)


def kubeconfig_with(tmp_path, cluster: dict, user: dict) -> str:
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "clusters": [{"name": "c", "cluster": cluster}], "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}], "current-context": "x",
    }))
    return str(path)


def test_master_clears_the_kubeconfigs_tls_server_name(tmp_path):
    path = kubeconfig_with(tmp_path, {"server": "https://10.0.0.1:6443", "tls-server-name": "kubernetes",
                                      "insecure-skip-tls-verify": True}, {"token": "t"})
    assert load_config(path).server_name == "kubernetes"
    assert load_config(path, master="https://127.0.0.1:6443").server_name is None


def test_a_socks5_proxy_url_is_refused_at_start_and_the_environments_is_not_used(tmp_path, monkeypatch):
    cluster = {"server": "https://10.0.0.1:6443", "insecure-skip-tls-verify": True}
    with pytest.raises(ConfigError, match="socks5 proxies are not supported"):
        load_config(kubeconfig_with(tmp_path, {**cluster, "proxy-url": "socks5://127.0.0.1:1080"}, {"token": "t"}))
    monkeypatch.setenv("HTTPS_PROXY", "socks5://127.0.0.1:1080")
    assert load_config(kubeconfig_with(tmp_path, cluster, {"token": "t"})).proxy_url is None  # direct, with a warning
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:3128")
    assert load_config(kubeconfig_with(tmp_path, cluster, {"token": "t"})).proxy_url == "http://127.0.0.1:3128"


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_a_failing_exec_plugin_stops_the_start_in_one_line(tmp_path, capsys, fmt):
    log.setup(0, fmt)  # as `run` does first: the root's handler must not say the package's error too
    user = {"exec": {"command": str(tmp_path / "missing-plugin"), "apiVersion": "client.authentication.k8s.io/v1"}}
    with pytest.raises(ConfigError, match=r"^getting credentials: ") as err:
        load_config(write_kubeconfig(tmp_path, user))
    assert "\n" not in str(err.value)
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("reader", ["simple", "package"])
async def test_disable_compression_is_carried_to_the_wire(tmp_path, reader):
    """client-go's DisableCompression: no Accept-Encoding: gzip, whichever reader read the kubeconfig."""
    heads = []

    async def handle(reader_, writer):
        while request := await read_request(reader_):
            heads.append(request)
            writer.write(ok(b"{}"))
            await writer.drain()

    user = {}
    if reader == "package":  # an exec plugin: the `kubernetes` package reads the file
        plugin = tmp_path / "plugin"
        plugin.write_text(EXEC_PLUGIN.format(python=sys.executable, counter=str(tmp_path / "runs")))
        plugin.chmod(plugin.stat().st_mode | stat.S_IEXEC)
        user = {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": str(plugin),
                         "interactiveMode": "Never"}}
    async with raw_server(handle) as url:
        for disable in (True, False):
            config = load_config(kubeconfig_with(tmp_path, {"server": url, "disable-compression": disable}, user))
            assert config.disable_compression is disable
            client = RestClient(config)
            try:
                await client.request("GET", "/api")
            finally:
                await client.close()
    assert b"accept-encoding" not in heads[0].lower()
    assert b"\r\nAccept-Encoding: gzip\r\n" in heads[1]
