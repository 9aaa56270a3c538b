"""What the picture and the summary of a failed run show: every replica, the failed run.

The picture's content is decided by ``_plot._layout`` (plain data), tested here without
reading pixels; ``plot`` draws exactly that.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest

import asyncreplica as ar
from asyncreplica._tools._cli import main as cli_main
from asyncreplica._tracing import load_trace, plot, summarize
from asyncreplica._tracing._plot import _layout

needs_matplotlib = pytest.mark.skipif(
    importlib.util.find_spec("matplotlib") is None,
    reason="matplotlib is not installed (pip install matplotlib)",
)


async def _healthy() -> None:
    ctx = ar.get_replica_context()
    assert ctx is not None
    await ctx.all_reduce("sum", 1.0)


async def _replica_1_never_arrives() -> None:
    ctx = ar.get_replica_context()
    assert ctx is not None
    if ctx.replica_id_in_sync_group == 1:
        return  # makes no collective: it never arrives
    await ctx.all_reduce("sum", np.ones(4))


@pytest.fixture
def failed_after_healthy_runs(tmp_path: Path) -> Path:
    """Five healthy runs of 4 replicas, then one in which replica 1 never arrives."""
    s = ar.MirroredStrategy([f"CPU:{i}" for i in range(4)])
    path = tmp_path / "failed.json"

    async def main() -> None:
        with s.trace(path):
            for _ in range(5):
                await s.run(_healthy)
            await s.run(_replica_1_never_arrives)

    with pytest.raises(ar.ReplicaExitedError):
        anyio.run(main)
    return path


def test_the_failed_run_is_shown_with_a_row_for_every_replica(
    failed_after_healthy_runs: Path,
) -> None:
    trace = load_trace(failed_after_healthy_runs)
    layout = _layout(trace, "failed.json", "failed", 2000)
    assert layout.replicas == [0, 1, 2, 3]  # replica 1 has a row, though it has no bar
    # The run failed as soon as replica 1 returned: 2 and 3 had not arrived yet either.
    assert layout.absent == {
        1: "finished: no collective in this run",
        2: "running: no collective in this run",
        3: "running: no collective in this run",
    }
    assert {s.args["run"] for s in layout.slices} == {5}  # only the failed run
    assert layout.title[0] == (
        "asyncreplica timeline: failed.json, run 5 (the failed run; 6 in the trace,"
        " run='all' for every one)"
    )
    assert layout.title[1].startswith("ReplicaExitedError: ")
    assert layout.slowest is None  # the failure is the point, not a healthy step


def test_all_runs_and_one_run_on_request(failed_after_healthy_runs: Path) -> None:
    trace = load_trace(failed_after_healthy_runs)
    every = _layout(trace, "failed.json", "all", 2000)
    assert {s.args["run"] for s in every.slices} == {0, 1, 2, 3, 4, 5}
    assert every.title[0] == "asyncreplica timeline: failed.json"
    one = _layout(trace, "failed.json", 2, 2000)
    assert {s.args["run"] for s in one.slices} == {2}
    assert one.failures == []
    assert "run 2 (one run;" in one.title[0]
    for bad in (6, -1, "last", True, 2.0):
        with pytest.raises(ValueError, match=r"pass 'failed' .* runs 0 to 5"):
            _layout(trace, "failed.json", bad, 2000)  # type: ignore[arg-type]


def test_a_long_error_line_is_wrapped_not_cut(tmp_path: Path) -> None:
    name = "CollectiveMismatchError: " + " ".join(f"word{i}" for i in range(60))
    trace = _synthetic(failure_type="CollectiveMismatchError", failure_name=name)
    layout = _layout(trace, "x.json", "failed", 2000)
    text = " ".join(layout.title[1:])
    assert text == name
    assert all(len(line) <= 120 for line in layout.title[1:])


def test_healthy_trace_points_at_the_slowest_rendezvous(tmp_path: Path) -> None:
    s = ar.MirroredStrategy(["CPU:0", "CPU:1"])
    path = tmp_path / "ok.json"

    async def main() -> None:
        with s.trace(path):
            await s.run(_healthy)

    anyio.run(main)
    layout = _layout(load_trace(path), "ok.json", "failed", 2000)
    assert layout.replicas == [0, 1]
    assert layout.absent == {}
    assert layout.title == ["asyncreplica timeline: ok.json"]


def test_summary_counts_every_replica_of_the_run(failed_after_healthy_runs: Path) -> None:
    text = summarize(failed_after_healthy_runs)
    first = text.splitlines()[0]
    assert first.endswith(": 4 replicas, 6 collectives in 6 runs"), first
    table = text.splitlines()
    row = next(line for line in table if line.split()[:2] == ["1", "5"])
    assert row.split()[1] == "5"  # replica 1 made the 5 healthy runs' collectives only


async def _replica_2_skips_the_second() -> None:
    ctx = ar.get_replica_context()
    assert ctx is not None
    await ctx.all_reduce("sum", 1.0)  # the first, reached by all
    if ctx.replica_id_in_sync_group != 2:
        await ctx.all_reduce("sum", 2.0)  # the failed one, replica 2 never reaches it


@pytest.fixture
def skipped_second(tmp_path: Path) -> Path:
    """3 replicas all reach position 0; replica 2 returns instead of reaching position 1."""
    s = ar.MirroredStrategy([f"CPU:{i}" for i in range(3)])
    path = tmp_path / "skipped.json"

    async def main() -> None:
        with s.trace(path):
            await s.run(_replica_2_skips_the_second)

    with pytest.raises(ar.ReplicaExitedError):
        anyio.run(main)
    return path


def _line(text: str) -> str:
    source = Path(__file__).read_text().splitlines()
    (number,) = [i for i, line in enumerate(source, 1) if line.rstrip().endswith(text)]
    return f"tracing/test_trace_layout.py:{number}"


def test_a_replica_with_bars_that_missed_the_failed_collective_is_labelled(
    skipped_second: Path,
) -> None:
    layout = _layout(load_trace(skipped_second), "skipped.json", "failed", 2000)
    assert layout.absent == {}  # every replica has the bar of position 0
    # The run failed when replica 2 returned; replica 1 had not resumed from position 0.
    labels = {replica: text for replica, _, text in layout.missing}
    assert labels == {
        1: "running: did not arrive at position 1",
        2: "finished: did not arrive at position 1",
    }
    (failure,) = layout.failures
    for replica, at, _ in layout.missing:
        ends = [s.end for s in layout.slices if s.args["replica"] == replica]
        assert at == max([float(failure["ts"]), *ends])  # after its bars, at the failure


def test_the_summary_does_not_name_a_finished_collective_as_the_failed_one(
    skipped_second: Path,
) -> None:
    lines = summarize(skipped_second).splitlines()
    first, failed = (
        _line("# the first, reached by all"),
        _line("# the failed one, replica 2 never reaches it"),
    )
    assert "  waited at position: 1" in lines
    assert f"  replica 0: waiting all_reduce(SUM) on float64[] at {failed}" in lines
    assert (
        f"  replica 1: running, did not arrive at position 1 (its last collective was "
        f"all_reduce(SUM) on float64[] at {first})"
    ) in lines
    assert (
        f"  replica 2: finished, did not arrive at position 1 (its last collective was "
        f"all_reduce(SUM) on float64[] at {first})"
    ) in lines


def test_perfettos_flight_recorder_markers_say_who_did_not_arrive(skipped_second: Path) -> None:
    markers = {
        e["args"]["replica"]: e["name"]
        for e in load_trace(skipped_second)["traceEvents"]
        if e.get("cat") == "failure" and e.get("s") == "t"
    }
    assert markers == {
        0: "flight recorder: replica 0 waiting",
        1: "flight recorder: replica 1 running, did not arrive at position 1",
        2: "flight recorder: replica 2 finished, did not arrive at position 1",
    }


def test_a_replica_that_made_no_collective_says_so_in_the_summary(
    failed_after_healthy_runs: Path,
) -> None:
    lines = summarize(failed_after_healthy_runs).splitlines()
    assert "  replica 1: finished, did not arrive at position 0 (it made no collective)" in lines


@pytest.mark.parametrize(
    ("error", "label"),
    [
        ("CollectiveTimeoutError", "  timed out at position: 0"),
        ("CollectiveMismatchError", "  mismatched position: 0"),
        ("ReplicaExitedError", "  waited at position: 0"),
        ("SomethingElse", "  at position: 0"),
    ],
)
def test_a_failures_position_is_labelled_by_its_kind(
    tmp_path: Path, error: str, label: str
) -> None:
    path = tmp_path / "t.json"
    path.write_text(json.dumps(_synthetic(failure_type=error, failure_name=f"{error}: x")))
    lines = summarize(path).splitlines()
    assert label in lines, lines
    if error != "CollectiveMismatchError":
        assert not any("mismatched" in line for line in lines)


@needs_matplotlib
def test_plot_and_the_cli_take_the_run(failed_after_healthy_runs: Path, tmp_path: Path) -> None:
    out = tmp_path / "one.png"
    plot(failed_after_healthy_runs, out, run=3)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (
        cli_main(["trace", "plot", str(failed_after_healthy_runs), "-o", str(out), "--run", "all"])
        == 0
    )
    assert (
        cli_main(["trace", "plot", str(failed_after_healthy_runs), "-o", str(out), "--run", "9"])
        != 0
    )


def _synthetic(*, failure_type: str, failure_name: str) -> dict[str, Any]:
    """A trace of one run of 2 replicas that failed at position 0."""
    run = {"run": 0, "num_replicas": 2, "devices": ["CPU:0", "CPU:1"], "status": "failed"}
    args = {"replica": 0, "run": 0, "collective": 0, "position": 0, "status": "never completed"}
    failure = {"type": failure_type, "run": 0, "position": 0, "name": None, "fields": None}
    return {
        "traceEvents": [
            {"ph": "X", "cat": "run", "name": "run 0", "ts": 0, "dur": 10, "args": run},
            {"ph": "X", "cat": "collective", "name": "all_reduce", "ts": 1, "dur": 5, "args": args},
            {"ph": "i", "s": "g", "cat": "failure", "ts": 6, "name": failure_name, "args": failure},
        ],
        "otherData": {
            "failures": [{**failure, "first_line": "x", "replicas": []}],
        },
    }
