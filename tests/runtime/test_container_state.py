"""A container subclass that carries state of its own besides its items (attack 23i, F7).

``class Grads(dict)`` with ``self.loss_scale = 1024`` came back from a collective, and from
``run``'s regrouping, rebuilt as ``type(m)(items)`` with ``loss_scale`` reset to the
constructor's default: ``r["w"] / r.loss_scale`` gave 2048 where 2 was meant, silently. A
``ChainMap`` of several maps came back as one map. Flattening now refuses a list, tuple or
mapping subclass instance holding state besides its items (a non-empty instance
``__dict__``, filled ``__slots__``, a ``ChainMap``'s further maps) with a ``TypeError``
naming the type, the attributes and what to do, wherever asyncreplica traverses a nest.
Containers whose state is their items (namedtuples, ``defaultdict``, ``OrderedDict``,
``Counter``, ``UserDict``, ``mappingproxy``, a one-map ``ChainMap``, the ``AttrDict`` idiom,
a ``Mapping`` keeping its items in one dict) still round-trip.
"""

from __future__ import annotations

import collections
import collections.abc
import types
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

import asyncreplica as ar
from asyncreplica._core._nest import flatten, unflatten

pytestmark = pytest.mark.anyio


def strategy() -> ar.MirroredStrategy:
    return ar.MirroredStrategy(["CPU:0", "CPU:1"])


def _errors(error: BaseException) -> list[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        return [e for sub in error.exceptions for e in _errors(sub)]
    return [error]


class Grads(dict):  # type: ignore[type-arg]
    """Gradients plus the loss scale they were computed with (the reproducer)."""

    def __init__(self, *args: Any, loss_scale: float = 1.0, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.loss_scale = loss_scale


class Tagged(list):  # type: ignore[type-arg]
    """A list subclass with an attribute."""

    def __init__(self, items: Any = (), tag: str = "") -> None:
        super().__init__(items)
        self.tag = tag


class Slotted(list):  # type: ignore[type-arg]
    """A list subclass whose state is in a (name-mangled) slot."""

    __slots__ = ("__scale",)

    def __init__(self, items: Any = (), scale: float = 1.0) -> None:
        super().__init__(items)
        self.__scale = scale


class Scaled(collections.abc.Mapping[str, Any]):
    """A Mapping keeping its items in a dict, plus a scale of its own."""

    def __init__(self, items: Any = None, scale: float = 1.0) -> None:
        self._d = dict(items or {})
        self.scale = scale

    def __getitem__(self, key: str) -> Any:
        return self._d[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._d)

    def __len__(self) -> int:
        return len(self._d)


def _grads() -> Grads:
    return Grads({"w": np.full(2, 1024.0)}, loss_scale=1024.0)


STATEFUL: dict[str, tuple[Callable[[], Any], str, str]] = {
    "dict-attribute": (_grads, "Grads", "loss_scale"),
    "list-attribute": (lambda: Tagged([np.ones(2)], tag="t"), "Tagged", "tag"),
    "list-slot": (lambda: Slotted([np.ones(2)], scale=4.0), "Slotted", "__scale"),
    "mapping-attribute": (lambda: Scaled({"w": np.ones(2)}, scale=4.0), "Scaled", "scale"),
    "chainmap-two-maps": (
        lambda: collections.ChainMap({"a": np.ones(2)}, {"b": np.ones(2)}),
        "ChainMap",
        "maps",
    ),
    "nested-in-a-dict": (lambda: {"g": [_grads()]}, "Grads", "loss_scale"),
}


def _check(error: BaseException, name: str, attribute: str) -> None:
    assert type(error) is TypeError, repr(error)
    assert not isinstance(error, ar.InternalError)
    text = str(error)
    assert name in text
    assert attribute in text
    assert "state" in text
    assert "plain" in text  # what to do


def _ctx() -> Any:
    ctx = ar.get_replica_context()
    assert ctx is not None
    return ctx


COLLECTIVES: dict[str, Callable[[Any, Any], Any]] = {
    "all_reduce": lambda ctx, v: ctx.all_reduce("sum", v),
    "all_gather": lambda ctx, v: ctx.all_gather(v, 0),
    "broadcast": lambda ctx, v: ctx.broadcast(v),
    "merge_call-args": lambda ctx, v: ctx.merge_call(lambda s, x: 0.0, (v,)),
    "merge_call-kwargs": lambda ctx, v: ctx.merge_call(lambda s, x: 0.0, (), {"x": v}),
}


@pytest.mark.parametrize("collective", list(COLLECTIVES))
@pytest.mark.parametrize("case", list(STATEFUL))
async def test_a_collective_refuses_a_container_with_state(case: str, collective: str) -> None:
    make, name, attribute = STATEFUL[case]
    call = COLLECTIVES[collective]

    async def step() -> Any:
        return await call(_ctx(), make())

    with pytest.raises(BaseException) as caught:  # noqa: PT011 (one or a group)
        await strategy().run(step)
    errors = _errors(caught.value)
    assert errors
    for error in errors:
        _check(error, name, attribute)


@pytest.mark.parametrize("case", list(STATEFUL))
async def test_run_refuses_a_result_with_state(case: str) -> None:
    make, name, attribute = STATEFUL[case]
    with pytest.raises(TypeError) as caught:
        await strategy().run(make)
    _check(caught.value, name, attribute)


@pytest.mark.parametrize("case", list(STATEFUL))
async def test_strategy_reduce_refuses_a_per_replica_of_containers_with_state(case: str) -> None:
    make, name, attribute = STATEFUL[case]
    s = strategy()
    with pytest.raises(TypeError) as caught:
        await s.reduce("sum", ar.PerReplica((make(), make())), axis=None)
    _check(caught.value, name, attribute)


async def test_the_reproducer_never_gives_2048() -> None:
    async def step() -> Any:
        r = await _ctx().all_reduce("sum", _grads())
        return r["w"] / r.loss_scale

    with pytest.raises(BaseException) as caught:  # noqa: PT011
        await strategy().run(step)
    for error in _errors(caught.value):
        assert "loss_scale" in str(error)


def test_flatten_refuses_it_naming_where() -> None:
    with pytest.raises(TypeError, match=r"replica 1's value .*Grads.*loss_scale"):
        flatten({"a": _grads()}, None, "replica 1's value")


class AttrDict(dict):  # type: ignore[type-arg]
    """The idiom whose attributes are its items."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.__dict__ = self


class Unfilled(list):  # type: ignore[type-arg]
    """A list subclass whose slot is left unset."""

    __slots__ = ("scale",)


class Plain(dict):  # type: ignore[type-arg]
    """A dict subclass without state."""


class Stored(collections.abc.Mapping[str, Any]):
    """A Mapping that keeps its items in one dict and nothing else."""

    __slots__ = ("_d",)

    def __init__(self, items: Any = None) -> None:
        self._d = dict(items or {})

    def __getitem__(self, key: str) -> Any:
        return self._d[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._d)

    def __len__(self) -> int:
        return len(self._d)


Point = collections.namedtuple("Point", "x y")


class Sub(Point):
    """A namedtuple subclass without __slots__ (an empty instance __dict__)."""


GOOD: dict[str, Callable[[], Any]] = {
    "namedtuple": lambda: Point(np.ones(2), np.ones(2)),
    "namedtuple-subclass": lambda: Sub(np.ones(2), np.ones(2)),
    "defaultdict": lambda: collections.defaultdict(list, {"a": np.ones(2)}),
    "ordereddict": lambda: collections.OrderedDict([("b", np.ones(2)), ("a", np.ones(2))]),
    "counter": lambda: collections.Counter({"a": 1, "b": 2}),
    "userdict": lambda: collections.UserDict({"a": np.ones(2)}),
    "chainmap-one-map": lambda: collections.ChainMap({"a": np.ones(2)}),
    "mappingproxy": lambda: types.MappingProxyType({"a": np.ones(2)}),
    "attrdict": lambda: AttrDict(a=np.ones(2)),
    "unfilled-slot": lambda: Unfilled([np.ones(2)]),
    "dict-subclass": lambda: Plain(a=np.ones(2)),
    "mapping-one-store": lambda: Stored({"a": np.ones(2)}),
}


@pytest.mark.parametrize("case", list(GOOD))
async def test_containers_whose_state_is_their_items_round_trip(case: str) -> None:
    make = GOOD[case]

    async def step() -> Any:
        return await _ctx().all_reduce("sum", make())

    s = strategy()
    original = make()
    for value in s.experimental_local_results(await s.run(step)):
        assert type(value) is type(original)
        if isinstance(original, collections.abc.Mapping):
            assert list(value) == list(original)
            for key in original:
                assert np.array_equal(value[key], np.multiply(original[key], 2))
        else:
            assert len(value) == len(original)
            for got, item in zip(value, original, strict=True):
                assert np.array_equal(got, np.multiply(item, 2))
        if isinstance(original, collections.defaultdict):
            assert value.default_factory is list
        if isinstance(original, AttrDict):
            assert vars(value) is value


@pytest.mark.parametrize("case", list(GOOD))
def test_flatten_and_unflatten_round_trip(case: str) -> None:
    original = GOOD[case]()
    leaves, treedef = flatten(original)
    rebuilt = unflatten(treedef, leaves)
    assert type(rebuilt) is type(original)
    assert flatten(rebuilt)[1] == treedef
