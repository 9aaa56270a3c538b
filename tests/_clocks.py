"""Timeouts tested on trio's autojump clock: seconds of waiting in no real time.

The runtime reads time through the event loop's clock (``asyncreplica/_runtime/_clock.py``)
and waits with anyio, which sleeps on that clock. On trio with
``MockClock(autojump_threshold=0)`` the clock jumps to the next deadline as soon as every
task waits, so a collective's timeout, a stall warning and ``anyio.sleep`` pass at once,
and the figures in messages are the mock clock's. asyncio has no such clock.

A plain test calls :func:`run_on_autojump_clock` where it would call ``anyio.run``. Two
ways for an ``anyio`` test (tests/conftest.py's ``anyio_backend`` fixture asks
:func:`anyio_backend`):

* ``@on_autojump_clock``: the test runs once, on trio with the autojump clock, instead of
  once per loop. For tests whose subject is the timeout itself (its count, its message,
  which replicas), the same on every loop.
* ``@trio_on_autojump_clock``: the test still runs on every loop, and trio's run is on the
  autojump clock. For tests whose subject differs per loop (task introspection,
  cancellation, the deadlock check): asyncio's runs still wait in real time.

Hang guards (``anyio.fail_after``) count mock time too: a run that hangs fails as soon as
every task waits, not after the guard's seconds.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
import pytest

__all__ = [
    "AUTOJUMP",
    "MARKER",
    "anyio_backend",
    "on_autojump_clock",
    "run_on_autojump_clock",
    "trio_on_autojump_clock",
]

T = TypeVar("T")

AUTOJUMP = "trio-autojump"
"""The ``anyio_backend`` parameter of a run on trio with ``MockClock(autojump_threshold=0)``."""

MARKER = "trio_autojump"
"""The marker of :data:`trio_on_autojump_clock`."""

on_autojump_clock = pytest.mark.parametrize(
    "anyio_backend", [pytest.param(AUTOJUMP, id=AUTOJUMP)], indirect=True
)
trio_on_autojump_clock = getattr(pytest.mark, MARKER)


def _autojump() -> tuple[str, dict[str, Any]]:
    from trio.testing import MockClock

    return ("trio", {"clock": MockClock(autojump_threshold=0)})


def anyio_backend(param: object, node: pytest.Item) -> object:
    """The ``anyio_backend`` value for ``param``: a fresh autojump clock where asked for."""
    if param == AUTOJUMP or (param == "trio" and node.get_closest_marker(MARKER) is not None):
        return _autojump()
    return param


def run_on_autojump_clock(main: Callable[[], Awaitable[T]]) -> T:
    """``anyio.run(main)`` on trio with a fresh autojump clock."""
    backend, options = _autojump()
    return anyio.run(main, backend=backend, backend_options=options)
