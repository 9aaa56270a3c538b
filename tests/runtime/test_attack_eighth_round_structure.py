"""Defects found by attack 23g (the eighth round): each test failed before its fix.

F5: the default replica context (outside any strategy) returned the value of calls that a
    one-replica ``MirroredStrategy`` refuses: an out-of-range ``axis`` for
    ``reduce_scatter``/``all_gather``, a 0-d ``all_gather`` or ``reduce_scatter``,
    ``reduce_scatter`` of ``IndexedSlices``, a SUM of booleans, ``name=1``,
    ``name=float("nan")``. A program written under the default strategy passed them and
    failed on its first run of several replicas. It now makes the very checks a replica's
    context makes (the ``_*_checks`` methods it inherits): the differential tests below
    run each call in both and want the same result, or the same error.
F6: a tuple subclass whose ``__new__`` takes ``*items`` was rebuilt as ``type(s)(items)``
    into a 1-tuple holding the list of items, a nesting level more on every pass, with
    no error. A rebuild that does not give back a container of the type holding exactly
    the items given (each the very object) is now a TypeError naming the type, the
    replica (for a collective) and what to do; list, dict and Mapping rebuilds alike.
"""

from __future__ import annotations

import collections
import collections.abc
import time
import types
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, NamedTuple

import numpy as np
import pytest

import asyncreplica as ar
from asyncreplica._runtime._context import DefaultReplicaContext, ReplicaContext

pytestmark = pytest.mark.anyio

DEVICES = ["CPU:0", "CPU:1", "CPU:2"]


def strategy(n: int = 2) -> ar.MirroredStrategy:
    return ar.MirroredStrategy(DEVICES[:n])


def _errors(error: BaseException) -> list[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        return [e for sub in error.exceptions for e in _errors(sub)]
    return [error]


# -- F5: the default context refuses what a one-replica MirroredStrategy refuses ------------


def _slices(dtype: Any = np.float64) -> ar.IndexedSlices:
    return ar.IndexedSlices(np.ones((1, 2), dtype), np.array([0]), np.array([3, 2]))


def _deep(depth: int) -> Any:
    value: Any = 1.0
    for _ in range(depth):
        value = [value]
    return value


class _Name(str):
    """A str subclass: read as its characters."""


def _merged(strategy: object, *args: Any, **kwargs: Any) -> Any:
    return args, kwargs


class Call(NamedTuple):
    """One call of a replica context's API: ``getattr(ctx, api)(*make(), **kwargs)``.

    ``refused``: whether a one-replica MirroredStrategy refuses it (checked, so that the
    list keeps its bad calls bad and its good calls good).
    """

    api: str
    make: Callable[[], tuple[Any, ...]]
    kwargs: dict[str, Any]
    refused: bool


class New:
    """An argument made anew for each context (a fresh array each time): ``make()``."""

    def __init__(self, make: Callable[[], Any]) -> None:
        self.make = make


def _c(api: str, *args: Any, refused: bool = False, **kwargs: Any) -> Call:
    return Call(
        api, lambda: tuple(a.make() if isinstance(a, New) else a for a in args), kwargs, refused
    )


def ones(*shape: int) -> New:
    return New(lambda: np.ones(shape))


SLICES = New(lambda: _slices())
EMPTY = New(list)


REPLICA_CALLS: dict[str, Call] = {
    # all_reduce
    "all_reduce-array": _c("all_reduce", "sum", ones(2)),
    "all_reduce-mean-int": _c("all_reduce", "mean", New(lambda: np.array([1, 2], np.int32))),
    "all_reduce-pyfloat": _c("all_reduce", "sum", 2.5),
    "all_reduce-pyint": _c("all_reduce", "sum", 2),
    "all_reduce-nest": _c("all_reduce", "sum", New(lambda: {"a": [1.0, (np.ones(2),)], "b": 2})),
    "all_reduce-empty": _c("all_reduce", "sum", EMPTY),
    "all_reduce-slices-mean": _c("all_reduce", "mean", SLICES),
    "all_reduce-name": _c("all_reduce", "sum", 1.0, name="n"),
    "all_reduce-name-str-subclass": _c("all_reduce", "sum", 1.0, name=_Name("n")),
    "all_reduce-options": _c(
        "all_reduce",
        "sum",
        New(lambda: [1.0, 2.0]),
        options=ar.CommunicationOptions(bytes_per_pack=8),
    ),
    "all_reduce-bool": _c("all_reduce", "sum", New(lambda: np.array([True])), refused=True),
    "all_reduce-bool-in-batch": _c(
        "all_reduce", "max", New(lambda: [np.ones(2), np.array([True])]), refused=True
    ),
    "all_reduce-slices-max": _c("all_reduce", "max", SLICES, refused=True),
    "all_reduce-op-bogus": _c("all_reduce", "bogus", 1.0, refused=True),
    "all_reduce-op-int": _c("all_reduce", 1, 1.0, refused=True),
    "all_reduce-str": _c("all_reduce", "sum", "x", refused=True),
    "all_reduce-2**70": _c("all_reduce", "sum", 2**70, refused=True),
    "all_reduce-object": _c("all_reduce", "sum", New(lambda: np.array([1], object)), refused=True),
    "all_reduce-masked": _c(
        "all_reduce", "sum", New(lambda: np.ma.array([1.0, 2.0], mask=[0, 1])), refused=True
    ),
    "all_reduce-name-int": _c("all_reduce", "sum", 1.0, name=1, refused=True),
    "all_reduce-name-nan": _c("all_reduce", "sum", 1.0, name=float("nan"), refused=True),
    "all_reduce-name-and-op": _c("all_reduce", "bogus", 1.0, name=1, refused=True),
    "all_reduce-options-dict": _c("all_reduce", "sum", 1.0, options={}, refused=True),
    "all_reduce-too-deep": _c("all_reduce", "sum", New(lambda: _deep(101)), refused=True),
    # all_gather
    "all_gather-array": _c("all_gather", ones(2), 0),
    "all_gather-axis-1": _c("all_gather", ones(2, 3), 1),
    "all_gather-axis-negative": _c("all_gather", ones(2, 3), -1),
    "all_gather-empty-any-axis": _c("all_gather", EMPTY, 7),
    "all_gather-nest": _c("all_gather", New(lambda: {"a": np.ones(2), "b": [np.ones((1, 2))]}), 0),
    "all_gather-axis-out-of-range": _c("all_gather", ones(2), 3, refused=True),
    "all_gather-axis-below-range": _c("all_gather", ones(2), -2, refused=True),
    "all_gather-0-d": _c("all_gather", New(lambda: np.float64(1.0)), 0, refused=True),
    "all_gather-pyfloat": _c("all_gather", 1.5, 0, refused=True),
    "all_gather-slices": _c("all_gather", SLICES, 0, refused=True),
    "all_gather-axis-str": _c("all_gather", ones(2), "0", refused=True),
    "all_gather-axis-bool": _c("all_gather", ones(2), True, refused=True),
    "all_gather-negative-axis-mixed-ranks": _c(
        "all_gather", New(lambda: [np.ones(2), np.ones((2, 2))]), -1, refused=True
    ),
    "all_gather-str": _c("all_gather", "x", 0, refused=True),
    "all_gather-name-int": _c("all_gather", ones(2), 0, name=1, refused=True),
    "all_gather-options-dict": _c("all_gather", ones(2), 0, options={}, refused=True),
    # broadcast
    "broadcast-array": _c("broadcast", ones(2)),
    "broadcast-pyint": _c("broadcast", 3),
    "broadcast-source-0": _c("broadcast", ones(2), source=0),
    "broadcast-source-1": _c("broadcast", ones(2), source=1, refused=True),
    "broadcast-source-negative": _c("broadcast", ones(2), source=-1, refused=True),
    "broadcast-source-bool": _c("broadcast", ones(2), source=True, refused=True),
    "broadcast-source-float": _c("broadcast", ones(2), source=0.0, refused=True),
    "broadcast-source-str": _c("broadcast", ones(2), source="0", refused=True),
    "broadcast-slices": _c("broadcast", SLICES, refused=True),
    "broadcast-str": _c("broadcast", "x", refused=True),
    "broadcast-name-int": _c("broadcast", ones(2), name=1, refused=True),
    # reduce_scatter
    "reduce_scatter-array": _c("reduce_scatter", "sum", ones(2)),
    "reduce_scatter-mean-int": _c("reduce_scatter", "mean", New(lambda: np.array([1, 2]))),
    "reduce_scatter-axis-1": _c("reduce_scatter", "sum", ones(2, 2), axis=1),
    "reduce_scatter-axis-negative": _c("reduce_scatter", "sum", ones(2, 2), axis=-1),
    "reduce_scatter-empty": _c("reduce_scatter", "sum", EMPTY, axis=3),
    "reduce_scatter-axis-out-of-range": _c("reduce_scatter", "sum", ones(2), axis=5, refused=True),
    "reduce_scatter-0-d": _c("reduce_scatter", "sum", New(lambda: np.float64(1)), refused=True),
    "reduce_scatter-slices": _c("reduce_scatter", "sum", SLICES, refused=True),
    "reduce_scatter-bool": _c("reduce_scatter", "sum", New(lambda: np.array([True])), refused=True),
    "reduce_scatter-op-bogus": _c("reduce_scatter", "bogus", ones(2), refused=True),
    "reduce_scatter-axis-str": _c("reduce_scatter", "sum", ones(2), axis="0", refused=True),
    "reduce_scatter-str": _c("reduce_scatter", "sum", "x", refused=True),
    "reduce_scatter-name-int": _c("reduce_scatter", "sum", ones(2), name=1, refused=True),
    # barrier
    "barrier": _c("barrier"),
    "barrier-name": _c("barrier", name="b"),
    "barrier-name-str-subclass": _c("barrier", name=_Name("b")),
    "barrier-name-int": _c("barrier", name=1, refused=True),
    "barrier-name-nan": _c("barrier", name=float("nan"), refused=True),
    # merge_call's argument checks
    "merge_call": _c("merge_call", _merged, (1.0, "a"), {"k": 2}),
    "merge_call-no-args": _c("merge_call", _merged),
    "merge_call-list-args": _c("merge_call", _merged, New(lambda: [np.ones(2)])),
    "merge_call-not-callable": _c("merge_call", 3, refused=True),
    "merge_call-args-int": _c("merge_call", _merged, 3, refused=True),
    "merge_call-args-str": _c("merge_call", _merged, "ab", refused=True),
    "merge_call-kwargs-list": _c("merge_call", _merged, (), [], refused=True),
    "merge_call-kwargs-not-str": _c("merge_call", _merged, (), {1: 2}, refused=True),
    "merge_call-args-too-deep": _c("merge_call", _merged, New(lambda: (_deep(101),)), refused=True),
}

STRATEGY_CALLS: dict[str, tuple[Callable[[Any], Awaitable[Any]], bool]] = {
    "reduce-sum": (lambda s: s.reduce("sum", np.ones(2), axis=None), False),
    "reduce-mean-axis": (lambda s: s.reduce("mean", np.ones((2, 3)), axis=0), False),
    "reduce-nest": (lambda s: s.reduce("mean", {"a": np.ones(2), "b": [3.0]}, axis=None), False),
    "reduce-slices": (lambda s: s.reduce("sum", _slices(), axis=None), False),
    "reduce-bool": (lambda s: s.reduce("sum", np.array([True]), axis=None), True),
    "reduce-op-bogus": (lambda s: s.reduce("bogus", 1.0), True),
    "reduce-axis-str": (lambda s: s.reduce("sum", np.ones(2), axis="x"), True),
    "reduce-axis-out-of-range": (lambda s: s.reduce("sum", np.ones(2), axis=5), True),
    "reduce-str": (lambda s: s.reduce("mean", "x", axis=None), True),
    "gather": (lambda s: s.gather(np.ones(2), 0), False),
    "gather-slices": (lambda s: s.gather(_slices(), 0), False),
    "gather-axis-str": (lambda s: s.gather(np.ones(2), "0"), True),
    "reduce_to-device": (lambda s: s.extended.reduce_to("mean", np.ones(2), "CPU:0"), False),
    "reduce_to-list": (lambda s: s.extended.reduce_to("sum", np.ones(2), ["CPU:0"]), False),
    "reduce_to-none": (lambda s: s.extended.reduce_to("sum", 1.0, None), True),
    "reduce_to-bool": (lambda s: s.extended.reduce_to("sum", np.array([True]), "CPU:0"), True),
    "reduce_to-options-dict": (
        lambda s: s.extended.reduce_to("sum", np.ones(2), "CPU:0", options={}),
        True,
    ),
    "batch_reduce_to": (
        lambda s: s.extended.batch_reduce_to("mean", [(np.ones(2), "CPU:0"), (2.0, "CPU:0")]),
        False,
    ),
    "batch_reduce_to-empty": (lambda s: s.extended.batch_reduce_to("sum", []), False),
    "batch_reduce_to-not-pairs": (lambda s: s.extended.batch_reduce_to("sum", [1.0]), True),
    "batch_reduce_to-not-list": (lambda s: s.extended.batch_reduce_to("sum", 3), True),
    "batch_reduce_to-op-bogus": (
        lambda s: s.extended.batch_reduce_to("bogus", [(1.0, "CPU:0")]),
        True,
    ),
    "broadcast_to-device": (lambda s: s.extended.broadcast_to(np.ones(2), "CPU:0"), False),
    "broadcast_to-list": (lambda s: s.extended.broadcast_to(np.ones(2), ["CPU:0"]), False),
    "broadcast_to-nest": (lambda s: s.extended.broadcast_to({"a": np.ones(2)}, "CPU:0"), False),
    "broadcast_to-array-destination": (
        lambda s: s.extended.broadcast_to(np.ones(2), np.ones(2)),
        True,
    ),
    "broadcast_to-none": (lambda s: s.extended.broadcast_to(np.ones(2), None), True),
    "broadcast_to-str": (lambda s: s.extended.broadcast_to("x", "CPU:0"), True),
    "run": (lambda s: s.run(lambda x: x * 2, args=(np.ones(2),)), False),
    "run-not-callable": (lambda s: s.run(3), True),
    "run-args-int": (lambda s: s.run(lambda: 1, args=3), True),
    "run-kwargs-list": (lambda s: s.run(lambda: 1, kwargs=[]), True),
    "update": (lambda s: s.extended.update(np.ones(2), lambda v: v + 1), False),
}


def _plain(value: Any, dtypes: bool) -> Any:
    """``value`` as plain data to compare: containers kept, leaves as (dtype,) values."""
    if isinstance(value, ar.IndexedSlices):
        return ("IndexedSlices", _plain(value.values, dtypes), _plain(value.indices, dtypes))
    if isinstance(value, dict):
        return {k: _plain(v, dtypes) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_plain(v, dtypes) for v in value)
    if value is None or isinstance(value, str):
        return value
    array = np.asarray(value)
    return (str(array.dtype), array.tolist()) if dtypes else array.tolist()


async def _outcome(call: Callable[[], Awaitable[Any]]) -> Any:
    try:
        return await call()
    except Exception as error:
        return error


async def _in_one_replica(call: Callable[[Any], Awaitable[Any]]) -> Any:
    """``call(ctx)`` in the one replica of a MirroredStrategy: its result or its error."""
    one = strategy(1)

    async def step() -> Any:
        return await _outcome(lambda: call(ar.get_replica_context()))

    try:
        return one.experimental_local_results(await one.run(step))[0]
    except BaseException as error:  # a run failed with the error: the one replica's
        (only,) = _errors(error)
        return only


def _same_error(default: BaseException, one: BaseException) -> None:
    assert type(default) is type(one), (default, one)
    assert str(default) == str(one)


@pytest.mark.parametrize("case", list(REPLICA_CALLS), ids=list(REPLICA_CALLS))
async def test_the_default_replica_context_refuses_what_one_replica_refuses(case: str) -> None:
    api, make, kwargs, refused = REPLICA_CALLS[case]
    ctx = ar.get_replica_context()
    assert isinstance(ctx, DefaultReplicaContext)
    args = make()
    default = await _outcome(lambda: getattr(ctx, api)(*args, **kwargs))
    one = await _in_one_replica(lambda c: getattr(c, api)(*make(), **kwargs))

    assert isinstance(one, Exception) is refused, one  # the list's good and bad calls
    if refused:
        assert isinstance(default, Exception), f"the default context returned {default!r}"
        _same_error(default, one)
        return
    assert not isinstance(default, Exception), default
    if api == "merge_call" or api == "barrier":
        assert _plain(default, False) == _plain(one, False)
    else:
        # The default context's collectives are the identity: the value itself comes
        # back, equal to one replica's result (whose dtype may differ: a MEAN of ints).
        # A value the backend converts (IndexedSlices: new ones, their parts converted)
        # comes back converted, as one replica's does (attack 23i, finding 6).
        value = args[1] if api in ("all_reduce", "reduce_scatter") else args[0]
        if isinstance(value, ar.IndexedSlices):
            assert type(default) is ar.IndexedSlices
        else:
            assert default is value
        assert _plain(default, False) == _plain(one, False)


@pytest.mark.parametrize("case", list(STRATEGY_CALLS), ids=list(STRATEGY_CALLS))
async def test_the_default_strategy_refuses_what_one_replica_refuses(case: str) -> None:
    call, refused = STRATEGY_CALLS[case]
    default = await _outcome(lambda: call(ar.get_strategy()))
    one = await _outcome(lambda: call(strategy(1)))

    assert isinstance(one, Exception) is refused, one
    if refused:
        assert isinstance(default, Exception), f"the default strategy returned {default!r}"
        _same_error(default, one)
    else:
        assert not isinstance(default, Exception), default
        assert _plain(default, True) == _plain(one, True)


def test_the_default_context_inherits_the_checks_it_makes() -> None:
    # One rule, one place: the default context calls a replica context's checks, it
    # does not carry copies of them.
    checks = [name for name in vars(ReplicaContext) if name.endswith("_checks")]
    assert len(checks) == 5
    for name in checks:
        assert name not in vars(DefaultReplicaContext), name


@pytest.mark.parametrize("api", ["all_reduce", "all_gather", "broadcast", "reduce_scatter"])
async def test_a_default_collective_in_cross_replica_context_is_refused_as_a_replicas(
    api: str,
) -> None:
    def call(ctx: ar.ReplicaContext) -> Awaitable[Any]:
        if api == "all_gather":
            return ctx.all_gather(np.ones(2), 0)
        if api == "broadcast":
            return ctx.broadcast(np.ones(2))
        return getattr(ctx, api)("sum", np.ones(2))

    one = strategy(1)
    seen: list[BaseException] = []

    async def step() -> None:
        ctx = ar.get_replica_context()
        assert ctx is not None

        def merge_fn(_: object) -> None:
            try:
                call(ctx)
            except ar.ReplicaContextError as error:
                seen.append(error)

        await ctx.merge_call(merge_fn)

    await one.run(step)
    (replicas,) = seen

    ctx = ar.get_replica_context()
    assert ctx is not None
    with one.scope(), pytest.raises(ar.ReplicaContextError) as in_scope:
        await call(ctx)
    _same_error(in_scope.value, replicas)

    async def merge_fn(_: object) -> BaseException:
        return await _outcome(lambda: call(ctx))

    _same_error(await ctx.merge_call(merge_fn), replicas)


async def test_reduce_scatter_refuses_booleans_when_each_replica_issues_it() -> None:
    # Refused at issue, as all_reduce refuses them (one rule: reduce_refusal), not by the
    # backend once every replica has arrived: the refusal is the signature's alone.
    async def step() -> str:
        ctx = ar.get_replica_context()
        assert ctx is not None
        with pytest.raises(TypeError, match="cannot reduce values of dtype bool") as caught:
            ctx.reduce_scatter("sum", np.array([True, False, True]))  # not awaited
        return str(caught.value)

    result = await strategy(3).run(step)
    assert len(set(strategy(3).experimental_local_results(result))) == 1


# -- F6: a rebuild that does not give back exactly its items is refused ---------------------


class Pair(tuple):  # type: ignore[type-arg]
    """A tuple subclass whose constructor takes its items one by one: ``Pair(a, b)``."""

    def __new__(cls, *items: Any) -> Pair:
        return super().__new__(cls, items)


class Doubled(list):  # type: ignore[type-arg]
    """A list subclass that keeps every item twice."""

    def __init__(self, items: Any = ()) -> None:
        super().__init__(x for item in items for x in (item, item))


class Floats(list):  # type: ignore[type-arg]
    """A list subclass that converts its items."""

    def __init__(self, items: Any = ()) -> None:
        super().__init__(float(np.sum(x)) for x in items)


class Plain(tuple):  # type: ignore[type-arg]
    """A tuple subclass whose constructor gives back a plain tuple."""

    def __new__(cls, items: Any = ()) -> Any:
        return tuple(items)


class Stamped(dict):  # type: ignore[type-arg]
    """A dict subclass that adds a key of its own each time it is made."""

    def __init__(self, items: Any = ()) -> None:
        super().__init__(items)
        self[f"v{len(self)}"] = 0.0


class Prefixed(dict):  # type: ignore[type-arg]
    """A dict subclass that renames its keys each time it is made."""

    def __init__(self, items: Any = ()) -> None:
        super().__init__({f"p.{k}": v for k, v in dict(items).items()})


class Frozen(collections.abc.Mapping[str, Any]):
    """A Mapping whose constructor ignores the dict it is given."""

    def __init__(self, items: Any = None) -> None:
        self._d = {"w": np.zeros(2)}

    def __getitem__(self, key: str) -> Any:
        return self._d[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._d)

    def __len__(self) -> int:
        return len(self._d)


BAD = {
    "tuple-new-star-args": (lambda: Pair(np.ones(2), np.ones(2)), "Pair", "namedtuple"),
    "list-doubles-items": (lambda: Doubled([np.ones(2)]), "Doubled", "__init__(self, items)"),
    "list-converts-items": (lambda: Floats([np.ones(2)]), "Floats", "plain list"),
    "tuple-gives-plain-tuple": (
        lambda: tuple.__new__(Plain, [np.ones(2)]),
        "Plain",
        "plain tuple",
    ),
    "dict-adds-a-key": (lambda: Stamped({"w": np.ones(2)}), "Stamped", "dict(m)"),
    "dict-renames-keys": (lambda: Prefixed({"w": np.ones(2)}), "Prefixed", "dict(m)"),
    "mapping-ignores-items": (lambda: Frozen(), "Frozen", "dict(m)"),
}


@pytest.mark.parametrize("case", list(BAD), ids=list(BAD))
async def test_a_collective_result_that_would_change_structure_is_refused(case: str) -> None:
    make, name, advice = BAD[case]

    async def step() -> Any:
        ctx = ar.get_replica_context()
        assert ctx is not None
        return await ctx.all_reduce("sum", make())

    with pytest.raises(BaseException) as caught:  # noqa: PT011 (one or a group of them)
        await strategy().run(step)
    errors = _errors(caught.value)
    assert len(errors) == 2  # each replica is told, none is left waiting
    assert {str(e).split("'s result")[0] for e in errors} == {"Replica 0", "Replica 1"}
    for error in errors:
        assert type(error) is TypeError, repr(error)
        text = str(error)
        assert f"{name} could not be rebuilt" in text
        assert "all_reduce" in text
        assert advice in text
        assert not isinstance(error, ar.InternalError)


@pytest.mark.parametrize("case", list(BAD), ids=list(BAD))
async def test_a_run_result_that_would_change_structure_is_refused(case: str) -> None:
    make, name, _ = BAD[case]
    with pytest.raises(TypeError, match=f"{name} could not be rebuilt"):
        await strategy().run(make)


async def test_a_tuple_subclass_taking_star_args_never_gains_a_nesting_level() -> None:
    # The reproducer: Pair(([a, b],)) of length 1 before, a level more on every pass.
    async def step() -> Any:
        ctx = ar.get_replica_context()
        assert ctx is not None
        return await ctx.all_reduce("sum", Pair(1.0, 2.0))

    with pytest.raises(BaseException) as caught:  # noqa: PT011
        await strategy().run(step)
    for error in _errors(caught.value):
        assert "given 2 items, it returned a" in str(error)
        assert "Pair of length 1" in str(error)


class Items(tuple):  # type: ignore[type-arg]
    """A tuple subclass whose constructor takes one iterable: rebuilt as it is."""

    def __new__(cls, items: Any = ()) -> Items:
        return super().__new__(cls, items)


class Stack(list):  # type: ignore[type-arg]
    """A plain list subclass."""


Point = collections.namedtuple("Point", "x y", defaults=(0.0,))


GOOD = {
    "namedtuple": lambda: Point(np.ones(2), np.ones(2)),
    "tuple-subclass": lambda: Items([np.ones(2), 1.0]),
    "list-subclass": lambda: Stack([np.ones(2), 1.0]),
    "defaultdict": lambda: collections.defaultdict(list, {"a": np.ones(2)}),
    "ordereddict": lambda: collections.OrderedDict([("b", 1.0), ("a", np.ones(2))]),
    "counter": lambda: collections.Counter({"a": 1, "b": 2}),
    "userdict": lambda: collections.UserDict({"a": np.ones(2)}),
    "chainmap": lambda: collections.ChainMap({"a": np.ones(2)}),
    "mappingproxy": lambda: types.MappingProxyType({"a": np.ones(2)}),
    "struct_time": lambda: time.gmtime(0),
}


@pytest.mark.parametrize("case", list(GOOD), ids=list(GOOD))
async def test_containers_that_keep_their_items_still_round_trip(case: str) -> None:
    make = GOOD[case]

    async def step() -> Any:
        ctx = ar.get_replica_context()
        assert ctx is not None
        return await ctx.all_reduce("sum", make())

    s = strategy()
    for value in s.experimental_local_results(await s.run(step)):
        original = make()
        assert type(value) is type(original)
        assert _items(value) == [np.multiply(item, 2).tolist() for item in _items(original)]


def _items(container: Any) -> list[Any]:
    """A container's items as plain data: a mapping's values by key, a sequence's in order."""
    if isinstance(container, collections.abc.Mapping):
        return [np.asarray(container[k]).tolist() for k in sorted(container)]
    return [np.asarray(item).tolist() for item in container]
