"""The default replica context's collectives keep a replica's await lifecycle (attack 23h, F2).

Outside any strategy, ``ar.get_replica_context()``'s collectives are the identity. They
made a replica's argument checks, but they were plain coroutines, so four misuses that a
one-replica ``MirroredStrategy`` refuses with a precise error passed:

* two uses of one ``name=`` in flight at once: returned both values;
* a collective created and never awaited: only Python's "coroutine ... was never awaited";
* a collective awaited twice: CPython's bare "cannot reuse already awaited coroutine";
* a collective issued in a worker thread (``asyncio.run`` in ``to_thread``): returned.

Each test here runs one scenario in the default context and in the one replica of a
``MirroredStrategy`` (the same function, so the same call sites) and wants the same
result, or the same error: same class, same message. A collective never awaited has no
replica's end in the default context: it is told by a ``RuntimeWarning`` at the line
that created it, whose text is the run's error's.
"""

from __future__ import annotations

import asyncio
import gc
import pathlib
import re
import warnings
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.to_thread
import numpy as np
import pytest

import asyncreplica as ar
from asyncreplica._runtime import _default

pytestmark = pytest.mark.anyio

Scenario = Callable[[Any], Awaitable[Any]]


def _is_trio(anyio_backend: object) -> bool:
    return anyio_backend == "trio" or (
        isinstance(anyio_backend, tuple) and anyio_backend[0] == "trio"
    )


def _only(error: BaseException) -> BaseException:
    while isinstance(error, BaseExceptionGroup):
        (error,) = error.exceptions
    return error


async def _in_default(scenario: Scenario) -> Any:
    ctx = ar.get_replica_context()
    assert isinstance(ctx, ar.ReplicaContext)
    assert not ar.has_strategy()
    try:
        return await scenario(ctx)
    except Exception as error:
        return error


async def _in_one_replica(scenario: Scenario) -> Any:
    one = ar.MirroredStrategy(["CPU:0"])

    async def step() -> Any:
        return await scenario(ar.get_replica_context())

    try:
        return one.experimental_local_results(await one.run(step))[0]
    except BaseException as error:  # the run failed with the one replica's error
        return _only(error)


def _text(error: BaseException) -> str:
    # A worker thread's name is the pool's (asyncio_0, AnyIO worker thread): not the rule.
    return re.sub(r"the event loop's \([^)]*\)", "the event loop's (THREAD)", str(error))


async def _same(scenario: Scenario) -> tuple[Any, Any]:
    """The scenario's outcome in the default context and in one replica; errors must agree."""
    default = await _in_default(scenario)
    one = await _in_one_replica(scenario)
    if isinstance(one, BaseException):
        assert isinstance(default, BaseException), f"the default context returned {default!r}"
        assert type(default) is type(one), (default, one)
        assert _text(default) == _text(one)
    else:
        assert not isinstance(default, BaseException), default
        assert default == one
    return default, one


# -- the four misuses ----------------------------------------------------------------------


async def _same_name_in_flight(ctx: Any) -> Any:
    first = ctx.all_reduce("sum", 1.0, name="g")
    try:
        second = ctx.all_reduce("sum", 2.0, name="g")
    except ar.CollectiveError:
        first.close()  # (else the default context warns that it was never awaited)
        raise
    return [await first, await second]


async def test_two_uses_of_one_name_in_flight_are_refused() -> None:
    default, _ = await _same(_same_name_in_flight)
    assert isinstance(default, ar.CollectiveError)
    assert "while its collective named 'g' issued earlier" in str(default)
    assert "has not completed" in str(default)


async def test_a_name_in_flight_in_gather_is_refused(anyio_backend: object) -> None:
    if _is_trio(anyio_backend):
        pytest.skip("asyncio.gather")

    async def gather(ctx: Any) -> Any:
        first = ctx.all_reduce("sum", 1.0, name="g")
        try:
            return await asyncio.gather(first, ctx.all_reduce("sum", 2.0, name="g"))
        finally:
            first.close()  # refused before gather took it: it never ran

    default, _ = await _same(gather)
    assert isinstance(default, ar.CollectiveError)


async def _never_awaited(ctx: Any) -> int:
    ctx.all_reduce("sum", 1.0)  # the line the warning names
    return 0


NEVER_AWAITED_LINE = _never_awaited.__code__.co_firstlineno + 1


async def test_a_collective_never_awaited_is_told_with_the_runs_message() -> None:
    one = await _in_one_replica(_never_awaited)
    assert isinstance(one, ar.CollectiveError)
    assert "Replica 0 created 1 collective that it never awaited" in str(one)

    with pytest.warns(RuntimeWarning) as record:
        result = await _in_default(_never_awaited)  # collected unawaited, at once
    assert result == 0
    (warning,) = record.list
    assert str(one) in str(warning.message)  # the run's own text, the call site included
    assert pathlib.Path(warning.filename) == pathlib.Path(__file__)
    assert warning.lineno == NEVER_AWAITED_LINE
    assert "coroutine" not in str(warning.message)  # not Python's own warning


async def _awaited_twice(ctx: Any) -> Any:
    collective = ctx.all_reduce("sum", 1.0)
    await collective
    return await collective


async def test_a_collective_awaited_twice_is_refused() -> None:
    default, _ = await _same(_awaited_twice)
    assert isinstance(default, ar.CollectiveError)
    assert "again, after it completed" in str(default)


async def _issued_in_a_thread(ctx: Any) -> Any:
    return await anyio.to_thread.run_sync(lambda: asyncio.run(ctx.all_reduce("sum", 1.0)))


async def test_a_collective_issued_in_a_worker_thread_is_refused() -> None:
    default, _ = await _same(_issued_in_a_thread)
    assert isinstance(default, ar.ReplicaContextError)
    assert "in a thread other than the event loop's" in str(default)


async def _awaited_in_a_thread(ctx: Any) -> Any:
    collective = ctx.all_reduce("sum", 1.0)

    async def wait() -> Any:
        return await collective

    try:
        return await anyio.to_thread.run_sync(lambda: asyncio.run(wait()))
    finally:
        collective.close()


async def test_a_collective_awaited_in_a_worker_thread_is_refused() -> None:
    default, _ = await _same(_awaited_in_a_thread)
    assert isinstance(default, ar.ReplicaContextError)
    assert "A collective was awaited (" in str(default)


# -- the rest of the lifecycle ---------------------------------------------------------------


async def _out_of_order(ctx: Any) -> Any:
    first = ctx.all_reduce("sum", 1.0)
    second = ctx.all_reduce("sum", 2.0)
    try:
        return [await second, await first]
    finally:
        first.close()
        second.close()


async def _closed_then_awaited(ctx: Any) -> Any:
    collective = ctx.barrier()
    collective.close()
    return await collective


async def _sent_by_hand(ctx: Any) -> Any:
    collective = ctx.all_reduce("sum", 1.0)
    try:
        return collective.send(None)
    finally:
        collective.close()


async def _merge_call_awaited_twice(ctx: Any) -> Any:
    collective = ctx.merge_call(lambda strategy: 1)
    await collective
    return await collective


@pytest.mark.parametrize(
    ("scenario", "words"),
    [
        (_out_of_order, "which it issued earlier and has not awaited"),
        (_closed_then_awaited, "which it closed: a closed collective never runs"),
        (_sent_by_hand, "by hand: only the event loop drives a collective"),
        (_merge_call_awaited_twice, "again, after it completed"),
    ],
    ids=["out_of_order", "closed_then_awaited", "sent_by_hand", "merge_call_awaited_twice"],
)
async def test_the_rest_of_the_lifecycle_is_a_replicas(scenario: Scenario, words: str) -> None:
    default, _ = await _same(scenario)
    assert isinstance(default, ar.CollectiveError)
    assert words in str(default)


# -- correct use: the identity, as before --------------------------------------------------


async def _awaited_once(ctx: Any) -> Any:
    return [
        await ctx.all_reduce("sum", 1.5),
        (await ctx.all_gather(np.array([1.0, 2.0]), 0)).tolist(),
        await ctx.broadcast(3.0),
        (await ctx.reduce_scatter("sum", np.array([4.0, 5.0]))).tolist(),
        await ctx.barrier(),
        await ctx.merge_call(lambda strategy, x: x + 1, args=(6,)),
    ]


async def _two_names_in_flight(ctx: Any) -> Any:
    a = ctx.all_reduce("sum", 1.0, name="a")
    b = ctx.all_reduce("sum", 2.0, name="b")
    return [await b, await a]


async def _one_name_reused_in_turn(ctx: Any) -> Any:
    results = []
    for v in (1.0, 2.0, 3.0):
        results.append(await ctx.all_reduce("sum", v, name="g"))
    closed = ctx.barrier(name="g")
    closed.close()  # a closed collective leaves its name free
    results.append(await ctx.barrier(name="g"))
    return results


async def _unnamed_in_turn(ctx: Any) -> Any:
    a = ctx.all_reduce("sum", 1.0)
    b = ctx.all_reduce("sum", 2.0)
    return [await a, await b]


@pytest.mark.parametrize(
    ("scenario", "expected"),
    [
        (_awaited_once, [1.5, [1.0, 2.0], 3.0, [4.0, 5.0], None, 7]),
        (_two_names_in_flight, [2.0, 1.0]),
        (_one_name_reused_in_turn, [1.0, 2.0, 3.0, None]),
        (_unnamed_in_turn, [1.0, 2.0]),
    ],
    ids=["awaited_once", "two_names_in_flight", "one_name_reused_in_turn", "unnamed_in_turn"],
)
async def test_correct_use_is_accepted_alike(scenario: Scenario, expected: Any) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        default, _ = await _same(scenario)
        gc.collect()
    assert default == expected


async def test_a_default_collective_runs_as_a_task(anyio_backend: object) -> None:
    if _is_trio(anyio_backend):
        pytest.skip("asyncio.gather and create_task take a coroutine object")

    async def tasks(ctx: Any) -> Any:
        first = await asyncio.create_task(ctx.all_reduce("sum", 1.0))
        return [first, *await asyncio.gather(ctx.all_reduce("sum", 2.0), ctx.barrier())]

    default, _ = await _same(tasks)
    assert default == [1.0, 2.0, None]


async def test_the_default_context_is_still_the_identity() -> None:
    ctx = ar.get_replica_context()
    assert ctx is not None
    value = [1.0, 2.0]
    collective = ctx.all_reduce("mean", value, name="x")
    assert isinstance(collective, _default.DefaultCollective)
    assert "not awaited" in repr(collective)
    assert await collective is value
    assert "(awaited)" in repr(collective)


def test_a_new_event_loop_starts_afresh() -> None:
    # A collective left in flight by an earlier loop of this thread does not hold its name.
    ctx = ar.get_replica_context()
    assert ctx is not None
    held: list[Any] = []

    async def leave() -> None:
        held.append(ctx.all_reduce("sum", 1.0, name="left"))

    async def again() -> Any:
        return await ctx.all_reduce("sum", 2.0, name="left")

    asyncio.run(leave())
    assert asyncio.run(again()) == 2.0
    held.pop().close()


def test_a_collective_issued_where_no_event_loop_runs_is_refused() -> None:
    # Its loop's thread is the thread whose event loop runs the code that issues it.
    ctx = ar.get_replica_context()
    assert ctx is not None
    with pytest.raises(ar.ReplicaContextError, match="in a thread other than the event loop's"):
        ctx.all_reduce("sum", 1.0)


async def test_many_names_used_in_turn_are_not_held_for_ever() -> None:
    ctx = ar.get_replica_context()
    assert ctx is not None
    for i in range(3 * _default._NAMES):
        await ctx.barrier(name=f"step {i}")
    assert len(_default._issued().names) <= _default._NAMES + 1


def test_each_message_is_written_once() -> None:
    # One rule, one place: the default context raises _ownership's errors, built there for
    # the run's checks and for it; no module carries a copy of their text.
    package = pathlib.Path(ar.__file__).parent
    phrases = [
        "in a thread other than the event loop's",
        "again, after it completed",
        "that it never awaited:",
        "which it issued earlier and has not awaited",
        "by hand: only the event",
        "which it closed: a closed collective",
        "a collective has one awaiter",
        "Named collectives match by name and use",
    ]
    for phrase in phrases:
        holders = [
            path.relative_to(package).as_posix()
            for path in sorted(package.rglob("*.py"))
            if phrase in path.read_text(encoding="utf-8")
        ]
        assert holders == ["_runtime/_ownership.py"], (phrase, holders)
