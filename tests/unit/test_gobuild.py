"""Go builds: made once however many runs want them, and failures the user can act on, in one line."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from pykcm.testenv.errors import BuildError
from pykcm.testenv.gobuild import built_once, run_go


def test_a_go_build_without_the_module_proxy_names_it_and_the_fix(tmp_path: Path) -> None:
    offline = ('echo "go: github.com/coredns/coredns@v1.14.2: Get \\"https://proxy.golang.org/...\\": '
               'dial tcp: lookup proxy.golang.org: no such host"; exit 1')
    with pytest.raises(BuildError) as err:
        run_go(["sh", "-c", offline], what="coredns", cwd=tmp_path, log_path=tmp_path / "log", log=lambda _: None)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("the Go module proxy is not reachable (give this machine access to it, or set "
                              "GOPROXY to a mirror): building coredns failed (exit 1): ")
    with pytest.raises(BuildError) as other:
        run_go(["sh", "-c", "echo 'x.go:1: undefined: y'; exit 2"], what="x", cwd=tmp_path,
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
