"""Command-line values turned into validated options: the --controllers list, booleans, feature gates
(Go durations are parsed in pykcm/util/durations.py)."""

from __future__ import annotations

import ipaddress
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

from pykcm.app import featuregates
from pykcm.client.protobuf import PROTOBUF
from pykcm.client.rest import JSON
from pykcm.serving.authz import misplaced_star
from pykcm.serving.tlspolicy import tls_policy
from pykcm.util.durations import go_duration
from pykcm.util.gostrconv import FLOAT32_LIMIT
from pykcm.util.log import go_quote

INT32_MAX = (1 << 31) - 1  # a Lease's leaseDurationSeconds


class OptionsError(ValueError):
    """A flag value the user must fix; the message is one line."""


class RegisteredController(Protocol):
    """What the --controllers parser reads of a controller class (or a ControllerInfo)."""

    name: str
    aliases: tuple[str, ...]
    enabled_by_default: bool


@dataclass(frozen=True)
class ControllerInfo:
    """A registered controller described by value, without its class (the tests use it)."""

    name: str
    aliases: tuple[str, ...] = ()
    enabled_by_default: bool = True


def resolve_controllers(spec: Iterable[str], known: Iterable[RegisteredController]) -> list[str]:
    """Evaluate KCM's --controllers list (controller-manager's IsControllerEnabled).

    For each controller the first entry naming it wins: `name` enables, `-name` disables. Only
    if no entry names it does `*` apply, enabling it if it is on by default; so
    `*,-replicaset` disables the ReplicaSet controller and `-namespace,namespace` leaves the
    namespace controller off. Aliases are accepted; unknown or empty names are an error. Returns
    canonical names in registration order.
    """
    controllers = list(known)
    canonical: dict[str, str] = {}
    for info in controllers:
        for alias in (info.name, *info.aliases):
            canonical[alias] = info.name
    entries = list(spec)  # an empty one (`a,,b`) or one with a space (`a, b`) is unknown, as in KCM
    for entry in entries:
        name = entry.removeprefix("-")
        if name != "*" and name not in canonical:
            raise OptionsError(f'"{name}" is not in the list of known controllers: {", ".join(sorted(canonical))}')
        if entry == "-*":
            raise OptionsError('"-*" is not allowed in --controllers')
    star = "*" in entries
    return [info.name for info in controllers if _controller_enabled(info, entries, canonical, star)]


def _controller_enabled(info: RegisteredController, entries: list[str], canonical: dict[str, str], star: bool) -> bool:
    for entry in entries:
        name = entry.removeprefix("-")
        if name != "*" and canonical[name] == info.name:
            return not entry.startswith("-")
    return star and info.enabled_by_default


LEASES_RESOURCE_LOCK = "leases"  # the only lock KCM still has; endpoints/configmaps locks were removed
LEADER_ELECTION_JITTER = 1.2  # client-go's JitterFactor: renew deadline must exceed retry period x this
DEFAULT_ALWAYS_ALLOW_PATHS = ("/healthz", "/readyz", "/livez")


def parse_bool(text: str) -> bool:
    """Go's strconv.ParseBool, as pflag accepts it in `--leader-elect=false`."""
    value = featuregates.go_bool(text)
    if value is None:
        raise OptionsError(f"invalid boolean {text!r} (use true or false)")
    return value


@dataclass
class Options:
    kubeconfig: str | None = None
    master: str | None = None
    controllers: list[str] = field(default_factory=lambda: ["*"])
    concurrent_replicaset_syncs: int = 5
    concurrent_namespace_syncs: int = 10
    namespace_sync_period: float = 300.0
    kube_api_qps: float = 20.0
    kube_api_burst: int = 30
    kube_api_content_type: str = PROTOBUF  # KCM's default; pykcm reads protobuf only for the pods watch
    min_resync_period: float = 12 * 3600.0
    controller_shutdown_timeout: float = 5.0  # in-flight syncs' time on SIGTERM (KCM's default is 10 s)
    local: bool = False
    use_service_account_credentials: bool = False
    # Leader election (client-go defaults; KCM's lease is kube-system/kube-controller-manager, ours "pykcm").
    leader_elect: bool = True
    leader_elect_lease_duration: float = 15.0
    leader_elect_renew_deadline: float = 10.0
    leader_elect_retry_period: float = 2.0
    leader_elect_resource_lock: str = LEASES_RESOURCE_LOCK
    leader_elect_resource_name: str = "pykcm"
    leader_elect_resource_namespace: str = "kube-system"
    # Secure serving of /healthz, /livez, /readyz and /metrics with delegated authn/authz.
    secure_port: int = 10257
    bind_address: str = "0.0.0.0"
    tls_cert_file: str | None = None
    tls_private_key_file: str | None = None
    tls_min_version: str = ""  # component-base's default: VersionTLS12
    tls_cipher_suites: list[str] = field(default_factory=list)  # Go's names; empty: OpenSSL's default list
    cert_dir: str = ""  # KCM's default: the self-signed pair is kept in memory
    client_ca_file: str | None = None  # the only client CA when given (no ConfigMap lookup for it)
    authentication_skip_lookup: bool = False  # no ConfigMap lookup: without --client-ca-file no client CA
    authentication_tolerate_lookup_failure: bool = False  # a failed lookup warns instead of stopping the start
    authentication_kubeconfig: str | None = None  # None: the main credentials
    authorization_kubeconfig: str | None = None  # None: the main credentials
    authorization_always_allow_paths: list[str] = field(default_factory=lambda: list(DEFAULT_ALWAYS_ALLOW_PATHS))
    profiling: bool = True  # KCM's default: /debug/flags/v is served (pykcm/serving/debugflags.py)
    flagz: dict[str, str] = field(default_factory=dict)  # every flag of the command line and its value, for /flagz
    # --feature-gates: the gates set, by name (featuregates.parse); unset gates take KCM's defaults.
    feature_gates: dict[str, bool] = field(default_factory=dict)
    # uvloop's event loop where it is installed (pykcm/app/eventloop.py); False: asyncio's own.
    uvloop: bool = True

    def validate(self) -> None:
        for name in ("concurrent_replicaset_syncs", "concurrent_namespace_syncs"):
            if getattr(self, name) < 1:
                raise OptionsError(f"--{name.replace('_', '-')} must be at least 1")
        # As client-go reads them: 0 is its default (5 QPS, burst 10) and a negative QPS turns
        # client-side limiting off; with a QPS, a burst must be given (client-go's NewForConfig); a
        # negative burst would fail every request, so it is refused.
        qps = self.kube_api_qps
        # KCM's flag is a float32; an infinite one (pflag takes "inf") would leave /configz unwritable, as Go's.
        if not math.isfinite(qps) or abs(qps) >= FLOAT32_LIMIT:
            raise OptionsError(f"--kube-api-qps: {qps} is out of range")
        if self.kube_api_qps > 0 and self.kube_api_burst <= 0:
            raise OptionsError("burst is required to be greater than 0 when RateLimiter is not set and QPS is set to "
                               "greater than 0")
        if self.kube_api_burst < 0 and self.kube_api_qps >= 0:
            raise OptionsError("--kube-api-burst must not be negative")
        if self.kube_api_content_type not in (JSON, PROTOBUF):
            raise OptionsError(
                f"--kube-api-content-type must be {JSON} or {PROTOBUF} (got {self.kube_api_content_type!r})"
            )
        if self.namespace_sync_period < 0 or self.min_resync_period < 0:  # 0: no periodic resync, as in KCM
            raise OptionsError("--namespace-sync-period and --min-resync-period must not be negative")
        if self.controller_shutdown_timeout < 0:
            raise OptionsError("--controller-shutdown-timeout must not be negative")
        if self.local and (self.kubeconfig or self.master):
            raise OptionsError("--local starts its own control plane; do not combine it with --kubeconfig/--master")
        self._validate_leader_election()
        self._validate_serving()
        try:
            featuregates.validate(self.feature_gates)
        except featuregates.FeatureGateError as err:
            raise OptionsError(f"--feature-gates: {err}") from None

    def feature_enabled(self, gate: str) -> bool:
        """Whether KCM's feature gate `gate` (one of featuregates.GATES) is on, as KCM's
        utilfeature.DefaultFeatureGate.Enabled answers it."""
        return featuregates.enabled(self.feature_gates, gate)

    def _validate_leader_election(self) -> None:
        if self.leader_elect_resource_lock != LEASES_RESOURCE_LOCK:
            raise OptionsError(
                f'--leader-elect-resource-lock must be "{LEASES_RESOURCE_LOCK}" '
                f"(got {self.leader_elect_resource_lock!r}; endpoints and configmaps locks no longer exist)"
            )
        if not self.leader_elect:
            return  # like component-base, durations only matter when electing
        lease, renew, retry = (
            self.leader_elect_lease_duration, self.leader_elect_renew_deadline, self.leader_elect_retry_period,
        )
        if min(lease, renew, retry) <= 0:
            raise OptionsError(
                "--leader-elect-lease-duration, --leader-elect-renew-deadline and --leader-elect-retry-period "
                "must be greater than 0"
            )
        if int(lease) > INT32_MAX:  # client-go writes int32(whole seconds): KCM's Lease would be refused or wrap
            raise OptionsError(
                f"--leader-elect-lease-duration ({go_duration(lease)}) is more than a Lease holds: "
                f"its leaseDurationSeconds is an int32, at most {INT32_MAX}s"
            )
        if lease <= renew:
            raise OptionsError(
                f"--leader-elect-lease-duration ({go_duration(lease)}) must be greater than "
                f"--leader-elect-renew-deadline ({go_duration(renew)})"
            )
        if renew <= LEADER_ELECTION_JITTER * retry:
            raise OptionsError(
                f"--leader-elect-renew-deadline ({go_duration(renew)}) must be greater than "
                f"{LEADER_ELECTION_JITTER} x --leader-elect-retry-period ({go_duration(retry)})"
            )
        if not self.leader_elect_resource_name or not self.leader_elect_resource_namespace:
            raise OptionsError("--leader-elect-resource-name and --leader-elect-resource-namespace must not be empty")

    def _validate_serving(self) -> None:
        if not 0 <= self.secure_port <= 65535:
            raise OptionsError(f"--secure-port {self.secure_port} must be between 0 (disabled) and 65535")
        try:
            ipaddress.ip_address(self.bind_address)
        except ValueError:
            raise OptionsError(f"--bind-address {self.bind_address!r} is not an IP address") from None
        if bool(self.tls_cert_file) != bool(self.tls_private_key_file):
            raise OptionsError("--tls-cert-file and --tls-private-key-file must be given together")
        for flag, check in (("--tls-min-version", lambda: tls_policy(min_version=self.tls_min_version)),
                            ("--tls-cipher-suites", lambda: tls_policy(cipher_suites=self.tls_cipher_suites))):
            try:
                check()
            except ValueError as err:
                raise OptionsError(f"{flag}: {err}") from None
        if (pattern := misplaced_star(self.authorization_always_allow_paths)) is not None:
            raise OptionsError(f"only trailing * allowed in {go_quote(pattern)}")  # path.go's words

