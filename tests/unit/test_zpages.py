"""Unit tests for pykcm.serving.zpages: /statusz and /flagz against what KCM v1.36.3's binary answered.

The expected bodies are KCM's own answers (kube-controller-manager v1.36.3, curl with the admin client
certificate), with KCM's values fed in as the component's; only the uptime was chosen to match.
"""

from __future__ import annotations

import json
import platform
import re
from datetime import UTC, datetime, timedelta

import pytest

from pykcm.serving import zpages
from pykcm.serving.zpages import DELIMITERS, Component, flagz_response, pretty_requested, statusz_response

START = datetime(2026, 11, 26, 15, 45, 12, tzinfo=UTC)
KCM = Component(
    name="kube-controller-manager", start_time=START, binary_version="1.36.3", runtime_version="go1.27.3",
    emulation_version="1.36", paths=("/configz", "/flagz", "/healthz", "/metrics"),
)
STATUSZ_V1BETA1 = "application/json;as=Statusz;v=v1beta1;g=config.k8s.io"
STATUSZ_V1ALPHA1 = "application/json;as=Statusz;v=v1alpha1;g=config.k8s.io"
FLAGZ_V1BETA1 = "application/json;as=Flagz;v=v1beta1;g=config.k8s.io"
WARNING = ("Warning: This endpoint is not meant to be machine parseable, has no formatting compatibility "
           "guarantees and is for debugging purposes only.")
TEXT = {"Content-Type": "text/plain; charset=utf-8"}

KCM_STATUSZ_TEXT = f"""
kube-controller-manager statusz
{WARNING}

Started: Thu Nov 26 15:45:12 UTC 2026
Up: 0 hr 00 min 09 sec
Go version: go1.27.3
Binary version: 1.36.3
Emulation version: 1.36
Paths: /configz /flagz /healthz /metrics
"""
KCM_STATUSZ_COMPACT = (
    '{"kind":"Statusz","apiVersion":"config.k8s.io/v1beta1","metadata":{"name":"kube-controller-manager"},'
    '"startTime":"2026-11-26T15:45:12Z","uptimeSeconds":79,"goVersion":"go1.27.3","binaryVersion":"1.36.3",'
    '"emulationVersion":"1.36","paths":["/configz","/flagz","/healthz","/metrics"]}\n'
)
KCM_STATUSZ_PRETTY_V1ALPHA1 = """{
  "kind": "Statusz",
  "apiVersion": "config.k8s.io/v1alpha1",
  "metadata": {
    "name": "kube-controller-manager"
  },
  "startTime": "2026-11-26T15:45:12Z",
  "uptimeSeconds": 9,
  "goVersion": "go1.27.3",
  "binaryVersion": "1.36.3",
  "emulationVersion": "1.36",
  "paths": [
    "/configz",
    "/flagz",
    "/healthz",
    "/metrics"
  ]
}"""
KCM_STATUSZ_YAML = """apiVersion: config.k8s.io/v1beta1
binaryVersion: 1.36.3
emulationVersion: "1.36"
goVersion: go1.27.3
kind: Statusz
metadata:
  name: kube-controller-manager
paths:
- /configz
- /flagz
- /healthz
- /metrics
startTime: "2026-11-26T15:45:12Z"
uptimeSeconds: 9
"""
MESSAGE = "only the following media types are accepted: application/json, application/yaml, text/plain"
KCM_406_RAW = f"""{{
  "kind": "Status",
  "apiVersion": "v1",
  "metadata": {{}},
  "status": "Failure",
  "message": "{MESSAGE}",
  "reason": "NotAcceptable",
  "code": 406
}}"""
KCM_406_COMPACT = (f'{{"kind":"Status","apiVersion":"v1","metadata":{{}},"status":"Failure","message":"{MESSAGE}",'
                   '"reason":"NotAcceptable","code":406}\n')
KCM_406_YAML = """apiVersion: v1
code: 406
kind: Status
message: 'only the following media types are accepted: application/json, application/yaml,
  text/plain'
metadata: {}
reason: NotAcceptable
status: Failure
"""

KCM_FLAGS = {
    "authorization-always-allow-paths": "[/healthz,/readyz,/livez]", "cert-dir": "- dash", "cloud-config": "null",
    "cluster-cidr": "0x1F", "cluster-name": "x<y>&z 'q' \"d\" a: b #c",
    "cluster-signing-kube-apiserver-client-cert-file": " lead",
    "cluster-signing-kube-apiserver-client-key-file": "trail ",
    "cluster-signing-kubelet-client-cert-file": "-0b101", "cluster-signing-kubelet-serving-cert-file": "a\ttab",
    "cluster-signing-kubelet-serving-key-file": "Yes", "cluster-signing-legacy-unknown-cert-file": "+.5",
    "cluster-signing-legacy-unknown-key-file": "0o17", "controllers": "[replicaset]",
    "external-cloud-volume-plugin": "a\nb",
    "flex-volume-plugin-dir": "/some very long path with spaces/that goes on and on and on/beyond eighty columns "
                              "for sure/yes indeed it does",
    "horizontal-pod-autoscaler-tolerance": "0.25", "kube-api-content-type": "application/vnd.kubernetes.protobuf",
    "leader-elect-resource-lock": "2026-13-45", "leader-elect-resource-name": "yes",
    "leader-elect-resource-namespace": "2026-11-26", "leader-migration-config": "~", "node-cidr-mask-size-ipv4": "24",
    "pv-recycler-pod-template-filepath-hostpath": "<<", "pv-recycler-pod-template-filepath-nfs": "1:20",
    "requestheader-extra-headers-prefix": "[1_000]", "service-cluster-ip-range": "1e3", "vmodule": "x=2",
}
KCM_FLAGZ_YAML = """apiVersion: config.k8s.io/v1beta1
flags:
  authorization-always-allow-paths: '[/healthz,/readyz,/livez]'
  cert-dir: '- dash'
  cloud-config: "null"
  cluster-cidr: "0x1F"
  cluster-name: 'x<y>&z ''q'' "d" a: b #c'
  cluster-signing-kube-apiserver-client-cert-file: ' lead'
  cluster-signing-kube-apiserver-client-key-file: 'trail '
  cluster-signing-kubelet-client-cert-file: "-0b101"
  cluster-signing-kubelet-serving-cert-file: "a\\ttab"
  cluster-signing-kubelet-serving-key-file: "Yes"
  cluster-signing-legacy-unknown-cert-file: "+.5"
  cluster-signing-legacy-unknown-key-file: "0o17"
  controllers: '[replicaset]'
  external-cloud-volume-plugin: |-
    a
    b
  flex-volume-plugin-dir: /some very long path with spaces/that goes on and on and
    on/beyond eighty columns for sure/yes indeed it does
  horizontal-pod-autoscaler-tolerance: "0.25"
  kube-api-content-type: application/vnd.kubernetes.protobuf
  leader-elect-resource-lock: 2026-13-45
  leader-elect-resource-name: "yes"
  leader-elect-resource-namespace: "2026-11-26"
  leader-migration-config: "~"
  node-cidr-mask-size-ipv4: "24"
  pv-recycler-pod-template-filepath-hostpath: <<
  pv-recycler-pod-template-filepath-nfs: "1:20"
  requestheader-extra-headers-prefix: '[1_000]'
  service-cluster-ip-range: "1e3"
  vmodule: x=2
kind: Flagz
metadata:
  name: kube-controller-manager
"""


def flagz_component(delimiter: str, flags: dict[str, str] | None = None) -> Component:
    flags = dict(reversed(list((KCM_FLAGS if flags is None else flags).items())))
    return Component(name="kube-controller-manager", start_time=START, binary_version="1.36.3", flags=flags,
                     flagz_delimiter=delimiter)


def test_statusz_text_is_kcms_byte_for_byte() -> None:
    answer = statusz_response(KCM, "", now=START + timedelta(seconds=9), delimiter=":")
    assert answer == (200, TEXT, KCM_STATUSZ_TEXT.encode())


@pytest.mark.parametrize("delimiter", DELIMITERS)
def test_statusz_text_delimiter_is_followed_by_a_space(delimiter: str) -> None:
    body = statusz_response(KCM, "", now=START + timedelta(seconds=9), delimiter=delimiter)[2].decode()
    assert body == KCM_STATUSZ_TEXT.replace(": ", f"{delimiter} ").replace(f"Warning{delimiter} ", "Warning: ")
    assert f"\nStarted{delimiter} Thu Nov 26 15:45:12 UTC 2026\n" in body


def test_statusz_text_picks_one_of_the_four_delimiters_per_request() -> None:
    seen = set()
    for _ in range(200):
        body = statusz_response(KCM, "text/plain", now=START)[2].decode()
        seen.add(re.search(r"\nStarted(.*?) Thu", body).group(1))
    assert seen == set(DELIMITERS)


def test_statusz_text_without_emulation_version_or_paths_keeps_their_lines_empty() -> None:
    bare = Component(name="pykcm", start_time=datetime(2025, 11, 6, 0, 0, 0, 750000), binary_version="0.1.0",
                     runtime_version="python3.11.7")
    body = zpages.statusz_text(bare, now=datetime(2025, 11, 10, 4, 2, 3, tzinfo=UTC), delimiter="=")
    assert body == (f"\npykcm statusz\n{WARNING}\n\nStarted= Thu Nov  6 00:00:00 UTC 2025\n"
                    "Up= 100 hr 02 min 03 sec\nGo version= python3.11.7\nBinary version= 0.1.0\n\n\n")


def test_statusz_text_escapes_html_as_go() -> None:
    odd = Component(name="pykcm", start_time=START, binary_version="1<2>&'\"", runtime_version="a&b")
    body = zpages.statusz_text(odd, now=START, delimiter=" ")
    assert "\nBinary version  1&lt;2&gt;&amp;&#39;&#34;\n" in body
    assert "\nGo version  a&amp;b\n" in body


def test_statusz_paths_are_first_segments_sorted_without_api_paths() -> None:
    listed = ("/readyz", "/metrics/slis", "/debug/flags/v", "/healthz", "/livez", "/metrics", "/statusz", "/flagz",
              "/api/v1", "/openapi/v2", "relative", "/")
    component = Component(name="pykcm", start_time=START, binary_version="0.1.0", paths=listed)
    assert zpages.statusz_object(component, now=START)["paths"] == [
        "/debug", "/flagz", "/healthz", "/livez", "/metrics", "/readyz", "/statusz"]
    assert "\nPaths: /debug /flagz /healthz /livez /metrics /readyz /statusz\n" in zpages.statusz_text(
        component, now=START, delimiter=":")


@pytest.mark.parametrize("accept", [
    "", "   ", "\t", "text/plain", "*/*", "text/*", "*", "text/plain;q=0", "text/plain;pretty=1",
    "application/json, text/plain", "application/json;as=Statusz;v=v1beta1;g=config.k8s.io;q=0.1, text/plain",
    "application/json;q=0.1;as=Statusz;v=v1beta1;g=config.k8s.io, */*;q=0.9",
    "application/json;q=abc;as=Statusz;v=v1beta1;g=config.k8s.io, text/plain;q=0.5",
])
def test_statusz_answers_text(accept: str) -> None:
    status, headers, body = statusz_response(KCM, accept, now=START + timedelta(seconds=9), delimiter=":")
    assert (status, headers, body) == (200, TEXT, KCM_STATUSZ_TEXT.encode())


def test_statusz_v1beta1_json_is_kcms_byte_for_byte() -> None:
    status, headers, body = statusz_response(KCM, STATUSZ_V1BETA1, now=START + timedelta(seconds=79))
    assert (status, headers) == (200, {"Content-Type": "application/json;g=config.k8s.io;v=v1beta1;as=Statusz"})
    assert body == KCM_STATUSZ_COMPACT.encode()


def test_statusz_v1alpha1_is_deprecated_and_pretty_for_curl() -> None:
    status, headers, body = statusz_response(KCM, STATUSZ_V1ALPHA1, pretty=True, now=START + timedelta(seconds=9))
    assert status == 200
    assert headers == {
        "Content-Type": "application/json;g=config.k8s.io;v=v1alpha1;as=Statusz",
        "Warning": '299 - "This version of the statusz endpoint is deprecated. Please use a newer version."',
    }
    assert body == KCM_STATUSZ_PRETTY_V1ALPHA1.encode()


def test_statusz_yaml_is_kcms_byte_for_byte() -> None:
    accept = "application/yaml;as=Statusz;v=v1beta1;g=config.k8s.io"
    status, headers, body = statusz_response(KCM, accept, now=START + timedelta(seconds=9))
    assert (status, headers) == (200, {"Content-Type": "application/yaml;g=config.k8s.io;v=v1beta1;as=Statusz"})
    assert body == KCM_STATUSZ_YAML.encode()


def test_statusz_json_of_pykcm_omits_empty_emulation_version_and_says_null_for_no_paths() -> None:
    bare = Component(name="pykcm", start_time=START.replace(microsecond=999999), binary_version="0.1.0")
    obj = json.loads(statusz_response(bare, STATUSZ_V1BETA1, now=START + timedelta(hours=2))[2])
    assert obj == {"kind": "Statusz", "apiVersion": "config.k8s.io/v1beta1", "metadata": {"name": "pykcm"},
                   "startTime": "2026-11-26T15:45:12Z", "uptimeSeconds": 7200,
                   "goVersion": f"python{platform.python_version()}", "binaryVersion": "0.1.0", "paths": None}


@pytest.mark.parametrize(("accept", "content_type", "shape"), [
    ("text/plain;q=0.5, application/json;as=Statusz;v=v1beta1;g=config.k8s.io",
     "application/json;g=config.k8s.io;v=v1beta1;as=Statusz", "compact"),
    ("*/*;q=0.9, application/json;q=0.1;as=Statusz;v=v1beta1;g=config.k8s.io",
     "application/json;g=config.k8s.io;v=v1beta1;as=Statusz", "compact"),
    ("text/*;q=0.1, application/*;as=Statusz;v=v1beta1;g=config.k8s.io",
     "application/json;g=config.k8s.io;v=v1beta1;as=Statusz", "compact"),
    ("*/*;as=Statusz;v=v1beta1;g=config.k8s.io", "application/json;g=config.k8s.io;v=v1beta1;as=Statusz", "compact"),
    ("application/json; as=Statusz ; v=v1beta1;g=config.k8s.io;foo=bar;sv=",
     "application/json;g=config.k8s.io;v=v1beta1;as=Statusz", "compact"),
    ("application/json;as=Statusz;v=v1beta1;g=config.k8s.io;pretty=1",
     "application/json;g=config.k8s.io;v=v1beta1;as=Statusz", "pretty"),
    ("application/json;as=Statusz;v=v1alpha1;g=config.k8s.io, application/yaml;as=Statusz;v=v1beta1;g=config.k8s.io",
     "application/json;g=config.k8s.io;v=v1alpha1;as=Statusz", "compact"),
    ("application/yaml;as=Statusz;v=v1alpha1;g=config.k8s.io",
     "application/yaml;g=config.k8s.io;v=v1alpha1;as=Statusz", "yaml"),
])
def test_statusz_negotiates_structured_answers_as_kcm(accept: str, content_type: str, shape: str) -> None:
    status, headers, body = statusz_response(KCM, accept, now=START)
    assert (status, headers["Content-Type"]) == (200, content_type)
    assert ("Warning" in headers) == ("v=v1alpha1" in content_type)
    text = body.decode()
    assert {"compact": text.startswith('{"kind":"Statusz"') and text.endswith("}\n"),
            "pretty": text.startswith('{\n  "kind": "Statusz"') and text.endswith("\n}"),
            "yaml": text.startswith("apiVersion: config.k8s.io/v1alpha1\n")}[shape]


@pytest.mark.parametrize("accept", [
    "application/vnd.kubernetes.protobuf", "application/vnd.kubernetes.protobuf;as=Statusz;v=v1beta1;g=config.k8s.io",
    "application/cbor", "application/cbor;as=Statusz;v=v1beta1;g=config.k8s.io", "text/html", "garbage", ",",
    "text/plain;as=Statusz;v=v1beta1;g=config.k8s.io", "application/json;as=Statusz;v=v1;g=config.k8s.io",
    "application/json;as=Flagz;v=v1beta1;g=config.k8s.io", "application/json;as=Statusz;v=v1beta1",
    "application/json;as=\"Statusz\";v=v1beta1;g=config.k8s.io", "Application/JSON", "text/ ",
    "application/json;as=Statusz;v=v1beta1;g=config.k8s.io;stream=watch", "application/yaml;stream=watch",
    "application/json;as=Statusz;v=v1beta1;g=config.k8s.io;sv=v1",
])
def test_unsupported_accepts_get_kcms_raw_406(accept: str) -> None:
    for pretty in (False, True):
        answer = statusz_response(KCM, accept, pretty=pretty, now=START)
        assert answer == (406, {"Content-Type": "application/json"}, KCM_406_RAW.encode())


@pytest.mark.parametrize("accept", ["application/json", "application/*", "application/json;stream=watch",
                                    "application/json;AS=Statusz;V=v1beta1;G=config.k8s.io"])
def test_unsupported_accepts_naming_json_get_a_negotiated_406(accept: str) -> None:
    assert statusz_response(KCM, accept) == (406, {"Content-Type": "application/json"}, KCM_406_COMPACT.encode())
    assert statusz_response(KCM, accept, pretty=True)[2] == KCM_406_RAW.encode()
    assert flagz_response(flagz_component(":"), accept) == (406, {"Content-Type": "application/json"},
                                                            KCM_406_COMPACT.encode())
    assert statusz_response(KCM, accept + ";pretty=1")[2] == KCM_406_RAW.encode()


@pytest.mark.parametrize("accept", ["application/yaml", "application/yaml;pretty=1", "text/html, application/yaml"])
def test_unsupported_accepts_naming_yaml_get_a_yaml_406(accept: str) -> None:
    assert statusz_response(KCM, accept) == (406, {"Content-Type": "application/yaml"}, KCM_406_YAML.encode())
    assert flagz_response(flagz_component(":"), accept)[2] == KCM_406_YAML.encode()


def test_flagz_text_sorts_flags_and_escapes_nothing() -> None:
    body = flagz_response(flagz_component("="), "")[2].decode()
    assert body.startswith(f"\nkube-controller-manager flagz\n{WARNING}\nauthorization-always-allow-paths=")
    for line in ("cluster-name=x<y>&z 'q' \"d\" a: b #c\n", "cluster-signing-kube-apiserver-client-cert-file= lead\n",
                 "cluster-signing-kube-apiserver-client-key-file=trail \n",
                 "cluster-signing-kubelet-serving-cert-file=a\ttab\n", "external-cloud-volume-plugin=a\nb\n",
                 "pv-recycler-pod-template-filepath-hostpath=<<\n", "vmodule=x=2\n"):
        assert f"\n{line}" in body
    names = [line.split("=")[0] for line in body.split("\n")[3:] if "=" in line]
    assert names == sorted(KCM_FLAGS)
    assert body.endswith("\nvmodule=x=2\n")


@pytest.mark.parametrize("delimiter", DELIMITERS)
def test_flagz_text_puts_the_delimiter_alone_between_name_and_value(delimiter: str) -> None:
    flags = {"v": "0", "allocate-node-cidrs": "false", "controllers": "[replicaset]", "master": ""}
    body = flagz_response(flagz_component(delimiter, flags), "text/plain")[2].decode()
    assert body == (f"\nkube-controller-manager flagz\n{WARNING}\nallocate-node-cidrs{delimiter}false\n"
                    f"controllers{delimiter}[replicaset]\nmaster{delimiter}\nv{delimiter}0\n")


def test_flagz_delimiter_is_chosen_once_per_component() -> None:
    component = Component(name="pykcm", start_time=START, binary_version="0.1.0", flags={"v": "2"})
    assert component.flagz_delimiter in DELIMITERS
    assert len({flagz_response(component, "")[2] for _ in range(20)}) == 1
    assert {Component(name="p", start_time=START, binary_version="0").flagz_delimiter for _ in range(200)} == set(
        DELIMITERS)


def test_flagz_json_sorts_flags_and_escapes_html_as_go() -> None:
    status, headers, body = flagz_response(flagz_component(":"), FLAGZ_V1BETA1)
    assert (status, headers) == (200, {"Content-Type": "application/json;g=config.k8s.io;v=v1beta1;as=Flagz"})
    assert body.startswith(b'{"kind":"Flagz","apiVersion":"config.k8s.io/v1beta1","metadata":'
                           b'{"name":"kube-controller-manager"},"flags":{"authorization-always-allow-paths":')
    assert b'"cluster-name":"x\\u003cy\\u003e\\u0026z \'q\' \\"d\\" a: b #c",' in body
    assert b'"external-cloud-volume-plugin":"a\\nb",' in body
    assert body.endswith(b'"vmodule":"x=2"}}\n')
    obj = json.loads(body)
    assert list(obj["flags"]) == sorted(KCM_FLAGS) and obj["flags"] == KCM_FLAGS


def test_flagz_v1alpha1_is_deprecated() -> None:
    accept = "application/json;as=Flagz;v=v1alpha1;g=config.k8s.io"
    status, headers, body = flagz_response(flagz_component(":"), accept, pretty=True)
    assert status == 200
    assert headers["Warning"] == '299 - "This version of the flagz endpoint is deprecated. Please use a newer version."'
    assert body.startswith(b'{\n  "kind": "Flagz",\n  "apiVersion": "config.k8s.io/v1alpha1",\n  "metadata": {\n')
    assert json.loads(body)["flags"] == KCM_FLAGS


def test_flagz_without_flags_omits_them() -> None:
    obj = json.loads(flagz_response(flagz_component(":", {}), FLAGZ_V1BETA1)[2])
    assert obj == {"kind": "Flagz", "apiVersion": "config.k8s.io/v1beta1",
                   "metadata": {"name": "kube-controller-manager"}}


def test_flagz_yaml_quotes_as_go_yaml() -> None:
    status, headers, body = flagz_response(flagz_component(" "), "application/yaml;as=Flagz;v=v1beta1;g=config.k8s.io")
    assert (status, headers) == (200, {"Content-Type": "application/yaml;g=config.k8s.io;v=v1beta1;as=Flagz"})
    assert body.decode() == KCM_FLAGZ_YAML


def test_yaml_key_order_is_go_yamls() -> None:
    flags = {"a10": "x", "a9": "x", "b": "x", "a_b": "x", "aB": "x", "a-1": "x"}
    body = flagz_response(flagz_component(":", flags), "application/yaml;as=Flagz;v=v1beta1;g=config.k8s.io")[2]
    assert re.findall(r"\n  (\S+):", body.decode().split("\nkind:")[0]) == ["a-1", "a_b", "a9", "a10", "aB", "b"]


def test_each_endpoint_refuses_the_others_kind() -> None:
    assert flagz_response(flagz_component(":"), STATUSZ_V1BETA1) == (406, {"Content-Type": "application/json"},
                                                                     KCM_406_RAW.encode())
    assert statusz_response(KCM, FLAGZ_V1BETA1) == (406, {"Content-Type": "application/json"}, KCM_406_RAW.encode())


@pytest.mark.parametrize(("user_agent", "query", "pretty"), [
    ("curl/8.5.0", {}, True), ("Wget/1.21", {}, True), ("Mozilla/5.0 (X11)", {}, True), ("kubectl/v1.36.3", {}, False),
    ("pykcm-test", {"pretty": ["true"]}, True), ("pykcm-test", {"pretty": ["1"]}, True),
    ("pykcm-test", {"pretty": ["T"]}, True), ("pykcm-test", {"pretty": ["yes"]}, False),
    ("curl/8.5.0", {"pretty": ["false"]}, False), ("pykcm-test", {"pretty": [""]}, False),
    ("curl/8.5.0", {"pretty": [""]}, True), ("", {}, False),
])
def test_pretty_requested_as_the_apiserver(user_agent: str, query: dict[str, list[str]], pretty: bool) -> None:
    assert pretty_requested(user_agent, query) is pretty


def test_runtime_version_is_pythons() -> None:
    assert zpages.python_runtime_version() == f"python{platform.python_version()}"
    assert Component(name="p", start_time=START, binary_version="0").runtime_version.startswith("python3.")
