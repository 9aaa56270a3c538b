"""The trace of a failed (or cancelled) run: exact where people look when a run fails.

Each replica's pending slice carries that replica's own call, every replica left
waiting has one, and a run cancelled from outside is not reported as a failure.
"""

from __future__ import annotations

import signal
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest

import asyncreplica as ar
from asyncreplica._tracing import load_trace, summarize

pytestmark = pytest.mark.anyio

Check = Callable[[Any], None]
HERE = "tracing/test_failed_trace.py"


def strategy(n: int) -> ar.MirroredStrategy:
    return ar.MirroredStrategy([f"CPU:{i}" for i in range(n)])


def context() -> ar.ReplicaContext:
    ctx = ar.get_replica_context()
    assert ctx is not None
    return ctx


def pending(data: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """The slices that never completed, by replica (one each at most)."""
    found: dict[int, dict[str, Any]] = {}
    for e in data["traceEvents"]:
        if e.get("cat") == "collective" and e["args"]["status"] != "completed":
            assert e["args"]["replica"] not in found
            found[e["args"]["replica"]] = e
    return found


def line_of(text: str) -> str:
    source = Path(__file__).read_text().splitlines()
    (number,) = [i for i, line in enumerate(source, 1) if line.strip().endswith(text)]
    return f"{HERE}:{number}"


async def test_each_replicas_pending_slice_carries_its_own_call(
    tmp_path: Path, check_trace: Check
) -> None:
    s = strategy(2)

    async def step() -> None:
        ctx = context()
        if ctx.replica_id_in_sync_group == 0:
            await ctx.all_gather(np.ones(2), axis=0)  # gather here
        else:
            await ctx.all_reduce("sum", 1.0)  # reduce here

    path = tmp_path / "mismatch.json"
    with pytest.raises(ar.CollectiveMismatchError), s.trace(path):
        await s.run(step)
    data = load_trace(path)
    check_trace(data)
    slices = pending(data)
    assert sorted(slices) == [0, 1]
    gather, reduce = slices[0], slices[1]
    assert gather["name"] == "all_gather(axis=0) (never completed)"
    assert reduce["name"] == "all_reduce(SUM) (never completed)"
    assert (gather["args"]["kind"], reduce["args"]["kind"]) == ("all_gather", "all_reduce")
    assert "op" not in gather["args"]
    assert reduce["args"]["op"] == "SUM"
    assert (gather["args"]["value"], reduce["args"]["value"]) == ("float64[2]", "float64[]")
    assert (gather["args"]["bytes"], reduce["args"]["bytes"]) == (16, 8)
    assert gather["args"]["call_site"] == line_of("# gather here")
    assert reduce["args"]["call_site"] == line_of("# reduce here")
    # Both are the run's first collective.
    assert gather["args"]["position"] == reduce["args"]["position"] == 0


async def _extra_collective() -> None:
    # Replica 0 makes a collective after the others finished.
    ctx = context()
    await ctx.all_reduce("sum", 1.0)
    if ctx.replica_id_in_sync_group == 0:
        await anyio.wait_all_tasks_blocked()  # the others have finished
        await ctx.all_reduce("sum", 2.0)


async def _first_returns_at_once() -> None:
    ctx = context()
    if ctx.replica_id_in_sync_group == 0:
        return
    await ctx.all_reduce("sum", 1.0)


async def _last_skips_the_second() -> None:
    ctx = context()
    await ctx.all_reduce("sum", 1.0)
    if ctx.replica_id_in_sync_group != 2:
        await ctx.all_reduce("sum", 2.0)


async def _named_after_an_exit() -> None:
    ctx = context()
    await ctx.all_reduce("sum", 1.0, name="a")
    if ctx.replica_id_in_sync_group == 0:
        await anyio.wait_all_tasks_blocked()  # the others have finished
        await ctx.all_reduce("sum", 1.0, name="b")


@pytest.mark.parametrize(
    "step",
    [_extra_collective, _first_returns_at_once, _last_skips_the_second, _named_after_an_exit],
)
async def test_every_replica_left_waiting_has_its_pending_slice(
    step: Callable[[], Awaitable[None]], tmp_path: Path, check_trace: Check
) -> None:
    s = strategy(3)
    path = tmp_path / "exited.json"
    with pytest.raises(ar.ReplicaExitedError) as info, s.trace(path):
        await s.run(step)
    error = info.value
    assert error.waiting
    data = load_trace(path)
    check_trace(data)
    slices = pending(data)
    assert set(slices) == set(error.waiting)
    for replica, e in slices.items():
        named = "" if error.name is None else f" {error.name!r}"
        assert e["name"] == f"all_reduce(SUM){named} (never completed)"
        assert e["args"]["status"] == "never completed: the run failed"
        assert e["args"]["mismatched"] is False
        if error.name is None:
            assert e["args"]["position"] == error.position
        else:
            assert (e["args"]["name"], e["args"]["occurrence"]) == (error.name, error.position)
        (row,) = [
            r for r in data["otherData"]["failures"][0]["replicas"] if r["replica"] == replica
        ]
        assert row["state"] == "waiting"
        assert e["args"]["call_site"] == row["call_site"]
    # The summary names each of them, as waiting.
    text = summarize(path)
    for replica in error.waiting:
        assert f"replica {replica}: waiting all_reduce(SUM" in text


async def test_a_run_cancelled_from_outside_is_not_a_failure(
    tmp_path: Path, check_trace: Check
) -> None:
    s = strategy(2)
    never = anyio.Event()

    async def step() -> None:
        ctx = context()
        if ctx.replica_id_in_sync_group == 1:
            await never.wait()
        await ctx.all_reduce("sum", 1.0)  # replica 0 waits here

    path = tmp_path / "cancelled.json"
    with s.trace(path):
        async with anyio.create_task_group() as tg:
            tg.start_soon(s.run, step)
            await anyio.wait_all_tasks_blocked()
            tg.cancel_scope.cancel()
    data = load_trace(path)
    check_trace(data)
    assert data["otherData"]["failures"] == []
    assert not [e for e in data["traceEvents"] if e.get("cat") == "failure"]
    (run,) = [e for e in data["traceEvents"] if e.get("cat") == "run"]
    assert run["name"] == "run 0 (cancelled)"
    assert run["args"]["status"] == "cancelled"
    slices = pending(data)
    assert sorted(slices) == [0]
    assert slices[0]["args"]["status"] == "never completed: the run was cancelled"
    text = summarize(path)
    assert " failed" not in text
    assert "cancelled while waiting" not in text
    assert "Run 0 was cancelled by a scope around Strategy.run (not a failure)" in text
    assert (
        f"  replica 0: waiting all_reduce(SUM) on float64[] at {line_of('# replica 0 waits here')}"
    ) in text


async def test_a_replica_cancelling_its_own_collective_is_still_a_failure(
    tmp_path: Path, check_trace: Check
) -> None:
    s = strategy(2)
    never = anyio.Event()

    async def step() -> None:
        ctx = context()
        if ctx.replica_id_in_sync_group == 0:
            with anyio.CancelScope() as scope:
                scope.cancel()
                await ctx.all_reduce("sum", 1.0)
            await ctx.all_reduce("sum", 2.0)
        else:
            await never.wait()

    path = tmp_path / "abandoned.json"
    with (
        pytest.raises(ar.CollectiveError, match=r"^Replica 0 was cancelled while waiting"),
        s.trace(path),
    ):
        await s.run(step)
    data = load_trace(path)
    check_trace(data)
    (failure,) = data["otherData"]["failures"]
    assert failure["first_line"].startswith("Replica 0 was cancelled while waiting")
    (run,) = [e for e in data["traceEvents"] if e.get("cat") == "run"]
    assert run["args"]["status"] == "failed"
    assert "Run 0 failed: CollectiveError: Replica 0 was cancelled" in summarize(path)


def test_ctrl_c_under_trio_is_the_failure_of_the_run(tmp_path: Path, check_trace: Check) -> None:
    trio = pytest.importorskip("trio")
    s = strategy(3)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler

    async def step() -> None:
        ctx = context()
        if ctx.replica_id_in_sync_group == 1:
            token = trio.lowlevel.current_trio_token()
            token.run_sync_soon(signal.raise_signal, signal.SIGINT)  # Ctrl-C
            await trio.sleep_forever()
        await ctx.all_reduce("sum", 1.0)

    path = tmp_path / "interrupted.json"
    with pytest.raises(KeyboardInterrupt), s.trace(path):
        trio.run(s.run, step)
    data = load_trace(path)
    check_trace(data)
    # The interrupt, not the replicas it cancelled while they waited.
    assert [f["type"] for f in data["otherData"]["failures"]] == ["KeyboardInterrupt"]
    assert set(pending(data)) == {0, 2}
