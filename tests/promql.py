"""Crude PromQL scanning for the alert rules and dashboard tests, and what pykcm exports.

Not a parser: enough to list the metric names and label matchers an expression uses, for
expressions written in this repository (double-quoted strings, no `}` inside them).
`promtool check rules` is what proves the expressions parse.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from functools import cache

import pytest

IDENT = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_SELECTOR = re.compile(rf"(?<![\w$])({IDENT})?\s*\{{([^}}]*)\}}")
_MATCHER = re.compile(r'\s*([a-zA-Z_]\w*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*,?')
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_KEYWORDS = {
    *("and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right"),
    *("offset", "bool", "inf", "nan", "atan2"),
}
HISTOGRAM_SUFFIXES = ("_bucket", "_count", "_sum")
# Labels Prometheus adds to every series of a target discovered through a ServiceMonitor.
TARGET_LABELS = {"job", "instance", "namespace", "pod", "service", "endpoint", "container"}


@dataclass(frozen=True)
class Matcher:
    label: str
    op: str
    value: str


@dataclass(frozen=True)
class Selector:
    metric: str | None
    matchers: tuple[Matcher, ...]

    def matcher(self, label: str) -> Matcher | None:
        return next((m for m in self.matchers if m.label == label), None)


def selectors(expr: str) -> list[Selector]:
    """Every `metric{...}` in expr, with its matchers."""
    found = []
    for match in _SELECTOR.finditer(expr):
        body = match.group(2)
        matchers = []
        pos = 0
        while pos < len(body.rstrip()):
            m = _MATCHER.match(body, pos)
            if m is None:
                raise ValueError(f"cannot read matchers {body!r} in {expr!r}")
            matchers.append(Matcher(m.group(1), m.group(2), m.group(3)))
            pos = m.end()
        found.append(Selector(match.group(1), tuple(matchers)))
    return found


def metric_names(expr: str) -> set[str]:
    """Identifiers used as metric names: not functions, keywords, labels, strings or durations."""
    text = _STRING.sub('""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = _GROUPING.sub(" ", text)
    text = re.sub(r"\boffset\s+\S+", " ", text)
    text = re.sub(r"\$\{?\w+\}?", " ", text)
    names = set()
    for match in re.finditer(rf"(?<![\w.$])({IDENT})(\s*\()?", text):
        name, call = match.group(1), match.group(2)
        if call or name.lower() in _KEYWORDS:
            continue
        names.add(name)
    return names


@dataclass(frozen=True)
class Exported:
    """A series name pykcm's /metrics can carry, with the label names of its family."""

    name: str
    labels: frozenset[str]


@cache
def exported_series() -> dict[str, Exported]:
    """Every series name in prometheus_client's default registry once pykcm's metrics and its
    built-in controllers are imported: counters as name_total, histograms as _bucket/_count/_sum."""
    from prometheus_client import REGISTRY

    from pykcm.app import docs

    # The README's metrics table must list every metric, so what it imports to build the table
    # (the runtime's modules and every registered controller) registers every collector.
    docs.metrics_markdown()

    # Label names are not part of a childless family's samples; read them from the collectors
    # (prometheus_client keeps them as _labelnames, on metric objects and metric families alike).
    labels_of: dict[str, frozenset[str]] = {}
    for collector, names in REGISTRY._collector_to_names.items():  # type: ignore[attr-defined]
        for name in names:
            labels_of[name] = frozenset(getattr(collector, "_labelnames", ()))
    series: dict[str, Exported] = {}
    for family in REGISTRY.collect():
        labels = labels_of.get(family.name) or frozenset(getattr(family, "_labelnames", ()))
        if family.type == "counter":
            entries = {f"{family.name}_total": labels}
        elif family.type == "histogram":
            entries = {family.name + suffix: labels for suffix in HISTOGRAM_SUFFIXES}
            entries[family.name + "_bucket"] = labels | {"le"}
        else:
            entries = {family.name: labels}
        for name, names_labels in entries.items():
            series[name] = Exported(name, names_labels)
        for sample in family.samples:  # process_*/python_* families list their samples' labels
            series.setdefault(sample.name, Exported(sample.name, frozenset(sample.labels)))
    series["up"] = Exported("up", frozenset())  # written by Prometheus for every target
    return series


def promtool() -> str:
    """promtool's path, or skip: it comes from Debian's `prometheus` package (.ci/run installs it)."""
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("promtool is not installed (Debian package `prometheus`; .ci/run installs it)")
    return path
