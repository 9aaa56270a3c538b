"""A merge function's bound values must agree across replicas (attack 23g, finding 2).

``merge_fn`` runs once, as replica 0 passed it. It was matched by code object only, so
a value bound into it that differed per replica (a ``functools.partial`` keyword, a bound
method's instance attribute, a closure cell, a default) was silently replaced by
replica 0's: every replica got a result computed with ``lr=0.1``. Plain bound values
(numbers, strings, bytes, None, tuples of them) are now part of what must agree; other
bound objects are not compared (replica 0's are used, as in TensorFlow).
"""

from __future__ import annotations

import collections
import dataclasses
import decimal
import enum
import fractions
import functools
import math
import operator
import time
import types
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import asyncreplica as ar
from asyncreplica._runtime._merge_key import merge_fn_key

pytestmark = pytest.mark.anyio


def strategy(n: int = 3) -> ar.MirroredStrategy:
    return ar.MirroredStrategy([f"CPU:{i}" for i in range(n)])


def apply(strategy: ar.Strategy, value: Any, lr: object) -> object:
    return lr


def scaled(lr: object, strategy: ar.Strategy, value: Any) -> object:
    return lr


class Optimizer:
    def __init__(self, lr: object) -> None:
        self.lr = lr
        self.name = "sgd"

    def apply(self, strategy: ar.Strategy, value: Any) -> object:
        return self.lr


class Scaled:
    def __init__(self, lr: object) -> None:
        self.lr = lr

    def __call__(self, strategy: ar.Strategy, value: Any) -> object:
        return self.lr


def _closure(lr: object) -> Callable[..., Any]:
    def merge_fn(strategy: ar.Strategy, value: Any) -> object:
        return lr

    return merge_fn


def _default(lr: object) -> Callable[..., Any]:
    return lambda strategy, value, lr=lr: lr


def _kwdefault(lr: object) -> Callable[..., Any]:
    def merge_fn(strategy: ar.Strategy, value: Any, *, lr: object = lr) -> object:
        return lr

    return merge_fn


BINDINGS: dict[str, tuple[Callable[[object], Callable[..., Any]], str]] = {
    "partial keyword": (lambda lr: functools.partial(apply, lr=lr), "lr"),
    "partial argument": (lambda lr: functools.partial(scaled, lr), "partial arg 0"),
    "nested partial": (lambda lr: functools.partial(functools.partial(apply, lr=lr)), "lr"),
    "bound method": (lambda lr: Optimizer(lr).apply, "self.lr"),
    "callable object": (lambda lr: Scaled(lr), "self.lr"),
    "closure cell": (_closure, "lr"),
    "default": (_default, "lr"),
    "keyword-only default": (_kwdefault, "lr"),
}


def _run(s: ar.MirroredStrategy, make: Callable[[int], Callable[..., Any]]) -> Any:
    async def step() -> Any:
        ctx = ar.get_replica_context()
        assert ctx is not None
        return await ctx.merge_call(make(ctx.replica_id_in_sync_group), args=(1.0,))

    return s.run(step)


@pytest.mark.parametrize("binding", sorted(BINDINGS))
async def test_a_plain_value_bound_differently_per_replica_is_a_mismatch(binding: str) -> None:
    bind, label = BINDINGS[binding]
    lrs = [0.1, 0.2]
    with pytest.raises(ar.CollectiveMismatchError) as caught:
        await _run(strategy(2), lambda r: bind(lrs[r]))
    error = caught.value
    assert error.fields == ("merge_fn",)
    text = str(error)
    assert "different values bound into it" in text
    assert f"  * replica 0: {label}=0.1\n  * replica 1: {label}=0.2\n" in text
    assert "Pass per-replica values through merge_call's args= or kwargs=" in text


@pytest.mark.parametrize("binding", sorted(BINDINGS))
async def test_equal_plain_values_bound_on_every_replica_match(binding: str) -> None:
    bind, _ = BINDINGS[binding]
    # Equal values that are distinct objects on each replica (floats computed per replica).
    result = await _run(strategy(), lambda r: bind(float(f"0.{5 + r - r}")))
    assert ar.MirroredStrategy(["CPU:0"]).experimental_local_results(result) in ((0.5,), (0.5,) * 3)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (1, 1.0),  # int and float: another type, another value
        (True, 1),
        (0.0, -0.0),
        ("a", b"a"),
        ((1, 2), (1, 3)),
        (None, 0),
        (np.float32(0.5), 0.5),
        (2**70, 2**70 + 1),
    ],
    ids=repr,
)
async def test_plain_values_differ_by_type_and_exact_value(a: object, b: object) -> None:
    with pytest.raises(ar.CollectiveMismatchError, match="different values bound into it"):
        await _run(strategy(2), lambda r: _closure(a if r == 0 else b))


async def test_nan_bound_on_every_replica_matches() -> None:
    result = await _run(strategy(2), lambda r: _closure(float("nan")))
    values = ar.MirroredStrategy(["CPU:0"]).experimental_local_results(result)
    assert all(math.isnan(v) for v in values)


async def test_objects_that_are_not_plain_values_are_not_compared() -> None:
    """An array or a dict bound per replica: replica 0's is used (documented, as in TF)."""

    def make(r: int) -> Callable[..., Any]:
        return functools.partial(apply, lr={"lr": r})

    s = strategy(2)
    result = await _run(s, make)
    assert s.experimental_local_results(result) == ({"lr": 0}, {"lr": 0})


async def test_extended_update_compares_its_functions_bound_values() -> None:
    w = ar.Mirrored([1.0, 1.0])

    async def step() -> Any:
        ctx = ar.get_replica_context()
        assert ctx is not None
        d = [0.5, 0.25][ctx.replica_id_in_sync_group]
        return await ctx.strategy.extended.update(w, lambda x, d=d: x - d)

    with pytest.raises(ar.CollectiveMismatchError) as caught:
        await strategy(2).run(step)
    assert caught.value.fields == ("merge_fn",)
    assert "  * replica 0: d=0.5\n  * replica 1: d=0.25\n" in str(caught.value)


# -- attack 23h, finding 1: what the first key missed -------------------------------------


@dataclasses.dataclass(slots=True)
class SlottedOptimizer:
    lr: float

    def apply(self, strategy: ar.Strategy, value: Any) -> float:
        return self.lr


class SlottedCallable:
    __slots__ = ("lr",)

    def __init__(self, lr: float) -> None:
        self.lr = lr

    def __call__(self, strategy: ar.Strategy, value: Any) -> float:
        return self.lr


class Base:
    lr = 0.0

    def apply(self, strategy: ar.Strategy, value: Any) -> float:
        return self.lr


class SmallSteps(Base):
    lr = 0.1


class LargeSteps(Base):
    lr = 0.2


class Colour(enum.Enum):
    RED = 1
    BLUE = 2


Pair = collections.namedtuple("Pair", "a b")


class Shown(float):
    def __repr__(self) -> str:
        return "x"


def _decorated(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(strategy: ar.Strategy, value: Any) -> Any:
        return fn(strategy, value)

    return wrapper


def _update_a(strategy: ar.Strategy, value: Any) -> str:
    return "a"


def _update_b(strategy: ar.Strategy, value: Any) -> str:
    return "b"


def _deep(value: object, depth: int) -> object:
    for _ in range(depth):
        value = (value,)
    return value


DIFFERING: dict[str, Callable[[int], Callable[..., Any]]] = {
    "slotted dataclass method": lambda r: SlottedOptimizer([0.1, 0.2][r]).apply,
    "slotted callable object": lambda r: SlottedCallable([0.1, 0.2][r]),
    "method inherited by subclasses": lambda r: [SmallSteps, LargeSteps][r]().apply,
    "different functions behind one decorator": lambda r: _decorated([_update_a, _update_b][r]),
    "a closure cell holding a partial": lambda r: _closure(functools.partial(apply, lr=r)),
    "Fraction": lambda r: _closure(fractions.Fraction(1, 10 + r)),
    "Decimal": lambda r: _closure(decimal.Decimal(f"0.{r + 1}")),
    "enum member": lambda r: _closure([Colour.RED, Colour.BLUE][r]),
    "namedtuple": lambda r: _closure(Pair(0.1, 0.1 * (r + 1))),
    "tuple nested deeper than 3": lambda r: _closure(_deep(r, 6)),
    "int longer than str allows": lambda r: _closure(10**5000 + r),
    "float subclass with one repr": lambda r: _closure(Shown(0.1 * (r + 1))),
    "numpy scalars alike in legacy print": lambda r: _closure(
        [np.float32(0.1), np.float16(0.1)][r]
    ),
}


@pytest.mark.parametrize("case", sorted(DIFFERING))
async def test_what_the_first_key_missed_is_a_mismatch(case: str) -> None:
    legacy = np.get_printoptions()["legacy"]
    np.set_printoptions(legacy="1.25")  # numpy scalars print alike: the key is not repr
    try:
        with pytest.raises(ar.CollectiveMismatchError) as caught:
            await _run(strategy(2), DIFFERING[case])
    finally:
        np.set_printoptions(legacy=legacy)
    assert caught.value.fields == ("merge_fn",)


SAME: dict[str, Callable[[int], Callable[..., Any]]] = {
    "slotted dataclass method": lambda r: SlottedOptimizer(float("0.5")).apply,
    "one decorated function": lambda r: _decorated(_update_a),
    "a closure cell holding equal partials": lambda r: _closure(functools.partial(apply, lr=1)),
    "int longer than str allows": lambda r: _closure(10**5000),
    "equal namedtuples": lambda r: _closure(Pair(0.5, (1, 2))),
    "a recursive closure": lambda r: _recursive(),
}


def _recursive() -> Callable[..., Any]:
    def merge_fn(strategy: ar.Strategy, value: Any) -> object:
        return merge_fn if value is None else 1.0

    return merge_fn


@pytest.mark.parametrize("case", sorted(SAME))
async def test_equal_bindings_of_those_kinds_match(case: str) -> None:
    s = strategy(2)
    result = await _run(s, SAME[case])
    # merge_fn ran (a nest's leaves come back per replica; one value, one component).
    assert len(s.experimental_local_results(result)) in (1, 2)


# -- attack 24f, finding 4: what the second key missed --------------------------------------


@functools.cache
def _cached(k: float, strategy: ar.Strategy) -> float:
    return k


class _Scaler:
    k = 1.0

    def scale(self, strategy: ar.Strategy) -> float:
        return self.k


class _Counter:
    def __init__(self, k: float) -> None:
        self.k = k

    def __call__(self) -> float:
        return self.k


def _lambda_on_one_line(r: int) -> Callable[..., Any]:
    return (lambda s: 1.0) if r == 0 else (lambda s: 2.0)


def _nested_constant(r: int) -> Callable[..., Any]:
    inner = (lambda: 1.0) if r == 0 else (lambda: 2.0)

    def merge_fn(strategy: ar.Strategy) -> float:
        return inner()

    return merge_fn


def _class_per_replica(r: int) -> Callable[..., Any]:
    class Scaler(_Scaler):
        k = [1.0, 2.0][r]

    return Scaler().scale


def _callable_in_a_cell(r: int) -> Callable[..., Any]:
    counter = _Counter([1.0, 2.0][r])

    def merge_fn(strategy: ar.Strategy) -> float:
        return counter()

    return merge_fn


MISSED: dict[str, Callable[[int], Callable[..., Any]]] = {
    "two lambdas on one line": _lambda_on_one_line,
    "a partial of an lru_cache wrapper": lambda r: functools.partial(_cached, [1.0, 2.0][r]),
    "lambdas differing in a constant, in a cell": _nested_constant,
    "a class made per replica": _class_per_replica,
    "a callable object in a cell": _callable_in_a_cell,
}


@pytest.mark.parametrize("case", sorted(MISSED))
async def test_what_the_second_key_missed_is_a_mismatch(case: str) -> None:
    async def step() -> Any:
        ctx = ar.get_replica_context()
        assert ctx is not None
        return await ctx.merge_call(MISSED[case](ctx.replica_id_in_sync_group))

    with pytest.raises(ar.CollectiveMismatchError) as caught:
        await strategy(2).run(step)
    assert caught.value.fields == ("merge_fn",)


@pytest.mark.parametrize("same", [True, False])
async def test_numpy_ufuncs_in_a_cell_are_compared_by_name(same: bool) -> None:
    def make(r: int) -> Callable[..., Any]:
        ufunc = np.add if same or r == 0 else np.multiply

        def merge_fn(strategy: ar.Strategy) -> str:
            return str(ufunc.__name__)

        return merge_fn

    async def step() -> Any:
        ctx = ar.get_replica_context()
        assert ctx is not None
        return await ctx.merge_call(make(ctx.replica_id_in_sync_group))

    s = strategy(2)
    if same:
        assert s.experimental_local_results(await s.run(step)) == ("add",)
    else:
        with pytest.raises(ar.CollectiveMismatchError):
            await s.run(step)


# -- attack 23i, findings 1-3: callables without attributes, shared holders, cost ------------


class _Relu:
    def __call__(self, x: float) -> float:
        return max(x, 0.0)


class _Neg:
    def __call__(self, x: float) -> float:
        return -x


def _calling(f: Callable[..., Any]) -> Callable[..., Any]:
    def merge_fn(strategy: ar.Strategy) -> Any:
        return f(-2.0)

    return merge_fn


def _static_per_replica(r: int) -> Callable[..., Any]:
    class Holder:
        f = staticmethod([abs, operator.neg][r])

    return lambda strategy: Holder.f(-2)


THIRD: dict[str, Callable[[int], Callable[..., Any]]] = {
    "callable objects of two types, no attributes": lambda r: _calling([_Relu(), _Neg()][r]),
    "itemgetter": lambda r: _calling(operator.itemgetter(r)),
    "methodcaller": lambda r: _calling(operator.methodcaller(["real", "conjugate"][r])),
    "a class holding another staticmethod": _static_per_replica,
}


@pytest.mark.parametrize("case", sorted(THIRD))
async def test_what_the_third_key_missed_is_a_mismatch(case: str) -> None:
    async def step() -> Any:
        ctx = ar.get_replica_context()
        assert ctx is not None
        return await ctx.merge_call(THIRD[case](ctx.replica_id_in_sync_group))

    with pytest.raises(ar.CollectiveMismatchError):
        await strategy(2).run(step)


class _SharedOptimizer:
    step = 0  # a class counter every replica bumps

    def __init__(self) -> None:
        self.calls = 0

    def apply(self, strategy: ar.Strategy) -> int:
        return self.calls


async def test_one_shared_instance_bumped_by_each_replica_is_not_a_mismatch() -> None:
    """The merge function reads one object: nothing of replica 0's replaces anything."""
    optimizer = _SharedOptimizer()

    async def step() -> Any:
        ctx = ar.get_replica_context()
        assert ctx is not None
        optimizer.calls += 1  # 1 on replica 0's arrival, 2 on replica 1's
        _SharedOptimizer.step += 1
        return await ctx.merge_call(optimizer.apply)

    s = strategy(2)
    assert s.experimental_local_results(await s.run(step)) == (2,)


def test_building_a_key_stays_cheap_for_shared_and_long_tuples() -> None:
    """A graph of shared tuples is walked once per object; a huge tuple is not compared."""
    shared: object = 1.0
    for _ in range(40):  # 2**40 leaves as a tree; 40 objects as a graph
        shared = (shared, shared)
    long = tuple(float(i) for i in range(1_000_000))
    started = time.perf_counter()
    key = merge_fn_key(_closure((shared, long)))
    assert time.perf_counter() - started < 5.0  # a hang guard: it took minutes
    assert key.bound == ()  # too long a text: not compared (documented)


# -- attack 23j, findings 1-3: __call__'s closure, builtin methods, bases, MethodType --------


def _callable_with_closure(r: int) -> Callable[..., Any]:
    lr = [0.1, 0.2][r]

    class Step:
        def __call__(self, strategy: ar.Strategy) -> float:
            return lr

    return Step()


def _callable_with_default(r: int) -> Callable[..., Any]:
    class Step:
        def __call__(self, strategy: ar.Strategy, lr: float = [0.1, 0.2][r]) -> float:
            return lr

    return Step()


def _reduce_method(r: int) -> Callable[..., Any]:
    reduce = [np.add.reduce, np.multiply.reduce][r]
    return lambda strategy: float(reduce(np.array([2.0, 3.0])))


def _base_per_replica(r: int) -> Callable[..., Any]:
    class Base:
        lr = [0.1, 0.2][r]

    class Step(Base):
        def apply(self, strategy: ar.Strategy) -> float:
            return self.lr

    return Step().apply


def _method_of_an_int(r: int) -> Callable[..., Any]:
    def apply(self: int, strategy: ar.Strategy) -> int:
        return self

    return types.MethodType(apply, r)


_SHARED = _SharedOptimizer()


def _another_function_on_one_instance(r: int) -> Callable[..., Any]:
    lr = [0.1, 0.2][r]

    def apply(self: object, strategy: ar.Strategy) -> float:
        return lr

    return types.MethodType(apply, _SHARED)


FOURTH: dict[str, Callable[[int], Callable[..., Any]]] = {
    "a callable object's __call__ closure": _callable_with_closure,
    "a callable object's __call__ default": _callable_with_default,
    "ufunc.reduce of two ufuncs": _reduce_method,
    "a base class made per replica": _base_per_replica,
    "MethodType of a function and an int": _method_of_an_int,
    "MethodType of another function on one instance": _another_function_on_one_instance,
}


@pytest.mark.parametrize("case", sorted(FOURTH))
async def test_what_the_fourth_key_missed_is_a_mismatch(case: str) -> None:
    async def step() -> Any:
        ctx = ar.get_replica_context()
        assert ctx is not None
        return await ctx.merge_call(FOURTH[case](ctx.replica_id_in_sync_group))

    with pytest.raises(ar.CollectiveMismatchError):
        await strategy(2).run(step)
