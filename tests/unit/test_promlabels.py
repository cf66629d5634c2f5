"""Memoised metric children: the same child prometheus-client would give, made once."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

from pykcm.util.promlabels import Children


def test_children_are_the_metrics_own_and_made_once() -> None:
    counter = Counter("demo_total", "demo", ["code"], registry=CollectorRegistry())
    calls = []
    labels = counter.labels

    def counting_labels(*values: str) -> Counter:
        calls.append(values)
        return labels(*values)

    counter.labels = counting_labels  # type: ignore[method-assign]
    by_code = Children(counter)
    by_code("200").inc()
    by_code("200").inc()
    by_code("404").inc()
    assert calls == [("200",), ("404",)]
    assert by_code("200") is labels("200")
    assert labels("200")._value.get() == 2
