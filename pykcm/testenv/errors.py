"""Errors of the local cluster tooling; each message's first line is meant for the user."""

from __future__ import annotations


class ControlPlaneError(Exception):
    """Any local cluster failure; the message's first line is meant for the user."""


class BuildError(ControlPlaneError):
    """A binary could not be found or built."""
