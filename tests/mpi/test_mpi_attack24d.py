"""The 24d attack's findings, each under ``mpiexec -n 2`` (programs/attack24d.py).

Every launch has test_mpi_lifecycle's hang guard (the programs dump their stacks and
exit; the launcher's whole process group is killed past it).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_mpi_lifecycle import launch

PROGRAM = Path(__file__).parent / "programs" / "attack24d.py"


@pytest.mark.parametrize("how", ["op", "dest", "brt", "opts", "run"])
def test_a_call_one_process_refuses_alone_never_pairs_with_the_next(
    how: str, tmp_path: Path
) -> None:
    # Process 1 refused call 0 before its part of the agreement (a bad op, destinations,
    # options, a PerReplica sized for process 0); the program caught it. Its
    # call 1 then paired with process 0's call 0: SUM 103 where 3 (and then 111) was
    # due, on both processes. Each exchange now carries its call's number: every
    # process raises that they are out of step instead of a wrong value.
    _rc, logs, output = launch("skew", how, tmp_path=tmp_path, program=PROGRAM)
    # Call 0 cannot succeed on process 0 with process 1 refusing it.
    due = {0: None, 1: "[111.0]", 2: "[111.0]"}
    for rank in (0, 1):
        for line in logs[rank].splitlines():
            i, _, said = line.removeprefix("call ").partition(": ")
            if line.startswith("call ") and said.startswith("["):
                assert said == due[int(i)], output  # never another call's value
    assert logs[0].startswith("call 0: CollectiveMismatchError: The processes are out of step"), (
        output
    )
    assert "process 0 (replicas 0, 1) is at its 1st call" in logs[0], output
    assert "process 1 (replica 2) is at its 2nd call" in logs[0], output


def _one_process(scenario: str, tmp_path: Path) -> str:
    out = tmp_path / "one"
    out.mkdir()
    subprocess.run(
        [sys.executable, str(PROGRAM), scenario, "one"],
        env={**os.environ, "ASYNCREPLICA_TEST_OUT": str(out)},
        check=True,
        timeout=60,
        capture_output=True,
    )
    return (out / "rank0.log").read_text(encoding="utf-8")


def test_max_of_empty_replicas_names_every_one_as_one_process_does(tmp_path: Path) -> None:
    # Layout 2 + 3, one row: replicas 1-4 are empty. Every process named only the first
    # refusing process's ("replica 1"), where one process names "replicas 1, 2, 3, 4".
    pytest.importorskip("mpi4py")
    one = _one_process("empty_max", tmp_path)
    assert "replicas 1, 2, 3, 4 hold values" in one
    rc, logs, output = launch("empty_max", tmp_path=tmp_path, program=PROGRAM)
    assert rc == 0, output
    assert logs[0] == logs[1] == one, output


def test_a_timeout_names_the_missing_and_arrived_replicas(tmp_path: Path) -> None:
    # The cross-process CollectiveTimeoutError had missing = arrived = frozenset() and
    # no roll call; one process has missing={2}, arrived={0, 1}.
    pytest.importorskip("mpi4py")
    one = _one_process("timeout_fields", tmp_path)
    assert one.startswith("missing=[2] arrived=[0, 1]\n"), one
    _rc, logs, output = launch("timeout_fields", tmp_path=tmp_path, program=PROGRAM)
    assert logs[0].startswith("missing=[2] arrived=[0, 1]\n"), output
    assert (
        "Timed out after 0.5 s waiting for replica 2 at the 1st collective (position 0)."
        in (logs[0])
    ), output
    assert "  * replicas 0, 1 called all_reduce(SUM) on float64[]" in logs[0], output
    assert "  * replica 2 did not arrive: process 1 is busy" in logs[0], output
