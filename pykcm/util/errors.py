"""apimachinery's error aggregate (several errors of one pass, reported together), OS and ssl
errors in one line for the user, and a bug's exception described with its type and place."""

from __future__ import annotations

import os
import re
import shutil
import ssl
import sysconfig
import traceback

_SSL_SOURCE = re.compile(r" \(_ssl\.c:\d+\)$")
_ERRNO = re.compile(r"^\[Errno \d+\] ")
_STDLIB = tuple({sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"]})


class AggregateError(Exception):
    """Several errors of one pass, reported together like apimachinery's utilerrors.Aggregate."""

    def __init__(self, errors: list[BaseException]) -> None:
        self.errors = errors
        messages = list(dict.fromkeys(str(e) for e in errors))
        super().__init__(messages[0] if len(messages) == 1 else f"[{', '.join(messages)}]")


def aggregate(errors: list[BaseException]) -> BaseException | None:
    """None for no errors, the error itself for one, else an AggregateError."""
    if not errors:
        return None
    return errors[0] if len(errors) == 1 else AggregateError(errors)


def os_error_message(err: OSError) -> str:
    """An OS or ssl error in one line: "No such file or directory: /x", the ssl reason without its
    C source position ("[X509: KEY_VALUES_MISMATCH] key values mismatch"); of a failed copytree, the
    first file's reason and how many more failed, not the list of them all."""
    if isinstance(err, ssl.SSLError):
        return _SSL_SOURCE.sub("", str(err))
    if isinstance(err, shutil.Error) and err.args and isinstance(err.args[0], list) and err.args[0]:
        failed = err.args[0]  # (source, destination, reason) of every file that failed, reason a str
        first = failed[0][2] if isinstance(failed[0], tuple) and len(failed[0]) == 3 else failed[0]
        more = f" (and {len(failed) - 1} more failed)" if len(failed) > 1 else ""
        return _ERRNO.sub("", str(first)) + more
    if err.strerror:  # without "[Errno 111]"
        return f"{err.strerror}: {err.filename}" if err.filename else err.strerror
    return str(err) or type(err).__name__


def one_line(err: BaseException | str) -> str:
    """An error as one line: its message with all whitespace runs made single spaces (an OS or
    ssl error without Python's "[Errno N]" or the C source position)."""
    text = os_error_message(err) if isinstance(err, OSError) else str(err) or type(err).__name__
    return " ".join(text.split())


def described(err: BaseException) -> BaseException | str:
    """A built-in exception (KeyError, TypeError, ...) is a bug in a sync or handler, and its message
    alone ("'spec'") says nothing: add its type and where it was raised. API and pykcm errors say enough."""
    if type(err).__module__ != "builtins" or err.__traceback__ is None:
        return err
    text = f"{type(err).__name__}: {' '.join(str(err).split())}"  # one line: a plugin's load error is printed as is
    if isinstance(err, ModuleNotFoundError):  # it names the module; where the import was asked for is no help
        return text
    # The innermost frame of the caller's source: `<frozen os>` (os.environ[...]) or importlib's
    # import_module (a plugin's missing module) would hide the line that asked for it.
    frames = [f for f in traceback.extract_tb(err.__traceback__)
              if not f.filename.startswith("<") and not in_stdlib(f.filename)]
    if not frames:
        return text
    frame = frames[-1]
    return f"{text} (at {os.path.basename(frame.filename)}:{frame.lineno} in {frame.name})"


def in_stdlib(filename: str) -> bool:
    """Python's own library (not what is installed into it): frames there name no caller's code."""
    return filename.startswith(_STDLIB) and "-packages" not in filename  # site-, dist-packages are not


def described_with_type(err: BaseException) -> str:
    """`described`, and always with the type: for errors that end the run (a plugin that cannot be
    loaded, built or run), where "No module named 'x'" or "boom" alone hides what kind of failure it is."""
    text = described(err)
    return text if isinstance(text, str) else f"{type(err).__name__}: {one_line(err)}"
