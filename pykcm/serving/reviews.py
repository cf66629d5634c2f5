"""Sending a TokenReview or SubjectAccessReview as KCM's delegated authentication and
authorization send theirs (k8s.io/apiserver's webhook.WithExponentialBackoff with
DefaultAuthWebhookRetryBackoff and DefaultShouldRetry): a transient failure is tried again, up to
five tries in all, and every try is counted.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from typing import Any

from pykcm.client.errors import ApiError, TransportError
from pykcm.client.rest import RestClient
from pykcm.serving import metrics

# DefaultAuthWebhookRetryBackoff: 0.5 s before the second try, growing 1.5 times, jitter 0.2.
TRIES = 5
FIRST_WAIT = 0.5
WAIT_FACTOR = 1.5
JITTER = 0.2

# KCM's TokenRequestTimeout bounds a TokenReview, tries and waits together; its authorization
# client's timeout bounds each SubjectAccessReview try (the REST client's Retry-After waits included).
REVIEW_TIMEOUT = 10.0

Record = Callable[[str, float], None]


async def send_review(client: RestClient, path: str, body: dict[str, Any], record: Record, *,
                      total: float | None = None, each: float | None = None) -> dict[str, Any]:
    """POST the review to `path`; its answer, or the last try's error. `record(code, seconds)` counts
    each try. `total` bounds all tries and waits, `each` every try: past either, a TransportError."""
    try:
        async with asyncio.timeout(total):
            return await _tries(client, path, body, record, each)
    except TimeoutError:  # `total`'s: each try's is turned into a TransportError in _tries
        raise TransportError(f"POST {path}: context deadline exceeded") from None


async def _tries(client: RestClient, path: str, body: dict[str, Any], record: Record,
                 each: float | None) -> dict[str, Any]:
    wait = FIRST_WAIT
    for attempt in range(1, TRIES + 1):
        start = time.monotonic()
        try:
            async with asyncio.timeout(each):
                review = await client.request("POST", path, body=body)
        except TimeoutError:
            record(metrics.NO_ANSWER, time.monotonic() - start)
            raise TransportError(f"POST {path}: context deadline exceeded") from None  # not tried again
        except asyncio.CancelledError:  # `total` ran out during this try (or the caller left)
            record(metrics.NO_ANSWER, time.monotonic() - start)
            raise
        except (ApiError, TransportError) as err:
            record(metrics.review_code(err), time.monotonic() - start)
            if attempt == TRIES or not should_retry(err):
                raise
            await asyncio.sleep(wait * (1 + random.random() * JITTER))
            wait *= WAIT_FACTOR
            continue
        record(metrics.CREATED, time.monotonic() - start)
        return review
    raise AssertionError("unreachable")  # the last try returns or raises


def should_retry(err: ApiError | TransportError) -> bool:
    """DefaultShouldRetry: a reset connection, an internal error, a timeout, too many requests, or
    an answer that asks to be tried again later (a refused connection is not retried)."""
    if isinstance(err, TransportError):
        return err.connection_reset
    if err.reason in ("InternalError", "Timeout", "TooManyRequests") or err.code == 429:
        return True
    # SuggestsClientDelay: a ServerTimeout with details, or any retryAfterSeconds.
    return bool(err.status.get("details")) and (err.reason == "ServerTimeout" or
                                                 int(err.details.get("retryAfterSeconds") or 0) > 0)
