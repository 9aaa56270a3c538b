"""Shared fixtures: every async test runs on asyncio, uvloop and trio.

Also marks ``out_of_process`` the tests that run the library only in child processes or
not at all (tests/_passes.py says how it reads them): the README's test command leaves
them out of its second, interpreted pass (``-m "not out_of_process"``).
"""

from __future__ import annotations

import importlib.util

import _clocks
import _passes  # tests/ is on sys.path, as for every module of the suite
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
    """Run each ``@pytest.mark.anyio`` test once per event loop.

    Or on trio's autojump clock, where tests/_clocks.py's decorators ask for it.
    """
    return _clocks.anyio_backend(request.param, request.node)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{_clocks.MARKER}: the test's trio run is on trio's autojump clock (tests/_clocks.py)",
    )
    config.addinivalue_line(
        "markers",
        f"{_passes.MARKER}: runs the library only in child processes or not at all, so the "
        "interpreted pass (ASYNCREPLICA_NO_EXTENSIONS=1) leaves it out (set by tests/conftest.py)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        function = getattr(item, "function", None)
        if function is None or "." in function.__qualname__:
            continue  # not a module-level test function: it counts as in process
        if _passes.out_of_process(item.path, function.__name__):
            item.add_marker(_passes.MARKER)
