"""Labelled children of Prometheus metrics, looked up once per set of label values.

prometheus-client's `labels()` validates the values and takes a lock on every call (about 30 µs);
the hot paths (every request, every watch event) call it with a handful of distinct values, so
each child is memoised. Label values must stay bounded (hosts, verbs, codes, resource names),
which the metrics' own rule already requires.
"""

from __future__ import annotations

from typing import Generic, Protocol, TypeVar

T = TypeVar("T", bound="Labelled")


class Labelled(Protocol):
    def labels(self: T, *values: str) -> T: ...


class Children(Generic[T]):
    """`children(*values)` is `metric.labels(*values)`, created once."""

    __slots__ = ("_children", "_metric")

    def __init__(self, metric: T) -> None:
        self._metric = metric
        self._children: dict[tuple[str, ...], T] = {}

    def __call__(self, *values: str) -> T:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self._metric.labels(*values)
        return child
