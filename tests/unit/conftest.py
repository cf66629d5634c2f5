"""Fixtures shared by the unit tests."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from pykcm.util.log import set_verbosity


@pytest.fixture
def verbosity(request: pytest.FixtureRequest) -> Iterator[None]:
    """Log at -v=N for the test, N given by `@pytest.mark.parametrize("verbosity", [N], indirect=True)`."""
    set_verbosity(request.param)
    yield
    set_verbosity(0)


@pytest.fixture(autouse=True)
def _pykcm_logging_restored() -> Iterator[None]:
    """A test that runs `cli.main` in-process lets it set up logging (a stderr handler, propagation
    off) process-wide: put the "pykcm" logger back, so later tests' caplog sees its records."""
    logger = logging.getLogger("pykcm")
    saved = logger.handlers[:], logger.propagate, logger.level
    yield
    logger.handlers[:], logger.propagate, logger.level = saved
