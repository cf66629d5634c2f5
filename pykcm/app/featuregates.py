"""`--feature-gates` as KCM v1.36.3 reads it, for the gates that change what pykcm does.

KCM's flag is component-base's ComponentGlobalsRegistry flag: `component:Name=bool` pairs split on
commas, the component `kube` or left out (not both), repeats of the flag adding to the list, and
a later setting of a gate winning. Its one-line errors (`missing bool value for X`, ...) are
kept word for word. The gates pykcm knows are KCM's (pkg/features/kube_features.go and client-go's
known_features.go) whose code paths pykcm's controllers implement:

- acted on: DeploymentReplicaSetTerminatingReplicas (status.terminatingReplicas),
  StaleControllerConsistencyReplicaSet (the stale-cache check), PodDeletionCost (the
  pod-deletion-cost annotation in the scale-down ranking), ComponentFlagz and ComponentStatusz
  (component-base's: /flagz and /statusz served), all beta and on, and AllBeta, which sets every
  beta gate not set by name;
- locked to true (GA): LogarithmicScaleDown and OrderedNamespaceDeletion, which pykcm always
  does; setting one to false is refused, as KCM refuses it;
- AtomicFIFO (client-go's informers, beta and on) only as StaleControllerConsistencyReplicaSet's
  dependency: KCM refuses to turn it off while that gate is on.

KCM refuses a gate name it does not know; pykcm cannot know all of KCM's (logging, metrics,
apiserver and client-go gates as well as kube's), so it accepts any other name and says once that
it ignores it.

Controllers ask `Options.feature_enabled("<name>")` (they sit below this layer). /flagz shows the
flag as KCM's does (`flag_text`); /configz shows no gates, as KCM's KubeControllerManagerConfiguration
has no field for them. /metrics has component-base's `kubernetes_feature_enabled{name,stage}` for
each gate pykcm knows (KCM lists all of its own), set once `validate` accepts the settings.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from prometheus_client import Gauge

from pykcm.util import metricopts
from pykcm.util.log import go_quote  # feature gates' messages quote as klog: Go's strconv.Quote

ALL_BETA = "AllBeta"
ATOMIC_FIFO = "AtomicFIFO"
COMPONENT_FLAGZ = "ComponentFlagz"
COMPONENT_STATUSZ = "ComponentStatusz"
DEPLOYMENT_REPLICASET_TERMINATING_REPLICAS = "DeploymentReplicaSetTerminatingReplicas"
LOGARITHMIC_SCALE_DOWN = "LogarithmicScaleDown"
ORDERED_NAMESPACE_DELETION = "OrderedNamespaceDeletion"
POD_DELETION_COST = "PodDeletionCost"
WATCH_LIST_CLIENT = "WatchListClient"
STALE_CONTROLLER_CONSISTENCY_REPLICASET = "StaleControllerConsistencyReplicaSet"

BETA, GA = "BETA", "GA"
KUBE_COMPONENT = "kube"  # component-base's DefaultKubeComponent, the only component KCM registers


@dataclass(frozen=True)
class Gate:
    default: bool
    stage: str  # BETA or GA, as KCM's --help names it
    locked: bool = False  # LockToDefault: any other value is refused
    acted_on: bool = True  # False: known only as a dependency, ignored otherwise


GATES: dict[str, Gate] = {
    ALL_BETA: Gate(False, BETA),
    ATOMIC_FIFO: Gate(True, BETA, acted_on=False),
    COMPONENT_FLAGZ: Gate(True, BETA),  # component-base's zpages: off, no /flagz
    COMPONENT_STATUSZ: Gate(True, BETA),  # off, no /statusz
    DEPLOYMENT_REPLICASET_TERMINATING_REPLICAS: Gate(True, BETA),
    LOGARITHMIC_SCALE_DOWN: Gate(True, GA, locked=True),
    ORDERED_NAMESPACE_DELETION: Gate(True, GA, locked=True),
    POD_DELETION_COST: Gate(True, BETA),
    STALE_CONTROLLER_CONSISTENCY_REPLICASET: Gate(True, BETA),
    WATCH_LIST_CLIENT: Gate(True, BETA),  # client-go's, which KCM takes into its own gates
}
# kube_features.go's defaultKubernetesFeatureGateDependencies, for the gates above.
DEPENDENCIES: dict[str, tuple[str, ...]] = {STALE_CONTROLLER_CONSISTENCY_REPLICASET: (ATOMIC_FIFO,)}

HELP = (
    "Comma-separated component:key=value pairs that describe feature gates, as KCM's (the component is 'kube' "
    "or left out; repeatable). pykcm acts on DeploymentReplicaSetTerminatingReplicas, "
    "StaleControllerConsistencyReplicaSet, PodDeletionCost, WatchListClient, ComponentFlagz and ComponentStatusz "
    "(BETA - default=true) and AllBeta; "
    "LogarithmicScaleDown and OrderedNamespaceDeletion are locked to true. Any other gate is accepted and named "
    "in the warning about ignored flags."
)

# component-base's featuregate metric, with the stage as KCM prints it: a GA gate's is "".
feature_enabled = Gauge(
    "kubernetes_feature_enabled",
    metricopts.kcm_help(metricopts.BETA,
                        "This metric records the data about the stage and enablement of a k8s feature."),
    ["name", "stage"],
)
_STAGE_LABEL = {BETA: "BETA", GA: ""}


class FeatureGateError(ValueError):
    """A --feature-gates value KCM refuses; the message is KCM's."""


def parse(value: str) -> dict[str, bool]:
    """The gates set by a --feature-gates value (every occurrence joined with commas), by name, in
    the order first named; the last setting of a gate wins. Raises FeatureGateError as KCM fails."""
    by_component = _multimap(value)
    if "" in by_component and KUBE_COMPONENT in by_component:
        raise FeatureGateError("set kube feature gates with default empty prefix or kube: prefix consistently, "
                               "do not mix use")
    for component in by_component:
        if component not in ("", KUBE_COMPONENT):
            raise FeatureGateError(f"component not registered: {component}")
    gates: dict[str, bool] = {}
    for entry in (entry for entries in by_component.values() for entry in entries):
        if not entry:
            continue
        name, sep, text = entry.partition("=")
        name = name.strip()
        if not sep:
            raise FeatureGateError(f"missing bool value for {name}")
        text = text.strip()
        setting = go_bool(text)
        if setting is None:
            raise FeatureGateError(
                f"invalid value of {name}={text}, err: strconv.ParseBool: parsing {go_quote(text)}: invalid syntax"
            )
        gates[name] = setting
    if "" in gates:  # the one name pykcm can tell is no gate of KCM's
        raise FeatureGateError("unrecognized feature gate: ")
    return gates


def validate(gates: Mapping[str, bool]) -> None:
    """KCM's checks of the gates it knows: a locked gate keeps its value, then dependencies hold."""
    errors = [
        f"cannot set feature gate {name} to {_go(value)}, feature is locked to {_go(GATES[name].default)}"
        for name, value in gates.items()
        if name in GATES and GATES[name].locked and value != GATES[name].default
    ]
    if not errors:
        for gate, needs in DEPENDENCIES.items():
            if enabled(gates, gate) and (off := [need for need in needs if not enabled(gates, need)]):
                errors.append(f"{gate} is enabled, but depends on features that are disabled: [{' '.join(off)}]")
    if errors:  # utilerrors.NewAggregate's text
        raise FeatureGateError(errors[0] if len(errors) == 1 else "[" + ", ".join(errors) + "]")
    # Every start validates its final settings here (Options.validate), as KCM records its gates
    # once its flags are set and valid, before it runs.
    record_metrics(gates)


def record_metrics(gates: Mapping[str, bool]) -> None:
    """kubernetes_feature_enabled: 1 or 0 for every gate pykcm knows, as `enabled` answers (KCM's AddMetrics)."""
    for name in sorted(GATES):  # added in the order Go's registry prints them
        feature_enabled.labels(name, _STAGE_LABEL[GATES[name].stage]).set(enabled(gates, name))


def enabled(gates: Mapping[str, bool], name: str) -> bool:
    """Whether gate `name` is on with these settings; KeyError for a gate pykcm does not know (KCM panics)."""
    gate = GATES[name]
    if name in gates:
        return gates[name]
    if gate.stage == BETA and name != ALL_BETA and ALL_BETA in gates:
        return gates[ALL_BETA]
    return gate.default


def ignored(gates: Mapping[str, bool]) -> list[str]:
    """The gates set that pykcm does not act on, in the order given."""
    return [name for name in gates if name not in GATES or not GATES[name].acted_on]


def ga_settings(gates: Mapping[str, bool]) -> list[tuple[str, bool]]:
    """GA gates set explicitly, which KCM warns "will be removed in a future release"."""
    return [(name, value) for name, value in gates.items() if name in GATES and GATES[name].stage == GA]


def flag_text(value: str) -> str:
    """The flag's value as KCM's /flagz shows it (ColonSeparatedMultimapStringString.String):
    `component:entry` pairs, components sorted, an omitted component printed as empty."""
    by_component = _multimap(value)
    return ",".join(f"{component}:{entry}" for component in sorted(by_component) for entry in by_component[component])


def _multimap(value: str) -> dict[str, list[str]]:
    """`a:x,b:y,z` → {"a": ["x"], "b": ["y"], "": ["z"]}: entries by component, trimmed, in order."""
    by_component: dict[str, list[str]] = {}
    for pair in value.split(","):
        if not pair:
            continue
        component, sep, entry = pair.partition(":")
        if not sep:
            component, entry = "", pair
        by_component.setdefault(component.strip(), []).append(entry.strip())
    return by_component


_GO_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_GO_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})


def go_bool(text: str) -> bool | None:
    """Go's strconv.ParseBool; None where it fails."""
    return True if text in _GO_TRUE else False if text in _GO_FALSE else None


def _go(value: bool) -> str:
    return "true" if value else "false"

