"""How the process treats the garbage collector, tuned for a few large, long-lived caches.

An informer's cache holds millions of small dicts and lists that live as long as the process
(or until the next relist). CPython's cyclic collector would walk all of them at every full
collection: about a second per 50,000 pods, with the event loop stopped. Nothing in a cache
forms reference cycles (objects decoded from JSON are trees), so once a cache is built it is
moved out of the collector's sight (`gc.freeze()`); reference counting still frees its objects
when a relist or a deletion drops them. The freeze takes every object the collector tracks, so
cyclic garbage in the oldest generation (a broken watch's connection) would be kept for good: a
full collection before each relist frees it, cheap then, as only the unfrozen heap is walked.
An object frozen by an earlier relist that dies later in a cycle is out of that collection's
reach: every FROZEN_SWEEP_EVERY at most, the collection before a relist unfreezes first and
walks everything (about a second per 50,000 pods; relists are rare, and the list costs more).
What a relist drops (the old cache) goes back to the system at once (`malloc_trim`): glibc would
otherwise keep the freed pages for reuse, and RSS would stay at the relist's peak.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import time
from collections.abc import Callable

# Young-generation threshold: collect after this many net allocations of container objects.
# The default (700) runs a young collection every page or two of a list; at 10,000 they cost
# as much in total, far less often, and leave fewer survivors to promote.
GEN0_THRESHOLD = 10_000
FROZEN_SWEEP_EVERY = 600.0  # seconds between full collections that also walk the frozen heap
_last_frozen_sweep = time.monotonic()


def tune() -> None:
    """Set the collector's thresholds for this process (once, at start)."""
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GEN0_THRESHOLD, gen1, gen2)


def settle() -> None:
    """After a cache was built: collect the young garbage, then freeze every survivor so that no
    later collection walks it again."""
    gc.collect(1)
    gc.freeze()


def collect_before_relist() -> None:
    """A full collection before a list replaces a cache, once caches are frozen (so it walks only
    what came after): what `settle()` freezes after the list is then the cache, not old garbage."""
    global _last_frozen_sweep
    if not gc.get_freeze_count():
        return
    now = time.monotonic()
    if now - _last_frozen_sweep >= FROZEN_SWEEP_EVERY:
        _last_frozen_sweep = now
        gc.unfreeze()  # settle() after the list freezes again what survives
    gc.collect()


def _find_malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to trim
        return None


_malloc_trim = _find_malloc_trim()


def return_freed() -> None:
    """Give the heap's free pages back to the system, after a large structure was dropped."""
    if _malloc_trim is not None:
        _malloc_trim(0)
