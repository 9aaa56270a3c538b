"""Golden tests of the collective error messages."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from asyncreplica import CollectiveMismatchError, ReplicaExitedError
from asyncreplica._core._nest import flatten
from asyncreplica._core._report import format_replicas, mismatch_message
from asyncreplica._core._signature import (
    CallSite,
    CollectiveKind,
    LeafSpec,
    ReduceOp,
    Signature,
    ordinal,
)

SITE = (
    CallSite("/home/u/proj/train.py", 88, "step"),
    CallSite("/home/u/proj/train.py", 120, "main"),
)
OTHER = (
    CallSite("/home/u/proj/train.py", 95, "step"),
    CallSite("/home/u/proj/train.py", 120, "main"),
)


@pytest.mark.parametrize(
    ("ids", "text"),
    [
        ([2], "replica 2"),
        ([3, 0, 1], "replicas 0-3"[:0] + "replicas 0, 1, 3"),
        ([0, 1, 2, 3, 5], "replicas 0-3, 5"),
        (list(range(4096)), "replicas 0-4095"),
        ([0, 1, 4, 5], "replicas 0, 1, 4, 5"),
    ],
)
def test_format_replicas(ids: list[int], text: str) -> None:
    assert format_replicas(ids) == text


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (1, "1st"),
        (2, "2nd"),
        (3, "3rd"),
        (4, "4th"),
        (11, "11th"),
        (12, "12th"),
        (13, "13th"),
        (21, "21st"),
        (102, "102nd"),
    ],
)
def test_ordinal(n: int, text: str) -> None:
    assert ordinal(n) == text


def test_mismatch_message_golden() -> None:
    reduce = Signature(
        CollectiveKind.ALL_REDUCE,
        op=ReduceOp.SUM,
        leaves=(LeafSpec((1024,), "float32"),),
        call_path=SITE,
    )
    gather = Signature(
        CollectiveKind.ALL_GATHER, axis=0, leaves=(LeafSpec((1024,), "float32"),), call_path=OTHER
    )
    error = CollectiveMismatchError(
        2,
        {0: reduce, 1: reduce, 3: reduce, 2: gather},
        ("kind", "reduce op", "axis", "call site"),
        num_replicas=5,
    )
    assert str(error) == (
        "Replicas disagree about their 3rd collective (position 2): kind, reduce op, axis, call site differ.\n"
        "\n"
        "  * replicas 0, 1, 3 called all_reduce(SUM) on float32[1024] at proj/train.py:88 <- proj/train.py:120\n"
        "  * replica 2 called all_gather(axis=0) on float32[1024] at proj/train.py:95 <- proj/train.py:120\n"
        "  * replica 4 has not arrived yet\n"
        "\n"
        "replica 2 skipped the collective at proj/train.py:88 that replicas 0, 1, 3 made: it is already "
        "at a later line of step() (proj/train.py:95).\n"
        "\n"
        "Every replica must issue the same collectives, with the same arguments, in the same order.\n"
        "The usual cause is a collective inside a branch on the replica id or on per-replica data "
        "(`if ctx.replica_id_in_sync_group == 0:`), or values whose shape or dtype depends on the replica. "
        "Move the collective out of the branch, or make every replica pass values of the same structure, "
        "shape and dtype.\n"
        "For more on this error, run `asyncreplica explain AR102`."
    )


def test_mismatch_of_structures_prints_both_structures() -> None:
    _, td_list = flatten([1.0, 2.0])
    _, td_dict = flatten({"a": 1.0})
    a = Signature(
        CollectiveKind.ALL_REDUCE,
        op=ReduceOp.SUM,
        structure=td_list,
        leaves=(LeafSpec((), "float64"),) * 2,
    )
    b = Signature(
        CollectiveKind.ALL_REDUCE,
        op=ReduceOp.SUM,
        structure=td_dict,
        leaves=(LeafSpec((), "float64"),),
    )
    text = str(
        CollectiveMismatchError(0, {0: a, 1: b}, ("structure", "dtype", "shape"), num_replicas=2)
    )
    assert "replica 0 called all_reduce(SUM) on [float64[], float64[]]" in text
    assert "replica 1 called all_reduce(SUM) on {'a': float64[]}" in text


def test_call_site_only_mismatch_explains_skipped_collective() -> None:
    a = Signature(
        CollectiveKind.ALL_REDUCE,
        op=ReduceOp.SUM,
        leaves=(LeafSpec((), "float64"),),
        call_path=SITE,
    )
    b = Signature(
        CollectiveKind.ALL_REDUCE,
        op=ReduceOp.SUM,
        leaves=(LeafSpec((), "float64"),),
        call_path=OTHER,
    )
    text = str(CollectiveMismatchError(0, {0: a, 1: b}, ("call site",), num_replicas=2))
    assert (
        text.splitlines()[0]
        == "Replicas disagree about their 1st collective (position 0): call site differs."
    )
    assert "usually one replica skipped a collective" in text
    assert "name= or create the strategy with check_call_sites=False" in text


def test_exited_message_golden() -> None:
    wait = Signature(
        CollectiveKind.ALL_REDUCE,
        op=ReduceOp.MEAN,
        leaves=(LeafSpec((8,), "float32"),),
        call_path=SITE,
    )
    last = Signature(CollectiveKind.BARRIER, call_path=OTHER)
    error = ReplicaExitedError(1, 3, {0: wait, 2: wait}, exited_count=3, exited_last=last)
    assert str(error) == (
        "Replica 1 finished after 3 collectives, but replicas 0, 2 are waiting at their 4th collective (position 3).\n"
        "\n"
        "  * replicas 0, 2 called all_reduce(MEAN) on float32[8] at proj/train.py:88\n"
        "  * replica 1 returned after barrier() at proj/train.py:95\n"
        "\n"
        "Every replica must make the same number of collectives in one run.\n"
        "Either replica 1 skipped a collective (a collective inside `if` on the replica id or on per-replica "
        "data, or a loop whose trip count differs per replica, such as an uneven last batch), or replicas 0, 2 "
        "made an extra one. Make every replica issue the same sequence of collectives.\n"
        "For more on this error, run `asyncreplica explain AR103`."
    )
    assert error.waiting == frozenset({0, 2})


def test_merge_call_signature_describes_function() -> None:
    s = Signature(CollectiveKind.MERGE_CALL, merge_fn=object(), merge_fn_name="update")
    assert s.describe() == "merge_call(update)"


def _reduce_at(line: int) -> Signature:
    return Signature(
        CollectiveKind.ALL_REDUCE,
        op=ReduceOp.SUM,
        leaves=(LeafSpec((4,), "float32"),),
        call_path=(CallSite("/p/train.py", line, "step"),),
    )


@pytest.mark.parametrize(
    ("outlier_line", "hint"),
    [
        pytest.param(
            41,
            "replica 0 made an extra collective at p/train.py:41: the others are already at a later line of step() (p/train.py:44).",
            id="extra",
        ),
        pytest.param(
            50,
            "replica 0 skipped the collective at p/train.py:44 that replicas 1, 2 made: it is already at a later line of step() (p/train.py:50).",
            id="missed",
        ),
    ],
)
def test_mismatch_says_extra_or_missed(outlier_line: int, hint: str) -> None:
    signatures = {0: _reduce_at(outlier_line), 1: _reduce_at(44), 2: _reduce_at(44)}
    text = str(CollectiveMismatchError(0, signatures, ("call site",), num_replicas=3))
    assert hint in text.splitlines()


def test_mismatch_tie_names_both_possibilities() -> None:
    text = str(
        CollectiveMismatchError(
            0, {0: _reduce_at(41), 1: _reduce_at(44)}, ("call site",), num_replicas=2
        )
    )
    assert (
        "replica 0 is at an earlier line (p/train.py:41) than replica 1 (p/train.py:44): either replica 0 "
        "made an extra collective at p/train.py:41, or replica 1 skipped it."
    ) in text.splitlines()


def _site(line: int) -> tuple[CallSite, ...]:
    return (CallSite("/p/train.py", line, "step"),)


def test_timeout_message_golden() -> None:
    from asyncreplica import CollectiveTimeoutError

    arrived = _reduce_at(44)
    error = CollectiveTimeoutError(
        3, 2.0, {0: arrived, 2: arrived}, {1: "awaiting at p/io.py:7 in load()"}
    )
    assert str(error) == (
        "Timed out after 2 s waiting for replica 1 at the 4th collective (position 3).\n"
        "\n"
        "  * replicas 0, 2 called all_reduce(SUM) on float32[4] at p/train.py:44 and waited\n"
        "  * replica 1 did not arrive: awaiting at p/io.py:7 in load()\n"
        "\n"
        "A collective completes only when every replica reaches it; the missing replicas are alive "
        "but busy elsewhere.\n"
        "Find what they wait for (I/O, a lock, a long computation) or raise timeout_seconds in "
        "CommunicationOptions.\n"
        "For more on this error, run `asyncreplica explain AR104`."
    )


def test_deadlock_message_golden() -> None:
    from asyncreplica import CollectiveDeadlockError

    x = Signature(CollectiveKind.BARRIER, name="x", call_path=_site(10))
    y = Signature(CollectiveKind.BARRIER, name="y", call_path=_site(20))
    error = CollectiveDeadlockError(
        [
            (0, "collective named 'x' (1st use)", x, [1]),
            (1, "collective named 'y' (1st use)", y, [0]),
        ],
        keys=[("x", 0), ("y", 0)],
    )
    assert error.cycle == ((0, "x"), (1, "y"))
    assert str(error) == (
        "Replicas 0, 1 wait for each other in a cycle: none of their collectives can ever complete.\n"
        "\n"
        "  * replica 0 waits at its collective named 'x' (1st use): barrier(name='x') at "
        "p/train.py:10, which replica 1 has not issued\n"
        "  * replica 1 waits at its collective named 'y' (1st use): barrier(name='y') at "
        "p/train.py:20, which replica 0 has not issued\n"
        "\n"
        "Named collectives match by name, so each replica must eventually issue every name its "
        "peers wait at; here each waits for a name that another issues only after its own wait.\n"
        "Await named collectives in the same order on every replica, or start them concurrently "
        "(asyncio.gather or a task group) so that none blocks the others.\n"
        "For more on this error, run `asyncreplica explain AR105`."
    )


def test_in_flight_message_golden() -> None:
    from asyncreplica._core._report import in_flight_message

    assert in_flight_message(2, _reduce_at(50), _reduce_at(44), "1st collective (position 0)") == (
        "Replica 2 issued a collective while its 1st collective (position 0) is still in flight.\n"
        "\n"
        "  * in flight: all_reduce(SUM) on float32[4] at p/train.py:44\n"
        "  * new: all_reduce(SUM) on float32[4] at p/train.py:50\n"
        "\n"
        "Unnamed collectives match by their order, so one replica issues them one at a time: await "
        "each collective before issuing the next, or give each concurrent collective a name "
        "(name='grads') so that they match by name.\n"
        "For more on this error, run `asyncreplica explain AR101`."
    )


def test_stall_and_resumed_messages_golden() -> None:
    from asyncreplica._core._report import resumed_message, stall_message

    text = stall_message(
        "1st collective (position 0)",
        30.04,
        {0: _reduce_at(44)},
        {1: "awaiting at p/io.py:7 in load()"},
    )
    assert text == (
        "Collective stalled: replica 0 has waited 30.0 s at the 1st collective (position 0) for "
        "replica 1.\n"
        "\n"
        "  * replica 0 called all_reduce(SUM) on float32[4] at p/train.py:44 and waits\n"
        "  * replica 1 did not arrive: awaiting at p/io.py:7 in load()\n"
        "\n"
        "This is a warning, not an error: the run goes on, and a message follows if the collective "
        "completes. Set CommunicationOptions(timeout_seconds=...) to fail instead."
    )
    assert resumed_message("collective named 'g' (2nd use)", 31.25) == (
        "Collective resumed: the collective named 'g' (2nd use) completed after 31.2 s; the stall "
        "warning above was not a hang."
    )


# A step whose replicas take two branches: replica 0 lines 8-9, replica 1 lines 11-12.
SWAP_SOURCE = {
    7: "    if ctx.replica_id_in_sync_group == 0:\n",
    8: "        grad = await ctx.all_reduce('sum', grad)  # the gradient first\n",
    9: "        loss = await ctx.all_reduce('sum', loss)\n",
    10: "    else:\n",
    11: "        loss = await ctx.all_reduce('sum', loss)\n",
    12: "        grad = await ctx.all_reduce('sum', grad)\n",
    13: "    grad = await ctx.all_reduce('sum', grad)\n",
    14: "    return loss, grad\n",
}


def _source(lines: dict[int, str]) -> Callable[[str, int], str]:
    def getline(filename: str, lineno: int) -> str:
        assert filename == "/home/u/scratch/train.py"
        return lines.get(lineno, "")

    return getline


def _call_at(line: int) -> Signature:
    return Signature(
        CollectiveKind.ALL_REDUCE,
        op=ReduceOp.SUM,
        leaves=(LeafSpec((), "float64"),),
        call_path=(CallSite("/home/u/scratch/train.py", line, "step"),),
    )


def _hint(lines: dict[int, str]) -> str:
    message = mismatch_message(
        0, {0: _call_at(8), 1: _call_at(11)}, ("call site",), 2, source=_source(lines)
    )
    return message.splitlines()[5]


def test_mismatch_tells_a_swap_from_the_source() -> None:
    # Each branch goes on with the other's call (line 8's comment does not count): a
    # swap, not an extra or a skipped call. docs/errors.md shows this line.
    assert _hint(SWAP_SOURCE) == (
        "replica 1 issues the same collectives as replica 0 in a different order: replica 1 calls "
        "scratch/train.py:11 then scratch/train.py:12 (the same call as scratch/train.py:8); "
        "replica 0 calls scratch/train.py:8 then scratch/train.py:9 (the same call as "
        "scratch/train.py:11)."
    )


def test_mismatch_is_no_swap_when_the_branch_does_not_go_on_with_the_other_call() -> None:
    # Replica 1's block ends at line 11; the same call after the block (line 13) is made
    # by every replica, so it tells nothing: the line order decides, as without source.
    lines = {**SWAP_SOURCE, 12: "        pass\n"}
    tie = (
        "replica 0 is at an earlier line (scratch/train.py:8) than replica 1 (scratch/train.py:11): "
        "either replica 0 made an extra collective at scratch/train.py:8, or replica 1 skipped it."
    )
    assert _hint(lines) == tie
    assert _hint({}) == tie  # no source (a file that is gone): the same


def test_a_skip_whose_call_follows_in_the_enclosing_block_is_no_swap() -> None:
    # Replica 1 skips line 8 (inside the `if`) and is at line 11, which line 12 (the same
    # code as line 8) follows. The others' block (the `if`) ends after line 8: they make
    # line 11 next as well, so this is a skip, not a swap.
    lines = {
        7: "    if ctx.replica_id_in_sync_group != 1:\n",
        8: "        grad = await ctx.all_reduce('sum', grad)\n",
        9: "\n",
        10: "    # the common part\n",
        11: "    loss = await ctx.all_reduce('sum', loss)\n",
        12: "    grad = await ctx.all_reduce('sum', grad)\n",
    }
    signatures = {0: _call_at(8), 1: _call_at(11), 2: _call_at(8)}
    message = mismatch_message(0, signatures, ("call site",), 3, source=_source(lines))
    assert "different order" not in message
    assert (
        "replica 1 skipped the collective at scratch/train.py:8 that replicas 0, 2 made: it is "
        "already at a later line of step() (scratch/train.py:11)."
    ) in message.splitlines()
