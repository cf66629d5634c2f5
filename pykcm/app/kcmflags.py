"""kube-controller-manager's command line, as far as pykcm does not act on it.

A platform team copies KCM's flags (kubeadm's static pod, a hardened profile) to pykcm. Most of
them configure controllers KCM keeps running (node IPAM, signing, garbage collection, ...),
serving features pykcm lacks in a way that fails closed (request-header auth, SNI certificates,
profiling), or logging and metrics plumbing: pykcm accepts those, says once which it ignores,
and starts. One would make it serve other TLS than asked if ignored (curves): it is refused.
Controllers that KCM has and pykcm does not (`--controllers=*,bootstrapsigner,tokencleaner`)
are left to KCM, said once likewise. Flags of KCM v1.36.3's `--help` and two deprecated ones it
hides; pykcm's own are not here.
The KCM numbers, durations, booleans, IP address and lists pykcm acts on are read here as pflag
reads them, left to right, so that they mean what they mean to KCM and the first bad one is refused
in KCM's words, whatever typer's version; flag names too (`--concurrent_gc_syncs` is
`--concurrent-gc-syncs`, as component-base's command sets pflag's normalization).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from pykcm.app.featuregates import go_bool
from pykcm.app.pflagvalues import (
    go_csv_record,
    go_int32_slice,
    go_ip,
    go_named_cert_key,
    go_quantity,
    go_string_to_string,
    go_vmodule,
)
from pykcm.app.pflagwords import Word, group_takes_next_word, pflag_words, shorthands
from pykcm.util.durations import DurationError, parse_duration
from pykcm.util.gostrconv import go_float, go_int, go_uint
from pykcm.util.log import go_quote


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


# Take a value (`--flag=v` or `--flag v`). The numbers, durations and _IGNORED_READ_VALUES' are checked as pflag
# parses them, so a typo in a copied command line stops the start as it stops KCM's; plain strings are not read.
IGNORED_DURATION_FLAGS = _words("""
--attach-detach-reconcile-sync-period --authentication-token-webhook-cache-ttl
--authorization-webhook-cache-authorized-ttl --authorization-webhook-cache-unauthorized-ttl
--cluster-signing-duration --controller-start-interval --endpoint-updates-batch-period
--endpointslice-updates-batch-period --horizontal-pod-autoscaler-cpu-initialization-period
--horizontal-pod-autoscaler-downscale-stabilization --horizontal-pod-autoscaler-initial-readiness-delay
--horizontal-pod-autoscaler-sync-period --legacy-service-account-token-clean-up-period --log-flush-frequency
--mirroring-endpointslice-updates-batch-period --node-monitor-grace-period --node-monitor-period
--node-startup-grace-period --pvclaimbinder-sync-period --resource-quota-sync-period --route-reconciliation-period
--node-sync-period
""")  # --node-sync-period, like --allow-untagged-cloud below: deprecated and hidden from KCM's --help
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
--allow-untagged-cloud --allocate-node-cidrs --configure-cloud-routes --contention-profiling
--disable-attach-detach-reconcile-sync
--disable-force-detach-on-timeout --disable-http2-serving --enable-dynamic-provisioning
--enable-garbage-collector --enable-hostpath-provisioner --enable-leader-migration
--log-json-split-stream --log-text-split-stream --permit-address-sharing --permit-port-sharing
""")

REFUSED_FLAGS = frozenset({"--tls-curve-preferences"})

# KCM's numbers and durations that pykcm acts on (Go types: KCM's and controller-manager's options,
# apiserver's serving, component-base's leader election and logging). Read here as pflag reads them,
# so a bad value gets KCM's message and typer gets the number KCM reads, in plain decimal (`0x20`,
# `010` are 32 and 8 to pflag); the ranges pykcm adds are typer's and Options.validate's.
ACCEPTED_INT32_FLAGS = _words("--concurrent-namespace-syncs --concurrent-replicaset-syncs --kube-api-burst")
ACCEPTED_INT_FLAGS = _words("--secure-port")  # Go's int: 64 bits
ACCEPTED_FLOAT32_FLAGS = _words("--kube-api-qps")
ACCEPTED_DURATION_FLAGS = _words("""
--controller-shutdown-timeout --leader-elect-lease-duration --leader-elect-renew-deadline
--leader-elect-retry-period --min-resync-period --namespace-sync-period
""")
VERBOSITY_FLAGS = _words("-v --v")  # component-base's: strconv.ParseUint(s, 10, 31)
HELP_FLAGS = _words("-h --help")  # cobra's: a boolean, `--help=false` is no help
# Other values pflag's Set parses as it reads them (an IP flag, string slices): the value typer gets.
_READ_VALUES: dict[str, Callable[[str], str]] = {
    "--bind-address": go_ip,
    **dict.fromkeys(("--controllers", "--tls-cipher-suites", "--authorization-always-allow-paths"),
                    lambda text: ",".join(go_csv_record(text))),  # run splits at commas: `"a,b"` is a, b
}
# The values pflag's Set checks of flags pykcm ignores or refuses: read only to refuse a bad one.
_IGNORED_READ_VALUES: dict[str, Callable[[str], object]] = {
    "--vmodule": go_vmodule, "--tls-sni-cert-key": go_named_cert_key, "--allow-metric-labels": go_string_to_string,
    "--tls-curve-preferences": go_int32_slice,
    **dict.fromkeys(("--log-json-info-buffer-size", "--log-text-info-buffer-size"), go_quantity),
    **dict.fromkeys(_words("""--disabled-metrics --emulated-version --min-compatibility-version
--requestheader-allowed-names --requestheader-extra-headers-prefix --requestheader-group-headers
--requestheader-uid-headers --requestheader-username-headers"""), go_csv_record),  # string slices
}
ACCEPTED_VALUE_FLAGS = (ACCEPTED_INT32_FLAGS | ACCEPTED_INT_FLAGS | ACCEPTED_FLOAT32_FLAGS | ACCEPTED_DURATION_FLAGS
                        | VERBOSITY_FLAGS | frozenset(_READ_VALUES))
LOG_FORMAT_FLAG, LOG_FORMATS = "--logging-format", ("text", "json")  # KCM v1.36.3's formats, pykcm's too

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
    help: bool = False  # cobra's help flag, its last value: it wins over every check after the flags parse


def split_kcm_flags(
    argv: list[str], value_options: frozenset[str] = frozenset(), own_options: frozenset[str] | None = None
) -> tuple[list[str], KcmFlags]:
    """`argv` without the KCM flags pykcm ignores or refuses (with their values), and which, its flag
    names as pflag reads them, its numbers in plain decimal, its IP address and lists as Go reads them;
    FlagError where pflag (or KCM's check of --logging-format) would refuse one.
    With `own_options` (the command's option names), a flag neither names is refused where it stands,
    as pflag refuses an unknown flag before a malformed value further on, and so are arguments."""

    def takes_value(flag: str) -> bool:
        return flag in IGNORED_VALUE_FLAGS or flag in REFUSED_FLAGS or flag in ACCEPTED_VALUE_FLAGS or (
            flag == LOG_FORMAT_FLAG)

    def word_after_is_value(flag: str) -> bool:  # `value_options`: the command's own (`--kubeconfig`)
        return takes_value(flag) or flag in value_options or group_takes_next_word(flag)

    def known(flag: str) -> bool:
        return own_options is None or flag in own_options or takes_value(flag) or flag in IGNORED_BOOL_FLAGS

    kept, arguments, found = argv[:1], [], KcmFlags()  # argv[0]: the command
    log_format = None
    for word in (one for group in pflag_words(argv[1:], word_after_is_value) for one in shorthands(group)):
        if (refusal := _unknown_flag(word, known)) is not None:
            raise FlagError(refusal)
        _check_syntax(word, takes_value(word.flag) or word.flag in value_options)
        if own_options is not None and (word.flag == "--" or not word.flag.startswith("-") or word.flag == "-"):
            arguments += word.words[1:] if word.flag == "--" else word.words
        elif word.flag in HELP_FLAGS:  # a boolean: `--help=false` is no help, the last one counts
            found.help = word.value is None or go_bool(word.value) is True
        elif word.flag in ACCEPTED_VALUE_FLAGS and word.value is not None:
            kept += _value_as_read(word.flag, word.value) if word.value or word.flag != "--bind-address" else []
        elif word.flag == LOG_FORMAT_FLAG:
            log_format = word.value
            kept += word.normalized()
        elif takes_value(word.flag) or word.flag in IGNORED_BOOL_FLAGS:
            bucket = found.refused if word.flag in REFUSED_FLAGS else found.ignored
            if word.flag not in bucket:
                bucket.append(word.flag)
        else:
            kept += word.normalized()
    if found.help:  # cobra prints the help before its Args check and KCM's own checks
        return [*kept, "--help"], found
    if any(arguments):  # cobra's Args check as KCM's: an empty argument is none, but named
        got = " ".join(map(go_quote, arguments))
        raise FlagError(f'"pykcm {argv[0]}" does not take any arguments, got [{got}]')
    if log_format is not None and log_format not in LOG_FORMATS:  # KCM checks it once the flags parse
        raise FlagError(f"format: Invalid value: {go_quote(log_format)}: Unsupported log format")
    return kept, found


def _unknown_flag(word: Word, known: Callable[[str], bool]) -> str | None:
    """pflag's words for a flag it cannot read, or None: bad syntax (`---x`, `--=x`), a name no one
    defines, a shorthand (one of a group: `-hx` is -h, then -x) named with the rest of its group."""
    raw = word.words[0]
    if raw in ("-", "--") or not raw.startswith("-"):
        return None
    if raw.startswith("--"):
        if raw[2] in "-=":
            return f"bad flag syntax: {raw}"
        return None if known(word.flag) else f"unknown flag: {word.given}"
    if known(word.flag):
        return None
    return f"unknown shorthand flag: '{raw[1]}' in {raw}"


def check_version_values(argv: list[str]) -> None:
    """FlagError in pflag's words for a bad `--version=` outside `run` (`pykcm --version=maybe`)."""
    for word in pflag_words(argv):
        if word.flag == "--version":
            _check_syntax(word, False)


def _value_as_read(flag: str, given: str) -> list[str]:
    """A checked flag as typer reads the value pflag read: a number in decimal, an IP address or a
    list as Go reads it (a duration as it is)."""
    value: object = read(given) if (read := _reader(flag)) else given
    text = repr(value) if isinstance(value, float) else str(value)
    return [flag, text] if flag == "-v" else [f"{flag}={text}"]


def _check_syntax(word: Word, takes_value: bool) -> None:
    """What pflag refuses of a KCM flag, in its words: a value flag ending the command line, a boolean
    that is no strconv.ParseBool value, a value pflag's Set parses (number, duration, list...) that does not."""
    if takes_value and word.value is None:
        raise FlagError(f"flag needs an argument: {_SHORT_MISSING.get(word.flag, word.given)}")
    if word.value is None:
        return
    value = go_quote(word.value)
    if _is_bool_flag(word.flag) and go_bool(word.value) is None and (
            (word.flag, word.value) != ("--version", "raw")):  # component-base's verflag takes "raw" too
        reason = f"strconv.ParseBool: parsing {value}: invalid syntax"
    else:
        reason = _value_error(word.flag, word.value)
    if reason:
        name = _BOTH_NAMES.get(word.flag, word.flag)  # pflag names a shorthand's long name too
        raise FlagError(f'invalid argument {value} for "{name}" flag: {reason}')


def _is_bool_flag(flag: str) -> bool:
    return flag in IGNORED_BOOL_FLAGS or flag in BOOL_VALUE_FLAGS or flag in HELP_FLAGS


_BOTH_NAMES = {"-v": "-v, --v", "--v": "-v, --v", "-h": "-h, --help", "--help": "-h, --help"}
_SHORT_MISSING = {"-v": "'v' in -v"}  # pflag's words for a shorthand without its value


def _value_error(flag: str, text: str) -> str | None:
    """Why pflag would not parse `text` for a typed KCM flag (Go's error), or None."""
    if flag in IGNORED_DURATION_FLAGS or flag in ACCEPTED_DURATION_FLAGS:
        try:
            parse_duration(text)
        except DurationError as err:  # Go's three messages
            if err.unit is None:
                return f"time: invalid duration {go_quote(text)}"
            what = f"unknown unit {go_quote(err.unit)}" if err.unit else "missing unit"
            return f"time: {what} in duration {go_quote(text)}"
        return None
    read = _reader(flag)
    if read is None:
        return None  # not a typed flag: its value is not read
    try:
        read(text)
    except ValueError as err:
        return str(err)
    return None


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
    (IGNORED_INT32_FLAGS | ACCEPTED_INT32_FLAGS, go_int, 32), (IGNORED_INT64_FLAGS | ACCEPTED_INT_FLAGS, go_int, 64),
    (IGNORED_FLOAT32_FLAGS | ACCEPTED_FLOAT32_FLAGS, go_float, 32), (IGNORED_FLOAT64_FLAGS, go_float, 64),
    (VERBOSITY_FLAGS, go_uint, 31),
)


def _reader(flag: str) -> Callable[[str], object] | None:
    """How pflag reads a typed flag's value, but a duration: a strconv function with its bit size, or
    _READ_VALUES' or _IGNORED_READ_VALUES'; None for a flag whose value is not read."""
    if read := _READ_VALUES.get(flag) or _IGNORED_READ_VALUES.get(flag):
        return read
    parser = next(((parse, bits) for flags, parse, bits in _NUMBER_FLAGS if flag in flags), None)
    return None if parser is None else lambda text: parser[0](text, parser[1])


# KCM's boolean flags (pflag) take `--flag`, `--flag=true` and `--flag=false`; typer's flag pairs
# take `--flag` and `--no-flag`. Translating the `=value` form keeps KCM command lines working,
# as does joining the repeats of a list flag, which pflag appends where click keeps the last
# (--feature-gates' too). pflag's -v forms are split_kcm_flags' (`run` has -v).
GO_BOOL_FLAGS = ("--leader-elect", "--use-service-account-credentials", "--profiling", "--authentication-skip-lookup",
                 "--authentication-tolerate-lookup-failure")
GO_LIST_FLAGS = ("--controllers", "--authorization-always-allow-paths", "--tls-cipher-suites", "--feature-gates")
VERSION_RAW = "--version-raw"  # what `--version=raw` (component-base's verflag) becomes


BOOL_VALUE_FLAGS = (*GO_BOOL_FLAGS, "--version")  # `--flag=value` read as strconv.ParseBool reads it


def translate_pflag_forms(argv: list[str], value_options: frozenset[str] = frozenset()) -> list[str]:
    """`argv` with pflag's forms in the spelling the typer command line reads. A boolean whose value
    does not parse is left as given: `split_kcm_flags` refuses it in its turn among the other flags.
    The word after one of `value_options` (`--kubeconfig`) is its value, whatever it looks like."""

    def takes_value(flag: str) -> bool:
        return flag in GO_LIST_FLAGS or flag in value_options

    return _join_list_flags(_translate_bool_forms(argv, takes_value), takes_value)


def _join_list_flags(argv: list[str], takes_value: Callable[[str], bool]) -> list[str]:
    """`--controllers=a --controllers b` → `--controllers=a,b`, where the first one stood."""
    out: list[str] = []
    first: dict[str, int] = {}
    for word in pflag_words(argv, takes_value):
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


def _translate_bool_forms(argv: list[str], takes_value: Callable[[str], bool]) -> list[str]:
    out: list[str] = []
    for word in pflag_words(argv, takes_value):
        if word.flag == "--version" and word.value == "raw":
            out.append(VERSION_RAW)
        elif word.value is not None and word.flag in BOOL_VALUE_FLAGS and (enabled := go_bool(word.value)) is not None:
            if word.flag == "--version":
                out += [word.flag] if enabled else []  # `--version=false` runs, as KCM's
            else:
                out.append(word.flag if enabled else f"--no-{word.flag.removeprefix('--')}")
        else:
            out += word.words
    return out
