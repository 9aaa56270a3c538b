"""summarize() and plot() on real traces."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import anyio
import anyio.lowlevel
import numpy as np
import pytest

import asyncreplica as ar
from asyncreplica._tracing import load_trace, plot, summarize

HERE = "tracing/test_trace_summary.py"
needs_matplotlib = pytest.mark.skipif(
    importlib.util.find_spec("matplotlib") is None,
    reason="matplotlib is not installed (pip install matplotlib)",
)


async def _late_replica_one() -> None:
    ctx = ar.get_replica_context()
    assert ctx is not None
    for step in range(4):
        if ctx.replica_id_in_sync_group == 1:
            # Replica 1 is "slow": it yields to the loop before each collective, so
            # the others are already waiting when it arrives (no sleeps involved).
            for _ in range(3):
                await anyio.lowlevel.checkpoint()
        await ctx.all_reduce("sum", np.full(8, float(step), np.float32))  # the late line


async def _mismatch() -> None:
    ctx = ar.get_replica_context()
    assert ctx is not None
    await ctx.all_reduce("sum", 1.0)
    shape = 3 if ctx.replica_id_in_sync_group == 1 else 4
    await ctx.all_reduce("sum", np.ones(shape))


def _line_of(text: str) -> int:
    source = Path(__file__).read_text().splitlines()
    return next(i for i, line in enumerate(source, start=1) if text in line)


@pytest.fixture
def ok_trace(tmp_path: Path) -> Path:
    s = ar.MirroredStrategy(["CPU:0", "CPU:1", "CPU:2"])
    path = tmp_path / "ok.json"

    async def main() -> None:
        with s.trace(path):
            await s.run(_late_replica_one)
            await s.run(_late_replica_one)

    anyio.run(main)
    return path


@pytest.fixture
def failed_trace(tmp_path: Path) -> Path:
    s = ar.MirroredStrategy(["CPU:0", "CPU:1", "CPU:2"])
    path = tmp_path / "failed.json.gz"

    async def main() -> None:
        with s.trace(path):
            await s.run(_late_replica_one)
            await s.run(_mismatch)

    with pytest.raises(ar.CollectiveMismatchError):
        anyio.run(main)
    return path


def test_summary_counts_waits_and_late_arrivals(ok_trace: Path) -> None:
    text = summarize(ok_trace)
    lines = text.splitlines()
    assert lines[0] == f"Trace {ok_trace}: 3 replicas, 8 collectives in 2 runs"
    table = lines[lines.index("replica  collectives  waiting (ms)  arrived last") + 1 :][:3]
    rows = {int(r.split()[0]): r.split()[1:] for r in table}
    assert {r: (int(c), int(last)) for r, (c, _, last) in rows.items()} == {
        0: (8, 0),
        1: (8, 8),
        2: (8, 0),
    }
    assert float(rows[1][1]) == 0.0  # the late replica never waits
    assert float(rows[0][1]) > 0.0
    slowest = next(line for line in lines if line.startswith("Slowest rendezvous: "))
    assert "all_reduce(SUM) at position" in slowest
    assert "replica 1 arrived last" in slowest
    assert slowest.endswith(f"at {HERE}:{_line_of('# the late line')}.")
    assert "failed" not in text


def test_summary_of_a_failed_run(failed_trace: Path) -> None:
    text = summarize(failed_trace)
    error_line = next(line for line in text.splitlines() if line.startswith("Run 1 failed: "))
    assert error_line.startswith(
        "Run 1 failed: CollectiveMismatchError: Replicas disagree about their 2nd collective "
        "(position 1)"
    )
    assert "  mismatched position: 1 (differing: shape" in text
    assert f"  replica 1: waiting all_reduce(SUM) on float64[3] at {HERE}:" in text
    assert f"  replica 0: waiting all_reduce(SUM) on float64[4] at {HERE}:" in text


def test_summary_mentions_dropped_events(tmp_path: Path) -> None:
    s = ar.MirroredStrategy(["CPU:0", "CPU:1", "CPU:2"])
    path = tmp_path / "small.json"

    async def main() -> None:
        with s.trace(path, max_events=10):
            await s.run(_late_replica_one)

    anyio.run(main)
    text = summarize(path)
    assert "(the oldest " in text
    assert "max_events=10" in text


def test_summary_of_no_runs(tmp_path: Path) -> None:
    s = ar.MirroredStrategy(["CPU:0"])
    with s.trace(tmp_path / "none.json"):
        pass
    assert "No collectives were recorded." in summarize(tmp_path / "none.json")


def test_not_a_trace(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not a JSON trace"):
        summarize(bad)
    bad.write_text('{"events": []}')
    with pytest.raises(ValueError, match="no traceEvents"):
        load_trace(bad)


@needs_matplotlib
@pytest.mark.parametrize("trace", ["ok_trace", "failed_trace"])
def test_plot_writes_a_png(trace: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    path = request.getfixturevalue(trace)
    output = tmp_path / "timeline.png"
    plot(path, output)
    data = output.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 10_000
    assert "matplotlib.pyplot" not in sys.modules  # no global plotting state


def test_plot_without_matplotlib_says_how_to_install(
    ok_trace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(ImportError, match="pip install matplotlib"):
        plot(ok_trace, tmp_path / "timeline.png")
    assert not (tmp_path / "timeline.png").exists()
