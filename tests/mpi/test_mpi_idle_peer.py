"""A process whose replicas are at no collective learns of a peer's failure (idle_peer.py).

Its event loop is idle (its one replica awaits an event never set), so no wait of the
process group reads the peers' notes: the run's own watch does (``watch_peers``).
Before it, such a process raised nothing: a peer's timeout left it waiting until the
job was aborted (10 s later, calling it "busy"), and a peer's error or exit left every
process waiting for ever. Each case runs under ``mpiexec -n 2`` and ``-n 3`` and is
compared with the same replicas in one process (``MirroredStrategy``), class and fields
(global ids).

Every launch has test_mpi_lifecycle's hang guard (the programs dump their stacks and
exit; the launcher's whole process group is killed past it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from test_mpi_lifecycle import launch

PROGRAM = Path(__file__).parent / "programs" / "idle_peer.py"
# Each loop and each process count once, not every pair: an mpiexec launch costs seconds,
# and the suite's time is a newcomer's (README: about 14 minutes on 2 cores).
LAYOUTS = [(2, "trio"), (3, "asyncio")]


def _one_process(scenario: str, loop: str, processes: int, tmp_path: Path) -> str:
    """The log of the same replicas in one process (MirroredStrategy)."""
    pytest.importorskip("mpi4py")
    out = tmp_path / "one"
    out.mkdir()
    subprocess.run(
        [sys.executable, str(PROGRAM), scenario, loop, "one", str(processes)],
        env={**os.environ, "ASYNCREPLICA_TEST_OUT": str(out)},
        check=True,
        timeout=60,
        capture_output=True,
    )
    return (out / "rank0.log").read_text(encoding="utf-8")


def _error(log: str, output: str) -> dict[str, Any]:
    """The run's error a process logged (its first line: class, fields, first line)."""
    assert log.startswith("{"), output
    found: dict[str, Any] = json.loads(log.splitlines()[0])
    return found


@pytest.mark.parametrize(("processes", "loop"), LAYOUTS)
def test_an_idle_process_raises_a_peers_timeout_as_one_process_does(
    processes: int, loop: str, tmp_path: Path
) -> None:
    # One process: CollectiveTimeoutError (position 0, 0.5 s, the idle replica missing).
    one = _error(_one_process("timeout", loop, processes, tmp_path), "")
    assert one["class"] == "CollectiveTimeoutError", one
    rc, logs, output = launch(
        "timeout", loop, tmp_path=tmp_path, program=PROGRAM, processes=processes
    )
    assert rc != 0, output  # out of step after a timeout: the job is aborted at exit
    for rank in range(processes):
        # Every process, the idle one included, with the same class and fields.
        assert _error(logs[rank], output) == one, (rank, output)
        assert logs[rank].endswith("end\n"), output  # its program went on
    assert "did not acknowledge" not in output, output  # each exited: no 10 s wait


@pytest.mark.parametrize(("processes", "loop"), LAYOUTS)
def test_an_idle_process_ends_its_run_with_a_peers_error_in_step(
    processes: int, loop: str, tmp_path: Path
) -> None:
    # One process raises replica 0's ValueError and cancels the others; the strategy
    # runs again. Here replica 0's process raises it; every other one raises the same
    # ReplicaExitedError, the idle one included (it made the exchange the failed
    # process waited at: no timeout is set, so before, every process waited for ever);
    # and the next run gives every process one process's value.
    one = _one_process("error", loop, processes, tmp_path)
    rc, logs, output = launch(
        "error", loop, tmp_path=tmp_path, program=PROGRAM, processes=processes
    )
    assert rc == 0, output
    assert (
        _error(logs[0], output)
        == _error(one, "")
        == {
            "class": "ValueError",
            "first line": "replica 0 fails",
        }
    )
    others = [_error(logs[rank], output) for rank in range(1, processes)]
    assert others[0]["class"] == "ReplicaExitedError", output
    assert others[0]["replica_id"] == 0, output  # process 0's first replica
    assert others[0]["first line"] == (
        "Process 0 failed, so this run cannot complete on any process."
    ), output
    assert all(o == others[0] for o in others), output  # the same on every process
    for rank in range(processes):
        assert logs[rank].splitlines()[1:] == one.splitlines()[1:] == ["again [6.0]", "end"], output


@pytest.mark.parametrize("processes", [2, 3])
def test_an_idle_process_ends_its_run_when_a_peer_exits(processes: int, tmp_path: Path) -> None:
    # Process 0 dies of an uncaught error before its run: its goodbye waits at the
    # exchange the others make next; the idle one makes it at once (before, it waited
    # for ever, and so did process 0's goodbye).
    _rc, logs, output = launch(
        "exit", "asyncio", tmp_path=tmp_path, program=PROGRAM, processes=processes
    )
    assert "ValueError: process 0 dies before its run" in output, output
    others = [_error(logs[rank], output) for rank in range(1, processes)]
    assert others[0]["class"] == "ReplicaExitedError", output
    assert others[0]["replica_id"] == 0, output
    assert all(o == others[0] for o in others), output
    for rank in range(1, processes):
        assert logs[rank].endswith("end\n"), output


def test_a_peer_that_read_the_failure_is_not_called_busy(tmp_path: Path) -> None:
    # Process 0 times out; process 1's run raises it, and its program goes on (idle)
    # past process 0's wait for its acknowledgement at exit (1 s here): process 0 says
    # that it read the failure, not that it is busy or blocked, before the abort.
    rc, logs, output = launch("told", "asyncio", tmp_path=tmp_path, program=PROGRAM)
    assert rc != 0, output
    assert _error(logs[1], output)["class"] == "CollectiveTimeoutError", output
    assert "goes on" in logs[1], output
    said = (
        "asyncreplica: process 0: process 1 (replica 2) did not acknowledge this process's "
        "failure within 1 s: it read it (its run raised it, or its next use of the "
        "strategy will), and goes on without exiting: it is stopped with the MPI job now."
    )
    assert said in output, output
    assert "busy" not in output, output


@pytest.mark.parametrize(("processes", "loop"), LAYOUTS)
def test_an_idle_replica_beside_one_at_the_collective_times_out_as_one_process(
    processes: int, loop: str, tmp_path: Path
) -> None:
    # The idle replica shares its process with a replica at the all_reduce (2 + 1, idle
    # replica 1; 1 + 1 + 2, idle replica 3): that process posts no exchange. Before,
    # whichever timer fired first decided: that process's own timeout made the peers
    # raise a ReplicaExitedError naming a replica that waited (replica_id 0), or the
    # peer's exchange timeout listed every replica of that process as missing and called
    # it busy. One process's CollectiveTimeoutError, fields and all, on every process.
    one = _error(_one_process("timeout shared", loop, processes, tmp_path), "")
    assert one["class"] == "CollectiveTimeoutError", one
    assert one["missing"] == [1 if processes == 2 else 3], one
    rc, logs, output = launch(
        "timeout shared", loop, tmp_path=tmp_path, program=PROGRAM, processes=processes
    )
    # The exit status is the race's: a peer's exchange timed out (out of step: the job is
    # aborted at exit), or the idle replica's process timed out first on its own replicas
    # and the others met it at its run's end (in step: the job goes on).
    del rc
    for rank in range(processes):
        assert _error(logs[rank], output) == one, (rank, output)
        assert logs[rank].endswith("end\n"), output
    assert "is busy outside collectives" not in output, output


@pytest.mark.parametrize(("processes", "loop"), LAYOUTS)
def test_a_stopped_process_names_its_replica_at_a_collective(
    processes: int, loop: str, tmp_path: Path
) -> None:
    # A replica of another process raises; the process whose replicas are one at the
    # all_reduce and one idle is stopped by the failed run's end. Its ReplicaExitedError
    # names the replica that waited (``waiting``) and where, not "no replica at a
    # collective" with waiting=[].
    one = _one_process("error shared", loop, processes, tmp_path)
    rc, logs, output = launch(
        "error shared", loop, tmp_path=tmp_path, program=PROGRAM, processes=processes
    )
    assert rc == 0, output
    fails = 2 if processes == 2 else 0
    failing = 1 if processes == 2 else 0  # its process
    assert _error(logs[failing], output) == _error(one, "")
    assert _error(one, "")["class"] == "ValueError"
    shared = 0 if processes == 2 else 2  # the process of the idle replica
    error = _error(logs[shared], output)
    assert error["class"] == "ReplicaExitedError", output
    assert error["replica_id"] == fails, output
    waiting_there = [0] if processes == 2 else [2]  # its replica at the all_reduce
    assert set(waiting_there) <= set(error["waiting"]), output
    assert "had no replica at a collective" not in output, output
    for rank in range(processes):
        assert logs[rank].splitlines()[1:] == one.splitlines()[1:], output
