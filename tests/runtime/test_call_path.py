"""Call paths: interned, keyed by instruction offsets, with the right lines."""

from __future__ import annotations

import asyncio
import inspect

import numpy as np

import asyncreplica as ar
from asyncreplica._runtime import _inspect


def _paths_of_two_calls_on_one_line() -> tuple[tuple[object, ...], tuple[object, ...], int]:
    line = inspect.currentframe().f_lineno + 1  # type: ignore[union-attr]
    first, second = _inspect.call_path(), _inspect.call_path()
    return first, second, line


def test_two_offsets_on_one_line_share_one_interned_path() -> None:
    first, second, line = _paths_of_two_calls_on_one_line()
    assert first is second  # different instruction offsets, the same (code, line) chain
    assert first[0].lineno == line
    assert first[0].function == "_paths_of_two_calls_on_one_line"


def test_a_mismatch_names_the_lines_of_both_call_sites() -> None:
    strategy = ar.MirroredStrategy(["CPU:0", "CPU:1"])
    lines: dict[int, int] = {}

    async def step() -> None:
        ctx = ar.get_replica_context()
        assert ctx is not None
        rid = ctx.replica_id_in_sync_group
        x = np.ones(2, np.float32)
        if rid == 0:
            lines[0] = inspect.currentframe().f_lineno + 1  # type: ignore[union-attr]
            await ctx.all_reduce("sum", x)
        else:
            lines[1] = inspect.currentframe().f_lineno + 1  # type: ignore[union-attr]
            await ctx.all_reduce("sum", x)

    try:
        asyncio.run(strategy.run(step))
    except ar.CollectiveMismatchError as exc:
        text = str(exc)
    else:  # pragma: no cover - the test fails below
        text = ""
    assert f"test_call_path.py:{lines[0]}" in text
    assert f"test_call_path.py:{lines[1]}" in text
