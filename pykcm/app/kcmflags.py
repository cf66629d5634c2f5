"""kube-controller-manager's command line, as far as pykcm does not act on it.

A platform team copies KCM's flags (kubeadm's static pod, a hardened profile) to pykcm. Most of
them configure controllers KCM keeps running (node IPAM, signing, garbage collection, ...),
serving features pykcm lacks in a way that fails closed (request-header auth, SNI certificates,
profiling), or logging and metrics plumbing: pykcm accepts those, says once which it ignores,
and starts. One would make it serve other TLS than asked if ignored (curves): it is refused.
Controllers that KCM has and pykcm does not (`--controllers=*,bootstrapsigner,tokencleaner`)
are left to KCM, said once likewise. Flags of KCM v1.36.3's `--help`; pykcm's own are not here.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from pykcm.app.featuregates import go_bool, go_quote
from pykcm.app.options import FLOAT32_LIMIT, OptionsError, parse_bool
from pykcm.util.durations import DurationError, parse_duration


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


# Take a value (`--flag=v` or `--flag v`). The numbers and durations are checked as pflag parses
# them, so a typo in a copied command line stops the start as it stops KCM's; the rest is not read.
IGNORED_DURATION_FLAGS = _words("""
--attach-detach-reconcile-sync-period --authentication-token-webhook-cache-ttl
--authorization-webhook-cache-authorized-ttl --authorization-webhook-cache-unauthorized-ttl
--cluster-signing-duration --controller-start-interval --endpoint-updates-batch-period
--endpointslice-updates-batch-period --horizontal-pod-autoscaler-cpu-initialization-period
--horizontal-pod-autoscaler-downscale-stabilization --horizontal-pod-autoscaler-initial-readiness-delay
--horizontal-pod-autoscaler-sync-period --legacy-service-account-token-clean-up-period --log-flush-frequency
--mirroring-endpointslice-updates-batch-period --node-monitor-grace-period --node-monitor-period
--node-startup-grace-period --pvclaimbinder-sync-period --resource-quota-sync-period --route-reconciliation-period
""")
IGNORED_INT32_FLAGS = _words("""
--concurrent-cron-job-syncs --concurrent-daemonset-syncs --concurrent-deployment-syncs
--concurrent-device-taint-eviction-syncs --concurrent-endpoint-syncs --concurrent-ephemeralvolume-syncs
--concurrent-gc-syncs --concurrent-horizontal-pod-autoscaler-syncs --concurrent-job-syncs --concurrent-rc-syncs
--concurrent-resource-quota-syncs --concurrent-resourceclaim-syncs --concurrent-service-endpoint-syncs
--concurrent-service-syncs --concurrent-serviceaccount-token-syncs --concurrent-statefulset-syncs
--concurrent-ttl-after-finished-syncs --concurrent-validating-admission-policy-status-syncs
--large-cluster-size-threshold --max-endpoints-per-slice --mirroring-concurrent-service-endpoint-syncs
--mirroring-max-endpoints-per-subset --node-cidr-mask-size --node-cidr-mask-size-ipv4 --node-cidr-mask-size-ipv6
--pv-recycler-increment-timeout-nfs --pv-recycler-minimum-timeout-hostpath --pv-recycler-minimum-timeout-nfs
--pv-recycler-timeout-increment-hostpath --terminated-pod-gc-threshold
""")
IGNORED_INT64_FLAGS = _words("--http2-max-streams-per-connection")
IGNORED_FLOAT32_FLAGS = _words("--node-eviction-rate --secondary-node-eviction-rate --unhealthy-zone-threshold")
IGNORED_FLOAT64_FLAGS = _words("--horizontal-pod-autoscaler-tolerance")
IGNORED_VALUE_FLAGS = (
    IGNORED_DURATION_FLAGS | IGNORED_INT32_FLAGS | IGNORED_INT64_FLAGS | IGNORED_FLOAT32_FLAGS | IGNORED_FLOAT64_FLAGS
    | _words("""
--allow-metric-labels --allow-metric-labels-manifest --cidr-allocator-type --cloud-config --cloud-provider
--cluster-cidr --cluster-name --cluster-signing-cert-file --cluster-signing-key-file
--cluster-signing-kube-apiserver-client-cert-file --cluster-signing-kube-apiserver-client-key-file
--cluster-signing-kubelet-client-cert-file --cluster-signing-kubelet-client-key-file
--cluster-signing-kubelet-serving-cert-file --cluster-signing-kubelet-serving-key-file
--cluster-signing-legacy-unknown-cert-file --cluster-signing-legacy-unknown-key-file --disabled-metrics
--emulated-version --external-cloud-volume-plugin --flex-volume-plugin-dir --leader-migration-config
--log-json-info-buffer-size --log-text-info-buffer-size --min-compatibility-version
--pv-recycler-pod-template-filepath-hostpath --pv-recycler-pod-template-filepath-nfs --requestheader-allowed-names
--requestheader-client-ca-file --requestheader-extra-headers-prefix --requestheader-group-headers
--requestheader-uid-headers --requestheader-username-headers --root-ca-file --service-account-private-key-file
--service-cluster-ip-range --show-hidden-metrics-for-version --tls-sni-cert-key --vmodule
""")
)

# Booleans (`--flag`, `--flag=false`).
IGNORED_BOOL_FLAGS = _words("""
--allocate-node-cidrs --configure-cloud-routes --contention-profiling --disable-attach-detach-reconcile-sync
--disable-force-detach-on-timeout --disable-http2-serving --enable-dynamic-provisioning
--enable-garbage-collector --enable-hostpath-provisioner --enable-leader-migration
--log-json-split-stream --log-text-split-stream --permit-address-sharing --permit-port-sharing
""")

REFUSED_FLAGS = frozenset({"--tls-curve-preferences"})

# KCM v1.36.3's controllers: every alias and the name it stands for (its controller descriptors),
# and the names that have no alias.
KCM_CONTROLLER_ALIASES = dict(pair.split("=") for pair in _words("""
attachdetach=persistentvolume-attach-detach-controller bootstrapsigner=bootstrap-signer-controller
cloud-node-lifecycle=cloud-node-lifecycle-controller clusterrole-aggregation=clusterrole-aggregation-controller
cronjob=cronjob-controller csrapproving=certificatesigningrequest-approving-controller
csrcleaner=certificatesigningrequest-cleaner-controller csrsigning=certificatesigningrequest-signing-controller
daemonset=daemonset-controller deployment=deployment-controller disruption=disruption-controller
endpoint=endpoints-controller endpointslice=endpointslice-controller
endpointslicemirroring=endpointslice-mirroring-controller ephemeral-volume=ephemeral-volume-controller
garbagecollector=garbage-collector-controller horizontalpodautoscaling=horizontal-pod-autoscaler-controller
job=job-controller legacy-service-account-token-cleaner=legacy-serviceaccount-token-cleaner-controller
namespace=namespace-controller nodeipam=node-ipam-controller nodelifecycle=node-lifecycle-controller
persistentvolume-binder=persistentvolume-binder-controller
persistentvolume-expander=persistentvolume-expander-controller podgc=pod-garbage-collector-controller
pv-protection=persistentvolume-protection-controller pvc-protection=persistentvolumeclaim-protection-controller
replicaset=replicaset-controller replicationcontroller=replicationcontroller-controller
resource-claim-controller=resourceclaim-controller resourcequota=resourcequota-controller
root-ca-cert-publisher=root-ca-certificate-publisher-controller route=node-route-controller
service=service-lb-controller serviceaccount=serviceaccount-controller
serviceaccount-token=serviceaccount-token-controller statefulset=statefulset-controller
storage-version-gc=storageversion-garbage-collector-controller svm=storage-version-migrator-controller
tokencleaner=token-cleaner-controller ttl=ttl-controller ttl-after-finished=ttl-after-finished-controller
"""))
KCM_CONTROLLERS = frozenset(KCM_CONTROLLER_ALIASES) | frozenset(KCM_CONTROLLER_ALIASES.values()) | _words("""
device-taint-eviction-controller kube-apiserver-serving-clustertrustbundle-publisher-controller
podcertificaterequest-cleaner-controller podgroup-protection-controller resourcepoolstatusrequest-controller
selinux-warning-controller service-cidr-controller taint-eviction-controller
validatingadmissionpolicy-status-controller volumeattributesclass-protection-controller
""")


class FlagError(ValueError):
    """An ignored flag that KCM would refuse (pflag's syntax): its message is KCM's."""


@dataclass
class KcmFlags:
    """What `split_kcm_flags` took out of a `run` command line."""

    ignored: list[str] = field(default_factory=list)  # flag names, in order, once each
    refused: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Word:
    """One flag of a pflag command line with its value, or one other word."""

    flag: str  # `--name` or `-v`; the word itself where it is no flag
    value: str | None  # after `=`, or the next word for a flag that takes one
    words: list[str]  # as given: one word, or two; everything from a `--` on


def pflag_words(argv: list[str], takes_value: Callable[[str], bool] = lambda _: False) -> Iterator[Word]:
    """`argv` as pflag reads it: a flag that takes a value takes the next word unless it has `=`."""
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            yield Word(arg, None, argv[i:])
            return
        flag, sep, value = arg.partition("=")
        if sep:
            yield Word(flag, value, [arg])
        elif takes_value(flag) and i + 1 < len(argv):
            yield Word(flag, argv[i + 1], argv[i : i + 2])
            i += 1
        else:
            yield Word(flag, None, [arg])
        i += 1


def split_kcm_flags(argv: list[str]) -> tuple[list[str], KcmFlags]:
    """`argv` without the KCM flags pykcm ignores or refuses (with their values), and which; FlagError
    where pflag would refuse one of them."""

    def takes_value(flag: str) -> bool:
        return flag in IGNORED_VALUE_FLAGS or flag in REFUSED_FLAGS

    kept: list[str] = []
    found = KcmFlags()
    for word in pflag_words(argv, takes_value):
        _check_syntax(word, takes_value(word.flag))
        if takes_value(word.flag) or word.flag in IGNORED_BOOL_FLAGS:
            bucket = found.refused if word.flag in REFUSED_FLAGS else found.ignored
            if word.flag not in bucket:
                bucket.append(word.flag)
        else:
            kept += word.words
    return kept, found


def _check_syntax(word: Word, takes_value: bool) -> None:
    """What pflag refuses of an ignored flag, in its words: a value flag ending the command line, a
    boolean that is no strconv.ParseBool value, a number or duration that does not parse."""
    if takes_value and word.value is None:
        raise FlagError(f"flag needs an argument: {word.flag}")
    if word.value is None:
        return
    value = go_quote(word.value)
    if word.flag in IGNORED_BOOL_FLAGS and go_bool(word.value) is None:
        reason = f"strconv.ParseBool: parsing {value}: invalid syntax"
    else:
        reason = _value_error(word.flag, word.value)
    if reason:
        raise FlagError(f'invalid argument {value} for "{word.flag}" flag: {reason}')


def _value_error(flag: str, text: str) -> str | None:
    """Why pflag would not parse `text` for an ignored typed flag (Go's error), or None."""
    if flag in IGNORED_DURATION_FLAGS:
        try:
            parse_duration(text)
        except DurationError as err:  # Go's three messages
            if err.unit is None:
                return f"time: invalid duration {go_quote(text)}"
            what = f"unknown unit {go_quote(err.unit)}" if err.unit else "missing unit"
            return f"time: {what} in duration {go_quote(text)}"
        return None
    parser = next(((parse, bits) for flags, parse, bits in _NUMBER_FLAGS if flag in flags), None)
    if parser is None:
        return None  # not a typed flag: its value is not read
    parse, bits = parser
    try:
        parse(text, bits)
    except ValueError as err:
        return str(err)
    return None


_GO_OCTAL = re.compile(r"[+-]?0[0-7]+")  # Go's base 0 reads a leading 0 as octal; Python refuses it


def go_int(text: str, bits: int) -> int:
    """Go's strconv.ParseInt(text, 0, bits), as pflag parses an int flag; ValueError in Go's words."""
    try:
        if text != text.strip():
            raise ValueError
        value = int(text, 8) if _GO_OCTAL.fullmatch(text) else int(text, 0)
    except ValueError:
        raise ValueError(f"strconv.ParseInt: parsing {go_quote(text)}: invalid syntax") from None
    if not -(2 ** (bits - 1)) <= value < 2 ** (bits - 1):
        raise ValueError(f"strconv.ParseInt: parsing {go_quote(text)}: value out of range")
    return value


def go_float(text: str, bits: int) -> float:
    """Go's strconv.ParseFloat(text, bits); ValueError in Go's words (hex floats are not read)."""
    try:
        if text != text.strip():
            raise ValueError
        value = float(text)
    except ValueError:
        raise ValueError(f"strconv.ParseFloat: parsing {go_quote(text)}: invalid syntax") from None
    if (math.isinf(value) and "inf" not in text.lower()) or (bits == 32 and FLOAT32_LIMIT <= abs(value) < math.inf):
        raise ValueError(f"strconv.ParseFloat: parsing {go_quote(text)}: value out of range")
    return value


def left_to_kcm(spec: list[str], pykcm_names: set[str]) -> tuple[list[str], list[str]]:
    """`--controllers` entries without the controllers only KCM has, and those names."""
    kept: list[str] = []
    left: list[str] = []
    for entry in spec:
        name = entry.removeprefix("-")
        if name in KCM_CONTROLLERS and name not in pykcm_names:
            if name not in left:
                left.append(name)
        else:
            kept.append(entry)
    return kept, left



_NUMBER_FLAGS: tuple[tuple[frozenset[str], Callable[[str, int], object], int], ...] = (
    (IGNORED_INT32_FLAGS, go_int, 32), (IGNORED_INT64_FLAGS, go_int, 64),
    (IGNORED_FLOAT32_FLAGS, go_float, 32), (IGNORED_FLOAT64_FLAGS, go_float, 64),
)

# KCM's boolean flags (pflag) take `--flag`, `--flag=true` and `--flag=false`; typer's flag pairs
# take `--flag` and `--no-flag`. Translating the `=value` form keeps KCM command lines working,
# as does splitting pflag's `-v=4`, which click would read as the value "=4", and joining the
# repeats of a list flag, which pflag appends where click keeps the last (--feature-gates' too).
GO_BOOL_FLAGS = ("--leader-elect", "--use-service-account-credentials", "--profiling", "--authentication-skip-lookup",
                 "--authentication-tolerate-lookup-failure")
GO_LIST_FLAGS = ("--controllers", "--authorization-always-allow-paths", "--tls-cipher-suites", "--feature-gates")
VERSION_RAW = "--version-raw"  # what `--version=raw` (component-base's verflag) becomes


def translate_pflag_forms(argv: list[str]) -> list[str]:
    """`argv` with pflag's forms in the spelling the typer command line reads; FlagError for a bad boolean."""
    return _join_list_flags(_translate_bool_and_v(argv))


def _join_list_flags(argv: list[str]) -> list[str]:
    """`--controllers=a --controllers b` → `--controllers=a,b`, where the first one stood."""
    out: list[str] = []
    first: dict[str, int] = {}
    for word in pflag_words(argv, GO_LIST_FLAGS.__contains__):
        if word.flag in GO_LIST_FLAGS and word.value is not None:
            if word.flag in first:  # an empty one adds nothing, as pflag's
                flag, _, value = out[first[word.flag]].partition("=")
                out[first[word.flag]] = f"{flag}={','.join(v for v in (value, word.value) if v)}"
            else:
                first[word.flag] = len(out)
                out.append(f"{word.flag}={word.value}")
        else:
            out += word.words
    return out


def _translate_bool_and_v(argv: list[str]) -> list[str]:
    out: list[str] = []
    for word in pflag_words(argv):
        if word.flag == "--version" and word.value == "raw":
            out.append(VERSION_RAW)
        elif word.value is not None and (word.flag in GO_BOOL_FLAGS or word.flag == "--version"):
            try:
                enabled = parse_bool(word.value)
            except OptionsError as err:
                raise FlagError(f"invalid argument {word.value!r} for {word.flag}: {err}") from None
            if word.flag == "--version":
                out += [word.flag] if enabled else []  # `--version=false` runs, as KCM's
            else:
                out.append(word.flag if enabled else f"--no-{word.flag.removeprefix('--')}")
        elif word.value is not None and word.flag == "-v":
            out += [word.flag, word.value]
        else:
            out += word.words
    return out
