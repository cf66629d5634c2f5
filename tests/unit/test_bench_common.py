"""The benchmarks' helpers that need no cluster: the ratio column, the --pykcm-checkout check,
what stays of a cluster's directory, one-line failures, and the tables' rows."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from pykcm.testenv.errors import ControlPlaneError
from tests.bench import bench_churn as churn
from tests.bench import bench_namespace as namespace
from tests.bench import bench_requests as requests
from tests.bench.common import (
    REPO,
    check_checkout_argument,
    checkout_problem,
    keep_only_logs,
    one_line_failures,
    ratio,
    scratch_directory,
)


@pytest.mark.parametrize(("ours", "theirs", "expected"), [
    (2.0, 4.0, "0.50x"),
    (3.0, 3.0, "1.00x"),
    (None, 1.0, "n/a"),
    (1.0, None, "n/a"),
    (float("nan"), 1.0, "n/a"),
    (1.0, float("inf"), "n/a"),
    (1.0, 0.0, "n/a"),
    (0.0, 1.0, "n/a"),
    (-0.2, 0.5, "n/a"),  # a difference of medians below the baseline: noise, not a ratio
    (0.5, -0.2, "n/a"),
])
def test_ratio_is_na_unless_both_positive_and_finite(ours: float | None, theirs: float | None, expected: str) -> None:
    assert ratio(ours, theirs) == expected


def test_checkout_problem_accepts_this_checkout() -> None:
    assert checkout_problem(REPO) is None


def test_checkout_problem_names_a_directory_without_pykcm(tmp_path: Path) -> None:
    problem = checkout_problem(tmp_path / "no-such-checkout")
    assert problem is not None and "no-such-checkout" in problem


def test_check_checkout_argument_exits_with_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    with pytest.raises(SystemExit) as exit_info:
        check_checkout_argument(parser, argparse.Namespace(pykcm_checkout=tmp_path))
    assert exit_info.value.code == 2
    assert "no pykcm checkout there" in capsys.readouterr().err


def test_keep_only_logs_removes_etcd_keys_and_kubeconfigs(tmp_path: Path) -> None:
    for name in ("etcd/member/snap", "pki", "logs"):
        (tmp_path / name).mkdir(parents=True)
    (tmp_path / "etcd" / "member" / "snap" / "db").write_text("data")
    (tmp_path / "pki" / "admin.key").write_text("key")
    (tmp_path / "kubeconfig").write_text("config")
    (tmp_path / "logs" / "kube-apiserver.log").write_text("log")
    keep_only_logs(tmp_path)
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == [
        "logs", "logs/kube-apiserver.log"]


def test_keep_only_logs_ignores_a_directory_never_made(tmp_path: Path) -> None:
    keep_only_logs(tmp_path / "never-started")
    assert not (tmp_path / "never-started").exists()


def test_scratch_directory_is_removed_after_an_error() -> None:
    with pytest.raises(KeyboardInterrupt), scratch_directory("pykcm-test-bench-") as root:
        (root / "etcd").mkdir()
        made = root
        raise KeyboardInterrupt
    assert not made.exists()


def test_one_line_failures_turns_a_control_plane_error_into_one_line_and_exit_1(
        capsys: pytest.CaptureFixture[str]) -> None:
    def main() -> None:
        raise ControlPlaneError("kube-apiserver did not become ready\nsee its log")

    with pytest.raises(SystemExit) as exit_info:
        one_line_failures(main)
    assert exit_info.value.code == 1
    assert capsys.readouterr().err == "[bench] failed: kube-apiserver did not become ready see its log\n"


def test_churn_compares_kcm_with_the_pykcm_sides_total() -> None:
    kcm = churn.Result(cpu=70.0, peak_rss=136.0)
    ours = churn.Result(cpu=20.0, peak_rss=77.0, other_cpu=60.0, other_rss=120.0)
    rows = {f.name: (f.kcm, f.pykcm) for f in churn.figures(kcm, ours)}
    assert rows["CPU during churn: pykcm (s)"] == (None, 20.0)
    assert rows["CPU during churn: KCM (other controllers) (s)"] == (None, 60.0)
    assert rows["CPU during churn: KCM | KCM + pykcm (s)"] == (70.0, 80.0)
    assert rows["peak RSS: KCM | KCM + pykcm, sum of peaks (MiB)"] == (136.0, 197.0)
    assert "event-loop lag max since start (s)" in rows


def test_namespace_table_shows_a_failed_side_as_na_with_its_note() -> None:
    work = namespace.Workload(10, 1, 1, 1, 2)
    ours = namespace.Result(1.0, 2.0, 60.0, 0.4)
    failed = namespace.Result(notes=["kcm side: failed: TimeoutError()"])
    lines = namespace.table(work, ours, failed).splitlines()
    assert all(line.rstrip().endswith("n/a |") for line in lines[2:6])
    assert lines[-1] == "note: kcm side: failed: TimeoutError()"


def test_a_failing_request_child_is_reported_by_its_stderr_tail(tmp_path: Path) -> None:
    (tmp_path / "pykcm").mkdir()
    (tmp_path / "pykcm" / "__init__.py").write_text("raise RuntimeError('a broken checkout')\n")
    args = argparse.Namespace(requests=16, in_flight=4)
    with pytest.raises(requests.ChildFailed, match=r"exited with 1: .*RuntimeError: a broken checkout$"):
        requests.run_child(tmp_path, tmp_path / "kubeconfig", args)
