"""deploy/grafana's dashboard: Grafana's dashboard-linter, valid PromQL (promtool), and only the
metrics pykcm exports.

dashboard-linter, unchanged, is built from the Go module in tests/dashboard-linter/ (its go.mod
says which commit and why those dependency pins) and runs `lint --strict --verbose`. It skips only
where the Go module proxy cannot be reached. The tests below it restate the linter's rules, so a
failure names the panel and query at fault: templated datasource, job and instance; every panel on
the templated datasource, titled, described and with a unit; every selector matching
job=~"$job" and instance=~"$instance"; rates over $__rate_interval; counters only under rate, irate
or increase; not editable.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from pykcm.testenv.gobuild import BuildError
from tests.dashboard_linter import LINTER_BUILD_TIMEOUT, build_linter
from tests.promql import HISTOGRAM_SUFFIXES, TARGET_LABELS, exported_series, metric_names, promtool, selectors
from tests.unit.test_alert_rules import alerts, seconds

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "pykcm-dashboard.json"


PANELS_WITH_QUERIES = {"timeseries", "stat", "gauge", "table", "graph", "singlestat", "state-timeline"}
UNITS = {"none", "short", "percent", "percentunit", "s", "ms", "bytes", "ops", "reqps", "bool"}
RATE_INTERVAL = "$__rate_interval"
# What the dashboard must show (the list); process_* come from prometheus-client.
REQUIRED_METRICS = {
    "leader_election_master_status", "running_managed_controllers",
    "workqueue_depth", "workqueue_adds_total", "workqueue_retries_total",
    "workqueue_queue_duration_seconds_bucket", "workqueue_work_duration_seconds_bucket",
    "pykcm_controller_sync_errors_total", "pykcm_controller_sync_duration_seconds_bucket",
    "rest_client_requests_total", "rest_client_request_duration_seconds_bucket",
    "rest_client_rate_limiter_duration_seconds_bucket",
    "pykcm_informer_objects", "pykcm_informer_events_total", "pykcm_informer_relists_total",
    "process_cpu_seconds_total", "process_resident_memory_bytes",
}  # fmt: skip


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def panels() -> list[dict[str, Any]]:
    """Every panel, including those inside collapsed rows."""
    found = []
    for panel in dashboard()["panels"]:
        found.append(panel)
        found.extend(panel.get("panels", []))
    return found


def query_panels() -> list[dict[str, Any]]:
    return [p for p in panels() if p["type"] in PANELS_WITH_QUERIES]


def targets() -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    for panel in query_panels():
        for target in panel["targets"]:
            yield panel, target


def template(name: str) -> dict[str, Any]:
    return next(t for t in dashboard()["templating"]["list"] if t["name"] == name)


def label_values_query(var: dict[str, Any]) -> tuple[str, str]:
    """(series selector, label) of a `label_values(selector, label)` variable query."""
    query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
    match = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", query)
    assert match, f"variable {var['name']}: {query!r} is not label_values(selector, label)"
    return match.group(1), match.group(2)


# -- Grafana's own linter -----------------------------------------------------------------------------


def _unreachable_proxy(message: str) -> str | None:
    """Why the Go module proxy could not be reached, from a BuildError and its build log; None when
    it was reached (a refused module is then a failure: the pins in tests/dashboard-linter/ need changing)."""
    log = re.search(r"full output in (\S+)", message)
    text = message + (Path(log.group(1)).read_text(errors="replace") if log and Path(log.group(1)).exists() else "")
    found = re.search(r"(?:dial|proxyconnect) tcp[^\n;]*|module lookup disabled by GOPROXY=off", text)
    return found.group(0) if found else None


@pytest.mark.late("dashboard-linter")  # its build runs in the background meanwhile
@pytest.mark.timeout(LINTER_BUILD_TIMEOUT + 120)
def test_dashboard_passes_grafana_dashboard_linter(capsys):
    def log(message: str) -> None:
        with capsys.disabled():
            print(f"\n[dashboard-linter] {message}", flush=True)

    try:
        linter = build_linter(log)
    except BuildError as err:
        unreachable = _unreachable_proxy(str(err))
        if unreachable is None:
            raise
        pytest.skip(f"dashboard-linter cannot be built here, the Go module proxy is out of reach: {unreachable}")
    result = subprocess.run(
        [linter, "lint", "--strict", "--verbose", str(DASHBOARD)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    # --verbose heads each rule's results with its description: all of them ran.
    rules = subprocess.run([linter, "rules"], capture_output=True, text=True, timeout=60, check=True).stdout
    descriptions = re.findall(r"^\* `[\w-]+` - (.+)$", rules, re.M)
    assert len(descriptions) >= 17 and all(d in result.stdout for d in descriptions), result.stdout


def test_unreachable_proxy_is_read_from_the_build_log(tmp_path):
    log = tmp_path / "build.log"
    log.write_text(
        'main.go:12:2: example.com/dep@v1.0.0: Get "https://proxy.invalid/example.com/dep/@v/v1.0.0.zip": '
        "dial tcp: lookup proxy.invalid on 127.0.0.53:53: no such host\n"
    )
    message = f"building x failed (exit 1): no such host; full output in {log}"
    assert _unreachable_proxy(message) == "dial tcp: lookup proxy.invalid on 127.0.0.53:53: no such host"
    refused = "example.com/dep@v0.0.0-2026: reading https://proxy.invalid/...: 403 Forbidden; full output in /none"
    assert _unreachable_proxy(refused) is None


# -- the linter's rules, restated -------------------------------------------------------------------


def test_templates_are_datasource_job_and_instance():
    datasource = template("datasource")
    assert (datasource["type"], datasource["query"], datasource["label"]) == ("datasource", "prometheus", "Data source")
    assert [t["type"] for t in dashboard()["templating"]["list"] if t["type"] == "datasource"] == ["datasource"]
    for name in ("job", "instance"):
        var = template(name)
        assert var["type"] == "query" and var["label"] == name.title()
        assert var["datasource"]["uid"] in ("$datasource", "${datasource}")
        assert var["multi"] is True and var["allValue"] == ".+"
        assert var["refresh"] == 2  # on time range change
        assert label_values_query(var)[1] == name
    assert template("job")["current"]["value"] == ["pykcm-metrics"]  # the ServiceMonitor's job
    assert label_values_query(template("instance"))[0] == 'up{job=~"$job"}'


def test_dashboard_is_not_editable_and_has_a_stable_uid():
    board = dashboard()
    assert board["editable"] is False
    assert board["uid"] == "pykcm" and board["title"]


@pytest.mark.parametrize("panel", query_panels(), ids=lambda p: p["title"])
def test_panel_uses_the_templated_datasource_and_is_described(panel):
    assert panel["datasource"]["uid"] == "${datasource}"
    assert panel["title"] and panel["description"]
    assert panel["fieldConfig"]["defaults"]["unit"] in UNITS
    assert panel["targets"], "a panel with no targets"
    assert len({t["refId"] for t in panel["targets"]}) == len(panel["targets"])
    for target in panel["targets"]:
        assert target["datasource"]["uid"] == "${datasource}"


def test_panels_have_unique_ids_and_do_not_overlap():
    ids = [p["id"] for p in panels()]
    assert len(ids) == len(set(ids))
    taken: set[tuple[int, int]] = set()
    for panel in panels():
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24
        cells = {(pos["x"] + dx, pos["y"] + dy) for dx in range(pos["w"]) for dy in range(pos["h"])}
        assert not cells & taken, f"{panel['title']} overlaps another panel"
        taken |= cells


@pytest.mark.parametrize(("panel", "target"), list(targets()), ids=lambda x: x.get("title") or x.get("refId"))
def test_target_filters_on_job_and_instance_and_rates_over_rate_interval(panel, target):
    expr = target["expr"]
    found = selectors(expr)
    assert found
    for selector in found:
        for label in ("job", "instance"):
            matcher = selector.matcher(label)
            assert matcher is not None and (matcher.op, matcher.value) == ("=~", f"${label}"), selector
    for function, window in re.findall(r"\b(\w+)\((?:[^()]*?)\[([^\]]+)\]", expr):
        if function in ("rate", "irate"):
            assert window == RATE_INTERVAL, expr
    # Counters only as the direct argument of rate, irate or increase.
    for match in re.finditer(r"(\w+_total)\{", expr):
        before = expr[: match.start()]
        assert re.search(r"\b(rate|irate|increase)\(\s*$", before), f"{match.group(1)} not under rate/irate/increase"


# -- PromQL and metrics -----------------------------------------------------------------------------


def dashboard_exprs() -> dict[str, str]:
    """Every query of the dashboard (panel targets and variable queries), by a readable name."""
    exprs = {f"{panel['title']} {target['refId']}": target["expr"] for panel, target in targets()}
    for name in ("job", "instance"):
        exprs[f"variable {name}"] = label_values_query(template(name))[0]
    return exprs


def test_every_query_is_valid_promql(tmp_path):
    """promtool parses each query as a recording rule, with Grafana's variables expanded."""
    rules = [
        {"record": f"dashboard:query_{i}", "expr": expr.replace(RATE_INTERVAL, "2m")}
        for i, expr in enumerate(dashboard_exprs().values())
    ]
    path = tmp_path / "dashboard-queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = subprocess.run([promtool(), "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_queries_name_only_metrics_and_labels_pykcm_exports():
    exported = exported_series()
    for name, expr in dashboard_exprs().items():
        assert metric_names(expr) - exported.keys() == set(), f"{name} names unknown metrics"
        for selector in selectors(expr):
            assert selector.metric in exported, selector
            unknown = {m.label for m in selector.matchers} - exported[selector.metric].labels - TARGET_LABELS
            assert unknown == set(), f"{name}: {selector.metric} has no label {unknown}"


def test_dashboard_shows_what_operators_need():
    used = set().union(*(metric_names(expr) for expr in dashboard_exprs().values()))
    assert REQUIRED_METRICS - used == set()


# -- the alerts the panels name -------------------------------------------------------------------

ALERT_NAME = re.compile(r"\bPykcm[A-Z]\w+")
# "<alert> fires <when>." and the numbers <when> may state, each checked against the rule.
FIRES = re.compile(r"\b(Pykcm[A-Z]\w+) fires ([^.]*)\.")
PERCENT, PER_MINUTE, SECONDS = re.compile(r"(\d+) %"), re.compile(r"(\d+) a minute"), re.compile(r"(\d+) s\b")
FOR_MINUTES, PLAIN = re.compile(r"for (\d+) minutes"), re.compile(r"\b(\d+)\b")


def base_names(expr: str) -> set[str]:
    return {re.sub(rf"({'|'.join(HISTOGRAM_SUFFIXES)})$", "", name) for name in metric_names(expr)}


def thresholds(expr: str) -> list[float]:
    return [float(n) for n in re.findall(r"[<>]=?\s*(\d+(?:\.\d+)?)", expr)]


def le_bounds(expr: str) -> list[float]:
    """The `le` values the selectors match: the alternatives of the rules' `1|1.0`, escapes dropped."""
    return [float(v.replace("\\", "")) for s in selectors(expr) if (m := s.matcher("le")) for v in m.value.split("|")]


def has(values: list[float], wanted: float) -> bool:
    return any(abs(v - wanted) < 1e-9 for v in values)


@pytest.mark.parametrize("panel", [p for p in panels() if ALERT_NAME.search(p.get("description", ""))],
                         ids=lambda p: p["title"])
def test_alerts_a_panel_names_watch_what_it_shows_and_fire_as_it_says(panel):
    """Each alert a description names exists and uses a metric the panel draws; a description naming
    one alert says when it fires, and every number it states is the rule's: a percentage or a
    number a threshold (N a minute: N/60 per second), N s a histogram bound, N minutes its `for`."""
    rules = {a["alert"]: a for a in alerts()}
    description = panel["description"]
    named = set(ALERT_NAME.findall(description))
    drawn = set().union(*(base_names(t["expr"]) for t in panel["targets"]))
    for name in named:
        assert name in rules, f"{panel['title']}: no alert {name}"
        assert base_names(rules[name]["expr"]) & drawn, f"{panel['title']}: {name} watches none of its metrics"
    claims = {name: when for name, when in FIRES.findall(description)}
    if len(named) == 1:
        assert claims.keys() == named, f"{panel['title']}: say when {named.pop()} fires"
    for name, when in claims.items():
        rule = rules[name]
        levels = thresholds(rule["expr"])
        for number in PERCENT.findall(when):
            assert has(levels, int(number) / 100), f"{name}: no threshold {number} %"
        for number in PER_MINUTE.findall(when):
            assert has(levels, int(number) / 60), f"{name}: no threshold {number} a minute"
        for number in SECONDS.findall(when):
            assert has(le_bounds(rule["expr"]), float(number)), f"{name}: no bucket bound {number} s"
        for number in FOR_MINUTES.findall(when):
            assert seconds(rule["for"]) == int(number) * 60, f"{name}: for {rule['for']}, not {number} minutes"
        rest = FOR_MINUTES.sub("", SECONDS.sub("", PER_MINUTE.sub("", PERCENT.sub("", when))))
        for number in PLAIN.findall(rest):
            assert has(levels, float(number)), f"{name}: no threshold {number}"
