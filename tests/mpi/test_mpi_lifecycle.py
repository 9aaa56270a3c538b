"""A process group's lifecycle (asyncreplica_mpi._lifecycle), cell by cell.

The table itself is tested without MPI; each cell that needs processes is exercised by
a scenario of ``programs/lifecycle.py`` under ``mpiexec -n 2`` (one launch per scenario:
each ends a process, so no scenario can poison the next). Every launch has a hang
guard (the programs dump their stacks and exit; the launcher's whole process group is
killed past it), and every launch must leave no UCX warning behind.

Cells and the scenario that exercises each (state, event):

=========================  ============================  =================================
state                      event                         scenario
=========================  ============================  =================================
created                    arrival failed (peer crashed  crash_before
                           before its constructor)
created                    arrival refused (peer's       crash_inside, fifth_attack.py
                           constructor refused its own   refused_args
                           arguments)
created                    arrival failed (peer gave up  late
                           before this one arrived)
created                    arrived                       every scenario
joined / running           peer exited (exit, several    exit_two (exit, raise)
                           strategies)
created                    arrival failed (peer ended    exit_normal (create)
                           normally, creates no more)
running                    peer exited (ended normally)  exit_normal (collective)
closed                     exit, a peer never ends       goodbye_timeout
                           (timeout_seconds)
running                    interrupted (SIGINT) in a     interrupt
                           collective
running                    interrupted just after        interrupts.py start_then_interrupt
                           posting an exchange
running                    interrupted in a wait (no     interrupts.py in_wait
                           asyncio runner)
running                    interrupted twice (runner)    interrupts.py twice
joined                     interrupted (SIGINT, or a     interrupts.py in_trace_merge
                           SIGTERM handler's exit) in
                           the trace merge's wait
created                    interrupted in the            interrupts.py in_constructor
                           constructor's wait
running                    peer finalized MPI            finalize_run
joined                     finalize (then exit)          finalize_only
finalized                  begin run                     finalize_run (process 0)
created                    finalize (MPI finalized       finalize_mid (process 1's
                           before the constructor)       "create")
running                    begin run (concurrent)        refused
running                    out of step (data timeout)    data_stall
running                    out of step (a collective's   call_timeout
                           own timeout)
running                    out of step (failure after    inline_miss
                           agreement, light collective)
running                    wait on another strategy      opposite
joined / running           trace merge with an error     trace_raise
running                    trace merge (refused)         merge_in_run
failed                     begin run (refused)           exit_two
joined                     release (dropped everywhere)  leak
any                        ``os._exit`` (no hook runs)   os_exit
created                    arrived (a freed              scaleout.py freed_comm
                           communicator's handle reused)
joined                     release (user communicator    scaleout.py leak_dup
                           freed, dropped everywhere)
running                    interrupted (runner) in the   scaleout.py end_interrupt
                           run-end / reduce exchange
running                    interrupted (runner), peer    scaleout.py own_interrupt
                           exited
running                    out of step (a peer timed     idle_peer.py timeout, told
                           out; no replica here at a
                           collective: the run's watch)
running                    end run (a peer's run failed  idle_peer.py error
                           while no replica here was at
                           a collective: the run's
                           watch stops it, in step)
running                    peer exited (no replica here  idle_peer.py exit
                           at a collective: the run's
                           watch stops it)
=========================  ============================  =================================

Floating-point errors alike on every process (np.seterr per process, a raising errcall,
warnings as errors, concurrent strategies): scaleout.py fp_settings, shared_op.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from asyncreplica_mpi._lifecycle import (
    TABLE,
    Event,
    LifecycleBug,
    Refusal,
    State,
    advance,
)

from asyncreplica._launch import find_mpiexec

PROGRAM = Path(__file__).parent / "programs" / "lifecycle.py"
GUARD_S = 25  # each program dumps its stacks and exits past this
KILL_S = GUARD_S + 15  # then the whole launch is killed
UCX_WARNING = "was not returned to mpool"
MPICH_LEAK = "has pending 1 references"


# -- the table, without processes -------------------------------------------------------


def test_every_state_answers_the_events_that_can_reach_it() -> None:
    for state in State:
        for event in (Event.BEGIN_RUN, Event.FINALIZE, Event.EXIT):
            assert (state, event) in TABLE, (state, event)


@pytest.mark.parametrize(("cell", "after"), sorted(TABLE.items(), key=str))
def test_each_cell(cell: tuple[State, Event], after: State | Refusal) -> None:
    assert advance(*cell) is after


def test_refusals_leave_the_state_and_name_the_reason() -> None:
    assert advance(State.RUNNING, Event.BEGIN_RUN) is Refusal.CONCURRENT_RUN
    assert advance(State.FINALIZED, Event.BEGIN_RUN) is Refusal.FINALIZED
    assert advance(State.FAILED, Event.BEGIN_RUN) is Refusal.FAILED
    assert advance(State.CLOSED, Event.TRACE_MERGE) is Refusal.CLOSED
    assert advance(State.RUNNING, Event.TRACE_MERGE) is Refusal.MERGE_IN_RUN


def test_a_pair_outside_the_table_is_a_bug_of_asyncreplica() -> None:
    with pytest.raises(LifecycleBug, match=r"asyncreplica internal error.*report"):
        advance(State.CREATED, Event.END_RUN)


def test_the_table_module_is_pure() -> None:
    source = (PROGRAM.parents[3] / "backends/asyncreplica_mpi/_lifecycle.py").read_text()
    for name in ("mpi4py", "anyio", "asyncio", "numpy", "time"):
        assert f"import {name}" not in source


# -- the cells under mpiexec ---------------------------------------------------------------


def launch(
    scenario: str,
    *args: str,
    tmp_path: Path,
    program: Path = PROGRAM,
    processes: int = 2,
) -> tuple[int, dict[int, str], str]:
    """Run a scenario on 2 processes (or ``processes``); its exit status, each rank's log,
    and its output."""
    pytest.importorskip("mpi4py", reason="the [mpi] extra (mpi4py, mpich) is not installed")
    mpiexec = find_mpiexec()
    if mpiexec is None:
        pytest.skip("mpiexec not found")
    env = {
        **os.environ,
        "ASYNCREPLICA_TEST_OUT": str(tmp_path),
        "PYTHONUNBUFFERED": "1",
        "LIFECYCLE_GUARD_S": str(GUARD_S),
    }
    env.pop("ASYNCREPLICA_TRACE", None)
    proc = subprocess.Popen(
        [mpiexec, "-n", str(processes), sys.executable, str(program), scenario, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,  # the hang guard ends every process of the launch
    )
    try:
        output, _ = proc.communicate(timeout=KILL_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail(f"{scenario}: the launch hung past {KILL_S} s:\n{output}")
    logs = {}
    for rank in range(processes):
        log = tmp_path / f"rank{rank}.log"
        logs[rank] = log.read_text(encoding="utf-8") if log.exists() else ""
    assert UCX_WARNING not in output, output
    assert MPICH_LEAK not in output, output  # a request left holding a communicator
    assert "Stack (most recent call first)" not in output, f"a process hung:\n{output}"
    return proc.returncode, logs, output


@pytest.mark.parametrize("how", ["exit", "raise"])
def test_exit_with_two_strategies_releases_a_peer_in_the_first(how: str, tmp_path: Path) -> None:
    # Process 0 leaves (normally, or of an uncaught ValueError) while process 1 is in a
    # collective on the first-created strategy: its goodbye on every strategy is posted
    # at once, so process 1 is released there, whatever the order.
    rc, logs, output = launch("exit_two", how, tmp_path=tmp_path)
    assert "got ReplicaExitedError" in logs[1], output
    assert rc == (1 if how == "raise" else 0), output  # the dying process's status is kept
    if how == "raise":
        assert (
            "process 0 (replica 0) exited after an uncaught ValueError: process 0 dies" in logs[1]
        )
        assert "ValueError: process 0 dies outside run" in output  # its traceback
    else:
        assert "process 0 (replica 0) exited" in logs[1]
    assert "busy outside collectives" not in output
    # The failed group refuses the next run at once.
    assert (
        "again ReplicaExitedError: Process 0 of this MultiWorkerMirroredStrategy has exited"
        in (logs[1])
    )


@pytest.mark.parametrize("then", ["create", "collective"])
def test_a_peer_that_ends_normally_releases_a_process_that_goes_on(
    then: str, tmp_path: Path
) -> None:
    # Process 0 returns from main (no exception); process 1 then creates a second
    # strategy (process 0's exit notes end its arrival notes), or makes a collective on
    # the first (process 0's goodbye meets it). Neither waits for ever.
    rc, logs, output = launch("exit_normal", then, tmp_path=tmp_path)
    assert rc == 0, output
    assert "not reached" not in logs[1], output
    if then == "create":
        assert (
            "got ReplicaExitedError: Process 0 exited, without creating its "
            "MultiWorkerMirroredStrategy number 2 on this communicator"
        ) in logs[1], output
        # The strategy both created still releases a collective on it.
        assert "then ReplicaExitedError: " in logs[1], output
        assert "process 0 (replica 0) exited" in logs[1], output
    else:
        assert "got ReplicaExitedError: " in logs[1], output
        assert "process 0 (replica 0) exited" in logs[1], output


def test_three_processes_exit_cleanly_when_one_ends_while_the_others_create(
    tmp_path: Path,
) -> None:
    # Process 0 ends normally while processes 1 and 2 create a second strategy: each
    # raises at process 0's exit note, and its receive of the other's arrival note was
    # left posted on COMM_WORLD ("Builtin communicator ... has pending 1 references" at
    # finalize, and the job was often killed, rc 9). launch() refuses that line.
    rc, logs, output = launch("end_while_create", tmp_path=tmp_path, processes=3)
    assert rc == 0, output
    for rank in (1, 2):
        assert (
            "got ReplicaExitedError: Process 0 exited, without creating its "
            "MultiWorkerMirroredStrategy number 2 on this communicator"
        ) in logs[rank], output
        assert "then ReplicaExitedError: " in logs[rank], output


def test_an_exit_note_is_never_received_by_the_programs_own_recv(tmp_path: Path) -> None:
    # Process 0 ends normally; its exit notes (for a peer that would create another
    # strategy) were sent on COMM_WORLD, where process 2's comm.recv() (ANY_SOURCE,
    # ANY_TAG) received one instead of process 1's object (UnpicklingError). They travel
    # on the library's own duplicate now.
    rc, logs, output = launch("user_recv", tmp_path=tmp_path, processes=3)
    assert rc == 0, output
    assert "received {'hello': 1} from 1 tag 5" in logs[2], output


def test_a_peer_creating_a_strategy_is_named_in_the_stall_warning(tmp_path: Path) -> None:
    # Process 0 creates a second strategy while process 1 waits for it in a collective
    # of the first: process 1's stall warning said process 0 was "busy outside
    # collectives"; it is creating #2 (and waits there for process 1).
    _, logs, output = launch("ctor_vs_run", tmp_path=tmp_path)
    assert "got CollectiveTimeoutError" in logs[0], output
    assert "got ReplicaExitedError" in logs[1], output  # process 0's goodbye released it
    assert (
        "process 0 (replica 0) did not arrive: it is creating MultiWorkerMirroredStrategy #2 "
        "(it waits there for this process), while this process waits on "
        "MultiWorkerMirroredStrategy #1"
    ) in output, output
    assert "busy outside collectives" not in output, output
    # and process 0's own warning (creating #2) says where process 1 waits
    assert (
        " s for process 1 to create theirs (every process must "
        "create it, in the same order).\n  * process 1 waits at the 1st collective "
        "(position 0): all_reduce(SUM) on float64[3]"
    ) in output, output
    assert (
        "of MultiWorkerMirroredStrategy #1 (for this process), while this process creates "
        "a new strategy: each waits for the other"
    ) in output, output


def test_an_exit_with_a_run_in_a_daemon_thread_tells_the_peer(tmp_path: Path) -> None:
    # The interpreter exits while a daemon thread is inside a run: the exchange cannot be
    # finished, so the job is aborted, but the peer's run raises first, naming the exit
    # (it was killed by the abort without a word), and the abort message says what was cut.
    rc, logs, output = launch("daemon_run", tmp_path=tmp_path)
    assert rc != 0, output
    assert (
        "worker got ReplicaExitedError: Process 0 exited while a run of "
        "MultiWorkerMirroredStrategy #1 was in progress in another thread"
    ) in logs[1], output
    assert (
        "asyncreplica: process 0: the processes are out of step (a run of "
        "MultiWorkerMirroredStrategy #1 was in progress in another thread"
    ) in output, output


def test_the_goodbye_at_exit_honours_timeout_seconds(tmp_path: Path) -> None:
    # Process 0 ends; process 1 stays busy (it waits for a message nobody sends): process
    # 0's goodbye warns at 1 s, then aborts the job at the strategy's timeout (2 s).
    rc, logs, output = launch("goodbye_timeout", tmp_path=tmp_path)
    assert rc != 0, output
    assert "busy" in logs[1], output
    assert "not reached" not in logs[1], output
    assert "Exit stalled: process 0 is exiting and has waited 1.0 s" in output
    assert re.search(
        r"asyncreplica: process 0 is exiting and has waited 2\.\d s, past the "
        r"timeout_seconds \(2 s\) of MultiWorkerMirroredStrategy #1, for the other "
        r"processes to reach the end of MultiWorkerMirroredStrategy #1",
        output,
    ), output
    assert "aborting the MPI job" in output
    assert "raise timeout_seconds or leave it unset" in output


def test_a_process_interrupted_in_a_collective_is_named_as_interrupted(tmp_path: Path) -> None:
    # SIGINT cancels asyncio's main task: process 0's run ends with a CancelledError,
    # which the peers must read as the interruption it is.
    rc, logs, output = launch("interrupt", tmp_path=tmp_path)
    assert rc != 0, output
    assert "run ended" in logs[0], output
    assert "got ReplicaExitedError: Process 0 failed" in logs[1], output
    assert (
        "process 0 (replica 0) failed: KeyboardInterrupt: the process was interrupted "
        "(SIGINT, Ctrl-C)"
    ) in logs[1], output
    assert "CancelledError" not in logs[1]


def test_an_interruption_during_the_goodbye_still_tells_the_peer(tmp_path: Path) -> None:
    # Ctrl-C while the goodbye at exit waits for a busy peer: a KeyboardInterrupt there
    # abandoned the exchange half done and both processes hung. The first is said and
    # the goodbye goes on (the peer's next run raises, naming the exit); the job ends.
    rc, logs, output = launch("interrupt_goodbye", "once", tmp_path=tmp_path)
    assert rc == 0, output
    assert "process 0 was interrupted (SIGINT, Ctrl-C) while exiting" in output, output
    assert "got ReplicaExitedError" in logs[1], output
    assert "process 0 (replica 0) exited" in logs[1], output
    assert "KeyboardInterrupt" not in output, output


def test_a_second_interruption_during_the_goodbye_aborts_the_job_saying_so(
    tmp_path: Path,
) -> None:
    rc, logs, output = launch("interrupt_goodbye", "twice", tmp_path=tmp_path)
    assert rc != 0, output
    assert "busy" in logs[1], output
    assert "not reached" not in logs[1], output
    assert (
        "process 0 was interrupted again (SIGINT, Ctrl-C) while exiting, waiting for the "
        "other processes to reach the end of MultiWorkerMirroredStrategy #1; aborting"
    ) in output, output


def test_a_trace_block_that_ends_inside_a_run_is_refused_in_step(tmp_path: Path) -> None:
    rc, logs, output = launch("merge_in_run", str(tmp_path / "t.json"), tmp_path=tmp_path)
    assert rc == 0, output
    for rank in range(2):
        assert "got ReplicaContextError: strategy.trace(...) ended inside a run" in logs[rank]
        assert "after 2.0" in logs[rank], output


def test_strategies_in_opposite_orders_are_named_in_the_stall_warning(tmp_path: Path) -> None:
    _, logs, output = launch("opposite", tmp_path=tmp_path)
    assert "got CollectiveTimeoutError" in logs[0], output
    assert "got ReplicaExitedError" in logs[1], output  # process 0's goodbye released it
    assert "process 0 (replica 0) exited" in logs[1]
    for other, there in ((1, "#2"), (0, "#1")):
        assert (
            f"process {other} (replica {other}) did not arrive: it waits at the 1st "
            f"collective (position 0): all_reduce(SUM) on float64[3]"
        ) in output
        assert f"of MultiWorkerMirroredStrategy {there}, another strategy" in output
    assert "The processes use their strategies in different orders" in output
    assert "busy outside collectives" not in output


def test_trace_blocks_nested_in_opposite_orders_raise_the_deadlock_on_both(
    tmp_path: Path,
) -> None:
    # Each inner block's end blocks its process on a different strategy than the
    # peer's: a certain cycle. Without a timeout, both raise CollectiveDeadlockError
    # at once (not a stall warning and a wait for ever), with the same message, and
    # the job is then aborted at exit, saying why.
    rc, logs, output = launch("nested_opposite", str(tmp_path / "t"), tmp_path=tmp_path)
    assert rc != 0, output
    first_lines = set()
    for rank in range(2):
        assert "result 2.0 2.0" in logs[rank], output
        assert (
            "got CollectiveDeadlockError: Processes 0 and 1 wait for each other on two "
            in (logs[rank])
        ), output
        assert "left the inner block" not in logs[rank]
        message = logs[rank].split("got CollectiveDeadlockError: ")[1].split("\ncycle")[0]
        first_lines.add(message)
        assert (
            "  * process 0 waits at the end of strategy.trace(...) of "
            "MultiWorkerMirroredStrategy #2 (its exchange 2 on that strategy), which process 1 "
            "has not reached: process 1 waits on MultiWorkerMirroredStrategy #1"
        ) in message
        assert (
            "  * process 1 waits at the end of strategy.trace(...) of "
            "MultiWorkerMirroredStrategy #1 (its exchange 2 on that strategy), which process 0 "
            "has not reached: process 0 waits on MultiWorkerMirroredStrategy #2"
        ) in message
        assert "Restart it." in message
        assert (
            "cycle ((0, 'the end of strategy.trace(...) of MultiWorkerMirroredStrategy #2'), (1, "
            in (logs[rank])
        )
        assert (
            "got BackendError: The processes of this MultiWorkerMirroredStrategy are out of step"
            in (logs[rank])
        )
    assert len(first_lines) == 1, first_lines  # the same error on both processes
    assert "Collective stalled" not in output
    assert (
        "the processes are out of step (the processes waited for each other on two "
        "strategies: a deadlock); aborting the MPI job"
    ) in output


def test_a_peer_busy_past_the_acknowledgement_wait_is_named_before_the_abort(
    tmp_path: Path,
) -> None:
    # Process 1 is busy (never yields) longer than process 0's wait for its
    # acknowledgement at exit (0.5 s here, 10 s by default): the abort stops it before
    # it can print anything, so process 0 says so first. It never read the failure, so
    # it may be busy; one that read it is not called so (test_mpi_idle_peer.py).
    rc, logs, output = launch("busy_past_ack", tmp_path=tmp_path)
    assert rc != 0, output
    assert "got CollectiveTimeoutError" in logs[0], output
    assert "not reached" not in logs[1]
    said = (
        "asyncreplica: process 0: process 1 (replica 1) did not acknowledge this process's "
        "failure within 0.5 s: it did not read it (busy inside a run in a call that does not "
        "yield, such as a computation or a blocking call, or with no run of "
        "MultiWorkerMirroredStrategy #1 in progress, whose next use raises it): it is "
        "stopped with the MPI job now, before reporting the failure."
    )
    assert said in output, output
    assert output.index(said) < output.index("aborting the MPI job"), output


def test_a_peer_that_finalizes_mpi_is_seen_by_the_next_run(tmp_path: Path) -> None:
    rc, logs, output = launch("finalize_run", tmp_path=tmp_path)
    assert rc == 0, output
    assert "got ReplicaExitedError" in logs[1], output
    assert "process 0 (replica 0) finalized MPI (MPI.Finalize())" in logs[1]
    # On process 0, the finalized strategy refuses (the FINALIZED state).
    assert (
        "got BackendError: This MultiWorkerMirroredStrategy cannot be used any more: " in (logs[0])
    )
    assert "MPI was finalized on this process" in logs[0]


def test_a_correct_program_where_one_process_finalizes_exits(tmp_path: Path) -> None:
    rc, logs, output = launch("finalize_only", tmp_path=tmp_path)
    assert rc == 0, output
    for rank in range(2):
        assert "result 2.0 2.0" in logs[rank], output
        assert "done" in logs[rank], output


def test_an_exception_in_a_trace_block_reaches_a_peer_in_a_run(tmp_path: Path) -> None:
    trace = tmp_path / "trace.json"
    rc, logs, output = launch("trace_raise", str(trace), tmp_path=tmp_path)
    assert rc != 0
    assert "ValueError: process 0 fails inside its trace block" in output  # printed
    assert "got ReplicaExitedError: Process 0 failed" in logs[1], output
    assert "failed: ValueError: process 0 fails inside its trace block" in logs[1]
    # Rank 0 still writes its own timeline, and says why it is alone.
    doc = json.loads(trace.read_text())
    assert "not merged" in doc["otherData"]


def test_every_use_after_finalize_inside_a_run_raises_backend_error(tmp_path: Path) -> None:
    # MPICH aborts a process that calls MPI after MPI_Finalize: every entry checks first.
    rc, logs, output = launch("finalize_mid", tmp_path=tmp_path)
    assert rc == 0, output
    finalized = "BackendError: This MultiWorkerMirroredStrategy cannot be used any more: MPI "
    for use in ("run", "reduce", "gather", "reduce_to", "next run"):
        assert f"{use}: {finalized}was finalized on this process" in logs[1], output
    # A strategy never made is not "this MultiWorkerMirroredStrategy", and the rank (no
    # MPI call may ask it) is not "-1": it is read from the strategy made before.
    assert (
        "create: BackendError: MultiWorkerMirroredStrategy cannot be created: MPI was "
        "finalized in process 1 (MPI.Finalize() ran, and no MPI call may be made after it"
    ) in logs[1], output
    assert "process -1" not in output, output
    assert "run: ReplicaExitedError" in logs[0], output
    assert "process 1 (replica 1) finalized MPI (MPI.Finalize())" in output
    for use in ("reduce", "gather", "reduce_to", "next run"):
        assert f"{use}: ReplicaExitedError: Process 1 of this" in logs[0], output


def test_finalizing_mpi_before_creating_a_strategy_reaches_the_others(tmp_path: Path) -> None:
    # Process 0 waits (no timeout) in its constructor: the finalize hook's exit note ends
    # the wait, and process 1's MPI.Finalize() returns.
    rc, logs, output = launch("finalize_first", tmp_path=tmp_path)
    assert rc == 0, output
    assert "finalized" in logs[1], output
    assert (
        "got ReplicaExitedError: Process 1 finalized MPI (MPI.Finalize()) before creating its "
        "strategy, without creating its MultiWorkerMirroredStrategy number 1"
    ) in logs[0], output


def test_the_options_timeout_of_reduce_to_bounds_the_wait_for_other_processes(
    tmp_path: Path,
) -> None:
    _, logs, output = launch("reduce_to_timeout", tmp_path=tmp_path)
    for name in ("reduce_to", "batch_reduce_to", "refused"):
        line = next(x for x in logs[0].splitlines() if x.startswith(f"{name}:"))
        assert "CollectiveTimeoutError after" in line, output
        assert float(line.split("after ")[1]) < 5.0, line  # 1 s, not the strategy's 20 s
        # Process 1, late, raises process 0's timeout at once (as one process's error).
        told = next(x for x in logs[1].splitlines() if x.startswith(f"{name}:"))
        assert told.startswith(f"{name}: CollectiveTimeoutError after "), output
        assert float(told.split("after ")[1]) < 1.0, told


def test_rank_0_writes_its_own_trace_when_a_peer_fails_in_its_block(tmp_path: Path) -> None:
    trace = tmp_path / "trace.json"
    rc, logs, output = launch("trace_peer_raise", str(trace), tmp_path=tmp_path)
    assert rc == 0, output
    assert "got ValueError: process 1 fails inside its trace block" in logs[1], output
    assert "got ReplicaExitedError" in logs[0], output
    assert "rank 0 writes its own" in output  # process 1's warning, now true
    doc = json.loads(trace.read_text())
    assert "not merged" in doc["otherData"]


def test_a_crash_before_the_constructor_reaches_the_others(tmp_path: Path) -> None:
    rc, logs, output = launch("crash_before", tmp_path=tmp_path)
    assert rc != 0
    assert (
        "got ReplicaExitedError: Process 0 exited after an uncaught ValueError: process 0 "
        "dies before its strategy"
    ) in logs[1], output
    assert "without creating its MultiWorkerMirroredStrategy number 1" in logs[1]


def test_a_constructor_that_refuses_its_arguments_tells_the_others(tmp_path: Path) -> None:
    # Process 0's constructor refuses its devices, and the process dies of it: the
    # refusal is told as the creation's own note, so process 1 raises the same class
    # at once (it raised ReplicaExitedError when process 0's exit hook ran, and waited
    # for ever where process 0 caught the error: programs/fifth_attack.py).
    rc, logs, output = launch("crash_inside", tmp_path=tmp_path)
    assert rc != 0
    assert (
        "got ValueError: MultiWorkerMirroredStrategy was not created: process 0 refused its "
        "own arguments (this is process 1):"
    ) in logs[1], output
    assert "  * process 0: ValueError: unknown device 'not a device'" in logs[1], output


def test_a_process_that_arrives_after_a_peer_gave_up_raises(tmp_path: Path) -> None:
    rc, logs, output = launch("late", tmp_path=tmp_path)
    assert rc == 0, output
    assert "got CollectiveTimeoutError: Timed out after 0.5 s creating" in logs[0]
    assert "got BackendError: Process 0 gave up waiting" in logs[1], output


def test_a_stopped_peer_in_the_data_transfer_is_warned_about_and_timed_out(
    tmp_path: Path,
) -> None:
    _, logs, output = launch("data_stall", tmp_path=tmp_path)
    assert re.search(r"has waited \d+\.\d s at the data transfer of the 1st collective", output), (
        output
    )
    assert "process 1 (replica 1) agreed on it but has not sent its data" in output
    assert (
        "got CollectiveTimeoutError: The other processes did not all send their data " in (logs[0])
    )
    assert "within 2 s" in logs[0]
    # Process 1 raises process 0's timeout, as one process raises its run's one error.
    assert (
        "got CollectiveTimeoutError: The other processes did not all send their data " in (logs[1])
    ), output
    assert "(Process 0 timed out and told this process, process 1 of 2.)" in logs[1], output
    assert "Segmentation fault" not in output


def test_a_collectives_own_timeout_bounds_the_wait_for_a_late_process(tmp_path: Path) -> None:
    _, logs, output = launch("call_timeout", tmp_path=tmp_path)
    assert "got CollectiveTimeoutError: Timed out after 1 s waiting for replica 1" in logs[0], (
        output
    )
    waited = float(logs[0].split("waited ")[1].split()[0])
    assert waited < 5.0, logs[0]  # 1 s, not the strategy's 20 s
    assert "got CollectiveTimeoutError: Timed out after 1 s waiting for replica 1" in logs[1], (
        output
    )


def test_a_failure_after_agreement_just_past_the_inline_size_is_reported(
    tmp_path: Path,
) -> None:
    _, logs, output = launch("inline_miss", "int", tmp_path=tmp_path)
    assert "got RuntimeError: injected failure in the data transfer" in logs[1], output
    assert "got ReplicaExitedError: Process 1 failed while moving the data of the 1st" in (logs[0])
    assert "RuntimeError: injected failure in the data transfer" in logs[0]
    assert "timed out" not in logs[0]


def test_a_refused_concurrent_run_keeps_the_processes_in_step(tmp_path: Path) -> None:
    rc, logs, output = launch("refused", tmp_path=tmp_path)
    assert rc == 0, output
    assert "got ReplicaContextError: Another MultiWorkerMirroredStrategy.run" in logs[1]
    assert "got ReplicaExitedError: Process 1 failed" in logs[0], output
    assert "ReplicaContextError: it refused a concurrent run of this strategy" in logs[0]
    for rank in range(2):
        assert "after 2.0" in logs[rank], output  # the strategy is still usable
    assert "restart the job" not in output.lower()


def test_strategies_dropped_on_every_process_free_their_communicators(tmp_path: Path) -> None:
    rc, logs, output = launch("leak", "40", tmp_path=tmp_path)
    assert rc == 0, output
    for rank in range(2):
        held = int(logs[rank].split("held ")[1].split()[0])
        assert held <= 3, logs[rank]  # not 40: each dropped group was released


def test_os_exit_ends_the_job_without_a_hang(tmp_path: Path) -> None:
    # Nothing runs in a process that calls os._exit: the library cannot report it. MPICH's
    # launcher ends the others (docs/scale-out.md, Limits); what is held here is that
    # nobody waits for ever.
    _, logs, _ = launch("os_exit", tmp_path=tmp_path)
    assert "os._exit" in logs[0]
    assert "waits" in logs[1]
    assert "not reached" not in logs[1]


# -- Ctrl-C (SIGINT) on process 0: programs/interrupts.py ------------------------------------

INTERRUPTS = PROGRAM.parent / "interrupts.py"
_TOLD = (
    "process 0 (replica 0) failed: KeyboardInterrupt: the process was interrupted (SIGINT, Ctrl-C)"
)


def test_an_interruption_just_after_posting_an_exchange_is_told_not_a_raw_mpi_error(
    tmp_path: Path,
) -> None:
    # KeyboardInterrupt lands between the persistent exchange's Start() and its wait:
    # the run's end must not start the same request again ("Invalid MPI_Request"), and
    # process 1 is told before the job ends, instead of being killed without a word.
    rc, logs, output = launch("start_then_interrupt", tmp_path=tmp_path, program=INTERRUPTS)
    assert rc != 0, output
    assert "raised KeyboardInterrupt after 1 runs" in logs[0], output
    assert "Invalid MPI_Request" not in output
    assert "got ReplicaExitedError after 1 runs: Process 0 stopped waiting" in logs[1], output
    assert _TOLD in logs[1], output


def test_an_interruption_in_a_wait_outside_asyncio_run_is_told(tmp_path: Path) -> None:
    # loop.run_until_complete: SIGINT raises KeyboardInterrupt wherever the loop is
    # (select, with the exchange posted); process 1, still busy, then reaches its
    # collective and raises ReplicaExitedError naming it before the job is aborted.
    rc, logs, output = launch("in_wait", tmp_path=tmp_path, program=INTERRUPTS)
    assert rc != 0, output
    assert "raised KeyboardInterrupt" in logs[0], output
    assert "got ReplicaExitedError after 0 runs: Process 0 stopped waiting" in logs[1], output
    assert _TOLD in logs[1], output
    assert "process 1 (replica 1) waited for it" in logs[1], output


def test_a_deferred_interruption_is_said_at_once_and_a_second_one_is_told(tmp_path: Path) -> None:
    # Under asyncio.run the first Ctrl-C waits (shielded) for the busy peer: it is said
    # at once, naming the collective and the peer; the second stops the process, and
    # the peer is told before the job is aborted.
    rc, logs, output = launch("twice", tmp_path=tmp_path, program=INTERRUPTS)
    assert rc != 0, output
    assert "the pending interruption was not said" not in logs[0], output
    assert (
        "said: asyncreplica: process 0 (replica 0) was interrupted (SIGINT, Ctrl-C) while it "
        "waits at the 1st collective (position 0): all_reduce(SUM)"
    ) in logs[0], output
    assert "for process 1 (replica 1). The interruption takes effect once" in logs[0]
    assert "Press Ctrl-C again to stop now" in logs[0]
    assert "got ReplicaExitedError after 0 runs: Process 0 stopped waiting" in logs[1], output
    assert _TOLD in logs[1], output


def test_an_interruption_in_the_constructor_is_taken_at_once_and_told(tmp_path: Path) -> None:
    # Process 0 waits in the constructor for process 1, which creates its strategy only
    # once process 0 exits: the Ctrl-C (a cancellation of asyncio's main task, blocked
    # in the constructor) must raise there at once, and process 1 hears why.
    rc, logs, output = launch("in_constructor", tmp_path=tmp_path, program=INTERRUPTS)
    # Process 0 dies of its KeyboardInterrupt: the job's status says so. (Process 1
    # receives process 0's exit notes at its exit: unreceived, they stalled process 0's
    # MPI_Finalize until the launcher killed it, and mpiexec returned 0.)
    assert rc != 0, output
    assert "raised KeyboardInterrupt in the constructor" in logs[0], output
    assert "created" not in logs[0]
    assert (
        "got ReplicaExitedError: Process 0 was interrupted (KeyboardInterrupt: SIGINT, "
        "Ctrl-C) while it waited for the other processes to create "
        "MultiWorkerMirroredStrategy, before this process (process 1) created it"
    ) in logs[1], output


@pytest.mark.parametrize("sig", ["INT", "TERM"])
def test_an_interruption_at_the_trace_merge_is_told_to_a_busy_peer(
    sig: str, tmp_path: Path
) -> None:
    # KeyboardInterrupt (or a SIGTERM handler's SystemExit) while process 0 waits at the
    # end of strategy.trace(...) for process 1, busy inside its block: the merge's wait
    # only marked the processes out of step, and the exit hook aborted the job at once,
    # killing process 1 without a word. It is told now, as in a collective's exchange,
    # and the exit hook waits for its acknowledgement.
    rc, logs, output = launch("in_trace_merge", sig, tmp_path=tmp_path, program=INTERRUPTS)
    assert rc != 0, output
    raised = "KeyboardInterrupt" if sig == "INT" else "SystemExit"
    assert f"raised {raised} at the end of the trace block" in logs[0], output
    assert logs[1].startswith(
        "got ReplicaExitedError: Process 0 stopped waiting for the other processes at the "
        "end of strategy.trace(...)"
    ), output
    told = _TOLD if sig == "INT" else "process 0 (replica 0) failed: SystemExit: 143"
    assert told in logs[1], output
    assert "did not acknowledge" not in output, output


def test_a_wait_outside_a_run_is_named_in_plain_words() -> None:
    # The stall warning, the timeout message and the trace's "not merged" line name a
    # peer's last exchange outside a run: "the end of strategy.trace(...)", not "a
    # cross-replica the end of strategy.trace(...)".
    from asyncreplica_mpi._failures import _exchange_text
    from asyncreplica_mpi._trace import _DETAIL

    assert _exchange_text((None, _DETAIL)) == "the end of strategy.trace(...)"
    assert (
        _exchange_text((None, {"describe": "reduce(SUM) on float64[3]"}))
        == "a cross-replica reduce(SUM) on float64[3]"
    )
    refused = {"describe": "a refused cross-replica operation (TypeError: no)"}
    assert _exchange_text((None, refused)) == refused["describe"]


# -- scale-out, third attack (programs/scaleout.py) ---------------------------------------

SCALEOUT = PROGRAM.parent / "scaleout.py"


@pytest.mark.parametrize("case", ["reduce_mean", "two_dtypes"])
def test_np_seterr_differing_between_processes_stops_every_process_in_step(
    case: str, tmp_path: Path
) -> None:
    # Process 0 raises on overflow, process 1 warns. Process 0 raised after the first of
    # two exchanges (a MEAN's sum then its count; one transfer per dtype) while process 1
    # went on to the second: both waited for ever. Now every transfer completes first,
    # and every process raises, process 1 naming process 0's setting.
    rc, logs, output = launch("fp_settings", "split", case, tmp_path=tmp_path, program=SCALEOUT)
    assert rc == 0, output
    for attempt in range(2):
        assert f"{attempt} FloatingPointError: overflow encountered in add\n" in logs[0], output
        assert (
            f"{attempt} FloatingPointError: overflow encountered in add: process 0 raised for "
            "it (np.seterr / np.errstate" in logs[1]
        ), output
    for rank in range(2):
        assert logs[rank].endswith("after 2.0\ndone\n"), output


@pytest.mark.parametrize(
    ("setting", "error"),
    [
        ("call", "Stop: errcall: overflow"),
        ("werror", "RuntimeWarning: overflow encountered in add"),
    ],
)
def test_a_raising_errcall_or_warnings_as_errors_alike_everywhere_keep_the_strategy_usable(
    setting: str, error: str, tmp_path: Path
) -> None:
    # The same on every process: the user's exception was replayed unmarked, so the
    # processes were declared out of step, every later run refused and the job aborted.
    for case in ("reduce_mean", "two_dtypes"):
        (tmp_path / case).mkdir()
        rc, logs, output = launch(
            "fp_settings", setting, case, tmp_path=tmp_path / case, program=SCALEOUT
        )
        assert rc == 0, output
        assert "out of step" not in output, output
        assert "aborting the MPI job" not in output, output
        for rank in range(2):
            assert logs[rank] == f"0 {error}\n1 {error}\nafter 2.0\ndone\n", output


def test_concurrent_collectives_keep_their_own_floating_point_record(tmp_path: Path) -> None:
    # Two strategies' large float16 all_reduces at once, only A's overflowing: the
    # rank-order operation's record was one per (op, dtype) for the process, so B
    # raised A's FloatingPointError (1.0 + 1.0 = 2.0 never overflows).
    rc, logs, output = launch("shared_op", tmp_path=tmp_path, program=SCALEOUT)
    assert rc == 0, output
    line = "A FloatingPointError: overflow encountered in add | B ok 2.0"
    for rank in range(2):
        assert logs[rank] == "".join(f"{r} {line}\n" for r in range(4)) + "done\n", output


@pytest.mark.parametrize(("case", "processes"), [("reversed", 2), ("subset", 3)])
def test_a_strategy_on_a_new_communicator_with_a_freed_ones_handle(
    case: str, processes: int, tmp_path: Path
) -> None:
    # MPICH hands a new communicator the handle of one the program freed; the library
    # kept its per-communicator state (creation serial, notes channel) by handle, so
    # the second strategy's creation waited for ever ("process 0 ... for process 0"),
    # or raised MPICH's raw "Invalid rank". It is keyed by the communicator now.
    rc, logs, output = launch(
        "freed_comm", case, tmp_path=tmp_path, program=SCALEOUT, processes=processes
    )
    assert rc == 0, output
    if case == "reversed":
        assert logs[0] == "A [3.0]\nB [6.0]\ndone\n", output
        assert logs[1] == "A [3.0]\nB [6.0, 6.0]\ndone\n", output
    else:
        assert logs[0] == logs[1] == "A [3.0]\nB [6.0]\ndone\n", output
        assert logs[2] == "B [6.0]\ndone\n", output


@pytest.mark.parametrize("where", ["run_end", "reduce"])
def test_asyncio_runs_first_ctrl_c_in_the_run_end_exchange_is_deferred(
    where: str, tmp_path: Path
) -> None:
    # asyncio.run's first Ctrl-C cancels the main task, which awaits the run-end
    # exchange: anyio's shields do not stop that cancellation, so process 0 left the
    # exchange it had posted, process 1 raised "stopped waiting ... at the end of their
    # run" and the job was aborted. The exchange now completes first, then the
    # interruption takes effect: the processes stay in step.
    # The same for strategy.reduce outside a run (where="reduce"), awaited by the main task.
    rc, logs, output = launch("end_interrupt", where, tmp_path=tmp_path, program=SCALEOUT)
    assert "aborting the MPI job" not in output, output
    assert "out of step" not in output, output
    assert logs[0] == "got CancelledError\n", output  # asyncio.run raises KeyboardInterrupt
    assert rc != 0, output  # process 0's KeyboardInterrupt
    first = "reduce 1" if where == "reduce" else "run returned"
    assert logs[1].startswith(f"{first}\ngot ReplicaExitedError\n"), output
    assert "KeyboardInterrupt" in output, output


def test_a_strategy_per_user_communicator_frees_its_communicators(tmp_path: Path) -> None:
    # Each step: comm = COMM_WORLD.Dup(), a strategy on it, a run, comm.Free(), the
    # strategy dropped. No later creation on that communicator ever released its group,
    # so 4 communicators a step were kept (MPICH's "Too many communicators" at the
    # 682nd, 515th with the notes' duplicate). Now released once every process dropped it.
    rc, logs, output = launch("leak_dup", "40", tmp_path=tmp_path, program=SCALEOUT)
    assert rc == 0, output
    for rank in range(2):
        held = logs[rank].splitlines()[0]
        groups, channels = (int(word) for word in re.findall(r"\d+", held))
        # Not 40: the last step's, and the one before whose release exchange is in flight.
        assert groups <= 2, held
        assert channels <= 2, held
    assert MPICH_LEAK not in output, output


def test_a_processs_own_ctrl_c_is_not_replaced_by_a_peers_error(tmp_path: Path) -> None:
    # Process 1's Ctrl-C (asyncio.run cancels its main task) as its run starts, while
    # process 0 exits: the run's collective finished first (shielded) and raised the
    # peer's ReplicaExitedError, which anyio's task group raised instead of the
    # cancellation: the Ctrl-C was lost. It takes effect at the run's end now.
    rc, logs, output = launch("own_interrupt", tmp_path=tmp_path, program=SCALEOUT)
    assert rc != 0, output  # process 1's KeyboardInterrupt
    assert logs[0] == "exits\ndone\n", output
    assert logs[1] == "got CancelledError (ReplicaExitedError)\n", output
    assert "KeyboardInterrupt" in output, output


def test_a_collective_issued_while_one_is_in_flight_is_refused_alike(tmp_path: Path) -> None:
    # Two replicas a process, each issuing two unnamed all_reduces at once: each
    # process's ledger refused its own first replica (process 1: "Replica 2"); one
    # process with 4 replicas names replica 0, so every process does now.
    rc, logs, output = launch("two_in_flight", tmp_path=tmp_path, program=SCALEOUT)
    assert rc == 0, output
    refused = (
        "CollectiveError: Replica 0 issued a collective while its 1st collective "
        "(position 0) is still in flight."
    )
    for rank in range(2):
        assert logs[rank] == f"{refused}\nafter 4.0\ndone\n", output
