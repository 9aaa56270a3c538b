"""A trace written while a run is still going marks the run and its collectives.

Before, such a run was written as its completed collectives only, as if nothing had
been pending (attack23f, a19 step 5: a loop stopped with a run in flight while the
``strategy.trace()`` block exited).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import asyncreplica as ar
from asyncreplica._tracing import summarize


def test_a_run_in_flight_when_the_trace_is_written_is_marked_unfinished(tmp_path: Path) -> None:
    strategy = ar.MirroredStrategy(["CPU:0", "CPU:1"])
    path = tmp_path / "unfinished.json"
    loop = asyncio.new_event_loop()
    parked = loop.create_future()
    never = loop.create_future()

    async def step() -> float:
        ctx = ar.get_replica_context()
        total = float(await ctx.all_reduce("sum", 1.0))
        if ctx.replica_id_in_sync_group == 1:
            parked.set_result(None)
            await never  # replica 1 never arrives at the second all_reduce
        return total + float(await ctx.all_reduce("sum", 1.0))

    try:
        with strategy.trace(path):
            task = loop.create_task(strategy.run(step))
            loop.run_until_complete(parked)
            # replica 0 waits at the second all_reduce; the block exits and writes now
        trace = json.loads(path.read_text())
        runs = [e for e in trace["traceEvents"] if e.get("cat") == "run" and e.get("ph") == "X"]
        assert [r["args"]["status"] for r in runs] == [
            "unfinished: still running when the trace was written"
        ]
        assert runs[0]["name"] == "run 0 (unfinished)"
        pending = [
            e
            for e in trace["traceEvents"]
            if e.get("cat") == "collective" and e["args"]["status"] != "completed"
        ]
        assert [(e["args"]["replica"], e["args"]["status"], e["name"]) for e in pending] == [
            (0, "in flight when the trace was written", "all_reduce(SUM) (in flight)")
        ]
        text = summarize(path)
        assert "Run 0 was still running when the trace was written; collectives in flight:" in text
        assert "  replica 0: waiting all_reduce(SUM)" in text
    finally:
        task.cancel()
        loop.run_until_complete(asyncio.gather(task, return_exceptions=True))
        loop.close()
