"""`pykcm run` as users run it: a real process against the real apiserver, stopped by signals."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pykcm.client.errors import NotFound
from pykcm.client.resources import DEPLOYMENTS, NAMESPACES, SERVICEACCOUNTS
from tests.support import (
    PykcmProcess,
    admin_client,
    checkout_env,
    create_namespace,
    free_port,
    https_get,
    stderr_after_start,
    wait_for,
)

pytestmark = pytest.mark.integration


async def default_sa_appears(kubeconfig: Path | str) -> None:
    client = admin_client(kubeconfig)
    try:
        ns = await create_namespace(client, "run", service_account=False)

        async def present() -> bool:
            try:
                return bool(await client.get(SERVICEACCOUNTS, "default", namespace=ns))
            except NotFound:
                return False

        await wait_for(present, timeout=30, message=f"ServiceAccount {ns}/default")
        await client.delete(NAMESPACES, ns)
    finally:
        await client.close()


async def test_run_syncs_caches_works_and_stops_cleanly_on_sigterm(control_plane, tmp_path):
    port = free_port()
    proc = PykcmProcess(
        "--kubeconfig", str(control_plane.kubeconfig), "--controllers", "serviceaccount", "--v", "2",
        "--secure-port", str(port), "--bind-address", "127.0.0.1", "--leader-elect-retry-period=2s",
        log_path=tmp_path / "pykcm.log",
    )
    try:
        await proc.wait_for_log("Caches are synced")
        await default_sa_appears(control_plane.kubeconfig)
        await zpages_are_served(f"https://127.0.0.1:{port}", control_plane)
        proc.signal(signal.SIGTERM)
        assert await proc.wait(30) == 0, proc.log()[-2000:]
        assert '"Stopped"' in proc.log()
        assert "Traceback" not in proc.log()
    finally:
        proc.kill()


async def zpages_are_served(url: str, control_plane) -> None:
    """KCM 1.36's /statusz and /flagz (beta, on by default): text, and the structured kinds; /configz."""
    cert = (control_plane.pki.admin_cert, control_plane.pki.admin_key)
    status, text = await https_get(f"{url}/statusz", cert=cert)
    assert status == 200 and "\npykcm statusz\n" in text and "Binary version" in text, text
    status, body = await https_get(f"{url}/statusz", cert=cert, accept=STRUCTURED.format("Statusz"))
    statusz = json.loads(body)
    assert statusz["paths"] == ["/configz", "/flagz", "/healthz", "/livez", "/metrics", "/readyz"]
    assert statusz["kind"] == "Statusz"
    status, body = await https_get(f"{url}/flagz", cert=cert, accept=STRUCTURED.format("Flagz"))
    flags = json.loads(body)["flags"]
    assert (flags["controllers"], flags["v"], flags["kube-api-qps"]) == ("[serviceaccount]", "2", "20")
    assert (flags["leader-elect-retry-period"], flags["leader-elect"], flags["tls-cert-file"]) == ("2s", "false", "")
    assert (await https_get(f"{url}/flagz"))[0] == 403  # anonymous: authorized as /metrics is
    status, body = await https_get(f"{url}/configz", cert=cert)
    config = json.loads(body)["kubecontrollermanager.config.k8s.io"]
    generic = config["Generic"]
    assert (generic["Controllers"], generic["ClientConnection"]["kubeconfig"]) == (
        ["serviceaccount-controller"], str(control_plane.kubeconfig))  # the alias made canonical, as KCM does
    assert (generic["LeaderElection"]["leaderElect"], generic["LeaderElection"]["retryPeriod"]) == (False, "2s")
    assert (await https_get(f"{url}/configz"))[0] == 403


STRUCTURED = "application/json;as={};v=v1beta1;g=config.k8s.io"


async def test_sigquit_dumps_every_thread_and_task_and_exits_2_as_kcm_does(control_plane, tmp_path):
    proc = PykcmProcess(
        "--kubeconfig", str(control_plane.kubeconfig), "--controllers", "serviceaccount",
        log_path=tmp_path / "pykcm.log",
    )
    try:
        await proc.wait_for_log("Caches are synced")
        proc.signal(signal.SIGQUIT)
        assert await proc.wait(30) == 2, proc.log()[-2000:]
    finally:
        proc.kill()
    dump = proc.log().split("SIGQUIT: quit\n", 1)[1]
    for part in ("thread MainThread:", "thread event-loop-watch:", "task 'controller serviceaccount-controller':",
                 "task 'serviceaccount-controller worker 0':"):
        assert f"\n{part}\n" in dump, dump
    worker = dump.split("\ntask 'serviceaccount-controller worker 0':\n", 1)[1].split("\n\n", 1)[0]
    # Down the chain of awaits: from the worker loop to where it waits (the queue, or a request).
    assert "in _worker\n" in worker and worker.count("  File ") >= 2, worker
    assert "Traceback" not in proc.log()


async def test_run_local_starts_its_own_control_plane_serves_and_stops(tmp_path):
    port = free_port()
    proc = PykcmProcess(  # its temp dir under tmp_path: not left in the system's if the test fails
        "--local", "--controllers", "serviceaccount", "--secure-port", str(port), log_path=tmp_path / "local.log",
        env={"TMPDIR": str(tmp_path)},
    )
    try:
        await proc.wait_for_log("Caches are synced", timeout=180)
        assert await https_get(f"https://127.0.0.1:{port}/healthz") == (200, "ok")
        assert _listening_addresses(port) == {"127.0.0.1"}  # --local serves on loopback only
        kubeconfig = Path(re.search(r"kubeconfig: (\S+)", proc.log()).group(1))
        state = json.loads((kubeconfig.parent / "testenv.json").read_text())
        pids = [p["pid"] for p in state["processes"].values()]
        assert pids and all(_alive(pid) for pid in pids)
        await default_sa_appears(kubeconfig)
        proc.signal(signal.SIGINT)
        assert await proc.wait(60) == 0, proc.log()[-2000:]
        assert not any(_alive(pid) for pid in pids), "the local control plane outlived pykcm"
        assert not kubeconfig.parent.exists()
    finally:
        proc.kill()


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["run", "--kubeconfig", "/does/not/exist"], 1, "does not exist"),
        (["run", "--master", "https://127.0.0.1:1", "--controllers", "serviceaccount"], 1, "apiserver"),
        (["run", "--controllers", "nope"], 2, "not in the list of known controllers"),
        (["run", "--kube-api-qps", "fast"], 2, "--kube-api-qps"),
        (["run", "--min-resync-period", "12 hours"], 2, "time: unknown unit \" hours\" in duration"),  # Go's words
    ],
)
def test_bad_input_is_one_line_and_exit_code(args, code, message, tmp_path):
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\nclusters: []\n")
    result = subprocess.run(
        [sys.executable, "-m", "pykcm.app.cli", *args],
        capture_output=True, text=True, timeout=60, env={**os.environ, "KUBECONFIG": str(kubeconfig)},
    )
    assert result.returncode == code, result.stderr
    lines = stderr_after_start(result.stderr)  # the unreachable apiserver's case starts first, as KCM
    assert len(lines) == 1 and lines[0].startswith("pykcm: error:"), result.stderr
    assert message in lines[0]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(")")[-1].split()[0] != "Z"


def _listening_addresses(port: int) -> set[str]:
    """IPv4 addresses with a listening TCP socket on `port`, from /proc/net/tcp."""
    addresses = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        host, hex_port = local.split(":")
        if state == "0A" and int(hex_port, 16) == port:  # 0A = LISTEN
            addresses.add(".".join(str(b) for b in reversed(bytes.fromhex(host))))
    return addresses


async def test_run_local_is_a_cluster_with_nodes_and_stops_when_one_of_its_processes_dies(tmp_path):
    """`pykcm run --local` as the README shows it: a Deployment gets Running, Ready pods; when the
    scheduler dies pykcm says which process and stops the whole cluster instead of hanging."""
    proc = PykcmProcess("--local", "--local-nodes", "2", log_path=tmp_path / "local.log")
    try:
        await proc.wait_for_log("Caches are synced", timeout=900)  # a cold machine builds first
        assert "Try this:" in proc.log() and "create deployment web" in proc.log()
        kubeconfig = Path(re.search(r"kubeconfig: (\S+)", proc.log()).group(1))
        state = json.loads((kubeconfig.parent / "testenv.json").read_text())
        processes = state["processes"]
        assert {"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok"} <= set(processes)
        client = admin_client(kubeconfig)
        try:
            ns = await create_namespace(client, "local")
            body = {
                "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
                "spec": {
                    "replicas": 3, "selector": {"matchLabels": {"app": "web"}},
                    "template": {"metadata": {"labels": {"app": "web"}},
                                 "spec": {"containers": [{"name": "web", "image": "nginx"}]}},
                },
            }
            await client.create(DEPLOYMENTS, body, namespace=ns)

            async def available() -> bool:
                status = (await client.get(DEPLOYMENTS, "web", namespace=ns)).get("status", {})
                return status.get("availableReplicas") == 3

            await wait_for(available, timeout=120, message="3 available replicas")
        finally:
            await client.close()
        os.kill(processes["kube-scheduler"]["pid"], signal.SIGKILL)
        assert await proc.wait(60) == 1, proc.log()[-2000:]
        assert "pykcm: error: the local cluster lost kube-scheduler" in proc.log()
        assert not any(_alive(p["pid"]) for p in processes.values()), "the local cluster outlived pykcm"
        assert f"keeping {kubeconfig.parent} for its logs" in proc.log()  # the scheduler's says why
    finally:
        proc.kill()
        if match := re.search(r"kubeconfig: (\S+)", proc.log()):
            shutil.rmtree(Path(match.group(1)).parent, ignore_errors=True)


LOCAL_RUN = ("run", "--local", "--local-nodes", "0", "--secure-port", "0", "--leader-elect=false",
             "--controllers", "namespace")


def _terminal_signals() -> None:
    """In the child: SIGHUP as a terminal leaves it, whatever ran the tests (nohup ignores it)."""
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


class LocalRun:
    """`pykcm run --local` (a bare apiserver, the namespace controller), or another command given, as a
    terminal runs it: in its own process group, which gets the signals. Its temp dir is made under
    `tmp_path`, so the cluster's processes are found by their command lines, and killed at the end if
    any outlived pykcm. "{tmp}" in `args` stands for that temp dir."""

    def __init__(self, tmp_path: Path, *args: str, command: tuple[str, ...] = LOCAL_RUN) -> None:
        self.tmp = tmp_path / "tmp"
        self.tmp.mkdir(parents=True)
        self.log_path = tmp_path / "local.log"
        with open(self.log_path, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "pykcm.app.cli", *command, *(a.replace("{tmp}", str(self.tmp)) for a in args)],
                stdout=out, stderr=subprocess.STDOUT, env=checkout_env({"TMPDIR": str(self.tmp)}), process_group=0,
                preexec_fn=_terminal_signals,
            )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def cluster(self) -> dict[int, str]:
        """The running processes of its cluster (etcd, kube-apiserver), by PID."""
        found = {}
        for proc in Path("/proc").iterdir():
            try:
                argv = (proc / "cmdline").read_bytes().split(b"\0")
                state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if proc.name.isdigit() and state != "Z" and any(str(self.tmp).encode() in arg for arg in argv):
                found[int(proc.name)] = Path(argv[0].decode()).name
        return found

    def wait_until(self, ready: Callable[[], object], what: str, timeout: float = 30.0, *,
                   running: bool = True) -> None:
        """Until `ready()`; with `running`, pykcm exiting first fails at once (not, after it is gone)."""
        deadline = time.monotonic() + timeout
        while not ready():
            assert not running or self.proc.poll() is None, (
                f"pykcm exited with {self.proc.returncode} before {what}:\n{self.log()}")
            assert time.monotonic() < deadline, f"no {what} after {timeout}s:\n{self.log()}"
            time.sleep(0.02)

    def signal(self, signum: int) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signum)

    def wait(self, timeout: float = 30.0) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"pykcm did not exit within {timeout}s:\n{self.log()}") from None

    def cleanup(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        for pid in self.cluster():
            os.kill(pid, signal.SIGKILL)

    def assert_nothing_left(self) -> None:
        survivors = self.cluster()
        assert not survivors, f"outlived pykcm: {survivors}\n{self.log()}"
        assert list(self.tmp.iterdir()) == [], f"left behind: {list(self.tmp.iterdir())}\n{self.log()}"


@pytest.fixture
def local_run(tmp_path: Path) -> Iterator[Callable[..., LocalRun]]:
    runs: list[LocalRun] = []

    def start(*args: str, command: tuple[str, ...] = LOCAL_RUN) -> LocalRun:
        runs.append(LocalRun(tmp_path / str(len(runs)), *args, command=command))
        return runs[-1]

    yield start
    for run in runs:
        run.cleanup()


@pytest.mark.parametrize(
    ("during", "signals"),
    [
        ("etcd", [signal.SIGTERM]),  # systemd, docker stop, timeout, CI: Python's default action ended it
        ("kube-apiserver", [signal.SIGHUP]),  # the terminal closed
        ("kube-apiserver", [signal.SIGINT]),  # Ctrl-C: it said nothing and kept its temp dir
        ("kube-apiserver", [signal.SIGINT, signal.SIGINT]),  # pressed twice: etcd outlived it
        ("etcd", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP]),
    ],
)
def test_run_local_interrupted_while_it_starts_stops_its_cluster_says_so_and_leaves_nothing(
    local_run, during, signals
):
    run = local_run()
    run.wait_until(lambda: during in run.cluster().values(), f"a running {during}")
    for signum in signals:
        run.signal(signum)
        time.sleep(0.05)
    assert run.wait() == 128 + signals[0], run.log()
    assert run.log().strip().splitlines()[-1] == "pykcm: interrupted"
    assert "Traceback" not in run.log()
    run.assert_nothing_left()


@pytest.mark.parametrize("uvloop", ["--uvloop", "--no-uvloop"])
def test_run_local_a_signal_during_its_teardown_kills_the_cluster_instead_of_leaving_it(local_run, uvloop):
    run = local_run(uvloop)
    run.wait_until(lambda: "Caches are synced" in run.log(), "synced caches")
    run.signal(signal.SIGTERM)
    run.wait_until(lambda: "stopping the local cluster" in run.log(), "a teardown")
    run.signal(signal.SIGINT)  # was: etcd left running (asyncio's loop), or the signal swallowed (uvloop's)
    run.wait()
    assert "SIGINT: killing the local cluster's processes" in run.log()
    assert run.log().count("stopping the local cluster") == 1
    run.assert_nothing_left()


def test_run_local_stops_its_cluster_on_sighup_as_on_sigterm(local_run):
    run = local_run()
    run.wait_until(lambda: "Caches are synced" in run.log(), "synced caches")
    run.signal(signal.SIGHUP)  # was: exit 129 at once, etcd and kube-apiserver left running
    assert run.wait() == 0, run.log()
    assert 'signal="SIGHUP"' in run.log()
    run.assert_nothing_left()


def test_run_local_killed_with_sigkill_takes_its_cluster_along(local_run):
    run = local_run()
    run.wait_until(lambda: "Caches are synced" in run.log(), "synced caches")
    pids = run.cluster()
    assert set(pids.values()) == {"etcd", "kube-apiserver"}
    run.signal(signal.SIGKILL)  # no cleanup can run: the kernel's PR_SET_PDEATHSIG stops them
    run.wait()
    # pykcm is gone: the kernel's SIGKILLs are queued, and on a busy machine the exits take a moment.
    run.wait_until(lambda: not run.cluster(), "the cluster's end", timeout=10, running=False)


def test_run_local_keeps_its_temp_dir_for_a_failed_cluster_process_only(local_run):
    # pykcm's own error once the cluster is up: the cluster's logs do not explain it.
    run = local_run("--authentication-kubeconfig=/does/not/exist", "--secure-port", str(free_port()))
    assert run.wait() == 1
    assert run.log().strip().splitlines()[-1] == "pykcm: error: kubeconfig '/does/not/exist' does not exist"
    assert "keeping" not in run.log()
    run.assert_nothing_left()
    # A process of the cluster died: its log says why, the directory stays.
    run = local_run()
    run.wait_until(lambda: "Caches are synced" in run.log(), "synced caches")
    apiserver = next(pid for pid, name in run.cluster().items() if name == "kube-apiserver")
    os.kill(apiserver, signal.SIGKILL)
    assert run.wait() == 1
    [kept] = list(run.tmp.iterdir())
    assert f"keeping {kept} for its logs" in run.log() and (kept / "logs" / "kube-apiserver.log").exists()
    assert "pykcm: error: the local cluster lost kube-apiserver" in run.log()
    assert not run.cluster()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_testenv_start_interrupted_stops_what_it_started(local_run, signum):
    run = local_run("--dir", "{tmp}/env", command=("testenv", "start"))
    run.wait_until(lambda: "kube-apiserver" in run.cluster().values(), "a running kube-apiserver")
    run.signal(signum)  # was: the default action, etcd and kube-apiserver left running
    assert run.wait() == 128 + signum, run.log()
    assert run.log().strip().splitlines()[-2:] == ["stopping the local cluster", "pykcm: interrupted"]
    assert not run.cluster(), run.log()
