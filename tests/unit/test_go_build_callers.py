"""Every Go build of the local cluster (the control plane, e2e.test, agnhost, `go install`ed tools),
run with a fake `go`: Go's work directory stays inside the build's own directory, so that nothing is
left behind however the build ends; the binary is on disk before it is published; and a run that
waits for another's build says so on its log."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from pykcm.testenv import build, e2e, gobuild, progress, testimages
from tests.unit.test_buildcache import fake_go_binary
from tests.unit.test_gobuild import _held_for, _synced

# Starts as Go does, with a work directory in $GOTMPDIR (else $TMPDIR), recorded; then either never
# ends (FAKE_GO_MODE=hang: a build to interrupt) or writes $FAKE_BINARY where `-o` or GOBIN says.
FAKE_GO = """#!/bin/sh
work=$(mktemp -d "${GOTMPDIR:-$TMPDIR}/go-buildXXXXXX")
echo "$work" >> "$FAKE_GO_RECORD"
[ "$FAKE_GO_MODE" = hang ] && exec sleep 60
out=""; prev=""; last=""
for arg in "$@"; do [ "$prev" = -o ] && out=$arg; prev=$arg; last=$arg; done
if [ "$1" = install ]; then name=${last%@*}; out="$GOBIN/${name##*/}"; fi
case "$out" in
  "") ;;
  */) mkdir -p "$out"; for arg in "$@"; do case "$arg" in ./*) cp "$FAKE_BINARY" "$out${arg#./}";; esac; done ;;
  *) mkdir -p "$(dirname "$out")"; cp "$FAKE_BINARY" "$out" ;;
esac
rm -r "$work"
"""


class Interrupted(Exception):
    pass


def _kwok(log: progress.Log) -> Path:
    return gobuild.ensure_go_install("sigs.k8s.io/kwok/cmd/kwok", "v0.8.0", log=log)


def _apiserver(log: progress.Log) -> Path:
    return build.ensure_components((build.APISERVER,), log)[build.APISERVER]


# Each build, and the module whose find_go it calls.
BUILDS: dict[str, tuple[Callable[[progress.Log], Path], object]] = {
    "go install": (_kwok, gobuild),
    "control plane": (_apiserver, build),
    "e2e.test": (e2e.ensure_e2e_test, e2e),
    "agnhost": (testimages.ensure_agnhost, testimages),
}


@pytest.fixture
def fake_go(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The fake `go` in every build module, the cache and TMPDIR in tmp_path; returns the record of
    Go's work directories."""
    go = tmp_path / "go"
    go.write_text(FAKE_GO)
    go.chmod(0o755)
    for _, module in BUILDS.values():
        monkeypatch.setattr(module, "find_go", lambda: str(go))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    monkeypatch.delenv("GOTMPDIR", raising=False)
    monkeypatch.setenv("FAKE_GO_RECORD", str(tmp_path / "record"))
    modules = {"k8s.io/kubernetes": "v1.36.3"}
    monkeypatch.setenv("FAKE_BINARY", str(fake_go_binary(tmp_path / "binary", modules)))
    return tmp_path / "record"


def _build_dirs(binary: Path) -> list[str]:
    target = binary.parent
    return [p.name for p in target.parent.iterdir() if p.name.startswith(f".{target.name}.build-")]


@pytest.mark.parametrize("name", BUILDS)
def test_an_interrupted_go_build_leaves_no_work_directory(
    name: str, fake_go: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`go build` handles no signal: stopped, it leaves its work directory (GBs for the control plane)
    where GOTMPDIR says, which must be inside the build's own directory; and one that a SIGKILL left
    is removed by the next build of the same target, but not another target's."""
    ensure, _ = BUILDS[name]
    monkeypatch.setattr(progress, "PROGRESS_EVERY", 0.1)
    monkeypatch.setenv("FAKE_GO_MODE", "hang")
    def interrupt(message: str) -> None:  # a progress line once go runs stands for ^C
        if "elapsed" in message and fake_go.exists():
            raise Interrupted

    with pytest.raises(Interrupted):
        ensure(interrupt)
    work = Path(fake_go.read_text().split()[0])
    # <cache>/<kind>/.<target>.build-XXXX/gowork/go-buildXXXX, and gone with the build's directory
    assert work.parent.name == "gowork" and work.parents[2].parent == tmp_path / "cache" / "pykcm", work
    assert not work.parents[1].exists()
    assert list((tmp_path / "tmp").iterdir()) == []

    # Killed outright (Python removed nothing): the next build of that target removes it.
    stale = work.parents[1] / "gowork" / "go-build1"
    stale.mkdir(parents=True)
    other = work.parents[2] / ".other-v1.build-x"
    other.mkdir()
    fake_go.unlink()
    with pytest.raises(Interrupted):
        ensure(interrupt)
    assert not stale.exists()
    assert [p.name for p in work.parents[2].iterdir() if ".build-" in p.name] == [other.name]


@pytest.mark.parametrize("name", BUILDS)
def test_a_go_build_is_on_disk_before_it_is_published(
    name: str, fake_go: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rename can reach the disk before the data it names: after a machine crash the cache would
    hold an empty binary, trusted for ever."""
    ensure, _ = BUILDS[name]
    events = _synced(monkeypatch)
    binary = ensure(lambda _: None)
    assert binary.read_bytes() == Path(os.environ["FAKE_BINARY"]).read_bytes()
    published = next(i for i, e in enumerate(events) if e[0] == "replace" and Path(e[2]) in (binary, binary.parent))
    source = Path(events[published][1])
    built = source / binary.name if Path(events[published][2]) == binary.parent else source
    assert ("fsync", str(built)) in events[:published]
    assert ("fsync", str(Path(events[published][2]).parent)) in events[published + 1 :]
    assert _build_dirs(binary) == []
    for work in fake_go.read_text().split():  # in the build's directory, gone with it
        assert Path(work).parent.name == "gowork" and not Path(work).parents[1].exists()


@pytest.mark.parametrize("name", ["e2e.test", "agnhost"])
def test_waiting_for_another_process_building_is_said_on_the_log(
    name: str, fake_go: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under pytest, stderr is captured: the caller's log is what shows that the run is waiting."""
    ensure, _ = BUILDS[name]
    monkeypatch.setattr(gobuild, "LOCK_POLL", 0.01)
    built = ensure(lambda _: None)  # where the other process puts it
    built.unlink()
    lock = built.parent.with_name(built.parent.name + ".lock")

    def other_build() -> None:
        built.write_bytes(Path(os.environ["FAKE_BINARY"]).read_bytes())
        built.chmod(0o755)

    holder = _held_for(lock, 0.2, other_build)
    said: list[str] = []
    fake_go.unlink()
    assert ensure(said.append) == built
    holder.join()
    assert len(said) == 1 and said[0].startswith(f"waiting for another process building {built.name} (log: ")
    assert not fake_go.exists()  # not built again
