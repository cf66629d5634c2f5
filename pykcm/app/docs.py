"""Reference tables for the README, generated from the code so they cannot drift.

    python -m pykcm.app.docs            # print the sections
    python -m pykcm.app.docs --write    # rewrite them in README.md between their markers
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import typer

README = Path(__file__).resolve().parents[2] / "README.md"


def _flag_default(param: Any) -> str:
    default = param.default
    if callable(default) or default is None or default == "":
        return ""
    if isinstance(default, bool):
        return "true" if default else "false"
    return str(getattr(default, "value", default))


def flags_markdown() -> str:
    """The `pykcm run` flags as a Markdown table, straight from the CLI definition."""
    from pykcm.app.cli import app

    run = typer.main.get_command(app).commands["run"]  # type: ignore[attr-defined]
    rows = ["| flag | default | meaning |", "| --- | --- | --- |"]
    for param in run.params:
        if not getattr(param, "opts", None) or param.name == "help" or getattr(param, "hidden", False):
            continue
        names = ", ".join(f"`{o}`" for o in [*param.opts, *getattr(param, "secondary_opts", [])])
        help_text = " ".join((param.help or "").split()).replace("|", "\\|")
        rows.append(f"| {names} | {_flag_default(param)} | {help_text} |")
    return "\n".join(rows)


def metrics_markdown() -> str:
    """Every metric family pykcm registers on /metrics, with its type and HELP (for a family KCM also
    has, led by its stability level as KCM prints it), by the name it is scraped under."""
    from prometheus_client import REGISTRY

    import pykcm.app.manager  # noqa: F401 - imports every layer, which registers its collectors
    from pykcm.controller import discover_controllers

    discover_controllers()  # controllers register their own metrics when imported

    rows = ["| metric | type | meaning |", "| --- | --- | --- |"]
    # prometheus_client names a counter family without its `_total`, which the scrape adds.
    named = sorted(((family.name + ("_total" if family.type == "counter" else ""), family)
                    for family in REGISTRY.collect()), key=lambda pair: pair[0])
    for name, family in named:
        if name.startswith(("python_", "process_")):
            continue
        rows.append(f"| `{name}` | {family.type} | {' '.join(family.documentation.split())} |")
    rows.append("| `process_*`, `python_*` | | process CPU, memory, file descriptors; Python GC and version |")
    return "\n".join(rows)


SECTIONS = {"flags": flags_markdown, "metrics": metrics_markdown}


def render(text: str) -> str:
    for name, make in SECTIONS.items():
        pattern = re.compile(rf"(<!-- BEGIN GENERATED {name} -->\n)(?:.*?\n)?(<!-- END GENERATED {name} -->)", re.S)
        if not pattern.search(text):
            raise SystemExit(f"README.md has no GENERATED {name} markers")
        text = pattern.sub(lambda m, make=make: m.group(1) + make() + "\n" + m.group(2), text)
    return text


def main() -> None:
    if "--write" in sys.argv[1:]:
        README.write_text(render(README.read_text()))
    else:
        for name, make in SECTIONS.items():
            print(f"## {name}\n\n{make()}\n")


if __name__ == "__main__":
    main()
