"""REST client metrics under client-go's names (component-base/metrics/prometheus/restclient).

Label values are hosts, verbs and HTTP codes: never object names.
"""

from __future__ import annotations

from prometheus_client import Counter, Histogram, disable_created_metrics

from pykcm.util.metricopts import ALPHA, kcm_help
from pykcm.util.promlabels import Children

disable_created_metrics()

REST_BUCKETS = (0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0)

# Every rest_client family is ALPHA in component-base.
rest_client_requests = Counter(
    "rest_client_requests_total",
    kcm_help(ALPHA, "Number of HTTP requests, partitioned by status code, method, and host."),
    ["code", "method", "host"],
)
rest_client_request_retries = Counter(
    "rest_client_request_retries_total",
    kcm_help(ALPHA, "Number of request retries, partitioned by status code, verb, and host."),
    ["code", "verb", "host"],
)
rest_client_request_duration = Histogram(
    "rest_client_request_duration_seconds",
    kcm_help(ALPHA, "Request latency in seconds. Broken down by verb, and host."),
    ["verb", "host"],
    buckets=REST_BUCKETS,
)
rest_client_rate_limiter_duration = Histogram(
    "rest_client_rate_limiter_duration_seconds",
    kcm_help(ALPHA, "Client side rate limiter latency in seconds. Broken down by verb, and host."),
    ["verb", "host"],
    buckets=REST_BUCKETS,
)

SIZE_BUCKETS = (64, 256, 512, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216)  # 64 B to 16 MiB
rest_client_request_size = Histogram(
    "rest_client_request_size_bytes", kcm_help(ALPHA, "Request size in bytes. Broken down by verb and host."),
    ["verb", "host"], buckets=SIZE_BUCKETS,
)
rest_client_response_size = Histogram(
    "rest_client_response_size_bytes", kcm_help(ALPHA, "Response size in bytes. Broken down by verb and host."),
    ["verb", "host"], buckets=SIZE_BUCKETS,
)

# Memoised children for the request path (see promlabels).
requests_by = Children(rest_client_requests)
retries_by = Children(rest_client_request_retries)
request_duration_by = Children(rest_client_request_duration)
rate_limiter_duration_by = Children(rest_client_rate_limiter_duration)
request_size_by = Children(rest_client_request_size)
response_size_by = Children(rest_client_response_size)
