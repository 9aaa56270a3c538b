"""Defects found by attack 23g (the eighth round): each test failed before its fix.

G1: an ndarray resized in place while its all_gather was in flight gave every replica a
    result of a size no signature announced (the in-flight check skipped the gather
    axis, and compared each replica with the last arrival's signature); the batch forms
    of all_gather, broadcast and reduce_scatter were not checked at all (a silently wrong
    gather, a BackendError, an InternalError), where all_reduce refused the same resize.
G3: an object with only ``__array__`` was converted two to four times (at issue, again
    when the last replica arrived), and the paths disagreed when the second conversion
    differed: a refusal, a silently accepted value, InternalError, BackendError, numpy's
    raw ValueError, a wrong all_gather; an error of the second conversion was lost or
    blamed on another replica. Now it is converted once, when the replica issues the
    collective (or calls the cross-replica API), and that array is what is combined.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import numpy as np
import pytest

import asyncreplica as ar

pytestmark = pytest.mark.anyio

DEVICES = ["CPU:0", "CPU:1", "CPU:2"]


def strategy(n: int = 2, **kwargs: Any) -> ar.MirroredStrategy:
    return ar.MirroredStrategy(DEVICES[:n], **kwargs)


def _ctx() -> ar.ReplicaContext:
    ctx = ar.get_replica_context()
    assert ctx is not None
    return ctx


def _rid() -> int:
    return int(_ctx().replica_id_in_sync_group)


def _leaf(error: BaseException) -> BaseException:
    while isinstance(error, BaseExceptionGroup):
        error = error.exceptions[0]
    return error


# -- G1: a value resized in flight is refused by every collective, on one rule ----------------

Issue = Callable[[ar.ReplicaContext, np.ndarray], Awaitable[Any]]

ISSUES: dict[str, Issue] = {
    "all_gather": lambda ctx, x: ctx.all_gather(x, 0),
    "all_gather batch": lambda ctx, x: ctx.all_gather([x, np.ones((2, 3))], 0),
    "all_reduce": lambda ctx, x: ctx.all_reduce("sum", x),
    "all_reduce batch": lambda ctx, x: ctx.all_reduce("sum", [x, np.ones(3)]),
    "broadcast": lambda ctx, x: ctx.broadcast(x, 0),
    "broadcast batch": lambda ctx, x: ctx.broadcast([x, np.ones(3)], 0),
    "reduce_scatter": lambda ctx, x: ctx.reduce_scatter("sum", x),
    "reduce_scatter batch": lambda ctx, x: ctx.reduce_scatter("sum", [x, np.ones(4)]),
}


@pytest.mark.parametrize("arrives", ["first", "last"])
@pytest.mark.parametrize("kind", list(ISSUES))
async def test_a_value_resized_in_flight_is_refused_by_every_collective(
    kind: str, arrives: str
) -> None:
    issue = ISSUES[kind]
    peer_arrived = anyio.Event()

    async def step() -> Any:
        ctx = _ctx()
        r = _rid()
        x = np.full(4, float(r + 1))
        pending = issue(ctx, x)
        if r == 1:
            peer_arrived.set()  # replica 1 awaits (arrives) before replica 0 runs again
            return await pending
        if arrives == "last":
            await peer_arrived.wait()
        x.resize((6,), refcheck=False)  # in place, after the issue, before the arrival
        x[:] = 9.0
        return await pending

    with pytest.raises(ValueError, match=r"replica 0's (value|batch) changed while its ") as info:
        await strategy().run(step)
    error = _leaf(info.value)
    assert isinstance(error, ValueError)
    text = str(error)
    assert "was in flight" in text
    assert "leaf 0 was float64[4] when the collective was issued and is float64[6] now" in text


async def test_an_uneven_all_gather_is_held_to_each_replicas_own_size() -> None:
    # Replica 1 issues 2 rows and grows to replica 0's 4 in flight: the last arrival's
    # signature (4 rows) would pass it; its own (2 rows) does not.
    async def step() -> Any:
        ctx = _ctx()
        r = _rid()
        x = np.full(4 if r == 0 else 2, float(r + 1))
        pending = ctx.all_gather(x, 0)
        if r == 1:
            x.resize((4,), refcheck=False)
        return await pending

    with pytest.raises(ValueError, match=r"replica 1's value changed while its all_gather"):
        await strategy().run(step)


async def test_an_uneven_all_gather_left_alone_is_not_refused() -> None:
    async def step() -> Any:
        r = _rid()
        return await _ctx().all_gather([np.full((3 - r, 2), float(r)), np.full(r + 1, float(r))], 0)

    result = await strategy(3).run(step)
    for rows, flat in strategy(3).experimental_local_results(result):
        np.testing.assert_array_equal(rows[:, 0], [0, 0, 0, 1, 1, 2])
        np.testing.assert_array_equal(flat, [0, 1, 1, 2, 2, 2])


# -- G3: a value the backend converts is converted once, when it is issued --------------------


class Lazy:
    """An array-like with only ``__array__``: float64 ones the first time, then ``later``."""

    def __init__(self, later: object, first: Any = None) -> None:
        self.calls = 0
        self.first = np.ones(4) if first is None else first
        self.later = later

    def __array__(self, dtype: object = None, copy: object = None) -> Any:
        self.calls += 1
        if self.calls == 1:
            return self.first
        if isinstance(self.later, BaseException):
            raise self.later
        return self.later


LATER: dict[str, object] = {
    "int64": np.full(4, 7, np.int64),
    "float32": np.full(4, 7, np.float32),
    "float64": np.full(4, 7.0),
    "shape 5": np.full(5, 7.0),
    "shape 2x2": np.full((2, 2), 7.0),
    "raises": ValueError("shard file vanished"),
}

PACK8 = ar.CommunicationOptions(bytes_per_pack=8)

# Replica 0 passes the Lazy value, replica 1 np.ones(4): what each path returns.
IN_REPLICA: dict[str, tuple[Callable[[ar.ReplicaContext, object], Awaitable[Any]], Any]] = {
    "all_reduce": (lambda ctx, v: ctx.all_reduce("sum", v), np.full(4, 2.0)),
    "all_reduce batch": (
        lambda ctx, v: ctx.all_reduce("sum", [np.ones(3), v]),
        [np.full(3, 2.0), np.full(4, 2.0)],
    ),
    "all_reduce bytes_per_pack": (
        lambda ctx, v: ctx.all_reduce("sum", [v, np.ones(3)], options=PACK8),
        [np.full(4, 2.0), np.full(3, 2.0)],
    ),
    "all_reduce nest": (
        lambda ctx, v: ctx.all_reduce("mean", {"g": v, "n": np.ones(2)}),
        {"g": np.ones(4), "n": np.ones(2)},
    ),
    "all_gather": (lambda ctx, v: ctx.all_gather(v, 0), np.ones(8)),
    "broadcast": (lambda ctx, v: ctx.broadcast(v, 0), np.ones(4)),
    "reduce_scatter": (lambda ctx, v: ctx.reduce_scatter("sum", v), np.full(2, 2.0)),
}


def _assert_equal(got: Any, want: Any) -> None:
    if isinstance(want, dict):
        assert isinstance(got, dict)
        assert set(got) == set(want)
        for key in want:
            _assert_equal(got[key], want[key])
    elif isinstance(want, list):
        assert isinstance(got, list)
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            _assert_equal(g, w)
    else:
        assert isinstance(got, np.ndarray)
        assert got.dtype == np.float64
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("later", list(LATER))
@pytest.mark.parametrize("path", list(IN_REPLICA))
async def test_an_array_like_is_converted_once_when_its_collective_is_issued(
    path: str, later: str
) -> None:
    issue, want = IN_REPLICA[path]
    lazy = Lazy(LATER[later])
    peer_issued = anyio.Event()

    async def step() -> Any:
        ctx = _ctx()
        r = _rid()
        if r == 0:
            await peer_issued.wait()
        pending = issue(ctx, lazy if r == 0 else np.ones(4))  # one call site for both
        if r == 1:
            peer_issued.set()
        return await pending  # replica 0 arrives last: it dispatches

    s = strategy()
    results = s.experimental_local_results(await s.run(step))
    assert lazy.calls == 1
    for result in results:
        _assert_equal(result, want)


CROSS: dict[str, tuple[Callable[[ar.Strategy, object], Awaitable[Any]], Any]] = {
    "Strategy.reduce": (
        lambda s, v: s.reduce("sum", ar.PerReplica([v, np.ones(4)]), axis=None),
        np.full(4, 2.0),
    ),
    "Strategy.reduce axis": (
        lambda s, v: s.reduce("mean", ar.PerReplica([v, np.ones(4)]), axis=0),
        np.float64(1.0),
    ),
    "Strategy.reduce plain": (lambda s, v: s.reduce("mean", v, axis=None), np.ones(4)),
    "reduce_to": (
        lambda s, v: s.extended.reduce_to("sum", ar.PerReplica([v, np.ones(4)]), "CPU:0"),
        np.full(4, 2.0),
    ),
    "batch_reduce_to": (
        lambda s, v: s.extended.batch_reduce_to(
            "sum",
            [
                (ar.PerReplica([np.ones(3), np.ones(3)]), "CPU:0"),
                (ar.PerReplica([v, np.ones(4)]), "CPU:0"),
            ],
            options=PACK8,
        ),
        [np.full(3, 2.0), np.full(4, 2.0)],
    ),
    "Strategy.gather": (lambda s, v: s.gather(ar.PerReplica([v, np.ones(4)]), 0), np.ones(8)),
    "broadcast_to": (lambda s, v: s.extended.broadcast_to(v, "CPU:0"), np.ones(4)),
}


@pytest.mark.parametrize("later", list(LATER))
@pytest.mark.parametrize("path", list(CROSS))
async def test_an_array_like_is_converted_once_by_the_cross_replica_apis(
    path: str, later: str
) -> None:
    call, want = CROSS[path]
    lazy = Lazy(LATER[later])
    got = await call(strategy(), lazy)
    assert lazy.calls == 1
    if isinstance(want, list):
        _assert_equal(got, want)
    else:
        np.testing.assert_array_equal(np.asarray(got), want)
        assert np.asarray(got).dtype == np.float64


class Refused:
    """An array-like whose conversion raises the user's own error."""

    def __init__(self) -> None:
        self.calls = 0
        self.error = LookupError("shard file vanished")

    def __array__(self, dtype: object = None, copy: object = None) -> Any:
        self.calls += 1
        raise self.error


def _causes(error: BaseException) -> list[BaseException]:
    chain = []
    cause: BaseException | None = error
    while cause is not None:
        chain.append(cause)
        cause = cause.__cause__
    return chain


@pytest.mark.parametrize("path", list(IN_REPLICA))
async def test_a_conversion_error_at_issue_is_the_refusal_of_the_replica_that_passed_it(
    path: str,
) -> None:
    issue, _ = IN_REPLICA[path]
    refused = Refused()

    async def step() -> Any:
        ctx = _ctx()
        return await issue(ctx, refused if _rid() == 0 else np.ones(4))

    with pytest.raises(TypeError) as info:
        await strategy().run(step)
    error = _leaf(info.value)
    assert refused.calls == 1  # not converted again to find the leaf
    assert "replica 0 passed value" in str(error)
    assert "of type test_attack_eighth_round.Refused" in str(error)
    assert "LookupError: shard file vanished" in str(error)
    assert refused.error in _causes(error)  # the user's own error, kept
    assert "(raised in replica 0 of 2 in MirroredStrategy.run)" in getattr(error, "__notes__", [])


@pytest.mark.parametrize(
    "path", [p for p in CROSS if p not in ("Strategy.reduce plain", "broadcast_to")]
)
async def test_a_conversion_error_in_a_cross_replica_api_names_the_component(path: str) -> None:
    call, _ = CROSS[path]
    refused = Refused()
    with pytest.raises(TypeError, match="LookupError: shard file vanished") as info:
        await call(strategy(), refused)
    assert refused.calls == 1
    assert refused.error in _causes(info.value)
    assert "(in replica 0's component of the distributed value)" in info.value.__notes__


class Holder:
    """An array-like that hands out its own array: the converted array is the user's."""

    def __init__(self) -> None:
        self.array = np.ones(4)

    def __array__(self, dtype: object = None, copy: object = None) -> Any:
        return self.array


@pytest.mark.parametrize("kind", ["all_gather", "all_reduce", "broadcast", "reduce_scatter"])
async def test_the_converted_array_is_held_to_its_shape_in_flight(kind: str) -> None:
    issue = ISSUES[kind]

    async def step() -> Any:
        ctx = _ctx()
        holder = Holder()
        pending = issue(ctx, holder)  # type: ignore[arg-type]
        if _rid() == 0:
            holder.array.resize((6,), refcheck=False)
        return await pending

    with pytest.raises(ValueError, match=r"is float64\[6\] now"):
        await strategy().run(step)


async def test_indexed_slices_parts_are_converted_once() -> None:
    values = Lazy(np.full((3, 2), 7.0), first=np.ones((1, 2)))

    async def step() -> Any:
        v: object = values if _rid() == 0 else np.ones((1, 2))
        slices = ar.IndexedSlices(v, np.array([_rid()]), (2, 2))
        return await _ctx().all_reduce("sum", slices)

    s = strategy()
    for result in s.experimental_local_results(await s.run(step)):
        np.testing.assert_array_equal(result.values, np.ones((2, 2)))
        np.testing.assert_array_equal(result.indices, [0, 1])
    assert values.calls == 1


async def test_a_bytearray_in_flight_cannot_be_resized() -> None:
    # Converted at issue, it is viewed by the array the collective reads: Python refuses
    # to resize it (BufferError) until the collective is gone, rather than a wrong sum.
    async def step() -> Any:
        data = bytearray(b"\x01\x02")
        pending = _ctx().all_reduce("sum", data)
        if _rid() == 0:
            with pytest.raises(BufferError):
                data.extend(b"\x03")
        return await pending

    s = strategy()
    for result in s.experimental_local_results(await s.run(step)):
        np.testing.assert_array_equal(result, [2, 4])
