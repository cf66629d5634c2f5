"""Go builds' failures the user can act on, in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from pykcm.testenv.errors import BuildError
from pykcm.testenv.gobuild import run_go


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
