"""TensorFlow 2.21 tf.distribute behaviours that apply to numpy values.

Each test cites the section of /work/shared/reference/tf_distribute.md it mirrors. Where our
library deliberately differs from TF (DESIGN.md §3), the test follows DESIGN.md and says so.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

import numpy as np
import pytest

import asyncreplica as ar

pytestmark = pytest.mark.anyio

SHARED = object()


class NT(NamedTuple):
    a: Any
    b: Any


class MyDict(dict):
    pass


class FrozenMap(Mapping):
    """A Mapping that is not a dict, rebuilt by ``type(v0)({...})``."""

    def __init__(self, data: dict) -> None:
        self._data = dict(data)

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)


@dataclasses.dataclass
class Box:
    x: Any


@pytest.fixture
def two() -> ar.MirroredStrategy:
    return ar.MirroredStrategy(["CPU:0", "CPU:1"])


@pytest.fixture
def three() -> ar.MirroredStrategy:
    return ar.MirroredStrategy(["CPU:0", "CPU:1", "CPU:2"])


def rid() -> int:
    return ar.get_replica_context().replica_id_in_sync_group


def per_replica(*values: Any) -> ar.PerReplica:
    return ar.PerReplica(tuple(values))


# §1.1, §2.1, §2.10: context functions -------------------------------------------------------


async def test_default_context_outside_any_strategy() -> None:
    ctx = ar.get_replica_context()
    assert ctx is not None
    assert type(ctx.replica_id_in_sync_group) is int
    assert ctx.replica_id_in_sync_group == 0
    assert ctx.num_replicas_in_sync == 1
    assert ar.in_cross_replica_context() is False
    assert ar.has_strategy() is False
    assert ar.get_strategy().num_replicas_in_sync == 1


async def test_scope_enters_cross_replica_context(two: ar.MirroredStrategy) -> None:
    with two.scope():
        assert ar.get_replica_context() is None
        assert ar.in_cross_replica_context() is True
        assert ar.has_strategy() is True
        assert ar.get_strategy() is two
    assert ar.has_strategy() is False
    assert ar.get_replica_context() is not None


async def test_scope_is_reentrant_for_the_same_strategy(two: ar.MirroredStrategy) -> None:
    with two.scope(), two.scope():
        assert ar.get_strategy() is two
    assert ar.has_strategy() is False


async def test_context_inside_run(two: ar.MirroredStrategy) -> None:
    seen = []

    async def step():
        ctx = ar.get_replica_context()
        seen.append(
            (
                ctx.replica_id_in_sync_group,
                ctx.num_replicas_in_sync,
                ctx.strategy is two,
                ctx.devices,
                ar.in_cross_replica_context(),
                ar.has_strategy(),
                ar.get_strategy() is two,
            )
        )

    await two.run(step)

    assert sorted(seen) == [
        (0, 2, True, ("CPU:0",), False, True, True),
        (1, 2, True, ("CPU:1",), False, True, True),
    ]
    assert ar.has_strategy() is False


async def test_plain_function_runs_once_per_replica(two: ar.MirroredStrategy) -> None:
    def step(x):
        return x + rid()

    result = await two.run(step, args=(10,))

    assert isinstance(result, ar.PerReplica)
    assert result.values == (10, 11)


async def test_default_replica_context_all_reduce_is_identity() -> None:
    ctx = ar.get_replica_context()
    mean = await ctx.all_reduce(ar.ReduceOp.MEAN, 3)
    assert np.asarray(mean).dtype.kind == "i"
    np.testing.assert_array_equal(mean, 3)
    nest = await ctx.all_reduce("sum", {"x": [1.0, 2.0], "y": (np.arange(2),)})
    assert type(nest["x"]) is list
    assert type(nest["y"]) is tuple
    np.testing.assert_array_equal(nest["x"][1], 2.0)
    np.testing.assert_array_equal(nest["y"][0], [0, 1])
    assert await ctx.all_reduce("sum", []) == []


async def test_default_replica_context_all_gather_is_identity() -> None:
    ctx = ar.get_replica_context()
    value = np.arange(3)
    assert await ctx.all_gather(value, 0) is value
    # A scalar is refused, as a replica's all_gather refuses it (it was returned as it
    # was, and the program failed on its first run of several replicas).
    with pytest.raises(ValueError, match="rank >= 1"):
        await ctx.all_gather(5.0, 0)


async def test_default_replica_context_merge_call_is_direct_call() -> None:
    seen = []

    def merge_fn(strategy, a, *, b):
        seen.append(
            (
                strategy is ar.get_strategy(),
                ar.in_cross_replica_context(),
                ar.has_strategy(),
                ar.get_replica_context(),
            )
        )
        return (a, b)

    default = ar.get_strategy()
    result = await ar.get_replica_context().merge_call(merge_fn, args=(1,), kwargs={"b": SHARED})

    assert result == (1, SHARED)
    assert seen == [(True, True, False, None)]
    assert ar.get_strategy() is default


async def test_default_strategy_run_returns_unwrapped() -> None:
    default = ar.get_strategy()

    async def step(x):
        return (x, rid())

    assert await default.run(step, args=(SHARED,)) == (SHARED, 0)


async def test_default_strategy_cross_replica_apis_are_identity() -> None:
    default = ar.get_strategy()
    value = np.array([1.0, 2.0])
    np.testing.assert_array_equal(await default.reduce("sum", value, None), [1.0, 2.0])
    np.testing.assert_array_equal(await default.gather(value, 0), [1.0, 2.0])
    assert default.experimental_local_results(SHARED) == (SHARED,)
    ctx = default.experimental_distribute_values_from_function(lambda c: c)
    assert isinstance(ctx, ar.ValueContext)
    assert (ctx.replica_id_in_sync_group, ctx.num_replicas_in_sync) == (0, 1)
    assert await default.extended.batch_reduce_to("sum", []) == []


@pytest.mark.parametrize(
    ("op", "expected"), [pytest.param("sum", 3.0, id="sum"), pytest.param("mean", 1.5, id="mean")]
)
async def test_default_strategy_reduce_with_axis_reduces_locally(op: str, expected: float) -> None:
    result = await ar.get_strategy().reduce(op, np.array([1.0, 2.0]), axis=0)
    np.testing.assert_allclose(result, expected)


async def test_default_scope_does_not_enter_cross_replica_context() -> None:
    with ar.get_strategy().scope():
        assert ar.in_cross_replica_context() is False
        assert ar.has_strategy() is False


# §2.2: run argument unwrapping and result regrouping --------------------------------------


async def test_run_gives_each_replica_its_per_replica_component(two: ar.MirroredStrategy) -> None:
    pr = per_replica(np.array(1.0), np.array(2.0))
    mirrored = ar.Mirrored((np.array(5.0), np.array(6.0)))

    async def step(a, *, m, shared):
        return (a, m, shared)

    result = await two.run(step, args=(pr,), kwargs={"m": mirrored, "shared": SHARED})

    assert type(result) is tuple
    assert result[0].values[0] is pr.values[0]
    assert result[0].values[1] is pr.values[1]
    assert result[1].values == mirrored.values
    assert result[2] is SHARED


async def test_run_passes_plain_argument_objects_unchanged(two: ar.MirroredStrategy) -> None:
    arg = np.arange(3)
    seen = []

    async def step(x, nest):
        seen.append((x is arg, nest["k"][0] is arg))

    await two.run(step, args=(arg, {"k": [arg]}))

    assert seen == [(True, True), (True, True)]


async def test_run_returns_identical_object_unwrapped(two: ar.MirroredStrategy) -> None:
    async def step():
        return SHARED

    assert await two.run(step) is SHARED


async def test_run_wraps_equal_but_distinct_objects(two: ar.MirroredStrategy) -> None:
    async def step():
        return int("123456789012")

    result = await two.run(step)

    assert isinstance(result, ar.PerReplica)
    assert result.values == (123456789012, 123456789012)


@pytest.mark.parametrize(
    ("make", "container"),
    [
        pytest.param(lambda r: [r, 7], list, id="list"),
        pytest.param(lambda r: (r, 7), tuple, id="tuple"),
        pytest.param(lambda r: NT(r, 7), NT, id="namedtuple"),
        pytest.param(lambda r: {"a": r, "b": 7}, dict, id="dict"),
        pytest.param(lambda r: MyDict(a=r, b=7), MyDict, id="dict-subclass"),
        pytest.param(
            lambda r: collections.OrderedDict(a=r, b=7), collections.OrderedDict, id="ordereddict"
        ),
        pytest.param(lambda r: FrozenMap({"a": r, "b": 7}), FrozenMap, id="custom-mapping"),
    ],
)
async def test_run_rebuilds_containers(two: ar.MirroredStrategy, make, container) -> None:
    async def step():
        return make(rid())

    result = await two.run(step)

    assert type(result) is container
    first, second = (
        (result[0], result[1]) if container in (list, tuple, NT) else (result["a"], result["b"])
    )
    assert isinstance(first, ar.PerReplica)
    assert first.values == (0, 1)
    assert second == 7


async def test_run_treats_dataclass_as_leaf(two: ar.MirroredStrategy) -> None:
    async def step():
        return Box(rid())

    result = await two.run(step)

    assert isinstance(result, ar.PerReplica)
    assert result.values == (Box(0), Box(1))


async def test_run_with_one_replica_does_not_wrap() -> None:
    one = ar.MirroredStrategy(["CPU:0"])

    async def step():
        return int("123456789012")

    assert await one.run(step) == 123456789012


async def test_per_replica_repr() -> None:
    assert repr(per_replica(1, 2)) == "PerReplica:{\n  0: 1,\n  1: 2\n}"


# §2.3: merge_call ---------------------------------------------------------------------------


async def test_merge_call_regroups_args_and_kwargs(two: ar.MirroredStrategy) -> None:
    calls = []

    def mf(strategy, a, b, c, *, k):
        calls.append((strategy, a, b, c, k))

    async def step():
        r = rid()
        await ar.get_replica_context().merge_call(
            mf, args=(r * 10, [r, 5], SHARED), kwargs={"k": {"x": r}}
        )

    await two.run(step)

    assert len(calls) == 1
    strategy, a, b, c, k = calls[0]
    assert strategy is two
    assert isinstance(a, ar.PerReplica)
    assert a.values == (0, 10)
    assert type(b) is list
    assert isinstance(b[0], ar.PerReplica)
    assert b[0].values == (0, 1)
    assert b[1] == 5
    assert c is SHARED
    assert list(k) == ["x"]
    assert k["x"].values == (0, 1)


@pytest.mark.parametrize(
    "is_async", [pytest.param(False, id="plain"), pytest.param(True, id="async")]
)
async def test_merge_fn_runs_once_in_cross_replica_context(
    two: ar.MirroredStrategy, is_async: bool
) -> None:
    seen = []

    def record(strategy):
        seen.append(
            (
                strategy is two,
                ar.get_replica_context(),
                ar.in_cross_replica_context(),
                ar.get_strategy() is two,
            )
        )
        return "done"

    async def amf(strategy):
        return record(strategy)

    async def step():
        return await ar.get_replica_context().merge_call(amf if is_async else record)

    assert await two.run(step) == "done"
    assert seen == [(True, None, True, True)]


@pytest.mark.parametrize(
    ("merge_result", "expected"),
    [
        pytest.param(per_replica("b", "a"), ("b", "a"), id="per-replica"),
        pytest.param(ar.Mirrored((100, 200)), (100, 200), id="mirrored-not-checked"),
    ],
)
async def test_merge_call_distributes_components(
    two: ar.MirroredStrategy, merge_result, expected
) -> None:
    async def step():
        return await ar.get_replica_context().merge_call(lambda s: merge_result)

    result = await two.run(step)

    assert isinstance(result, ar.PerReplica)
    assert result.values == expected


async def test_merge_call_distributes_nests_leaf_by_leaf(two: ar.MirroredStrategy) -> None:
    got = {}

    def mf(strategy):
        return {"same": 3, "per": per_replica(1, 2), "lst": [per_replica(1, 2), "x"]}

    async def step():
        got[rid()] = await ar.get_replica_context().merge_call(mf)

    await two.run(step)

    assert got == {
        0: {"same": 3, "per": 1, "lst": [1, "x"]},
        1: {"same": 3, "per": 2, "lst": [2, "x"]},
    }


async def test_merge_fn_can_reduce_and_result_is_unwrapped(two: ar.MirroredStrategy) -> None:
    async def mf(strategy, value):
        return await strategy.reduce("sum", value, axis=None)

    async def step():
        return await ar.get_replica_context().merge_call(
            mf, args=(np.array([1.0, 2.0]) * (rid() + 1),)
        )

    result = await two.run(step)

    assert not isinstance(result, ar.PerReplica)
    np.testing.assert_array_equal(result, [3.0, 6.0])


async def test_merge_call_inside_merge_fn_is_a_context_error(two: ar.MirroredStrategy) -> None:
    contexts = {}

    async def mf(strategy):
        await contexts[0].merge_call(lambda s: None)

    async def step():
        ctx = ar.get_replica_context()
        contexts[ctx.replica_id_in_sync_group] = ctx
        await ctx.merge_call(mf)

    with pytest.raises(ar.ReplicaContextError):
        await two.run(step)


# §2.4, §2.5: all_reduce -----------------------------------------------------------------------


async def test_all_reduce_nest_keeps_structure_types(two: ar.MirroredStrategy) -> None:
    async def step():
        r = rid()
        value = {"x": [r, r * 10.0], "y": (r + 1.0,), "z": NT(a=r, b=np.full([2], r))}
        return await ar.get_replica_context().all_reduce("sum", value)

    for out in two.experimental_local_results(await two.run(step)):
        assert type(out) is dict
        assert type(out["x"]) is list
        assert type(out["y"]) is tuple
        assert type(out["z"]) is NT
        np.testing.assert_array_equal(out["x"][0], 1)
        np.testing.assert_array_equal(out["x"][1], 10.0)
        np.testing.assert_array_equal(out["y"][0], 3.0)
        np.testing.assert_array_equal(out["z"].a, 1)
        np.testing.assert_array_equal(out["z"].b, [1, 1])


async def test_all_reduce_empty_nest_returns_empty_list(two: ar.MirroredStrategy) -> None:
    async def step():
        return await ar.get_replica_context().all_reduce("sum", [])

    assert await two.run(step) == []


async def test_all_reduce_results_are_distinct_read_only_views(two: ar.MirroredStrategy) -> None:
    async def step():
        return await ar.get_replica_context().all_reduce("sum", np.arange(4.0))

    result = await two.run(step)

    assert isinstance(result, ar.PerReplica)
    first, second = result.values
    assert first is not second
    assert np.shares_memory(first, second)
    assert not first.flags.writeable
    np.testing.assert_array_equal(first, [0.0, 2.0, 4.0, 6.0])


async def test_all_reduce_scalar_gives_zero_dim_array(two: ar.MirroredStrategy) -> None:
    async def step():
        return await ar.get_replica_context().all_reduce("sum", 1.0)

    for out in two.experimental_local_results(await two.run(step)):
        assert isinstance(out, np.ndarray)
        assert out.shape == ()
        assert out == 2.0


@pytest.mark.parametrize(
    ("op", "expected"),
    [
        pytest.param("sum", 6.0, id="sum"),
        pytest.param("mean", 2.0, id="mean"),
        pytest.param("min", 1.0, id="min"),
        pytest.param("max", 3.0, id="max"),
        pytest.param("prod", 6.0, id="prod"),
    ],
)
async def test_all_reduce_three_replicas_ops(three: ar.MirroredStrategy, op, expected) -> None:
    async def step():
        return await ar.get_replica_context().all_reduce(op, np.float64(rid() + 1))

    for out in three.experimental_local_results(await three.run(step)):
        np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize(
    ("make", "op", "expected", "dtype"),
    [
        pytest.param(
            lambda r: np.array([1, 2]) * (r + 1), "mean", [1.5, 3.0], np.float64, id="int-mean"
        ),
        pytest.param(
            lambda r: np.array([1, 2], np.int32) * (r + 1),
            "mean",
            [1.5, 3.0],
            np.float64,
            id="int32-mean",
        ),
        pytest.param(
            lambda r: np.array([1, 2], np.int32) * (r + 1), "sum", [3, 6], np.int32, id="int32-sum"
        ),
        pytest.param(lambda r: np.float32(r + 1), "mean", 1.5, np.float32, id="float32-mean"),
        pytest.param(lambda r: np.float16(r + 1), "sum", 3.0, np.float16, id="float16-sum"),
        pytest.param(
            lambda r: np.array([1.0, 2.0]) * (r + 1),
            "sum",
            [3.0, 6.0],
            np.float64,
            id="float64-sum",
        ),
    ],
)
async def test_all_reduce_dtypes(two: ar.MirroredStrategy, make, op, expected, dtype) -> None:
    async def step():
        return await ar.get_replica_context().all_reduce(op, make(rid()))

    for out in two.experimental_local_results(await two.run(step)):
        assert np.asarray(out).dtype == dtype
        np.testing.assert_array_equal(out, expected)


async def test_all_reduce_indexed_slices_sum_concatenates(two: ar.MirroredStrategy) -> None:
    async def step():
        r = rid()
        value = ar.IndexedSlices(np.array([[r + 1.0]]), np.array([r]), np.array([2, 1]))
        return await ar.get_replica_context().all_reduce("sum", value)

    for out in two.experimental_local_results(await two.run(step)):
        np.testing.assert_array_equal(out.values, [[1.0], [2.0]])
        np.testing.assert_array_equal(out.indices, [0, 1])


async def test_all_reduce_indexed_slices_mean_scales_values(two: ar.MirroredStrategy) -> None:
    async def step():
        value = ar.IndexedSlices(np.array([[2.0]]), np.array([0]), np.array([2, 1]))
        return await ar.get_replica_context().all_reduce("mean", value)

    for out in two.experimental_local_results(await two.run(step)):
        np.testing.assert_array_equal(out.values, [[1.0], [1.0]])
        np.testing.assert_array_equal(out.indices, [0, 0])


# §2.6: all_gather and gather ------------------------------------------------------------------


async def test_all_gather_docstring_example(two: ar.MirroredStrategy) -> None:
    async def step():
        r = rid()
        b = np.array([[0, 1]]) if r == 0 else np.array([[2, 3], [4, 5]])
        return await ar.get_replica_context().all_gather({"a": np.array([r]), "b": b}, axis=0)

    for out in two.experimental_local_results(await two.run(step)):
        np.testing.assert_array_equal(out["a"], [0, 1])
        np.testing.assert_array_equal(out["b"], [[0, 1], [2, 3], [4, 5]])


async def test_all_gather_uneven_three_replicas(three: ar.MirroredStrategy) -> None:
    async def step():
        r = rid()
        return await ar.get_replica_context().all_gather(np.full([1 + r], float(r)), axis=0)

    for out in three.experimental_local_results(await three.run(step)):
        np.testing.assert_array_equal(out, [0.0, 1.0, 1.0, 2.0, 2.0, 2.0])


async def test_all_gather_along_axis_one(two: ar.MirroredStrategy) -> None:
    async def step():
        return await ar.get_replica_context().all_gather(np.array([[rid()]]), axis=1)

    for out in two.experimental_local_results(await two.run(step)):
        np.testing.assert_array_equal(out, [[0, 1]])


async def test_all_gather_empty_nest_returns_empty_list(two: ar.MirroredStrategy) -> None:
    async def step():
        return await ar.get_replica_context().all_gather([], axis=0)

    assert await two.run(step) == []


async def test_all_gather_rejects_rank_zero_leaves(two: ar.MirroredStrategy) -> None:
    caught = []

    async def step():
        try:
            await ar.get_replica_context().all_gather(np.float64(rid()), axis=0)
        except ValueError as exc:
            caught.append(exc)

    await two.run(step)

    assert len(caught) == 2


async def test_all_gather_rejects_indexed_slices(two: ar.MirroredStrategy) -> None:
    caught = []

    async def step():
        value = ar.IndexedSlices(np.array([[1.0]]), np.array([0]), np.array([2, 1]))
        try:
            await ar.get_replica_context().all_gather(value, axis=0)
        except NotImplementedError as exc:
            caught.append(exc)

    await two.run(step)

    assert len(caught) == 2


@pytest.mark.parametrize(
    ("axis", "shape"),
    [
        pytest.param(0, (2, 2, 3), id="axis0"),
        pytest.param(1, (1, 4, 3), id="axis1"),
        pytest.param(2, (1, 2, 6), id="axis2"),
    ],
)
async def test_gather_docstring_shapes(two: ar.MirroredStrategy, axis, shape) -> None:
    block = np.reshape(np.arange(6), (1, 2, 3))
    result = await two.gather(per_replica(block, block), axis)
    assert result.shape == shape
    np.testing.assert_array_equal(result, np.concatenate([block, block], axis=axis))


async def test_gather_concatenates_in_replica_order(two: ar.MirroredStrategy) -> None:
    result = await two.gather(per_replica(np.array([[1], [2]]), np.array([[3], [4]])), 0)
    np.testing.assert_array_equal(result, [[1], [2], [3], [4]])


async def test_gather_uneven_sizes_along_axis(two: ar.MirroredStrategy) -> None:
    result = await two.gather(per_replica(np.array([0.0]), np.array([1.0, 2.0])), 0)
    np.testing.assert_array_equal(result, [0.0, 1.0, 2.0])


async def test_gather_of_plain_value_is_unchanged(two: ar.MirroredStrategy) -> None:
    result = await two.gather(np.array([[1], [2]]), 0)
    np.testing.assert_array_equal(result, [[1], [2]])


async def test_gather_of_nest_gathers_each_leaf(two: ar.MirroredStrategy) -> None:
    # Deliberate difference: TF returns replica 0's components for a nest.
    g = per_replica(np.array([[1], [2]]), np.array([[3], [4]]))
    result = await two.gather((g, g), 0)
    assert type(result) is tuple
    for leaf in result:
        np.testing.assert_array_equal(leaf, [[1], [2], [3], [4]])


async def test_gather_rejects_rank_zero_leaves(two: ar.MirroredStrategy) -> None:
    with pytest.raises(ValueError, match=r"(?i)scalar|rank|0-d|dimension"):
        await two.gather(per_replica(np.float64(0.0), np.float64(1.0)), 0)


# §2.7: strategy.reduce -------------------------------------------------------------------------

EVEN = (np.array([0.0, 1.0, 2.0, 3.0]), np.array([4.0, 5.0, 6.0, 7.0]))
PARTIAL = (np.array([0.0, 1.0, 2.0, 3.0]), np.array([4.0, 5.0]))
ONES = (np.ones((2, 3)), np.ones((2, 3)) * 2)


@pytest.mark.parametrize(
    ("values", "op", "axis", "expected"),
    [
        pytest.param(EVEN, "sum", None, [4.0, 6.0, 8.0, 10.0], id="sum-none"),
        pytest.param(EVEN, "mean", None, [2.0, 3.0, 4.0, 5.0], id="mean-none"),
        pytest.param(EVEN, "sum", 0, 28.0, id="sum-axis0"),
        pytest.param(EVEN, "mean", 0, 3.5, id="mean-axis0"),
        pytest.param(EVEN, "sum", -1, 28.0, id="sum-axis-neg1"),
        pytest.param(EVEN, "mean", -1, 3.5, id="mean-axis-neg1"),
        pytest.param(PARTIAL, "mean", 0, 2.5, id="partial-mean-axis0"),
        pytest.param(PARTIAL, "sum", 0, 15.0, id="partial-sum-axis0"),
        pytest.param(ONES, "mean", (0, 1), 1.5, id="mean-axis-tuple"),
        pytest.param(ONES, "sum", (0, 1), 18.0, id="sum-axis-tuple"),
        pytest.param(ONES, "mean", [0, 1], 1.5, id="mean-axis-list"),
        pytest.param(ONES, "mean", 1, [1.5, 1.5], id="mean-axis1"),
    ],
)
async def test_reduce_table(two: ar.MirroredStrategy, values, op, axis, expected) -> None:
    result = await two.reduce(op, per_replica(*values), axis=axis)
    np.testing.assert_allclose(result, expected)


async def test_reduce_int_mean_with_axis_gives_float64(two: ar.MirroredStrategy) -> None:
    result = await two.reduce("mean", per_replica(np.arange(4), np.arange(4, 8)), axis=0)
    assert np.asarray(result).dtype == np.float64
    np.testing.assert_array_equal(result, 3.5)


async def test_reduce_partial_batch_without_axis_fails(two: ar.MirroredStrategy) -> None:
    with pytest.raises((ValueError, ar.CollectiveMismatchError)):
        await two.reduce("sum", per_replica(*PARTIAL), axis=None)


async def test_reduce_axis_out_of_range_is_value_error(two: ar.MirroredStrategy) -> None:
    with pytest.raises(ValueError, match=r"(?i)axis"):
        await two.reduce("sum", per_replica(*EVEN), axis=1)


async def test_reduce_nest_without_axis_maps_over_leaves(two: ar.MirroredStrategy) -> None:
    x = per_replica(np.float64(3.0), np.float64(3.0))
    y = per_replica(np.float64(2.0), np.float64(2.0))
    result = await two.reduce("sum", (x, y), None)
    assert type(result) is tuple
    np.testing.assert_array_equal(result[0], 6.0)
    np.testing.assert_array_equal(result[1], 4.0)


async def test_reduce_nest_with_axis_reduces_each_leaf(two: ar.MirroredStrategy) -> None:
    # Deliberate difference: TF stacks the nest into one tensor.
    pr = per_replica(*EVEN)
    result = await two.reduce("sum", (pr, pr), axis=0)
    assert type(result) is tuple
    np.testing.assert_array_equal(result[0], 28.0)
    np.testing.assert_array_equal(result[1], 28.0)


# §2.8, §2.9: non-distributed values, reduce_to, batch_reduce_to, broadcast_to -----------------


async def test_reduce_mean_of_plain_value_returns_it(two: ar.MirroredStrategy) -> None:
    np.testing.assert_array_equal(await two.reduce("mean", 3.0, None), 3.0)
    np.testing.assert_array_equal(await two.reduce("mean", np.array([1.0, 2.0]), None), [1.0, 2.0])


async def test_reduce_sum_of_plain_value_with_two_replicas_is_value_error(
    two: ar.MirroredStrategy,
) -> None:
    with pytest.raises(ValueError, match=r"(?i)sum"):
        await two.reduce("sum", np.float64(3.0), None)


async def test_reduce_sum_of_plain_value_with_one_replica_returns_it() -> None:
    one = ar.MirroredStrategy(["CPU:0"])
    np.testing.assert_array_equal(await one.reduce("sum", np.float64(3.0), None), 3.0)


async def test_reduce_to_per_replica_destination_gives_mirrored(two: ar.MirroredStrategy) -> None:
    pr = per_replica(np.array([1.0, 2.0]), np.array([2.0, 4.0]))
    result = await two.extended.reduce_to("sum", pr, pr)
    assert isinstance(result, ar.Mirrored)
    assert len(result.values) == 2
    for component in result.values:
        np.testing.assert_array_equal(component, [3.0, 6.0])


async def test_reduce_to_device_string_gives_single_value(two: ar.MirroredStrategy) -> None:
    pr = per_replica(np.array([1.0, 2.0]), np.array([2.0, 4.0]))
    result = await two.extended.reduce_to("mean", pr, "CPU:0")
    assert not isinstance(result, (ar.Mirrored, ar.PerReplica))
    np.testing.assert_array_equal(result, [1.5, 3.0])


async def test_reduce_to_maps_over_nests(two: ar.MirroredStrategy) -> None:
    pr = per_replica(np.float64(1.0), np.float64(2.0))
    pr2 = per_replica(np.float64(10.0), np.float64(20.0))
    result = await two.extended.reduce_to("sum", (pr, pr2), pr)
    assert type(result) is tuple
    assert all(isinstance(part, ar.Mirrored) for part in result)
    np.testing.assert_array_equal(result[0].values[1], 3.0)
    np.testing.assert_array_equal(result[1].values[0], 30.0)


@pytest.mark.parametrize("bytes_per_pack", [0, 4, 8, 1 << 20], ids=lambda b: f"bpp{b}")
async def test_batch_reduce_to_independent_of_packing(
    two: ar.MirroredStrategy, bytes_per_pack
) -> None:
    pr = per_replica(np.array([1.0, 2.0]), np.array([2.0, 4.0]))
    pr2 = per_replica(np.float64(10.0), np.float64(20.0))
    options = ar.CommunicationOptions(bytes_per_pack=bytes_per_pack)
    result = await two.extended.batch_reduce_to("sum", [(pr, pr), (pr2, pr2)], options)
    assert len(result) == 2
    assert all(isinstance(part, ar.Mirrored) for part in result)
    np.testing.assert_array_equal(result[0].values[0], [3.0, 6.0])
    np.testing.assert_array_equal(result[1].values[1], 30.0)


async def test_batch_reduce_to_empty_list(two: ar.MirroredStrategy) -> None:
    assert await two.extended.batch_reduce_to("sum", []) == []


async def test_broadcast_to_returns_python_float_unchanged(two: ar.MirroredStrategy) -> None:
    value = 1.5
    destinations = per_replica(np.float64(0.0), np.float64(0.0))
    assert await two.extended.broadcast_to(value, destinations) is value


async def test_broadcast_to_array_gives_mirrored(two: ar.MirroredStrategy) -> None:
    destinations = per_replica(np.float64(0.0), np.float64(0.0))
    result = await two.extended.broadcast_to(np.array([1.0, 2.0]), destinations)
    assert isinstance(result, ar.Mirrored)
    assert len(result.values) == 2
    for component in result.values:
        np.testing.assert_array_equal(component, [1.0, 2.0])


# Local results, distribute values and datasets (§1.3, §2.15) --------------------------------


async def test_local_results_of_per_replica(two: ar.MirroredStrategy) -> None:
    pr = per_replica("a", "b")
    assert two.experimental_local_results(pr) == ("a", "b")


async def test_local_results_of_nest(two: ar.MirroredStrategy) -> None:
    nest = {"p": per_replica(1, 2), "s": SHARED}
    assert two.experimental_local_results(nest) == ({"p": 1, "s": SHARED}, {"p": 2, "s": SHARED})


async def test_local_results_of_plain_value(two: ar.MirroredStrategy) -> None:
    assert two.experimental_local_results(SHARED) == (SHARED,)


async def test_distribute_values_from_function_always_wraps(two: ar.MirroredStrategy) -> None:
    contexts = []

    def value_fn(ctx):
        contexts.append((type(ctx), ctx.replica_id_in_sync_group, ctx.num_replicas_in_sync))
        return SHARED

    result = two.experimental_distribute_values_from_function(value_fn)

    assert isinstance(result, ar.PerReplica)
    assert result.values == (SHARED, SHARED)
    assert contexts == [(ar.ValueContext, 0, 2), (ar.ValueContext, 1, 2)]


@pytest.mark.parametrize(
    ("devices", "batches", "expected"),
    [
        pytest.param(4, [np.arange(6)], [[[0, 1], [2, 3], [4, 5], []]], id="6-over-4"),
        pytest.param(
            2,
            [np.arange(4), np.arange(4, 7)],
            [[[0, 1], [2, 3]], [[4, 5], [6]]],
            id="range7-batch4",
        ),
        pytest.param(
            2, [np.arange(4), np.arange(4, 5)], [[[0, 1], [2, 3]], [[4], []]], id="range5-batch4"
        ),
        pytest.param(
            2, [np.arange(2), np.arange(2, 4)], [[[0], [1]], [[2], [3]]], id="range4-batch2"
        ),
    ],
)
async def test_distribute_dataset_splits_batches(devices, batches, expected) -> None:
    strategy = ar.MirroredStrategy([f"CPU:{i}" for i in range(devices)])

    got = list(strategy.experimental_distribute_dataset(batches))

    assert len(got) == len(expected)
    for element, want in zip(got, expected, strict=True):
        assert isinstance(element, ar.PerReplica)
        assert len(element.values) == devices
        for component, part in zip(element.values, want, strict=True):
            np.testing.assert_array_equal(component, np.array(part, dtype=np.int64))


async def test_distribute_dataset_splits_along_axis_zero(two: ar.MirroredStrategy) -> None:
    (element,) = two.experimental_distribute_dataset([np.arange(8).reshape(4, 2)])
    np.testing.assert_array_equal(element.values[0], [[0, 1], [2, 3]])
    np.testing.assert_array_equal(element.values[1], [[4, 5], [6, 7]])


async def test_distribute_dataset_accepts_async_iterable(two: ar.MirroredStrategy) -> None:
    async def batches():
        yield np.arange(4)
        yield np.arange(4, 5)

    got = [element.values async for element in two.experimental_distribute_dataset(batches())]

    assert len(got) == 2
    np.testing.assert_array_equal(got[0][1], [2, 3])
    np.testing.assert_array_equal(got[1][0], [4])
    assert len(got[1][1]) == 0


# §1.5, §1.6: ReduceOp and CommunicationOptions ----------------------------------------------


@pytest.mark.parametrize(
    ("text", "op"),
    [
        pytest.param("sum", "SUM", id="sum"),
        pytest.param("Sum", "SUM", id="Sum"),
        pytest.param("SUM", "SUM", id="SUM"),
        pytest.param("mean", "MEAN", id="mean"),
        pytest.param("mIn", "MIN", id="mIn"),
        pytest.param("max", "MAX", id="max"),
        pytest.param("Prod", "PROD", id="Prod"),
    ],
)
def test_reduce_op_from_string_is_case_insensitive(text: str, op: str) -> None:
    assert ar.ReduceOp(text) is getattr(ar.ReduceOp, op)


@pytest.mark.parametrize("text", ["bogus", "", "su m"], ids=["bogus", "empty", "space"])
def test_reduce_op_invalid_string_is_value_error(text: str) -> None:
    with pytest.raises(ValueError, match=r"(?i)reduce ?op"):
        ar.ReduceOp(text)


def test_communication_options_defaults() -> None:
    options = ar.CommunicationOptions()
    assert options.bytes_per_pack == 0
    assert options.timeout_seconds is None
    assert options.implementation is ar.CommunicationImplementation.AUTO


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        pytest.param("ring", "RING", id="ring"),
        pytest.param("Nccl", "NCCL", id="Nccl"),
        pytest.param("AUTO", "AUTO", id="AUTO"),
        pytest.param(ar.CommunicationImplementation.RING, "RING", id="enum"),
    ],
)
def test_communication_options_implementation_accepts_strings(given, expected) -> None:
    options = ar.CommunicationOptions(implementation=given)
    assert options.implementation is getattr(ar.CommunicationImplementation, expected)


@pytest.mark.parametrize(
    "kwargs",
    [
        pytest.param({"bytes_per_pack": -1}, id="negative-bytes-per-pack"),
        pytest.param({"implementation": "bogus"}, id="unknown-implementation"),
        pytest.param({"implementation": 5}, id="implementation-int"),
    ],
)
def test_communication_options_validation(kwargs) -> None:
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        ar.CommunicationOptions(**kwargs)


@pytest.mark.parametrize(
    ("other", "expected"),
    [
        pytest.param(None, (16, 5.0, "RING"), id="none"),
        pytest.param(ar.CommunicationOptions(), (16, 5.0, "RING"), id="defaults-do-not-override"),
        pytest.param(ar.CommunicationOptions(bytes_per_pack=7), (7, 5.0, "RING"), id="bytes"),
        pytest.param(
            ar.CommunicationOptions(timeout_seconds=0), (16, 0, "RING"), id="timeout-zero"
        ),
        pytest.param(ar.CommunicationOptions(implementation="nccl"), (16, 5.0, "NCCL"), id="impl"),
    ],
)
def test_communication_options_merge(other, expected) -> None:
    base = ar.CommunicationOptions(bytes_per_pack=16, timeout_seconds=5.0, implementation="ring")

    merged = base.merge(other)

    assert merged is not base
    assert (merged.bytes_per_pack, merged.timeout_seconds, merged.implementation.name) == expected
    assert (base.bytes_per_pack, base.timeout_seconds, base.implementation.name) == (
        16,
        5.0,
        "RING",
    )


# §2.11, §2.12: failures -----------------------------------------------------------------------


async def test_exception_in_one_replica_is_reraised_as_is(two: ar.MirroredStrategy) -> None:
    boom = ValueError("boom 1")

    async def step():
        if rid() == 1:
            raise boom
        return await ar.get_replica_context().all_reduce("sum", 1.0)

    with pytest.raises(ValueError, match="boom 1") as info:
        await two.run(step)

    assert info.value is boom


async def test_exception_note_names_the_replica(two: ar.MirroredStrategy) -> None:
    async def step():
        if rid() == 1:
            raise KeyError("boom")
        await ar.get_replica_context().barrier()

    with pytest.raises(KeyError) as info:
        await two.run(step)

    notes = getattr(info.value, "__notes__", [])
    assert any("replica" in note.lower() and "1" in note for note in notes), notes


async def test_exception_in_merge_fn_is_reraised_as_is(two: ar.MirroredStrategy) -> None:
    boom = ZeroDivisionError("merge boom")

    def mf(strategy):
        raise boom

    async def step():
        await ar.get_replica_context().merge_call(mf)

    with pytest.raises(ZeroDivisionError) as info:
        await two.run(step)

    assert info.value is boom


async def test_strategy_usable_after_failure(two: ar.MirroredStrategy) -> None:
    async def bad():
        if rid() == 0:
            raise ValueError("boom")
        await ar.get_replica_context().all_reduce("sum", 1.0)

    async def good():
        return await ar.get_replica_context().all_reduce("sum", 1.0)

    with pytest.raises(ValueError, match="boom"):
        await two.run(bad)

    for out in two.experimental_local_results(await two.run(good)):
        np.testing.assert_array_equal(out, 2.0)


@pytest.mark.parametrize(
    "counts",
    [
        pytest.param((1, 0), id="r0-once-r1-never"),
        pytest.param((0, 1), id="r0-never-r1-once"),
        pytest.param((2, 1), id="two-vs-one"),
        pytest.param((1, 1, 0), id="last-of-three-skips"),
    ],
)
@pytest.mark.parametrize("kind", ["all_reduce", "merge_call"])
async def test_count_mismatch_raises_replica_exited(counts, kind) -> None:
    strategy = ar.MirroredStrategy([f"CPU:{i}" for i in range(len(counts))])

    async def step():
        ctx = ar.get_replica_context()
        for _ in range(counts[ctx.replica_id_in_sync_group]):
            if kind == "all_reduce":
                await ctx.all_reduce("sum", 1.0)
            else:
                await ctx.merge_call(lambda s: None)

    with pytest.raises(ar.ReplicaExitedError) as info:
        await strategy.run(step)

    assert isinstance(info.value, ar.CollectiveError)
    assert isinstance(info.value, RuntimeError)


async def test_replica_exited_error_names_replica_and_position(two: ar.MirroredStrategy) -> None:
    async def step():
        if rid() == 0:
            await ar.get_replica_context().all_reduce("sum", 1.0)

    with pytest.raises(ar.ReplicaExitedError) as info:
        await two.run(step)

    assert info.value.replica_id == 1
    assert info.value.position == 0


async def test_different_reduce_op_same_count_is_mismatch(two: ar.MirroredStrategy) -> None:
    # Deliberate difference: TF silently uses replica 0's op.
    async def step():
        op = "sum" if rid() == 0 else "mean"
        return await ar.get_replica_context().all_reduce(op, 1.0)

    with pytest.raises(ar.CollectiveMismatchError) as info:
        await two.run(step)

    assert isinstance(info.value, ar.CollectiveError)
    assert info.value.position == 0


async def test_different_collective_kind_same_count_is_mismatch(two: ar.MirroredStrategy) -> None:
    async def step():
        ctx = ar.get_replica_context()
        v = np.array([1.0, 2.0]) * (rid() + 1)
        if rid() == 0:
            return await ctx.all_reduce("sum", v)
        return await ctx.all_gather(v, 0)

    with pytest.raises(ar.CollectiveMismatchError):
        await two.run(step)


async def test_swapped_order_same_count_is_mismatch(two: ar.MirroredStrategy) -> None:
    async def step():
        ctx = ar.get_replica_context()
        r = rid()
        a, b = np.float64(1 + r), np.float64(10 * (r + 1))
        if r == 0:
            x = await ctx.all_reduce("sum", a)
            y = await ctx.all_reduce("sum", b)
        else:
            y = await ctx.all_reduce("sum", b)
            x = await ctx.all_reduce("sum", a)
        return x, y

    with pytest.raises(ar.CollectiveMismatchError):
        await two.run(step)


# Wrong-context errors ---------------------------------------------------------------------------


def test_replica_context_error_is_runtime_error() -> None:
    assert issubclass(ar.ReplicaContextError, RuntimeError)
    assert issubclass(ar.ReplicaContextError, ar.AsyncReplicaError)


async def test_stale_replica_context_after_run(two: ar.MirroredStrategy) -> None:
    captured = []

    async def step():
        captured.append(ar.get_replica_context())

    await two.run(step)

    with pytest.raises(ar.ReplicaContextError):
        await captured[0].all_reduce("sum", 1.0)


@pytest.mark.parametrize(
    "call",
    [
        pytest.param(lambda s: s.reduce("mean", 1.0, None), id="reduce"),
        pytest.param(lambda s: s.gather(np.ones(1), 0), id="gather"),
        pytest.param(lambda s: s.extended.reduce_to("mean", 1.0, "CPU:0"), id="reduce_to"),
        pytest.param(lambda s: s.extended.batch_reduce_to("mean", []), id="batch_reduce_to"),
        pytest.param(lambda s: s.extended.broadcast_to(1.0, "CPU:0"), id="broadcast_to"),
        pytest.param(lambda s: s.run(lambda: None), id="nested-run"),
    ],
)
async def test_cross_replica_api_inside_replica_is_context_error(
    two: ar.MirroredStrategy, call
) -> None:
    caught = []

    async def step():
        try:
            await call(two)
        except ar.ReplicaContextError as exc:
            caught.append(exc)

    await two.run(step)

    assert len(caught) == 2


async def test_scope_inside_replica_is_context_error(two: ar.MirroredStrategy) -> None:
    caught = []

    async def step():
        try:
            with two.scope():
                pass
        except ar.ReplicaContextError as exc:
            caught.append(exc)

    await two.run(step)

    assert len(caught) == 2


async def test_scope_mixing_two_strategies_is_context_error(two: ar.MirroredStrategy) -> None:
    other = ar.MirroredStrategy(["CPU:0"])
    with two.scope():
        with pytest.raises(ar.ReplicaContextError), other.scope():
            pass
        assert ar.get_strategy() is two


async def test_run_inside_scope_of_another_strategy_is_context_error(
    two: ar.MirroredStrategy,
) -> None:
    other = ar.MirroredStrategy(["CPU:0"])
    with two.scope(), pytest.raises(ar.ReplicaContextError):
        await other.run(lambda: None)


# Issue 15: parity fixes found by the TensorFlow golden run (tests/test_tf_golden.py) ------


async def test_reduce_with_axis_rejects_replicas_of_different_ranks(
    two: ar.MirroredStrategy,
) -> None:
    value = per_replica(np.ones((3, 2), np.float32), np.ones((0,), np.float32))
    for op in ("sum", "mean"):
        with pytest.raises(ValueError, match=r"replica 0 holds shape \(3, 2\); replica 1 holds"):
            await two.reduce(op, value, axis=0)


async def test_reduce_with_axis_rejects_disagreeing_other_dimensions(
    two: ar.MirroredStrategy,
) -> None:
    value = per_replica(np.ones((2, 3)), np.ones((2, 4)))
    with pytest.raises(ValueError, match="other dimensions must agree"):
        await two.reduce("sum", value, axis=0)


@pytest.mark.parametrize("axis", [None, 0, 1, -1, (0, 1), [0, 1]])
@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int32, np.uint8, np.int64])
async def test_reduce_sum_keeps_the_integer_dtype(
    two: ar.MirroredStrategy, axis: Any, dtype: Any
) -> None:
    value = per_replica(np.ones((2, 3), dtype), np.ones((2, 3), dtype))
    result = await two.reduce("sum", value, axis=axis)
    assert result.dtype == dtype
    ones = np.ones((2, 3), np.int64)
    expected = (
        ones if axis is None else ones.sum(axis=tuple(axis) if isinstance(axis, list) else axis)
    )
    np.testing.assert_array_equal(result, np.asarray(expected) * 2)


async def test_reduce_mean_of_integers_does_not_overflow(two: ar.MirroredStrategy) -> None:
    small = per_replica(np.full(2, 100, np.int8), np.full(2, 100, np.int8))
    np.testing.assert_array_equal(await two.reduce("mean", small, None), [100.0, 100.0])
    np.testing.assert_array_equal(await two.reduce("mean", small, 0), 100.0)
    big = per_replica(np.full(1, 2**62, np.int64), np.full(1, 2**62, np.int64))
    result = await two.reduce("mean", big, None)
    assert result.dtype == np.float64
    assert result[0] == 2.0**62


async def test_reduce_of_a_plain_array_returns_a_new_writable_array() -> None:
    one = ar.MirroredStrategy(["CPU:0"])
    two = ar.MirroredStrategy(["CPU:0", "CPU:1"])
    x = np.array([1, 2], np.int32)
    for strategy, op in ((one, "sum"), (one, "mean"), (two, "mean")):
        result = await strategy.reduce(op, x, None)
        assert result is not x
        assert result.dtype == np.int32
        result[0] = 7
        np.testing.assert_array_equal(x, [1, 2])
        single = await strategy.extended.reduce_to(op, x, "CPU:0")
        assert single is not x
        single[0] = 7
        np.testing.assert_array_equal(x, [1, 2])


@pytest.mark.parametrize("devices", [1, 2])
async def test_reduce_to_accepts_an_array_as_destinations(devices: int) -> None:
    strategy = ar.MirroredStrategy([f"CPU:{i}" for i in range(devices)])
    x = strategy.experimental_distribute_values_from_function(
        lambda c: np.array([c.replica_id_in_sync_group + 1.0])
    )
    target = np.zeros(1)
    result = await strategy.extended.reduce_to("sum", x, destinations=target)
    assert isinstance(result, np.ndarray)
    np.testing.assert_array_equal(result, [sum(range(1, devices + 1))])
    # TF's idiom reduce_to(op, x, destinations=x) is an all-reduce: one value at N=1.
    same = await strategy.extended.reduce_to("sum", x, destinations=x)
    assert isinstance(same, ar.Mirrored if devices > 1 else np.ndarray)


async def test_broadcast_to_one_device_gives_a_plain_array(two: ar.MirroredStrategy) -> None:
    x = np.array([1.0, 2.0])
    result = await two.extended.broadcast_to(x, "CPU:0")
    assert isinstance(result, np.ndarray)
    assert result is not x
    np.testing.assert_array_equal(result, x)


@pytest.mark.parametrize("value", [(), {}, (5, "x"), [SHARED]])
async def test_local_results_of_a_nest_without_distributed_leaves(
    two: ar.MirroredStrategy, value: Any
) -> None:
    assert two.experimental_local_results(value) == (value, value)
    assert ar.MirroredStrategy(["CPU:0"]).experimental_local_results(value) == (value,)


async def test_values_from_function_regroups_a_dict_into_a_dict_of_per_replica(
    two: ar.MirroredStrategy,
) -> None:
    result = two.experimental_distribute_values_from_function(
        lambda c: {"x": c.replica_id_in_sync_group, "n": (SHARED,)}
    )
    assert isinstance(result, dict)
    assert result["x"] == per_replica(0, 1)
    # Every leaf is wrapped (TF's always_wrap), also a shared object.
    assert isinstance(result["n"], tuple)
    assert result["n"][0] == per_replica(SHARED, SHARED)


async def test_values_from_function_wraps_at_one_replica() -> None:
    one = ar.MirroredStrategy(["CPU:0"])
    assert one.experimental_distribute_values_from_function(lambda c: 3) == per_replica(3)


async def test_distribute_dataset_with_one_replica_yields_plain_batches() -> None:
    one = ar.MirroredStrategy(["CPU:0"])
    got = list(one.experimental_distribute_dataset([np.arange(3), {"a": np.arange(2)}]))
    assert isinstance(got[0], np.ndarray)
    np.testing.assert_array_equal(got[0], [0, 1, 2])
    assert isinstance(got[1]["a"], np.ndarray)


async def test_distribute_dataset_of_a_zero_d_array_says_what_to_do(
    two: ar.MirroredStrategy,
) -> None:
    with pytest.raises(TypeError, match=r"0-d array.*np\.array\(\[3\.0\]\)"):
        list(two.experimental_distribute_dataset([np.array(3.0)]))


async def test_distribute_dataset_re_iterates_a_re_iterable_input(
    two: ar.MirroredStrategy,
) -> None:
    dataset = two.experimental_distribute_dataset([np.arange(4), np.arange(2)])
    assert len(list(dataset)) == 2
    assert len(list(dataset)) == 2
    assert len([x async for x in dataset]) == 2


async def test_distribute_dataset_second_pass_over_a_generator_raises(
    two: ar.MirroredStrategy,
) -> None:
    dataset = two.experimental_distribute_dataset(np.arange(4) + i for i in range(2))
    assert len(list(dataset)) == 2
    with pytest.raises(RuntimeError, match=r"one-shot iterator.*consumed"):
        list(dataset)


async def test_distribute_dataset_second_pass_over_an_async_generator_raises(
    two: ar.MirroredStrategy,
) -> None:
    async def batches():
        yield np.arange(4)

    dataset = two.experimental_distribute_dataset(batches())
    assert len([x async for x in dataset]) == 1
    with pytest.raises(RuntimeError, match="one-shot iterator"):
        [x async for x in dataset]


async def test_batch_reduce_to_requires_tuples(two: ar.MirroredStrategy) -> None:
    pr = per_replica(np.ones(1), np.ones(1))
    for bad in ([[pr, pr]], [pr], [(pr,)], [(pr, pr, pr)]):
        with pytest.raises(ValueError, match="should be a tuple"):
            await two.extended.batch_reduce_to("sum", bad)


async def test_batch_reduce_to_is_one_batched_reduction(
    two: ar.MirroredStrategy, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = two.backend
    calls: list[int] = []
    original = backend.all_reduce

    async def counting(op: Any, values: Any, **kwargs: Any) -> Any:
        calls.append(len(values[0]))
        return await original(op, values, **kwargs)

    monkeypatch.setattr(backend, "all_reduce", counting)
    a = per_replica(np.float32(1), np.float32(2))
    b = per_replica(np.arange(3.0), np.arange(3.0))
    c = per_replica(np.array([1], np.int64), np.array([2], np.int64))
    result = await two.extended.batch_reduce_to("sum", [(a, a), (b, "CPU:0"), ((c, a), c)])
    assert calls == [3]  # one reduction of the three distinct values
    assert isinstance(result[0], ar.Mirrored)
    np.testing.assert_array_equal(result[1], [0.0, 2.0, 4.0])
    assert result[1].flags.writeable
    assert result[2][0] == ar.Mirrored([np.array([3]), np.array([3])])
    assert float(result[2][1].values[1]) == 3.0


async def test_distribute_datasets_from_function(two: ar.MirroredStrategy) -> None:
    contexts = []

    def dataset_fn(ctx: ar.InputContext) -> list[np.ndarray]:
        contexts.append(ctx)
        batch = ctx.get_per_replica_batch_size(8)
        data = np.arange(11.0)
        return [data[i : i + batch] for i in range(0, len(data), batch)]

    dataset = two.distribute_datasets_from_function(dataset_fn)
    (ctx,) = contexts
    assert (ctx.num_input_pipelines, ctx.input_pipeline_id, ctx.num_replicas_in_sync) == (1, 0, 2)
    steps = [two.experimental_local_results(x) for x in dataset]
    assert len(steps) == 2
    np.testing.assert_array_equal(steps[0][1], [4, 5, 6, 7])
    np.testing.assert_array_equal(steps[1][0], [8, 9, 10])
    assert steps[1][1].shape == (0,)  # the input ran out: an empty batch, as in TF
    assert len(list(dataset)) == 2  # re-iterable
    alias = two.experimental_distribute_datasets_from_function(dataset_fn)
    assert len([x async for x in alias]) == 2


async def test_distribute_datasets_from_function_indivisible_batch(
    two: ar.MirroredStrategy,
) -> None:
    three = ar.MirroredStrategy(["CPU:0", "CPU:1", "CPU:2"])
    with pytest.raises(ValueError, match="`global_batch_size` 8 is not divisible by"):
        three.distribute_datasets_from_function(lambda c: [c.get_per_replica_batch_size(8)])
    with pytest.raises(TypeError, match="iterable"):
        two.distribute_datasets_from_function(lambda c: 3)
    with pytest.raises(ValueError, match="options"):
        two.distribute_datasets_from_function(lambda c: [], options=object())


async def test_input_context_defaults_and_repr() -> None:
    ctx = ar.InputContext()
    assert (ctx.num_input_pipelines, ctx.input_pipeline_id, ctx.num_replicas_in_sync) == (1, 0, 1)
    assert ctx.get_per_replica_batch_size(5) == 5
    assert "input_pipeline_id=0" in repr(ctx)


async def test_update_in_cross_replica_context(two: ar.MirroredStrategy) -> None:
    var = ar.Mirrored([np.ones(2), np.ones(2)])
    delta = per_replica(np.float64(1), np.float64(2))

    grouped = await two.extended.update(var, lambda v, d: v + d, args=(delta,))
    assert isinstance(grouped, ar.Mirrored)
    np.testing.assert_array_equal(grouped.values[1], [3.0, 3.0])

    async def double(v: np.ndarray) -> np.ndarray:
        return v * 2

    ungrouped = await two.extended.update(var, double, group=False)
    assert isinstance(ungrouped, tuple)
    assert len(ungrouped) == 2
    with pytest.raises(TypeError, match="distributed value"):
        await two.extended.update(np.ones(2), double)


async def test_update_in_replica_context_goes_through_merge_call(
    two: ar.MirroredStrategy,
) -> None:
    var = ar.Mirrored([np.zeros(1), np.zeros(1)])
    calls = []

    def add(v: np.ndarray, d: Any) -> np.ndarray:
        calls.append(ar.in_cross_replica_context())
        return v + d

    async def step() -> Any:
        return await two.extended.update(var, add, args=(float(rid() + 1),))

    result = await two.run(step)
    assert calls == [True, True]  # once per component, in cross-replica context
    local = two.experimental_local_results(result)
    np.testing.assert_array_equal(local[0], [1.0])
    np.testing.assert_array_equal(local[1], [2.0])


async def test_update_in_replica_context_is_a_collective(two: ar.MirroredStrategy) -> None:
    var = ar.Mirrored([np.zeros(1), np.zeros(1)])

    async def step() -> Any:
        if rid() == 0:
            return await two.extended.update(var, lambda v: v)
        return None

    with pytest.raises(ar.ReplicaExitedError):
        await two.run(step)


async def test_call_for_each_replica(two: ar.MirroredStrategy) -> None:
    async def fn(x: Any) -> Any:
        return x + rid()

    result = await two.extended.call_for_each_replica(fn, args=[10])
    assert result == per_replica(10, 11)

    async def merge_fn(strategy: ar.Strategy) -> Any:
        return await strategy.extended.call_for_each_replica(fn, args=(0,))

    async def step() -> Any:
        return await ar.get_replica_context().merge_call(merge_fn)

    assert await two.run(step) == per_replica(0, 1)

    async def nested() -> Any:
        return await two.extended.call_for_each_replica(fn, args=(0,))

    with pytest.raises(ar.ReplicaContextError):
        await two.run(nested)


async def test_value_container_and_cluster_resolver(two: ar.MirroredStrategy) -> None:
    x = np.ones(1)
    assert two.extended.value_container(x) is x
    assert two.cluster_resolver is None
    assert ar.get_strategy().cluster_resolver is None


async def test_get_cross_replica_context(two: ar.MirroredStrategy) -> None:
    assert ar.get_cross_replica_context() is None
    with two.scope():
        assert ar.get_cross_replica_context() is two

    seen = []

    def merge_fn(strategy: ar.Strategy) -> None:
        seen.append(ar.get_cross_replica_context())

    async def step() -> None:
        seen.append(ar.get_cross_replica_context())
        await ar.get_replica_context().merge_call(merge_fn)

    await two.run(step)
    assert seen == [None, None, two]


def test_experimental_set_strategy(two: ar.MirroredStrategy) -> None:
    other = ar.MirroredStrategy(["CPU:0"])
    try:
        ar.experimental_set_strategy(two)
        assert ar.get_strategy() is two
        assert ar.in_cross_replica_context()
        ar.experimental_set_strategy(other)  # replaces, as in TF
        assert ar.get_strategy() is other
        ar.experimental_set_strategy(None)
        assert not ar.has_strategy()
        with two.scope(), pytest.raises(RuntimeError, match="Must not be called inside"):
            ar.experimental_set_strategy(other)
        with pytest.raises(TypeError):
            ar.experimental_set_strategy("CPU:0")  # type: ignore[arg-type]
    finally:
        ar.experimental_set_strategy(None)
    assert not ar.has_strategy()
