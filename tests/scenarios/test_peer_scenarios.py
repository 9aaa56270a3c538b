"""The 25 "bad programs" of reference/peer_detection.md section 5: each raises at once, never hangs.

One test per scenario that applies in one process (scenario 25, cyclic waits across sub-groups,
becomes the wait cycle of named collectives awaited in different orders). Each test builds the
bad program as a user would write it, then pins the exception type, its attributes, the first line
of its message and the bullets that say which replica did what where. Programs that are
legitimately fine (named collectives in any order, closures of one merge_fn) check their results.

Expected call sites are computed from marker comments (``# @name``) in this file, so editing the
file does not break the tests. Where a test needs one replica to arrive last (so that the error
sees every replica), that replica awaits ``anyio.wait_all_tasks_blocked()`` first: ordering by
the scheduler's knowledge, never by sleeping.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest
from _clocks import trio_on_autojump_clock

import asyncreplica as ar
from asyncreplica._core._ledger import ReplicaRow, ReplicaState

pytestmark = pytest.mark.anyio

_HERE = Path(__file__)
_SOURCE = _HERE.read_text(encoding="utf-8").splitlines()
_FILE = f"{_HERE.parent.name}/{_HERE.name}"  # how call sites print: the last two components
HANG_GUARD = 10.0  # seconds; every scenario must end long before this


# -- helpers -----------------------------------------------------------------------------------


def line_of(marker: str) -> int:
    """The number of the one line of this file that ends with the comment ``# @marker``."""
    tag = f"# @{marker}"
    hits = [n for n, text in enumerate(_SOURCE, 1) if text.rstrip().endswith(tag)]
    assert len(hits) == 1, f"marker {marker!r} is on lines {hits}, expected exactly one"
    return hits[0]


def at(marker: str) -> str:
    """The call site of the marked line as messages print it: ``scenarios/test_...py:42``."""
    return f"{_FILE}:{line_of(marker)}"


def replicas(ids: Iterable[int]) -> str:
    """``replica 2`` / ``replicas 0, 2`` / ``replicas 0-3``, as messages group replicas."""
    ordered = sorted(ids)
    if len(ordered) == 1:
        return f"replica {ordered[0]}"
    spans: list[str] = []
    start = prev = ordered[0]
    for i in [*ordered[1:], None]:
        if i is not None and i == prev + 1:
            prev = i
            continue
        spans.extend([f"{start}-{prev}"] if prev - start >= 2 else map(str, range(start, prev + 1)))
        if i is not None:
            start = prev = i
    return "replicas " + ", ".join(spans)


def strategy(n: int, **kwargs: Any) -> ar.MirroredStrategy:
    return ar.MirroredStrategy([f"CPU:{i}" for i in range(n)], **kwargs)


def context() -> ar.ReplicaContext:
    ctx = ar.get_replica_context()
    assert ctx is not None
    return ctx


def first_line(error: BaseException) -> str:
    return str(error).splitlines()[0]


def assert_first_line(error: BaseException, pattern: str) -> None:
    line = first_line(error)
    assert re.fullmatch(pattern, line), f"first line {line!r} does not match {pattern!r}"


def bullets(error: BaseException) -> list[str]:
    """The ``  * ...`` lines of a message, without the bullet."""
    return [line[4:] for line in str(error).splitlines() if line.startswith("  * ")]


def rows(error: ar.CollectiveError, n: int) -> tuple[ReplicaRow, ...]:
    """The report's rows, checked to be one per replica in replica order."""
    assert error.report is not None
    assert [row.replica_id for row in error.report.rows] == list(range(n))
    return error.report.rows


async def fails(
    s: ar.Strategy,
    step: Callable[..., Any],
    error_type: type[BaseException],
    args: tuple[Any, ...] = (),
) -> Any:
    """Run ``step``; return the error it raised (exactly one, of ``error_type``), under a guard."""
    with anyio.fail_after(HANG_GUARD), pytest.raises(error_type) as info:
        await s.run(step, args=args)
    return info.value


async def assert_usable(s: ar.Strategy) -> None:
    """After any failure, the same strategy runs a correct program correctly."""

    async def good() -> object:
        ctx = context()
        return await ctx.all_reduce("sum", float(ctx.replica_id_in_sync_group + 1))

    n = s.num_replicas_in_sync
    with anyio.fail_after(HANG_GUARD):
        result = await s.run(good)
    assert s.experimental_local_results(result) == (n * (n + 1) / 2,) * n


arrive_last = anyio.wait_all_tasks_blocked  # every other replica is parked (or done) first


# -- 1-3: a collective under a condition --------------------------------------------------------


async def test_s01_conditional_all_reduce_is_an_extra_call_before_the_common_all_gather() -> None:
    s = strategy(4)
    m = np.ones(4, np.float32)

    async def step() -> None:
        ctx = context()
        if ctx.replica_id_in_sync_group == 0:
            await arrive_last()
            await ctx.all_reduce("sum", m)  # @s01-extra
        await ctx.all_gather(m, axis=0)  # @s01-gather

    error = await fails(s, step, ar.CollectiveMismatchError)
    assert error.position == 0
    assert error.fields[0] == "kind"
    assert "call site" in error.fields
    assert_first_line(
        error,
        r"Replicas disagree about their 1st collective \(position 0\): kind, .*call site differ\.",
    )
    assert f"replicas 1-3 called all_gather(axis=0) on float32[4] at {at('s01-gather')}" in bullets(
        error
    )
    assert f"replica 0 called all_reduce(SUM) on float32[4] at {at('s01-extra')}" in bullets(error)
    # The outlier's line comes first in the same function: it made an extra call (brief item 6).
    assert f"replica 0 made an extra collective at {at('s01-extra')}" in str(error)
    report = rows(error, 4)
    assert [row.call_site.lineno for row in report if row.call_site] == [
        line_of("s01-extra"),
        *[line_of("s01-gather")] * 3,
    ]
    assert {row.state for row in report} == {ReplicaState.WAITING}
    await assert_usable(s)


async def test_s02_conditional_barrier_while_the_others_return() -> None:
    s = strategy(4)
    x = np.ones(4, np.float32)

    async def step() -> None:
        ctx = context()
        await ctx.all_reduce("sum", x)  # @s02-reduce
        if ctx.replica_id_in_sync_group == 0:
            await ctx.barrier()  # @s02-barrier

    error = await fails(s, step, ar.ReplicaExitedError)
    assert error.replica_id in {1, 2, 3}
    assert error.position == 1
    assert error.waiting == frozenset({0})
    assert_first_line(
        error,
        rf"Replica {error.replica_id} finished after 1 collective, but replica 0 is waiting at "
        r"its 2nd collective \(position 1\)\.",
    )
    assert f"replica 0 called barrier() at {at('s02-barrier')}" in bullets(error)
    assert (
        f"replica {error.replica_id} returned after all_reduce(SUM) on float32[4] at "
        f"{at('s02-reduce')}"
    ) in bullets(error)
    report = rows(error, 4)
    assert report[0].state is ReplicaState.WAITING
    assert report[0].position == 1
    assert report[0].call_site is not None
    assert report[0].call_site.lineno == line_of("s02-barrier")
    assert report[error.replica_id].state is ReplicaState.FINISHED
    await assert_usable(s)


async def test_s03_skipped_collective_whose_successor_looks_the_same() -> None:
    s = strategy(4)
    x = np.ones(4, np.float32)

    async def step() -> None:
        ctx = context()
        if ctx.replica_id_in_sync_group != 1:
            await ctx.all_reduce("sum", x)  # @s03-first
        else:
            await arrive_last()
        await ctx.all_reduce("sum", x)  # @s03-second

    error = await fails(s, step, ar.CollectiveMismatchError)
    assert error.position == 0
    assert error.fields == ("call site",)
    assert set(error.signatures) == {0, 1, 2, 3}
    assert_first_line(
        error, r"Replicas disagree about their 1st collective \(position 0\): call site differs\."
    )
    assert f"replicas 0, 2, 3 called all_reduce(SUM) on float32[4] at {at('s03-first')}" in bullets(
        error
    )
    assert f"replica 1 called all_reduce(SUM) on float32[4] at {at('s03-second')}" in bullets(error)
    # The outlier's line comes later in the same function: it missed one (brief item 6).
    assert f"replica 1 skipped the collective at {at('s03-first')}" in str(error)
    assert rows(error, 4)[1].history[-1][1].call_site.lineno == line_of("s03-second")
    await assert_usable(s)


async def test_s03_without_call_site_checks_the_skip_still_cannot_hang() -> None:
    s = strategy(2, check_call_sites=False)
    x = np.ones(4, np.float32)

    async def step() -> None:
        ctx = context()
        if ctx.replica_id_in_sync_group == 0:
            await ctx.all_reduce("sum", x)  # @s03-off-first
        await ctx.all_reduce("sum", x)  # @s03-off-second

    # Position 0 pairs replica 0's first call with replica 1's only one; replica 1 then returns.
    error = await fails(s, step, ar.ReplicaExitedError)
    assert (error.replica_id, error.position, error.waiting) == (1, 1, frozenset({0}))
    assert_first_line(
        error,
        r"Replica 1 finished after 1 collective, but replica 0 is waiting at its 2nd collective "
        r"\(position 1\)\.",
    )
    assert f"replica 0 called all_reduce(SUM) on float32[4] at {at('s03-off-second')}" in bullets(
        error
    )


# -- 4-5: swapped order -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("size_b", "fields"),
    [
        pytest.param(8, ("shape", "call site"), id="s04-different-shapes"),
        pytest.param(4, ("call site",), id="s05-same-shapes"),
    ],
)
async def test_s04_s05_swapped_order(size_b: int, fields: tuple[str, ...]) -> None:
    s = strategy(2)
    a = np.ones(4, np.float32)
    b = np.ones(size_b, np.float32)

    async def step() -> None:
        ctx = context()
        if ctx.replica_id_in_sync_group == 0:
            await ctx.all_reduce("sum", a)  # @s04-r0-first
            await ctx.all_reduce("sum", b)  # @s04-r0-second
        else:
            await ctx.all_reduce("sum", b)  # @s04-r1-first
            await ctx.all_reduce("sum", a)  # @s04-r1-second

    error = await fails(s, step, ar.CollectiveMismatchError)
    assert error.position == 0
    assert error.fields == fields
    assert_first_line(
        error,
        rf"Replicas disagree about their 1st collective \(position 0\): "
        rf"{re.escape(', '.join(fields))} differs?\.",
    )
    assert bullets(error)[:2] == [
        f"replica 0 called all_reduce(SUM) on float32[4] at {at('s04-r0-first')}",
        f"replica 1 called all_reduce(SUM) on float32[{size_b}] at {at('s04-r1-first')}",
    ]
    # Told as a swap (each branch goes on with the other's call), not as an extra call.
    assert (
        f"replica 1 issues the same collectives as replica 0 in a different order: replica 1 calls "
        f"{at('s04-r1-first')} then {at('s04-r1-second')} (the same call as {at('s04-r0-first')}); "
        f"replica 0 calls {at('s04-r0-first')} then {at('s04-r0-second')} (the same call as "
        f"{at('s04-r1-first')})."
    ) in str(error).splitlines()
    assert "extra collective" not in str(error)
    await assert_usable(s)


async def _grads(ctx: ar.ReplicaContext, g: np.ndarray) -> object:
    return await ctx.all_reduce("sum", g)


async def _loss(ctx: ar.ReplicaContext, loss: float) -> object:
    return await ctx.all_reduce("mean", loss)


async def test_s04_swapped_order_through_helpers_is_told_as_a_swap() -> None:
    """The swap is told at the step's lines that call the helpers, as for inline calls."""
    s = strategy(2)
    g = np.ones(3)

    async def step() -> None:
        ctx = context()
        if ctx.replica_id_in_sync_group == 0:
            await _grads(ctx, g)  # @helper-r0-first
            await _loss(ctx, 2.0)  # @helper-r0-second
        else:
            await _loss(ctx, 2.0)  # @helper-r1-first
            await _grads(ctx, g)  # @helper-r1-second

    error = await fails(s, step, ar.CollectiveMismatchError)
    assert (
        f"replica 1 issues the same collectives as replica 0 in a different order: replica 1 calls "
        f"{at('helper-r1-first')} then {at('helper-r1-second')} (the same call as "
        f"{at('helper-r0-first')}); replica 0 calls {at('helper-r0-first')} then "
        f"{at('helper-r0-second')} (the same call as {at('helper-r1-first')})."
    ) in str(error).splitlines()
    assert "extra collective" not in str(error)
    await assert_usable(s)


async def test_s05_named_collectives_in_swapped_order_are_fine_when_issued_together() -> None:
    s = strategy(3)
    results: dict[tuple[int, str], Any] = {}

    async def reduce_named(ctx: ar.ReplicaContext, name: str, value: np.ndarray) -> None:
        results[ctx.replica_id_in_sync_group, name] = await ctx.all_reduce("sum", value, name=name)

    async def step() -> None:
        ctx = context()
        rid = ctx.replica_id_in_sync_group
        values = {"a": np.full(4, rid + 1.0), "b": np.full(8, 10.0 * (rid + 1))}
        order = ["b", "a"] if rid == 1 else ["a", "b"]
        async with anyio.create_task_group() as tg:
            for name in order:
                tg.start_soon(reduce_named, ctx, name, values[name])

    with anyio.fail_after(HANG_GUARD):
        await s.run(step)
    assert sorted(results) == [(r, name) for r in range(3) for name in "ab"]
    for (_, name), value in results.items():
        expected = np.full(4, 6.0) if name == "a" else np.full(8, 60.0)
        np.testing.assert_array_equal(value, expected)


# -- 6-9: same collective, different arguments ----------------------------------------------------


async def test_s06_shape_depends_on_the_replica_batch() -> None:
    s = strategy(4)

    async def step() -> None:
        ctx = context()
        rid = ctx.replica_id_in_sync_group
        batch = np.ones((3, 5 if rid == 2 else 4), np.float32)
        if rid == 2:
            await arrive_last()
        await ctx.all_reduce("sum", batch.sum(0))  # @s06-reduce

    error = await fails(s, step, ar.CollectiveMismatchError)
    assert error.position == 0
    assert error.fields == ("shape",)
    assert_first_line(
        error, r"Replicas disagree about their 1st collective \(position 0\): shape differs\."
    )
    assert bullets(error)[:2] == [
        f"replicas 0, 1, 3 called all_reduce(SUM) on float32[4] at {at('s06-reduce')}",
        f"replica 2 called all_reduce(SUM) on float32[5] at {at('s06-reduce')}",
    ]
    assert [sig.leaves[0].shape for _, sig in sorted(error.signatures.items())] == [
        (4,),
        (4,),
        (5,),
        (4,),
    ]


async def test_s07_autocast_branch_changes_the_dtype() -> None:
    s = strategy(3)

    async def step() -> None:
        ctx = context()
        autocast = ctx.replica_id_in_sync_group == 1
        grad = np.ones(4, np.float16 if autocast else np.float32)
        if autocast:
            await arrive_last()
        await ctx.all_reduce("sum", grad)  # @s07-reduce

    error = await fails(s, step, ar.CollectiveMismatchError)
    assert error.position == 0
    assert error.fields == ("dtype",)
    assert_first_line(
        error, r"Replicas disagree about their 1st collective \(position 0\): dtype differs\."
    )
    assert bullets(error)[:2] == [
        f"replicas 0, 2 called all_reduce(SUM) on float32[4] at {at('s07-reduce')}",
        f"replica 1 called all_reduce(SUM) on float16[4] at {at('s07-reduce')}",
    ]


@pytest.mark.parametrize("other_op", ["mean", "max"], ids=["sum-vs-mean", "sum-vs-max"])
async def test_s08_reduce_op_differs(other_op: str) -> None:
    s = strategy(2)

    async def step() -> None:
        ctx = context()
        op = other_op if ctx.replica_id_in_sync_group == 1 else "sum"
        await ctx.all_reduce(op, np.ones(4, np.float32))  # @s08-reduce

    error = await fails(s, step, ar.CollectiveMismatchError)
    assert error.position == 0
    assert error.fields == ("reduce op",)
    assert_first_line(
        error, r"Replicas disagree about their 1st collective \(position 0\): reduce op differs\."
    )
    assert sorted(bullets(error)[:2]) == [
        f"replica 0 called all_reduce(SUM) on float32[4] at {at('s08-reduce')}",
        f"replica 1 called all_reduce({other_op.upper()}) on float32[4] at {at('s08-reduce')}",
    ]


async def test_s09_broadcast_source_differs() -> None:
    s = strategy(3)

    async def step() -> None:
        ctx = context()
        rid = ctx.replica_id_in_sync_group
        if rid == 1:
            await arrive_last()
        await ctx.broadcast(np.ones(4, np.float32), source=rid % 2)  # @s09-broadcast

    error = await fails(s, step, ar.CollectiveMismatchError)
    assert error.position == 0
    assert error.fields == ("source",)
    assert_first_line(
        error, r"Replicas disagree about their 1st collective \(position 0\): source differs\."
    )
    assert bullets(error)[:2] == [
        f"replicas 0, 2 called broadcast(source=0) on float32[4] at {at('s09-broadcast')}",
        f"replica 1 called broadcast(source=1) on float32[4] at {at('s09-broadcast')}",
    ]


# -- 10-12: different collectives at one position -------------------------------------------------


def _apply_gradients(strategy: ar.Strategy, grad: Any) -> Any:
    return grad


def _skip_gradients(strategy: ar.Strategy, grad: Any) -> None:
    return None


async def test_s10_merge_call_on_one_replica_all_reduce_on_the_other() -> None:
    s = strategy(2)
    grad = np.ones(4, np.float32)

    async def step() -> None:
        ctx = context()
        if ctx.replica_id_in_sync_group == 0:
            await ctx.merge_call(_apply_gradients, args=(grad,))  # @s10-merge
        else:
            await ctx.all_reduce("sum", grad)  # @s10-reduce

    error = await fails(s, step, ar.CollectiveMismatchError)
    assert error.position == 0
    assert error.fields[0] == "kind"
    assert {"merge_fn", "call site"} <= set(error.fields)
    assert_first_line(
        error,
        r"Replicas disagree about their 1st collective \(position 0\): kind(, .*)? differs?\.",
    )
    assert sorted(bullets(error)[:2]) == [
        f"replica 0 called merge_call(_apply_gradients) at {at('s10-merge')}",
        f"replica 1 called all_reduce(SUM) on float32[4] at {at('s10-reduce')}",
    ]


async def test_s11_different_merge_fn() -> None:
    s = strategy(2)

    async def step() -> None:
        ctx = context()
        grad = np.full(4, np.nan if ctx.replica_id_in_sync_group == 1 else 1.0)
        merge_fn = _apply_gradients if np.all(np.isfinite(grad)) else _skip_gradients
        await ctx.merge_call(merge_fn, args=(grad,))  # @s11-merge

    error = await fails(s, step, ar.CollectiveMismatchError)
    assert error.position == 0
    assert error.fields == ("merge_fn",)
    assert_first_line(
        error, r"Replicas disagree about their 1st collective \(position 0\): merge_fn differs\."
    )
    assert sorted(bullets(error)[:2]) == [
        f"replica 0 called merge_call(_apply_gradients) at {at('s11-merge')}",
        f"replica 1 called merge_call(_skip_gradients) at {at('s11-merge')}",
    ]


async def test_s11_closures_of_one_merge_fn_match_and_replica_0s_runs() -> None:
    s = strategy(2)

    def make_merge_fn(scale: object) -> Callable[..., Any]:
        def merge_fn(strategy: ar.Strategy, value: Any) -> Any:
            return scale, strategy.experimental_local_results(value)

        return merge_fn

    shared = np.float32(10)  # the same value on every replica: the closures match

    async def step() -> Any:
        ctx = context()
        rid = ctx.replica_id_in_sync_group
        return await ctx.merge_call(make_merge_fn(shared), args=(float(rid),))

    with anyio.fail_after(HANG_GUARD):
        result = await s.run(step)
    assert result == (10, (0.0, 1.0))  # TF semantics: replica 0's closure, run once


async def test_s11_closures_over_different_plain_values_are_a_mismatch() -> None:
    """Replica 0's closure runs for all: a bound value that differs would be dropped."""
    s = strategy(2)

    def make_merge_fn(scale: int) -> Callable[..., Any]:
        def merge_fn(strategy: ar.Strategy, value: Any) -> Any:
            return scale, strategy.experimental_local_results(value)

        return merge_fn

    async def step() -> Any:
        ctx = context()
        rid = ctx.replica_id_in_sync_group
        return await ctx.merge_call(make_merge_fn(10 + rid), args=(float(rid),))

    error = await fails(s, step, ar.CollectiveMismatchError)
    assert error.fields == ("merge_fn",)
    assert "  * replica 0: scale=10\n  * replica 1: scale=11" in str(error)


_VALUE = np.arange(6, dtype=np.float32)
_DESCRIBE = {
    "all_reduce": "all_reduce(SUM) on float32[6]",
    "all_gather": "all_gather(axis=0) on float32[6]",
    "broadcast": "broadcast(source=0) on float32[6]",
    "reduce_scatter": "reduce_scatter(SUM, axis=0) on float32[6]",
    "barrier": "barrier()",
}


async def issue(ctx: ar.ReplicaContext, kind: str) -> Any:
    """A helper the step calls: the call path has two frames (here, then the step)."""
    if kind == "all_reduce":
        return await ctx.all_reduce("sum", _VALUE)  # @issue-all_reduce
    if kind == "all_gather":
        return await ctx.all_gather(_VALUE, axis=0)  # @issue-all_gather
    if kind == "broadcast":
        return await ctx.broadcast(_VALUE, source=0)  # @issue-broadcast
    if kind == "reduce_scatter":
        return await ctx.reduce_scatter("sum", _VALUE, axis=0)  # @issue-reduce_scatter
    return await ctx.barrier()  # @issue-barrier


@pytest.mark.parametrize(
    ("majority", "outlier"),
    [
        ("all_reduce", "all_gather"),
        ("all_reduce", "broadcast"),
        ("all_gather", "broadcast"),
        ("reduce_scatter", "all_reduce"),
        ("broadcast", "barrier"),
    ],
    ids=lambda kind: kind,
)
async def test_s12_collective_kinds_differ(majority: str, outlier: str) -> None:
    s = strategy(3)

    async def step() -> None:
        ctx = context()
        is_outlier = ctx.replica_id_in_sync_group == 1
        if is_outlier:
            await arrive_last()
        await issue(ctx, outlier if is_outlier else majority)  # @s12-call

    error = await fails(s, step, ar.CollectiveMismatchError)
    assert error.position == 0
    assert error.fields[0] == "kind"
    assert "call site" in error.fields
    assert_first_line(
        error,
        r"Replicas disagree about their 1st collective \(position 0\): kind(, .*)? differs?\.",
    )
    assert bullets(error)[:2] == [
        f"replicas 0, 2 called {_DESCRIBE[majority]} at {at('issue-' + majority)} <- {at('s12-call')}",
        f"replica 1 called {_DESCRIBE[outlier]} at {at('issue-' + outlier)} <- {at('s12-call')}",
    ]
    sites = [row.signature.call_path for row in rows(error, 3) if row.signature is not None]
    assert [[site.function for site in path] for path in sites] == [["issue", "step"]] * 3


# -- 13-16: replicas that return early or late --------------------------------------------------


def mean_loss(batch: np.ndarray) -> np.floating[Any] | None:
    return None if len(batch) == 0 else batch.mean()


async def test_s13_early_return_on_an_empty_last_shard() -> None:
    s = strategy(4)
    # 6 examples over 4 replicas: shards of 2, 2, 2 and 0 (replica 3 gets an empty batch).
    (batch,) = s.experimental_distribute_dataset([np.arange(6, dtype=np.float64)])

    async def step(batch: np.ndarray) -> Any:
        ctx = context()
        loss = mean_loss(batch)
        if loss is None:
            return None
        return await ctx.all_reduce("sum", loss)  # @s13-reduce

    error = await fails(s, step, ar.ReplicaExitedError, args=(batch,))
    assert error.replica_id == 3
    assert error.position == 0
    assert error.waiting
    assert error.waiting <= {0, 1, 2}
    waiting = replicas(error.waiting)
    assert_first_line(
        error,
        rf"Replica 3 finished after 0 collectives, but {waiting} (is|are) waiting at "
        r"(its|their) 1st collective \(position 0\)\.",
    )
    assert bullets(error) == [
        f"{waiting} called all_reduce(SUM) on float64[] at {at('s13-reduce')}",
        "replica 3 returned without making any collective",
    ]
    report = rows(error, 4)
    assert report[3].state is ReplicaState.FINISHED
    assert (report[3].position, report[3].history) == (0, ())


async def test_s14_exception_in_one_replica_while_the_others_wait() -> None:
    s = strategy(4)
    boom = ValueError("corrupt record in shard 2")
    cancelled: list[int] = []

    async def step() -> None:
        ctx = context()
        rid = ctx.replica_id_in_sync_group
        await ctx.all_reduce("sum", 1.0)
        if rid == 2:
            await arrive_last()  # the others wait at the 2nd collective
            raise boom
        try:
            await ctx.all_reduce("sum", 2.0)
        except anyio.get_cancelled_exc_class():
            cancelled.append(rid)
            raise

    with anyio.fail_after(HANG_GUARD), pytest.raises(ValueError, match=r"^corrupt record") as info:
        await s.run(step)
    assert info.value is boom  # the root cause itself, not a CollectiveError or a group
    assert not isinstance(info.value, ar.CollectiveError)
    assert info.value.__notes__ == ["(raised in replica 2 of 4 in MirroredStrategy.run)"]
    assert sorted(cancelled) == [0, 1, 3]
    await assert_usable(s)


async def test_s15_extra_collective_on_replica_0_after_the_others_returned() -> None:
    s = strategy(2)

    async def step() -> None:
        ctx = context()
        rid = ctx.replica_id_in_sync_group
        loss = float(rid)
        await ctx.all_reduce("sum", loss)  # @s15-train
        if rid == 0:  # "is_global_zero": log a metric on the main replica only
            await arrive_last()  # replica 1 has returned
            await ctx.all_reduce("mean", loss)  # @s15-extra

    error = await fails(s, step, ar.ReplicaExitedError)
    assert (error.replica_id, error.position, error.waiting) == (1, 1, frozenset({0}))
    assert_first_line(
        error,
        r"Replica 1 finished after 1 collective, but replica 0 is waiting at its 2nd collective "
        r"\(position 1\)\.",
    )
    assert bullets(error) == [
        f"replica 0 called all_reduce(MEAN) on float64[] at {at('s15-extra')}",
        f"replica 1 returned after all_reduce(SUM) on float64[] at {at('s15-train')}",
    ]
    report = rows(error, 2)
    assert (report[0].state, report[0].position) == (ReplicaState.WAITING, 1)
    assert (report[1].state, report[1].position) == (ReplicaState.FINISHED, 1)
    await assert_usable(s)


async def test_s16_loop_trip_count_depends_on_the_shard() -> None:
    s = strategy(2)
    shards = s.experimental_distribute_values_from_function(
        lambda vc: np.ones((6 if vc.replica_id_in_sync_group == 0 else 4, 2))
    )

    async def step(shard: np.ndarray) -> None:
        ctx = context()
        for batch in shard:
            await ctx.all_reduce("sum", batch)  # @s16-loop

    error = await fails(s, step, ar.ReplicaExitedError, args=(shards,))
    assert (error.replica_id, error.position, error.waiting) == (1, 4, frozenset({0}))
    assert_first_line(
        error,
        r"Replica 1 finished after 4 collectives, but replica 0 is waiting at its 5th collective "
        r"\(position 4\)\.",
    )
    assert bullets(error) == [
        f"replica 0 called all_reduce(SUM) on float64[2] at {at('s16-loop')}",
        f"replica 1 returned after all_reduce(SUM) on float64[2] at {at('s16-loop')}",
    ]
    report = rows(error, 2)
    assert [pos for pos, _ in report[0].history] == [0, 1, 2, 3, 4]
    assert [pos for pos, _ in report[1].history] == [0, 1, 2, 3]
    assert {sig.call_site.lineno for row in report for _, sig in row.history if sig.call_site} == {
        line_of("s16-loop")
    }


# -- 17-18: nests ---------------------------------------------------------------------------------


async def test_s17_dict_keys_differ() -> None:
    s = strategy(3)

    async def step() -> None:
        ctx = context()
        has_aux = ctx.replica_id_in_sync_group != 1
        loss, aux = np.float32(1.0), np.float32(0.5)
        if not has_aux:
            await arrive_last()
        await ctx.all_reduce("sum", {"loss": loss, **({"aux": aux} if has_aux else {})})  # @s17

    error = await fails(s, step, ar.CollectiveMismatchError)
    assert error.position == 0
    assert error.fields[0] == "structure"
    assert_first_line(
        error,
        r"Replicas disagree about their 1st collective \(position 0\): structure(, .*)? differs?\.",
    )
    assert bullets(error)[:2] == [
        f"replicas 0, 2 called all_reduce(SUM) on {{'aux': float32[], 'loss': float32[]}} at {at('s17')}",
        f"replica 1 called all_reduce(SUM) on {{'loss': float32[]}} at {at('s17')}",
    ]


async def test_s18_one_deep_leaf_shape_differs() -> None:
    s = strategy(2)

    async def step() -> None:
        ctx = context()
        rid = ctx.replica_id_in_sync_group
        grads = {"layer1": {"w": np.ones((4, 8))}, "layer3": {"w": np.ones((8, 8 + rid))}}
        if rid == 1:
            await arrive_last()
        await ctx.all_reduce("sum", grads)  # @s18-reduce

    error = await fails(s, step, ar.CollectiveMismatchError)
    assert error.position == 0
    assert error.fields == ("shape",)
    assert_first_line(
        error, r"Replicas disagree about their 1st collective \(position 0\): shape differs\."
    )
    nest = "{{'layer1': {{'w': float64[4,8]}}, 'layer3': {{'w': float64[8,{}]}}}}"
    assert bullets(error)[:2] == [
        f"replica 0 called all_reduce(SUM) on {nest.format(8)} at {at('s18-reduce')}",
        f"replica 1 called all_reduce(SUM) on {nest.format(9)} at {at('s18-reduce')}",
    ]


# -- 19-21: data-dependent collectives --------------------------------------------------------------


_EXPERTS = [np.full((1, 3), float(e)) for e in range(3)]
_ROUTES = {0: [0, 2], 1: [1]}


async def test_s19_number_of_collectives_depends_on_routing() -> None:
    s = strategy(2)

    async def step() -> None:
        ctx = context()
        for expert in _ROUTES[ctx.replica_id_in_sync_group]:
            await ctx.all_gather(_EXPERTS[expert], axis=0)  # @s19-gather

    error = await fails(s, step, ar.ReplicaExitedError)
    assert (error.replica_id, error.position, error.waiting) == (1, 1, frozenset({0}))
    assert_first_line(
        error,
        r"Replica 1 finished after 1 collective, but replica 0 is waiting at its 2nd collective "
        r"\(position 1\)\.",
    )
    assert bullets(error) == [
        f"replica 0 called all_gather(axis=0) on float64[1,3] at {at('s19-gather')}",
        f"replica 1 returned after all_gather(axis=0) on float64[1,3] at {at('s19-gather')}",
    ]


async def test_s19_fixed_by_agreeing_on_the_count_first() -> None:
    s = strategy(2)

    async def step() -> list[Any]:
        ctx = context()
        routed = _ROUTES[ctx.replica_id_in_sync_group]
        count = int(await ctx.all_reduce("max", len(routed)))
        padded = [_EXPERTS[e] for e in routed] + [np.zeros((1, 3))] * (count - len(routed))
        return [await ctx.all_gather(p, axis=0) for p in padded]

    with anyio.fail_after(HANG_GUARD):
        result = await s.run(step)
    for gathered in s.experimental_local_results(result):
        assert len(gathered) == 2
        np.testing.assert_array_equal(gathered[0], np.vstack([_EXPERTS[0], _EXPERTS[1]]))
        np.testing.assert_array_equal(gathered[1], np.vstack([_EXPERTS[2], np.zeros((1, 3))]))


@pytest.mark.parametrize(
    ("w3_size", "error_type"),
    [
        pytest.param(2, ar.ReplicaExitedError, id="same-shapes-pair-silently-then-run-out"),
        pytest.param(3, ar.CollectiveMismatchError, id="different-shapes"),
    ],
)
async def test_s20_guarded_reductions_over_a_varying_set(
    w3_size: int, error_type: type[ar.CollectiveError]
) -> None:
    s = strategy(2)

    async def step() -> None:
        ctx = context()
        rid = ctx.replica_id_in_sync_group
        grads = {
            "w1": np.ones(2),
            "w2": None if rid == 1 else np.ones(2),  # unused on replica 1 this step
            "w3": np.ones(w3_size),
        }
        for grad in grads.values():
            if grad is not None:
                await ctx.all_reduce("sum", grad)  # @s20-reduce

    error = await fails(s, step, error_type)
    if error_type is ar.ReplicaExitedError:
        assert (error.replica_id, error.position, error.waiting) == (1, 2, frozenset({0}))
        assert_first_line(
            error,
            r"Replica 1 finished after 2 collectives, but replica 0 is waiting at its 3rd "
            r"collective \(position 2\)\.",
        )
        assert f"replica 0 called all_reduce(SUM) on float64[2] at {at('s20-reduce')}" in bullets(
            error
        )
    else:
        assert (error.position, error.fields) == (1, ("shape",))
        assert_first_line(
            error, r"Replicas disagree about their 2nd collective \(position 1\): shape differs\."
        )
        assert sorted(bullets(error)[:2]) == [
            f"replica 0 called all_reduce(SUM) on float64[2] at {at('s20-reduce')}",
            f"replica 1 called all_reduce(SUM) on float64[3] at {at('s20-reduce')}",
        ]


def _buffers(rid: int) -> dict[str, np.ndarray]:
    return {"bias": np.full(3, rid + 1.0), "kernel": np.full((2, 3), 10.0 * (rid + 1))}


def _unordered_names(rid: int) -> list[str]:
    # Stands in for iterating over a set built in a replica-dependent order.
    return ["kernel", "bias"] if rid % 2 else ["bias", "kernel"]


async def test_s21_unordered_names_without_name_are_caught_by_shape() -> None:
    s = strategy(2)

    async def step() -> None:
        ctx = context()
        rid = ctx.replica_id_in_sync_group
        buffers = _buffers(rid)
        for name in _unordered_names(rid):
            await ctx.all_reduce("sum", buffers[name])  # @s21-reduce

    error = await fails(s, step, ar.CollectiveMismatchError)
    assert (error.position, error.fields) == (0, ("shape",))
    assert sorted(bullets(error)[:2]) == [
        f"replica 0 called all_reduce(SUM) on float64[3] at {at('s21-reduce')}",
        f"replica 1 called all_reduce(SUM) on float64[2,3] at {at('s21-reduce')}",
    ]


async def test_s21_unordered_names_with_name_match_by_name() -> None:
    s = strategy(4)
    results: dict[tuple[int, str], Any] = {}

    async def reduce_buffer(ctx: ar.ReplicaContext, name: str, value: np.ndarray) -> None:
        results[ctx.replica_id_in_sync_group, name] = await ctx.all_reduce("sum", value, name=name)

    async def step() -> None:
        ctx = context()
        rid = ctx.replica_id_in_sync_group
        buffers = _buffers(rid)
        async with anyio.create_task_group() as tg:
            for name in _unordered_names(rid):
                tg.start_soon(reduce_buffer, ctx, name, buffers[name])

    with anyio.fail_after(HANG_GUARD):
        await s.run(step)
    assert len(results) == 8
    for (_, name), value in results.items():
        np.testing.assert_array_equal(value, sum(_buffers(r)[name] for r in range(4)))


# -- 22: two collectives in flight in one replica -------------------------------------------------


@pytest.mark.parametrize(
    "first_name", [None, "x"], ids=["unnamed-then-unnamed", "named-then-unnamed"]
)
async def test_s22_unnamed_collective_while_another_is_in_flight(first_name: str | None) -> None:
    s = strategy(2)

    never = anyio.Event()

    async def step() -> None:
        ctx = context()
        if ctx.replica_id_in_sync_group == 1:
            await never.wait()  # still busy: replica 0's first collective stays in flight
        async with anyio.create_task_group() as tg:
            tg.start_soon(functools.partial(ctx.all_reduce, "sum", 1.0, name=first_name))
            await arrive_last()  # the first collective is parked, in flight
            await ctx.all_reduce("sum", 2.0)  # @s22-second

    error = await fails(s, step, ar.CollectiveError)
    assert not isinstance(error, ar.CollectiveMismatchError | ar.ReplicaExitedError)
    assert_first_line(error, r"Replica 0 issued .*in flight.*")
    message = str(error)
    assert at("s22-second") in message
    assert "await each" in message
    assert re.search(r"\bnames?\b|name=", message), message  # the fix: name them
    await assert_usable(s)


# -- 23: alive but busy ---------------------------------------------------------------------------


@trio_on_autojump_clock
async def test_s23_busy_replica_times_out_naming_where_it_waits() -> None:
    timeout = ar.CommunicationOptions(timeout_seconds=0.05)
    s = strategy(4, communication_options=timeout)
    never = anyio.Event()  # a data loader that never delivers

    async def step() -> None:
        ctx = context()
        if ctx.replica_id_in_sync_group == 2:
            await never.wait()  # @s23-busy
        await ctx.all_reduce("sum", np.ones(4, np.float32))  # @s23-reduce

    error = await fails(s, step, ar.CollectiveTimeoutError)
    assert isinstance(error, TimeoutError)
    assert (error.position, error.timeout) == (0, 0.05)
    assert (error.arrived, error.missing) == (frozenset({0, 1, 3}), frozenset({2}))
    assert_first_line(
        error,
        r"Timed out after 0\.05 s waiting for replica 2 at the 1st collective \(position 0\)\.",
    )
    assert bullets(error)[0] == (
        f"replicas 0, 1, 3 called all_reduce(SUM) on float32[4] at {at('s23-reduce')} and waited"
    )
    missing = [b for b in bullets(error) if b.startswith("replica 2 ")]
    assert len(missing) == 1
    # Brief item 5: where the missing replica is awaiting right now, as "file:line in function".
    assert f"test_peer_scenarios.py:{line_of('s23-busy')} in step" in missing[0]
    report = rows(error, 4)
    assert report[2].state is ReplicaState.RUNNING
    assert all(report[r].state is ReplicaState.WAITING for r in (0, 1, 3))
    await assert_usable(s)


class _OnRecord(logging.Handler):
    """Calls ``action`` for each record whose message starts with ``prefix``."""

    def __init__(self, prefix: str, action: Callable[[], object]) -> None:
        super().__init__(logging.WARNING)
        self.prefix, self.action = prefix, action

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith(self.prefix):
            self.action()


@trio_on_autojump_clock
async def test_s23_stall_warning_then_resumed_when_the_busy_replica_arrives(
    caplog: pytest.LogCaptureFixture,
) -> None:
    s = strategy(3, stall_warning_seconds=0.05)
    loaded = anyio.Event()  # set by the stall warning itself: the loader "recovers" after it
    logger = logging.getLogger("asyncreplica")
    handler = _OnRecord("Collective stalled", loaded.set)
    logger.addHandler(handler)

    async def step() -> Any:
        ctx = context()
        if ctx.replica_id_in_sync_group == 1:
            await loaded.wait()  # @s23-stall-busy
        return await ctx.all_reduce("sum", float(ctx.replica_id_in_sync_group))

    try:
        with caplog.at_level(logging.WARNING, logger="asyncreplica"), anyio.fail_after(HANG_GUARD):
            result = await s.run(step)
    finally:
        logger.removeHandler(handler)
    assert s.experimental_local_results(result) == (3.0, 3.0, 3.0)  # a stall never fails the run
    records = [r for r in caplog.records if r.name == "asyncreplica"]
    assert [r.levelno for r in records] == [logging.WARNING, logging.WARNING]
    stalled, resumed = (r.getMessage() for r in records)
    assert re.match(r"^Collective stalled", stalled)
    assert re.match(r"^Collective resumed", resumed)
    assert "replica 1" in stalled
    assert f"test_peer_scenarios.py:{line_of('s23-stall-busy')} in step" in stalled


# -- 24: cancellation from outside ----------------------------------------------------------------


async def _block_in_merge_fn(strategy: ar.Strategy, never: anyio.Event) -> None:
    await never.wait()


@pytest.mark.parametrize("where", ["busy-replica", "inside-merge-fn"])
async def test_s24_cancelling_the_run_from_outside_leaves_nothing_parked(where: str) -> None:
    s = strategy(3)
    never = anyio.Event()
    unwound: list[int] = []

    async def step() -> None:
        ctx = context()
        rid = ctx.replica_id_in_sync_group
        try:
            await ctx.all_reduce("sum", 1.0)
            if where == "busy-replica" and rid == 2:
                await never.wait()
            if where == "inside-merge-fn":
                await ctx.merge_call(_block_in_merge_fn, args=(never,))
            await ctx.all_reduce("sum", 2.0)  # replicas 0 and 1 park here
        finally:
            unwound.append(rid)

    before = len(anyio.get_running_tasks())
    with anyio.fail_after(HANG_GUARD):
        async with anyio.create_task_group() as tg:
            tg.start_soon(functools.partial(s.run, step))
            await anyio.wait_all_tasks_blocked()  # everybody parked or busy
            assert len(anyio.get_running_tasks()) > before
            tg.cancel_scope.cancel()
    assert tg.cancel_scope.cancelled_caught
    assert sorted(unwound) == [0, 1, 2]
    assert len(anyio.get_running_tasks()) == before
    await assert_usable(s)


# -- 25: wait cycle (named collectives awaited in different orders) ------------------------------


@pytest.mark.parametrize(
    "orders",
    [
        pytest.param({0: ["x", "y"], 1: ["y", "x"]}, id="two-replicas"),
        pytest.param({0: ["x", "y", "z"], 1: ["y", "z", "x"], 2: ["z", "x", "y"]}, id="three"),
    ],
)
async def test_s25_named_collectives_awaited_in_different_orders_form_a_wait_cycle(
    orders: dict[int, list[str]],
) -> None:
    n = len(orders)
    s = strategy(n)  # no timeout: the cycle is certain, so it must be reported at once

    async def step() -> None:
        ctx = context()
        for name in orders[ctx.replica_id_in_sync_group]:
            await ctx.all_reduce("sum", 1.0, name=name)  # @s25-wait

    deadlock_error = getattr(ar, "CollectiveDeadlockError", None)
    assert deadlock_error is not None, "ar.CollectiveDeadlockError (brief item 3) is missing"
    assert issubclass(deadlock_error, ar.CollectiveError)
    error = await fails(s, step, deadlock_error)
    cycle = tuple(error.cycle)
    assert len(cycle) >= 2
    assert all(name == orders[rid][0] for rid, name in cycle), cycle
    if n == 2:
        assert sorted(cycle) == [(0, "x"), (1, "y")]
    assert_first_line(error, r"(?i).*\b(deadlock|cycle)\b.*")
    message = str(error)
    for rid, name in cycle:
        assert re.search(rf"\breplicas? [^\n]*\b{rid}\b", message), rid
        assert name in message
    assert at("s25-wait") in message
    assert rows(error, n)[0].state is ReplicaState.WAITING
    await assert_usable(s)


# -- the helpers themselves ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ids", "text"),
    [
        ([2], "replica 2"),
        ([0, 2], "replicas 0, 2"),
        ([0, 1, 2, 3], "replicas 0-3"),
        ([1, 3], "replicas 1, 3"),
    ],
    ids=["one", "two", "span", "gap"],
)
def test_replicas_formatter(ids: list[int], text: str) -> None:
    assert replicas(ids) == text


def test_markers_are_unique_and_found() -> None:
    assert _SOURCE[line_of("s01-extra") - 1].strip().startswith("await ctx.all_reduce")
    with pytest.raises(AssertionError, match="expected exactly one"):
        line_of("no-such-marker")
