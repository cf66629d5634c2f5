"""apimachinery's error aggregate (several errors of one pass, reported together), and OS and ssl
errors in one line for the user."""

from __future__ import annotations

import re
import ssl

_SSL_SOURCE = re.compile(r" \(_ssl\.c:\d+\)$")


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
    C source position ("[X509: KEY_VALUES_MISMATCH] key values mismatch")."""
    if isinstance(err, ssl.SSLError):
        return _SSL_SOURCE.sub("", str(err))
    if err.strerror:  # without "[Errno 111]"
        return f"{err.strerror}: {err.filename}" if err.filename else err.strerror
    return str(err) or type(err).__name__
