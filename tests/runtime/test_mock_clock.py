"""Timeouts and stall warnings on trio's autojump clock: the run reads the loop's clock.

Minutes of waiting pass in no real time; the figures in the messages are the mock
clock's, which they could not be if the run read the system clock.
"""

from __future__ import annotations

import logging
import time

import anyio
import numpy as np
import pytest
from _clocks import on_autojump_clock, trio_on_autojump_clock

import asyncreplica as ar

trio = pytest.importorskip("trio")
from trio.testing import MockClock  # noqa: E402


async def _replica_1_never_arrives() -> None:
    ctx = ar.get_replica_context()
    assert ctx is not None
    if ctx.replica_id_in_sync_group == 1:
        await anyio.Event().wait()  # never set: only the timeout ends the run
    await ctx.all_reduce("sum", np.ones(2))


def _run_on_mock_clock(strategy: ar.MirroredStrategy) -> BaseException:
    clock = MockClock(autojump_threshold=0)

    async def main() -> None:
        await strategy.run(_replica_1_never_arrives)

    with pytest.raises(BaseException) as info:  # noqa: PT011 - checked by the callers
        anyio.run(main, backend="trio", backend_options={"clock": clock})
    assert clock.current_time() >= 100.0  # mock time passed
    return info.value


def test_a_two_minute_timeout_passes_in_no_real_time(caplog: pytest.LogCaptureFixture) -> None:
    options = ar.CommunicationOptions(timeout_seconds=120.0)
    s = ar.MirroredStrategy(
        ["CPU:0", "CPU:1"], communication_options=options, stall_warning_seconds=60.0
    )
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="asyncreplica"):
        error = _run_on_mock_clock(s)
    assert time.monotonic() - started < 30.0  # hang guard: mock minutes, not real ones
    assert isinstance(error, ar.CollectiveTimeoutError), repr(error)
    stalls = [r.getMessage() for r in caplog.records if "waited" in r.getMessage()]
    assert stalls, [r.getMessage() for r in caplog.records]
    # The stall warning's figure is the mock clock's 60 s, not the real milliseconds.
    assert any("60." in m or "1 min" in m for m in stalls), stalls


# -- tests/_clocks.py: the decorators that put a test on the autojump clock -------------


@on_autojump_clock
@pytest.mark.anyio
async def test_on_autojump_clock_runs_once_on_trio_with_time_mocked(
    anyio_backend_name: str,
) -> None:
    assert anyio_backend_name == "trio"
    started, real = anyio.current_time(), time.monotonic()
    await anyio.sleep(3600.0)
    assert anyio.current_time() - started >= 3600.0
    assert time.monotonic() - real < 30.0  # hang guard: an hour of mock time, not real


@trio_on_autojump_clock
@pytest.mark.anyio
async def test_trio_on_autojump_clock_mocks_trio_only(anyio_backend_name: str) -> None:
    started, real = anyio.current_time(), time.monotonic()
    if anyio_backend_name == "trio":
        await anyio.sleep(3600.0)
        assert anyio.current_time() - started >= 3600.0
    else:  # asyncio keeps its real clock: a real millisecond is a millisecond
        await anyio.sleep(0.001)
        assert anyio.current_time() - started < 30.0
    assert time.monotonic() - real < 30.0
