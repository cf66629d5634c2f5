"""Write prometheusrule.yaml from rules/pykcm-alerts.yaml, the rules' single source of truth.

    python deploy/prometheus/generate_prometheusrule.py           # rewrite prometheusrule.yaml
    python deploy/prometheus/generate_prometheusrule.py --check   # exit 1 if it is out of date

The rules file's body (from `groups:` on, comments included) becomes the PrometheusRule's
`spec` verbatim, indented, so the Operator loads exactly what promtool checks and tests.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
RULES = HERE / "rules" / "pykcm-alerts.yaml"
TARGET = HERE / "prometheusrule.yaml"

HEADER = """\
# GENERATED from rules/pykcm-alerts.yaml by generate_prometheusrule.py: edit the rules file, then run
#   python deploy/prometheus/generate_prometheusrule.py
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: pykcm
  namespace: kube-system
  labels:
    # Match your Prometheus' spec.ruleSelector; these are kube-prometheus' conventional labels
    # (kube-prometheus-stack selects `release: <helm release>` unless told otherwise).
    prometheus: k8s
    role: alert-rules
spec:
"""


def render(rules_text: str) -> str:
    """The PrometheusRule manifest whose spec is the rules file from its `groups:` line on."""
    lines = rules_text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("groups:")), None)
    if start is None:
        raise ValueError(f"{RULES.name} has no top-level `groups:` line")
    body = "".join(f"  {line}\n" if line.strip() else "\n" for line in lines[start:])
    return HEADER + body


def main(argv: list[str]) -> int:
    expected = render(RULES.read_text())
    if "--check" in argv:
        if not TARGET.exists() or TARGET.read_text() != expected:
            print(f"{TARGET.name} is out of date: run python deploy/prometheus/{Path(__file__).name}", file=sys.stderr)
            return 1
        return 0
    TARGET.write_text(expected)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
