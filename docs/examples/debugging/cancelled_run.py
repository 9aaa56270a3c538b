"""A run cancelled by a scope around it: the trace says so, and records no failure."""

import tempfile
from pathlib import Path

import anyio

import asyncreplica as ar
from asyncreplica._tracing import summarize

strategy = ar.MirroredStrategy(["CPU:0", "CPU:1"])


async def step():
    ctx = ar.get_replica_context()
    if ctx.replica_id_in_sync_group == 1:
        await anyio.sleep(3600)  # replica 1 is slow (I/O, a long computation)
    return await ctx.all_reduce("sum", 1.0)


async def main(path):
    with strategy.trace(path):
        with anyio.move_on_after(0.1):  # the caller's time limit
            await strategy.run(step)


with tempfile.TemporaryDirectory() as tmp:
    path = Path(tmp) / "train.json"
    anyio.run(main, path)
    text = summarize(path)  # as `asyncreplica trace summarize train.json`
    print(text)
    assert "Run 0 was cancelled by a scope around Strategy.run (not a failure)" in text
    # The lines that docs/debugging.md shows:
    assert (
        "Run 0 was cancelled by a scope around Strategy.run (not a failure); "
        "collectives in flight:\n"
        "  replica 0: waiting all_reduce(SUM) on float64[] at debugging/cancelled_run.py:18"
    ) in text
    assert " failed" not in text
