"""Which upstream e2e tests (k8s.io/kubernetes/test/e2e v1.36.3) run against pykcm, and why the
others do not.

The four groups the issue names, every test in them as `e2e.test --list-tests` prints it. RUN
runs on kwok's nodes (test_upstream.py), which report pods Running and Ready without running
anything; a test that execs into a pod, reads its logs or sends HTTP to it cannot pass on them,
with KCM or with pykcm: those (ON_REAL_NODE) run on the real node (test_upstream_containers.py).
[Serial], [Slow] and [Feature:...] tests are not excluded for that: the e2e.test run is serial
anyway (one Ginkgo process), and both namespace-drain speed tests run ([Serial], one of them
[Feature:ComprehensiveNamespaceDraining]).
"""

from __future__ import annotations

from collections.abc import Iterable

from pykcm.testenv.e2e import go_regex_escape

GROUPS = (
    "[sig-apps] ReplicaSet ",
    "[sig-api-machinery] Namespaces ",
    "[sig-api-machinery] OrderedNamespaceDeletion ",
    "[sig-auth] ServiceAccounts ",
)

TOKEN_ROTATION = "[sig-auth] ServiceAccounts should support InClusterConfig with token rotation [Slow]"

RUN = (
    "[sig-apps] ReplicaSet Replace and Patch tests [Conformance]",
    "[sig-apps] ReplicaSet Replicaset should have a working scale subresource [Conformance]",
    "[sig-apps] ReplicaSet should adopt matching pods on creation and release no longer matching pods [Conformance]",
    "[sig-apps] ReplicaSet should list and delete a collection of ReplicaSets [Conformance]",
    "[sig-apps] ReplicaSet should surface a failure condition on a common issue like exceeded quota",
    "[sig-apps] ReplicaSet should validate Replicaset Status endpoints [Conformance]",
    "[sig-api-machinery] Namespaces [Serial] should always delete fast (ALL of 100 namespaces in 150 seconds)"
    " [Feature:ComprehensiveNamespaceDraining]",
    "[sig-api-machinery] Namespaces [Serial] should apply a finalizer to a Namespace [Conformance]",
    "[sig-api-machinery] Namespaces [Serial] should apply an update to a Namespace [Conformance]",
    "[sig-api-machinery] Namespaces [Serial] should apply changes to a namespace status [Conformance]",
    "[sig-api-machinery] Namespaces [Serial] should delete fast enough (90 percent of 100 namespaces in 150 seconds)",
    "[sig-api-machinery] Namespaces [Serial] should ensure that all pods are removed when a namespace is deleted"
    " [Conformance]",
    "[sig-api-machinery] Namespaces [Serial] should ensure that all services are removed when a namespace is deleted"
    " [Conformance]",
    "[sig-api-machinery] Namespaces [Serial] should patch a Namespace [Conformance]",
    "[sig-api-machinery] OrderedNamespaceDeletion namespace deletion should delete pod first [Conformance]",
    "[sig-auth] ServiceAccounts no secret-based service account token should be auto-generated",
    "[sig-auth] ServiceAccounts should allow opting out of API token automount [Conformance]",
    "[sig-auth] ServiceAccounts should create a serviceAccountToken and ensure a successful TokenReview [Conformance]",
    "[sig-auth] ServiceAccounts should guarantee kube-root-ca.crt exist in any namespace [Conformance]",
    "[sig-auth] ServiceAccounts should run through the lifecycle of a ServiceAccount [Conformance]",
    "[sig-auth] ServiceAccounts should update a ServiceAccount [Conformance]",
)

# Need a real container: test_upstream_containers.py runs them on the real node (agnhost and
# busybox built here, see pykcm/testenv/testimages.py), not on kwok's nodes. What each needs:
ON_REAL_NODE = {
    "[sig-apps] ReplicaSet should serve a basic image on each replica with a public image [Conformance]":
        "sends HTTP to each pod through the apiserver's pod proxy: agnhost serve-hostname",
    "[sig-auth] ServiceAccounts ServiceAccountIssuerDiscovery should support OIDC discovery of service account issuer"
    " [Conformance]":
        "agnhost checks its projected token against the issuer's discovery endpoints (the issuer must be reachable"
        " from the pod without DNS: the real node's is https://10.0.0.1); the test reads its logs",
    "[sig-auth] ServiceAccounts should mount an API token into pods [Conformance]":
        "reads the mounted token, CA and namespace files with kubectl exec (busybox)",
    "[sig-auth] ServiceAccounts should mount projected service account token [Conformance]":
        "reads the projected token from agnhost mounttest's output (pod logs)",
    "[sig-auth] ServiceAccounts should set ownership and permission when RunAsUser or FsGroup is present [LinuxOnly]":
        "reads the token files' owner and mode from agnhost mounttest's output (pod logs)",
    TOKEN_ROTATION:
        "counts token rotations in the logs of agnhost inclusterclient (the kubelet renews a 10-minute token"
        " after 8 minutes: about 10 minutes, marker `slow`)",
}

# Not run anywhere here. README.md lists them (a unit test checks).
NOT_RUN = {
    "[sig-apps] ReplicaSet should serve a basic image on each replica with a private image":
        "upstream runs it only with --provider=gce (a private registry image), and it sends HTTP to the pods",
}


def focus_regex() -> str:
    return "|".join(go_regex_escape(group) for group in GROUPS)


def skip_regex() -> str:
    """On kwok's nodes: every test that needs a container."""
    return exactly(sorted({*NOT_RUN, *ON_REAL_NODE}))


def exactly(names: Iterable[str]) -> str:
    """A Ginkgo focus or skip matching these test names and no other of the groups."""
    return "|".join(go_regex_escape(name) for name in names)
