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

Record = Callable[[str, float], None]


async def send_review(client: RestClient, path: str, body: dict[str, Any], record: Record) -> dict[str, Any]:
    """POST the review to `path`; its answer, or the last try's error. `record(code, seconds)` counts each try."""
    wait = FIRST_WAIT
    for attempt in range(1, TRIES + 1):
        start = time.monotonic()
        try:
            review = await client.request("POST", path, body=body)
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
