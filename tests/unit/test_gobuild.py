"""Go builds: made once however many runs want them, and failures the user can act on, in one line."""

from __future__ import annotations

import fcntl
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from pykcm.testenv import gobuild, progress
from pykcm.testenv.errors import BuildError
from pykcm.testenv.gobuild import built_once, locked, run_go


def test_a_go_build_without_the_module_proxy_names_it_and_the_fix(tmp_path: Path) -> None:
    offline = ('echo "go: github.com/coredns/coredns@v1.14.2: Get \\"https://proxy.golang.org/...\\": '
               'dial tcp: lookup proxy.golang.org: no such host"; exit 1')
    with pytest.raises(BuildError) as err:
        run_go(["sh", "-c", offline], what="coredns", cwd=tmp_path, temp=tmp_path, log_path=tmp_path / "log",
               log=lambda _: None)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("the Go module proxy is not reachable (give this machine access to it, or set "
                              "GOPROXY to a mirror): building coredns failed (exit 1): ")
    with pytest.raises(BuildError) as other:
        run_go(["sh", "-c", "echo 'x.go:1: undefined: y'; exit 2"], what="x", cwd=tmp_path, temp=tmp_path,
               log_path=tmp_path / "log2", log=lambda _: None)
    assert str(other.value).startswith("building x failed (exit 2): x.go:1: undefined: y")


def test_a_binary_is_built_once_by_concurrent_callers_and_not_again(tmp_path: Path) -> None:
    binary = tmp_path / "tools" / "thing-v1" / "thing"
    builds: list[Path] = []

    def build(target: Path) -> None:
        builds.append(target)
        time.sleep(0.2)  # the other callers arrive while this one holds the lock
        target.mkdir(parents=True)
        binary.write_text("#!/bin/sh\n")
        binary.chmod(0o755)

    results: list[Path] = []
    callers = [threading.Thread(target=lambda: results.append(built_once(binary, build))) for _ in range(3)]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join()
    assert results == [binary] * 3
    assert builds == [binary.parent]
    assert built_once(binary, build) == binary and len(builds) == 1


def test_a_failed_build_leaves_nothing_and_is_tried_again(tmp_path: Path) -> None:
    binary = tmp_path / "thing-v1" / "thing"

    def failing(target: Path) -> None:
        raise BuildError("building thing failed (exit 1)")

    with pytest.raises(BuildError):
        built_once(binary, failing)
    with pytest.raises(BuildError):  # not remembered as built
        built_once(binary, failing)
    assert not binary.exists()


def _held_for(lock: Path, seconds: float, finish: Callable[[], object] = lambda: None) -> threading.Thread:
    """Another process's build: `lock` taken now (by another open file, as flock counts them), and
    let go `seconds` later, after `finish()`."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    holder = open(lock, "w")  # noqa: SIM115 - closed by the thread
    fcntl.flock(holder, fcntl.LOCK_EX)

    def release() -> None:
        time.sleep(seconds)
        finish()
        holder.close()

    thread = threading.Thread(target=release)
    thread.start()
    return thread


def test_waiting_for_another_process_building_says_so_and_again_every_progress_interval(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(progress, "PROGRESS_EVERY", 0.2)
    monkeypatch.setattr(gobuild, "LOCK_POLL", 0.01)
    lock = tmp_path / "controlplane" / "v1.36.3.lock"
    holder = _held_for(lock, 0.5)
    (lock.parent / "v1.36.3.build.log").write_text("k8s.io/api/core/v1\n")  # the other build's
    said: list[str] = []
    with locked(lock, what="kube-apiserver, etcd", log=said.append):
        assert not holder.is_alive()  # it got the lock only once the other let go
    holder.join()
    log = lock.parent / "v1.36.3.build.log"
    assert said[0] == f"waiting for another process building kube-apiserver, etcd (log: {log})"
    assert 1 <= len(said) - 1 <= 3  # about every 0.2 s of the 0.5 s
    assert all(line.startswith("  waiting for another process building kube-apiserver, etcd: ") and
               line.endswith(f"s elapsed (log: {log})") for line in said[1:])
    said.clear()
    with locked(lock, log=said.append):  # not busy: not a word
        pass
    assert said == []


def test_a_binary_built_by_another_process_is_waited_for_by_name_and_not_built_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gobuild, "LOCK_POLL", 0.01)
    binary = tmp_path / "tools" / "kwok-v0.8.0" / "kwok"

    def other_build() -> None:
        binary.parent.mkdir(parents=True)
        binary.write_text("#!/bin/sh\n")
        binary.chmod(0o755)

    holder = _held_for(tmp_path / "tools" / "kwok-v0.8.0.lock", 0.2, other_build)
    said: list[str] = []

    def build(target: Path) -> None:
        raise AssertionError("built again")

    assert built_once(binary, build, log=said.append) == binary
    holder.join()
    assert said == [f"waiting for another process building kwok (lock: {tmp_path / 'tools' / 'kwok-v0.8.0.lock'})"]


@pytest.mark.parametrize("content", [b"", b"\0" * 4096])
def test_a_binary_a_crash_left_empty_is_built_again(tmp_path: Path, content: bytes) -> None:
    """Published without fsync, a binary can be empty (or zero-filled) after a machine crash: it must
    not be trusted for ever."""
    binary = tmp_path / "tools" / "kwok-v0.8.0" / "kwok"
    binary.parent.mkdir(parents=True)
    binary.write_bytes(content)
    binary.chmod(0o755)
    builds: list[Path] = []

    def build(target: Path) -> None:
        builds.append(target)
        binary.write_text("#!/bin/sh\n")

    assert built_once(binary, build) == binary
    assert builds == [binary.parent]
    assert built_once(binary, build) == binary and len(builds) == 1  # now good: not built again


def _synced(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, ...]]:
    """fsync and rename calls, in order, by path (still done)."""
    events: list[tuple[str, ...]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(src: str | Path, dst: str | Path) -> None:
        events.append(("replace", str(src), str(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    return events


def test_a_published_build_reaches_the_disk_before_its_name_and_its_name_before_the_return(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    built = tmp_path / ".build-x" / "bin"
    built.mkdir(parents=True)
    (built / "kwok").write_text("#!/bin/sh\n")
    broken = tmp_path / "kwok-v0.8.0"
    broken.mkdir()
    (broken / "kwok").write_bytes(b"")  # a directory is published over a broken build
    events = _synced(monkeypatch)
    gobuild.publish(built, broken)
    assert events == [("fsync", str(built / "kwok")), ("fsync", str(built)), ("replace", str(built), str(broken)),
                      ("fsync", str(tmp_path))]
    assert (broken / "kwok").read_text() == "#!/bin/sh\n"
    events.clear()
    (tmp_path / "new").write_text("x")
    gobuild.publish(tmp_path / "new", broken / "kwok")
    assert events == [("fsync", str(tmp_path / "new")), ("replace", str(tmp_path / "new"), str(broken / "kwok")),
                      ("fsync", str(broken))]
