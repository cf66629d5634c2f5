"""kwok's inputs that need no cluster: node manifests, address arithmetic, the Stages file."""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path

import pytest
import yaml

from pykcm.testenv.build import KUBERNETES_VERSION
from pykcm.testenv.kwok import (
    MAX_NODES,
    NODE_CIDR_PREFIX,
    POD_CIDR,
    STAGES_FILE,
    ControlPlaneError,
    ManagedProcess,
    check_stages,
    kwok_argv,
    last_error,
    node_ip,
    node_manifest,
    node_pod_cidr,
)


def test_each_node_gets_its_own_slash_25_of_the_pod_cidr() -> None:
    assert [node_pod_cidr(i) for i in (0, 1, 2, 511, 512, MAX_NODES - 1)] == [
        "10.240.0.0/25",
        "10.240.0.128/25",
        "10.240.1.0/25",
        "10.240.255.128/25",
        "10.241.0.0/25",
        "10.255.255.128/25",
    ]
    cidrs = {ipaddress.ip_network(node_pod_cidr(i)) for i in range(MAX_NODES)}
    assert len(cidrs) == MAX_NODES and all(c.subnet_of(POD_CIDR) for c in cidrs)  # type: ignore[arg-type]
    # The scale tests' 5,000 nodes fit, and 150,000 pods: by node capacity (110 each) and by fake IPs.
    assert MAX_NODES >= 5000 and MAX_NODES * 110 >= 150_000 and POD_CIDR.num_addresses >= 150_000
    assert 2 ** (32 - NODE_CIDR_PREFIX) - 2 >= 110  # a node's podCIDR holds its capacity
    with pytest.raises(ValueError, match=r"outside 0\.\.8191"):
        node_pod_cidr(MAX_NODES)


def test_node_ips_are_distinct_loopback_addresses() -> None:
    ips = [ipaddress.ip_address(node_ip(i)) for i in range(MAX_NODES)]
    assert str(ips[0]) == "127.1.0.1"
    assert len(set(ips)) == MAX_NODES and all(ip.is_loopback for ip in ips)


def test_node_manifest_is_a_registered_kubelet_node_for_kwok() -> None:
    node = node_manifest("kwok-node-7", 7, labels={"zone": "a"})

    meta, spec, status = node["metadata"], node["spec"], node["status"]
    assert meta["annotations"] == {"kwok.x-k8s.io/node": "fake"}
    assert meta["labels"] == {
        "kubernetes.io/hostname": "kwok-node-7",
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "kwok.x-k8s.io/node": "fake",
        "zone": "a",
    }
    assert spec == {"podCIDR": "10.240.3.128/25", "podCIDRs": ["10.240.3.128/25"]}
    assert status["allocatable"] == status["capacity"]
    capacity = {k: status["capacity"][k] for k in ("pods", "cpu", "memory")}
    assert capacity == {"pods": "110", "cpu": "32", "memory": "256Gi"}
    assert "ephemeral-storage" in status["capacity"]
    assert status["addresses"] == [
        {"type": "InternalIP", "address": "127.1.0.8"},
        {"type": "Hostname", "address": "kwok-node-7"},
    ]
    assert status["nodeInfo"]["kubeletVersion"] == KUBERNETES_VERSION


def test_shipped_stages_pass_the_check_and_follow_the_kubernetes_version() -> None:
    stages = list(yaml.safe_load_all(STAGES_FILE.read_text()))
    assert [s["metadata"]["name"] for s in stages] == [
        "node-initialize",
        "node-heartbeat",
        "pod-ready",
        "pod-complete",
        "pod-delete",
    ]
    assert all(s["apiVersion"] == "kwok.x-k8s.io/v1alpha1" and s["kind"] == "Stage" for s in stages)
    check_stages(STAGES_FILE)
    assert f'"{KUBERNETES_VERSION}"' in STAGES_FILE.read_text()


@pytest.mark.parametrize(
    ("mutate", "problem"),
    [
        (lambda spec: spec.update(selecor=spec.pop("selector")), "unknown field spec.selecor"),
        (lambda spec: spec["selector"].update(matchExpresions=[]), "unknown field spec.selector.matchExpresions"),
        (lambda spec: spec["steps"][0].update(deleted=True), r"unknown field spec.steps\[0\].deleted"),
        (lambda spec: spec.pop("selector"), "no spec.selector"),
    ],
)
def test_check_stages_refuses_what_kwok_would_silently_ignore(tmp_path: Path, mutate, problem: str) -> None:
    stages = list(yaml.safe_load_all(STAGES_FILE.read_text()))
    mutate(stages[2]["spec"])
    path = tmp_path / "stages.yaml"
    path.write_text(yaml.safe_dump_all(stages))

    with pytest.raises(ControlPlaneError, match=f"stage 'pod-ready' .*{problem}") as err:
        check_stages(path)
    assert "\n" not in str(err.value)


def test_kwok_listens_on_loopback_only_and_manages_annotated_nodes() -> None:
    argv = kwok_argv(Path("/bin/kwok"), Path("/kc"), Path("/stages.yaml"), Path("/wd"), 4321, "WARN", 40)

    assert argv[1:3] == ["KWOK_WORKDIR=/wd", "/bin/kwok"]
    assert "--server-address=127.0.0.1:4321" in argv
    assert "--node-port" not in " ".join(argv)  # a node port would also listen on 0.0.0.0
    assert {"--manage-all-nodes=false", "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake"} <= set(argv)
    assert "--cidr=10.240.0.0/12" in argv and "--node-lease-duration-seconds=40" in argv


def test_last_error_reads_kwoks_json_log(tmp_path: Path) -> None:
    log = tmp_path / "kwok.log"
    error = {"level": "ERROR", "msg": "failed to apply stage", "err": "boom", "stage": "pod-ready"}
    lines = ["===== pykcm testenv: starting now: kwok", "  -v, --v log-level  usage", json.dumps(error)]
    log.write_text("\n".join([*lines, json.dumps({"level": "INFO", "msg": "Patch pod"})]) + "\n")
    proc = ManagedProcess("kwok", 0, 0, log)

    assert last_error(proc) == "failed to apply stage: boom (stage pod-ready)"
    log.write_text("\n".join([*lines[:2], "panic: oops"]) + "\n")
    assert last_error(proc) == "panic: oops"
