"""What client-go refuses in a kubeconfig, said in one line before anything is read from it.

Two kinds of refusal: a file whose fields have the wrong types or that names an entry twice,
which client-go cannot even decode ("error loading config file": a quoted "false" for
`insecure-skip-tls-verify` is a string, not a boolean, where Python's truthiness would turn TLS
verification off), and settings of the context in use that contradict each other (clientcmd's
validation.go and the transport: a CA file and CA data, a CA with `insecure-skip-tls-verify`, two
ways to authenticate).
"""

from __future__ import annotations

import os
import re
from typing import IO, Any

import yaml

from pykcm.util.log import one_line

# Field types as client-go's kubeconfig structs declare them (None, YAML's null, is always allowed).
_FIELDS: dict[str, dict[str, type]] = {
    "cluster": {
        "server": str, "certificate-authority": str, "certificate-authority-data": str,
        "insecure-skip-tls-verify": bool, "tls-server-name": str, "proxy-url": str, "disable-compression": bool,
        "extensions": list,
    },
    "user": {
        "client-certificate": str, "client-certificate-data": str, "client-key": str, "client-key-data": str,
        "token": str, "tokenFile": str, "as": str, "as-uid": str, "as-groups": list, "as-user-extra": dict,
        "username": str, "password": str, "auth-provider": dict, "exec": dict, "extensions": list,
    },
    "context": {"cluster": str, "user": str, "namespace": str, "extensions": list},
}
_TYPE_NAMES = {str: "string", bool: "boolean", list: "list", dict: "mapping", int: "number", float: "number"}


# Go's YAML (go-yaml v2 under sigs.k8s.io/yaml, YAML 1.1) reads a bare y, Y, n or N as a boolean,
# PyYAML as a string: read them as Go does, so that `name: y` is refused as kubectl refuses it and
# `insecure-skip-tls-verify: y` is true; and write them quoted, so that Go reads back a string.
_GO_BOOLS = re.compile(r"^(?:y|Y|n|N)$")


class _Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    bool_values = {**yaml.SafeLoader.bool_values, "y": True, "n": False}


class _Dumper(yaml.SafeDumper):
    pass


for _cls in (_Loader, _Dumper):
    _cls.add_implicit_resolver("tag:yaml.org,2002:bool", _GO_BOOLS, list("yYnN"))


def load_yaml(path: str) -> Any:
    with open(path, "rb") as f:
        return yaml.load(f, Loader=_Loader)


def dump_yaml(doc: Any, stream: IO[str]) -> None:
    """`doc` as block YAML that Go's YAML reads back as the same values."""
    yaml.dump(doc, stream, Dumper=_Dumper, default_flow_style=False)


def read_kubeconfig(path: str) -> tuple[Any, str | None]:
    """The document at `path` (None for an empty file) and why client-go cannot decode it as a
    kubeconfig, in one line, or None.

    These are the files client-go refuses with "error loading config file" (unreadable, not
    YAML, not a mapping, sections or fields of the wrong type, a name twice in a section); the
    package would fail on some with Python's own messages ("'str' object does not support item
    assignment") and read others wrongly. A missing file raises FileNotFoundError: client-go skips
    it in a KUBECONFIG list.
    """
    try:
        doc = load_yaml(path)
    except FileNotFoundError:
        raise
    except OSError as exc:
        return None, exc.strerror or str(exc)
    except yaml.YAMLError as exc:
        return None, "not YAML: " + one_line(exc)
    return doc, _document_problem(doc)


def _document_problem(doc: Any) -> str | None:
    if doc is None:
        return None  # empty: no configuration, which is no error while loading
    if not isinstance(doc, dict):
        return f"not a kubeconfig: the file holds a YAML {_type_name(doc)}, not a mapping"
    for kind in ("cluster", "context", "user"):
        entries = doc.get(f"{kind}s")
        if entries is None:
            continue
        if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
            return f"'{kind}s' must be a list of mappings"
        names: set[str] = set()
        for entry in entries:
            section, name = entry.get(kind, {}), entry.get("name")
            if not isinstance(section, dict):
                return f"each '{kind}s' entry's '{kind}' must be a mapping"
            # The value as read, not its truthiness: `name: no` is YAML's false, which Go refuses.
            if not isinstance(name, str | None):
                return f"each '{kind}s' entry's 'name' must be a string, not a {_type_name(name)}"
            name = name or ""  # absent: Go's empty string
            if problem := _field_problem(kind, name, section):
                return problem
            if name in names:  # client-go decodes each list into a map by name
                return f"duplicate name {name!r} in '{kind}s'"
            names.add(name)
    if not isinstance(doc.get("current-context"), str | None):  # null, as in Go, is no current context
        return f"'current-context' must be a string, not a {_type_name(doc['current-context'])}"
    return None


def _field_problem(kind: str, name: Any, section: dict[str, Any]) -> str | None:
    for key, want in _FIELDS[kind].items():
        value = section.get(key)
        if value is None or isinstance(value, want):
            continue
        return f"{kind} {name!r}: '{key}' must be a {_TYPE_NAMES[want]}, not a {_type_name(value)}"
    groups, extra = section.get("as-groups") or [], section.get("as-user-extra") or {}
    if not all(isinstance(g, str) for g in groups):
        return f"{kind} {name!r}: 'as-groups' must be a list of strings"
    if not all(isinstance(v, list) and all(isinstance(s, str) for s in v) for v in extra.values()):
        return f"{kind} {name!r}: 'as-user-extra' must map each key to a list of strings"
    return None


def _type_name(value: Any) -> str:
    return _TYPE_NAMES.get(type(value), type(value).__name__)


def conflict(cluster_name: str, cluster: dict[str, Any], user_name: str, user: dict[str, Any],
             bases: tuple[str, str]) -> str | None:
    """The first contradiction in the context's cluster and user that client-go refuses, or None.

    Relative paths are read against `bases`, the directories of the kubeconfigs the cluster and
    the user come from, as client-go resolves them.
    """
    ca_file, ca_data = cluster.get("certificate-authority"), cluster.get("certificate-authority-data")
    if ca_file and ca_data:
        return (f"certificate-authority-data and certificate-authority are both specified for {cluster_name}. "
                "certificate-authority-data will override.")
    if ca_file and (problem := _unreadable(bases[0], ca_file)):
        return f"unable to read certificate-authority {ca_file} for {cluster_name} due to {problem}"
    if (ca_file or ca_data) and cluster.get("insecure-skip-tls-verify"):
        return "specifying a root certificates file with the insecure flag is not allowed"
    cert_file, cert_data = user.get("client-certificate"), user.get("client-certificate-data")
    key_file, key_data = user.get("client-key"), user.get("client-key-data")
    if cert_file or cert_data:
        if cert_file and cert_data:
            return (f"client-cert-data and client-cert are both specified for {user_name}. "
                    "client-cert-data will override.")
        if key_file and key_data:
            return f"client-key-data and client-key are both specified for {user_name}; client-key-data will override"
        if not (key_file or key_data):
            return f"client-key-data or client-key must be specified for {user_name} to use the clientCert " \
                   "authentication method."
        for what, path in (("client-cert", cert_file), ("client-key", key_file)):
            if path and (problem := _unreadable(bases[1], path)):
                return f"unable to read {what} {path} for {user_name} due to {problem}"
    if not user.get("as") and (user.get("as-uid") or user.get("as-groups") or user.get("as-user-extra")):
        return f"requesting uid, groups or user-extra for {user_name} without impersonating a user"
    methods = [m for m, given in (("token", user.get("token")),
                                  ("basicAuth", user.get("username") or user.get("password"))) if given]
    if len(methods) > 1:
        return f"more than one authentication method found for {user_name}; found [{' '.join(methods)}], only one " \
               "is allowed"
    return None


def _unreadable(base: str, path: str) -> str | None:
    try:
        with open(os.path.join(base, path), "rb"):
            return None
    except OSError as exc:
        return exc.strerror or str(exc)
