"""apimachinery's error aggregate: several errors of one pass, reported together."""

from __future__ import annotations


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
