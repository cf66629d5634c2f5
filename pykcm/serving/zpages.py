"""/statusz and /flagz, as KCM v1.36.3 serves them (k8s.io/apiserver's statusz and flagz packages),
and /configz (component-base's configz).

Pure functions: the server passes the Accept header (and whether to pretty-print JSON) and sends
back the (status, headers, body) they return. Content negotiation is the apiserver's: no Accept
gives text; `application/json` or `application/yaml` with `as=Statusz;v=v1beta1;g=config.k8s.io`
(or v1alpha1, with a deprecation Warning; Flagz likewise) gives the object; anything else a 406
Status, itself negotiated from the same Accept, as the built KCM answers. The text separates names
and values with a delimiter picked at random among four, so that nobody parses it: per request on
/statusz, once per process on /flagz (KCM caches its first /flagz text).
"""

from __future__ import annotations

import functools
import json
import platform
import random
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from typing import Any

import yaml

from pykcm.serving.accept import parse_accept

STATUSZ_PATH, FLAGZ_PATH, CONFIGZ_PATH = "/statusz", "/flagz", "/configz"
DELIMITERS = (":", ": ", "=", " ")
GROUP, VERSIONS, DEPRECATED_VERSION = "config.k8s.io", ("v1alpha1", "v1beta1"), "v1alpha1"
_NON_DEBUGGING = frozenset({"/apis", "/api", "/openid", "/openapi", "/.well-known"})
_SERIALIZERS = ("application/json", "application/yaml", "text/plain")  # the codec factory's order, protobuf left out
_WARNING = ("Warning: This endpoint is not meant to be machine parseable, has no formatting compatibility "
            "guarantees and is for debugging purposes only.")
_HTML = str.maketrans({"<": "&lt;", ">": "&gt;", "&": "&amp;", "'": "&#39;", '"': "&#34;"})
_DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")

Response = tuple[int, dict[str, str], bytes]


def python_runtime_version() -> str:
    """What pykcm reports where KCM reports `goVersion` (Go's runtime.Version(), e.g. go1.27.3): the
    runtime executing the component, so `python3.11.7`. The field keeps its name in the structured
    answers, which are KCM's API kinds; the value says which runtime (and which bugs) one talks to."""
    return f"python{platform.python_version()}"


@dataclass(frozen=True)
class Component:
    """What /statusz and /flagz tell about the running component: build one per process, as the /flagz
    delimiter is drawn when it is made."""

    name: str  # KCM's is kube-controller-manager
    start_time: datetime  # the process's start; naive means UTC; reported to the second, in UTC
    binary_version: str  # KCM's is 1.36.3, without a "v"
    runtime_version: str = field(default_factory=python_runtime_version)  # in KCM's goVersion place
    emulation_version: str = ""  # KCM's is 1.36; empty omits it (JSON) or leaves its text line empty
    paths: Sequence[str] = ()  # the listed paths; statusz reports their first segments, sorted
    flags: Mapping[str, str] = field(default_factory=dict)  # flag name -> value as pflag prints it
    config: Mapping[str, Any] | None = None  # what /configz shows (pykcm/app/configz.py); None: not served
    statusz: bool = True  # served (KCM's ComponentStatusz gate)
    flagz: bool = True  # served (ComponentFlagz)
    flagz_delimiter: str = field(default_factory=lambda: random.choice(DELIMITERS))  # fixed per process, as KCM


def _start(component: Component) -> datetime:
    start = component.start_time
    return (start.replace(tzinfo=UTC) if start.tzinfo is None else start.astimezone(UTC)).replace(microsecond=0)


def _uptime(component: Component, now: datetime | None) -> int:
    return max(0, int(((now or datetime.now(UTC)) - _start(component)).total_seconds()))


def _paths(listed: Sequence[str]) -> list[str]:
    folders = {"/" + parts[1] for parts in (p.split("/") for p in listed) if len(parts) > 1 and parts[1]}
    return sorted(folders - _NON_DEBUGGING)


def statusz_text(component: Component, *, now: datetime | None = None, delimiter: str | None = None) -> str:
    """The text answer, byte for byte KCM's layout (Go's time.UnixDate, html-escaped values)."""
    d = (delimiter if delimiter is not None else random.choice(DELIMITERS)).translate(_HTML)
    s, up = _start(component), _uptime(component, now)
    started = f"{_DAYS[s.weekday()]} {_MONTHS[s.month - 1]} {s.day:2d} {s:%H:%M:%S} UTC {s.year:04d}"
    emulation, paths = component.emulation_version.translate(_HTML), " ".join(_paths(component.paths)).translate(_HTML)
    return (f"\n{component.name} statusz\n{_WARNING}\n\nStarted{d} {started}\n"
            f"Up{d} {up // 3600} hr {up // 60 % 60:02d} min {up % 60:02d} sec\n"
            f"Go version{d} {component.runtime_version.translate(_HTML)}\n"
            f"Binary version{d} {component.binary_version.translate(_HTML)}\n"
            f"{f'Emulation version{d} {emulation}' if emulation else ''}\n{f'Paths{d} {paths}' if paths else ''}\n")


def flagz_text(component: Component) -> str:
    """The text answer: flags sorted by name, `name<delimiter>value`, nothing escaped."""
    lines = "".join(f"{k}{component.flagz_delimiter}{v}\n" for k, v in sorted(component.flags.items()))
    return f"\n{component.name} flagz\n{_WARNING}\n{lines}"


def statusz_object(component: Component, version: str = "v1beta1", *, now: datetime | None = None) -> dict:
    obj: dict = {"kind": "Statusz", "apiVersion": f"{GROUP}/{version}", "metadata": {"name": component.name},
                 "startTime": f"{_start(component):%Y-%m-%dT%H:%M:%SZ}", "uptimeSeconds": _uptime(component, now),
                 "goVersion": component.runtime_version, "binaryVersion": component.binary_version}
    if component.emulation_version:
        obj["emulationVersion"] = component.emulation_version
    obj["paths"] = _paths(component.paths) or None  # Go's nil slice: null
    return obj


def flagz_object(component: Component, version: str = "v1beta1") -> dict:
    obj: dict = {"kind": "Flagz", "apiVersion": f"{GROUP}/{version}", "metadata": {"name": component.name}}
    if component.flags:
        obj["flags"] = dict(sorted(component.flags.items()))
    return obj


def pretty_requested(user_agent: str, query: Mapping[str, Sequence[str]]) -> bool:
    """The apiserver's isPrettyPrint: `?pretty=<Go bool>` decides, else a curl, Wget or browser agent."""
    value = (query.get("pretty") or [""])[0]
    if value:
        return value in ("1", "t", "T", "true", "TRUE", "True")
    return user_agent.startswith(("curl", "Wget", "Mozilla/5.0"))


def statusz_response(component: Component, accept: str, *, pretty: bool = False, now: datetime | None = None,
                     delimiter: str | None = None) -> Response:
    """The answer to GET /statusz with this Accept header (KCM's handler answers any method alike)."""
    return _respond("statusz", "Statusz", accept, pretty, lambda: statusz_text(component, now=now, delimiter=delimiter),
                    lambda version: statusz_object(component, version, now=now))


def flagz_response(component: Component, accept: str, *, pretty: bool = False) -> Response:
    """The answer to GET /flagz with this Accept header."""
    return _respond("flagz", "Flagz", accept, pretty, lambda: flagz_text(component),
                    lambda version: flagz_object(component, version))


def _respond(endpoint: str, kind: str, accept: str, pretty: bool, text: Callable[[], str],
             structured: Callable[[str], dict]) -> Response:
    accept = accept.strip(" \t")  # as Go's net/http reads header values
    if accept.strip():
        chosen = _negotiate(accept, kind)
        if chosen is None:
            return _not_acceptable(accept, pretty)
        media, version, pretty_param = chosen
        if media != "text/plain":
            headers = {"Content-Type": f"{media};g={GROUP};v={version};as={kind}"}
            if version == DEPRECATED_VERSION:
                headers["Warning"] = f'299 - "This version of the {endpoint} endpoint is deprecated. ' \
                                     'Please use a newer version."'
            return 200, headers, _encode(structured(version), media, pretty or pretty_param)
    return 200, {"Content-Type": "text/plain; charset=utf-8"}, text().encode()


def _not_acceptable(accept: str, pretty: bool) -> Response:
    status = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
              "message": "only the following media types are accepted: " + ", ".join(_SERIALIZERS),
              "reason": "NotAcceptable", "code": 406}
    chosen = _negotiate(accept, None)  # the error is negotiated too, with the apiserver's default restrictions
    if chosen is None:  # responsewriters.WriteRawJSON
        return 406, {"Content-Type": "application/json"}, _encode(status, "application/json", True)
    return 406, {"Content-Type": chosen[0]}, _encode(status, chosen[0], pretty or chosen[2])


def _negotiate(accept: str, kind: str | None) -> tuple[str, str, bool] | None:
    """(media type, version, pretty=1) as NegotiateMediaTypeOptions: the clauses in goautoneg's order, each
    tried against JSON, YAML, text; kind restricts as/g/v to it, None allows none (default restrictions)."""
    for typ, sub, params in parse_accept(accept):
        for media in _SERIALIZERS:
            s_typ, s_sub = media.split("/")
            if not ((typ == s_typ and sub in (s_sub, "*")) or typ == sub == "*"):
                continue
            as_, g, v = (params.get(k, "") for k in ("as", "g", "v"))
            convert = bool(params.keys() & {"as", "g", "v"})
            stream = params.get("stream", "")  # only JSON streams, and only the default restrictions allow watch
            if params.get("sv") or (stream and (kind or media != "application/json" or stream != "watch")):
                continue
            if kind is None or media == "text/plain":
                allowed = not convert
            else:
                allowed = convert and (as_, g) == (kind, GROUP) and v in VERSIONS
            if allowed:
                return media, v, params.get("pretty") == "1"
    return None


def _encode(obj: dict, media: str, pretty: bool) -> bytes:
    if media == "application/yaml":  # sigs.k8s.io/yaml: JSON, then go-yaml v2 with its key order
        return yaml.dump(_yaml_sorted(obj), Dumper=_GoYamlDumper, default_flow_style=False, allow_unicode=True,
                         sort_keys=False).encode()
    return go_json(obj, indent=2) if pretty else go_json(obj) + b"\n"  # json.Encoder ends with a newline


def go_json(obj: Mapping[str, Any], indent: int | None = None) -> bytes:
    """`obj` as Go's encoding/json writes it: compact (or indented), UTF-8, HTML-safe escaping."""
    text = json.dumps(obj, ensure_ascii=False, indent=indent, separators=(",", ": ") if indent else (",", ":"))
    for char in "<>&\u2028\u2029":
        text = text.replace(char, f"\\u{ord(char):04x}")
    return text.encode()


def configz_response(component: Component) -> Response:
    """The answer to /configz (component-base's configz: any method, no negotiation)."""
    headers = {"Content-Type": "application/json", "X-Content-Type-Options": "nosniff"}
    return 200, headers, go_json(component.config or {})


def _yaml_less(a: str, b: str) -> int:
    """go-yaml v2's keyList.Less for string keys: letters after other runes, digit runs by value."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x == y:
            continue
        if x.isalpha() or y.isalpha():
            return (-1 if x < y else 1) if x.isalpha() and y.isalpha() else (-1 if y.isalpha() else 1)
        lead = 1 if "0" in (x, y) and re.search(r"[1-9]\d*$", a[:i]) else 0
        da, db = re.match(r"\d*", a[i:]).group(), re.match(r"\d*", b[i:]).group()  # type: ignore[union-attr]
        an, bn = (lead * 10 ** len(da) + int(da or 0), len(da)), (lead * 10 ** len(db) + int(db or 0), len(db))
        return (-1 if an < bn else 1) if an != bn else (-1 if x < y else 1)
    return len(a) - len(b)


def _yaml_sorted(value: object) -> object:
    if isinstance(value, dict):
        return {k: _yaml_sorted(value[k]) for k in sorted(value, key=functools.cmp_to_key(_yaml_less))}
    return [_yaml_sorted(v) for v in value] if isinstance(value, list) else value


_YAML_NON_STR = re.compile(  # what go-yaml v2's resolve reads as no string (digits, signs: "_" removed first)
    r"y|Y|yes|Yes|YES|n|N|no|No|NO|true|True|TRUE|false|False|FALSE|on|On|ON|off|Off|OFF|~|null|Null|NULL|"
    r"[-+]?\.(inf|Inf|INF)|\.(nan|NaN|NAN)|\.\d+([eE][-+]?\d+)?|[-+]?(0[xX][0-9a-fA-F]+|0[oO][0-7]+|0[bB][01]+)|"
    r"[-+]?(\.\d+|\d+(\.\d*)?)([eE][-+]?\d+)?")
_YAML_BASE60 = re.compile(r"[-+]?\d[\d_]*(:[0-5]?\d)+(\.[\d_]*)?")
_YAML_TIME = re.compile(r"(\d{4})-(\d\d?)-(\d\d?)([Tt]\d\d?:\d\d?:\d\d?(\.\d+)?(Z|[+-]\d\d:\d\d)|"
                        r" \d\d?:\d\d?:\d\d?(\.\d+)?)?")


def _yaml_needs_quotes(text: str) -> bool:
    """go-yaml v2's encoder double-quotes a string that would read back as something else."""
    resolved = text.replace("_", "") if text[:1] in tuple("+-0123456789") else text
    if text == "" or _YAML_NON_STR.fullmatch(resolved) or _YAML_BASE60.fullmatch(text):
        return True
    try:
        match = _YAML_TIME.fullmatch(text)
        return match is not None and bool(date(int(match[1]), int(match[2]), int(match[3])))
    except ValueError:
        return False


class _GoYamlDumper(yaml.SafeDumper):
    """PyYAML's emitter is libyaml's, as go-yaml's: only which strings stay plain needs go-yaml's rules."""

    def represent_str(self, data: str) -> yaml.ScalarNode:
        style = "|" if "\n" in data else '"' if _yaml_needs_quotes(data) else None
        return self.represent_scalar("tag:yaml.org,2002:str", data, style=style)

    def resolve(self, kind: type, value: str, implicit: tuple[bool, bool]) -> str:
        if kind is yaml.ScalarNode and implicit[0] and not _yaml_needs_quotes(value):
            return "tag:yaml.org,2002:str"  # plain, where PyYAML would quote (2026-13-45, <<)
        return super().resolve(kind, value, implicit)


_GoYamlDumper.add_representer(str, _GoYamlDumper.represent_str)
