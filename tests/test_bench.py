"""`asyncreplica bench --quick` runs end to end (a smoke test: ratios are reported, not asserted)."""

from __future__ import annotations

import importlib.util
import json
import pathlib

import pytest

from asyncreplica._bench import main


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
    assert ("tracing on", "asyncreplica + trace") in systems
    # The minimal implementations each target is also read against, measured in the run.
    assert ("batched 1000 x 1 KiB", "numpy, per leaf (floor)") in systems
    for kind in ("all_gather", "broadcast", "reduce_scatter"):
        assert (kind, "futures") in systems
    assert all(r["median_us"] > 0 and r["baseline_us"] > 0 for r in rows)
    figures = [t["figure"] for t in report["targets"]]
    assert any(f.startswith("all_reduce 8 B x 8 vs futures") for f in figures)
    assert any(f.startswith("RSS growth") for f in figures)
    assert any(f.startswith("RSS added by") for f in figures)
    assert all(isinstance(t["met"], bool) for t in report["targets"])
    references = {t["figure"]: t["reference"] for t in report["targets"]}
    for figure, reference in references.items():
        if figure.startswith(("batched", "per-replica cost", "all_gather", "broadcast")):
            assert reference is not None, figure
            assert reference > 0, figure
        if figure.startswith(("all_reduce 8 B", "RSS")):
            assert reference is None, figure
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
