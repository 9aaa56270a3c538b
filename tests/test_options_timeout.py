"""``CommunicationOptions.timeout_seconds``: NaN is refused, infinity waits for ever."""

from __future__ import annotations

import math

import anyio
import pytest
from _clocks import run_on_autojump_clock

import asyncreplica as ar


@pytest.mark.parametrize("nan", [math.nan, -math.nan, float("nan")], ids=["nan", "-nan", "str"])
def test_nan_timeout_is_value_error(nan: float) -> None:
    with pytest.raises(ValueError, match="timeout_seconds") as info:
        ar.CommunicationOptions(timeout_seconds=nan)
    assert "nan" in str(info.value)


def test_negative_timeout_is_value_error() -> None:
    with pytest.raises(ValueError, match="timeout_seconds"):
        ar.CommunicationOptions(timeout_seconds=-1.0)
    with pytest.raises(ValueError, match="timeout_seconds"):
        ar.CommunicationOptions(timeout_seconds=-math.inf)


def test_infinite_timeout_overrides_a_finite_default_and_waits_for_ever() -> None:
    options = ar.CommunicationOptions(timeout_seconds=5.0).merge(
        ar.CommunicationOptions(timeout_seconds=math.inf)
    )
    assert options.timeout_seconds == math.inf

    strategy = ar.MirroredStrategy(
        ["CPU:0", "CPU:1"], communication_options=ar.CommunicationOptions(timeout_seconds=math.inf)
    )

    async def step() -> object:
        ctx = ar.get_replica_context()
        assert ctx is not None
        if ctx.replica_id_in_sync_group == 1:
            await anyio.sleep(86400.0)  # a day late (mock time), but never timed out
        return await ctx.all_reduce("sum", 1.0)

    async def main() -> object:
        with anyio.fail_after(365 * 86400.0):  # hang guard, in mock time too
            return await strategy.run(step)

    result = run_on_autojump_clock(main)
    assert strategy.experimental_local_results(result) == (2.0, 2.0)
