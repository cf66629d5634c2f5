"""Credentials from kubeconfig files, as the `kubernetes` package loads them."""

import pytest
import yaml

from pykcm.client.config import ConfigError, bearer_token_config, load_config


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
