"""Two strategies traced into one file, as ASYNCREPLICA_TRACE does: what docs/debugging.md says.

An independent attack observed that both strategies' replicas share the tracks by id and
that runs are numbered across both. docs/debugging.md ("Several strategies in one
trace") states it, and how to tell the strategies apart; this pins each statement.
"""

from __future__ import annotations

from pathlib import Path

import anyio

import asyncreplica as ar
from asyncreplica._tracing import summarize
from asyncreplica._tracing._recorder import ChromeTracer
from asyncreplica._tracing._session import _attach


async def _step() -> None:
    ctx = ar.get_replica_context()
    assert ctx is not None
    await ctx.all_reduce("sum", 1.0)


def test_two_strategies_share_the_replica_tracks_and_the_run_numbers(tmp_path: Path) -> None:
    two = ar.MirroredStrategy(["CPU:0", "CPU:1"])
    three = ar.MirroredStrategy(["CPU:0", "CPU:1", "CPU:2"])
    tracer = ChromeTracer()  # one tracer for both, as ASYNCREPLICA_TRACE's
    _attach(two, tracer)
    _attach(three, tracer)

    async def main() -> None:
        await two.run(_step)
        await three.run(_step)

    anyio.run(main)
    path = tmp_path / "both.json"
    tracer.write(path)
    trace = tracer.to_json()
    events = trace["traceEvents"]
    names = sorted(e["args"]["name"] for e in events if e.get("name") == "thread_name")
    assert names == ["backend", "replica 0", "replica 1", "replica 2", "runs"]
    runs = {e["args"]["run"]: e["args"] for e in events if e.get("cat") == "run"}
    # numbered across strategies; num_replicas and devices tell them apart
    assert {r: (a["num_replicas"], tuple(a["devices"])) for r, a in runs.items()} == {
        0: (2, ("CPU:0", "CPU:1")),
        1: (3, ("CPU:0", "CPU:1", "CPU:2")),
    }
    tids = {
        (e["args"]["run"], e["args"]["replica"]): e["tid"]
        for e in events
        if e.get("cat") == "collective"
    }
    assert tids[(0, 0)] == tids[(1, 0)]  # replica 0 of both on one track
    text = summarize(path)
    assert "3 replicas, 2 collectives in 2 runs" in text
    row0 = next(line.split() for line in text.splitlines() if line.strip().startswith("0 "))
    assert row0[1] == "2"  # replica 0's row counts both strategies' replica 0
