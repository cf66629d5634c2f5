"""Fixtures shared by the unit tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pykcm.util.log import set_verbosity


@pytest.fixture
def verbosity(request: pytest.FixtureRequest) -> Iterator[None]:
    """Log at -v=N for the test, N given by `@pytest.mark.parametrize("verbosity", [N], indirect=True)`."""
    set_verbosity(request.param)
    yield
    set_verbosity(0)
