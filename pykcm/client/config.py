"""Where the API server is and how to authenticate.

Kubeconfigs (a KUBECONFIG list merged first, as client-go merges it) and the pod's service
account are read by `pykcm.client.kubeconfig`; the `kubernetes` package loads exec and
auth-provider plugins from the same merged kubeconfig. Either way we only take the resulting
endpoint, TLS material and a bearer-token source.
"""

from __future__ import annotations

import contextlib
import logging
import os
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from urllib.parse import urlsplit

from pykcm.client.fence import WriteFence
from pykcm.client.kubeconfig import (
    SERVICE_ACCOUNT_DIR,
    Credentials,
    Kubeconfig,
    KubeconfigError,
    chosen_sections,
    default_kubeconfig_path,
    impersonation_headers,
    in_cluster,
    kubeconfig_paths,
    load_kubeconfig,
    simple_credentials,
)
from pykcm.client.packagefiles import package_files
from pykcm.client.proxy import parse_proxy, proxy_for
from pykcm.client.tlsverify import verifying_context
from pykcm.util.errors import os_error_message
from pykcm.util.log import get_logger, one_line
from pykcm.util.memfile import transient_path
from pykcm.util.pem import pem_pair_problem, read_pem_pair_problem

log = get_logger("client-config")
PLUGIN_TOKEN_PERIOD = 5.0  # seconds between asking the kubernetes package for its (maybe refreshed) token


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
    # --kube-api-content-type: JSON, or protobuf where pykcm reads it (client/protobuf.py: the pods watch)
    content_type: str = "application/json"
    ca_file: str | None = None  # to build clients that trust the server but present other credentials
    verify_tls: bool = True
    cert_file: str | None = None  # client certificate and key files, re-read when they rotate
    key_file: str | None = None
    # Inline TLS material (PEM) in place of the files above: kept in memory, never rotated (it cannot change).
    ca_data: bytes | None = field(default=None, repr=False)
    cert_data: bytes | None = field(default=None, repr=False)
    key_data: bytes | None = field(default=None, repr=False)
    server_name: str | None = None  # the name the server's certificate is checked for, if not the host's
    proxy_url: str | None = None  # the proxy to connect through (load_config: proxy-url, else the environment's)
    impersonate: tuple[tuple[str, str], ...] = ()  # Impersonate-* headers sent with every request
    disable_compression: bool = False  # no Accept-Encoding: gzip (a kubeconfig cluster's disable-compression)
    # Told of every 401: a token source that can fetch a new token now (client-go's ResettableTokenSource).
    on_unauthorized: Callable[[], None] | None = field(default=None, repr=False, compare=False)
    # Checked before each mutating request (a leader's fence); shared by clients derived from this one.
    write_fence: WriteFence | None = field(default=None, repr=False, compare=False)

    def with_limits(self, qps: float, burst: int) -> ClientConfig:
        return replace(self, qps=qps, burst=burst)

    def client_tls_context(self) -> ssl.SSLContext:
        """A fresh client TLS context from the files as they are now and the inline data (for certificate rotation)."""
        return tls_context(self.ca_file, self.verify_tls, self.cert_file, self.key_file,
                           ca_data=self.ca_data, cert_data=self.cert_data, key_data=self.key_data)


# client-go's words, then where pykcm looks (client-go's hint, KUBERNETES_MASTER, is not read here).
_NO_CONFIGURATION = (
    "invalid configuration: no configuration has been provided: give --kubeconfig or --master, set KUBECONFIG "
    "or ~/.kube/config, or run in a pod with a service account token"
)


def load_config(kubeconfig: str | None = None, master: str | None = None, context: str | None = None) -> ClientConfig:
    """Resolve credentials as KCM does: --kubeconfig, else in-cluster, else the default kubeconfig.

    `--master` overrides the server address from whichever source was used.
    """
    if kubeconfig and not os.path.exists(kubeconfig):
        raise ConfigError(f"kubeconfig {kubeconfig!r} does not exist")
    in_pod = bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and os.path.exists(
        os.path.join(SERVICE_ACCOUNT_DIR, "token")
    )
    if kubeconfig:
        creds = _kubeconfig_credentials([kubeconfig], context, master)  # an explicit file: no list, no merge
    elif in_pod:
        creds = in_cluster() or _package_credentials(None, context)
        log.info("Using the in-cluster configuration (the pod's service account token)", host=creds.host)
    elif master:
        creds = Credentials(host=master)
    else:
        if not any(map(os.path.exists, kubeconfig_paths())):
            raise ConfigError(_NO_CONFIGURATION)
        # KCM reads no default kubeconfig; pykcm does (for `pykcm run` on a laptop), and says which.
        path = default_kubeconfig_path() or os.environ.get("KUBECONFIG", "")
        log.info("Using the default kubeconfig", path=path, context=context or "")
        creds = _kubeconfig_credentials(kubeconfig_paths(), context, master)
    if master:
        creds.host = master
        creds.server_name = None  # client-go: a server on the command line clears the kubeconfig's tls-server-name
    if not creds.host:
        raise ConfigError("no API server address: give --kubeconfig or --master")
    tls = bool(creds.ca_file or creds.ca_data or creds.cert_file or creds.cert_data or not creds.verify_tls)
    host = server_url(creds.host, tls)
    proxy = _proxy(host, creds.proxy_url)
    if not host.startswith("https"):
        # client-go merges the user's credentials (tokens, basic auth, client certificates) only into a
        # TLS config: over plain HTTP they would travel in the clear. Impersonation it keeps.
        return ClientConfig(host=host, ssl_context=None, verify_tls=creds.verify_tls, proxy_url=proxy,
                            impersonate=creds.impersonate, disable_compression=creds.disable_compression)
    return ClientConfig(
        host=host,
        ssl_context=tls_context(creds.ca_file, creds.verify_tls, creds.cert_file, creds.key_file,
                                ca_data=creds.ca_data, cert_data=creds.cert_data, key_data=creds.key_data),
        token_source=creds.token_source,
        ca_file=creds.ca_file,
        verify_tls=creds.verify_tls,
        cert_file=creds.cert_file,
        key_file=creds.key_file,
        ca_data=creds.ca_data,
        cert_data=creds.cert_data,
        key_data=creds.key_data,
        server_name=creds.server_name,
        proxy_url=proxy,
        impersonate=creds.impersonate,
        disable_compression=creds.disable_compression,
    )


def _proxy(host: str, proxy_url: str | None) -> str | None:
    """The proxy for `host` (the kubeconfig's proxy-url, else the environment's), checked now: one this
    client cannot speak (socks5) is an error from the kubeconfig, and from the environment a warning,
    the connection going direct as before pykcm read proxies."""
    proxy = proxy_for(host, proxy_url)
    if proxy is None:
        return None
    try:
        parse_proxy(proxy)
    except ValueError as err:
        if proxy_url:
            raise ConfigError(f"invalid configuration: {err}") from None
        log.warning("Ignoring the environment's proxy, connecting directly", err=str(err))
        return None
    return proxy


def _kubeconfig_credentials(paths: list[str], context: str | None, master: str | None) -> Credentials:
    """The kubeconfig of `paths`, merged as client-go merges a KUBECONFIG list: refused in one line
    where client-go refuses it, read here where it is simple, else by the package."""
    merged = _loaded(paths)
    if merged.empty:  # client-go: no configuration has been provided, unless --master is one
        if master:
            return Credentials(host=master)
        raise ConfigError(_NO_CONFIGURATION)
    try:
        creds = simple_credentials(merged, context, master)
    except KubeconfigError as err:
        raise ConfigError(str(err)) from None
    if creds is not None:
        return creds
    with _package_errors() as errors:
        creds = _package_credentials(merged, context)
    if sections := chosen_sections(merged, context):  # what the package does not carry over
        cluster, user = sections
        creds.server_name = cluster.get("tls-server-name") or None
        creds.proxy_url = cluster.get("proxy-url") or None
        creds.disable_compression = bool(cluster.get("disable-compression"))
        try:
            creds.impersonate = impersonation_headers(user)
        except KubeconfigError as err:
            raise ConfigError(str(err)) from None
        plugin = user.get("exec") or user.get("auth-provider")
        if plugin and creds.token_source() is None and not (creds.cert_file or creds.cert_data):
            # The package logs a failed plugin and goes on without a token: every request would be
            # system:anonymous's, and the cause one stray line. KCM stops with the plugin's error.
            raise ConfigError(f"getting credentials: {errors[-1] if errors else 'the plugin gave no token'}")
    return creds


def server_url(host: str, tls: bool) -> str:
    """client-go's DefaultServerURL: `host` as a URL, a bare host:port getting the scheme its TLS
    settings imply; anything else is the one-line error client-go gives, at start-up."""
    try:
        parts = urlsplit(host if "://" in host else ("https://" if tls else "http://") + host)
        parts.port  # noqa: B018  # raises ValueError for a port that is no number or out of range
    except ValueError:
        raise ConfigError(f"host must be a URL or a host:port pair: {host!r}") from None
    if not parts.hostname:
        raise ConfigError(f"host must be a URL or a host:port pair: {host!r}")
    if parts.scheme not in ("http", "https"):
        raise ConfigError(f"unsupported protocol scheme {parts.scheme!r} in the API server address {host!r}")
    return parts.geturl().rstrip("/")


def _loaded(paths: list[str]) -> Kubeconfig:
    try:
        return load_kubeconfig(paths)
    except KubeconfigError as err:
        raise ConfigError(str(err)) from None


def _package_credentials(kubeconfig: Kubeconfig | str | None, context: str | None) -> Credentials:
    """What the `kubernetes` package loads: auth plugins, and its messages. `kubeconfig` is merged
    already (a path: that one file); None is the pod's service account."""
    from kubernetes import client as k8s_client  # imported only here: see pykcm.client.kubeconfig
    from kubernetes import config as k8s_config
    from kubernetes.config import kube_config
    from kubernetes.config.kube_config import KubeConfigLoader

    merged = _loaded([kubeconfig]) if isinstance(kubeconfig, str) else kubeconfig
    cfg = k8s_client.Configuration()
    files = package_files(kube_config)  # inline material (an exec plugin's clientKeyData) in memory, not /tmp
    try:
        if merged is None:
            k8s_config.load_incluster_config(client_configuration=cfg)
        else:
            # Not load_kube_config: it would merge KUBECONFIG its own way (the last current-context
            # wins, an empty file is an error). A refreshed auth-provider token is written back to
            # the file its user came from, as client-go persists it (after start-up from
            # PluginToken's thread, where the package refreshes); an exec plugin runs in our
            # working directory, as client-go runs it.
            resolved = merged.resolved()
            loader = KubeConfigLoader(resolved, active_context=context,
                                      config_persister=merged.persister(resolved, context))
            loader.load_and_set(cfg)
    except Exception as exc:  # the package raises several unrelated types; the user needs one line
        raise ConfigError(f"invalid configuration: {one_line(exc)}") from None
    finally:
        # The bytes are taken below and the package reads none of these paths again: close them now.
        paths = (cfg.ssl_ca_cert, cfg.cert_file, cfg.key_file)
        data = [files.content(path) if files else None for path in paths]
        if files:
            files.release(*paths)
    return Credentials(
        host=cfg.host or "",
        ca_file=None if data[0] else cfg.ssl_ca_cert,
        ca_data=data[0],
        verify_tls=bool(cfg.verify_ssl),
        cert_file=None if data[1] else cfg.cert_file,
        cert_data=data[1],
        key_file=None if data[2] else cfg.key_file,
        key_data=data[2],
        # The package keeps the token (with its "Bearer " prefix) under "BearerToken", older
        # releases under "authorization"; asking this way also runs exec/OIDC refreshes.
        token_source=PluginToken(lambda: cfg.get_api_key_with_prefix("BearerToken", alias="authorization")),
    )


@contextlib.contextmanager
def _package_errors() -> Iterator[list[str]]:
    """The error lines the package logs meanwhile (it logs a failed exec plugin on the root logger
    itself), taken by a filter of the root logger: said once, in the caller's error, not also by the
    root's handler (which writes other loggers' lines in pykcm's format)."""
    errors: list[str] = []

    class Collect(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            if record.levelno < logging.ERROR:
                return True
            errors.append(one_line(record.getMessage()))
            return False

    collect = Collect()
    logging.getLogger().addFilter(collect)
    try:
        yield errors
    finally:
        logging.getLogger().removeFilter(collect)


class PluginToken:
    """The `kubernetes` package's bearer token, asked for off the event loop.

    Asking runs the package's refresh hook, which, once the token is within 5 minutes of its expiry,
    runs the exec plugin (`aws eks get-token`, a subprocess) or the OIDC refresh (an HTTP call) in
    the asking thread: on the event loop that would stall every informer and worker for as long.
    So callers get the last token at once, and every `period` a thread asks again; the package's
    5 minutes' margin leaves the old token valid while the new one comes. The lock serialises the
    askers (the package's objects are not thread-safe; the Lease thread asks too)."""

    def __init__(self, ask: Callable[[], str | None], period: float = PLUGIN_TOKEN_PERIOD) -> None:
        self._ask = ask
        self.period = period
        self._lock = threading.Lock()
        self._token = ask()  # at start-up, where waiting for the plugin is what KCM does too
        self._asked_at = time.monotonic()
        self._asking = False

    def __call__(self) -> str | None:
        if not self._asking and time.monotonic() - self._asked_at >= self.period:
            self._asking = True
            threading.Thread(target=self._refresh, name="kubeconfig token", daemon=True).start()
        return self._token

    def _refresh(self) -> None:
        try:
            with self._lock:
                self._token = self._ask() or self._token
        except Exception as exc:  # the package's plugins raise anything; the last token may still do
            log.error(exc, "Refreshing the kubeconfig's token failed")
        finally:
            self._asked_at = time.monotonic()
            self._asking = False


def bearer_token_config(base: ClientConfig, token_source: Callable[[], str | None],
                        on_unauthorized: Callable[[], None] | None = None) -> ClientConfig:
    """Same server and trust as `base`, but authenticating only with the given bearer token.

    No client certificate is presented: the apiserver would authenticate a request by its
    certificate before looking at the token; and no impersonation, as client-go's
    AnonymousClientConfig, which KCM's service account clients start from.
    """
    https = base.host.startswith("https")
    return replace(
        base,
        ssl_context=tls_context(base.ca_file, base.verify_tls, ca_data=base.ca_data) if https else None,
        token_source=token_source,
        cert_file=None,
        key_file=None,
        cert_data=None,
        key_data=None,
        impersonate=(),
        on_unauthorized=on_unauthorized,
    )


def tls_context(
    ca_file: str | None, verify: bool = True, cert_file: str | None = None, key_file: str | None = None, *,
    ca_data: bytes | None = None, cert_data: bytes | None = None, key_data: bytes | None = None,
) -> ssl.SSLContext:
    """A client TLS context; each `*_data` (inline PEM) stands in for its file and never touches a disk."""
    try:
        if ca_data:  # PEM is ASCII; the ssl module reads a CA bundle from memory
            ctx = verifying_context(cadata=ca_data.decode("ascii", "ignore"))
        else:
            ctx = verifying_context(cafile=ca_file or None)
    except OSError as exc:  # ssl.SSLError is one
        reason = os_error_message(exc).replace("cadata", "certificate-authority-data")  # ssl's word for it
        raise ConfigError(f"invalid TLS configuration: certificate authority: {reason}") from None
    if not verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if cert_file or cert_data:
        try:
            # A certificate and key load only from paths: inline ones through a memory file open
            # for the load alone (the bytes are kept for the next context), see util/memfile.py.
            with contextlib.ExitStack() as paths:
                cert = paths.enter_context(transient_path(cert_data, "pykcm-client-cert")) if cert_data else cert_file
                key = paths.enter_context(transient_path(key_data, "pykcm-client-key")) if key_data else key_file
                ctx.load_cert_chain(cert or "", key)
        except OSError as exc:
            problem = _pair_problem(cert_file, key_file, cert_data, key_data) or os_error_message(exc)
            raise ConfigError(f"invalid TLS configuration: client certificate: {problem}") from None
    return ctx


def _pair_problem(cert_file: str | None, key_file: str | None, cert_data: bytes | None,
                  key_data: bytes | None) -> str | None:
    """Which half of the pair is not PEM, naming its file (or the kubeconfig field of inline data)."""
    if cert_data is None and key_data is None:
        return read_pem_pair_problem(cert_file or "", key_file or cert_file or "")
    try:
        cert = cert_data if cert_data is not None else _read(cert_file or "")
        key = key_data if key_data is not None else (_read(key_file) if key_file else cert)
    except OSError:
        return None
    cert_name = cert_file or "client-certificate-data"
    key_name = key_file or ("client-key-data" if key_data is not None else cert_name)
    return pem_pair_problem(cert, key, cert_name, key_name)


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()
