"""Inline TLS material (a kubeconfig's *-data, an exec plugin's clientKeyData) never reaches a file
system: client-go keeps it in memory, and a file of it would outlive a killed pykcm."""

from __future__ import annotations

import base64
import os
import ssl
import stat
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from pykcm.client import packagefiles
from pykcm.client.config import ConfigError, bearer_token_config, load_config, tls_context
from pykcm.client.rest import RestClient
from pykcm.testenv.certs import Pki
from pykcm.util import memfile


@pytest.fixture
def temp_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """tempfile.gettempdir() for the test: an empty directory whose every file is checked after."""
    directory = tmp_path / "tmp"
    directory.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(directory))
    yield directory


def b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def kubeconfig(tmp_path: Path, server: str, pki: Pki, user: dict[str, Any]) -> str:
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "clusters": [{"name": "c", "cluster": {"server": server, "certificate-authority-data": b64(pki.ca_cert)}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}], "current-context": "x",
    }))
    return str(path)


def files_holding(directory: Path, secret: bytes) -> list[Path]:
    return [path for path in directory.rglob("*") if path.is_file() and secret in path.read_bytes()]


def open_memory_files() -> list[str]:
    targets = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            targets.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            continue
    return [target for target in targets if target.startswith("memfd:pykcm")]


async def whoami(config_path: str) -> str:
    client = RestClient(load_config(config_path))
    try:
        return str((await client.request("GET", "/whoami"))["cn"])
    finally:
        await client.close()


@pytest.mark.parametrize("memory_files", [True, False], ids=["memfd", "no-memfd"])
async def test_inline_client_key_data_is_used_and_never_written(
    mtls_server: str, pki: Pki, tmp_path: Path, temp_dir: Path, monkeypatch: pytest.MonkeyPatch, memory_files: bool
) -> None:
    if not memory_files:  # as on a system without memfd_create: a private file, removed once loaded
        monkeypatch.setattr(memfile, "memory_file", lambda content, name: None)
    user = {"client-certificate-data": b64(pki.admin_cert), "client-key-data": b64(pki.admin_key)}
    assert await whoami(kubeconfig(tmp_path, mtls_server, pki, user)) == "pykcm-admin"
    assert files_holding(temp_dir, pki.admin_key.read_bytes()) == []
    assert list(temp_dir.iterdir()) == []
    assert open_memory_files() == []  # a memory file lives only while ssl loads it


async def test_a_context_built_again_later_still_has_the_inline_pair(
    mtls_server: str, pki: Pki, tmp_path: Path, temp_dir: Path
) -> None:
    """Certificate rotation (a CA file that changed) and derived clients build contexts after start-up:
    the bytes are kept, not a path that was closed."""
    user = {"client-certificate-data": b64(pki.admin_cert), "client-key-data": b64(pki.admin_key)}
    config = load_config(kubeconfig(tmp_path, mtls_server, pki, user))
    client = RestClient(replace(config, ssl_context=config.client_tls_context()))
    try:
        assert (await client.request("GET", "/whoami"))["cn"] == "pykcm-admin"
    finally:
        await client.close()
    anonymous = bearer_token_config(config, lambda: None).ssl_context
    assert anonymous is not None and [ca["subject"] for ca in anonymous.get_ca_certs()] == [
        ca["subject"] for ca in ssl.create_default_context(cafile=str(pki.ca_cert)).get_ca_certs()]
    assert "PRIVATE KEY" not in repr(config) and b64(pki.admin_key) not in repr(config)
    assert list(temp_dir.iterdir()) == []


# An exec credential plugin answering with a client certificate and key (PEM, not base64).
EXEC_PLUGIN = """#!{python}
import json, pathlib
status = {{"clientCertificateData": pathlib.Path({cert!r}).read_text(),
          "clientKeyData": pathlib.Path({key!r}).read_text()}}
print(json.dumps({{"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential", "status": status}}))
"""


@pytest.mark.parametrize("memory_files", [True, False], ids=["memfd", "no-memfd"])
async def test_an_exec_plugins_client_key_is_used_and_never_left_on_disk(
    mtls_server: str, pki: Pki, tmp_path: Path, temp_dir: Path, monkeypatch: pytest.MonkeyPatch, memory_files: bool
) -> None:
    if not memory_files:
        monkeypatch.setattr(packagefiles, "memory_file", lambda content, name: None)
        monkeypatch.setattr(packagefiles, "_installed", None)  # a fresh one, whose directory is under temp_dir
    plugin = tmp_path / "plugin"
    plugin.write_text(EXEC_PLUGIN.format(python=sys.executable, cert=str(pki.admin_cert), key=str(pki.admin_key)))
    plugin.chmod(plugin.stat().st_mode | stat.S_IEXEC)
    user = {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": str(plugin),
                     "interactiveMode": "Never"}}
    assert await whoami(kubeconfig(tmp_path, mtls_server, pki, user)) == "pykcm-admin"
    assert files_holding(temp_dir, pki.admin_key.read_bytes()) == []
    assert [path for path in temp_dir.rglob("*") if path.is_file()] == []  # the CA's file neither
    assert open_memory_files() == []


def test_inline_data_that_is_not_pem_is_named(tmp_path: Path, pki: Pki) -> None:
    user = {"client-certificate-data": b64(pki.admin_cert), "client-key-data": base64.b64encode(b"junk").decode()}
    with pytest.raises(ConfigError, match=r"^invalid TLS configuration: client certificate: no PEM private key in "
                                          r"client-key-data$"):
        load_config(kubeconfig(tmp_path, "https://127.0.0.1:1", pki, user))


def test_a_memory_file_reads_its_content_and_is_not_inherited() -> None:
    memory = memfile.memory_file(b"secret", "pykcm-test")
    if memory is None:
        pytest.skip("no memfd_create here")
    fd, path = memory
    try:
        assert Path(path).read_bytes() == b"secret"
        assert Path(path).read_bytes() == b"secret"  # each open reads from the start
        assert not os.get_inheritable(fd)  # close-on-exec: an exec plugin does not get it
        assert path == f"/proc/self/fd/{fd}"
    finally:
        os.close(fd)
    assert not os.path.exists(path)


def test_a_shared_package_file_stays_readable_until_its_last_holder_releases_it() -> None:
    files = packagefiles.PackageFiles()
    first = files("-----BEGIN CERTIFICATE-----\n")
    second = files("-----BEGIN CERTIFICATE-----\n")  # the same content: the same file, held twice
    assert first == second
    files.release(second)
    assert Path(first).read_bytes() == b"-----BEGIN CERTIFICATE-----\n"  # the other holder still reads it
    files.release(first)
    assert files.content(first) is None and not os.path.exists(first)


def test_an_inline_ca_that_is_not_pem_is_named_by_its_kubeconfig_field() -> None:
    with pytest.raises(ConfigError, match="certificate authority: no start line: certificate-authority-data does not"):
        tls_context(None, ca_data=b"junk")
