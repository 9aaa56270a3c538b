"""Defects found by attack 23e (the seventh round): each test failed before its fix.

F1: an unbatched (feature, label) tuple or namedtuple of scalars in a distributed
    dataset was split across the tuple (a silently wrong number) instead of refused.
F2: a user Mapping whose constructor cannot take ``cls(dict)`` was an InternalError in the
    interpreted build and a bare TypeError in the compiled one, naming no replica.
F3: a Mapping whose iteration yields other keys on a second pass was an InternalError
    (a KeyError in the library's rebuild).
F4: all_gather of an ndarray subclass whose ``shape`` lies blamed the numpy backend
    (BackendError): the due size was read from ``.shape``, not from the plain view of
    the memory that the backend combines.
F5: dict keys that are NaN made "structure differs" with both replicas shown alike and
    nothing to act on.
"""

from __future__ import annotations

import collections
import collections.abc
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import asyncreplica as ar
from asyncreplica._runtime._input import UnbatchedElementError

pytestmark = pytest.mark.anyio

DEVICES = ["CPU:0", "CPU:1", "CPU:2"]

Example = collections.namedtuple("Example", "feature label")


def strategy(n: int = 2, **kwargs: Any) -> ar.MirroredStrategy:
    return ar.MirroredStrategy(DEVICES[:n], **kwargs)


# -- F1: one rule for every container's leaves: no batch axis, no split --------------------


@pytest.mark.parametrize(
    "element",
    [
        (0.5, 1.0),
        Example(0.5, 1.0),
        (np.float64(0.5), np.float64(1.0)),
        (np.array(0.5), np.array(1.0)),
        {"feature": 0.5, "label": 1.0},
        ([0.5, 0.25], 1.0),
        (1, 2, 3, 4),
    ],
    ids=["tuple", "namedtuple", "np-scalars", "0-d-arrays", "dict", "list-and-scalar", "ints"],
)
async def test_an_unbatched_tuple_of_scalars_is_refused_not_split_across_the_tuple(
    element: Any,
) -> None:
    with pytest.raises(UnbatchedElementError, match="without a batch axis"):
        list(strategy().experimental_distribute_dataset([element]))


async def test_a_tuple_of_batches_is_still_split_along_each_batch() -> None:
    (batch,) = list(
        strategy().experimental_distribute_dataset([Example([0.5, 0.25], np.array([1.0, 2.0]))])
    )
    assert isinstance(batch, Example)
    assert batch.feature.values == ([0.5], [0.25])
    np.testing.assert_array_equal(batch.label.values[1], [2.0])


async def test_one_replica_passes_an_unbatched_tuple_on_as_it_is() -> None:
    (batch,) = list(strategy(1).experimental_distribute_dataset([Example(0.5, 1.0)]))
    assert batch == Example(0.5, 1.0)


# -- F2: a mapping type that cannot be rebuilt is the user's TypeError, naming it -------------


class Params(collections.abc.Mapping[str, Any]):
    """A config class whose constructor takes keywords: ``Params(dict)`` raises."""

    def __init__(self, **kw: Any) -> None:
        self._d = dict(kw)

    def __getitem__(self, k: str) -> Any:
        return self._d[k]

    def __iter__(self) -> Iterator[str]:
        return iter(self._d)

    def __len__(self) -> int:
        return len(self._d)


def _errors(error: BaseException) -> list[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        return [e for sub in error.exceptions for e in _errors(sub)]
    return [error]


@pytest.mark.parametrize("collective", ["all_reduce", "all_gather", "broadcast"])
async def test_a_mapping_that_cannot_be_rebuilt_is_the_users_type_error(collective: str) -> None:
    async def step() -> Any:
        ctx = ar.get_replica_context()
        assert ctx is not None
        value = Params(w=np.ones(2))
        if collective == "all_reduce":
            return await ctx.all_reduce("sum", value)
        if collective == "all_gather":
            return await ctx.all_gather(value, axis=0)
        return await ctx.broadcast(value)

    with pytest.raises(BaseException) as caught:  # noqa: PT011 (one or a group of them)
        await strategy().run(step)
    errors = _errors(caught.value)
    assert len(errors) == 2  # each replica is told, in its own task
    for error in errors:
        assert type(error) is TypeError, repr(error)
        text = str(error)
        assert "Params could not be rebuilt as type(m)(items)" in text
        assert collective in text
        assert "Replica " in text
        assert isinstance(error.__cause__, TypeError)
        assert not isinstance(error, ar.InternalError)


async def test_a_result_mapping_that_cannot_be_rebuilt_names_its_type() -> None:
    async def step() -> Any:
        return Params(w=np.ones(2))

    with pytest.raises(TypeError, match=r"Params could not be rebuilt as type\(m\)\(items\)"):
        await strategy().run(step)


async def test_strategy_reduce_of_a_mapping_that_cannot_be_rebuilt_names_its_type() -> None:
    value = ar.PerReplica((Params(w=np.ones(2)), Params(w=np.ones(2))))
    with pytest.raises(TypeError, match=r"Params could not be rebuilt"):
        await strategy().reduce("sum", value, axis=None)


# -- F3: a mapping is iterated once per flatten -------------------------------------------------


_PASSES: dict[int, int] = {}


class FlipMap(dict):  # type: ignore[type-arg]
    """Yields key 'a' on odd passes and 'b' on even ones; both keys are present.

    Rebuilt as ``FlipMap(items)``, it keeps the items it is given (one that ignored them
    would give back other values than the reduced ones: refused since, see
    test_attack_eighth_round_structure.py). A dict subclass whose pass count is kept
    outside the instance: a mapping with state of its own besides its items is refused
    since (test_container_state.py).
    """

    def __init__(self, items: dict[str, Any] | None = None) -> None:
        super().__init__({} if items is None else items)
        _PASSES[id(self)] = 0

    @property
    def d(self) -> dict[str, Any]:
        return dict(dict.items(self))  # the items it holds, not its flipping view

    def __getitem__(self, k: str) -> Any:
        if dict.__contains__(self, k):
            return dict.__getitem__(self, k)
        if k in ("a", "b"):
            return np.array([1.0])
        raise KeyError(k)

    def __iter__(self) -> Iterator[str]:
        _PASSES[id(self)] += 1
        return iter(["a"] if _PASSES[id(self)] % 2 else ["b"])

    def __len__(self) -> int:
        return 1


async def test_a_mapping_whose_iteration_changes_is_read_in_one_pass() -> None:
    async def step() -> Any:
        ctx = ar.get_replica_context()
        assert ctx is not None
        out = await ctx.all_reduce("sum", FlipMap())
        assert out.d.keys() == {"a"}  # the key read in the one pass, holding the sum
        np.testing.assert_array_equal(out.d["a"], [2.0])
        return out

    result = await strategy().run(step)
    for value in strategy().experimental_local_results(result):
        assert isinstance(value, FlipMap)


async def test_a_mapping_that_yields_a_key_twice_is_the_users_type_error() -> None:
    class Twice(FlipMap):
        def __iter__(self) -> Iterator[str]:
            return iter(["a", "a"])

        def __len__(self) -> int:
            return 2

    async def step() -> Any:
        ctx = ar.get_replica_context()
        assert ctx is not None
        return await ctx.all_reduce("sum", Twice())

    with pytest.raises(BaseException) as caught:  # noqa: PT011 (one or a group of them)
        await strategy().run(step)
    for error in _errors(caught.value):
        assert type(error) is TypeError, repr(error)
        assert "Twice could not be rebuilt" in str(error)
        assert "yielded the same key more than once" in str(error)
    assert len(_errors(caught.value)) == 2  # each replica is told, none is left waiting


# -- F4: the due spec is the plain view's, as the combined memory is ---------------------------


class LyingShape(np.ndarray):  # type: ignore[type-arg]
    @property  # type: ignore[misc]
    def shape(self) -> tuple[int, ...]:  # type: ignore[override]
        return (1,)


@pytest.mark.parametrize("n", [2, 3])
async def test_all_gather_of_a_subclass_whose_shape_lies_gathers_its_memory(n: int) -> None:
    async def step() -> Any:
        ctx = ar.get_replica_context()
        assert ctx is not None
        x = np.array([1.0, 2.0]).view(LyingShape)
        return await ctx.all_gather(x, axis=0)

    s = strategy(n)
    for _ in range(2):  # the first call describes the result type, the next reads it
        result = await s.run(step)
        for value in s.experimental_local_results(result):
            np.testing.assert_array_equal(np.asarray(value), [1.0, 2.0] * n)


# -- F5: a key unequal to itself is named as the cause -----------------------------------------


async def test_nan_keys_in_a_collective_are_named_as_the_cause() -> None:
    async def step() -> Any:
        ctx = ar.get_replica_context()
        assert ctx is not None
        return await ctx.all_reduce("sum", {float("nan"): np.ones(1)})

    with pytest.raises(ar.CollectiveMismatchError, match="compares unequal to itself"):
        await strategy().run(step)


async def test_nan_keys_in_a_result_are_named_as_the_cause() -> None:
    async def step() -> Any:
        return {"ok": 1.0, "nested": {float("nan"): np.ones(1)}}

    with pytest.raises(ValueError, match=r"compares unequal to itself \(nan"):
        await strategy().run(step)


async def test_one_nan_key_object_shared_by_every_replica_still_works() -> None:
    nan = float("nan")

    async def step() -> Any:
        ctx = ar.get_replica_context()
        assert ctx is not None
        return await ctx.all_reduce("sum", {nan: np.ones(1)})

    s = strategy()
    for value in s.experimental_local_results(await s.run(step)):
        np.testing.assert_array_equal(value[nan], [2.0])
