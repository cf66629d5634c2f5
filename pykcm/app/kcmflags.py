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

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from pykcm.app.featuregates import go_bool, go_quote


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


# Take a value (`--flag=v` or `--flag v`).
IGNORED_VALUE_FLAGS = _words("""
--allow-metric-labels --allow-metric-labels-manifest --attach-detach-reconcile-sync-period
--authentication-token-webhook-cache-ttl --authorization-webhook-cache-authorized-ttl
--authorization-webhook-cache-unauthorized-ttl --cidr-allocator-type
--cloud-config --cloud-provider --cluster-cidr --cluster-name --cluster-signing-cert-file
--cluster-signing-duration --cluster-signing-key-file --cluster-signing-kube-apiserver-client-cert-file
--cluster-signing-kube-apiserver-client-key-file --cluster-signing-kubelet-client-cert-file
--cluster-signing-kubelet-client-key-file --cluster-signing-kubelet-serving-cert-file
--cluster-signing-kubelet-serving-key-file --cluster-signing-legacy-unknown-cert-file
--cluster-signing-legacy-unknown-key-file --concurrent-cron-job-syncs --concurrent-daemonset-syncs
--concurrent-deployment-syncs --concurrent-device-taint-eviction-syncs --concurrent-endpoint-syncs
--concurrent-ephemeralvolume-syncs --concurrent-gc-syncs --concurrent-horizontal-pod-autoscaler-syncs
--concurrent-job-syncs --concurrent-rc-syncs --concurrent-resource-quota-syncs
--concurrent-resourceclaim-syncs --concurrent-service-endpoint-syncs --concurrent-service-syncs
--concurrent-serviceaccount-token-syncs --concurrent-statefulset-syncs
--concurrent-ttl-after-finished-syncs --concurrent-validating-admission-policy-status-syncs
--controller-start-interval --disabled-metrics --emulated-version
--endpoint-updates-batch-period --endpointslice-updates-batch-period --external-cloud-volume-plugin
--flex-volume-plugin-dir --horizontal-pod-autoscaler-cpu-initialization-period
--horizontal-pod-autoscaler-downscale-stabilization --horizontal-pod-autoscaler-initial-readiness-delay
--horizontal-pod-autoscaler-sync-period --horizontal-pod-autoscaler-tolerance
--http2-max-streams-per-connection --large-cluster-size-threshold --leader-migration-config
--legacy-service-account-token-clean-up-period --log-flush-frequency --log-json-info-buffer-size
--log-text-info-buffer-size --max-endpoints-per-slice --min-compatibility-version
--mirroring-concurrent-service-endpoint-syncs --mirroring-endpointslice-updates-batch-period
--mirroring-max-endpoints-per-subset --node-cidr-mask-size --node-cidr-mask-size-ipv4
--node-cidr-mask-size-ipv6 --node-eviction-rate --node-monitor-grace-period --node-monitor-period
--node-startup-grace-period --pv-recycler-increment-timeout-nfs --pv-recycler-minimum-timeout-hostpath
--pv-recycler-minimum-timeout-nfs --pv-recycler-pod-template-filepath-hostpath
--pv-recycler-pod-template-filepath-nfs --pv-recycler-timeout-increment-hostpath
--pvclaimbinder-sync-period --requestheader-allowed-names --requestheader-client-ca-file
--requestheader-extra-headers-prefix --requestheader-group-headers --requestheader-uid-headers
--requestheader-username-headers --resource-quota-sync-period --root-ca-file
--route-reconciliation-period --secondary-node-eviction-rate --service-account-private-key-file
--service-cluster-ip-range --show-hidden-metrics-for-version --terminated-pod-gc-threshold
--tls-sni-cert-key --unhealthy-zone-threshold --vmodule
""")

# Booleans (`--flag`, `--flag=false`).
IGNORED_BOOL_FLAGS = _words("""
--allocate-node-cidrs --configure-cloud-routes --contention-profiling --disable-attach-detach-reconcile-sync
--disable-force-detach-on-timeout --disable-http2-serving --enable-dynamic-provisioning
--enable-garbage-collector --enable-hostpath-provisioner --enable-leader-migration
--log-json-split-stream --log-text-split-stream --permit-address-sharing --permit-port-sharing
""")

REFUSED_FLAGS = frozenset({"--tls-curve-preferences"})

# Every controller name and alias KCM v1.36.3 knows (its --help and its controller descriptors).
KCM_CONTROLLERS = _words("""
bootstrap-signer-controller certificatesigningrequest-approving-controller
certificatesigningrequest-cleaner-controller certificatesigningrequest-signing-controller
cloud-node-lifecycle-controller clusterrole-aggregation-controller cronjob-controller
daemonset-controller deployment-controller device-taint-eviction-controller disruption-controller
endpoints-controller endpointslice-controller endpointslice-mirroring-controller
ephemeral-volume-controller garbage-collector-controller horizontal-pod-autoscaler-controller
job-controller kube-apiserver-serving-clustertrustbundle-publisher-controller
legacy-serviceaccount-token-cleaner-controller namespace-controller node-ipam-controller
node-lifecycle-controller node-route-controller persistentvolume-attach-detach-controller
persistentvolume-binder-controller persistentvolume-expander-controller
persistentvolume-protection-controller persistentvolumeclaim-protection-controller
pod-garbage-collector-controller podcertificaterequest-cleaner-controller
podgroup-protection-controller replicaset-controller replicationcontroller-controller
resourceclaim-controller resourcepoolstatusrequest-controller resourcequota-controller
root-ca-certificate-publisher-controller selinux-warning-controller service-cidr-controller
service-lb-controller serviceaccount-controller serviceaccount-token-controller
statefulset-controller storage-version-migrator-controller storageversion-garbage-collector-controller
taint-eviction-controller token-cleaner-controller ttl-after-finished-controller ttl-controller
validatingadmissionpolicy-status-controller volumeattributesclass-protection-controller
attachdetach bootstrapsigner cloud-node-lifecycle clusterrole-aggregation cronjob csrapproving
csrcleaner csrsigning daemonset deployment disruption endpoint endpointslice endpointslicemirroring
ephemeral-volume garbagecollector horizontalpodautoscaling job legacy-service-account-token-cleaner
namespace nodeipam nodelifecycle persistentvolume-binder persistentvolume-expander podgc
pv-protection pvc-protection replicaset replicationcontroller resource-claim-controller
resourcequota root-ca-cert-publisher route service serviceaccount serviceaccount-token
statefulset storage-version-gc svm tokencleaner ttl ttl-after-finished
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
    boolean that is no strconv.ParseBool value (its other values are not checked: pykcm ignores them)."""
    if takes_value and word.value is None:
        raise FlagError(f"flag needs an argument: {word.flag}")
    if word.flag in IGNORED_BOOL_FLAGS and word.value is not None and go_bool(word.value) is None:
        value = go_quote(word.value)
        raise FlagError(
            f'invalid argument {value} for "{word.flag}" flag: strconv.ParseBool: parsing {value}: invalid syntax'
        )


def left_to_kcm(spec: list[str], pykcm_names: set[str]) -> tuple[list[str], list[str]]:
    """`--controllers` entries without the controllers only KCM has, and those names."""
    kept: list[str] = []
    left: list[str] = []
    for entry in spec:
        name = entry.strip().removeprefix("-")
        if name in KCM_CONTROLLERS and name not in pykcm_names:
            if name not in left:
                left.append(name)
        else:
            kept.append(entry)
    return kept, left
