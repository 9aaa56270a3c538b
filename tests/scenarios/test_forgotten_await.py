"""A forgotten ``await`` on a collective (brief item 9): caught where it happens, or when the replica ends.

The object a collective call returns refuses ``bool()``, ``float()``, ``int()``, ``complex()``,
``iter()`` and numpy conversion with a ``TypeError`` that asks "did you forget `await`?". A
collective object that a replica created but never awaited is reported when the replica finishes,
as a ``CollectiveError`` saying "never awaited" with the file:line where it was created.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest

import asyncreplica as ar

pytestmark = pytest.mark.anyio

_HERE = Path(__file__)
_SOURCE = _HERE.read_text(encoding="utf-8").splitlines()
FORGOT = re.compile(r"did you forget `await`\?", re.IGNORECASE)
HANG_GUARD = 10.0


def line_of(marker: str) -> int:
    """The number of the one line of this file that ends with the comment ``# @marker``."""
    tag = f"# @{marker}"
    hits = [n for n, text in enumerate(_SOURCE, 1) if text.rstrip().endswith(tag)]
    assert len(hits) == 1, f"marker {marker!r} is on lines {hits}, expected exactly one"
    return hits[0]


def strategy(n: int) -> ar.MirroredStrategy:
    return ar.MirroredStrategy([f"CPU:{i}" for i in range(n)])


def context() -> ar.ReplicaContext:
    ctx = ar.get_replica_context()
    assert ctx is not None
    return ctx


def _merge(strategy: ar.Strategy, value: Any) -> Any:
    return value


# Each collective, called the way a user would, and what awaiting it gives replica `rid` of 2.
COLLECTIVES: dict[str, tuple[Callable[[ar.ReplicaContext, int], Any], Callable[[int], Any]]] = {
    "all_reduce": (
        lambda ctx, rid: ctx.all_reduce("sum", np.full(2, rid + 1.0)),
        lambda rid: np.full(2, 3.0),
    ),
    "all_gather": (
        lambda ctx, rid: ctx.all_gather(np.full(1, float(rid)), axis=0),
        lambda rid: np.array([0.0, 1.0]),
    ),
    "broadcast": (
        lambda ctx, rid: ctx.broadcast(np.full(2, float(rid)), source=1),
        lambda rid: np.full(2, 1.0),
    ),
    "reduce_scatter": (
        lambda ctx, rid: ctx.reduce_scatter("sum", np.arange(4.0), axis=0),
        lambda rid: np.arange(4.0)[2 * rid : 2 * rid + 2] * 2,
    ),
    "barrier": (lambda ctx, rid: ctx.barrier(), lambda rid: None),
    "merge_call": (
        lambda ctx, rid: ctx.merge_call(_merge, args=(float(rid),)),
        lambda rid: float(rid),
    ),
}

CONVERSIONS: dict[str, Callable[[Any], object]] = {
    "bool": bool,
    "float": float,
    "int": int,
    "complex": complex,
    "iter": iter,
    "np.asarray": np.asarray,
}


@pytest.mark.parametrize("conversion", list(CONVERSIONS), ids=list(CONVERSIONS))
@pytest.mark.parametrize("kind", list(COLLECTIVES), ids=list(COLLECTIVES))
async def test_collective_awaitable_refuses_conversion(kind: str, conversion: str) -> None:
    s = strategy(2)
    call, expected = COLLECTIVES[kind]
    convert = CONVERSIONS[conversion]
    outcomes: dict[int, object] = {}

    async def step() -> None:
        ctx = context()
        rid = ctx.replica_id_in_sync_group
        pending = call(ctx, rid)
        try:
            convert(pending)
        except TypeError as exc:
            outcomes[rid] = exc
        else:
            outcomes[rid] = None
        result = await pending  # the program is otherwise correct: the awaitable still works
        if expected(rid) is None:
            assert result is None
        else:
            np.testing.assert_array_equal(result, expected(rid))

    with anyio.fail_after(HANG_GUARD):
        await s.run(step)
    assert sorted(outcomes) == [0, 1]
    for rid, outcome in outcomes.items():
        assert isinstance(outcome, TypeError), f"{conversion}() was accepted on replica {rid}"
        assert FORGOT.search(str(outcome)), str(outcome)


async def test_forgotten_await_in_a_condition_fails_the_run_with_the_type_error() -> None:
    s = strategy(2)

    async def step() -> None:
        ctx = context()
        # A float (booleans are refused when the collective is issued, before the
        # forgotten await could be noticed).
        share = 1.0 / (ctx.replica_id_in_sync_group + 1)
        if ctx.all_reduce("min", share):  # @fa-condition
            await ctx.barrier()

    with anyio.fail_after(HANG_GUARD), pytest.raises(TypeError) as info:
        await s.run(step)
    assert FORGOT.search(str(info.value))
    assert info.value.__traceback__ is not None
    frames = [tb.tb_lineno for tb in _walk(info.value.__traceback__)]
    assert line_of("fa-condition") in frames  # raised where the await is missing


def _walk(tb: Any) -> list[Any]:
    out = []
    while tb is not None:
        out.append(tb)
        tb = tb.tb_next
    return out


async def test_never_awaited_collective_is_reported_when_the_replica_finishes() -> None:
    s = strategy(1)

    async def step() -> None:
        ctx = context()
        ctx.all_reduce("sum", 1.0)  # @fa-dropped

    with anyio.fail_after(HANG_GUARD), pytest.raises(ar.CollectiveError) as info:
        await s.run(step)
    message = str(info.value)
    assert "never awaited" in message
    assert f"test_forgotten_await.py:{line_of('fa-dropped')}" in message
    assert info.value.report is not None


async def test_never_awaited_on_one_replica_while_the_other_waits() -> None:
    s = strategy(2)

    async def step() -> None:
        ctx = context()
        if ctx.replica_id_in_sync_group == 1:
            ctx.all_reduce("sum", 1.0)  # @fa-dropped-one
        else:
            await ctx.all_reduce("sum", 1.0)

    with anyio.fail_after(HANG_GUARD), pytest.raises(ar.CollectiveError) as info:
        await s.run(step)
    message = str(info.value)
    assert "never awaited" in message
    assert f"test_forgotten_await.py:{line_of('fa-dropped-one')}" in message
    # The run is over and the strategy is usable again.

    async def good() -> object:
        return await context().all_reduce("sum", 1.0)

    assert s.experimental_local_results(await s.run(good)) == (2.0, 2.0)


async def test_awaited_collective_is_not_reported() -> None:
    s = strategy(2)

    async def step() -> object:
        ctx = context()
        pending = ctx.all_reduce("sum", 1.0)
        return await pending

    with anyio.fail_after(HANG_GUARD):
        result = await s.run(step)
    assert s.experimental_local_results(result) == (2.0, 2.0)


async def test_of_several_pending_the_unawaited_are_reported_in_the_order_issued() -> None:
    # The newest pending collective is registered apart from the older ones (a flat
    # list slot per replica): the report still lists every unawaited one, oldest first.
    s = strategy(1)

    async def step() -> None:
        ctx = context()
        first = ctx.all_reduce("sum", 1.0)  # @fa-first
        # Named: unnamed collectives must be awaited in the order they were issued.
        second = ctx.all_reduce("sum", 2.0, name="second")  # @fa-second
        third = ctx.all_reduce("sum", 3.0)  # @fa-third
        fourth = ctx.all_reduce("sum", 4.0, name="fourth")  # @fa-fourth
        await fourth
        await second
        fifth = ctx.all_reduce("sum", 5.0)  # @fa-fifth
        del first, third, fifth

    with anyio.fail_after(HANG_GUARD), pytest.raises(ar.CollectiveError) as info:
        await s.run(step)
    message = str(info.value)
    assert "created 3 collectives that it never awaited" in message
    sites = [f"test_forgotten_await.py:{line_of(m)}" for m in ("fa-first", "fa-third", "fa-fifth")]
    found = [message.index(site) for site in sites]
    assert found == sorted(found), message
    for awaited in ("fa-second", "fa-fourth"):
        assert f"test_forgotten_await.py:{line_of(awaited)}" not in message
