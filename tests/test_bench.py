"""`asyncreplica bench --quick` runs end to end (a smoke test: ratios are reported, not asserted)."""

from __future__ import annotations

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
    rows = json.loads(out.read_text())
    systems = {(r["case"], r["system"]) for r in rows}
    assert ("all_reduce", "asyncreplica") in systems
    assert ("all_reduce", "futures") in systems
    assert ("all_gather", "asyncreplica") in systems
    assert all(r["median_us"] > 0 and r["baseline_us"] > 0 for r in rows)


def test_bad_arguments_are_usage_errors() -> None:
    with pytest.raises(SystemExit) as info:
        main(["--repeat", "0"])
    assert info.value.code == 2
