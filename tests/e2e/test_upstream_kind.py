"""The upstream e2e tests of pykcm's three controllers on kind, KCM against pykcm: RUN and the
container tests of ON_REAL_NODE (upstream.py) on a fresh kind cluster (a control plane and a
worker, real kubelets and containerd: pykcm/testenv/kind/) whose KCM runs every controller
(kubeadm's set), then on another fresh one made from deploy/kind's recipe, whose KCM leaves the
three to `pykcm run` from outside (on the host, with kind's kubeconfig) as deployed: deploy/'s
RBAC, each controller as its own ServiceAccount (see runs.py). Every test that passes for KCM
must pass for pykcm; both tables print side by side.

One kind cluster at a time per Docker engine: the sides run one after the other, each cluster
deleted before the next is made, and the host holds after each what it held before. The engine's
directory is locked while it runs: another session's kind test makes this one wait (ENGINE_WAIT).
e2e.test's images (agnhost, busybox) are built here and loaded with `kind load image-archive`;
the pause image is the node image's own.

Measured warm on 2 cores: about 9 minutes for both sides (per side: `kind create cluster` 36 s,
image load 5 s, e2e.test 3.5-4 minutes, delete 3 s). The token-rotation test (about 10 minutes
a run, 22 minutes both sides) runs apart, under the extra marker `slow`. Both stay out of the
default run and CI (marker `kind_e2e`: CI's cold hour cannot hold them beside the rest). Run with
`python -m pytest -m "kind_e2e and not slow"` (`-m "kind_e2e and slow"` for the rotation), or as
a script: `python -m tests.e2e.test_upstream_kind [--rotation]` prints the same table.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import pytest

from pykcm.testenv import docker
from pykcm.testenv.build import KUBECTL, ensure_components
from pykcm.testenv.e2e import E2ERun, ensure_e2e_test
from pykcm.testenv.kind import cluster, nodeimage
from pykcm.testenv.nodes import KUBEADM_CONTROLLERS
from pykcm.testenv.progress import format_duration
from pykcm.testenv.testimages import ensure_agnhost, write_e2e_images
from tests.deploy_credentials import install_deploy_credentials_with
from tests.e2e.runs import (
    DEPLOY_MODE,
    ENV_BEFORE,
    Log,
    assert_pykcm_passes_what_kcm_passes,
    assert_ran_exactly,
    run_beside_pykcm,
    session_env,
    side_by_side,
)
from tests.e2e.upstream import NOT_RUN, ON_REAL_NODE, RUN, TOKEN_ROTATION, exactly

KIND_TESTS = (*RUN, *sorted(set(ON_REAL_NODE) - {TOKEN_ROTATION}))  # every one passes on kind for KCM
ENGINE_WAIT = 1800.0  # seconds; another session may hold the kind engine's directory
E2E_TIMEOUT = 30 * 60  # hard limit of one e2e.test run of KIND_TESTS, which takes about 4 minutes
ROTATION_TIMEOUT = 30 * 60  # the rotation test alone: about 10 minutes
BUILD_TIMEOUT = 60 * 60  # e2e.test, agnhost and the node image from cold Go build caches
SIDES = ("kcm", "pykcm")

pytestmark = [pytest.mark.e2e, pytest.mark.kind_e2e]


def run_both(directory: Path, log: Log, names: tuple[str, ...], timeout: float) -> tuple[E2ERun, E2ERun]:
    """KCM's run, then pykcm's, each on a fresh kind cluster, the engine held for both."""
    e2e_test, agnhost = ensure_e2e_test(log), ensure_agnhost(log)
    kubectl = ensure_components((KUBECTL,), log)[KUBECTL]
    engine_dir = nodeimage.default_docker_directory()
    with docker.running(engine_dir, log=log, wait=ENGINE_WAIT) as engine:
        image, kind = nodeimage.ensure_node_image(log, engine), nodeimage.ensure_kind(log)
        archives = write_e2e_images(directory / "images", agnhost)
        before = cluster.host_traces(engine_dir)  # the engine's own mounts, and whatever others left
        kcm, pykcm = (
            _run_side(engine, image, kind, directory / side, log, pykcm=side == "pykcm", archives=archives,
                      e2e_test=e2e_test, kubectl=kubectl, names=names, timeout=timeout)
            for side in SIDES
        )
        assert cluster.host_traces(engine_dir) == before, "a kind cluster left something on the host"
    return kcm, pykcm


def _run_side(
    engine: docker.DockerEngine, image: str, kind: Path, directory: Path, log: Log, *, pykcm: bool,
    archives: list[Path], e2e_test: Path, kubectl: Path, names: tuple[str, ...], timeout: float,
) -> E2ERun:
    side = "pykcm" if pykcm else "KCM"
    started = time.monotonic()
    with cluster.running(engine, image, kind, directory / "kind", log=log,
                         kcm_controllers=None if pykcm else KUBEADM_CONTROLLERS) as made:
        log(f"DURATION [kind, {side}] kind create cluster (2 nodes): {format_duration(time.monotonic() - started)}")
        loading = time.monotonic()
        cluster.load_image_archives(made, archives, log=log)
        log(f"DURATION [kind, {side}] kind load image-archive: {format_duration(time.monotonic() - loading)}")
        credentials = (install_deploy_credentials_with(made.kubeconfig, DEPLOY_MODE, directory / "pykcm.kubeconfig")
                       if pykcm else None)
        run = run_beside_pykcm(e2e_test, made.kubeconfig, kubectl, directory, log, credentials,
                               focus=exactly(names), skip="", timeout=timeout)
        log(f"DURATION [kind, {side}] e2e.test, {len(names)} tests: {format_duration(run.seconds)}")
    log(f"DURATION [kind, {side}] side in all (create, load, e2e.test, delete): "
        f"{format_duration(time.monotonic() - started)}")
    return run


def _check(runs: tuple[E2ERun, E2ERun], names: tuple[str, ...]) -> None:
    kcm, pykcm = runs
    print(side_by_side(kcm, pykcm, names))
    assert_ran_exactly(kcm, names, excluded=tuple(NOT_RUN))
    assert_ran_exactly(pykcm, names, excluded=tuple(NOT_RUN))
    assert_pykcm_passes_what_kcm_passes(kcm, pykcm, names)
    assert session_env() == ENV_BEFORE


@pytest.fixture(scope="module")
def prerequisites() -> None:
    if missing := cluster.missing_prerequisites():
        pytest.skip("; ".join(missing))


@pytest.mark.timeout(BUILD_TIMEOUT + ENGINE_WAIT + 2 * (E2E_TIMEOUT + 5 * 60))
def test_pykcm_passes_every_upstream_test_on_kind_that_kcm_passes(
    prerequisites: None, tmp_path: Path, testenv_log: Log
) -> None:
    _check(run_both(tmp_path, testenv_log, KIND_TESTS, E2E_TIMEOUT), KIND_TESTS)


@pytest.mark.slow
@pytest.mark.timeout(BUILD_TIMEOUT + ENGINE_WAIT + 2 * (ROTATION_TIMEOUT + 5 * 60))
def test_pykcm_passes_the_token_rotation_test_on_kind_if_kcm_does(
    prerequisites: None, tmp_path: Path, testenv_log: Log
) -> None:
    names = (TOKEN_ROTATION,)
    _check(run_both(tmp_path, testenv_log, names, ROTATION_TIMEOUT), names)


def main(argv: list[str]) -> int:
    """Both sides, the table printed; exit 1 if a test passed for KCM and not for pykcm, or, in one line,
    if a build, a cluster or the machine failed or the run was interrupted (^C, SIGTERM or SIGHUP, which
    stop the clusters first: their processes and containers do not die with this one)."""
    from pykcm.testenv import interrupts
    from pykcm.testenv.errors import ControlPlaneError  # BuildError is one
    from pykcm.util.errors import os_error_message

    if missing := cluster.missing_prerequisites():
        print("; ".join(missing))
        return 2
    rotation = "--rotation" in argv
    names, timeout = ((TOKEN_ROTATION,), ROTATION_TIMEOUT) if rotation else (KIND_TESTS, E2E_TIMEOUT)
    directory = Path(tempfile.mkdtemp(prefix="pykcm-kind-e2e-"))  # kept: reports, e2e and pykcm logs

    def log(line: str) -> None:
        print(line, flush=True)

    try:
        with interrupts.interruptible():  # as the CLI's testenv commands
            _check(run_both(directory, log, names, timeout), names)
    except AssertionError as failure:
        print(failure)
        return 1
    except (ControlPlaneError, OSError, KeyboardInterrupt) as err:
        text = ("interrupted" if isinstance(err, KeyboardInterrupt)
                else os_error_message(err) if isinstance(err, OSError) else str(err).strip())
        print(f"error: {text.splitlines()[0] if text else type(err).__name__}")  # later lines: a log's tail
        return 1
    finally:
        print(f"reports and logs: {directory}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
