"""OS errors in one line for the user, a failed copy of a whole tree included."""

from __future__ import annotations

import errno
import shutil

from pykcm.util.errors import os_error_message


def test_a_failed_copytree_is_its_first_reason_and_a_count() -> None:
    """shutil.Error holds (source, destination, reason) of every file that failed: its str() is the
    repr of them all."""
    full = "[Errno 28] No space left on device: '/cache/.build-x/src/go.sum'"
    failed = [("/src/go.sum", "/cache/.build-x/src/go.sum", full)]
    failed += [(f"/src/{n}.go", f"/cache/.build-x/src/{n}.go", full.replace("go.sum", f"{n}.go")) for n in range(3)]
    assert os_error_message(shutil.Error(failed)) == (
        "No space left on device: '/cache/.build-x/src/go.sum' (and 3 more failed)"
    )
    assert os_error_message(shutil.Error(failed[:1])) == "No space left on device: '/cache/.build-x/src/go.sum'"


def test_other_os_errors_are_unchanged() -> None:
    assert os_error_message(OSError(errno.ENOSPC, "No space left on device")) == "No space left on device"
    assert os_error_message(FileNotFoundError(errno.ENOENT, "No such file or directory", "/x")) == (
        "No such file or directory: /x"
    )
    assert os_error_message(shutil.Error("Destination path '/x' already exists")) == (
        "Destination path '/x' already exists"
    )
