"""Bad input gets a precise error, and nothing the user passes is modified."""

from __future__ import annotations

import copy
import re

import numpy as np
import pytest

import asyncreplica as ar

pytestmark = pytest.mark.anyio


@pytest.fixture
def two() -> ar.MirroredStrategy:
    return ar.MirroredStrategy(["CPU:0", "CPU:1"])


def rid() -> int:
    return ar.get_replica_context().replica_id_in_sync_group


# Devices and backends -----------------------------------------------------------------------


@pytest.mark.parametrize("device", ["TPU:0", "CPU:x", "", "CPU:-1", "CPU"], ids=str.__repr__)
def test_unknown_device_is_value_error(device: str) -> None:
    with pytest.raises(ValueError, match=r"(?i)device"):
        ar.MirroredStrategy(["CPU:0", device])


@pytest.mark.parametrize(
    ("devices", "canonical"),
    [
        pytest.param(["CPU:0", "CPU:0"], "CPU:0", id="same-spelling"),
        pytest.param(["CPU:1", "/cpu:1"], "CPU:1", id="tf-short-spelling"),
        pytest.param(
            ["CPU:1", "/job:localhost/replica:0/task:0/device:CPU:1"],
            "CPU:1",
            id="tf-long-spelling",
        ),
    ],
)
def test_duplicate_devices_is_value_error(devices: list[str], canonical: str) -> None:
    with pytest.raises(ValueError, match=canonical):
        ar.MirroredStrategy(devices)


def test_empty_device_list_is_value_error() -> None:
    with pytest.raises(ValueError, match=r"(?i)device"):
        ar.MirroredStrategy([])


@pytest.mark.parametrize(
    "device",
    ["/cpu:1", "/job:localhost/replica:0/task:0/device:CPU:1", "CPU:1"],
    ids=["short", "long", "canonical"],
)
def test_tf_device_spellings_are_canonicalised(device: str) -> None:
    strategy = ar.MirroredStrategy(["CPU:0", device])
    assert tuple(strategy.extended.worker_devices) == ("CPU:0", "CPU:1")


def test_unknown_backend_lists_available_backends() -> None:
    with pytest.raises(ar.BackendNotFoundError) as info:
        ar.MirroredStrategy(["CPU:0"], backend="no-such-backend")

    assert isinstance(info.value, LookupError)
    assert info.value.name == "no-such-backend"
    assert "numpy" in info.value.available
    assert "no-such-backend" in str(info.value)
    assert "numpy" in str(info.value)


# Reduce ops -----------------------------------------------------------------------------------


@pytest.mark.parametrize("op", ["bogus", "", "average"], ids=["bogus", "empty", "average"])
def test_reduce_op_constructor_rejects_unknown_name(op: str) -> None:
    with pytest.raises(ValueError, match=r"(?i)reduce ?op"):
        ar.ReduceOp(op)


async def test_strategy_reduce_rejects_unknown_op(two: ar.MirroredStrategy) -> None:
    with pytest.raises(ValueError, match="bogus"):
        await two.reduce("bogus", ar.PerReplica((np.float64(1.0), np.float64(2.0))), None)


async def test_reduce_to_rejects_unknown_op(two: ar.MirroredStrategy) -> None:
    pr = ar.PerReplica((np.float64(1.0), np.float64(2.0)))
    with pytest.raises(ValueError, match="bogus"):
        await two.extended.reduce_to("bogus", pr, pr)


async def test_all_reduce_rejects_unknown_op(two: ar.MirroredStrategy) -> None:
    caught = []

    async def step():
        try:
            await ar.get_replica_context().all_reduce("bogus", 1.0)
        except ValueError as exc:
            caught.append(exc)

    await two.run(step)

    assert len(caught) == 2


# Non-numeric leaves -----------------------------------------------------------------------------

NON_NUMERIC = [
    pytest.param("a", id="str"),
    pytest.param(None, id="none"),
    pytest.param(object(), id="object"),
    pytest.param([1.0, "a"], id="str-in-list"),
    pytest.param({"k": None}, id="none-in-dict"),
]


@pytest.mark.parametrize("leaf", NON_NUMERIC)
async def test_all_reduce_rejects_non_numeric_leaves(two: ar.MirroredStrategy, leaf) -> None:
    caught = []

    async def step():
        try:
            await ar.get_replica_context().all_reduce("sum", leaf)
        except TypeError as exc:
            caught.append(exc)

    await two.run(step)

    assert len(caught) == 2


@pytest.mark.parametrize("leaf", NON_NUMERIC[:3])
async def test_all_gather_rejects_non_numeric_leaves(two: ar.MirroredStrategy, leaf) -> None:
    caught = []

    async def step():
        try:
            await ar.get_replica_context().all_gather(leaf, 0)
        except TypeError as exc:
            caught.append(exc)

    await two.run(step)

    assert len(caught) == 2


@pytest.mark.parametrize("leaf", NON_NUMERIC[:3])
async def test_strategy_reduce_rejects_non_numeric_components(
    two: ar.MirroredStrategy, leaf
) -> None:
    with pytest.raises(TypeError):
        await two.reduce("sum", ar.PerReplica((leaf, leaf)), None)


# Options ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("bytes_per_pack", [-1, -(1 << 20)], ids=["minus-one", "minus-1MiB"])
def test_negative_bytes_per_pack_is_value_error(bytes_per_pack: int) -> None:
    with pytest.raises(ValueError, match="bytes_per_pack"):
        ar.CommunicationOptions(bytes_per_pack=bytes_per_pack)


def test_strategy_rejects_negative_bytes_per_pack_at_construction() -> None:
    with pytest.raises(ValueError, match="bytes_per_pack"):
        ar.MirroredStrategy(
            ["CPU:0"], communication_options=ar.CommunicationOptions(bytes_per_pack=-1)
        )


# run() arguments --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(1, id="int"),
        pytest.param("ab", id="str"),
        pytest.param({"a": 1}, id="dict"),
        pytest.param(np.array([1, 2]), id="ndarray"),
        pytest.param(None, id="none"),
    ],
)
async def test_run_args_must_be_list_or_tuple(two: ar.MirroredStrategy, args) -> None:
    calls = []

    async def step(*a):
        calls.append(a)

    with pytest.raises(ValueError, match=r"(?i)list or tuple"):
        await two.run(step, args=args)

    assert calls == []


async def test_run_accepts_list_args(two: ar.MirroredStrategy) -> None:
    async def step(a, b):
        return a + b

    assert await two.run(step, args=[1, 2]) == 3


async def test_run_rejects_coroutine_object_with_right_call(two: ar.MirroredStrategy) -> None:
    async def step(x):
        return x

    coro = step(1)
    try:
        with pytest.raises(TypeError) as info:
            await two.run(coro)
    finally:
        coro.close()

    message = str(info.value)
    assert re.search(r"run\([\w.<>]*\bstep, args=", message), message


# Nothing the user passed is modified; results are read-only ---------------------------------------


async def test_all_reduce_does_not_modify_inputs(two: ar.MirroredStrategy) -> None:
    shared = np.arange(4.0)
    nest = {"w": shared, "parts": [shared, np.ones(2)]}
    snapshot = copy.deepcopy(nest)
    parts = nest["parts"]

    async def step():
        return await ar.get_replica_context().all_reduce("sum", nest)

    result = await two.run(step)

    assert list(nest) == ["w", "parts"]
    assert nest["parts"] is parts
    assert len(parts) == 2
    assert nest["w"] is shared
    np.testing.assert_array_equal(shared, snapshot["w"])
    np.testing.assert_array_equal(parts[1], snapshot["parts"][1])
    assert shared.flags.writeable
    np.testing.assert_array_equal(two.experimental_local_results(result)[1]["w"], shared * 2)


@pytest.mark.parametrize("op", ["sum", "mean", "min", "max", "prod"])
async def test_all_reduce_does_not_write_per_replica_inputs(two: ar.MirroredStrategy, op) -> None:
    inputs = (np.array([1.0, 2.0]), np.array([3.0, 4.0]))
    for x in inputs:
        x.flags.writeable = False

    async def step():
        return await ar.get_replica_context().all_reduce(op, inputs[rid()])

    await two.run(step)

    np.testing.assert_array_equal(inputs[0], [1.0, 2.0])
    np.testing.assert_array_equal(inputs[1], [3.0, 4.0])


async def test_run_does_not_modify_per_replica_or_kwargs(two: ar.MirroredStrategy) -> None:
    pr = ar.PerReplica((np.array([1.0]), np.array([2.0])))
    values = pr.values
    kwargs = {"cfg": {"lr": 0.1}, "pr": pr}

    async def step(*, cfg, pr):
        return await ar.get_replica_context().all_reduce("sum", pr)

    await two.run(step, kwargs=kwargs)

    assert pr.values is values
    np.testing.assert_array_equal(values[0], [1.0])
    np.testing.assert_array_equal(values[1], [2.0])
    assert list(kwargs) == ["cfg", "pr"]
    assert kwargs["cfg"] == {"lr": 0.1}
    assert kwargs["pr"] is pr


async def test_merge_call_does_not_modify_arguments(two: ar.MirroredStrategy) -> None:
    args_list = [np.arange(3.0), {"k": 1}]
    snapshot = copy.deepcopy(args_list)

    def mf(strategy, lst):
        return None

    async def step():
        await ar.get_replica_context().merge_call(mf, args=(args_list,))

    await two.run(step)

    assert len(args_list) == 2
    np.testing.assert_array_equal(args_list[0], snapshot[0])
    assert args_list[1] == snapshot[1]


async def test_strategy_reduce_does_not_modify_components(two: ar.MirroredStrategy) -> None:
    a, b = np.array([1.0, 2.0]), np.array([3.0, 4.0])

    for op in ("sum", "mean"):
        await two.reduce(op, ar.PerReplica((a, b)), axis=None)
        await two.reduce(op, ar.PerReplica((a, b)), axis=0)

    np.testing.assert_array_equal(a, [1.0, 2.0])
    np.testing.assert_array_equal(b, [3.0, 4.0])


async def test_distribute_dataset_does_not_modify_batches(two: ar.MirroredStrategy) -> None:
    batch = np.arange(6)
    batches = [batch]

    list(two.experimental_distribute_dataset(batches))

    assert batches == [batch]
    np.testing.assert_array_equal(batch, np.arange(6))


COLLECTIVES = [
    pytest.param(lambda ctx, x: ctx.all_reduce("sum", x), id="all_reduce"),
    pytest.param(lambda ctx, x: ctx.all_gather(x, 0), id="all_gather"),
    pytest.param(lambda ctx, x: ctx.broadcast(x, 0), id="broadcast"),
    pytest.param(lambda ctx, x: ctx.reduce_scatter("sum", x, 0), id="reduce_scatter"),
]


@pytest.mark.parametrize("collective", COLLECTIVES)
async def test_collective_results_are_read_only(two: ar.MirroredStrategy, collective) -> None:
    async def step():
        return await collective(ar.get_replica_context(), np.arange(4.0))

    for out in two.experimental_local_results(await two.run(step)):
        assert isinstance(out, np.ndarray)
        assert not out.flags.writeable
        with pytest.raises(ValueError, match="read-only"):
            out[0] = 99.0


async def test_strategy_reduce_result_does_not_alias_inputs(two: ar.MirroredStrategy) -> None:
    a, b = np.arange(3.0), np.arange(3.0)
    result = await two.reduce("sum", ar.PerReplica((a, b)), None)
    np.testing.assert_array_equal(result, [0.0, 2.0, 4.0])
    assert not np.shares_memory(result, a)
    assert not np.shares_memory(result, b)
