"""A KUBECONFIG list is merged as client-go merges it, then read exactly as one kubeconfig file.

client-go's ClientConfigLoadingRules.Load: the first file to name a cluster, user or context wins
that entry whole; current-context comes from the first file that sets one; missing and empty files
are skipped, a file that cannot be decoded is an error naming it; relative paths are read against
the directory of the file they are written in."""

from __future__ import annotations

import logging
import os
import shutil
import stat
from pathlib import Path
from typing import Any

import pytest
import yaml

from pykcm.client.config import ConfigError, PluginToken, load_config
from pykcm.client.kubeconfig import Kubeconfig, load_kubeconfig
from pykcm.client.kubeconfigcheck import dump_yaml
from pykcm.testenv.certs import Pki, ensure_pki
from tests.unit.test_kubeconfig import write

INSECURE = {"server": "https://127.0.0.1:6443", "insecure-skip-tls-verify": True}


@pytest.fixture(autouse=True)
def environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Outside a pod, no proxy from the environment, no ~/.kube/config."""
    for name in ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT", "HTTPS_PROXY", "https_proxy", "HTTP_PROXY",
                 "http_proxy", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return ensure_pki(tmp_path_factory.mktemp("pki"))  # real PEM: load_config builds the TLS context


def kubeconfig_in(tmp_path: Path, name: str, cluster: dict[str, Any], user: dict[str, Any], **extra: Any) -> str:
    """test_kubeconfig's file (clusters c and other, user u, contexts x and y, current x) in its own directory."""
    (tmp_path / name).mkdir(exist_ok=True)
    return write(tmp_path / name, cluster, user, **extra)


def use(monkeypatch: pytest.MonkeyPatch, *paths: str | Path) -> None:
    monkeypatch.setenv("KUBECONFIG", os.pathsep.join(map(str, paths)))


def test_the_first_file_to_name_an_entry_wins_it_whole(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    first = kubeconfig_in(tmp_path, "a", INSECURE, {"token": "from-a"})
    # Same names, more fields: none of them is merged into the first file's entries.
    second = kubeconfig_in(tmp_path, "b", {"server": "https://10.0.0.2:6443", "tls-server-name": "b",
                                           "proxy-url": "http://127.0.0.1:3128"},
                           {"token": "from-b", "as": "bob"})
    use(monkeypatch, first, second)
    config = load_config()
    assert (config.host, config.token_source()) == ("https://127.0.0.1:6443", "Bearer from-a")
    assert (config.server_name, config.proxy_url, config.impersonate) == (None, None, ())


def test_names_only_a_later_file_defines_are_taken_from_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    contexts = [{"name": "x", "context": {"cluster": "later", "user": "later-user"}}]
    first = kubeconfig_in(tmp_path, "a", INSECURE, {}, contexts=contexts)
    second = kubeconfig_in(tmp_path, "b", INSECURE, {}, clusters=[{"name": "later", "cluster": INSECURE}],
                           users=[{"name": "later-user", "user": {"token": "from-b"}}])
    use(monkeypatch, first, second)
    assert load_config().token_source() == "Bearer from-b"


def test_current_context_comes_from_the_first_file_that_sets_one(monkeypatch: pytest.MonkeyPatch,
                                                                 tmp_path: Path) -> None:
    unset = kubeconfig_in(tmp_path, "a", INSECURE, {"token": "t"}, **{"current-context": ""})
    sets_y = kubeconfig_in(tmp_path, "b", INSECURE, {"token": "t"}, **{"current-context": "y"})
    sets_x = kubeconfig_in(tmp_path, "c", INSECURE, {"token": "t"}, **{"current-context": "x"})
    use(monkeypatch, unset, sets_y, sets_x)
    assert load_config().host == "https://other:1"  # context y's cluster
    assert load_config(context="x").host == "https://127.0.0.1:6443"  # --context still chooses


def test_relative_paths_are_read_against_their_own_files_directory(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                                   pki: Pki) -> None:
    for name, sources in (("a", [pki.ca_cert]), ("b", [pki.admin_cert, pki.admin_key])):
        (tmp_path / name / "pki").mkdir(parents=True)
        for source in sources:
            shutil.copy(source, tmp_path / name / "pki" / source.name)
    (tmp_path / "b" / "token").write_text("from-b-file")
    cluster = {"server": "https://127.0.0.1:6443", "certificate-authority": "pki/ca.crt"}
    first = kubeconfig_in(tmp_path, "a", cluster, {}, users=[])  # the user comes from the second file
    user = {"client-certificate": "pki/admin.crt", "client-key": "pki/admin.key", "tokenFile": "token"}
    second = kubeconfig_in(tmp_path, "b", INSECURE, user)
    use(monkeypatch, first, second)
    config = load_config()
    assert config.ca_file == str(tmp_path / "a" / "pki" / "ca.crt")
    assert (config.cert_file, config.key_file) == (str(tmp_path / "b" / "pki" / "admin.crt"),
                                                   str(tmp_path / "b" / "pki" / "admin.key"))
    assert config.token_source() == "Bearer from-b-file"


@pytest.mark.parametrize("skipped", ["missing", "empty", "repeated"])
def test_missing_empty_and_repeated_files_are_skipped(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                      skipped: str) -> None:
    good = kubeconfig_in(tmp_path, "a", INSECURE, {"token": "t"})
    (tmp_path / "empty").write_text("")
    other = {"missing": tmp_path / "missing", "empty": tmp_path / "empty", "repeated": good}[skipped]
    use(monkeypatch, other, good, other)
    config = load_config()
    assert (config.host, config.token_source()) == ("https://127.0.0.1:6443", "Bearer t")


def test_a_list_of_nothing_but_missing_or_empty_files_is_no_configuration(monkeypatch: pytest.MonkeyPatch,
                                                                          tmp_path: Path) -> None:
    (tmp_path / "empty").write_text("")
    use(monkeypatch, tmp_path / "missing", tmp_path / "empty")
    with pytest.raises(ConfigError, match=r"^invalid configuration: no configuration has been provided"):
        load_config()
    # As in client-go, --master alone is then a configuration (with no credentials).
    assert load_config(master="https://10.0.0.9:6443").host == "https://10.0.0.9:6443"


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("not: [valid", "not YAML: "),
        ("- a list\n", "not a kubeconfig: the file holds a YAML list, not a mapping"),
        ("users: [{name: u, user: {token: a}}, {name: u, user: {token: b}}]\n", "duplicate name 'u' in 'users'"),
    ],
    ids=["not-yaml", "a-list", "duplicate-name"],
)
def test_a_file_that_cannot_be_decoded_is_an_error_naming_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                             content: str, problem: str) -> None:
    good = kubeconfig_in(tmp_path, "a", INSECURE, {"token": "t"})
    broken = tmp_path / "broken"
    broken.write_text(content)
    use(monkeypatch, good, broken)  # an error even where the first file holds all that is used
    with pytest.raises(ConfigError) as err:
        load_config()
    assert str(err.value).startswith(f"error loading config file {str(broken)!r}: {problem}")
    assert "\n" not in str(err.value)


def test_tls_server_name_proxy_and_impersonation_are_read_from_a_list(monkeypatch: pytest.MonkeyPatch,
                                                                      tmp_path: Path) -> None:
    cluster = {**INSECURE, "tls-server-name": "kubernetes", "proxy-url": "http://127.0.0.1:3128"}
    first = kubeconfig_in(tmp_path, "a", cluster, {}, users=[])
    user = {"token": "t", "as": "jane", "as-uid": "42", "as-groups": ["g"], "as-user-extra": {"k": ["v"]}}
    second = kubeconfig_in(tmp_path, "b", INSECURE, user)
    use(monkeypatch, first, second)
    config = load_config()
    assert (config.server_name, config.proxy_url) == ("kubernetes", "http://127.0.0.1:3128")
    assert config.impersonate == (("Impersonate-User", "jane"), ("Impersonate-Uid", "42"),
                                  ("Impersonate-Group", "g"), ("Impersonate-Extra-k", "v"))


def test_a_token_file_wins_over_the_token_in_a_list(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    first = kubeconfig_in(tmp_path, "a", INSECURE, {"token": "inline", "tokenFile": "token"})
    (tmp_path / "a" / "token").write_text("from-file")
    use(monkeypatch, first, tmp_path / "missing")
    assert load_config().token_source() == "Bearer from-file"


@pytest.mark.parametrize(
    ("user", "message"),
    [
        ({"token": "t", "username": "a", "password": "b"},
         "more than one authentication method found for u; found [token basicAuth], only one is allowed"),
        ({"as-groups": ["g"]}, "requesting uid, groups or user-extra for u without impersonating a user"),
        ({"token": 5}, "error loading config file "),
    ],
    ids=["two-ways-to-authenticate", "groups-without-a-user", "a-field-of-the-wrong-type"],
)
def test_what_client_go_refuses_in_one_file_it_refuses_in_a_list(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                                  user: dict[str, Any], message: str) -> None:
    first = kubeconfig_in(tmp_path, "a", INSECURE, {}, users=[])
    second = kubeconfig_in(tmp_path, "b", INSECURE, user)
    use(monkeypatch, first, second)
    with pytest.raises(ConfigError) as err:
        load_config()
    assert message in str(err.value) and "\n" not in str(err.value)


def test_an_exec_plugins_relative_command_is_found_from_its_files_directory(monkeypatch: pytest.MonkeyPatch,
                                                                            tmp_path: Path) -> None:
    """client-go resolves a command with a path separator against the directory of the file naming
    it; and what the package does not read (tls-server-name here) is still carried over."""
    first = kubeconfig_in(tmp_path, "a", {**INSECURE, "tls-server-name": "kubernetes"}, {}, users=[])
    status = '{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"token":"from-exec"}}'
    plugin = tmp_path / "b" / "plugin.sh"
    plugin.parent.mkdir()
    plugin.write_text(f"#!/bin/sh\necho '{status}'\n")
    plugin.chmod(0o755)
    exec_user = {"exec": {"command": "./plugin.sh", "apiVersion": "client.authentication.k8s.io/v1"}}
    second = kubeconfig_in(tmp_path, "b", INSECURE, exec_user)
    use(monkeypatch, first, second)
    config = load_config()
    assert (config.token_source(), config.server_name) == ("Bearer from-exec", "kubernetes")


def test_an_explicit_kubeconfig_is_not_merged_with_the_list(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    explicit = kubeconfig_in(tmp_path, "a", INSECURE, {}, users=[])
    listed = kubeconfig_in(tmp_path, "b", INSECURE, {"token": "from-list"})
    use(monkeypatch, listed)
    assert load_config(explicit).token_source() is None
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(str(tmp_path / "missing"))  # a missing --kubeconfig is an error, not skipped


def refresh_as_the_package_does(merged: Kubeconfig, token: str) -> None:
    """The package refreshes the token in the document it was given, then calls the persister."""
    resolved = merged.resolved()
    persist = merged.persister(resolved, None)
    assert persist is not None
    resolved["users"][0]["user"]["auth-provider"]["config"]["id-token"] = token
    persist()


def add_a_context(path: Path) -> None:
    """As `kubectl config set-context added` does (which quotes the context named y, as dump_yaml does)."""
    doc = yaml.safe_load(path.read_text())
    doc["contexts"].append({"name": "added", "context": {"cluster": "c", "user": "u"}})
    with path.open("w") as f:
        dump_yaml(doc, f)


def test_a_refreshed_auth_provider_token_is_written_back_to_the_file_it_came_from(tmp_path: Path) -> None:
    """The package refreshes an OIDC or GCP token in the document it was given and asks for it to
    be persisted: it is written to the user's own file, whose relative paths stay relative."""
    first = kubeconfig_in(tmp_path, "a", INSECURE, {}, users=[])
    user = {"auth-provider": {"name": "oidc", "config": {"id-token": "old"}}, "tokenFile": "token"}
    second = kubeconfig_in(tmp_path, "b", INSECURE, user)
    untouched = Path(first).read_text()
    merged = load_kubeconfig([first, second])
    resolved = merged.resolved()["users"][0]["user"]
    assert resolved["tokenFile"] == str(tmp_path / "b" / "token")  # the package is given absolute paths
    refresh_as_the_package_does(merged, "new")
    written = yaml.safe_load(Path(second).read_text())["users"][0]["user"]
    assert written == {"auth-provider": {"name": "oidc", "config": {"id-token": "new"}}, "tokenFile": "token"}
    assert Path(first).read_text() == untouched


def test_a_refreshed_token_keeps_what_was_changed_in_the_file_since_start_up(tmp_path: Path) -> None:
    """client-go reads the file again under its lock and replaces only the user's auth-provider
    config: a context added meanwhile (kubectl config set-context) stays, and so does the mode."""
    path = Path(kubeconfig_in(tmp_path, "a", INSECURE, {"auth-provider": {"name": "oidc",
                                                                          "config": {"id-token": "old"}}}))
    path.chmod(0o640)
    merged = load_kubeconfig([str(path)])
    add_a_context(path)
    refresh_as_the_package_does(merged, "new")
    written = yaml.safe_load(path.read_text())
    assert [c["name"] for c in written["contexts"]] == ["x", "y", "added"]
    assert written["users"][0]["user"]["auth-provider"]["config"] == {"id-token": "new"}
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    assert sorted(p.name for p in path.parent.iterdir()) == ["kubeconfig"]  # no lock or temporary file left


def test_a_token_refreshed_by_the_package_keeps_a_context_added_after_start_up(tmp_path: Path) -> None:
    """End to end: a gcp auth provider whose command gives a new token each time, refreshed in
    PluginToken's thread as after start-up."""
    script = tmp_path / "token.sh"
    script.write_text('#!/bin/sh\nn=$(($(cat "$0.count" 2>/dev/null || echo 0) + 1)); echo $n > "$0.count"\n'
                      'echo \'{"credential":{"access_token":"tok-\'$n\'","token_expiry":"2000-01-01T00:00:00Z"}}\'\n')
    script.chmod(0o755)
    gcp = {"name": "gcp", "config": {"cmd-path": str(script), "cmd-args": ""}}
    path = Path(kubeconfig_in(tmp_path, "a", INSECURE, {"auth-provider": gcp}))
    config = load_config(str(path))
    assert isinstance(config.token_source, PluginToken)
    add_a_context(path)
    before = config.token_source()
    config.token_source._refresh()  # what the thread runs
    token = config.token_source()
    assert token != before
    written = yaml.safe_load(path.read_text())
    assert [c["name"] for c in written["contexts"]] == ["x", "y", "added"]
    assert token == "Bearer " + written["users"][0]["user"]["auth-provider"]["config"]["access-token"]


def test_a_held_lock_file_fails_the_write_in_one_log_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """kubectl holds <file>.lock while it writes: client-go's persister then fails with an error;
    pykcm logs it, writes nothing, leaves kubectl's lock alone, and the refresh goes on."""
    path = Path(kubeconfig_in(tmp_path, "a", INSECURE, {"auth-provider": {"name": "oidc",
                                                                          "config": {"id-token": "old"}}}))
    before = path.read_text()
    merged = load_kubeconfig([str(path)])
    Path(f"{path}.lock").touch()
    with caplog.at_level(logging.ERROR):
        refresh_as_the_package_does(merged, "new")  # does not raise
    assert path.read_text() == before and Path(f"{path}.lock").exists()
    assert [r.getMessage() for r in caplog.records] == [
        "Could not write the refreshed auth-provider token to the kubeconfig"]
    assert "File exists" in caplog.records[0].kv["err"]  # type: ignore[attr-defined]
