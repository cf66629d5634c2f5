"""pykcm.util.memory: what the freeze after a relist keeps, and what it does not."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from pykcm.util import memory


class Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the cyclic collector frees it


@pytest.fixture
def frozen_heap() -> Iterator[None]:
    gc.freeze()  # as after the first cache was built
    yield
    gc.unfreeze()
    gc.collect()


def test_garbage_in_the_oldest_generation_is_freed_before_a_relist_not_frozen(frozen_heap: None) -> None:
    cycle = Node()
    gone = weakref.ref(cycle)
    gc.collect()  # survives a full collection: now in the oldest generation, as a long-lived watch's objects
    del cycle  # the watch broke: garbage, which only the next full collection would see
    memory.collect_before_relist()
    memory.settle()  # the relist's cache built, then frozen with whatever is left
    assert gone() is None


def test_without_it_the_freeze_would_keep_that_garbage_for_good(frozen_heap: None) -> None:
    cycle = Node()
    gone = weakref.ref(cycle)
    gc.collect()
    del cycle
    memory.settle()
    gc.collect()
    assert gone() is not None  # why collect_before_relist exists


def test_garbage_frozen_by_an_earlier_relist_is_freed_by_the_next_sweep(frozen_heap: None,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A connection alive at one relist's freeze that dies later in a cycle (its error's traceback
    holds it): the periodic sweep before a relist unfreezes and finds it."""
    cycle = Node()
    gone = weakref.ref(cycle)
    memory.settle()  # frozen with the cache
    del cycle
    monkeypatch.setattr(memory, "_last_frozen_sweep", 0.0)
    monkeypatch.setattr(memory, "FROZEN_SWEEP_EVERY", 1e9)
    memory.collect_before_relist()
    assert gone() is not None  # within the interval: only the unfrozen heap is walked
    monkeypatch.setattr(memory, "FROZEN_SWEEP_EVERY", 0.0)
    memory.collect_before_relist()
    assert gone() is None
    assert memory._last_frozen_sweep > 0
