"""`pykcm testenv image` and `kind-image` around their builds (no engine or build runs here): SIGTERM
and SIGHUP clean up as Ctrl-C does, the build logs are the engine directory's, and an unusable
--save path is refused before the build."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from pykcm.testenv import image
from pykcm.testenv.docker import DockerEngine
from tests.support import CHECKOUT, checkout_env

# The command with its engine replaced by a block that says when it starts and when its cleanup runs.
CHILD = """
import contextlib, signal, sys, time
signal.signal(signal.SIGHUP, signal.SIG_DFL)  # as in a terminal: a CI runner's nohup ignores it
from pykcm.app import cli
from pykcm.testenv import docker, image
from pykcm.testenv.kind import nodeimage

@contextlib.contextmanager
def engine(*args, **kwargs):
    try:
        print("engine running", flush=True)
        time.sleep(60)  # a build
        yield
    finally:
        print("engine stopped", flush=True)

image.built = docker.running = engine
nodeimage.missing_prerequisites = lambda: []
sys.exit(cli.main(sys.argv[1:]))
"""


@pytest.mark.parametrize("command", [["image", "--checkout", str(CHECKOUT)], ["kind-image"]])
@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_sigterm_and_sighup_stop_the_engine_and_end_in_one_line(tmp_path: Path, command: list[str], signum: int,
                                                                code: int) -> None:
    child = subprocess.Popen([sys.executable, "-c", CHILD, "testenv", *command], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=checkout_env({"XDG_CACHE_HOME": str(tmp_path)}))
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == "engine running\n"
        child.send_signal(signum)
        out, err = child.communicate(timeout=30)
    finally:
        child.kill()
        child.wait()
    assert (child.returncode, out, err) == (code, "engine stopped\n", "pykcm: interrupted\n")


class _Engine(DockerEngine):
    def docker(self, *args: str, timeout: float = 300.0, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(list(args), 0, "", "")


def test_the_build_logs_are_the_engine_directorys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two builds on two engines at once must not write the same log files."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))  # nothing of the shared cache, even unfixed
    monkeypatch.setattr(image.baseimage, "ensure_base_image", lambda engine, log: "pykcm-local/python:1")
    monkeypatch.setattr(image.baseimage, "ensure_build_image", lambda engine, base, log: "pykcm-local/python-build:1")
    monkeypatch.setattr(image.docker, "docker_cli", lambda: "docker")
    monkeypatch.setattr(image, "inspect", lambda engine, name, base="": image.Image(name, "sha256:0", 1, base, ()))
    logs: list[Path] = []
    monkeypatch.setattr(image, "run_with_progress", lambda argv, **kwargs: logs.append(kwargs["log_path"]))
    for name in ("a", "b"):
        image.build(_Engine(tmp_path / name, []), CHECKOUT, log=lambda _: None)
    assert logs == [tmp_path / name / "logs" / f"{log}.build.log"
                    for name in ("a", "b") for log in ("pykcm-build-stage", "pykcm-image")]


@pytest.mark.parametrize(("save", "why"), [("", "is a directory: pass the tarball's file name"),
                                           ("file/image.tar", "file is not a directory")])
def test_an_unusable_save_path_is_refused_before_the_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str], save: str,
                                                           why: str) -> None:
    from pykcm.app import cli

    (tmp_path / "file").write_text("")
    monkeypatch.setattr(image, "built", lambda *a, **k: pytest.fail("the build started"))
    target = tmp_path / save
    assert cli.main(["testenv", "image", "--checkout", str(CHECKOUT), "--save", str(target)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"pykcm: error: --save {target}") and err.endswith(f"{why}\n") and err.count("\n") == 1
