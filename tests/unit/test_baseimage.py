"""Where the local base image's Debian packages come from (the mirror apt on this machine uses), and
what an interrupted debootstrap leaves behind: nothing, and nothing of the host's removed."""

import os
import shutil
from pathlib import Path

import pytest

from pykcm.testenv import baseimage, hostnet, progress
from pykcm.testenv.baseimage import DEFAULT_MIRROR, debian_mirror

DEB822 = """Types: deb
URIs: http://mirror.example/debian-security
Suites: bookworm-security
Components: main

Types: deb
URIs: http://mirror.example/debian
Suites: bookworm bookworm-updates
Components: main
"""


def test_the_main_suite_of_a_deb822_source_wins_over_security(tmp_path: Path):
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d" / "debian.sources").write_text(DEB822)
    assert debian_mirror(tmp_path) == "http://mirror.example/debian"


def test_one_line_sources_with_options_are_read(tmp_path: Path):
    (tmp_path / "sources.list").write_text(
        "# comment\ndeb [signed-by=/k.gpg] http://other.example/debian bookworm main\n"
    )
    assert debian_mirror(tmp_path) == "http://other.example/debian"


def test_without_sources_debian_itself(tmp_path: Path):
    assert debian_mirror(tmp_path) == DEFAULT_MIRROR


# ----- an interrupted debootstrap (a fake one: debootstrap never runs here)

FAKE_DEBOOTSTRAP = """#!/bin/sh
# Called as debootstrap --variant=minbase --include=... SUITE TARGET MIRROR; mounts as the real one does.
target="$4"
mkdir -p "$target/proc" "$target/host"
if [ -n "$FAKE_MOUNT" ]; then
  mount -t tmpfs pykcm-test-proc "$target/proc"
  mount --bind "$FAKE_MOUNT" "$target/host"
fi
# The real one's exit traps unmount; this one's only say that they ran (and only after a while).
trap 'sleep 0.3; echo "traps ran" > "$FAKE_EVENTS"; exit 143' TERM
touch "$FAKE_READY"
while :; do sleep 0.05; done
"""


@pytest.fixture
def fake_debootstrap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A fake debootstrap first on PATH; progress lines every 0.1 s; mounts below tmp_path undone after."""
    fakebin = tmp_path / "fakebin"
    fakebin.mkdir()
    (fakebin / "debootstrap").write_text(FAKE_DEBOOTSTRAP)
    (fakebin / "debootstrap").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fakebin}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_EVENTS", str(tmp_path / "events"))
    monkeypatch.setenv("FAKE_READY", str(tmp_path / "ready"))
    monkeypatch.setattr(progress, "PROGRESS_EVERY", 0.1)
    yield tmp_path / "events"
    hostnet.unmount_all(tmp_path)


def _interrupted_debootstrap(tmp_path: Path) -> Path:
    """Run _debootstrap_tarball and ^C it (as a KeyboardInterrupt) once the fake is under way."""
    images = tmp_path / "cache" / "images"

    def log(line: str) -> None:
        if line.startswith("  debootstrap:") and (tmp_path / "ready").exists():
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        baseimage._debootstrap_tarball(images / "debian.tar", "http://mirror.invalid/debian", ("python3",), log, None)
    return images


def test_an_interrupted_debootstrap_gets_sigterm_and_its_traps_are_waited_for(tmp_path: Path, fake_debootstrap):
    images = _interrupted_debootstrap(tmp_path)
    assert fake_debootstrap.read_text() == "traps ran\n"  # not SIGKILLed; and waited for
    assert [p.name for p in images.iterdir()] == ["debian.debootstrap.log"]  # no .rootfs-* left


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (the fake debootstrap mounts a tmpfs and a bind mount)")
@pytest.mark.skipif(shutil.which("mount") is None, reason="no mount(8) on this machine")
def test_what_an_interrupted_debootstrap_left_mounted_is_unmounted_not_removed_through(tmp_path: Path,
                                                                                       monkeypatch, fake_debootstrap):
    """The fake's traps do not unmount (as when they could not run): the cleanup must, before it
    removes the temp dir, or it deletes what the mounts show (here a directory of the host's)."""
    host = tmp_path / "host-dir"
    host.mkdir()
    (host / "file").write_text("the host's\n")
    monkeypatch.setenv("FAKE_MOUNT", str(host))
    images = _interrupted_debootstrap(tmp_path)
    assert hostnet.mounts_under(tmp_path) == []
    assert (host / "file").read_text() == "the host's\n"
    assert [p.name for p in images.iterdir()] == ["debian.debootstrap.log"]
