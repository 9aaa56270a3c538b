"""The run's clock: the event loop's own, read in one place.

Timeouts and stall warnings wait with anyio (``anyio.sleep``, ``fail_after``), which
sleep on the event loop's clock; the times they compare against must come from that
same clock, or a loop whose clock is not the system's (trio's ``MockClock``, a test
loop) would drive the waits but not the arithmetic. asyncio and uvloop: ``loop.time``;
trio: ``trio.current_time`` (through anyio).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import anyio

__all__ = ["loop_clock"]


def loop_clock(loop: asyncio.AbstractEventLoop | None) -> Callable[[], float]:
    """The clock of the running event loop: ``loop`` (asyncio) or trio's when None.

    Must be called inside the running loop.
    """
    if loop is not None:
        return loop.time
    return anyio.current_time
