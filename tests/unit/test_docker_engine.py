"""The private Docker engine's directory and stop (pykcm/testenv/docker.py), without a real engine:
its directory is pykcm's alone (anything else is refused before a thing in it is removed or
unmounted), dockerd is stopped before containerd (it stops its containers through it), and a tree
something is mounted in is removed without recursing into the mount (hostnet.remove_tree)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from pykcm.testenv import docker, hostnet, processes
from pykcm.testenv.errors import ControlPlaneError
from tests.support import CHECKOUT

NEEDS_ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (mounts, and the engine's prerequisite check)")


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """gobuild.cache_dir() under tmp_path: the shared cache is never touched."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    return tmp_path / "xdg" / "pykcm"


@pytest.fixture
def unmounted(tmp_path: Path):
    """Whatever a test mounted below tmp_path goes, even if it failed (or replaced unmount_all)."""
    unmount_all = hostnet.unmount_all
    yield
    unmount_all(tmp_path)


# ----- whose directory


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "victim"
    (victim / "run" / "results").mkdir(parents=True)
    (victim / "run" / "results" / "data.csv").write_text("precious\n")
    (victim / "notes.txt").write_text("mine\n")
    return victim


def _files(directory: Path) -> list[str]:
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*"))


def test_a_directory_with_other_things_in_it_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    victim = _victim(tmp_path)
    before = _files(victim)
    with pytest.raises(docker.DockerError) as refused:
        docker.claim_directory(victim)
    assert str(refused.value) == (f"{victim} is not empty and is no private Docker engine's directory (it has no "
                                  "pykcm-docker-engine file): pass a new or empty directory")
    assert _files(victim) == before


@NEEDS_ROOT
def test_testenv_image_refuses_such_a_directory_in_one_line_before_starting_anything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The review's reproduction: daemons that refuse to run, a --docker-dir with a run/ of the user's."""
    from pykcm.app import cli

    fakebin = tmp_path / "fakebin"
    fakebin.mkdir()
    for name in ("dockerd", "containerd", "docker", "debootstrap"):
        (fakebin / name).write_text(f"#!/bin/sh\necho 'fake {name}: refusing to run' >&2\nexit 1\n")
        (fakebin / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{fakebin}{os.pathsep}{os.environ['PATH']}")
    victim = _victim(tmp_path)
    before = _files(victim)
    assert cli.main(["testenv", "image", "--checkout", str(CHECKOUT), "--docker-dir", str(victim)]) == 1
    err = capsys.readouterr().err
    assert err == f"pykcm: error: {victim} is not empty and is no private Docker engine's directory (it has no " \
                  "pykcm-docker-engine file): pass a new or empty directory\n"
    assert _files(victim) == before  # run/results/data.csv too; no engine.lock, no logs


@pytest.mark.parametrize("path", ["/", "/var/lib/docker", "/var/lib/docker/pykcm", "/var/lib", "/var/lib/containerd",
                                  "/run", "/var/run/docker", "/etc/containerd"])
def test_the_root_and_a_system_dockers_paths_are_refused(path: str) -> None:
    with pytest.raises(docker.DockerError, match="a system docker's or containerd's; pass a directory of its own"):
        docker.claim_directory(Path(path).resolve())


def test_the_system_dockers_configured_data_root_is_refused(tmp_path: Path, monkeypatch) -> None:
    config = tmp_path / "daemon.json"
    config.write_text(json.dumps({"data-root": str(tmp_path / "docker-data")}))
    monkeypatch.setattr(docker, "_DOCKER_CONFIG", config)
    marked = tmp_path / "docker-data" / "engine"
    marked.mkdir(parents=True)
    (marked / docker.MARKER).write_text("")  # even marked: the system docker's own comes first
    with pytest.raises(docker.DockerError, match=f"inside {tmp_path / 'docker-data'}, a system docker's"):
        docker.claim_directory(marked)
    docker.claim_directory(tmp_path / "elsewhere")  # beside it is fine


def test_a_new_or_empty_directory_is_taken_and_marked(tmp_path: Path) -> None:
    new, empty = tmp_path / "a" / "new", tmp_path / "empty"
    empty.mkdir()
    for directory in (new, empty):
        docker.claim_directory(directory)
        assert (directory / docker.MARKER).is_file()
        docker.claim_directory(directory)  # marked: again, and with things of its own in it
        (directory / "data").mkdir(exist_ok=True)
        (directory / "something").write_text("")
        docker.claim_directory(directory)


def test_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(docker.DockerError, match="is not a directory"):
        docker.claim_directory(tmp_path / "file")


def test_an_engine_directory_of_an_earlier_pykcm_keeps_working(tmp_path: Path) -> None:
    earlier = tmp_path / "engine"
    for sub in ("data/overlay2", "containerd", "logs", "run"):
        (earlier / sub).mkdir(parents=True)
    (earlier / "engine.lock").write_text("")
    docker.claim_directory(earlier)
    assert (earlier / docker.MARKER).is_file() and (earlier / "data/overlay2").is_dir()


def test_the_default_directories_in_the_pykcm_cache_are_pykcms(private_cache: Path) -> None:
    for purpose in ("", "kind"):
        directory = docker.default_directory(purpose)
        assert directory == private_cache / (f"docker-{purpose}" if purpose else "docker")
        directory.mkdir(parents=True)
        (directory / "left by something").write_text("")
        docker.claim_directory(directory.resolve())
        assert (directory / docker.MARKER).is_file()


# ----- stopping: dockerd first


DAEMON = """#!/bin/sh
trap 'sleep {delay}; echo "{name} stopped" >> "{events}"; exit 0' TERM
echo "{name} up" >> "{events}"
while :; do sleep 0.05; done
"""


def _fake_daemons(tmp_path: Path) -> tuple[list[processes.ManagedProcess], Path]:
    """A dockerd that takes a while to stop (its containers) and a containerd that stops at once."""
    events = tmp_path / "events"
    procs = []
    for name, delay in (("dockerd", 0.5), ("containerd", 0)):
        script = tmp_path / f"fake-{name}"
        script.write_text(DAEMON.format(name=name, delay=delay, events=events))
        script.chmod(0o755)
        procs.append(processes.spawn(name, [str(script)], tmp_path / "logs"))
    deadline = time.monotonic() + 10
    while len(events.read_text().splitlines() if events.exists() else []) < 2:
        assert time.monotonic() < deadline, "the fake daemons did not start"
        time.sleep(0.05)
    return procs, events


def _stopped(events: Path) -> list[str]:
    return [line for line in events.read_text().splitlines() if line.endswith(" stopped")]


def test_stop_waits_for_dockerd_before_it_stops_containerd(tmp_path: Path) -> None:
    procs, events = _fake_daemons(tmp_path)
    engine = docker.DockerEngine(tmp_path, procs)
    try:
        engine.stop()
    finally:
        processes.stop_all(procs, timeout=1)
    assert _stopped(events) == ["dockerd stopped", "containerd stopped"]
    assert not any(proc.alive() for proc in procs)


def test_an_engine_left_behind_is_stopped_dockerd_first_too(tmp_path: Path) -> None:
    procs, events = _fake_daemons(tmp_path)
    try:
        # Recorded containerd first, as a run killed before dockerd started would leave it.
        docker._save_state(docker.DockerEngine(tmp_path, procs[::-1]))
        said: list[str] = []
        docker._stop_leftovers(tmp_path, said.append)
    finally:
        processes.stop_all(procs, timeout=1)
    assert _stopped(events) == ["dockerd stopped", "containerd stopped"]
    assert said and "left running" in said[0]
    assert not docker._state_file(tmp_path).exists()


def test_dockerd_kills_stubborn_containers_before_we_stop_waiting_for_it(tmp_path: Path, monkeypatch) -> None:
    # dockerd's own default, 15 s for its containers, was our whole wait: a container ignoring SIGTERM
    # left dockerd SIGKILLed with its shim, mounts and cgroups behind.
    argv: list[str] = []

    def spawn(name: str, args: list[str], logs: Path) -> None:
        argv.extend(args)
        raise docker.DockerError("stop here")

    monkeypatch.setattr(docker, "spawn", spawn)
    engine = docker.DockerEngine(tmp_path, [])
    with pytest.raises(docker.DockerError, match="stop here"):
        docker._start_dockerd(tmp_path, tmp_path / "run", engine)
    timeout = next(int(a.split("=")[1]) for a in argv if a.startswith("--shutdown-timeout="))
    assert timeout + 10 <= docker.DOCKERD_STOP_WAIT


# ----- removing what something may have mounted into


def test_a_tree_without_mounts_is_removed_and_a_missing_one_is_nothing(tmp_path: Path) -> None:
    (tmp_path / "tree" / "a").mkdir(parents=True)
    hostnet.remove_tree(tmp_path / "tree")
    hostnet.remove_tree(tmp_path / "tree")
    assert not (tmp_path / "tree").exists()


def test_a_symlink_is_removed_not_its_target(tmp_path: Path) -> None:
    (tmp_path / "target").mkdir()
    (tmp_path / "target" / "kept").write_text("")
    (tmp_path / "link").symlink_to(tmp_path / "target")
    hostnet.remove_tree(tmp_path / "link")
    assert not (tmp_path / "link").is_symlink() and (tmp_path / "target" / "kept").exists()


def bind_mounted_tree(tmp_path: Path) -> tuple[Path, Path]:
    """A directory `kept` holding a file, bind-mounted at `tree`/mnt; returns (kept, tree)."""
    kept = tmp_path / "host-dir"
    kept.mkdir()
    (kept / "file").write_text("not the tree's\n")
    tree = tmp_path / "tree"
    (tree / "mnt").mkdir(parents=True)
    subprocess.run(["mount", "--bind", str(kept), str(tree / "mnt")], check=True)
    return kept, tree


@NEEDS_ROOT
@pytest.mark.skipif(shutil.which("mount") is None, reason="no mount(8) on this machine")
def test_a_bind_mount_below_is_unmounted_first_and_what_it_shows_is_kept(tmp_path: Path, unmounted) -> None:
    kept, tree = bind_mounted_tree(tmp_path)
    hostnet.remove_tree(tree)
    assert not tree.exists() and (kept / "file").read_text() == "not the tree's\n"
    assert hostnet.mounts_under(tmp_path) == []


@NEEDS_ROOT
@pytest.mark.skipif(shutil.which("mount") is None, reason="no mount(8) on this machine")
def test_a_mount_that_stays_is_never_recursed_into(tmp_path: Path, monkeypatch, unmounted) -> None:
    kept, tree = bind_mounted_tree(tmp_path)
    monkeypatch.setattr(hostnet, "unmount_all", lambda *roots: [])  # as an umount that fails
    with pytest.raises(ControlPlaneError, match=f"{tree / 'mnt'} is still mounted: not removing {tree}"):
        hostnet.remove_tree(tree)
    assert (kept / "file").read_text() == "not the tree's\n"
