"""Credentials read without the `kubernetes` package, where reading them is simple.

Importing the package costs about 0.25 s of CPU at every start (it brings requests, oauthlib,
pydantic and its generated client), while most controller managers run with a kubeconfig that
holds a server, TLS files or data, a token or token file (maybe with impersonation, a proxy or a
TLS server name), or in a pod with its service account. Those are read here. A KUBECONFIG list
is merged here as client-go merges it (`load_kubeconfig`) and then read as one file. Exec and
auth-provider plugins are left to the package (`simple_credentials` returns None); what client-go
would refuse is refused first, in one line (kubeconfigcheck.py).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from pykcm.client.kubeconfigcheck import conflict, dump_yaml, read_kubeconfig
from pykcm.util.hostport import join_host_port
from pykcm.util.log import get_logger, one_line

log = get_logger("kubeconfig")

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
TOKEN_REREAD_PERIOD = 60.0  # client-go re-reads a token file once a minute (cachingTokenSource)

# The keys this reader understands; any other key means the package reads the file.
_CLUSTER_KEYS = {"server", "certificate-authority", "certificate-authority-data", "insecure-skip-tls-verify",
                 "tls-server-name", "proxy-url", "disable-compression"}
_USER_KEYS = {"client-certificate", "client-certificate-data", "client-key", "client-key-data", "token", "tokenFile",
              "username", "password", "as", "as-uid", "as-groups", "as-user-extra"}
_CONTEXT_KEYS = {"cluster", "user", "namespace"}
_IGNORED_KEYS = {"extensions"}  # read by no client
# The fields holding paths, which client-go reads against the directory of the file naming them
# (ResolveLocalPaths); an exec command too, if it holds a path separator (else it is looked up in PATH).
_PATH_KEYS = {"cluster": ("certificate-authority",), "user": ("client-certificate", "client-key", "tokenFile")}


class KubeconfigError(Exception):
    """A kubeconfig client-go would refuse; the message is one line for the user."""


@dataclass
class Credentials:
    """Where the API server is and how to prove who we are: TLS files or inline bytes, a token source."""

    host: str
    ca_file: str | None = None
    verify_tls: bool = True
    cert_file: str | None = None
    key_file: str | None = None
    token_source: Callable[[], str | None] = field(default=lambda: None, repr=False)
    # Inline TLS material (PEM), in place of the file of the same name: kept in memory only.
    ca_data: bytes | None = field(default=None, repr=False)
    cert_data: bytes | None = field(default=None, repr=False)
    key_data: bytes | None = field(default=None, repr=False)
    server_name: str | None = None  # tls-server-name: the name the server's certificate is checked for
    proxy_url: str | None = None
    impersonate: tuple[tuple[str, str], ...] = ()  # Impersonate-* headers, in order, names repeated
    disable_compression: bool = False  # the cluster's disable-compression: ask for no gzip


class FileToken:
    """A bearer token from a file, re-read once a minute so that a rotated token is picked up."""

    def __init__(self, path: str, period: float = TOKEN_REREAD_PERIOD, fallback: str = "") -> None:
        self.path = path
        self.period = period
        try:
            self._token = self._read() or fallback  # client-go: an empty file is an error, the inline token stands in
        except OSError:
            if not fallback:  # client-go falls back to the kubeconfig's own token only if there is one
                raise
            self._token = fallback
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


@dataclass
class Kubeconfig:
    """A kubeconfig as client-go's ClientConfigLoadingRules.Load makes it of one file or many.

    Each cluster, user and context is the first file's to name it, whole: nothing of a later
    file's entry of that name is merged in. current-context is the first file's to set one.
    Preferences and extensions, which no client reads, are not merged."""

    doc: dict[str, Any] = field(default_factory=lambda: {"clusters": [], "users": [], "contexts": []})
    # The directory of the file each entry came from, by (kind, name): its relative paths are read there.
    bases: dict[tuple[str, Any], str] = field(default_factory=dict)
    # The file each user came from (client-go's LocationOfOrigin): a refreshed auth-provider token goes there.
    origins: dict[Any, str] = field(default_factory=dict)

    def add(self, path: str, doc: dict[str, Any]) -> None:
        base = os.path.dirname(os.path.abspath(path))
        for kind in ("cluster", "user", "context"):
            for entry in doc.get(f"{kind}s") or ():
                if (kind, entry.get("name")) not in self.bases:
                    self.bases[kind, entry.get("name")] = base
                    self.doc[f"{kind}s"].append(entry)
                    if kind == "user":
                        self.origins[entry.get("name")] = path
        if doc.get("current-context") and not self.doc.get("current-context"):
            self.doc["current-context"] = doc["current-context"]

    @property
    def empty(self) -> bool:
        """client-go's IsConfigEmpty: no configuration at all (which --master alone may stand in for)."""
        return not (self.bases or self.doc.get("current-context"))

    def resolved(self) -> dict[str, Any]:
        """The document with relative paths made absolute, each against its own file's directory,
        for the package (which would read all of them against one). Sections are copied, so the
        absolute paths never reach a file (see `persister`)."""
        doc = dict(self.doc)
        for kind, keys in _PATH_KEYS.items():
            doc[f"{kind}s"] = [
                {**entry, kind: _resolved(entry[kind], keys, self.bases[kind, entry.get("name")])}
                if isinstance(entry.get(kind), dict) else entry
                for entry in self.doc[f"{kind}s"]
            ]
        return doc

    def persister(self, resolved: dict[str, Any], context: str | None) -> Callable[[], None] | None:
        """What the package calls once it has refreshed an auth provider's token in `resolved` (the
        document it was given): client-go's PersisterForUser, for the user of the context in use."""
        chosen = _named(self.doc, "context", context or self.doc.get("current-context"))
        user = chosen.get("user") if chosen else None
        section = _named(resolved, "user", user)
        if user not in self.origins or section is None:
            return None
        path = self.origins[user]
        return lambda: write_back(path, user, (section.get("auth-provider") or {}).get("config") or {})


# This process's loads of one file (--kubeconfig and --authentication-kubeconfig naming the same
# file) take turns, rather than fail on each other's lock file.
_writing = threading.Lock()


def write_back(path: str, user: Any, config: dict[str, Any]) -> None:
    """Persist an auth provider's refreshed `config` as client-go's persister does: under the lock
    file kubectl takes too, the file is read again and only `user`'s auth-provider config replaced,
    so that what was changed in it since start-up is kept. Runs in the package's refresh thread:
    it never raises (client-go's Persist returns the error), a failure is one line in the log and
    the refreshed token is still used."""
    try:
        with _writing, _lock_file(path):
            try:
                doc, problem = read_kubeconfig(path)
            except FileNotFoundError:
                return  # as in client-go: the user is gone from the files, nothing to write
            if problem:
                raise KubeconfigError(f"error loading config file {path!r}: {problem}")
            entry = _named(doc or {}, "user", user)
            provider = entry.get("auth-provider") if entry else None
            if not isinstance(provider, dict):
                return  # the user or its auth provider was removed meanwhile: client-go writes nothing either
            provider["config"] = dict(config)
            _replace_file(path, doc)
    except Exception as exc:  # the package's refresh would fail on any exception, losing the new token
        log.error(exc, "Could not write the refreshed auth-provider token to the kubeconfig", path=path)


@contextlib.contextmanager
def _lock_file(path: str) -> Iterator[None]:
    """client-go's lockFile: `<path>.lock`, created exclusively; one that exists (kubectl is writing,
    or one crashed) fails the write, as in client-go."""
    os.close(os.open(path + ".lock", os.O_CREAT | os.O_EXCL | os.O_RDONLY, 0))
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.remove(path + ".lock")


def _replace_file(path: str, doc: Any) -> None:
    """Write `doc` to a new file renamed over `path`'s target (a symlink stays one): a crash never
    leaves half a kubeconfig. Mode and owner are kept, as rewriting the file in place keeps them."""
    target = os.path.realpath(path)
    st = os.stat(target)
    fd, temp = tempfile.mkstemp(dir=os.path.dirname(target), prefix=f".{os.path.basename(target)}.")
    try:
        with os.fdopen(fd, "w") as f:
            dump_yaml(doc, f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(temp, st.st_mode & 0o7777)
        if (st.st_uid, st.st_gid) != (os.getuid(), os.getgid()):
            with contextlib.suppress(OSError):  # root writing a user's file: give it back
                os.chown(temp, st.st_uid, st.st_gid)
        os.replace(temp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(temp)
        raise


def load_kubeconfig(paths: Iterable[str]) -> Kubeconfig:
    """The files of `paths` merged into one kubeconfig, as client-go loads a KUBECONFIG list.

    A file listed twice is read once; a missing or empty one is skipped (--kubeconfig's file is
    checked to exist before); one that client-go cannot decode is an error naming it, even where
    the other files hold all that is used."""
    merged = Kubeconfig()
    for path in dict.fromkeys(paths):
        try:
            doc, problem = read_kubeconfig(path)
        except FileNotFoundError:
            continue
        if problem:
            raise KubeconfigError(f"error loading config file {path!r}: {problem}")
        if doc:
            merged.add(path, doc)
    return merged


def simple_credentials(config: Kubeconfig, context: str | None = None, master: str | None = None) -> Credentials | None:
    """The credentials of a kubeconfig this reader fully understands, else None (the package reads it).

    Raises KubeconfigError for what client-go refuses in the context in use. `master` stands in
    for a cluster without a server, as `--master` is merged into the kubeconfig's cluster.
    """
    chosen = _chosen(config.doc, context)
    if chosen is None:
        return None
    cluster_name, cluster, user_name, user = chosen
    cluster_base = config.bases.get(("cluster", cluster_name), "")
    bases = (cluster_base, config.bases.get(("user", user_name), cluster_base))  # a context without a user
    if problem := conflict(cluster_name, cluster, user_name, user, bases):
        raise KubeconfigError(f"invalid configuration: {problem}")
    if not set(cluster) <= _CLUSTER_KEYS | _IGNORED_KEYS or not set(user) <= _USER_KEYS | _IGNORED_KEYS:
        return None
    try:
        return _credentials(cluster, user, bases, master)
    except (OSError, binascii.Error, ValueError) as exc:
        raise KubeconfigError(f"invalid configuration: {one_line(exc)}") from None


def simple_kubeconfig(path: str, context: str | None = None, master: str | None = None) -> Credentials | None:
    """`simple_credentials` of the one file at `path`; None also for a file that cannot be decoded."""
    try:
        config = load_kubeconfig([path])
    except KubeconfigError:
        return None
    return simple_credentials(config, context, master)


def chosen_sections(config: Kubeconfig, context: str | None = None) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The cluster and user sections of the context in use, or None where they cannot be found."""
    chosen = _chosen(config.doc, context)
    return (chosen[1], chosen[3]) if chosen else None


def kubeconfig_paths() -> list[str]:
    """The files of $KUBECONFIG (a list to merge), else ~/.kube/config."""
    value = os.environ.get("KUBECONFIG") or "~/.kube/config"
    return [os.path.expanduser(path) for path in value.split(os.pathsep) if path]


def default_kubeconfig_path() -> str | None:
    """$KUBECONFIG when it names one file, else ~/.kube/config; None for a list to merge."""
    paths = kubeconfig_paths()
    return paths[0] if len(paths) == 1 else None


def _resolved(section: dict[str, Any], keys: tuple[str, ...], base: str) -> dict[str, Any]:
    section = dict(section) | {key: _resolve(base, section[key]) for key in keys if section.get(key)}
    command = section["exec"].get("command") if isinstance(section.get("exec"), dict) else None
    if isinstance(command, str) and os.sep in command:
        section["exec"] = {**section["exec"], "command": _resolve(base, command)}
    return section


def _resolve(base: str, path: Any) -> Any:
    return os.path.normpath(os.path.join(base, path)) if isinstance(path, str) else path


def _named(doc: dict[str, Any], kind: str, name: Any) -> dict[str, Any] | None:
    entries = [e for e in doc.get(f"{kind}s") or () if isinstance(e, dict) and e.get("name") == name]
    if len(entries) != 1 or not isinstance(entries[0].get(kind), dict):
        return None
    return entries[0][kind]


def _chosen(doc: Any, context_name: str | None) -> tuple[str, dict[str, Any], str, dict[str, Any]] | None:
    """The context's cluster and user (with their names), or None where the package should say why."""
    if not isinstance(doc, dict):
        return None
    context = _named(doc, "context", context_name or doc.get("current-context"))
    if context is None or not set(context) <= _CONTEXT_KEYS | _IGNORED_KEYS:
        return None
    cluster = _named(doc, "cluster", context.get("cluster"))
    user = _named(doc, "user", context.get("user")) if "user" in context else {}
    if cluster is None or user is None:
        return None
    return context.get("cluster", ""), cluster, context.get("user", ""), user


def _credentials(cluster: dict[str, Any], user: dict[str, Any], bases: tuple[str, str],
                 master: str | None) -> Credentials | None:
    server = cluster.get("server") or master
    if not server:
        return None
    creds = Credentials(host=server.rstrip("/"), verify_tls=not cluster.get("insecure-skip-tls-verify"),
                        server_name=cluster.get("tls-server-name") or None, proxy_url=cluster.get("proxy-url") or None,
                        disable_compression=bool(cluster.get("disable-compression")))
    creds.ca_file, creds.ca_data = _file_or_data(cluster, "certificate-authority", bases[0])
    creds.cert_file, creds.cert_data = _file_or_data(user, "client-certificate", bases[1])
    creds.key_file, creds.key_data = _file_or_data(user, "client-key", bases[1])
    creds.token_source = _token_source(user, bases[1])
    creds.impersonate = impersonation_headers(user)
    return creds


def _token_source(user: dict[str, Any], base: str) -> Callable[[], str | None]:
    """client-go's order: a token file (re-read; the inline token if it cannot be read), a token, basic auth."""
    token = user.get("token") or ""
    if user.get("tokenFile"):
        path = os.path.normpath(os.path.join(base, user["tokenFile"]))
        source = FileToken(path, fallback=token)
        if source() is None:
            raise KubeconfigError(f'read empty token from file "{path}"')
        return source
    if token:
        bearer = f"Bearer {token}"
        return lambda: bearer
    if user.get("username"):  # client-go's HasBasicAuth: a password alone sends nothing
        pair = f"{user.get('username') or ''}:{user.get('password') or ''}"
        basic = "Basic " + base64.b64encode(pair.encode()).decode()
        return lambda: basic
    return lambda: None


def impersonation_headers(user: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    """The Impersonate-* headers client-go's impersonating round tripper sends for `as` and its kin."""
    name, uid = user.get("as") or "", user.get("as-uid") or ""
    groups, extra = user.get("as-groups") or [], user.get("as-user-extra") or {}
    if not (name or uid or groups or extra):
        return ()
    headers = [("Impersonate-User", name)] + ([("Impersonate-Uid", uid)] if uid else [])
    headers += [("Impersonate-Group", group) for group in groups]
    headers += [(f"Impersonate-Extra-{_header_key_escape(key)}", value) for key, values in extra.items()
                for value in values]
    if any("\r" in value or "\n" in value for _, value in headers):  # Go refuses such a header value too
        raise KubeconfigError("invalid configuration: an impersonation value holds a line break")
    return tuple(headers)


_HEADER_KEY_BYTES = frozenset(b"!#$&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")


def _header_key_escape(key: str) -> str:
    """An extra's key as a header name: bytes a header name cannot hold, and '%', percent-encoded."""
    return "".join(chr(b) if b in _HEADER_KEY_BYTES else f"%{b:02X}" for b in key.encode())


def _file_or_data(section: dict[str, Any], key: str, base: str) -> tuple[str | None, bytes | None]:
    """The path for `key`, or the bytes of `key-data` (data wins, as in client-go); missing files raise OSError.

    Data stays in memory, as client-go keeps it: a file written for it (a client key) would outlive a
    killed process. The TLS context is built from the bytes (config.tls_context)."""
    data = section.get(f"{key}-data")
    if data:
        return None, base64.b64decode(data, validate=True)
    if data is not None and not section.get(key):
        raise ValueError(f"{key}-data is empty")
    if not section.get(key):
        return None, None
    return os.path.normpath(os.path.join(base, section[key])), None
