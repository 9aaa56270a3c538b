"""The ledger, driven synchronously: no event loop, no arrays."""

from __future__ import annotations

import pytest

from asyncreplica import CollectiveError, CollectiveMismatchError, ReplicaExitedError
from asyncreplica._core._ledger import Ledger, ReplicaState
from asyncreplica._core._signature import CallSite, CollectiveKind, LeafSpec, ReduceOp, Signature

SITE_A = (CallSite("train.py", 10, "step"),)
SITE_B = (CallSite("train.py", 12, "step"),)


def sig(
    kind: CollectiveKind = CollectiveKind.ALL_REDUCE,
    *,
    op: ReduceOp | None = ReduceOp.SUM,
    shape: tuple[int, ...] = (4,),
    dtype: str = "float32",
    site: tuple[CallSite, ...] = SITE_A,
    name: str | None = None,
) -> Signature:
    return Signature(kind, op=op, leaves=(LeafSpec(shape, dtype),), call_path=site, name=name)


def test_positions_complete_when_every_replica_arrives() -> None:
    ledger = Ledger(3)
    assert ledger.arrive(0, sig()) == (0, False)
    assert ledger.arrive(2, sig()) == (0, False)
    assert ledger.arrive(1, sig()) == (0, True)
    assert ledger.arrive(1, sig()) == (1, False)


def test_single_replica_completes_at_once() -> None:
    assert Ledger(1).arrive(0, sig()) == (0, True)


@pytest.mark.parametrize(
    ("other", "fields"),
    [
        pytest.param(sig(op=ReduceOp.MEAN), ("reduce op",), id="op"),
        pytest.param(sig(shape=(5,)), ("shape",), id="shape"),
        pytest.param(sig(dtype="float64"), ("dtype",), id="dtype"),
        pytest.param(sig(site=SITE_B), ("call site",), id="call-site"),
        pytest.param(sig(CollectiveKind.ALL_GATHER, op=None), ("kind", "reduce op"), id="kind"),
    ],
)
def test_first_disagreeing_arrival_raises_with_fields(
    other: Signature, fields: tuple[str, ...]
) -> None:
    ledger = Ledger(3)
    ledger.arrive(0, sig())
    with pytest.raises(CollectiveMismatchError) as info:
        ledger.arrive(1, other)
    assert info.value.fields == fields
    assert info.value.position == 0
    assert set(info.value.signatures) == {0, 1}
    assert info.value.report is not None


def test_call_sites_ignored_when_disabled_or_named() -> None:
    ledger = Ledger(2, check_call_sites=False)
    ledger.arrive(0, sig())
    assert ledger.arrive(1, sig(site=SITE_B)) == (0, True)
    named = Ledger(2)
    named.arrive(0, sig(name="g"))
    assert named.arrive(1, sig(name="g", site=SITE_B)) == (("g", 0), True)


def test_finish_while_others_wait_raises_exited() -> None:
    ledger = Ledger(3)
    ledger.arrive(0, sig())
    ledger.arrive(1, sig())
    with pytest.raises(ReplicaExitedError) as info:
        ledger.finish(2)
    assert info.value.replica_id == 2
    assert info.value.position == 0
    assert info.value.waiting == frozenset({0, 1})


def test_arrival_after_a_replica_finished_short_raises_exited() -> None:
    ledger = Ledger(2)
    ledger.arrive(0, sig())
    ledger.arrive(1, sig())
    ledger.finish(1)  # after one collective; nobody is waiting yet
    with pytest.raises(ReplicaExitedError) as info:
        ledger.arrive(0, sig(site=SITE_B))
    assert info.value.replica_id == 1
    assert info.value.position == 1
    assert "finished after 1 collective," in str(info.value)


def test_finishing_at_equal_counts_is_fine() -> None:
    ledger = Ledger(2)
    ledger.arrive(0, sig())
    ledger.arrive(1, sig())
    ledger.finish(0)
    ledger.finish(1)
    assert [row.state for row in ledger.report().rows] == [ReplicaState.FINISHED] * 2


def test_named_collectives_match_by_name_in_any_order() -> None:
    ledger = Ledger(2)
    assert ledger.arrive(0, sig(name="a")) == (("a", 0), False)
    assert ledger.arrive(0, sig(name="b", site=SITE_B)) == (("b", 0), False)
    assert ledger.arrive(1, sig(name="b")) == (("b", 0), True)
    assert ledger.arrive(1, sig(name="a", site=SITE_B)) == (("a", 0), True)
    assert ledger.arrive(0, sig()) == (0, False)  # unnamed positions are counted apart


def test_named_mismatch_reports_the_name() -> None:
    ledger = Ledger(2)
    ledger.arrive(0, sig(name="a"))
    with pytest.raises(
        CollectiveMismatchError,
        match=r"^Replicas disagree about their collective named 'a' \(1st use\): shape differs\.",
    ) as info:
        ledger.arrive(1, sig(name="a", shape=(9,)))
    assert info.value.name == "a"
    assert info.value.position == 0


def test_finish_without_a_name_others_wait_at_raises_exited() -> None:
    ledger = Ledger(2)
    ledger.arrive(0, sig(name="a"))
    with pytest.raises(ReplicaExitedError, match="waiting at its collective named 'a'"):
        ledger.finish(1)


def test_deadlock_error_names_the_cycle() -> None:
    ledger = Ledger(2)
    ledger.arrive(0, sig(name="x"))
    ledger.arrive(1, sig(name="y", site=SITE_B))
    assert ledger.all_waiting()
    error = ledger.deadlock_error()
    assert error.cycle == ((0, "x"), (1, "y"))
    text = str(error)
    assert text.startswith("Replicas 0, 1 wait for each other in a cycle")
    assert (
        "replica 0 waits at its collective named 'x' (1st use): all_reduce(SUM, name='x') on float32[4] at train.py:10, which replica 1 has not issued"
        in text
    )


def test_all_waiting_needs_every_replica_waiting_or_finished() -> None:
    ledger = Ledger(3)
    ledger.arrive(0, sig(name="x"))
    ledger.arrive(1, sig(name="y"))
    assert not ledger.all_waiting()
    ledger.arrive(2, sig(name="x"))
    assert ledger.all_waiting()


def test_abandoning_a_pending_collective_is_an_error() -> None:
    ledger = Ledger(2)
    key, _ = ledger.arrive(0, sig())
    error = ledger.abandon(0, key)
    assert error is not None
    assert str(error).startswith(
        "Replica 0 was cancelled while waiting at its 1st collective (position 0)"
    )
    ledger.arrive(1, sig())
    assert ledger.abandon(1, key) is None  # completed: nothing is left hanging


def test_collective_while_one_in_flight_raises() -> None:
    ledger = Ledger(2)
    ledger.arrive(0, sig())
    with pytest.raises(CollectiveError, match=r"^Replica 0 issued a collective while its 1st"):
        ledger.arrive(0, sig(site=SITE_B))


def test_named_collective_while_unnamed_in_flight_is_allowed() -> None:
    ledger = Ledger(2)
    ledger.arrive(0, sig())
    assert ledger.arrive(0, sig(name="n")) == (("n", 0), False)


def test_collective_after_finishing_raises() -> None:
    ledger = Ledger(1)
    ledger.finish(0)
    with pytest.raises(
        CollectiveError,
        match=r"^Replica 0 issued all_reduce\(SUM\) on float32\[4\] after it finished",
    ):
        ledger.arrive(0, sig())


def test_report_rows_carry_state_position_and_history() -> None:
    ledger = Ledger(2)
    for _ in range(20):
        ledger.arrive(0, sig())
        ledger.arrive(1, sig())
    ledger.arrive(0, sig(site=SITE_B))
    ledger.fail(1)
    rows = ledger.report().rows
    assert rows[0].state is ReplicaState.WAITING
    assert rows[0].position == 20
    assert rows[0].call_site == SITE_B[0]
    assert len(rows[0].history) == 16
    assert rows[0].history[-1][0] == 20
    assert rows[1].state is ReplicaState.FAILED
    assert rows[1].position == 20
    assert (
        str(rows[0])
        == "replica 0: waiting, position 20 all_reduce(SUM) on float32[4] at train.py:12"
    )


def test_timeout_error_lists_arrived_and_missing() -> None:
    ledger = Ledger(3)
    ledger.arrive(0, sig())
    error = ledger.timeout_error(0, 2.5, {2: "awaiting sleep at io.py:3"})
    assert error.arrived == frozenset({0})
    assert error.missing == frozenset({1, 2})
    assert isinstance(error, TimeoutError)
    text = str(error)
    assert text.startswith(
        "Timed out after 2.5 s waiting for replicas 1, 2 at the 1st collective (position 0)."
    )
    assert "replica 2 did not arrive: awaiting sleep at io.py:3" in text
    assert "replica 1 did not arrive: running after 0 collectives" in text


def test_cancel_marks_only_live_replicas() -> None:
    ledger = Ledger(2)
    ledger.finish(0)
    ledger.cancel(0)
    ledger.cancel(1)
    assert [r.state for r in ledger.report().rows] == [
        ReplicaState.FINISHED,
        ReplicaState.CANCELLED,
    ]


def test_an_offset_names_replicas_by_global_id_everywhere() -> None:
    # Under MPI a process's ledger counts its replicas from the global id of its first.
    ledger = Ledger(2, offset=4)
    ledger.arrive(0, sig())
    ledger.arrive(1, sig())
    ledger.arrive(0, sig())
    with pytest.raises(ReplicaExitedError) as info:
        ledger.finish(1)
    error = info.value
    assert str(error).startswith("Replica 5 finished after 1 collective, but replica 4 is waiting")
    assert (error.replica_id, error.position, error.waiting) == (5, 1, frozenset({4}))
    assert error.report is not None
    assert [row.replica_id for row in error.report.rows] == [4, 5]
    stalled = ledger.stall_message(1, 2.0, {})
    assert "replica 4 has waited 2.0 s at the 2nd collective (position 1) for replica 5" in stalled


def test_an_offset_lists_the_replicas_not_arrived_by_global_id() -> None:
    ledger = Ledger(3, offset=3)
    ledger.arrive(0, sig())
    with pytest.raises(CollectiveMismatchError) as info:
        ledger.arrive(1, sig(shape=(5,)))
    assert set(info.value.signatures) == {3, 4}
    assert "  * replica 5 has not arrived yet" in str(info.value)
