"""The real node's pieces that need no root: prerequisite messages, the images it imports, and
whose teardown may touch the machine (claims in a private runtime dir, host actions recorded)."""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

from pykcm.testenv import images, processes, realnode
from pykcm.testenv.build import Binaries
from pykcm.testenv.controlplane import ControlPlane
from pykcm.testenv.errors import ControlPlaneError


def test_without_root_a_real_node_is_refused_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(realnode.os, "geteuid", lambda: 1000)
    with pytest.raises(ControlPlaneError) as err:
        realnode.check_prerequisites()
    assert str(err.value) == "a real node needs root (containerd, mounts, network interfaces, iptables)"


def test_each_missing_debian_package_is_named_once(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(realnode.os, "geteuid", lambda: 0)
    monkeypatch.setattr(realnode, "cached_runc", lambda: False)
    absent = str(tmp_path / "absent")
    present = "/bin/sh"  # the others installed, whatever this machine has
    packages = [(pkg, absent if pkg in ("containerd", "libseccomp-dev") else present)
                for pkg, _ in (*realnode.RUNTIME_PACKAGES, *realnode.RUNC_BUILD_PACKAGES)]
    monkeypatch.setattr(realnode, "RUNTIME_PACKAGES", tuple(packages))
    monkeypatch.setattr(realnode, "RUNC_BUILD_PACKAGES", ())
    monkeypatch.setattr(realnode, "BUSYBOX", Path("/bin/sh"))  # present, but not static on Debian
    with pytest.raises(ControlPlaneError) as err:
        realnode.check_prerequisites()
    message = str(err.value)
    assert "\n" not in message
    assert message.endswith("apt-get install containerd libseccomp-dev busybox-static")


def test_node_images_are_docker_archives_of_one_busybox_layer(tmp_path: Path) -> None:
    fake_busybox = tmp_path / "busybox"
    fake_busybox.write_bytes(b"\x7fELF busybox")
    pause, tools = images.write_node_images(tmp_path / "out", busybox=fake_busybox)
    with tarfile.open(tools) as archive:
        manifest = json.load(archive.extractfile("manifest.json"))  # type: ignore[arg-type]
        (entry,) = manifest
        config = json.load(archive.extractfile(entry["Config"]))  # type: ignore[arg-type]
        layer = archive.extractfile(entry["Layers"][0]).read()  # type: ignore[union-attr]
    assert entry["RepoTags"] == [images.BUSYBOX_IMAGE]
    assert config["rootfs"]["diff_ids"] == [f"sha256:{hashlib.sha256(layer).hexdigest()}"]
    with tarfile.open(fileobj=io.BytesIO(layer)) as rootfs:
        assert rootfs.extractfile("bin/busybox").read() == b"\x7fELF busybox"  # type: ignore[union-attr]
        assert rootfs.getmember("bin/wget").linkname == "busybox"
        assert rootfs.getmember("tmp").isdir()
    with tarfile.open(pause) as archive:
        pause_config = json.load(archive.extractfile(json.load(archive.extractfile("manifest.json"))[0]["Config"]))  # type: ignore[arg-type]
    assert pause_config["config"]["Cmd"][0] == "/bin/sleep"  # the sandbox only has to block
    # The same files make the same image: a re-import is a no-op.
    again = images.write_node_images(tmp_path / "again", busybox=fake_busybox)[1]
    assert again.read_bytes() == tools.read_bytes()


class Machine:
    """The teardown's machine-wide actions, recorded instead of done; `running` are the PIDs of a
    real node's kubelet and shims that /proc would show."""

    def __init__(self, runtime: Path) -> None:
        self.runtime = runtime
        self.touched: list[str] = []
        self.running: set[int] = set()
        self.asked: list[Callable[[list[bytes]], bool]] = []

    def record(self, name: str, result: object) -> Callable[..., object]:
        def action(*_args: object, **_kwargs: object) -> object:
            self.touched.append(name)
            return result

        return action

    def process_trees(self, is_root: Callable[[list[bytes]], bool]) -> set[int]:
        self.asked.append(is_root)
        return self.running

    def claim(self, directory: Path) -> None:
        self.runtime.mkdir(exist_ok=True)
        (self.runtime / "owner").write_text(f"{directory}\n")


@pytest.fixture
def machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Machine:
    found = Machine(tmp_path / "run")
    monkeypatch.setattr(realnode, "RUNTIME_DIR", found.runtime)
    monkeypatch.setattr(realnode, "OWNER_FILE", found.runtime / "owner")
    monkeypatch.setattr(realnode, "KUBELET_ROOT", found.runtime / "kubelet")
    monkeypatch.setattr(realnode, "kill_trees", found.record("shims", 0))
    monkeypatch.setattr(processes, "process_trees", found.process_trees)
    monkeypatch.setattr(realnode.hostnet, "run", found.record("run", subprocess.CompletedProcess([], 0, "", "")))
    for name in ("unmount_all", "remove_interfaces", "remove_chains"):
        monkeypatch.setattr(realnode.hostnet, name, found.record(name, []))
    monkeypatch.setattr(realnode.hostnet, "restore_ip_forward", found.record("restore_ip_forward", None))
    return found


def _with_real_node(directory: Path) -> ControlPlane:
    """A stopped cluster in `directory` whose record says it had a real node."""
    directory.mkdir()
    state = {"ip_forward": "0", "chains": {"4": {}, "6": {}}, "kube_proxy": "/x/kube-proxy"}
    (directory / realnode.STATE_FILE).write_text(json.dumps(state))
    plane = ControlPlane(directory, Binaries(Path("/x/kube-apiserver"), Path("/x/etcd")),
                         {"etcd_client": 1, "etcd_peer": 2, "apiserver": 3})
    plane._save(running=False)
    return plane


def test_a_stale_directory_leaves_the_real_node_another_cluster_holds_alone(machine: Machine, tmp_path: Path) -> None:
    """The machine restarted (the claim in /run went), cluster B then took the real node: stopping A
    would have killed B's pods, unmounted its volumes and removed its chains and interface."""
    stale, holder = _with_real_node(tmp_path / "a"), _with_real_node(tmp_path / "b")
    machine.claim(holder.directory)
    said: list[str] = []
    realnode.teardown(stale, said.append)
    assert machine.touched == []
    assert said == [f"real node record of {stale.directory} dropped, the machine left alone: "
                    f"it holds the real node of the cluster in {holder.directory}"]
    assert not (stale.directory / realnode.STATE_FILE).exists()
    assert realnode.claimant() == holder.directory


def test_an_unclaimed_node_that_runs_is_left_alone(machine: Machine, tmp_path: Path) -> None:
    stale = _with_real_node(tmp_path / "a")
    machine.running = {4242, 4243}
    said: list[str] = []
    realnode.teardown(stale, said.append)
    assert machine.touched == []
    assert said == [f"real node record of {stale.directory} dropped, the machine left alone: "
                    "a real node runs on it without a claim (2 processes: kubelet, shims, pods)"]
    assert not (stale.directory / realnode.STATE_FILE).exists()
    [is_root] = machine.asked
    assert is_root([b"/x/kubelet", f"--root-dir={machine.runtime / 'kubelet'}".encode()])
    assert is_root([b"/usr/bin/containerd-shim-runc-v2", b"-address", f"{machine.runtime}/containerd.sock".encode()])
    assert not is_root([b"/usr/bin/kubelet", b"--root-dir=/var/lib/kubelet"])  # the host's own


class RunningKubelet:
    """This cluster's own kubelet, still running (stopped by the teardown, not signalled here)."""

    name = realnode.KUBELET
    stopped = False

    def alive(self) -> bool:
        return not self.stopped

    def stop(self, timeout: float = 0) -> None:
        self.stopped = True


@pytest.mark.parametrize("case", ["claimed", "unclaimed and idle", "unclaimed but its own node runs"])
def test_the_claimant_or_an_unclaimed_idle_machine_is_torn_down(machine: Machine, tmp_path: Path, case: str) -> None:
    """Its own claim, or none (a restarted machine) with no other node running: everything goes, as before."""
    plane = _with_real_node(tmp_path / "a")
    if case == "claimed":
        machine.claim(plane.directory)
    if case == "unclaimed but its own node runs":  # its claim lost (/run cleaned), its kubelet seen in /proc
        plane.processes[realnode.KUBELET] = RunningKubelet()  # type: ignore[assignment]
        machine.running = {4242}
    said: list[str] = []
    realnode.teardown(plane, said.append)
    assert {"shims", "run", "unmount_all", "remove_interfaces", "remove_chains", "restore_ip_forward"} <= set(
        machine.touched)
    assert said[-1].startswith(f"real node {realnode.NODE_NAME} removed: ")
    assert realnode.claimant() is None and not (machine.runtime / "owner").exists()
