"""A local cluster's directory (pykcm/testenv/cluster.py, controlplane.py, certs.py), without Kubernetes
binaries: one start or stop at a time, every process recorded as soon as it is spawned, no one
else's files written over, a malformed state file said in one line, and a serving certificate
that names the addresses the apiserver is probed at."""

from __future__ import annotations

import fcntl
import json
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from pykcm.testenv import cluster, controlplane, processes
from pykcm.testenv.build import Binaries
from pykcm.testenv.certs import ensure_pki
from pykcm.testenv.controlplane import STATE_FILE, ControlPlane
from pykcm.testenv.errors import BuildError, ControlPlaneError
from pykcm.testenv.processes import ManagedProcess

ROOT = Path(__file__).parents[2]


class NotBuilt(BuildError):
    """What the tests' ensure_binaries raises: a start that got this far was not refused."""


@pytest.fixture
def unbuilt(monkeypatch: pytest.MonkeyPatch) -> None:
    def ensure_binaries(**_kwargs: object) -> Binaries:
        raise NotBuilt("reached the build")

    monkeypatch.setattr(cluster, "ensure_binaries", ensure_binaries)


def _stopped_state(directory: Path) -> None:
    plane = ControlPlane(directory, Binaries(Path("/x/kube-apiserver"), Path("/x/etcd")), _ports())
    plane._save(running=False)


def _ports() -> dict[str, int]:
    return {"etcd_client": 1, "etcd_peer": 2, "apiserver": 3}


@pytest.fixture
def held(tmp_path: Path) -> Iterator[Path]:
    """tmp_path's lock, held as another start or stop would hold it."""
    with open(tmp_path / cluster.LOCK_FILE, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield tmp_path


# ----- one start or stop at a time (finding #2)


def test_a_start_or_stop_of_a_directory_in_use_fails_at_once_in_one_line(held: Path, unbuilt: None) -> None:
    _stopped_state(held)
    for action in (cluster.start, cluster.stop):
        started = time.monotonic()
        with pytest.raises(cluster.DirectoryBusy) as err:
            action(held)
        assert str(err.value) == f"another testenv start or stop is using {held}"
        assert time.monotonic() - started < 1.0
    assert json.loads((held / STATE_FILE).read_text())["processes"] == {}  # nothing written over


def test_etcd_is_recorded_before_the_start_waits_for_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plane = ControlPlane(tmp_path, Binaries(Path("/x/kube-apiserver"), Path("/x/etcd")), _ports())
    fake = ManagedProcess("etcd", 4242, 777, tmp_path / "logs" / "etcd.log")
    monkeypatch.setattr(controlplane, "spawn", lambda *_args: fake)
    recorded: list[dict] = []

    def wait_ready(*_args: object) -> None:
        recorded.append(json.loads((tmp_path / STATE_FILE).read_text())["processes"])
        raise ControlPlaneError("etcd was not ready")  # what a SIGKILL here would leave: the state file

    monkeypatch.setattr(controlplane, "wait_ready", wait_ready)
    with pytest.raises(ControlPlaneError):
        plane._start_etcd()
    assert recorded == [{"etcd": fake.to_json()}]


STARTER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from pykcm.testenv.cluster import start
    start(Path(sys.argv[1]), log=print)
""")


@pytest.fixture
def fake_assets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """KUBEBUILDER_ASSETS whose etcd never gets healthy (it writes its PID beside them) and an apiserver."""
    assets = tmp_path / "assets"
    assets.mkdir()
    for name in ("etcd", "kube-apiserver"):
        (assets / name).write_text(f"#!/bin/sh\necho $$ > {assets}/{name}.pid\nexec sleep 60\n")
        (assets / name).chmod(0o755)
    monkeypatch.setenv("KUBEBUILDER_ASSETS", str(assets))
    return assets


def test_a_start_killed_while_it_waits_for_etcd_leaves_etcd_to_stop_and_no_one_else_in_meanwhile(
    tmp_path: Path, fake_assets: Path
) -> None:
    directory = tmp_path / "env"
    starter = subprocess.Popen([sys.executable, "-c", STARTER, str(directory)], cwd=ROOT, stdout=subprocess.DEVNULL)
    pid_file = fake_assets / "etcd.pid"
    etcd: ManagedProcess | None = None
    try:
        deadline = time.monotonic() + 30
        while not (pid_file.exists() and pid_file.read_text().strip()) and time.monotonic() < deadline:
            time.sleep(0.05)
        pid = int(pid_file.read_text())
        etcd = ManagedProcess("etcd", pid, processes._proc_stat(pid)[1], Path("etcd.log"))  # type: ignore[index]
        with pytest.raises(cluster.DirectoryBusy):  # the start waits for etcd, holding the directory
            cluster.start(directory)
        with pytest.raises(cluster.DirectoryBusy):
            cluster.stop(directory)
        starter.kill()  # SIGKILL: no cleanup of its own
        starter.wait()
        assert etcd.alive()
        cluster.stop(directory, timeout=5.0)  # was: "no control plane state", etcd left running
        assert not etcd.alive()
    finally:
        starter.kill()
        starter.wait()
        if etcd is not None:
            etcd.kill()


# ----- no one else's files written over (finding #9)


def test_a_directory_of_someone_elses_files_is_refused_in_one_line(tmp_path: Path, unbuilt: None) -> None:
    (tmp_path / "pki").mkdir()
    (tmp_path / "pki" / "ca.key").write_text("my precious CA key")
    (tmp_path / "kubeconfig").write_text("my kubeconfig")
    with pytest.raises(ControlPlaneError) as err:
        cluster.start(tmp_path)
    assert str(err.value) == (
        f"{tmp_path} holds kubeconfig, pki but no {STATE_FILE}, so it is not a testenv directory: "
        "refusing to write over them; use a new or empty directory"
    )
    assert (tmp_path / "pki" / "ca.key").read_text() == "my precious CA key"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kubeconfig", "pki"]  # not even a lock file


@pytest.mark.parametrize("present", [[], ["audit/audit-policy.yaml"], [STATE_FILE, "pki/ca.key", "etcd/x"]])
def test_a_new_or_testenv_directory_or_one_with_unrelated_files_is_started(
    tmp_path: Path, unbuilt: None, present: list[str]
) -> None:
    """Unrelated files: the tests' audit policy (tests/faults.py) is written there before the start."""
    for name in present:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("{}")
    with pytest.raises(NotBuilt):
        cluster.start(tmp_path / "new" if not present else tmp_path)


# ----- a malformed state file (finding #10)


@pytest.mark.parametrize("text", ["{}", "[]", "null", '"x"', "entry-without-start-time"])
def test_a_malformed_state_file_is_one_line_and_a_start_may_reuse_its_directory(
    tmp_path: Path, unbuilt: None, text: str
) -> None:
    if text == "entry-without-start-time":
        _stopped_state(tmp_path)
        state = json.loads((tmp_path / STATE_FILE).read_text())
        state["processes"] = {"etcd": {"pid": 1, "log": "etcd.log"}}
        text = json.dumps(state)
    (tmp_path / STATE_FILE).write_text(text)
    for action in (cluster.stop, ControlPlane.from_state):
        with pytest.raises(ControlPlaneError) as err:
            action(tmp_path)
        message = str(err.value)
        assert message.startswith(f"unreadable control plane state {tmp_path / STATE_FILE}: ") and "\n" not in message
    with pytest.raises(NotBuilt):  # not refused as running, nor as someone else's
        cluster.start(tmp_path)


# ----- the apiserver's serving certificate (finding #7)


def _ips(cert: Path) -> set[str]:
    sans = x509.load_pem_x509_certificate(cert.read_bytes()).extensions.get_extension_for_class(
        x509.SubjectAlternativeName
    )
    return {str(ip) for ip in sans.value.get_values_for_type(x509.IPAddress)}


def test_a_kept_serving_cert_lacking_an_address_is_reissued_by_the_same_ca(tmp_path: Path) -> None:
    pki = ensure_pki(tmp_path)
    assert _ips(pki.apiserver_cert) == {"127.0.0.1", "10.0.0.1"}
    ca, admin = pki.ca_cert.read_bytes(), pki.admin_cert.read_bytes()
    ensure_pki(tmp_path, extra_ips=("10.200.0.1",))  # the same directory started with --real-node
    assert _ips(pki.apiserver_cert) == {"127.0.0.1", "10.0.0.1", "10.200.0.1"}
    assert pki.ca_cert.read_bytes() == ca and pki.admin_cert.read_bytes() == admin
    serving = x509.load_pem_x509_certificate(pki.apiserver_cert.read_bytes())
    serving.verify_directly_issued_by(x509.load_pem_x509_certificate(ca))
    key = serialization.load_pem_private_key(pki.apiserver_key.read_bytes(), None)
    assert key.public_key().public_numbers() == serving.public_key().public_numbers()  # type: ignore[union-attr]
    reissued = pki.apiserver_cert.read_bytes()
    ensure_pki(tmp_path, extra_ips=("127.0.0.1",))  # started without it again: kept, addresses and all
    ensure_pki(tmp_path, extra_ips=("10.200.0.1",))
    assert pki.apiserver_cert.read_bytes() == reissued

