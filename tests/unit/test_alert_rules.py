"""deploy/prometheus's alerting rules: promtool-checked, unit-tested with promtool, scoped to the
ServiceMonitor's job, in sync with the generated PrometheusRule and with the metrics pykcm exports."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from tests.promql import TARGET_LABELS, exported_series, metric_names, promtool, selectors

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS = ROOT / "deploy" / "prometheus"
RULES_DIR = PROMETHEUS / "rules"
RULES = RULES_DIR / "pykcm-alerts.yaml"
RULE_TESTS = sorted((RULES_DIR / "tests").glob("*.yaml"))
SEVERITIES = {"warning", "critical"}
MIN_FOR_SECONDS = 120  # no alert on one failed scrape or one slow evaluation


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def alerts() -> list[dict[str, Any]]:
    return [rule for group in load_yaml(RULES)["groups"] for rule in group["rules"] if "alert" in rule]


def seconds(duration: str) -> int:
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    parts = re.findall(r"(\d+)([smhd])", duration)
    assert parts and "".join(n + u for n, u in parts) == duration, f"not a simple duration: {duration}"
    return sum(int(n) * units[u] for n, u in parts)


def job_label() -> str:
    """The job label of pykcm's targets: the ServiceMonitor sets none, so it is the Service's name."""
    monitor = load_yaml(PROMETHEUS / "servicemonitor.yaml")
    service = load_yaml(ROOT / "deploy" / "service.yaml")
    assert "jobLabel" not in monitor["spec"], "the ServiceMonitor sets jobLabel: update the rules' job"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == [p["name"] for p in service["spec"]["ports"]]
    return service["metadata"]["name"]


def lease_name() -> str:
    daemonset = load_yaml(ROOT / "deploy" / "daemonset.yaml")
    args = daemonset["spec"]["template"]["spec"]["containers"][0]["args"]
    return next(a.split("=", 1)[1] for a in args if a.startswith("--leader-elect-resource-name="))


def run_promtool(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool(), *map(str, args)], capture_output=True, text=True, timeout=120)


# -- promtool ---------------------------------------------------------------------------------------


def test_rules_pass_promtool_check():
    result = run_promtool("check", "rules", RULES)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(alerts())} rules found" in result.stdout


def test_rule_unit_tests_pass_promtool_test():
    assert RULE_TESTS, "no promtool unit tests under deploy/prometheus/rules/tests"
    result = run_promtool("test", "rules", *RULE_TESTS)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == len(RULE_TESTS), result.stdout


def test_every_alert_is_tested_firing_and_silent():
    fired: set[str] = set()
    silent: set[str] = set()
    for path in RULE_TESTS:
        spec = load_yaml(path)
        assert spec["rule_files"] == ["../pykcm-alerts.yaml"], f"{path.name} must test the real rules file"
        for case in spec["tests"]:
            for check in case.get("alert_rule_test", []):
                (fired if check.get("exp_alerts") else silent).add(check["alertname"])
    names = {a["alert"] for a in alerts()}
    assert names - fired == set(), "alerts no unit test fires"
    assert names - silent == set(), "alerts no unit test keeps silent"
    assert (fired | silent) - names == set(), "unit tests name alerts that do not exist"


def _mutated_rules_fail_the_unit_tests(tmp_path: Path, mutate: Any) -> str:
    copy = tmp_path / "rules"
    shutil.copytree(RULES_DIR, copy)
    rules = copy / RULES.name
    rules.write_text(mutate(rules.read_text()))
    result = run_promtool("test", "rules", *sorted((copy / "tests").glob("*.yaml")))
    assert result.returncode != 0, "the unit tests did not notice the mutation"
    return set(re.findall(r"alertname: (\w+)", result.stdout + result.stderr))


def test_unit_tests_catch_every_alert_firing_on_a_blip(tmp_path):
    """Negative control: without its `for:`, every alert fires in a blip, burst or pending case."""
    failed = _mutated_rules_fail_the_unit_tests(tmp_path, lambda text: re.sub(r"(?m)^\s+for: \S+\n", "", text))
    assert {a["alert"] for a in alerts()} - failed == set()


def test_unit_tests_catch_alerts_that_match_another_job(tmp_path):
    """Negative control: scoped to any job, kube-controller-manager's series trigger the alerts."""
    failed = _mutated_rules_fail_the_unit_tests(tmp_path, lambda text: text.replace('job="pykcm-metrics"', 'job=~".+"'))
    assert {"PykcmDown", "PykcmWorkQueueBacklog", "PykcmRestClientErrors"} <= failed


# -- conventions --------------------------------------------------------------------------------------


@pytest.mark.parametrize("alert", alerts(), ids=lambda a: a["alert"])
def test_alert_is_runbook_ready(alert):
    assert re.fullmatch(r"Pykcm[A-Z][A-Za-z]+", alert["alert"])
    assert alert["labels"]["severity"] in SEVERITIES
    assert seconds(alert["for"]) >= MIN_FOR_SECONDS
    annotations = alert["annotations"]
    assert set(annotations) >= {"summary", "description"}
    assert "\n" not in annotations["summary"] and annotations["summary"].endswith(".")
    assert len(annotations["description"]) > len(annotations["summary"])


@pytest.mark.parametrize("alert", alerts(), ids=lambda a: a["alert"])
def test_every_selector_is_scoped_to_pykcms_job(alert):
    """pykcm exports client-go's names: unscoped, a rule would also see KCM's and the scheduler's."""
    job = job_label()
    found = selectors(alert["expr"])
    assert found
    for selector in found:
        matcher = selector.matcher("job")
        assert matcher is not None and (matcher.op, matcher.value) == ("=", job), f"{selector} in {alert['alert']}"
        lease = selector.matcher("name") if selector.metric and selector.metric.startswith("leader_election") else None
        if lease is not None:
            assert lease.value == lease_name()


def test_rules_name_only_metrics_and_labels_pykcm_exports():
    exported = exported_series()
    for alert in alerts():
        expr = alert["expr"]
        assert metric_names(expr) - exported.keys() == set(), f"{alert['alert']} names unknown metrics"
        for selector in selectors(expr):
            assert selector.metric in exported, selector
            unknown = {m.label for m in selector.matchers} - exported[selector.metric].labels - TARGET_LABELS
            assert unknown == set(), f"{alert['alert']}: {selector.metric} has no label {unknown}"


# -- the PrometheusRule -------------------------------------------------------------------------------


def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("generate_prometheusrule", PROMETHEUS / "generate_prometheusrule.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_prometheusrule_is_generated_from_the_rules_file():
    gen = generator()
    target = PROMETHEUS / "prometheusrule.yaml"
    assert target.read_text() == gen.render(RULES.read_text()), (
        "deploy/prometheus/prometheusrule.yaml is out of date: run python deploy/prometheus/generate_prometheusrule.py"
    )
    rule = load_yaml(target)
    assert rule["apiVersion"] == "monitoring.coreos.com/v1" and rule["kind"] == "PrometheusRule"
    assert rule["spec"] == load_yaml(RULES)


def test_generator_check_mode_reports_a_stale_prometheusrule(tmp_path, monkeypatch, capsys):
    gen = generator()
    monkeypatch.setattr(gen, "TARGET", tmp_path / "prometheusrule.yaml")
    assert gen.main(["--check"]) == 1
    assert "out of date" in capsys.readouterr().err
    assert gen.main([]) == 0 and gen.main(["--check"]) == 0


def test_prometheus_component_ships_the_prometheusrule():
    component = load_yaml(PROMETHEUS / "kustomization.yaml")
    assert "prometheusrule.yaml" in component["resources"]
