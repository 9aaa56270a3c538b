"""Shared fixtures: every async test runs on asyncio, uvloop and trio."""

from __future__ import annotations

import importlib.util

import pytest

_LOOPS = [
    pytest.param("asyncio", id="asyncio"),
    pytest.param(
        ("asyncio", {"use_uvloop": True}),
        id="uvloop",
        marks=pytest.mark.skipif(
            importlib.util.find_spec("uvloop") is None, reason="uvloop is not installed"
        ),
    ),
    pytest.param("trio", id="trio"),
]


@pytest.fixture(params=_LOOPS)
def anyio_backend(request: pytest.FixtureRequest) -> object:
    """Run each ``@pytest.mark.anyio`` test once per event loop."""
    return request.param
