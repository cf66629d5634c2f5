"""The upstream e2e tests of pykcm's controllers that need real containers (upstream.py's
ON_REAL_NODE), run with e2e.test on a cluster whose only node is the real one (containerd,
kubelet, kube-proxy: see pykcm/testenv/realnode.py): once with KCM running every controller,
once with pykcm running its three as deployed (see runs.py). Every test that passes for KCM
must pass for pykcm.

Their images cannot be pulled here: agnhost is built from its source in the e2e module and
written, like busybox, as a FROM-scratch image under the name e2e.test asks for, then imported
into the node's containerd (pykcm/testenv/testimages.py).

One real node runs per machine, so the two runs go one after the other. The token-rotation test
waits for the kubelet to renew a 10-minute token (about 10 minutes a run): it runs apart, under
the extra marker `slow`. Run them alone with `python -m pytest -m realnode tests/e2e`
(`-m "realnode and not slow"` leaves out the rotation).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pykcm.testenv import realnode
from pykcm.testenv.controlplane import ControlPlane
from pykcm.testenv.e2e import E2ERun, ensure_e2e_test
from pykcm.testenv.errors import ControlPlaneError
from pykcm.testenv.testimages import ensure_agnhost, write_e2e_images
from tests.e2e.runs import (
    ENV_BEFORE,
    Log,
    assert_pykcm_passes_what_kcm_passes,
    assert_ran_exactly,
    run_on_cluster,
    session_env,
    side_by_side,
)
from tests.e2e.upstream import ON_REAL_NODE, TOKEN_ROTATION, exactly

CONTAINER_TESTS = tuple(sorted(set(ON_REAL_NODE) - {TOKEN_ROTATION}))
E2E_TIMEOUT = 15 * 60  # hard limit of one run of the container tests, which takes about 2 minutes
ROTATION_TIMEOUT = 30 * 60  # the rotation test alone: about 10 minutes
BUILD_TIMEOUT = 40 * 60  # e2e.test and agnhost from a cold Go build cache

# Each run starts a real node of its own, so the module runs with the other own-node tests, before the
# session's real node starts, and last among them (late): e2e.test builds in the background meanwhile.
pytestmark = [pytest.mark.e2e, pytest.mark.realnode, pytest.mark.own_real_node, pytest.mark.late("e2e-test")]


@pytest.fixture(scope="module")
def binaries(testenv_log: Log) -> tuple[Path, Path]:
    """e2e.test and agnhost; skips, in one line, without root or the real node's packages."""
    try:
        realnode.check_prerequisites()
    except ControlPlaneError as err:
        pytest.skip(str(err))
    return ensure_e2e_test(testenv_log), ensure_agnhost(testenv_log)


def _runs(binaries: tuple[Path, Path], directory: Path, log: Log, names: tuple[str, ...],
          timeout: float) -> tuple[E2ERun, E2ERun]:
    """KCM's run, then pykcm's, each on a fresh cluster with the real node and no other."""
    e2e_test, agnhost = binaries

    def import_images(plane: ControlPlane) -> None:
        realnode.import_images(write_e2e_images(realnode.node_dir(plane) / "images", agnhost))

    kcm, pykcm = (
        run_on_cluster(e2e_test, directory / name, log, pykcm=name == "pykcm", focus=exactly(names), skip="",
                       timeout=timeout, prepare=import_images, real_node=True)
        for name in ("kcm", "pykcm")
    )
    return kcm, pykcm


def _check(runs: tuple[E2ERun, E2ERun], names: tuple[str, ...]) -> None:
    kcm, pykcm = runs
    print(side_by_side(kcm, pykcm, names))
    assert_ran_exactly(kcm, names)
    assert_ran_exactly(pykcm, names)
    assert_pykcm_passes_what_kcm_passes(kcm, pykcm, names)
    assert session_env() == ENV_BEFORE


@pytest.mark.timeout(BUILD_TIMEOUT + 2 * E2E_TIMEOUT + 5 * 60)
def test_pykcm_passes_every_container_test_that_kcm_passes(
    binaries: tuple[Path, Path], tmp_path: Path, testenv_log: Log
) -> None:
    _check(_runs(binaries, tmp_path, testenv_log, CONTAINER_TESTS, E2E_TIMEOUT), CONTAINER_TESTS)


@pytest.mark.slow
@pytest.mark.timeout(BUILD_TIMEOUT + 2 * ROTATION_TIMEOUT + 5 * 60)
def test_pykcm_passes_the_token_rotation_test_if_kcm_does(
    binaries: tuple[Path, Path], tmp_path: Path, testenv_log: Log
) -> None:
    names = (TOKEN_ROTATION,)
    _check(_runs(binaries, tmp_path, testenv_log, names, ROTATION_TIMEOUT), names)
