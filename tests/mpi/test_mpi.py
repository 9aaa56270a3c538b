"""MultiWorkerMirroredStrategy across real processes: ``mpiexec -n 2`` and ``-n 3``.

Each test launches one of the programs in ``programs/`` under mpiexec (the MPICH
wheel's, installed by the ``[test]`` extra) with a hang guard, and reads one log per
rank. Bad programs must raise on *every* process, with the error naming processes,
replicas and call sites.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from asyncreplica._launch import find_mpiexec

pytest.importorskip("mpi4py", reason="the [mpi] extra (mpi4py, mpich) is not installed")

PROGRAMS = Path(__file__).parent / "programs"
HANG_GUARD_S = 90


def line(marker: str) -> int:
    """The line of ``scenarios.py`` that ends with ``# marker: <marker>``."""
    lines = (PROGRAMS / "scenarios.py").read_text(encoding="utf-8").splitlines()
    return next(i for i, text in enumerate(lines, 1) if text.endswith(f"# marker: {marker}"))


def _mpiexec() -> str:
    found = find_mpiexec()
    if found is None:
        pytest.skip("mpiexec not found (pip install 'asyncreplica[mpi]' brings MPICH's)")
    return found


def launch(
    n: int, program: str, *args: str, tmp_path: Path, env: dict[str, str] | None = None
) -> tuple[int, dict[int, str], str]:
    """Run ``program`` on ``n`` processes; return the exit status and each rank's log.

    ``env`` adds variables to the processes' environment (test_mpi_errors uses it).
    """
    environ = {**os.environ, "ASYNCREPLICA_TEST_OUT": str(tmp_path), "PYTHONUNBUFFERED": "1"}
    environ.pop("ASYNCREPLICA_TRACE", None)
    environ.update(env or {})
    proc = subprocess.run(
        [_mpiexec(), "-n", str(n), sys.executable, str(PROGRAMS / program), *args],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
        env=environ,
        check=False,
    )
    logs = {}
    for rank in range(n):
        log = tmp_path / f"rank{rank}.log"
        logs[rank] = log.read_text(encoding="utf-8") if log.exists() else ""
    return proc.returncode, logs, proc.stdout + proc.stderr


def _every_rank_finishes(n: int, program: str, tmp_path: Path) -> None:
    """Launch ``program`` on ``n`` processes; it must exit 0 with every rank done."""
    rc, _, output = launch(n, program, tmp_path=tmp_path)
    assert rc == 0, output
    for rank in range(n):
        assert f"rank={rank} done" in output, output


@pytest.mark.parametrize("n", [2, 3])
def test_every_collective_matches_numpy(n: int, tmp_path: Path) -> None:
    _every_rank_finishes(n, "collectives.py", tmp_path)


def test_collectives_on_trio(tmp_path: Path) -> None:
    rc, _, output = launch(2, "collectives.py", "trio", tmp_path=tmp_path)
    assert rc == 0, output
    assert "rank=1 done" in output


def test_loop_stays_responsive_while_waiting_for_another_process(tmp_path: Path) -> None:
    # Process 1 joins the collective only after process 0's other coroutine has run
    # 100 times, which it can only do while process 0's replicas wait.
    rc, logs, output = launch(2, "scenarios.py", "responsive", tmp_path=tmp_path)
    assert rc == 0, output
    assert "ticks 100" in logs[0]
    assert "got 100" in logs[1]
    assert "result 3.0" in logs[0]
    assert "result 3.0" in logs[1]


# scenario -> (error on every process, words the message must contain)
SCENARIOS = {
    "skip": (
        "ReplicaExitedError",
        [
            (
                "Replicas of process 1 stopped issuing collectives while other processes "
                "wait at their 2nd collective (position 1)"
            ),
            "process 0 (replicas 0, 1) called all_reduce(SUM) on float64[3] at ",
            f"scenarios.py:{line('skip')} in skip",
            "process 1 (replica 2) finished their step function",
        ],
    ),
    "extra": (
        "ReplicaExitedError",
        [
            "Replicas of process 0 stopped issuing collectives",
            "process 1 (replica 2) called all_reduce(SUM) on float64[3]",
            f"scenarios.py:{line('extra')} in extra",
        ],
    ),
    "shape": (
        "CollectiveMismatchError",
        [
            # The same field names as inside one process (asyncreplica._core._match).
            "Processes disagree about their 1st collective (position 0): shape differs.",
            "process 0 (replicas 0, 1) called all_reduce(SUM) on float64[3]",
            "process 1 (replica 2) called all_reduce(SUM) on float64[4]",
        ],
    ),
    "op": ("CollectiveMismatchError", [": reduce op differs.", "all_reduce(MAX)"]),
    "array_type": (
        "CollectiveMismatchError",
        [
            "Processes disagree about their 1st collective (position 0): array type differs.",
            "on array_api_strict.Array(float64[3])",
        ],
    ),
    "callsite": (
        "CollectiveMismatchError",
        [
            "call site differs",
            f"scenarios.py:{line('callsite-0')} in callsite",
            f"scenarios.py:{line('callsite-1')} in callsite",
        ],
    ),
}


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_bad_program_raises_on_every_process(scenario: str, tmp_path: Path) -> None:
    error, words = SCENARIOS[scenario]
    rc, logs, output = launch(2, "scenarios.py", scenario, tmp_path=tmp_path)
    assert rc != 0, output
    for rank in (0, 1):
        assert logs[rank].startswith(f"raised {error}\n"), (rank, logs[rank], output)
        for word in words:
            assert word in logs[rank], (rank, word, logs[rank])
        assert "asyncreplica explain AR" in logs[rank]


def test_exception_in_one_process_raises_on_the_others(tmp_path: Path) -> None:
    rc, logs, output = launch(2, "scenarios.py", "raise", tmp_path=tmp_path)
    assert rc != 0, output
    assert logs[1].startswith("raised ValueError\nbad batch on process 1"), logs[1]
    assert logs[0].startswith("raised ReplicaExitedError\n"), logs[0]
    assert "Process 1 failed" in logs[0]
    assert "process 1 (replica 2) failed: ValueError: bad batch on process 1" in logs[0]


def test_uncaught_exception_outside_a_run_reaches_the_others(tmp_path: Path) -> None:
    # Process 1 dies before its run; its exit hook tells process 0, which would
    # otherwise wait for ever at its first collective.
    rc, logs, output = launch(2, "scenarios.py", "raise_outside", tmp_path=tmp_path)
    assert rc != 0, output
    assert logs[1].startswith("raised ValueError"), logs[1]
    assert logs[0].startswith("raised ReplicaExitedError\n"), logs[0]
    assert "Process 1 failed" in logs[0]
    assert "exited after an uncaught ValueError: process 1 crashed before its run" in logs[0]


def _demo(*args: str) -> subprocess.CompletedProcess[str]:
    _mpiexec()  # skips when there is none
    return subprocess.run(
        [sys.executable, "-m", "asyncreplica", "demo", "--mpi", *args],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
        check=False,
    )


def test_demo_mpi_matches_one_process() -> None:
    # 3 replicas on 2 processes (2 + 1): the same weights as the single-replica run.
    proc = _demo("--replicas", "3", "--processes", "2", "--epochs", "1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "3 replicas on 2 MPI processes (MultiWorkerMirroredStrategy)" in out
    assert "replicas: all 3 hold bitwise identical weights" in out
    assert "single-replica reference: weights match" in out
    assert out.count("epoch 1/1") == 1  # only rank 0 prints


def test_demo_mpi_bug_is_caught_on_every_process() -> None:
    proc = _demo("--replicas", "2", "--processes", "2", "--epochs", "1", "--bug", "skip")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stderr.count("CollectiveMismatchError: Processes disagree") == 1
    assert "process 1 (replica 1) called all_reduce(SUM) on float64[]" in proc.stderr


def test_trace_is_merged_by_rank_0_with_global_replica_ids(tmp_path: Path) -> None:
    from asyncreplica._tracing import load_trace, summarize

    path = tmp_path / "merged.json.gz"
    rc, logs, output = launch(2, "trace.py", str(path), tmp_path=tmp_path)
    assert rc == 0, output
    assert logs[0] == logs[1] == "traced\n"
    trace = load_trace(path)
    events = trace["traceEvents"]
    assert {e["pid"] for e in events} == {0, 1}
    names = {e["args"]["name"] for e in events if e.get("name") == "process_name"}
    assert names == {"MPI rank 0", "MPI rank 1"}
    threads = {(e["pid"], e["args"]["name"]) for e in events if e.get("name") == "thread_name"}
    assert {(0, "replica 0"), (1, "replica 1"), (1, "replica 2")} <= threads
    slices = [e for e in events if e.get("cat") == "collective"]
    assert sorted({e["args"]["replica"] for e in slices}) == [0, 1, 2]
    assert len(slices) == 9  # 3 replicas x 3 collectives
    assert all(e["ts"] >= 0 for e in events if "ts" in e)
    assert trace["otherData"]["mpi_world_size"] == 2
    assert "3 replicas, 3 collectives in 1 run" in summarize(path)


def test_a_merged_trace_never_has_negative_timestamps(tmp_path: Path) -> None:
    # Process 1's events precede rank 0's origin by about 1 s once aligned: the merged
    # trace moves as a whole so that its earliest event is at 0 (offsets kept).
    rc, logs, output = launch(2, "trace_shift.py", tmp_path=tmp_path)
    assert rc == 0, output
    assert logs[0] == "ok\ndone\n", output
    assert logs[1] == "done\n", output


def test_a_busy_process_times_out_and_the_job_aborts(tmp_path: Path) -> None:
    # Process 1 never reaches the collective; process 0 gives up after timeout_seconds,
    # and, the processes being out of step, its exit hook aborts the whole job.
    rc, logs, output = launch(2, "scenarios.py", "timeout", tmp_path=tmp_path)
    assert rc != 0, output
    assert logs[0].startswith("raised CollectiveTimeoutError\n"), logs[0]
    # The roll call one process gives (global ids), then what it means across processes.
    assert "Timed out after 0.5 s waiting for replica 2 at the 1st collective" in logs[0]
    assert "  * replica 2 did not arrive: process 1 is busy" in logs[0]
    assert "(This is process 0 of 2.)" in logs[0]
    # Process 1 blocks for ever in recv: the launch only ended because process 0's
    # exit hook aborted the job (its stderr line may be cut off by the abort itself).
    assert logs[1] == ""


@pytest.mark.parametrize("named", [False, True], ids=["one", "two-named-in-a-task-group"])
def test_a_timeout_is_told_to_the_processes_still_waiting(named: bool, tmp_path: Path) -> None:
    # Process 0 times out first; process 1 (arrived later) and process 2 (busy) raise
    # process 0's error (its class, fields and roll call, as one process raises its
    # run's one error) instead of being ended by its exit hook first. With two named
    # collectives in a replica's task group, the second fails because the first timed
    # out: still the one error on each process, never a group of both.
    args = ("named",) if named else ()
    rc, logs, output = launch(3, "timeout_peers.py", *args, tmp_path=tmp_path)
    assert rc != 0, output
    assert logs[0].startswith("raised CollectiveTimeoutError\n"), output
    # Named: 'a' or 'b', whichever timed out first.
    where = "the collective named '" if named else "the 1st collective"
    assert f"Timed out after 0.5 s waiting for replica 2 at {where}" in logs[0], output
    for rank in (1, 2):
        # The same message, but for the line that says which process timed out.
        told = f"(Process 0 timed out and told this process, process {rank} of 3.)"
        assert logs[rank] == logs[0].replace("(This is process 0 of 3.)", told), output
        # One pointer to the explanation, at the end.
        assert logs[rank].count("asyncreplica explain") == 1, logs[rank]
        assert "See docs/errors.md" not in logs[rank]


def test_bench_mpi_quick_measures_ours_raw_and_checks(tmp_path: Path) -> None:
    _mpiexec()  # skips when there is none
    out = tmp_path / "mpi.json"
    proc = subprocess.run(
        [sys.executable, "-m", "asyncreplica", "bench", "--mpi", "--quick", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=3 * HANG_GUARD_S,  # the table, then one mpiexec job per kind of fault
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "across 2 MPI processes x 4 replicas" in proc.stdout
    assert proc.stdout.count("all_reduce(SUM) float32 across") == 1  # only rank 0 prints
    header = proc.stdout.splitlines()[1]
    assert "ours/raw" in header
    assert "floor/raw" in header
    data = json.loads(out.read_text())
    assert (data["processes"], data["replicas"]) == (2, 4)
    assert [row["size"] for row in data["rows"]] == [8, 1 << 20]
    for row in data["rows"]:
        assert row["ours_s"] > 0
        assert row["raw_s"] > 0
        assert row["checks_s"] > 0
        assert row["ratio"] == pytest.approx(row["ours_s"] / row["raw_s"])
        assert row["local_s"] > 0
        assert row["floor_ratio"] == pytest.approx((row["local_s"] + row["raw_s"]) / row["raw_s"])
    # Then every kind of fault's latency: a number for each (every other process
    # raised the kind's error), printed in its own table.
    assert [row["kind"] for row in data["faults"]] == list(FAULTS)
    for row in data["faults"]:
        assert row["processes"] == 2
        assert row["latency_s"] is not None, row
        assert row["samples_s"] == [row["latency_s"]]
        print(f"bench: fault latency, {row['kind']}: {row['latency_s'] * 1e3:.1f} ms")
    assert "fault latency across 2 MPI processes" in proc.stdout
    for kind in FAULTS:
        assert f"\n{kind:>10}  " in proc.stdout, proc.stdout


def test_gpu_devices_are_refused_before_any_mpi_call() -> None:
    import asyncreplica as ar

    with pytest.raises(ValueError, match=r"GPU devices \(GPU:0\) are not supported across"):
        ar.MultiWorkerMirroredStrategy(["GPU:0"])


def test_a_refused_constructor_in_one_process_starts_no_mpi() -> None:
    # A refusal of this process's own arguments is told to the other processes, which
    # wait in their constructors for it (test_mpi_fifth_attack.py): only where an MPI
    # launcher started the process or MPI is in use. One process (this suite's, a
    # script run plainly) never starts MPI for a refusal: that aborted the whole suite's
    # process once. A child process, so that nothing else in it imports mpi4py.
    from asyncreplica._launch import LAUNCHER_VARIABLES

    code = (
        "import sys\n"
        "import asyncreplica as ar\n"
        "for devices in ([], ['CPU:0', 'CPU:0'], ['GPU:0'], 'CPU:0', ['not a device']):\n"
        "    try:\n"
        "        ar.MultiWorkerMirroredStrategy(devices)\n"
        "    except (TypeError, ValueError) as exc:\n"
        "        print(type(exc).__name__)\n"
        "try:\n"
        "    ar.MultiWorkerMirroredStrategy(stall_warning_seconds=-1)\n"
        "except ValueError:\n"
        "    print('ValueError')\n"
        "print('mpi4py.MPI' in sys.modules)\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARIABLES}
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.split() == [
        "ValueError",
        "ValueError",
        "ValueError",
        "TypeError",
        "ValueError",
        "ValueError",
        "False",
    ], proc.stdout + proc.stderr


def test_a_local_mismatch_names_local_ids_and_fails_the_other_processes(tmp_path: Path) -> None:
    rc, logs, output = launch(2, "scenarios.py", "local", tmp_path=tmp_path)
    assert rc != 0, output
    assert logs[0].startswith("raised CollectiveMismatchError\nReplicas disagree"), logs[0]
    assert "(found on process 0 of 2, which runs replicas 0, 1)" in logs[0]
    # The same class and attributes (global ids) on every process.
    # A peer's copy keeps the finder's first line (one process's message), then says why
    # its own run cannot complete.
    assert logs[1].startswith("raised CollectiveMismatchError\nReplicas disagree"), logs[1]
    assert "\nProcess 0 failed, so this run cannot complete on any process." in logs[1]
    assert "failed: CollectiveMismatchError: Replicas disagree" in logs[1]


@pytest.mark.parametrize(
    ("kind", "backend"),
    [
        ("small", "asyncio"),
        ("barrier", "asyncio"),
        ("large", "asyncio"),
        ("gather", "asyncio"),
        ("small", "trio"),
        ("large", "trio"),
    ],
)
def test_a_run_cancelled_while_waiting_finishes_its_exchange(
    kind: str, backend: str, tmp_path: Path
) -> None:
    # Process 0 cancels its run while its first collective waits for process 1. Once
    # posted, the collective must complete (its waits are shielded, whether it moves
    # data after the agreement or not): process 0 finishes it, then process 1 sees
    # process 0 fail, and both processes are still in step for another run.
    rc, logs, output = launch(2, "cancel.py", kind, backend, tmp_path=tmp_path)
    assert rc == 0, output
    want = {"small": "6-6/2", "large": "6-6/131072", "gather": "0-2/3", "barrier": "none"}[kind]
    assert "cancelled True" in logs[0], logs[0]
    assert f"first ['{want}']" in logs[0], logs[0]  # the replica that dispatched it
    assert logs[1].startswith("raised ReplicaExitedError\nProcess 0 failed"), logs[1]
    assert f"first ['{want}']" in logs[1], logs[1]
    assert "again [3.0, 3.0]" in logs[0], logs[0]
    assert "again [3.0]" in logs[1], logs[1]


@pytest.mark.parametrize("n", [2, 3])
def test_small_all_reduces_travel_with_their_agreement_intact(n: int, tmp_path: Path) -> None:
    # Every exchange reuses one buffer: results must not alias it, leaves of mixed
    # dtypes at odd offsets must come back intact, and a scalar's MEAN is an array.
    _every_rank_finishes(n, "inline.py", tmp_path)


@pytest.mark.parametrize("n", [2, 3])
def test_large_results_have_mpis_bits_stay_read_only_and_move_without_threads(
    n: int, tmp_path: Path
) -> None:
    # Large values are reduced by MPI, in place in the local result's buffer where it
    # can be: the bits of MPI's own Allreduce of the local sums, results read-only for
    # good (no view made writable again) and never overwritten by later collectives,
    # and no thread started to move the data.
    _every_rank_finishes(n, "large.py", tmp_path)


def test_large_results_on_trio(tmp_path: Path) -> None:
    rc, _, output = launch(2, "large.py", "trio", tmp_path=tmp_path)
    assert rc == 0, output
    assert "rank=1 done" in output


@pytest.mark.parametrize("n", [2, 3])
def test_values_equal_one_process_whatever_byte_order_or_rank(n: int, tmp_path: Path) -> None:
    # Big-endian inputs (a different byte order on each process) and 0-d values give
    # the values and shapes a one-process MirroredStrategy gives, on every path:
    # inline, gathered, MPI Allreduce, all_gather and broadcast from every source.
    _every_rank_finishes(n, "values.py", tmp_path)


@pytest.mark.parametrize("n", [2, 3])
def test_integer_mean_equals_one_process_bits(n: int, tmp_path: Path) -> None:
    # MEAN of integers whose sum overflows their dtype (int8, big-endian int32, int64 and
    # uint64 near their limits): all_reduce on every path, reduce_scatter and
    # strategy.reduce give exactly the one-process MirroredStrategy's float64 bits.
    _every_rank_finishes(n, "int_mean.py", tmp_path)


@pytest.mark.parametrize("n", [2, 3])
def test_foreign_arrays_come_back_in_their_own_type(n: int, tmp_path: Path) -> None:
    # JAX and array_api_strict inputs (array_api_strict ones on several of its devices)
    # under MultiWorkerMirroredStrategy: every collective gives each replica its own
    # input's array type and device, with the one-process MirroredStrategy's bits.
    pytest.importorskip("jax", reason="jax missing (pip install 'jax[cpu]')")
    pytest.importorskip("array_api_strict", reason="array_api_strict missing")
    _every_rank_finishes(n, "foreign.py", tmp_path)


@pytest.mark.parametrize("n", [2, 3])
def test_the_run_after_a_failed_one_starts_in_step(n: int, tmp_path: Path) -> None:
    # A run fails across processes (a process raises, finishes early, or mismatches)
    # while process 0 has a second named collective queued behind the failing exchange:
    # that one makes no exchange of its own, so the strategy's next runs are correct.
    _every_rank_finishes(n, "rerun.py", tmp_path)


@pytest.mark.parametrize("n", [2, 3])
def test_the_job_exits_when_some_processes_dropped_their_strategies(n: int, tmp_path: Path) -> None:
    # Process 0 keeps three strategies, the others drop theirs: the goodbye at exit is
    # an exchange on every group, so every process must still say it on each (the
    # hang guard of launch() fails the test otherwise).
    _every_rank_finishes(n, "dropped.py", tmp_path)


@pytest.mark.parametrize("n", [2, 3])
def test_named_collectives_from_helper_tasks_on_every_process(n: int, tmp_path: Path) -> None:
    # A replica's helper tasks (task group, asyncio.gather) were watched under its
    # global id, so on process 1 and later the wait-cycle check never saw them and
    # reported a cycle for a correct named pair.
    _every_rank_finishes(n, "named_tasks.py", tmp_path)


@pytest.mark.parametrize("n", [2, 3])
def test_processes_out_of_step_say_so_on_every_process(n: int, tmp_path: Path) -> None:
    # The last process is one exchange ahead (simulated): every process raises the same
    # BackendError naming each one's exchange count, never a false mismatch, and the
    # exit hook ends the job.
    rc, logs, output = launch(n, "out_of_step.py", tmp_path=tmp_path)
    assert rc != 0, output
    counts = ", ".join(f"process {r}: {2 if r < n - 1 else 3}" for r in range(n))
    for rank in range(n):
        assert logs[rank].startswith("raised BackendError\n"), logs[rank]
        assert "The processes of this MultiWorkerMirroredStrategy are out of step" in logs[rank]
        assert f"different numbers of exchanges before this one ({counts})" in logs[rank]


def test_a_second_concurrent_run_is_refused_at_once(tmp_path: Path) -> None:
    # asyncio.gather(s.run(a), s.run(b)) on one MultiWorkerMirroredStrategy: the
    # second run is refused before it issues anything, on every process; the first
    # completes, and the processes stay in step.
    rc, logs, output = launch(2, "scenarios.py", "concurrent", tmp_path=tmp_path)
    assert rc != 0, output
    for rank in (0, 1):
        assert logs[rank].startswith("first (3.0"), (rank, logs[rank], output)
        assert "raised ReplicaContextError\n" in logs[rank], logs[rank]
        assert "Another MultiWorkerMirroredStrategy.run of this strategy is still in" in logs[rank]
        assert f"progress on process {rank}" in logs[rank]


def _attributes(log: str) -> dict[str, object]:
    """The ``attributes {...}`` line a scenario logs for its error."""
    import ast

    text = next(t for t in log.splitlines() if t.startswith("attributes "))
    value = ast.literal_eval(text[len("attributes ") :])
    assert isinstance(value, dict)
    return value


def test_errors_inside_one_process_use_global_replica_ids(tmp_path: Path) -> None:
    # 2 processes x 2 replicas; global replica 3 (process 1's second) skips the 2nd
    # collective. Process 1's own ledger finds it: its message and attributes must say
    # replica 3 and replica 2 (global), never 1 and 0; process 0 sees process 1 fail
    # with that message, at position 1 where its own replicas 0 and 1 wait.
    rc, logs, output = launch(2, "scenarios.py", "local_skip", tmp_path=tmp_path)
    assert rc != 0, output
    assert logs[1].startswith(
        "raised ReplicaExitedError\nReplica 3 finished after 1 collective, but replica 2 is "
        "waiting at its 2nd collective (position 1)."
    ), logs[1]
    assert "  * replica 3 returned after all_reduce(SUM)" in logs[1]
    assert "(found on process 1 of 2, which runs replicas 2, 3)" in logs[1]
    # The same attributes (global ids) on every process: every replica waits but 3.
    assert _attributes(logs[1]) == {
        "replica_id": 3,
        "position": 1,
        "waiting": [0, 1, 2],
        "report": [2, 3],
    }
    assert logs[0].startswith("raised ReplicaExitedError\nProcess 1 failed"), logs[0]
    assert (
        "process 1 (replicas 2, 3) failed: ReplicaExitedError: Replica 3 finished after 1 "
        "collective, but replica 2 is waiting"
    ) in logs[0]
    assert _attributes(logs[0]) == {
        "replica_id": 3,
        "position": 1,
        "waiting": [0, 1, 2],
        "report": [0, 1],
    }


def test_a_local_mismatch_on_process_1_names_global_replicas(tmp_path: Path) -> None:
    rc, logs, output = launch(2, "scenarios.py", "local_mismatch", tmp_path=tmp_path)
    assert rc != 0, output
    assert logs[1].startswith("raised CollectiveMismatchError\nReplicas disagree"), logs[1]
    assert "  * replica 2 called all_reduce(SUM) on float64[3]" in logs[1]
    assert "  * replica 3 called all_reduce(SUM) on float64[4]" in logs[1]
    # The same class and attributes (global ids) on every process.
    assert _attributes(logs[1]) == {"position": 0, "signatures": [0, 1, 2, 3], "report": [2, 3]}
    assert logs[0].startswith("raised CollectiveMismatchError\nReplicas disagree"), logs[0]
    assert "\nProcess 1 failed, so this run cannot complete on any process." in logs[0]
    assert _attributes(logs[0]) == {"position": 0, "signatures": [0, 1, 2, 3], "report": [0, 1]}


@pytest.mark.parametrize(
    ("scenario", "want"),
    [
        # the message says "at their 2nd collective (position 1)": so must .position
        ("skip", {"replica_id": 2, "position": 1, "waiting": [0, 1]}),
        ("extra", {"replica_id": 0, "position": 1, "waiting": [2]}),
        ("shape", {"position": 0, "signatures": [0, 1, 2]}),
    ],
)
def test_cross_process_error_attributes_agree_with_the_message(
    scenario: str, want: dict[str, object], tmp_path: Path
) -> None:
    rc, logs, output = launch(2, "scenarios.py", scenario, tmp_path=tmp_path)
    assert rc != 0, output
    # Process 0 runs replicas 0 and 1, process 1 replica 2: each error's report has a row
    # for each of the process's own replicas, under its global id.
    for rank, own in ((0, [0, 1]), (1, [2])):
        assert _attributes(logs[rank]) == {**want, "report": own}, (rank, logs[rank])


def test_a_late_process_is_named_in_a_stall_warning(tmp_path: Path) -> None:
    # stall_warning_seconds=0.3; process 1 joins the first collective only once process
    # 0 has logged its stall warning (its logging handler releases process 1): the
    # warning names the late process and its replicas, then the collective resumes.
    rc, logs, output = launch(2, "scenarios.py", "late", tmp_path=tmp_path)
    assert rc == 0, output
    assert (
        "warning: Collective stalled across processes: process 0 (replicas 0, 1) has waited"
    ) in logs[0], logs[0]
    assert "at the 1st collective (position 0): all_reduce(SUM) on float64[] at " in logs[0]
    assert "for process 1 (replica 2)." in logs[0]
    assert "  * process 1 (replica 2) did not arrive: " in logs[0]
    assert "warning: Collective resumed: the processes completed the 1st collective" in logs[0]
    # Under load process 1 may also warn that process 0 is slow to create its strategy
    # (stall_warning_seconds=0.3 applies to the creation too); nothing else comes first.
    rest = logs[1]
    if rest.startswith("warning: MultiWorkerMirroredStrategy creation stalled"):
        rest = rest.split("to fail instead.\n", 1)[1]
    assert rest.startswith("released by the stall warning\n"), logs[1]
    assert "finished" in logs[0]
    assert "finished" in logs[1]


def test_creating_the_strategy_is_bounded_and_names_the_missing_process(tmp_path: Path) -> None:
    # Process 1 never creates its strategy; process 0 (timeout_seconds=1) warns, then
    # raises naming process 1, instead of waiting inside MPI_Comm_dup for ever.
    _, logs, output = launch(2, "scenarios.py", "construct", tmp_path=tmp_path)
    log = logs[0]
    assert "warning: MultiWorkerMirroredStrategy creation stalled: process 0 has " in log, output
    assert "for process 1 to create theirs" in log
    assert "raised CollectiveTimeoutError\nTimed out after 1 s creating " in log
    assert "process 1 did not create theirs (this is process 0 of 2; arrived: process 0)" in log
    assert logs[1] == "released by process 0's error\n", logs[1]


@pytest.mark.parametrize("scenario", ["transfer", "transfer_thread", "transfer_timeout"])
def test_a_failure_inside_one_data_transfer_reaches_every_process(
    scenario: str, tmp_path: Path
) -> None:
    # Process 1 raises inside its data transfer, after the processes agreed (polled
    # from the loop; in a worker thread; with timeout_seconds=30): process 0, which
    # waits for its data, raises at once naming process 1's own error (not a timeout).
    rc, logs, output = launch(2, "scenarios.py", scenario, tmp_path=tmp_path)
    assert rc != 0, output
    assert logs[1].startswith("raised TypeError\nsimulated: mpi4py refused the buffer"), logs[1]
    assert logs[0].startswith("raised ReplicaExitedError\nProcess 1 failed while moving"), logs[0]
    size = 300_000 if scenario == "transfer_thread" else 100_000
    assert (
        f"the data of the 1st collective (position 0): all_reduce(SUM) on float64[{size}] "
        f"at {PROGRAMS / 'scenarios.py'}:{line('transfer')} in step"
    ) in logs[0]
    assert (
        "  * process 1 (replica 2) failed: TypeError: simulated: mpi4py refused the buffer"
    ) in logs[0]
    assert _attributes(logs[0]) == {
        "replica_id": 2,
        "position": 0,
        "waiting": [0, 1],
        "report": [0, 1],
    }


FAULTS = {
    "skip": "ReplicaExitedError",
    "swap": "CollectiveMismatchError",
    "mismatch": "CollectiveMismatchError",
    "raise": "ReplicaExitedError",
    "exit": "ReplicaExitedError",
    "transfer": "ReplicaExitedError",
}
# The first line of the error every other process raises ({f}: the faulty rank).
FAULT_LINES = {
    "skip": (
        "Replicas of process {f} stopped issuing collectives while other processes wait "
        "at their 2nd collective (position 1)."
    ),
    "swap": "Processes disagree about their 2nd collective (position 1): call site differs.",
    "mismatch": (
        "Processes disagree about their 2nd collective (position 1): shape, call site differ."
    ),
    "raise": "Process {f} failed, so this run cannot complete on any process.",
    "exit": (
        "Replicas of process {f} stopped issuing collectives while other processes wait "
        "at their 1st collective (position 0)."
    ),
    "transfer": (
        "Process {f} failed while moving the data of the 2nd collective (position 1): "
        "all_reduce(SUM) on float64[100000]"
    ),
}


def _fault_reaches_every_process(kind: str, n: int, tmp_path: Path, *args: str) -> None:
    """Launch latency.py: every rank but the faulty one raises the precise error."""
    _, logs, output = launch(n, "latency.py", kind, *args, tmp_path=tmp_path)
    faults = [int(t.split()[1]) for t in logs[n - 1].splitlines() if t.startswith("fault ")]
    assert faults, (logs[n - 1], output)
    for rank in range(n - 1):
        lines = logs[rank].splitlines()
        at = next((i for i, t in enumerate(lines) if t.startswith("error ")), None)
        assert at is not None, (rank, logs[rank], output)
        _, when, name = lines[at].split()
        assert name == FAULTS[kind], (rank, logs[rank])
        assert lines[at + 1].startswith(FAULT_LINES[kind].format(f=n - 1)), (rank, logs[rank])
        print(
            f"{kind} on {n} processes{' (' + ' '.join(args) + ')' if args else ''}: "
            f"rank {rank} raised after {(int(when) - faults[0]) / 1e6:.1f} ms"
        )


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("kind", sorted(FAULTS))
def test_every_kind_of_fault_reaches_every_process(kind: str, n: int, tmp_path: Path) -> None:
    # The last rank makes the fault; every other rank must raise (none waits for
    # ever: the hang guard). The latency is printed (pytest -s), never asserted:
    # `asyncreplica bench --mpi --check` holds it to its target.
    _fault_reaches_every_process(kind, n, tmp_path)


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("kind", sorted(FAULTS))
def test_no_fault_waits_for_a_timer_to_reach_the_other_processes(
    kind: str, n: int, tmp_path: Path
) -> None:
    # Every timer of a cross-process wait (the sleeps between tests, reading the
    # peers' notes, announcing a wait, stall warnings, the failed process's grace
    # for acknowledgements) is set far beyond the hang guard, and waits park at once:
    # each fault still raises its precise error on every other process, so its
    # delivery never depends on a timer firing (docs/scale-out.md, "What is caught").
    _fault_reaches_every_process(kind, n, tmp_path, "far")
