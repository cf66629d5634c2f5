"""The real node's pieces that need no root: prerequisite messages and the images it imports."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest

from pykcm.testenv import images, realnode
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
