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
