"""`asyncreplica bench`: a `--quick` run end to end (ratios reported, not asserted), and its parts.

The parts are tested on canned rows: how a figure within the noise is reported, what
the chart draws (its data, not its pixels), the targets and `--check`.
"""

from __future__ import annotations

import importlib.util
import json
import math
import pathlib
import sys

import numpy as np
import pytest

from asyncreplica._tools._bench import _cases as bench_cases
from asyncreplica._tools._bench import _main as bench_main
from asyncreplica._tools._bench import main
from asyncreplica._tools._bench._baselines import _difference, _median_us, _rendezvous
from asyncreplica._tools._bench._cases import SCALE_REFERENCE, Plan
from asyncreplica._tools._bench._model import Row
from asyncreplica._tools._bench._plot import _plot, chart
from asyncreplica._tools._bench._report import _targets_table
from asyncreplica._tools._bench._targets import _mpi_targets, _targets
from asyncreplica._tools._bench_mpi_faults import KINDS as FAULT_KINDS


@pytest.mark.slow
def test_quick_bench_writes_a_table_and_json(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bench.json"
    assert main(["--quick", "--quiet", "--repeat", "1", "--json", str(out)]) == 0
    table = capsys.readouterr().out
    assert table.splitlines()[0].split()[:3] == ["case", "N", "size"]
    report = json.loads(out.read_text())
    rows = report["rows"]
    systems = {(r["case"], r["system"]) for r in rows}
    assert ("all_reduce", "asyncreplica") in systems
    assert ("all_reduce", "futures") in systems
    assert ("all_gather", "asyncreplica") in systems
    assert ("scale (per replica)", "asyncreplica") in systems
    for r in rows:  # each loop's scale figure against the bare rendezvous on that loop
        if r["case"] == "scale (per replica)":
            assert r["baseline"] == f"{SCALE_REFERENCE[r['loop']]}, per replica"
    assert ("tracing on", "asyncreplica + trace") in systems
    for name in ("numpy", "jax", "array_api_strict"):  # issue 18: by input array type
        assert ("all_reduce array type", name) in systems
    # The minimal implementations each target is also read against, measured in the run.
    assert ("batched 1000 x 1 KiB", "numpy, per leaf (floor)") in systems
    for kind in ("all_gather", "broadcast", "reduce_scatter"):
        assert (kind, "futures") in systems
    # Every figure is measured or null (not measured), never zero or a tiny clamped time.
    for key in ("median_us", "baseline_us"):
        assert all(r[key] is None or r[key] > 1e-3 for r in rows), key
    figures = [t["figure"] for t in report["targets"]]
    assert any(f.startswith("all_reduce 8 B x 8 vs futures") for f in figures)
    assert any(f.startswith("RSS growth") for f in figures)
    assert any(f.startswith("RSS added by") for f in figures)
    assert all(isinstance(t["met"], bool) for t in report["targets"])
    references = {t["figure"]: t for t in report["targets"]}
    for figure, target in references.items():
        if figure.startswith(("batched", "per-replica cost", "all_gather", "broadcast")):
            assert target["reference_system"], figure
            # null only where noise left the reference not measured; never zero.
            assert target["reference"] is None or target["reference"] > 0, figure
        if figure.startswith(("all_reduce 8 B", "RSS")):
            assert target["reference"] is None, figure
            assert not target["reference_system"], figure
    assert "\nreference: the same figure for a minimal implementation" in table
    assert "\nall_reduce 8 B x 8 vs futures rendezvous" in table
    # With the [mpi] extra (the [test] extra has it), the run includes raw mpi4py.
    if importlib.util.find_spec("mpi4py") is not None:
        assert report["mpi"]["processes"] == 2
        assert {row["size"] for row in report["mpi"]["rows"]} == {8, 1 << 20}
        assert "raw MPI" in table


def test_bad_arguments_are_usage_errors() -> None:
    with pytest.raises(SystemExit) as info:
        main(["--repeat", "0"])
    assert info.value.code == 2


# -- the parts, without timing anything ------------------------------------------------

NAN = math.nan


def _rows(*, small: float = 10.0, futures_64mib: float = NAN, scale: float = 1.0) -> list[Row]:
    """A run's rows as the cases write them (8 and 64 MiB all_reduce, batch, scale)."""
    floor = "numpy floor (1 thread)"
    return [
        Row("all_reduce", 8, 8, "asyncio", "asyncreplica", small, "futures", 5.0),
        Row("all_reduce", 8, 8, "asyncio", "futures", 5.0, floor, 1.0),
        Row("all_reduce", 8, 8, "-", floor, 1.0, floor, 1.0),
        Row("all_reduce", 8, 64 << 20, "asyncio", "asyncreplica", 1100.0, floor, 1000.0),
        Row("all_reduce", 8, 64 << 20, "asyncio", "futures", futures_64mib, floor, 1000.0),
        Row("all_reduce", 8, 64 << 20, "-", floor, 1000.0, floor, 1000.0),
        Row("run start-up", 8, 8, "asyncio", "asyncreplica", 500.0, "one round", 10.0),
        Row("batched 1000 x 1 KiB", 4, 1024000, "asyncio", "asyncreplica", 400.0, "one", 100.0),
        Row(
            "batched 1000 x 1 KiB", 4, 1024000, "-", "numpy, per leaf (floor)", 200.0, "one", 100.0
        ),
        Row("1000 separate 1 KiB", 4, 1024000, "asyncio", "asyncreplica", 6000.0, "batched", 400.0),
        Row("scale (per replica)", 8, 8, "asyncio", "asyncreplica", 2.0, "futures", 1.0),
        Row("scale (per replica)", 4096, 8, "asyncio", "asyncreplica", 2.0 * scale, "futures", 1.1),
    ]


def test_a_difference_within_the_noise_is_not_measured() -> None:
    assert math.isnan(_difference(1.0, 1.5))
    assert math.isnan(_difference(1.0, 1.0))
    assert _difference(2.0, 1.5) == 0.5
    # The median of the measured samples, only when more than half were measured.
    assert _median_us([NAN, 2e-6, 4e-6], 1) == pytest.approx(3.0)
    assert math.isnan(_median_us([NAN, NAN, 4e-6], 1))
    assert math.isnan(_median_us([NAN, 4e-6], 1))


def test_the_chart_draws_a_missing_measurement_as_a_gap() -> None:
    data = chart(_rows(), _targets(_rows()))
    lines = {s.label: s for s in data.times}
    assert data.times_title.startswith("all_reduce, 8 replicas")
    assert lines["futures"].x == [8, 64 << 20]
    assert lines["futures"].y == [5.0, None]  # not 1e-9 / rounds: nothing drawn
    assert lines["asyncreplica (asyncio)"].y == [10.0, 1100.0]
    assert lines["numpy floor (1 thread)"].y == [1.0, 1000.0]


def test_the_chart_keeps_one_direction_per_panel_and_marks_each_target() -> None:
    data = chart(_rows(), _targets(_rows()))
    lower = {b.label: b for b in data.lower}
    higher = {b.label: b for b in data.higher}
    assert set(higher) == {"1000 separate all_reduces vs batched"}
    assert higher["1000 separate all_reduces vs batched"].limit == 10.0
    assert higher["1000 separate all_reduces vs batched"].value == 15.0
    assert not set(lower) & set(higher)
    small = lower["all_reduce 8 B x 8 vs futures rendezvous"]
    assert (small.value, small.limit, small.met) == (2.0, 2.5, True)
    batched = lower["batched 1000 x 1 KiB x 4 vs one 1000 KiB"]
    assert (batched.value, batched.limit, batched.reference) == (4.0, 5.0, 2.0)
    assert lower["all_reduce 64 MiB x 8 vs best numpy floor"].limit == 1.15
    # A one-off cost is no ratio to a target: it is not drawn.
    assert not any("start-up" in label for label in lower)


def test_the_chart_draws_no_bar_for_a_target_not_measured() -> None:
    rows = _rows(small=NAN)
    data = chart(rows, _targets(rows))
    small = next(b for b in data.lower if b.label.startswith("all_reduce 8 B x 8 vs"))
    assert small.value is None
    assert small.met is False
    assert not any(s.label == "asyncreplica (asyncio)" and s.y[0] is not None for s in data.times)


@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None, reason="no matplotlib")
def test_the_renderer_draws_the_chart_data(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "chart.png"
    _plot(_rows(), _targets(_rows()), str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "matplotlib.pyplot" not in sys.modules  # no global plotting state


def test_the_targets_are_issue_17s_table() -> None:
    targets = {t.figure: t for t in _targets(_rows(scale=1.25))}
    expected = {
        "all_reduce 8 B x 8 vs futures rendezvous": ("<= 2.5x", "1.5x"),
        "batched 1000 x 1 KiB x 4 vs one 1000 KiB": ("<= 5x", "3x"),
        "per-replica cost, 4096 vs 8 replicas": ("<= 1.2x", "1x"),
        "all_reduce 64 MiB x 8 vs best numpy floor": ("<= 1.15x", "1.05x"),
    }
    for figure, (target, goal) in expected.items():
        assert (targets[figure].target, targets[figure].goal) == (target, goal), figure
    assert targets["all_reduce 8 B x 8 vs futures rendezvous"].met
    assert not targets["per-replica cost, 4096 vs 8 replicas"].met  # 1.25x
    assert targets["per-replica cost, 4096 vs 8 replicas"].reference == pytest.approx(1.1)
    assert targets["batched 1000 x 1 KiB x 4 vs one 1000 KiB"].reference == 2.0


def _typed(name: str, us: float, numpy_us: float = 400.0) -> Row:
    return Row("all_reduce array type", 8, 1 << 20, "asyncio", name, us, "numpy inputs", numpy_us)


def test_the_array_type_targets_read_each_library_against_numpy_inputs() -> None:
    rows = [_typed("numpy", 400.0), _typed("jax", 430.0), _typed("array_api_strict", 480.0)]
    targets = {t.figure: t for t in _targets(_rows() + rows)}
    jax = targets["all_reduce 1 MiB x 8, jax / numpy inputs"]
    strict = targets["all_reduce 1 MiB x 8, array_api_strict / numpy inputs"]
    assert (jax.value, jax.target, jax.met) == (pytest.approx(1.075), "<= 1.1x", True)
    assert (strict.value, strict.target, strict.met) == (pytest.approx(1.2), "<= 1.1x", False)
    # Within the noise: not measured, so missed.
    noisy = {t.figure: t for t in _targets([_typed("jax", NAN)])}
    assert not noisy["all_reduce 1 MiB x 8, jax / numpy inputs"].met


def test_a_library_not_installed_is_a_dash_and_no_target(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = Row("all_reduce array type", 8, 1 << 20, "asyncio", "jax", NAN, "not installed", NAN)
    rows = [*_rows(), _typed("numpy", 400.0), missing, _typed("array_api_strict", 420.0)]
    figures = [t.figure for t in _targets(rows)]
    assert "all_reduce 1 MiB x 8, array_api_strict / numpy inputs" in figures
    assert not any("jax" in f for f in figures)
    _canned(monkeypatch, rows)
    assert main(["--quick", "--quiet", "--check"]) == 0  # nothing to miss
    line = next(x for x in capsys.readouterr().out.splitlines() if "not installed" in x)
    assert line.split()[:6] == ["all_reduce", "array", "type", "8", "1", "MiB"]
    assert "jax" in line
    assert " -us " in line
    assert line.rstrip().endswith("-x")


def test_the_mpi_targets_read_the_mpi_report() -> None:
    report = {
        "processes": 2,
        "replicas": 4,
        "rows": [
            {"size": 8, "ours_s": 100e-6, "raw_s": 20e-6, "local_s": 1e-6},
            {"size": 1024, "ours_s": 100e-6, "raw_s": 20e-6, "local_s": 1e-6},
            {"size": 1 << 20, "ours_s": 1.2e-3, "raw_s": 0.8e-3, "local_s": 0.2e-3},
            {"size": 16 << 20, "ours_s": 20e-3, "raw_s": 10e-3, "local_s": 4e-3},
        ],
    }
    targets = {t.figure: t for t in _mpi_targets(report, rendezvous_us=30.0)}
    faults = {f"MPI fault latency, {kind} (2 processes)" for kind in FAULT_KINDS}
    assert set(targets) == {
        "MPI all_reduce 8 B x 4 vs raw Allreduce + local rendezvous",
        "MPI all_reduce 1 MiB x 4 vs local sum + raw Allreduce",
        "MPI all_reduce 16 MiB x 4 vs local sum + raw Allreduce",
        *faults,
    }
    # A report without fault latencies misses every one of their targets.
    assert not any(targets[f].met or math.isfinite(targets[f].value) for f in faults)
    small = targets["MPI all_reduce 8 B x 4 vs raw Allreduce + local rendezvous"]
    assert small.value == pytest.approx(50.0)  # 100 - (20 + 30) us
    assert (small.unit, small.target, small.goal, small.met) == ("us", "<= +15 us", "+5 us", False)
    one = targets["MPI all_reduce 1 MiB x 4 vs local sum + raw Allreduce"]
    assert (one.value, one.target, one.met) == (pytest.approx(1.2), "<= 1.3x", True)
    assert not targets["MPI all_reduce 16 MiB x 4 vs local sum + raw Allreduce"].met  # 1.43x


def test_the_mpi_fault_latency_targets_read_the_faults_rows() -> None:
    latencies = {"skip": 0.004, "swap": 0.2, "mismatch": 0.21, "raise": None, "exit": 0.05}
    report = {
        "processes": 3,
        "replicas": 4,
        "rows": [],
        "faults": [
            {"kind": kind, "processes": 3, "latency_s": latency, "samples_s": [latency]}
            for kind, latency in latencies.items()
        ],  # no "transfer" row: not measured
    }
    targets = {t.figure: t for t in _mpi_targets(report, rendezvous_us=30.0)}
    got = {
        figure.removeprefix("MPI fault latency, ").removesuffix(" (3 processes)"): (
            None if not math.isfinite(t.value) else t.value,
            t.met,
        )
        for figure, t in targets.items()
    }
    assert got == {
        "skip": (0.004, True),
        "swap": (0.2, True),  # the bound is inclusive
        "mismatch": (0.21, False),
        "raise": (None, False),  # some process never raised the kind's error
        "exit": (0.05, True),
        "transfer": (None, False),
    }
    skip = targets["MPI fault latency, skip (3 processes)"]
    assert (skip.unit, skip.target, skip.goal) == ("s", "<= 0.2 s", "")
    assert "0.00 s" in _targets_table([skip])


def _canned(monkeypatch: pytest.MonkeyPatch, rows: list[Row]) -> None:
    """``main`` measures nothing: every case returns its part of ``rows``."""
    monkeypatch.setattr(bench_main, "_measure_all_reduce", lambda plan, progress: rows)
    for name in (
        "_measure_scale",
        "_measure_moves",
        "_measure_array_types",
        "_measure_batched",
        "_measure_tracing",
    ):
        monkeypatch.setattr(bench_main, name, lambda plan, progress: [])
    monkeypatch.setattr(bench_main, "_measure_memory", lambda plan, progress: [])
    monkeypatch.setattr(bench_main, "_measure_mpi", lambda quick, progress: None)


def test_check_exits_1_when_a_target_is_missed(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _canned(monkeypatch, _rows(scale=1.25))
    assert main(["--quick", "--quiet"]) == 0  # without --check: reported only
    assert main(["--quick", "--quiet", "--check"]) == 1
    err = capsys.readouterr().err
    assert "missed: per-replica cost, 4096 vs 8 replicas: <= 1.2x" in err


def test_check_exits_1_when_a_target_was_not_measured(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _canned(monkeypatch, _rows(small=NAN))
    assert main(["--quick", "--quiet", "--check"]) == 1
    out, err = capsys.readouterr()
    assert "missed: all_reduce 8 B x 8 vs futures rendezvous" in err
    line = next(x for x in out.splitlines() if x.startswith("all_reduce 8 B x 8 vs futures"))
    assert "not measured" in line


def test_check_exits_0_when_every_target_is_met(
    monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path
) -> None:
    _canned(monkeypatch, _rows())
    out = tmp_path / "bench.json"
    assert main(["--quick", "--quiet", "--check", "--json", str(out)]) == 0
    # A missing measurement is null in the (strict) JSON, not NaN and not a tiny time.
    rows = json.loads(out.read_text())["rows"]
    futures = [r for r in rows if r["system"] == "futures" and r["nbytes"] == 64 << 20]
    assert futures[0]["median_us"] is None


def test_the_scale_target_holds_on_each_loop() -> None:
    # Issue 17: per-replica cost flat "on asyncio, uvloop and trio": one figure per loop.
    scale = [
        Row("scale (per replica)", n, 8, loop, "asyncreplica", us, "futures", 1.0)
        for loop, (at8, at4096) in {
            "asyncio": (2.0, 2.2),
            "uvloop": (2.0, 2.6),
            "trio": (4.0, 4.4),
        }.items()
        for n, us in ((8, at8), (4096, at4096))
    ]
    targets = {t.figure: t for t in _targets(scale)}
    assert targets["per-replica cost, 4096 vs 8 replicas"].value == pytest.approx(1.1)
    assert targets["per-replica cost, 4096 vs 8 replicas"].met
    assert targets["per-replica cost, 4096 vs 8 replicas, uvloop"].value == pytest.approx(1.3)
    assert not targets["per-replica cost, 4096 vs 8 replicas, uvloop"].met
    assert targets["per-replica cost, 4096 vs 8 replicas, trio"].met


def test_each_loops_scale_target_is_read_against_the_bare_rendezvous_on_that_loop() -> None:
    # The reference is the minimal rendezvous's own growth on the same loop: futures on
    # asyncio and uvloop, trio's own parking on trio; not asyncio's futures for every loop.
    bare = {"asyncio": (1.0, 1.3), "uvloop": (0.5, 0.6), "trio": (2.0, 5.0)}
    scale = [
        Row(
            "scale (per replica)",
            n,
            8,
            loop,
            "asyncreplica",
            3.0,
            f"{SCALE_REFERENCE[loop]}, per replica",
            us,
        )
        for loop, costs in bare.items()
        for n, us in zip((8, 4096), costs, strict=True)
    ]
    targets = {t.figure: t for t in _targets(scale)}
    expected = {
        "per-replica cost, 4096 vs 8 replicas": (1.3, "futures"),
        "per-replica cost, 4096 vs 8 replicas, uvloop": (1.2, "futures"),
        "per-replica cost, 4096 vs 8 replicas, trio": (2.5, "trio rendezvous"),
    }
    for figure, (reference, system) in expected.items():
        assert targets[figure].reference == pytest.approx(reference), figure
        assert targets[figure].reference_system == system, figure
    line = next(x for x in _targets_table(list(targets.values())).splitlines() if "trio" in x)
    assert line.endswith("2.50 x trio rendezvous")


@pytest.mark.parametrize("loop", ["asyncio", "uvloop", "trio"])
def test_the_bare_rendezvous_runs_on_each_loop(loop: str) -> None:
    pytest.importorskip(loop)
    inputs = [np.full(2, float(i + 1), np.float32) for i in range(5)]
    assert _rendezvous(loop, inputs, 3) > 0
    with pytest.raises(ValueError, match="unknown loop"):
        _rendezvous("tornado", inputs, 1)


def test_the_scale_rows_carry_each_loops_own_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    # _measure_scale times the bare rendezvous on every loop it times ours on, and each
    # loop's row carries that loop's reference as its baseline.
    calls: list[tuple[str, str, int]] = []

    def bare(loop: str, inputs: list[object], rounds: int) -> float:
        calls.append(("bare", loop, rounds))
        return {"asyncio": 1.0, "trio": 3.0}[loop] * rounds

    def ours(loop: str, strategy: object, step: object, value: object) -> float:
        calls.append(("ours", loop, 0))
        return 10.0 * len(calls)

    monkeypatch.setattr(bench_cases, "_rendezvous", bare)
    monkeypatch.setattr(bench_cases, "_run_ours", ours)
    plan = Plan([8], [8], [8], ["asyncio", "trio"], 1, 1 << 20, scale_budget=64)
    rows = bench_cases._measure_scale(plan, lambda _: None)
    assert {("bare", loop, r) for loop in ("asyncio", "trio") for r in (8, 16)} <= set(calls)
    by_loop = {r.loop: r for r in rows}
    assert by_loop["asyncio"].baseline == "futures, per replica"
    assert by_loop["trio"].baseline == "trio rendezvous, per replica"
    # 8 more rounds of 8 replicas: 8 s (asyncio) and 24 s (trio) -> 1/8 and 3/8 s per replica.
    assert by_loop["asyncio"].baseline_us == pytest.approx(1e6 / 8)
    assert by_loop["trio"].baseline_us == pytest.approx(3e6 / 8)


@pytest.mark.parametrize("quick", [True, False])
def test_both_modes_measure_the_scale_target_at_its_replica_counts(
    monkeypatch: pytest.MonkeyPatch, quick: bool
) -> None:
    # The target is "4096 vs 8": a quick run measures those counts too (in fewer
    # rounds), on every loop installed, so its figure is the target's, not a stand-in.
    plans: list[Plan] = []
    _canned(monkeypatch, _rows())

    def scale(plan: Plan, progress: object) -> list[Row]:
        plans.append(plan)
        return []

    monkeypatch.setattr(bench_main, "_measure_scale", scale)
    assert main(["--quiet", *(["--quick"] if quick else [])]) == 0
    (plan,) = plans
    assert min(plan.many_replicas) == 8
    assert max(plan.many_replicas) == 4096
    assert plan.loops == bench_main._loops()
    assert plan.scale_budget // 4096 >= 4
