"""The test helpers run the code of the checkout they live in, never an installed copy."""

import subprocess
import sys
from pathlib import Path

from tests.support import CHECKOUT, checkout_env


def test_child_pykcm_imports_this_checkout_from_any_directory(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", "import pykcm, pykcm.controllers as c; print(pykcm.__file__); print(c.__file__)"],
        capture_output=True, text=True, check=True, cwd=tmp_path, env=checkout_env({"PYTHONPATH": "/elsewhere"}),
    ).stdout.split()
    expected = [CHECKOUT / "pykcm" / "__init__.py", CHECKOUT / "controllers" / "__init__.py"]
    assert [Path(p).resolve() for p in out] == expected


def test_a_checkout_the_caller_names_comes_first(tmp_path: Path) -> None:
    # How the benchmarks measure an earlier commit: its worktree on the caller's PYTHONPATH.
    earlier = tmp_path / "earlier"
    (earlier / "pykcm").mkdir(parents=True)
    (earlier / "pykcm" / "__init__.py").write_text("")
    out = subprocess.run(
        [sys.executable, "-c", "import pykcm; print(pykcm.__file__)"],
        capture_output=True, text=True, check=True, cwd=tmp_path, env=checkout_env({"PYTHONPATH": str(earlier)}),
    ).stdout.strip()
    assert Path(out).resolve() == earlier / "pykcm" / "__init__.py"
