"""Defects found by attack 23g (the eighth round): each test failed before its fix.

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
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import asyncreplica as ar

pytestmark = pytest.mark.anyio

DEVICES = ["CPU:0", "CPU:1", "CPU:2"]


def strategy(n: int = 2) -> ar.MirroredStrategy:
    return ar.MirroredStrategy(DEVICES[:n])


def _errors(error: BaseException) -> list[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        return [e for sub in error.exceptions for e in _errors(sub)]
    return [error]


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
