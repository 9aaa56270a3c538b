"""The fifth scale-out attack's findings, each under ``mpiexec -n 2`` (programs/fifth_attack.py).

Every launch has test_mpi_lifecycle's hang guard (the programs dump their stacks and
exit; the launcher's whole process group is killed past it).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_mpi_lifecycle import launch

PROGRAM = Path(__file__).parent / "programs" / "fifth_attack.py"


def test_an_uncaught_exception_with_a_lone_surrogate_still_reaches_the_peer(
    tmp_path: Path,
) -> None:
    # The exit note was encoded as strict UTF-8: a message holding '\udcff' (os.fsdecode
    # of a file name that is not UTF-8) crashed the exit hook, and process 0 waited for
    # ever in its collective. Every text sent between processes is encoded in one place
    # now, which escapes what UTF-8 cannot encode.
    rc, logs, output = launch("surrogate_exit", tmp_path=tmp_path, program=PROGRAM)
    assert rc != 0, output  # process 1's RuntimeError
    assert "UnicodeEncodeError" not in output, output
    assert logs[0].startswith("got ReplicaExitedError\n"), output
    assert (
        "process 1 (replica 1) exited after an uncaught RuntimeError: cannot read shard "
        "/tmp/no-such-shard-\\udcff.npy"
    ) in logs[0], output


def test_an_exception_whose_str_raises_in_a_replica_is_told_and_raised_as_itself(
    tmp_path: Path,
) -> None:
    # describe_exception called str() unguarded: process 1 raised that RuntimeError
    # instead of its own exception, never told process 0, and the next runs were out of
    # step (CollectiveMismatchError between unrelated collectives).
    rc, logs, output = launch("badstr_run", tmp_path=tmp_path, program=PROGRAM)
    assert rc == 0, output
    assert logs[1] == "got BadStr: <its __str__ raised>\nnext 2.0\n", output
    assert logs[0].startswith("got ReplicaExitedError: Process 1 failed"), output
    assert (
        "process 1 (replica 1) failed: BadStr (its message could not be read: its __str__ raised)"
    ) in logs[0], output
    assert logs[0].endswith("next 2.0\n"), output


def test_an_uncaught_exception_whose_str_raises_is_named_to_the_peer(tmp_path: Path) -> None:
    rc, logs, output = launch("badstr_exit", tmp_path=tmp_path, program=PROGRAM)
    assert rc != 0, output  # process 1's BadStr
    assert logs[0].startswith("got ReplicaExitedError\n"), output
    assert (
        "process 1 (replica 1) exited after an uncaught BadStr (its message could not be "
        "read: its __str__ raised)"
    ) in logs[0], output


@pytest.mark.parametrize(
    ("how", "error"),
    [
        ("none", "ValueError: devices must name at least one device, e.g. ['CPU:0']"),
        ("twice", "ValueError: device 'CPU:0' (CPU:0) is listed twice"),
        ("type", "TypeError: check_call_sites must be True or False, got 'yes'"),
    ],
)
def test_a_constructor_refusing_one_processs_arguments_releases_the_others(
    how: str, error: str, tmp_path: Path
) -> None:
    # Process 1 caught its constructor's ValueError and went on: process 0 waited in its
    # constructor for ever (the stall warning said process 1 had not created its
    # strategy). The refusal is told as the creation's note: every process raises
    # ValueError, in step, and both create their next strategy together.
    rc, logs, output = launch("refused_args", how, tmp_path=tmp_path, program=PROGRAM)
    assert rc == 0, output
    cls, _, text = error.partition(": ")
    assert logs[0].startswith(
        f"got {cls}\nMultiWorkerMirroredStrategy was not created: process 1 refused its "
        "own arguments (this is process 0):\n\n"
        f"  * process 1: {error}"
    ), output
    assert logs[1].startswith(f"got {cls}\n{text}"), output
    for rank in range(2):
        assert logs[rank].endswith("next 2.0\n"), output
    assert "stalled" not in output, output


# -- the texts sent between processes, without MPI ------------------------------------------


class _BadStr(Exception):
    def __str__(self) -> str:
        raise RuntimeError("str of this exception raises")


def test_a_failure_is_described_as_one_process_describes_it_even_if_its_str_raises() -> None:
    from asyncreplica_mpi._protocol import describe_exception

    from asyncreplica.abc import error_text

    assert describe_exception(_BadStr()) == error_text(_BadStr())
    assert describe_exception(_BadStr()) == (
        "_BadStr (its message could not be read: its __str__ raised)"
    )
    group = ExceptionGroup("2 replicas failed", [_BadStr(), ValueError("bad")])
    assert describe_exception(group).startswith("_BadStr (its message could not be read")


def test_every_text_sent_to_other_processes_survives_what_utf8_cannot_encode() -> None:
    import os

    from asyncreplica_mpi._protocol import from_wire, to_wire

    name = os.fsdecode(b"/tmp/shard-\xff.npy")
    assert from_wire(to_wire(f"exited after an uncaught RuntimeError: {name}")) == (
        "exited after an uncaught RuntimeError: /tmp/shard-\\udcff.npy"
    )
    assert from_wire(b"\xff ok") == "\ufffd ok"


def test_creations_on_two_communicators_in_opposite_orders_are_named_as_possible(
    tmp_path: Path,
) -> None:
    # Attack 24d: process 0 creates on COMM_WORLD then on a Dup, process 1 the other way
    # round. Each waits for the other; the warning and the timeout said only that the
    # peer "did not create theirs", when it waits creating one on the other
    # communicator. Its notes travel there, so the cycle cannot be seen: both now say
    # which communicator each waits on, and that the peer may be creating elsewhere.
    _, logs, output = launch("creation_cycle", tmp_path=tmp_path, program=PROGRAM)
    elsewhere = (
        "is creating a strategy on another communicator (the creations on two "
        "communicators, a duplicate or split of this one, made in opposite orders wait "
        "for each other for ever"
    )
    places = {0: "COMM_WORLD", 1: "a communicator of 2 processes (not COMM_WORLD)"}
    timed_out = 0
    for rank in range(2):
        log = logs[rank]
        peer = 1 - rank
        said = f"process {peer} has not announced itself on {places[rank]}, where this "
        assert "warning: MultiWorkerMirroredStrategy creation stalled" in log, output
        # In the warning, and in the timeout's error where this process timed out first
        # (the other one is then told that it gave up).
        if "got CollectiveTimeoutError" in log:
            timed_out += 1
            assert log.count(said) == 2, output
            assert log.count(elsewhere) == 2, output
        else:
            assert "got BackendError" in log, output
            assert log.count(said) == 1, output
            assert log.count(elsewhere) == 1, output
    assert timed_out >= 1, output
