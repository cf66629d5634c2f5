"""What the side-by-side benchmarks share: a controller process's figures from /proc, bounded
concurrency for the benchmark's own requests, and the KCM | pykcm | ratio table."""

from __future__ import annotations

import argparse
import asyncio
import compileall
import contextlib
import math
import os
import shutil
import sys
import tempfile
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from prometheus_client.parser import text_string_to_metric_families

from pykcm.client.resources import LEASES
from pykcm.client.rest import RestClient
from pykcm.testenv.cluster import running
from pykcm.testenv.controlplane import ControlPlane
from pykcm.testenv.errors import ControlPlaneError

T = TypeVar("T")

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
REPO = Path(__file__).resolve().parents[2]


# -- /proc ------------------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """utime + stime of a live process (fields 14 and 15 of /proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def running_still(pid: int) -> bool:
    """The process has not exited (a zombie not yet reaped counts as exited)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


def _status_mib(pid: int, field: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field):
            return int(line.split()[1]) / 1024
    return float("nan")


def peak_rss_mib(pid: int) -> float:
    """Peak resident set size (VmHWM) of a live process."""
    return _status_mib(pid, "VmHWM:")


def rss_mib(pid: int) -> float:
    """Resident set size (VmRSS) of a live process right now."""
    return _status_mib(pid, "VmRSS:")


# -- requests ---------------------------------------------------------------------------------------


async def bounded(coros: Iterable[Awaitable[T]], limit: int) -> list[T]:
    """Await all of `coros` with at most `limit` in flight; results in order."""
    gate = asyncio.Semaphore(limit)

    async def one(coro: Awaitable[T]) -> T:
        async with gate:
            return await coro

    return await asyncio.gather(*(one(c) for c in coros))


# -- one side ---------------------------------------------------------------------------------------


async def lease_transitions(api: RestClient, name: str) -> int:
    """leaseTransitions of the controller manager's Lease in kube-system: how often it changed hands."""
    return int((await api.get(LEASES, name, "kube-system"))["spec"].get("leaseTransitions", 0))


def on_fresh_cluster(directory: Path, label: str, bench: Callable[[ControlPlane], Awaitable[T]],
                     failed: Callable[[str], T], **cluster: Any) -> T:
    """`bench` on a fresh local cluster (`running(directory, **cluster)`), so caches and etcd start
    out equal for both sides; a side that fails is `failed(note)`, a note in the table rather than
    the end of the run. Afterwards (also after a failure or Ctrl-C) only the cluster's logs stay
    in `directory`: its etcd data, keys and kubeconfigs are removed."""
    print(f"[bench] {label}, cluster in {directory}", flush=True)
    try:
        with running(directory, log=lambda m: print(f"[testenv] {m}", flush=True), **cluster) as plane:
            return asyncio.run(bench(plane))
    except Exception as err:
        print(f"[bench] {label} failed: {err!r}", flush=True)
        return failed(f"{label}: failed: {err!r}"[:300])
    finally:
        keep_only_logs(directory)


# -- scratch directories ----------------------------------------------------------------------------


def keep_only_logs(directory: Path) -> None:
    """Remove everything in a cluster's `directory` but its `logs`: etcd's data can be gigabytes,
    and the private keys and kubeconfigs have no use once the cluster is stopped."""
    if not directory.is_dir():
        return
    for entry in directory.iterdir():
        if entry.name == "logs" and entry.is_dir() and not entry.is_symlink():
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)


@contextlib.contextmanager
def scratch_directory(prefix: str) -> Iterator[Path]:
    """A temp directory for a benchmark's cluster, removed at exit whatever ends the run (the
    control plane, stopped by `running` inside it, is gone by then)."""
    with tempfile.TemporaryDirectory(prefix=prefix, ignore_cleanup_errors=True) as tmp:
        yield Path(tmp)


def one_line_failures(main: Callable[[], None]) -> None:
    """Run `main`; a control plane that cannot start (or be built) ends the run with one line on
    stderr and exit status 1 rather than a traceback."""
    try:
        main()
    except ControlPlaneError as err:
        print(f"[bench] failed: {err}".replace("\n", " ")[:500], file=sys.stderr)
        sys.exit(1)


# -- the pykcm checkout -----------------------------------------------------------------------------


def checkout_problem(checkout: Path) -> str | None:
    """Why `checkout` is not a pykcm checkout to run from, or None: a wrong path would otherwise
    fall through to this checkout's pykcm (the child's path ends with it), an after/after table."""
    if not (checkout / "pykcm" / "app" / "options.py").is_file():
        return f"--pykcm-checkout {checkout}: no pykcm checkout there (no pykcm/app/options.py)"
    return None


def add_checkout_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pykcm-checkout", type=Path, default=REPO,
                        help="the checkout pykcm runs from (e.g. `git worktree add` of an earlier commit)")


def check_checkout_argument(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    args.pykcm_checkout = args.pykcm_checkout.resolve()
    if problem := checkout_problem(args.pykcm_checkout):
        parser.error(problem)


def add_pinning_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--apiserver-cpus", type=int, default=0,
                        help="pin the apiserver and etcd to this many CPUs (0: not pinned)")
    parser.add_argument("--controllers-share-cpus", action="store_true",
                        help="pin each controller manager to the apiserver's CPUs too (needs --apiserver-cpus; "
                             "without it the controller managers are not pinned at all)")


def check_pinning_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    cpus = len(os.sched_getaffinity(0))
    if not 0 <= args.apiserver_cpus < cpus:
        parser.error(f"--apiserver-cpus {args.apiserver_cpus}: this machine has {cpus} CPUs; leave one to the rest")
    if args.controllers_share_cpus and not args.apiserver_cpus:
        parser.error("--controllers-share-cpus needs --apiserver-cpus N: the CPUs to share")


def pin_to_cpus(pids: Iterable[int], cpus: int) -> None:
    """Every thread of each process onto the first `cpus` of this process's CPUs (threads made
    later inherit it), to starve the control plane as a busy control-plane node would."""
    chosen = sorted(os.sched_getaffinity(0))[:cpus]
    for pid in pids:
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(ProcessLookupError):  # a thread that just ended
                os.sched_setaffinity(int(task.name), chosen)


# -- Prometheus histograms --------------------------------------------------------------------------


def histogram_buckets(metrics_text: str, series: str, labels: dict[str, str] | None = None) -> dict[float, float]:
    """{le: cumulative count} of the `series` (a *_bucket name) samples carrying `labels`."""
    return {
        float(sample.labels["le"]): sample.value
        for family in text_string_to_metric_families(metrics_text)
        for sample in family.samples
        if sample.name == series and all(sample.labels.get(k) == v for k, v in (labels or {}).items())
    }


def bucket_quantile(buckets: dict[float, float], q: float, baseline: dict[float, float] | None = None) -> float | None:
    """The upper bound of the bucket the q-quantile falls under (of the counts since `baseline`,
    an earlier scrape), or None without observations."""
    counts = sorted((le, count - (baseline or {}).get(le, 0.0)) for le, count in buckets.items())
    if not counts or counts[-1][1] <= 0:
        return None
    return next(le for le, count in counts if count >= q * counts[-1][1])


def lag_figures(metrics_text: str, since: str | None = None) -> tuple[float | None, float | None]:
    """(p99 as the bucket bound it falls under, max) of pykcm's event-loop lag; the p99 counts only
    what was observed after `since`, an earlier scrape, when given."""
    series = "pykcm_event_loop_lag_seconds_bucket"
    baseline = histogram_buckets(since, series) if since is not None else None
    p99 = bucket_quantile(histogram_buckets(metrics_text, series), 0.99, baseline)
    maximum = next((float(line.split()[-1]) for line in metrics_text.splitlines()
                    if line.startswith("pykcm_event_loop_lag_max_seconds ")), None)
    return p99, maximum


# -- report -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Figure:
    """One row: a figure for KCM and for pykcm (None where a side has no such figure)."""

    name: str
    kcm: float | None
    pykcm: float | None
    fmt: str = "{:.1f}"

    def cell(self, value: float | None) -> str:
        return "-" if value is None else self.fmt.format(value)


def ratio(ours: float | None, theirs: float | None) -> str:
    """ours/theirs; n/a unless both are positive (a difference of medians can be negative: noise)."""
    if ours is None or theirs is None or not math.isfinite(ours) or not math.isfinite(theirs):
        return "n/a"
    if ours <= 0 or theirs <= 0:
        return "n/a"
    return f"{ours / theirs:.2f}x"


def side_by_side(groups: Sequence[tuple[str, Sequence[Figure], Sequence[str]]], label_width: int = 22,
                 figure_width: int = 26, label_header: str = "client limits") -> list[str]:
    """Table lines: per group (e.g. one client limit) its label, its figures and notes below."""
    figure_width = max([figure_width, *(len(f.name) + 2 for _, figures, _ in groups for f in figures)])
    header = f"{label_header:<{label_width}}{'figure':<{figure_width}}{'KCM':>12}{'pykcm':>12}{'pykcm/KCM':>12}"
    lines = [header, "-" * len(header)]
    for label, figures, notes in groups:
        for i, fig in enumerate(figures):
            lines.append(f"{label if i == 0 else '':<{label_width}}{fig.name:<{figure_width}}"
                         f"{fig.cell(fig.kcm):>12}{fig.cell(fig.pykcm):>12}{ratio(fig.pykcm, fig.kcm):>12}")
        lines += [f"{'':<{label_width}}note: {note}" for note in notes]
    lines.append("-" * len(header))
    return lines


def pykcm_env(checkout: Path = REPO) -> dict[str, str]:
    """Environment for a `python -m pykcm...` child: this checkout (or another, to measure an
    earlier commit) first on its path, whatever the working directory (an installed pykcm would
    otherwise win outside the checkout).

    The checkout's bytecode is written first, as `pip install` and the image do: with
    PYTHONDONTWRITEBYTECODE set (as on CI machines) the child would otherwise compile every
    module of pykcm at each start, about 0.1 s of CPU that an installed pykcm never spends.
    PYTHONSAFEPATH keeps `python -m` from putting the working directory (this checkout, when
    run from it) ahead of the checkout asked for."""
    for package in ("pykcm", "controllers"):
        compileall.compile_dir(checkout / package, quiet=1)
    path = os.environ.get("PYTHONPATH")
    return {"PYTHONPATH": f"{checkout}{os.pathsep}{path}" if path else str(checkout), "PYTHONSAFEPATH": "1"}
