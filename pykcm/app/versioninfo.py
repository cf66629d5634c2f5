"""pykcm's version in KCM's two forms: `--version` and `--version=raw` (component-base's verflag)."""

from __future__ import annotations

import platform

import typer

from pykcm import __version__


def version_line() -> str:
    return f"pykcm {__version__}"


def raw_version() -> str:
    """KCM prints its version.Info struct; this is pykcm's, in the same form."""
    major, minor, *_ = [*__version__.split("."), "", ""]
    return (f'version.Info{{Major:"{major}", Minor:"{minor}", GitVersion:"v{__version__}", '
            f'Compiler:"{platform.python_implementation()} {platform.python_version()}", '
            f'Platform:"{platform.system().lower()}/{platform.machine()}"}}')


def print_version(value: bool) -> None:
    """An eager option's callback: print and exit before anything else is read."""
    if value:
        typer.echo(version_line())
        raise typer.Exit()


def print_raw_version(value: bool) -> None:
    if value:
        typer.echo(raw_version())
        raise typer.Exit()
