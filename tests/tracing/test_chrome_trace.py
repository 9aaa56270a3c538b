"""strategy.trace(): Chrome trace-event JSON that Perfetto opens, on every event loop."""

from __future__ import annotations

import gzip
import json
import os
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import numpy as np
import pytest

import asyncreplica as ar
from asyncreplica._tracing import ChromeTracer, _attach, _itemsize, _lanes, load_trace

pytestmark = pytest.mark.anyio

Check = Callable[[Any], None]
HERE = "tracing/test_chrome_trace.py"


def strategy(n: int = 3) -> ar.MirroredStrategy:
    return ar.MirroredStrategy([f"CPU:{i}" for i in range(n)])


def events(data: dict[str, Any], cat: str, ph: str = "X") -> list[dict[str, Any]]:
    return [e for e in data["traceEvents"] if e.get("cat") == cat and e["ph"] == ph]


def thread_names(data: dict[str, Any]) -> dict[int, str]:
    return {
        e["tid"]: e["args"]["name"]
        for e in data["traceEvents"]
        if e["ph"] == "M" and e["name"] == "thread_name"
    }


async def every_kind(x: float) -> object:
    ctx = ar.get_replica_context()
    assert ctx is not None
    a = await ctx.all_reduce("sum", np.full(4, x, np.float32))
    await ctx.all_gather(np.ones((2, 3), np.int64), axis=0, name="gathered")
    await ctx.broadcast(np.arange(3.0), source=1)
    await ctx.reduce_scatter("max", np.ones(6, np.float64), axis=0)
    await ctx.barrier()
    await ctx.merge_call(lambda strategy: None)
    return a


async def test_the_trace_is_valid_chrome_json(tmp_path: Path, check_trace: Check) -> None:
    s = strategy(3)
    path = tmp_path / "trace.json"
    with s.trace(path) as tracer:
        assert isinstance(tracer, ChromeTracer)
        await s.run(every_kind, args=(1.0,))
        await s.run(every_kind, args=(2.0,))
    assert s._tracer is None
    data = json.loads(path.read_text())
    check_trace(data)

    # One process (this one), named; one named track per replica, the backend, the runs.
    process = [e for e in data["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"]
    assert [e["pid"] for e in process] == [os.getpid()]
    names = thread_names(data)
    assert sorted(names.values()) == ["backend", "replica 0", "replica 1", "replica 2", "runs"]

    collectives = events(data, "collective")
    assert len(collectives) == 2 * 6 * 3  # runs x collectives x replicas
    by_replica = Counter(names[e["tid"]] for e in collectives)
    assert by_replica == {"replica 0": 12, "replica 1": 12, "replica 2": 12}
    for e in collectives:
        args = e["args"]
        assert names[e["tid"]] == f"replica {args['replica']}"
        assert args["call_site"].startswith(f"{HERE}:")
        assert args["waited_us"] >= 0
        assert e["dur"] >= args["waited_us"] - 0.001
        assert args["status"] == "completed"
    first = [e for e in collectives if e["args"]["run"] == 0 and e["args"].get("position") == 0]
    assert {e["name"] for e in first} == {"all_reduce(SUM)"}
    assert all(e["args"]["kind"] == "all_reduce" and e["args"]["op"] == "SUM" for e in first)
    assert all(e["args"]["bytes"] == 16 and e["args"]["dtype"] == "float32" for e in first)
    assert all(e["args"]["value"] == "float32[4]" for e in first)
    assert sum(e["args"]["arrived_last"] for e in first) == 1
    gathered = [e for e in collectives if e["args"].get("name") == "gathered"]
    assert len(gathered) == 6
    assert {e["args"]["occurrence"] for e in gathered} == {0}  # once per run
    assert all(e["args"]["bytes"] == 48 and e["args"]["dtype"] == "int64" for e in gathered)
    barrier = [e for e in collectives if e["args"]["kind"] == "barrier"]
    assert barrier
    assert all(e["args"]["bytes"] == 0 for e in barrier)

    # One reduction per collective on the backend track, with an arrow from the last arrival.
    dispatches = events(data, "dispatch")
    assert len(dispatches) == 2 * 6
    assert {names[e["tid"]] for e in dispatches} == {"backend"}
    starts = {e["id"]: e for e in events(data, "dispatch", "s")}
    ends = {e["id"]: e for e in events(data, "dispatch", "f")}
    assert starts.keys() == ends.keys() == {e["args"]["collective"] for e in dispatches}
    for d in dispatches:
        late = [
            e
            for e in collectives
            if e["args"]["collective"] == d["args"]["collective"] and e["args"]["arrived_last"]
        ]
        assert len(late) == 1
        assert d["args"]["dispatched_by"] == late[0]["args"]["replica"]
        assert starts[d["args"]["collective"]]["tid"] == late[0]["tid"]
        # The reduction happens inside the last arrival's slice.
        assert late[0]["ts"] <= d["ts"] <= d["ts"] + d["dur"] <= late[0]["ts"] + late[0]["dur"]

    runs = events(data, "run")
    assert [e["args"]["status"] for e in runs] == ["ok", "ok"]
    assert data["otherData"]["dropped_events"] == 0
    assert data["otherData"]["failures"] == []


async def test_waiting_and_lateness_are_measured(tmp_path: Path, check_trace: Check) -> None:
    # Replica 1 always arrives last: it yields to the loop before each collective,
    # so replica 0 is already waiting. Orders events without any sleep.
    s = strategy(2)

    async def step() -> None:
        ctx = ar.get_replica_context()
        assert ctx is not None
        for _ in range(5):
            if ctx.replica_id_in_sync_group == 1:
                for _ in range(3):
                    await anyio.lowlevel.checkpoint()
            await ctx.all_reduce("sum", 1.0)

    path = tmp_path / "late.json"
    with s.trace(path):
        await s.run(step)
    data = load_trace(path)
    check_trace(data)
    collectives = events(data, "collective")
    late = Counter(e["args"]["replica"] for e in collectives if e["args"]["arrived_last"])
    assert late == {1: 5}
    for e in collectives:
        if e["args"]["replica"] == 0:
            assert e["args"]["waited_us"] == pytest.approx(e["args"]["late_us"], abs=0.002)
        else:
            assert e["args"]["waited_us"] == 0


async def test_named_collectives_in_flight_together_still_nest(
    tmp_path: Path, check_trace: Check
) -> None:
    s = strategy(2)

    async def step() -> None:
        ctx = ar.get_replica_context()
        assert ctx is not None
        names = ("a", "b") if ctx.replica_id_in_sync_group == 0 else ("b", "a")

        async def reduce(name: str) -> None:
            await ctx.all_reduce("sum", 1.0, name=name)

        async with anyio.create_task_group() as tg:
            for name in names:
                tg.start_soon(reduce, name)

    path = tmp_path / "named.json"
    with s.trace(path):
        for _ in range(3):
            await s.run(step)
    data = load_trace(path)
    check_trace(data)  # overlapping slices went to extra lanes
    collectives = events(data, "collective")
    assert Counter(e["args"]["replica"] for e in collectives) == {0: 6, 1: 6}
    names = thread_names(data)
    for e in collectives:
        assert names[e["tid"]].startswith(f"replica {e['args']['replica']}")


async def test_gzip_when_the_name_ends_in_gz(tmp_path: Path, check_trace: Check) -> None:
    s = strategy(2)
    path = tmp_path / "trace.json.gz"
    with s.trace(path):
        await s.run(every_kind, args=(1.0,))
    raw = path.read_bytes()
    assert raw[:2] == b"\x1f\x8b"
    data = json.loads(gzip.decompress(raw))
    check_trace(data)
    assert data == load_trace(path)
    assert len(events(data, "collective")) == 6 * 2


async def test_the_ring_buffer_drops_the_oldest_and_says_so(
    tmp_path: Path, check_trace: Check
) -> None:
    s = strategy(2)

    async def step() -> None:
        ctx = ar.get_replica_context()
        assert ctx is not None
        for _ in range(20):
            await ctx.all_reduce("sum", 1.0)

    path = tmp_path / "ring.json"
    with s.trace(path, max_events=31):
        await s.run(step)
    data = load_trace(path)
    check_trace(data)
    other = data["otherData"]
    # Each collective is 3 events (two replicas, one reduction), the run 1: 10 fit.
    assert other["max_events"] == 31
    assert other["events_kept"] <= 31
    assert other["dropped_collectives"] == 10
    assert other["dropped_events"] == 30
    kept = sorted({e["args"]["position"] for e in events(data, "collective")})
    assert kept == list(range(10, 20))  # the newest
    notes = [e for e in data["traceEvents"] if e["ph"] == "i" and "dropped" in e["name"]]
    assert len(notes) == 1
    assert notes[0]["name"] == "30 earlier events dropped"


async def test_a_failed_run_still_writes_the_file_with_every_history(
    tmp_path: Path, check_trace: Check
) -> None:
    s = strategy(3)

    async def ok() -> None:
        ctx = ar.get_replica_context()
        assert ctx is not None
        await ctx.all_reduce("sum", 1.0)

    async def mismatched() -> None:
        ctx = ar.get_replica_context()
        assert ctx is not None
        await ctx.all_reduce("sum", 1.0)
        shape = 3 if ctx.replica_id_in_sync_group == 1 else 4
        if ctx.replica_id_in_sync_group == 1:
            # Arrive last, so that replica 1's is the arrival the ledger refuses.
            await anyio.wait_all_tasks_blocked()
        await ctx.all_reduce("sum", np.ones(shape))

    path = tmp_path / "failed.json"
    with s.trace(path):
        await s.run(ok)
        with pytest.raises(ar.CollectiveMismatchError) as info:
            await s.run(mismatched)
    assert s._tracer is None
    data = load_trace(path)
    check_trace(data)
    error = info.value
    (failure,) = data["otherData"]["failures"]
    assert failure["type"] == "CollectiveMismatchError"
    assert failure["message"] == str(error)
    assert failure["first_line"] == str(error).splitlines()[0]
    assert failure["position"] == 1
    assert failure["run"] == 1
    assert "shape" in failure["fields"]
    assert error.report is not None
    assert [row["replica"] for row in failure["replicas"]] == [0, 1, 2]
    # Which replicas reached the second collective before the mismatch depends on the
    # event loop's wake-up order; the mismatching pair did.
    arrived = sorted(row.replica_id for row in error.report.rows if len(row.history) == 2)
    assert set(error.signatures) <= set(arrived)
    assert 1 in arrived
    for row, expected in zip(failure["replicas"], error.report.rows, strict=True):
        assert row["state"] == expected.state.value
        assert len(row["history"]) == len(expected.history)
        assert row["history"][0]["collective"] == "all_reduce(SUM) on float64[]"
        for entry, (seq, signature) in zip(row["history"], expected.history, strict=True):
            assert entry["seq"] == seq
            assert entry["collective"] == signature.describe()
            assert entry["call_site"].startswith(f"{HERE}:")

    # On the timeline: one flight-recorder instant per replica track, the error globally.
    names = thread_names(data)
    recorders = [e for e in events(data, "failure", "i") if e["s"] == "t"]
    assert sorted(names[e["tid"]] for e in recorders) == ["replica 0", "replica 1", "replica 2"]
    for e in recorders:
        assert e["args"]["history"] == failure["replicas"][e["args"]["replica"]]["history"]
        assert e["args"]["error"] == failure["first_line"]
    (glob,) = [e for e in events(data, "failure", "i") if e["s"] == "g"]
    assert glob["name"].startswith("CollectiveMismatchError: ")
    assert glob["args"]["message"] == str(error)
    # The collective that never completed ends with the run, for every replica,
    # including the one whose arrival was refused.
    unfinished = [e for e in events(data, "collective") if e["args"]["status"] != "completed"]
    assert sorted(e["args"]["replica"] for e in unfinished) == arrived
    assert all(e["name"].endswith("(never completed)") for e in unfinished)
    assert [e["args"]["replica"] for e in unfinished if e["args"]["mismatched"]] == [1]
    assert [e["args"]["status"] for e in events(data, "run")] == ["ok", "failed"]


async def test_an_exception_in_a_replica_is_recorded(tmp_path: Path, check_trace: Check) -> None:
    s = strategy(2)

    async def step() -> None:
        ctx = ar.get_replica_context()
        assert ctx is not None
        await ctx.all_reduce("sum", 1.0)
        if ctx.replica_id_in_sync_group == 0:
            await anyio.wait_all_tasks_blocked()  # replica 1 is parked at its second
            raise ValueError("boom")
        await ctx.all_reduce("sum", 1.0)

    path = tmp_path / "boom.json"
    with pytest.raises(ValueError, match="boom"), s.trace(path):
        await s.run(step)
    data = load_trace(path)
    check_trace(data)
    (failure,) = data["otherData"]["failures"]
    assert failure["type"] == "ValueError"
    assert failure["first_line"] == "boom"
    assert failure["replicas"] == []  # no flight recorder outside collective errors
    # Replica 1 was cancelled while it waited at its second collective.
    unfinished = [e for e in events(data, "collective") if e["args"]["status"] != "completed"]
    assert [e["args"]["replica"] for e in unfinished] == [1]


async def test_nested_trace_blocks_both_record(tmp_path: Path, check_trace: Check) -> None:
    s = strategy(2)
    outer, inner = tmp_path / "outer.json", tmp_path / "inner.json"
    with s.trace(outer):
        await s.run(every_kind, args=(1.0,))
        with s.trace(inner):
            await s.run(every_kind, args=(1.0,))
        await s.run(every_kind, args=(1.0,))
    assert s._tracer is None
    for path, runs in ((outer, 3), (inner, 1)):
        data = load_trace(path)
        check_trace(data)
        assert len(events(data, "run")) == runs


async def test_concurrent_runs_on_one_tracer_stay_apart(tmp_path: Path, check_trace: Check) -> None:
    # As with ASYNCREPLICA_TRACE: several strategies share one tracer.
    tracer = ChromeTracer()
    two, three = strategy(2), strategy(3)
    _attach(two, tracer)
    _attach(three, tracer)
    async with anyio.create_task_group() as tg:
        tg.start_soon(two.run, every_kind, (1.0,))
        tg.start_soon(three.run, every_kind, (1.0,))
    tracer.write(tmp_path / "both.json")
    data = load_trace(tmp_path / "both.json")
    check_trace(data)
    runs = {e["args"]["run"]: e["args"]["num_replicas"] for e in events(data, "run")}
    assert sorted(runs.values()) == [2, 3]
    per_collective = Counter(e["args"]["collective"] for e in events(data, "collective"))
    per_run: dict[int, set[int]] = {}
    for e in events(data, "collective"):
        per_run.setdefault(e["args"]["run"], set()).add(per_collective[e["args"]["collective"]])
    assert per_run == {r: {n} for r, n in runs.items()}


def test_tracing_is_off_unless_asked() -> None:
    assert strategy(2)._tracer is None


def test_bad_arguments(tmp_path: Path) -> None:
    s = strategy(2)
    with pytest.raises(ValueError, match="max_events"), s.trace(tmp_path / "x.json", max_events=0):
        pass
    with pytest.raises(FileNotFoundError, match="not a directory"), s.trace(tmp_path / "no" / "x"):
        pass
    assert s._tracer is None
    assert not list(tmp_path.iterdir())


def test_an_empty_trace_is_valid(tmp_path: Path, check_trace: Check) -> None:
    s = strategy(2)
    with s.trace(tmp_path / "empty.json"):
        pass
    data = load_trace(tmp_path / "empty.json")
    check_trace(data)
    assert not events(data, "collective")


@pytest.mark.parametrize(
    ("dtype", "size"),
    [
        ("float32", 4),
        ("float64", 8),
        ("bfloat16", 2),
        ("float16", 2),
        ("complex128", 16),
        ("int8", 1),
        ("uint64", 8),
        ("bool", 1),
        ("float8_e4m3fn", 1),
        ("object", None),
        ("str", None),
    ],
)
def test_item_sizes_come_from_dtype_names(dtype: str, size: int | None) -> None:
    assert _itemsize(dtype) == size


def test_lanes_keep_nesting_and_split_partial_overlaps() -> None:
    items: list[tuple[int, int, dict[str, Any]]] = [
        (0, 10, {}),  # lane 0
        (2, 5, {}),  # nested in it: lane 0
        (5, 8, {}),  # after that, still inside: lane 0
        (7, 12, {}),  # overlaps (5, 8) and (0, 10) partially: lane 1
        (12, 13, {}),  # after everything: lane 0
        (9, 11, {}),  # overlaps (0, 10) partially, inside (7, 12): lane 1
    ]
    assert _lanes(items) == [0, 0, 0, 1, 0, 1]
