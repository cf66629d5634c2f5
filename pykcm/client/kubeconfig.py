"""Credentials read without the `kubernetes` package, where reading them is simple.

Importing the package costs about 0.25 s of CPU at every start (it brings requests, oauthlib,
pydantic and its generated client), while most controller managers run with a kubeconfig that
holds nothing but a server, TLS files or data and a token, or in a pod with its service
account. Those are read here. Everything else (exec and auth-provider plugins, basic auth,
proxies, impersonation, a KUBECONFIG list to merge, and any file this reader does not fully
understand) returns None, and the caller asks the package, whose messages then explain what is
wrong; for a file that is no kubeconfig at all `kubeconfig_problem` says why instead.
"""

from __future__ import annotations

import atexit
import base64
import binascii
import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import yaml

from pykcm.util.hostport import join_host_port
from pykcm.util.log import one_line

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
TOKEN_REREAD_PERIOD = 60.0  # client-go re-reads a token file once a minute (cachingTokenSource)

# The keys this reader understands; any other key means the package reads the file.
_CLUSTER_KEYS = {"server", "certificate-authority", "certificate-authority-data", "insecure-skip-tls-verify"}
_USER_KEYS = {"client-certificate", "client-certificate-data", "client-key", "client-key-data", "token", "tokenFile"}
_CONTEXT_KEYS = {"cluster", "user", "namespace"}
_IGNORED_KEYS = {"extensions"}  # read by no client


@dataclass
class Credentials:
    """Where the API server is and how to prove who we are, as files and a token source."""

    host: str
    ca_file: str | None = None
    verify_tls: bool = True
    cert_file: str | None = None
    key_file: str | None = None
    token_source: Callable[[], str | None] = field(default=lambda: None, repr=False)


class FileToken:
    """A bearer token from a file, re-read once a minute so that a rotated token is picked up."""

    def __init__(self, path: str, period: float = TOKEN_REREAD_PERIOD) -> None:
        self.path = path
        self.period = period
        self._token = self._read()
        self._read_at = time.monotonic()

    def _read(self) -> str:
        with open(self.path) as f:
            return f.read().strip()

    def __call__(self) -> str | None:
        if time.monotonic() - self._read_at >= self.period:
            self._read_at = time.monotonic()
            with contextlib.suppress(OSError):  # keep the last token; the apiserver says if it is bad
                self._token = self._read() or self._token
        return f"Bearer {self._token}" if self._token else None


def in_cluster() -> Credentials | None:
    """The pod's service account (client-go's InClusterConfig), or None outside a pod."""
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
    token_path = os.path.join(SERVICE_ACCOUNT_DIR, "token")
    ca_path = os.path.join(SERVICE_ACCOUNT_DIR, "ca.crt")
    if not host or not port or not os.path.isfile(token_path) or not os.path.isfile(ca_path):
        return None
    token = FileToken(token_path)
    if token() is None:
        return None
    return Credentials(host=f"https://{join_host_port(host, port)}", ca_file=ca_path, token_source=token)


def _load_yaml(path: str) -> Any:
    with open(path, "rb") as f:
        return yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def simple_kubeconfig(path: str, context: str | None = None) -> Credentials | None:
    """The credentials of a kubeconfig this reader fully understands, else None."""
    try:
        return _credentials(_load_yaml(path), os.path.dirname(os.path.abspath(path)), context)
    except (OSError, yaml.YAMLError, binascii.Error, ValueError, TypeError, AttributeError, KeyError):
        return None


def kubeconfig_problem(path: str) -> str | None:
    """Why the file at `path` cannot be a kubeconfig at all, in one line, or None.

    These are the files client-go refuses with "error loading config file" (unreadable, not
    YAML, not a mapping, sections of the wrong type); the package fails on them with Python's
    own messages ("'str' object does not support item assignment"), which tell the user nothing.
    """
    try:
        doc = _load_yaml(path)
    except OSError as exc:
        return exc.strerror or str(exc)
    except yaml.YAMLError as exc:
        return "not YAML: " + one_line(exc)
    if doc is None:
        return None  # empty: the package says so
    if not isinstance(doc, dict):
        kind = {"list": "list", "str": "string", "bool": "boolean"}.get(type(doc).__name__, "number")
        return f"not a kubeconfig: the file holds a YAML {kind}, not a mapping"
    for kind in ("cluster", "context", "user"):
        entries = doc.get(f"{kind}s")
        if entries is None:
            continue
        if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
            return f"'{kind}s' must be a list of mappings"
        if any(not isinstance(e.get(kind, {}), dict) for e in entries):
            return f"each '{kind}s' entry's '{kind}' must be a mapping"
    if not isinstance(doc.get("current-context", ""), str):
        return "'current-context' must be a string"
    return None


def kubeconfig_paths() -> list[str]:
    """The files of $KUBECONFIG (a list to merge), else ~/.kube/config."""
    value = os.environ.get("KUBECONFIG") or "~/.kube/config"
    return [os.path.expanduser(path) for path in value.split(os.pathsep) if path]


def default_kubeconfig_path() -> str | None:
    """$KUBECONFIG when it names one file, else ~/.kube/config; None for a list to merge."""
    paths = kubeconfig_paths()
    return paths[0] if len(paths) == 1 else None


def _named(doc: dict[str, Any], kind: str, name: Any) -> dict[str, Any] | None:
    entries = [e for e in doc.get(f"{kind}s") or () if isinstance(e, dict) and e.get("name") == name]
    if len(entries) != 1 or not isinstance(entries[0].get(kind), dict):
        return None
    return entries[0][kind]


def _credentials(doc: Any, base: str, context_name: str | None) -> Credentials | None:
    if not isinstance(doc, dict):
        return None
    context = _named(doc, "context", context_name or doc.get("current-context"))
    if context is None or not set(context) <= _CONTEXT_KEYS | _IGNORED_KEYS:
        return None
    cluster = _named(doc, "cluster", context.get("cluster"))
    user = _named(doc, "user", context.get("user")) if "user" in context else {}
    if (
        cluster is None
        or user is None
        or not set(cluster) <= _CLUSTER_KEYS | _IGNORED_KEYS
        or not set(user) <= _USER_KEYS | _IGNORED_KEYS
    ):
        return None
    server = cluster.get("server")
    if not isinstance(server, str) or not server:
        return None
    creds = Credentials(host=server.rstrip("/"), verify_tls=not cluster.get("insecure-skip-tls-verify", False))
    if creds.host.startswith("https"):
        creds.ca_file = _file_or_data(cluster, "certificate-authority", base)
        creds.cert_file = _file_or_data(user, "client-certificate", base)
        creds.key_file = _file_or_data(user, "client-key", base)
        if (creds.cert_file is None) != (creds.key_file is None):
            return None
    token = user.get("token")
    if token:
        bearer = f"Bearer {token}"
        creds.token_source = lambda: bearer
    elif user.get("tokenFile"):
        creds.token_source = FileToken(os.path.normpath(os.path.join(base, user["tokenFile"])))
    return creds


def _file_or_data(section: dict[str, Any], key: str, base: str) -> str | None:
    """A path for `key` or `key-data` (data wins, as in client-go); missing files raise OSError."""
    data = section.get(f"{key}-data")
    if data:
        return _data_file(base64.b64decode(data, validate=True))
    if data is not None and not section.get(key):
        raise ValueError(f"{key}-data is empty")
    if not section.get(key):
        return None
    path = os.path.normpath(os.path.join(base, section[key]))
    if not os.path.isfile(path):
        raise FileNotFoundError(path)
    return path


_data_dir: str | None = None
DATA_DIR_PREFIX = "pykcm-kubeconfig-"


def _data_file(content: bytes) -> str:
    """A private file holding `content` (TLS material given inline), removed when the process ends.

    The directory is named after the process: one that was killed (no atexit) leaves its own
    behind, and the next process to need one removes it."""
    global _data_dir
    if _data_dir is None:
        remove_abandoned_data_dirs()
        _data_dir = tempfile.mkdtemp(prefix=f"{DATA_DIR_PREFIX}{os.getpid()}-")
        atexit.register(shutil.rmtree, _data_dir, True)
    fd, path = tempfile.mkstemp(dir=_data_dir)
    with os.fdopen(fd, "wb") as f:
        f.write(content)
    return path


def remove_abandoned_data_dirs(tmp: str | None = None) -> None:
    """Remove this user's data directories whose process is gone (killed before its atexit ran)."""
    tmp = tmp or tempfile.gettempdir()
    with contextlib.suppress(OSError):
        for entry in os.scandir(tmp):
            pid = entry.name.removeprefix(DATA_DIR_PREFIX).split("-", 1)[0]
            if entry.name.startswith(DATA_DIR_PREFIX) and pid.isdigit() and not _alive(int(pid)):
                with contextlib.suppress(OSError):
                    if entry.is_dir(follow_symlinks=False) and entry.stat().st_uid == os.getuid():
                        shutil.rmtree(entry.path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True
