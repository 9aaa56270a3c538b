"""Defects found by attack 23d (the sixth round): each test failed before its fix.

E1: a (features, labels) batch of plain lists was split across the tuple, not along
    the batch; a dict of lists raised a bare ``TypeError``.
E3: a deep nest crashed the compiled ``regroup`` (C stack overflow) and raised
    ``RecursionError`` in the interpreted build: one limit, one error, in both builds.
E6: only replica 0's structure was checked by ``regroup``: ``None`` or a number there
    with lists on the others was accepted, the reverse refused.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import asyncreplica as ar
from asyncreplica._core import _nest

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


# -- E1: lists in a dataset element are batches, as tf.data reads them ---------------------


FEATURES = [1.0, 2.0, 3.0, 4.0]
LABELS = [10.0, 20.0, 30.0, 40.0]


@pytest.mark.parametrize(
    "element",
    [
        pytest.param((FEATURES, LABELS), id="tuple-of-lists"),
        pytest.param((np.array(FEATURES), np.array(LABELS)), id="tuple-of-arrays"),
        pytest.param((FEATURES, np.array(LABELS)), id="mixed"),
    ],
)
async def test_a_pair_of_lists_is_split_along_the_batch_as_arrays_are(element: Any) -> None:
    s = strategy()

    async def step(batch: Any) -> Any:
        x, y = batch
        n = await _ctx().all_reduce("sum", np.int64(len(x)))
        return n, await _ctx().all_reduce("sum", np.float64(sum(x) + sum(y)))

    for batch in s.experimental_distribute_dataset([element]):
        n, total = await s.run(step, args=(batch,))
        assert int(n.values[0]) == 4
        assert float(total.values[0]) == 110.0
        assert list(batch[0].values[0]) == [1.0, 2.0]
        assert list(batch[1].values[1]) == [30.0, 40.0]


async def test_a_dict_of_lists_is_split_along_the_batch() -> None:
    s = strategy()
    (batch,) = list(s.experimental_distribute_dataset([{"x": FEATURES, "y": LABELS}]))
    assert batch["x"].values == ([1.0, 2.0], [3.0, 4.0])
    assert batch["y"].values == ([10.0, 20.0], [30.0, 40.0])


@pytest.mark.parametrize(
    ("element", "pieces"),
    [
        pytest.param([1.0, 2.0, 3.0], ([1.0, 2.0], [3.0]), id="list-of-numbers"),
        # A tuple of numbers is structure, not a batch (F1, attack 23e): refused as an
        # unbatched element, see test_attack_seventh_round.py.
        pytest.param([[1, 2], [3, 4]], ([[1, 2]], [[3, 4]]), id="rows-of-a-2d-list"),
        pytest.param(["ab", "cd"], (["ab"], ["cd"]), id="list-of-strings"),
    ],
)
async def test_a_whole_list_batch_is_sliced_by_rows(element: Any, pieces: Any) -> None:
    (batch,) = list(strategy().experimental_distribute_dataset([element]))
    assert batch.values == pieces


async def test_a_list_of_arrays_stays_a_structure_split_leaf_by_leaf() -> None:
    x, y = np.arange(4.0), np.arange(4.0) * 10
    (batch,) = list(strategy().experimental_distribute_dataset([[x, y]]))
    assert isinstance(batch, list)
    np.testing.assert_array_equal(batch[1].values[1], [20.0, 30.0])


async def test_a_dict_of_numbers_is_an_unbatched_element_not_a_bare_type_error() -> None:
    with pytest.raises(IndexError, match="must be a batch"):
        list(strategy().experimental_distribute_dataset([{"x": 1.0, "y": 2.0}]))


async def test_lists_from_a_dataset_fn_pad_with_empty_batches() -> None:
    s = strategy()

    def dataset_fn(_: Any) -> Any:
        return [([1.0, 2.0], [10.0, 20.0]), ([3.0], [30.0]), ([5.0], [50.0])]

    steps = list(s.distribute_datasets_from_function(dataset_fn))
    assert len(steps) == 2
    assert steps[1][0].values == ([5.0], [])
    assert steps[1][1].values == ([50.0], [])


# -- E3: one depth limit for every traversal, in both builds ---------------------------


def _deep(n: int) -> Any:
    v: Any = 1.0
    for _ in range(n):
        v = [v]
    return v


@pytest.mark.parametrize("depth", [_nest.MAX_NEST_DEPTH + 1, 2000, 50_000])
async def test_a_step_returning_a_deep_nest_is_refused_naming_the_replica(depth: int) -> None:
    async def step() -> Any:
        return _deep(depth) if _rid() == 1 else _deep(1)

    with pytest.raises(ValueError, match=r"replica 1's value is a nest more than 100 containers"):
        await strategy().run(step)


@pytest.mark.parametrize("depth", [2000, 50_000])
def test_regroup_and_flatten_refuse_a_deep_nest_without_crashing(depth: int) -> None:
    with pytest.raises(ValueError, match="MAX_NEST_DEPTH = 100"):
        _nest.regroup([_deep(depth), _deep(depth)], ar.PerReplica, 0)
    with pytest.raises(ValueError, match="a value is a nest more than"):
        _nest.flatten(_deep(depth))


def test_a_nest_at_the_limit_is_traversed() -> None:
    leaves, treedef = _nest.flatten(_deep(_nest.MAX_NEST_DEPTH))
    assert leaves == [1.0]
    merged = _nest.regroup([_deep(_nest.MAX_NEST_DEPTH)] * 2, ar.PerReplica, 0)
    assert _nest.flatten(merged)[1] == treedef


def test_a_list_that_contains_itself_is_refused() -> None:
    loop: list[Any] = [1.0]
    loop.append(loop)
    with pytest.raises(ValueError, match="contains itself"):
        _nest.flatten(loop)


async def test_a_collective_on_a_deep_nest_is_refused() -> None:
    async def step() -> Any:
        return await _ctx().all_reduce("sum", _deep(50_000))

    with pytest.raises(ValueError, match="a nest more than 100 containers"):
        await strategy().run(step)


# -- E6: regroup's structure check is symmetric ------------------------------------------


CASES: dict[str, Any] = {
    "list-vs-none": lambda r: [1] if r == 0 else None,
    "none-list-none": lambda r: [None, [1], None][r],
    "int-vs-list": lambda r: 5 if r == 0 else [1],
    "str-vs-list": lambda r: "ab" if r == 0 else ["a", "b"],
    "nested-none": lambda r: {"a": None if r == 1 else {"b": 1}},
}


@pytest.mark.parametrize("make", list(CASES.values()), ids=list(CASES))
async def test_every_replica_must_return_the_same_structure(make: Any) -> None:
    async def step() -> Any:
        return make(_rid())

    with pytest.raises(ValueError, match=r"replica 0 gave .* but replica 1 gave"):
        await strategy(3).run(step)


async def test_equal_structures_still_regroup() -> None:
    async def step() -> Any:
        return {"a": [_rid(), None], "b": (1.0,)}

    result = await strategy(3).run(step)
    assert result["a"][0].values == (0, 1, 2)
    assert result["a"][1] is None
    assert result["b"] == (1.0,)


# -- E2: extended.update in replica context takes the var every replica passed -----------


async def test_update_of_one_captured_dict_works_in_replica_context_as_outside() -> None:
    s = strategy(1)
    var = {"w": 1.0}

    def add_one(w: Any) -> Any:
        return {"w": w["w"] + 1}

    async def step() -> Any:
        return await _ctx().strategy.extended.update(var, add_one)

    assert await s.run(step) == {"w": 2.0}
    assert await s.extended.update(var, add_one) == {"w": 2.0}


@pytest.mark.parametrize("var", [{"w": 1.0}, [1.0]], ids=["dict", "list"])
async def test_update_of_one_plain_nest_on_two_replicas_is_refused_as_outside(var: Any) -> None:
    s = strategy()

    async def step() -> Any:
        return await _ctx().strategy.extended.update(var, lambda w: w)

    message = rf"needs a distributed value .* on 2 replicas, got {type(var).__name__}"
    with pytest.raises(TypeError, match=message):
        await s.run(step)
    with pytest.raises(TypeError, match=message):
        await s.extended.update(var, lambda w: w)


async def test_update_of_different_objects_names_every_replica_and_their_objects() -> None:
    s = strategy(3)
    shared = ar.Mirrored([1.0, 1.0, 1.0])
    own = ar.Mirrored([1.0, 1.0, 1.0])

    async def step() -> Any:
        var = own if _rid() == 2 else shared
        return await _ctx().strategy.extended.update(var, lambda w: w)

    with pytest.raises(ValueError, match="must pass the same object") as caught:
        await s.run(step)
    text = str(caught.value)
    assert f"replicas 0, 1 passed Mirrored at {id(shared):#x}" in text
    assert f"replica 2 passed Mirrored at {id(own):#x}" in text


# -- E4: CommunicationOptions fields set after creation are checked as in __init__ -------


@pytest.mark.parametrize(
    ("field", "value", "error", "message"),
    [
        ("timeout_seconds", float("nan"), ValueError, r"timeout_seconds must be .* got nan"),
        ("timeout_seconds", -1.0, ValueError, r"timeout_seconds must be a number of seconds >= 0"),
        ("timeout_seconds", "1", TypeError, r"timeout_seconds must be a number of seconds"),
        ("bytes_per_pack", -1, ValueError, r"`bytes_per_pack` must be >=0"),
        ("bytes_per_pack", 1.5, TypeError, r"bytes_per_pack must be an int"),
        ("implementation", "bogus", ValueError, r"`implementation` must be instance"),
    ],
)
def test_an_option_set_after_creation_is_checked_as_the_constructor_checks_it(
    field: str, value: Any, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        ar.CommunicationOptions(**{field: value})
    options = ar.CommunicationOptions(timeout_seconds=1.0)
    with pytest.raises(error, match=message):
        setattr(options, field, value)
    assert options == ar.CommunicationOptions(timeout_seconds=1.0)


async def test_valid_options_set_after_creation_are_used() -> None:
    options = ar.CommunicationOptions()
    options.implementation = "ring"
    options.bytes_per_pack = 8
    options.timeout_seconds = 5.0
    assert options.implementation is ar.CommunicationImplementation.RING
    assert options.merge(None) == options

    async def step() -> Any:
        return await _ctx().all_reduce("sum", np.ones(2), options=options)

    result = await strategy().run(step)
    np.testing.assert_array_equal(result.values[0], [2.0, 2.0])
