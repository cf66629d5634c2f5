"""The upstream end-to-end suite: `e2e.test` built from k8s.io/kubernetes/test/e2e.

The binary is the upstream test package compiled unchanged, from the Go module in `gomod-e2e/`
(the control plane's module shape: k8s.io/kubernetes v1.36.3, every staging module replaced by
v0.36.3). It lives in the user cache under a directory named by that module's content hash, built
once under a lock like the control plane's binaries. The build has two steps so that progress is
visible: `go build -v` of the packages the suite compiles (one line each), then `go test -c`,
which reuses them and only compiles the suite's own test files and links (with -vet=off: vet
would analyse every one of its two thousand dependencies first).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from xml.etree import ElementTree

from .build import KUBERNETES_VERSION, LDFLAGS
from .errors import BuildError
from .gobuild import Log, build_dir, built_once, cache_dir, find_go, format_duration, is_executable, publish, run_go
from .interrupts import deferred

E2E_GOMOD_DIR = Path(__file__).parent / "gomod-e2e"
E2E_PACKAGE = "k8s.io/kubernetes/test/e2e"
E2E_BINARY = "e2e.test"


def _source_files() -> list[Path]:
    return sorted([E2E_GOMOD_DIR / "go.mod", E2E_GOMOD_DIR / "go.sum", *E2E_GOMOD_DIR.glob("*/*.go")])


def e2e_source_hash() -> str:
    digest = hashlib.sha256()
    for path in _source_files():
        digest.update(path.relative_to(E2E_GOMOD_DIR).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def e2e_cache_dir() -> Path:
    return cache_dir() / "e2e" / f"{KUBERNETES_VERSION}-{e2e_source_hash()}"


def ensure_e2e_test(log: Log = print) -> Path:
    """The path of `e2e.test`, building it on first use (about 10 minutes on 2 cores)."""
    return built_once(e2e_cache_dir() / E2E_BINARY, lambda directory: _build(directory, log), log)


def _build(target: Path, log: Log) -> None:
    go = find_go()
    log_path = target.with_name(target.name + ".build.log")
    log(f"building {E2E_BINARY} {KUBERNETES_VERSION} from {E2E_PACKAGE}: a one-time cost of several minutes; "
        f"log: {log_path}")
    started = time.monotonic()
    with build_dir(target) as tmp:
        src, out = tmp / "src", tmp / "bin" / E2E_BINARY
        shutil.copytree(E2E_GOMOD_DIR, src)  # the installed package may be read-only
        # The module's go.sum is complete (`go mod tidy` over suite/), so the build resolves nothing new.
        env = {"GOFLAGS": "-mod=readonly"}  # the control plane's settings, so its build cache is reused
        packages_log = log_path.with_name(log_path.name.replace(".build.log", ".packages.log"))
        run_go([go, "build", "-v", "-trimpath", "-tags", "tools", "./suite"],
               what=f"{E2E_BINARY} packages", cwd=src, temp=tmp, log_path=packages_log, log=log, env=env)
        run_go([go, "test", "-c", "-vet=off", "-trimpath", "-ldflags", LDFLAGS, "-o", str(out), E2E_PACKAGE],
               what=E2E_BINARY, cwd=src, temp=tmp, log_path=log_path, log=log, env=env)
        if not is_executable(out):
            raise BuildError(f"go test -c finished without producing {E2E_BINARY}; see {log_path}")
        target.mkdir(parents=True, exist_ok=True)
        publish(out, target / E2E_BINARY)
    log(f"built {E2E_BINARY} {KUBERNETES_VERSION} in {format_duration(time.monotonic() - started)} -> {target}")


# ----- running it


@dataclass(frozen=True)
class SpecResult:
    """One upstream test (a Ginkgo spec) as the JUnit report gives it."""

    name: str
    status: str  # "passed", "failed" or "skipped" (an interrupted or timed-out spec counts as failed)
    seconds: float
    message: str = ""


@dataclass(frozen=True)
class E2ERun:
    results: dict[str, SpecResult]
    exit_code: int | None  # None: killed at the hard time limit
    seconds: float
    log_path: Path
    junit_path: Path

    def with_status(self, status: str) -> set[str]:
        return {name for name, result in self.results.items() if result.status == status}


def go_regex_escape(text: str) -> str:
    """`text` as a literal in an RE2 (Go) regular expression; RE2 rejects Python's escaped spaces."""
    return "".join(f"\\{c}" if c in _RE2_SPECIAL else c for c in text)


_RE2_SPECIAL = set("\\.+*?()|[]{}^$")


def e2e_argv(
    binary: Path, kubeconfig: Path, report_dir: Path, *, focus: str, skip: str, timeout: float,
    kubectl: Path | None = None, seed: int = 1,
) -> list[str]:
    """The e2e.test command line for a local cluster. Nothing in it reaches beyond the cluster:
    the skeleton provider has no cloud, no image is pre-pulled, no log is gathered over SSH, no
    progress is POSTed anywhere (--progress-report-url stays empty)."""
    return [
        str(binary),
        f"--kubeconfig={kubeconfig}",
        "--provider=skeleton",
        f"--report-dir={report_dir}",  # junit_01.xml
        f"--e2e-output-dir={report_dir}",
        f"--repo-root={report_dir}",  # test files come from the binary's embedded copies
        f"--kubectl-path={kubectl or 'kubectl'}",
        "--prepull-images=false",
        "--disable-log-dump",
        "--allowed-not-ready-nodes=0",
        f"--ginkgo.focus={focus}",
        f"--ginkgo.skip={skip}",
        # The suite randomizes the order; one seed makes two runs (KCM, pykcm) run in the same order.
        f"--ginkgo.seed={seed}",
        f"--ginkgo.timeout={max(60, int(timeout) - 60)}s",  # Ginkgo's own limit, to still write a report
        "--ginkgo.no-color",
        "--ginkgo.v",
    ]


def run_e2e(
    binary: Path, kubeconfig: Path, report_dir: Path, *, focus: str, skip: str, timeout: float,
    kubectl: Path | None = None, log: Log = print,
) -> E2ERun:
    """Run e2e.test once, at most `timeout` seconds (then it is interrupted, then killed); its
    output goes to report_dir/e2e.log and its JUnit report to report_dir/junit_01.xml. Every
    PROGRESS_EVERY seconds a line says how many specs have finished. An exception while it runs
    (^C, a test's timeout) ends it, with its children, before it propagates; in a worker thread,
    which sees none, end_all() does."""
    report_dir.mkdir(parents=True, exist_ok=True)
    log_path, junit_path = report_dir / "e2e.log", report_dir / "junit_01.xml"
    junit_path.unlink(missing_ok=True)  # an earlier run's report must not pass for this run's
    argv = e2e_argv(binary, kubeconfig, report_dir, focus=focus, skip=skip, timeout=timeout, kubectl=kubectl)
    log(f"running {E2E_BINARY} (at most {format_duration(timeout)}); log: {log_path}")
    started = time.monotonic()
    # A TMPDIR of its own, removed afterwards: the suite leaves a directory there each time it starts
    # (test/e2e/kubectl/kuberc.go makes one while building the spec tree and only os.Remove()s it).
    with open(log_path, "w") as out, tempfile.TemporaryDirectory(prefix="e2e-tmp-") as tmp:
        out.write(" ".join(argv) + "\n")
        out.flush()
        env = {**os.environ, "TMPDIR": tmp}
        # A process group of its own, so that _end reaches the kubectl processes it runs too (the
        # terminal's ^C no longer does: _end, or end_all() for a run in a worker thread, forwards it).
        # deferred(): no signal raises between the fork and its record, which would leave it unseen; it
        # raises at the block's end, inside the try.
        proc: subprocess.Popen[bytes] | None = None
        try:
            with deferred():
                proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=report_dir, env=env,
                                        start_new_session=True)
                with _running_lock:
                    _running.add(proc)
            exit_code = _wait(proc, started, started + timeout, log, log_path)
        except BaseException:
            if proc is not None:
                # Not left running against a cluster the caller is about to stop, in a TMPDIR removed here.
                with contextlib.suppress(Exception):  # the log's stream may be what failed
                    log(f"{E2E_BINARY} interrupted: stopping it (at most {format_duration(INTERRUPT_GRACE)})")
                _end(proc, INTERRUPT_GRACE)
            raise
        finally:
            if proc is not None:
                with _running_lock:
                    _running.discard(proc)
    seconds = time.monotonic() - started
    results = _read_report(junit_path, log_path, log)
    counts = ", ".join(f"{sum(r.status == s for r in results.values())} {s}" for s in ("passed", "failed", "skipped"))
    log(f"{E2E_BINARY} exited {exit_code} after {format_duration(seconds)}: {counts}")
    return E2ERun(results, exit_code, seconds, log_path, junit_path)


PROGRESS_EVERY = 30.0  # seconds between progress lines while e2e.test runs
INTERRUPT_GRACE = 60.0  # seconds e2e.test gets after SIGINT to report and clean up, then SIGKILL
# Ginkgo's verbose reporter starts a line with its result for each spec that ran: "• [12.3 seconds]",
# "• [FAILED] [60.0 seconds]", "S [SKIPPED] [0.5 seconds]" (skipped at run time); the specs left out by
# --ginkgo.focus/skip are bare "S"s.
_SPEC_DONE = re.compile(rb"^(?:\xe2\x80\xa2 |S \[SKIPPED\])", re.MULTILINE)


def _wait(proc: subprocess.Popen[bytes], started: float, deadline: float, log: Log, log_path: Path) -> int | None:
    finished = _FinishedSpecs(log_path)
    while (left := deadline - time.monotonic()) > 0:
        try:
            return proc.wait(timeout=min(PROGRESS_EVERY, left))
        except subprocess.TimeoutExpired:
            pass
        if deadline > time.monotonic():
            log(f"  {E2E_BINARY}: {finished.count()} specs finished, "
                f"{format_duration(time.monotonic() - started)} elapsed (log: {log_path})")
    if (code := proc.poll()) is not None:
        return code
    log(f"{E2E_BINARY} ran past its time limit: interrupting it")
    _end(proc, INTERRUPT_GRACE)
    return None


# The e2e.test processes run_e2e() is waiting for, in any thread: for end_all().
_running: set[subprocess.Popen[bytes]] = set()
_running_lock = threading.Lock()


def end_all(grace: float | None = None, log: Log = print) -> None:
    """End every e2e.test now running as _end does (SIGINT to each group, SIGKILL after `grace` seconds,
    INTERRUPT_GRACE by default, or at once if this is interrupted too); each run_e2e() then returns or
    raises as usual. For a caller whose runs wait in worker threads, when its own wait raises: Python
    raises ^C (and interrupts' SIGTERM and SIGHUP) in the main thread only, and e2e.test, in a group of
    its own, no longer gets the terminal's ^C, so the workers would wait for it to end by itself."""
    grace = INTERRUPT_GRACE if grace is None else grace
    with _running_lock:
        procs = list(_running)
    if not procs:
        return
    with contextlib.suppress(Exception):  # the log's stream may be what failed
        log(f"interrupted: stopping {len(procs)} {E2E_BINARY} run(s) (at most {format_duration(grace)})")
    deadline = time.monotonic() + grace
    try:
        for proc in procs:
            _signal_group(proc, signal.SIGINT)
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.0, deadline - time.monotonic()))
    finally:
        for proc in procs:  # its waiting run_e2e() reaps it
            _signal_group(proc, signal.SIGKILL)


def _end(proc: subprocess.Popen[bytes], grace: float) -> None:
    """SIGINT to e2e.test's group (Ginkgo then reports the interrupted suite and runs its cleanup),
    then SIGKILL to the group after `grace` seconds, or at once if this wait is itself interrupted."""
    try:
        _signal_group(proc, signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(grace)
    finally:
        _signal_group(proc, signal.SIGKILL)  # also what it left running (kubectl), once it has exited
        proc.wait()


def _signal_group(proc: subprocess.Popen[bytes], signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):  # the group is gone
        os.killpg(proc.pid, signum)


class _FinishedSpecs:
    """Counts the result lines in the e2e log as it grows, reading only what is new."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset, self.done, self.partial = path, 0, 0, b""

    def count(self) -> int:
        with contextlib.suppress(OSError), open(self.path, "rb") as file:
            file.seek(self.offset)
            chunk = self.partial + file.read()
            self.offset = file.tell()
            complete, _, self.partial = chunk.rpartition(b"\n")
            self.done += len(_SPEC_DONE.findall(complete))
        return self.done


def _read_report(junit_path: Path, log_path: Path, log: Log) -> dict[str, SpecResult]:
    """The JUnit report's results; none if e2e.test wrote none, or was killed while writing it
    (Ginkgo writes it in place, so a SIGKILL can leave it cut short)."""
    if not junit_path.exists():
        return {}
    try:
        return parse_junit(junit_path)
    except (ElementTree.ParseError, OSError) as err:
        log(f"unreadable JUnit report {junit_path} ({err}); see {log_path}")
        return {}


def parse_junit(path: Path) -> dict[str, SpecResult]:
    """Spec name -> result from the suite's JUnit report. Specs appear as "[It] <full name>"; the
    suite's own set-up and report nodes are left out. Ginkgo's status attribute says passed,
    skipped, pending, or how it failed (failed, panicked, interrupted, timedout, aborted)."""
    results = {}
    for case in ElementTree.parse(path).getroot().iter("testcase"):
        name = case.get("name", "")
        if not name.startswith(_SPEC_PREFIX):
            continue
        name = name.removeprefix(_SPEC_PREFIX)
        status = _STATUS.get(case.get("status", ""), "failed")
        details = [e for e in (case.find("failure"), case.find("error"), case.find("skipped")) if e is not None]
        detail = details[0] if details else None
        message = "" if detail is None else detail.get("message") or (detail.text or "").strip()
        first_line = message.splitlines()[0] if message else ""
        results[name] = SpecResult(name, status, float(case.get("time") or 0), first_line)
    return results


_SPEC_PREFIX = "[It] "
_STATUS = {"passed": "passed", "skipped": "skipped", "pending": "skipped"}
