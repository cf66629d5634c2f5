"""The secure port's authentication and authorization metrics, as k8s.io/apiserver v0.36.3 defines
them for KCM's delegated auth (all ALPHA):

- `apiserver_delegated_authn_request_*` and `apiserver_delegated_authz_request_*`
  (authenticatorfactory, authorizerfactory): one per TokenReview or SubjectAccessReview sent (a
  cached answer sends none), by the answer's HTTP code, or `<error>` when there was no answer;
- `authentication_attempts`, `authentication_duration_seconds` and `authenticated_user_requests`
  (endpoints/filters): one per request, `success` (anonymous included) or `error` (a token the
  apiserver did not accept, or could not review); `failure` needs anonymous off, which KCM's
  delegated authentication never is;
- `authorization_attempts_total`, `authorization_duration_seconds`: one per authenticated request,
  `allowed` (privileged groups and always-allowed paths too: they are authorizers in the same
  union), `denied`, `no-opinion` or `error`.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import REGISTRY, Counter, Histogram, Metric, disable_created_metrics
from prometheus_client.registry import Collector

from pykcm.client.errors import ApiError, TransportError
from pykcm.util.metricopts import ALPHA, exponential_buckets, kcm_help

disable_created_metrics()

DELEGATED_BUCKETS = (0.25, 0.5, 0.7, 1.0, 1.5, 3.0, 5.0, 10.0)
FILTER_BUCKETS = exponential_buckets(0.001, 2, 15)
# A review's `code`: what the apiserver's create handler answers a review it made (RestClient gives
# a success answer's body only, and a review is made or refused), else the error's code, else
# `<error>` (the webhook clients' label for no HTTP answer).
CREATED = "201"
NO_ANSWER = "<error>"


def _delegated(kind: str) -> tuple[Counter, Histogram]:
    """authenticatorfactory's or authorizerfactory's pair (`kind` authn or authz): one per review sent."""
    return (
        Counter(f"apiserver_delegated_{kind}_request_total",
                kcm_help(ALPHA, "Number of HTTP requests partitioned by status code."), ["code"]),
        Histogram(f"apiserver_delegated_{kind}_request_duration_seconds",
                  kcm_help(ALPHA, "Request latency in seconds. Broken down by status code."), ["code"],
                  buckets=DELEGATED_BUCKETS),
    )


delegated_authn_requests, delegated_authn_duration = _delegated("authn")
delegated_authz_requests, delegated_authz_duration = _delegated("authz")
authentication_duration = Histogram(
    "authentication_duration_seconds",
    kcm_help(ALPHA, "Authentication duration in seconds broken out by result."), ["result"], buckets=FILTER_BUCKETS,
)
authorization_attempts = Counter(
    "authorization_attempts_total",
    kcm_help(ALPHA, "Counter of authorization attempts broken down by result. It can be either 'allowed', 'denied', "
             "'no-opinion' or 'error'."),
    ["result"],
)
authorization_duration = Histogram(
    "authorization_duration_seconds",
    kcm_help(ALPHA, "Authorization duration in seconds broken out by result."), ["result"], buckets=FILTER_BUCKETS,
)


class _GoCounterType(str):
    """The type `counter` as generate_latest prints it, but unequal to the "counter" it checks
    before adding `_total` to a family's HELP and TYPE names (OpenMetrics' rule). Go's client
    prints a family under its defined name, and apiserver defines two counters without `_total`."""

    def __eq__(self, other: object) -> bool:
        return other is self

    def __hash__(self) -> int:
        return id(self)


_COUNTER = _GoCounterType("counter")


class _UnsuffixedCounter(Collector):
    """A counter by one label, exposed under its Go name (no `_total`); updated on the event loop."""

    def __init__(self, name: str, documentation: str, label: str) -> None:
        self.name, self.documentation, self.label = name, documentation, label
        self.counts: dict[str, float] = {}

    def inc(self, value: str) -> None:
        self.counts[value] = self.counts.get(value, 0.0) + 1

    def collect(self) -> Iterable[Metric]:
        family = Metric(self.name, self.documentation, "counter")
        family.type = _COUNTER
        for value, count in sorted(self.counts.items()):
            family.add_sample(self.name, {self.label: value}, count)
        yield family


authentication_attempts = _UnsuffixedCounter(
    "authentication_attempts", kcm_help(ALPHA, "Counter of authenticated attempts."), "result"
)
# By apiserver's compressUsername: a handful of values, never a user's name.
authenticated_user_requests = _UnsuffixedCounter(
    "authenticated_user_requests", kcm_help(ALPHA, "Counter of authenticated requests broken out by username."),
    "username",
)
REGISTRY.register(authentication_attempts)
REGISTRY.register(authenticated_user_requests)

_KNOWN_USERNAMES = frozenset({"admin", "client", "kube_proxy", "kubelet", "system:serviceaccount:kube-system:default"})


def compress_username(name: str) -> str:
    """apiserver's compressUsername: known internal identities as they are, else `email_id` or `other`."""
    if name in _KNOWN_USERNAMES:
        return name
    return "email_id" if "@" in name else "other"


def record_authentication(result: str, seconds: float, username: str | None = None) -> None:
    """The authentication filter's metrics; `username` on success."""
    authentication_attempts.inc(result)
    authentication_duration.labels(result).observe(seconds)
    if username is not None:
        authenticated_user_requests.inc(compress_username(username))


def record_authorization(result: str, seconds: float) -> None:
    authorization_attempts.labels(result).inc()
    authorization_duration.labels(result).observe(seconds)


def review_code(err: ApiError | TransportError) -> str:
    return str(err.code) if isinstance(err, ApiError) else NO_ANSWER


def record_token_review(code: str, seconds: float) -> None:
    delegated_authn_requests.labels(code).inc()
    delegated_authn_duration.labels(code).observe(seconds)


def record_access_review(code: str, seconds: float) -> None:
    delegated_authz_requests.labels(code).inc()
    delegated_authz_duration.labels(code).observe(seconds)
