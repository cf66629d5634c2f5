"""`--feature-gates` (pykcm.app.featuregates and its use in pykcm.app.cli): KCM v1.36.3's syntax, its
one-line errors (each message below is the `err=` of the built kube-controller-manager's "command
failed" line for the same value), the gates pykcm acts on, and the warning for the others."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import REGISTRY, generate_latest

from pykcm.app import cli, featuregates, kcmflags
from pykcm.app.options import Options, OptionsError
from pykcm.util.log import go_quote


class RecordingLog:
    def __init__(self) -> None:
        self.lines: list[tuple[str, str, dict[str, Any]]] = []

    def v(self, _level: int) -> RecordingLog:
        return self

    def info(self, msg: str, **kv: Any) -> None:
        self.lines.append(("info", msg, kv))

    def warning(self, msg: str, **kv: Any) -> None:
        self.lines.append(("warning", msg, kv))


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> tuple[RecordingLog, list[Options]]:
    """`cli.main(["run", ...])` up to the manager's start, which is recorded instead; its log lines too."""
    log, runs = RecordingLog(), []
    monkeypatch.setattr(cli, "log", log)
    monkeypatch.setattr(cli.logging_setup, "setup", lambda *_: None)
    monkeypatch.setattr(cli, "_run_manager", lambda options, classes, watch=None: runs.append(options))
    return log, runs


@pytest.mark.parametrize(
    ("value", "gates"),
    [
        ("A=true,B=false", {"A": True, "B": False}),
        ("kube:A=true,kube:B=0", {"A": True, "B": False}),
        (" A = F , ,B=1,A=TRUE", {"A": True, "B": True}),  # trimmed; the last setting wins, first place kept
        ("", {}),
        (",,", {}),
        ("kube:", {}),
    ],
)
def test_parse_reads_kcms_syntax(value: str, gates: dict[str, bool]) -> None:
    assert featuregates.parse(value) == gates
    assert list(featuregates.parse(value)) == list(gates)


KCM_ERRORS = [
    ("Foo", "missing bool value for Foo"),
    ("kube:Foo", "missing bool value for Foo"),
    ("Foo=maybe", 'invalid value of Foo=maybe, err: strconv.ParseBool: parsing "maybe": invalid syntax'),
    ('Foo=tru"e', 'invalid value of Foo=tru"e, err: strconv.ParseBool: parsing "tru\\"e": invalid syntax'),
    ("Foo=", 'invalid value of Foo=, err: strconv.ParseBool: parsing "": invalid syntax'),
    ("wardle:Foo=true", "component not registered: wardle"),
    ("=true", "unrecognized feature gate: "),
    ("LogarithmicScaleDown=false", "cannot set feature gate LogarithmicScaleDown to false, feature is locked to true"),
    ("LogarithmicScaleDown=false,OrderedNamespaceDeletion=false",
     "[cannot set feature gate LogarithmicScaleDown to false, feature is locked to true, "
     "cannot set feature gate OrderedNamespaceDeletion to false, feature is locked to true]"),
    ("AtomicFIFO=false",
     "StaleControllerConsistencyReplicaSet is enabled, but depends on features that are disabled: [AtomicFIFO]"),
    ("AllBeta=false,StaleControllerConsistencyReplicaSet=true",
     "StaleControllerConsistencyReplicaSet is enabled, but depends on features that are disabled: [AtomicFIFO]"),
]


@pytest.mark.parametrize(("value", "message"), KCM_ERRORS)
def test_a_value_kcm_refuses_is_one_usage_error_line_with_kcms_message(
    value: str, message: str, started: tuple[RecordingLog, list[Options]], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["run", f"--feature-gates={value}"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"pykcm: error: --feature-gates: {message} (see 'pykcm run --help')"
    ]
    assert started[1] == []


def test_mixing_the_kube_prefix_and_none_across_repeats_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["run", "--feature-gates", "A=true", "--feature-gates=kube:B=true"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "pykcm: error: --feature-gates: set kube feature gates with default empty prefix or kube: prefix "
        "consistently, do not mix use (see 'pykcm run --help')"
    ]


def test_options_validate_refuses_a_locked_gate_off() -> None:
    with pytest.raises(OptionsError, match=r"^--feature-gates: cannot set feature gate OrderedNamespaceDeletion"):
        Options(feature_gates={"OrderedNamespaceDeletion": False}).validate()
    Options(feature_gates={"OrderedNamespaceDeletion": True, "AtomicFIFO": False,
                           "StaleControllerConsistencyReplicaSet": False}).validate()


def test_enabled_takes_kcms_defaults_allbeta_then_the_named_setting() -> None:
    acted_on = ("DeploymentReplicaSetTerminatingReplicas", "StaleControllerConsistencyReplicaSet", "PodDeletionCost")
    assert all(Options().feature_enabled(gate) for gate in (*acted_on, "LogarithmicScaleDown"))
    all_off = Options(feature_gates={"AllBeta": False, "PodDeletionCost": True})
    assert [all_off.feature_enabled(gate) for gate in acted_on] == [False, False, True]
    assert not all_off.feature_enabled("AtomicFIFO") and all_off.feature_enabled("OrderedNamespaceDeletion")
    all_off.validate()  # AtomicFIFO off with the gate needing it: fine
    assert Options(feature_gates={"AllBeta": True}).feature_enabled("PodDeletionCost")
    with pytest.raises(KeyError):
        Options().feature_enabled("NoSuchGate")  # a gate the code names but the table lacks is a bug


def test_gates_are_applied_and_the_others_named_once_in_the_ignored_warning(
    started: tuple[RecordingLog, list[Options]],
) -> None:
    log, runs = started
    argv = ["run", "--feature-gates=Foo=true,DeploymentReplicaSetTerminatingReplicas=false",
            "--cluster-cidr=10.0.0.0/8", "--feature-gates", "AtomicFIFO=true,Foo=false,LogarithmicScaleDown=true"]
    assert cli.main(argv) == 0
    (options,) = runs
    assert options.feature_gates == {"Foo": False, "DeploymentReplicaSetTerminatingReplicas": False,
                                     "AtomicFIFO": True, "LogarithmicScaleDown": True}
    assert not options.feature_enabled("DeploymentReplicaSetTerminatingReplicas")
    assert options.flagz["feature-gates"] == (  # KCM's colonSeparatedMultimapStringString, as its /flagz shows it
        ":Foo=true,:DeploymentReplicaSetTerminatingReplicas=false,:AtomicFIFO=true,:Foo=false,:LogarithmicScaleDown=true"
    )
    assert [line for line in log.lines if line[0] == "warning"] == [
        ("warning", "Ignoring kube-controller-manager flags for what pykcm does not run or serve",
         {"flags": ["--cluster-cidr"], "featureGates": ["Foo", "AtomicFIFO"]}),
    ]
    assert ("info", "Warning: setting GA feature gate. It will be removed in a future release.",
            {"featureGate": "LogarithmicScaleDown", "value": True}) in log.lines


def test_only_gates_pykcm_acts_on_warn_of_nothing(started: tuple[RecordingLog, list[Options]]) -> None:
    log, runs = started
    assert cli.main(["run", "--feature-gates=kube:PodDeletionCost=false,kube:AllBeta=true"]) == 0
    assert runs[0].feature_gates == {"PodDeletionCost": False, "AllBeta": True}
    assert runs[0].flagz["feature-gates"] == "kube:PodDeletionCost=false,kube:AllBeta=true"
    assert log.lines == []


def test_kubernetes_feature_enabled_shows_every_gate_pykcm_knows_as_set_by_the_flag(
    started: tuple[RecordingLog, list[Options]],
) -> None:
    """component-base's gauge, as KCM v1.36.3 prints it for these gates: the stage BETA, or "" for GA."""
    assert cli.main(["run", "--feature-gates=PodDeletionCost=false,AtomicFIFO=true,Foo=true"]) == 0
    lines = [line for line in generate_latest(REGISTRY).decode().splitlines() if "kubernetes_feature_enabled" in line]
    assert lines == [
        "# HELP kubernetes_feature_enabled [BETA] This metric records the data about the stage and enablement of a k8s "
        "feature.",
        "# TYPE kubernetes_feature_enabled gauge",
        'kubernetes_feature_enabled{name="AllBeta",stage="BETA"} 0.0',
        'kubernetes_feature_enabled{name="AtomicFIFO",stage="BETA"} 1.0',
        'kubernetes_feature_enabled{name="ComponentFlagz",stage="BETA"} 1.0',
        'kubernetes_feature_enabled{name="ComponentStatusz",stage="BETA"} 1.0',
        'kubernetes_feature_enabled{name="DeploymentReplicaSetTerminatingReplicas",stage="BETA"} 1.0',
        'kubernetes_feature_enabled{name="LogarithmicScaleDown",stage=""} 1.0',
        'kubernetes_feature_enabled{name="OrderedNamespaceDeletion",stage=""} 1.0',
        'kubernetes_feature_enabled{name="PodDeletionCost",stage="BETA"} 0.0',  # the flag's
        'kubernetes_feature_enabled{name="StaleControllerConsistencyReplicaSet",stage="BETA"} 1.0',
        'kubernetes_feature_enabled{name="WatchListClient",stage="BETA"} 1.0',
    ]  # Foo is no gate pykcm knows, so not listed
    assert cli.main(["run", "--feature-gates=AllBeta=true"]) == 0  # a later start shows its own settings
    assert REGISTRY.get_sample_value("kubernetes_feature_enabled", {"name": "PodDeletionCost", "stage": "BETA"}) == 1
    assert REGISTRY.get_sample_value("kubernetes_feature_enabled", {"name": "AllBeta", "stage": "BETA"}) == 1
    assert cli.main(["run", "--feature-gates=AllBeta=false"]) == 0
    assert REGISTRY.get_sample_value("kubernetes_feature_enabled", {"name": "AtomicFIFO", "stage": "BETA"}) == 0


def test_flagz_and_help() -> None:
    assert featuregates.flag_text("") == ""
    assert featuregates.flag_text(" kube: A=true ,,kube:") == "kube:A=true,kube:"
    assert kcmflags.translate_pflag_forms(["run", "--feature-gates", "A=true", "--feature-gates=B=false"]) == [
        "run", "--feature-gates=A=true,B=false"]
    assert "StaleControllerConsistencyReplicaSet" in featuregates.HELP


@pytest.mark.parametrize(
    ("text", "quoted"),
    [("maybe", '"maybe"'), ("a\tb", '"a\\tb"'), ("\x01\x7f", '"\\x01\\x7f"'), ("é", '"é"'), ("\u200b", '"\\u200b"'),
     ("\\", '"\\\\"'), ("\udcff", '"\\xff"')],
)
def test_go_quote_is_strconv_quote(text: str, quoted: str) -> None:
    assert go_quote(text) == quoted
