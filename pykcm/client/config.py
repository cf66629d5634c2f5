"""Where the API server is and how to authenticate, loaded by the `kubernetes` package.

The package handles kubeconfig parsing, in-cluster service-account tokens and exec/OIDC
auth plugins; we only take the resulting endpoint, TLS material and a bearer-token source.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from kubernetes import client as k8s_client
from kubernetes import config as k8s_config


class ConfigError(Exception):
    """The credentials could not be loaded; the message is one line for the user."""


@dataclass
class ClientConfig:
    host: str
    ssl_context: ssl.SSLContext | None
    token_source: Callable[[], str | None] = field(default=lambda: None, repr=False)
    qps: float = 20.0
    burst: int = 30
    user_agent: str = ""

    def with_limits(self, qps: float, burst: int) -> ClientConfig:
        return replace(self, qps=qps, burst=burst)


def load_config(kubeconfig: str | None = None, master: str | None = None, context: str | None = None) -> ClientConfig:
    """Resolve credentials as KCM does: --kubeconfig, else in-cluster, else the default kubeconfig.

    `--master` overrides the server address from whichever source was used.
    """
    cfg = k8s_client.Configuration()
    try:
        if kubeconfig:
            if not os.path.exists(kubeconfig):
                raise ConfigError(f"kubeconfig {kubeconfig!r} does not exist")
            k8s_config.load_kube_config(config_file=kubeconfig, context=context, client_configuration=cfg)
        elif os.environ.get("KUBERNETES_SERVICE_HOST") and os.path.exists(
            "/var/run/secrets/kubernetes.io/serviceaccount/token"
        ):
            k8s_config.load_incluster_config(client_configuration=cfg)
        elif master:
            cfg.host = master
        else:
            k8s_config.load_kube_config(context=context, client_configuration=cfg)
    except ConfigError:
        raise
    except Exception as exc:  # the package raises several unrelated types; the user needs one line
        detail = " ".join(str(exc).split()) or type(exc).__name__
        raise ConfigError(f"invalid configuration: {detail}") from None
    if master:
        cfg.host = master
    if not cfg.host:
        raise ConfigError("no API server address: give --kubeconfig or --master")
    return ClientConfig(
        host=cfg.host.rstrip("/"),
        ssl_context=_ssl_context(cfg) if cfg.host.startswith("https") else None,
        token_source=lambda: cfg.get_api_key_with_prefix("authorization"),
    )


def _ssl_context(cfg: k8s_client.Configuration) -> ssl.SSLContext:
    try:
        ctx = ssl.create_default_context(cafile=cfg.ssl_ca_cert) if cfg.ssl_ca_cert else ssl.create_default_context()
        if not cfg.verify_ssl:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if cfg.cert_file:
            ctx.load_cert_chain(cfg.cert_file, cfg.key_file)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"invalid TLS configuration: {exc}") from None
    return ctx
