"""Shared fixtures. Integration tests run against one real local control plane per session
(etcd + kube-apiserver built from k8s.io/kubernetes); a build failure errors them, never skips."""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path

import pytest

from pykcm.client.rest import RestClient
from pykcm.testenv import interrupts
from pykcm.testenv.build import ensure_binaries
from pykcm.testenv.cluster import running
from pykcm.testenv.controlplane import ControlPlane
from pykcm.testenv.errors import ControlPlaneError
from pykcm.testenv.kwok import ensure_kwok
from pykcm.testenv.realnode import check_prerequisites
from pykcm.util.errors import os_error_message
from pykcm.util.log import KlogFormatter
from tests.background_builds import BUILDS, start_background_build
from tests.deploy_credentials import CREDENTIALS_ENV, install_deploy_credentials, run_managers_as
from tests.support import admin_client

INTEGRATION_DIR = Path(__file__).parent / "integration"

def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if INTEGRATION_DIR in item.path.parents:
            item.add_marker(pytest.mark.integration)
    # One real node runs per machine, and the session's (cluster_with_real_node) lives until the
    # end: a test that needs a real node of its own goes first, before any test can start that one.
    # Tests marked `late` go last in their group (own real node, or the rest): what they need builds
    # in the background meanwhile.
    items.sort(key=lambda item: (item.get_closest_marker("own_real_node") is None,
                                 item.get_closest_marker("late") is not None))


def pytest_collection_finish(session: pytest.Session) -> None:
    if session.config.option.collectonly:
        return
    marks = [mark for item in session.items for mark in item.iter_markers("late")]
    if any(len(mark.args) != 1 or mark.args[0] not in BUILDS for mark in marks):
        raise pytest.UsageError("mark a late test with the background build it waits for: "
                                "@pytest.mark.late(\"<name in tests/background_builds.py>\")")
    wanted = {mark.args[0] for mark in marks}
    for name in sorted(wanted):
        if started := start_background_build(name):
            _terminal_log(session.config)(started)
    marks = [{mark.name for mark in item.iter_markers()} for item in session.items]
    _build_control_plane(marks, _terminal_log(session.config))


def _build_control_plane(marks: Sequence[set[str]], log: Callable[[str], None]) -> None:
    """The binaries that the collected tests' (`marks`, by test) clusters need, built before the first
    test and so outside every test's time limit: cold, on 2 cores, the build takes about 10 minutes,
    and the first fixture to need them would time out at 600 s without root (as root, the real node's
    test comes first, with 45). The control plane for `integration` and `e2e` tests; the KCM for `kcm`
    and `nodes` ones (envtest's KUBEBUILDER_ASSETS have none: it is built then only if asked for);
    kube-scheduler and kwok (a module of its own, with its own build cache) for `nodes` ones."""
    if not any(names & {"integration", "e2e"} for names in marks):
        return
    nodes = any("nodes" in names for names in marks)
    need_kcm = nodes or any("kcm" in names for names in marks)
    builds: list[tuple[str, Callable[[], object]]] = [
        ("the control plane", lambda: ensure_binaries(need_kcm=need_kcm, need_kubectl=True,
                                                      need_scheduler=nodes, log=log)),
    ]
    if nodes:
        builds.append(("kwok", lambda: ensure_kwok(log)))
    for what, build in builds:
        try:
            build()
        except (ControlPlaneError, OSError) as err:  # the first test that needs it reports it again
            reason = os_error_message(err) if isinstance(err, OSError) else str(err).strip()
            log(f"building {what} failed: {reason.splitlines()[0] if reason else type(err).__name__}")


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    """Captured logs in failure reports as klog lines, so they carry the key/values (err, key)
    that pytest's default format drops. SIGTERM and SIGHUP end the session as Ctrl-C does."""
    plugin = config.pluginmanager.getplugin("logging-plugin")
    if plugin is not None:
        plugin.report_handler.setFormatter(KlogFormatter())
    # SIGTERM (a CI job cancelled, `timeout`) and SIGHUP (a closed terminal) unwind the session as
    # Ctrl-C does: the local clusters' processes live in sessions of their own, and Python's default
    # action would end pytest with them running. An ignored SIGHUP (nohup, as CI runs) stays ignored.
    interrupts.raise_on_termination()


def _terminal_log(config: pytest.Config) -> Callable[[str], None]:
    """Show control-plane progress even under output capture: the first run builds for minutes."""
    capture = config.pluginmanager.getplugin("capturemanager")

    def log(message: str) -> None:
        with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
            print(f"\n[testenv] {message}", flush=True)

    return log


@pytest.fixture(scope="session")
def testenv_log(pytestconfig: pytest.Config) -> Callable[[str], None]:
    """Progress lines of local-cluster builds and runs, shown even under output capture."""
    return _terminal_log(pytestconfig)


SHARED_CLUSTERS = ("control_plane", "cluster_with_nodes")


@pytest.fixture(autouse=True)
def _shared_clusters_stay_up(request: pytest.FixtureRequest) -> Iterator[None]:
    """A shared cluster that lost a process is reported against the test it happened in or before
    (a warning with the process's last log lines, in the summary and on the terminal), and etcd and
    the apiserver are started again: one crash must not fail every test after it (a CI run once
    lost 26 tests that way with no trace of why the apiserver had gone)."""
    _revive_shared_clusters(request, "before")
    yield
    _revive_shared_clusters(request, "during")


def _revive_shared_clusters(request: pytest.FixtureRequest, when: str) -> None:
    for name in SHARED_CLUSTERS:
        if name not in request.fixturenames:
            continue
        plane: ControlPlane = request.getfixturevalue(name)
        if not (dead := plane.dead_processes()):
            continue
        report = "; ".join(f"{p.name} (pid {p.pid}) exited, last lines: {' | '.join(p.log_tail(8))}" for p in dead)
        revived = plane.revive()
        message = f"the shared {name} lost {report} {when} {request.node.nodeid}"
        message += f" (restarted {', '.join(revived)})" if revived else ""
        request.getfixturevalue("testenv_log")(message)
        warnings.warn(message, pytest.PytestWarning, stacklevel=1)


@pytest.fixture
async def client(control_plane: ControlPlane) -> AsyncIterator[RestClient]:
    """An admin API client for test set-up and assertions."""
    api = admin_client(control_plane.kubeconfig)
    yield api
    await api.close()


@pytest.fixture
async def nodes_client(cluster_with_nodes: ControlPlane) -> AsyncIterator[RestClient]:
    """An admin API client of the cluster with nodes."""
    api = admin_client(cluster_with_nodes.kubeconfig)
    yield api
    await api.close()


@pytest.fixture(scope="session")
def cluster_with_nodes(tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config) -> Iterator[ControlPlane]:
    """A cluster with nodes, shared by the session: kube-controller-manager running every
    controller pykcm does not, kube-scheduler, and three kwok nodes (pods become Running)."""
    with running(tmp_path_factory.mktemp("cluster"), log=_terminal_log(pytestconfig), nodes=3) as plane:
        yield plane


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config) -> Iterator[ControlPlane]:
    with running(tmp_path_factory.mktemp("control-plane"), log=_terminal_log(pytestconfig)) as plane:
        mode = os.environ.get(CREDENTIALS_ENV, "admin")
        if mode != "admin":
            run_managers_as(install_deploy_credentials(plane, mode), mode)
        yield plane


@pytest.fixture(scope="module")
def own_plane(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[ControlPlane]:
    """A control plane of the module's own, for tests that stop, restart or break it, or that need
    the apiserver started with the module's `APISERVER_ARGS` (a feature gate off, say)."""
    name = request.module.__name__.rsplit(".", 1)[-1]
    args = list(getattr(request.module, "APISERVER_ARGS", ()))
    with running(tmp_path_factory.mktemp(f"{name}-plane"), apiserver_args=args, log=lambda _msg: None) as plane:
        yield plane


@pytest.fixture
async def own_client(own_plane: ControlPlane) -> AsyncIterator[RestClient]:
    """An admin API client of `own_plane`."""
    api = admin_client(own_plane.kubeconfig)
    yield api
    await api.close()


@pytest.fixture(scope="session")
def cluster_with_real_node(
    tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config
) -> Iterator[ControlPlane]:
    """A cluster with one real node (containerd, runc, CNI, kubelet, kube-proxy) beside KCM's
    other controllers and kube-scheduler. Skips, naming what is missing, without root or one
    of the Debian packages; only one real node runs on a machine at a time."""
    try:
        check_prerequisites()
    except ControlPlaneError as err:
        pytest.skip(str(err))
    with running(tmp_path_factory.mktemp("realnode"), log=_terminal_log(pytestconfig), real_node=True) as plane:
        yield plane
