"""TensorFlow parity of the input pipeline and of plain values (issue 25).

Each case is TensorFlow 2.21's measured behaviour (also recorded in tests/tf_golden):
static per-replica batches end the epoch, unbatched elements, the distributed
iterator's API, and plain values through ``reduce``, ``reduce_to`` and ``broadcast_to``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import numpy as np
import pytest

import asyncreplica as ar
from asyncreplica._runtime._input import UNKNOWN_CARDINALITY, DistributedIterator
from asyncreplica.abc import LeafSpec

pytestmark = pytest.mark.anyio


def strategy(n: int) -> ar.MirroredStrategy:
    return ar.MirroredStrategy([f"CPU:{i}" for i in range(n)])


def batches(size: int, batch: int, drop_remainder: bool = False) -> list[np.ndarray]:
    data = np.arange(size)
    out = [data[i : i + batch] for i in range(0, size, batch)]
    return [b for b in out if len(b) == batch] if drop_remainder else out


def steps(s: ar.MirroredStrategy, dataset: Any) -> list[list[list[Any]]]:
    return [[np.asarray(c).tolist() for c in s.experimental_local_results(x)] for x in dataset]


# distribute_datasets_from_function: the end of the data -------------------------------


async def test_static_batches_end_the_epoch_when_the_data_runs_out_mid_step() -> None:
    two = strategy(2)
    dataset = two.distribute_datasets_from_function(lambda c: batches(11, 2, True))
    assert steps(two, dataset) == [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]  # TF: no [[8, 9], []]
    dataset = two.distribute_datasets_from_function(lambda c: batches(22, 2, True))
    assert len(list(dataset)) == 5  # TF: 5 steps
    assert len([x async for x in dataset]) == 5


async def test_a_shorter_remainder_batch_pads_the_last_step_with_empty_batches() -> None:
    two = strategy(2)
    got = list(two.distribute_datasets_from_function(lambda c: batches(9, 2)))
    assert len(got) == 3
    last = got[-1].values
    np.testing.assert_array_equal(last[0], [8])
    assert last[1].shape == (0,)
    assert last[1].dtype == last[0].dtype


async def test_empty_batches_keep_the_rank_of_the_batches() -> None:
    two = strategy(2)
    rows = np.arange(14.0).reshape(7, 2)
    got = list(two.distribute_datasets_from_function(lambda c: [rows[:4], rows[4:]]))
    assert len(got) == 1  # a complete step
    three = strategy(3)
    got = list(three.distribute_datasets_from_function(lambda c: [rows[:4], rows[4:]]))
    assert [c.shape for c in got[0].values] == [(4, 2), (3, 2), (0, 2)]


async def test_unbatched_scalars_are_one_element_per_replica() -> None:
    two = strategy(2)
    dataset = two.distribute_datasets_from_function(lambda c: list(np.arange(5)))
    assert steps(two, dataset) == [[0, 1], [2, 3]]  # TF yields these two steps


async def test_unbatched_rows_never_get_empty_batches_of_another_rank() -> None:
    two = strategy(2)
    rows = list(np.arange(10.0).reshape(5, 2))
    got = list(two.distribute_datasets_from_function(lambda c: rows))
    assert len(got) == 2
    assert {c.shape for x in got for c in x.values} == {(2,)}


async def test_the_async_path_follows_the_same_rule() -> None:
    two = strategy(2)

    class Source:
        def __aiter__(self) -> AsyncIterator[np.ndarray]:
            return self.gen()

        async def gen(self) -> AsyncIterator[np.ndarray]:
            for b in batches(11, 2, True):
                yield b

    dataset = two.distribute_datasets_from_function(lambda c: Source())
    assert len([x async for x in dataset]) == 2


async def test_get_next_as_optional_and_reduce_still_see_the_padded_last_step() -> None:
    # TF 2.21: for-loops end before the partial step of static batches, but
    # get_next_as_optional and dataset.reduce give it, padded (a scalar with zero).
    two = strategy(2)
    dataset = two.distribute_datasets_from_function(lambda c: batches(11, 2, True))
    it = iter(dataset)
    got = [it.get_next_as_optional() for _ in range(4)]
    assert [o.has_value() for o in got] == [True, True, True, False]
    tail = got[2].get_value().values
    np.testing.assert_array_equal(tail[0], [8, 9])
    assert tail[1].shape == (0,)

    async def fold(state: Any, x: Any) -> Any:
        return state + await two.reduce("SUM", x, axis=0)

    assert await dataset.reduce(np.int64(0), fold) == 45  # TF: 45, the tail included
    assert len([x async for x in dataset]) == 2
    it = iter(dataset)
    assert len([next(it), next(it)]) == 2
    with pytest.raises(StopIteration):
        next(it)  # before the tail
    assert not it.get_next_as_optional().has_value()  # and stays at its end
    scalars = two.distribute_datasets_from_function(lambda c: list(np.arange(5)))
    it = iter(scalars)
    values = [it.get_next_as_optional().get_value().values for _ in range(3)]
    assert [[int(v) for v in step] for step in values] == [[0, 1], [2, 3], [4, 0]]


# experimental_distribute_dataset of unbatched elements --------------------------------


async def test_one_replica_passes_unbatched_elements_through() -> None:
    one = strategy(1)
    got = list(one.experimental_distribute_dataset(list(np.arange(3))))
    assert got == [0, 1, 2]
    marker = object()
    assert list(one.experimental_distribute_dataset([marker])) == [marker]


async def test_unbatched_elements_on_several_replicas_raise_index_and_type_error() -> None:
    two = strategy(2)
    with pytest.raises(IndexError, match="batch the dataset first"):
        list(two.experimental_distribute_dataset(list(np.arange(3))))
    with pytest.raises(TypeError, match="batch the dataset first"):
        list(two.experimental_distribute_dataset([1, 2]))


# the iterator API ------------------------------------------------------------------


async def test_iterator_get_next_optional_and_element_spec() -> None:
    two = strategy(2)
    dataset = two.experimental_distribute_dataset(batches(10, 4))
    it = iter(dataset)
    assert isinstance(it, DistributedIterator)
    spec = it.element_spec
    assert spec == ar.PerReplica([LeafSpec((2,), "int64"), LeafSpec((2,), "int64")])
    np.testing.assert_array_equal(it.get_next().values[1], [2, 3])  # the spec consumed nothing
    opt = it.get_next_as_optional()
    assert opt.has_value()
    np.testing.assert_array_equal(opt.get_value().values[0], [4, 5])
    assert next(it).values[0].tolist() == [8]
    end = it.get_next_as_optional()
    assert not end.has_value()
    with pytest.raises(ValueError, match="does not have a value"):
        end.get_value()
    with pytest.raises(StopIteration):
        it.get_next()
    with pytest.raises(StopIteration):
        next(it)


async def test_one_replica_element_spec_is_plain() -> None:
    one = strategy(1)
    dataset = one.experimental_distribute_dataset([{"x": np.zeros((2, 3), np.float32)}])
    assert dataset.element_spec == {"x": LeafSpec((2, 3), "float32")}


async def test_element_spec_of_a_one_shot_input_keeps_the_element() -> None:
    two = strategy(2)

    def gen() -> Iterator[np.ndarray]:
        yield from batches(8, 4)

    dataset = two.experimental_distribute_dataset(gen())
    assert dataset.element_spec.values[0] == LeafSpec((2,), "int64")
    assert dataset.cardinality == UNKNOWN_CARDINALITY
    assert len(list(dataset)) == 2  # the peeked element is not lost
    again = two.experimental_distribute_dataset(gen())
    assert again.element_spec is not None
    assert len([x async for x in again]) == 2
    empty = two.experimental_distribute_dataset([])
    with pytest.raises(ValueError, match="no elements"):
        _ = empty.element_spec


async def test_cardinality_is_the_length_of_the_input_as_in_tf() -> None:
    two = strategy(2)
    assert two.experimental_distribute_dataset(batches(10, 4)).cardinality == 3
    # TF counts the input's batches, not the steps: 5 batches give 2 steps.
    dataset = two.distribute_datasets_from_function(lambda c: batches(11, 2, True))
    assert dataset.cardinality == 5


async def test_dataset_reduce_awaits_an_async_reduce_func() -> None:
    two = strategy(2)
    dataset = two.experimental_distribute_dataset(batches(10, 4))

    async def fold(state: Any, x: Any) -> Any:
        return state + await two.reduce("SUM", x, axis=0)

    assert await dataset.reduce(np.int64(0), fold) == 45
    assert await dataset.reduce(0, lambda state, x: state + 1) == 3


# plain values through the cross-replica APIs ----------------------------------------


async def test_sum_of_a_plain_value_along_an_axis_counts_it_once_per_replica() -> None:
    two = strategy(2)
    value = np.array([1.5, 2.5], np.float32)
    result = await two.reduce("SUM", value, axis=0)
    assert result == 8.0  # TF: N times the sum
    assert result.dtype == np.float32
    assert await two.reduce("MEAN", value, axis=0) == 2.0
    with pytest.raises(ValueError, match="cannot be reduced"):
        await two.reduce("SUM", value, axis=None)
    with pytest.raises(ValueError, match="cannot be reduced"):
        await two.reduce("PROD", value, axis=0)


async def test_reduce_to_mean_of_a_plain_value_is_one_value() -> None:
    two = strategy(2)
    destinations = ar.PerReplica([np.zeros(1), np.zeros(1)])
    result = await two.extended.reduce_to("MEAN", np.array([1.0, 2.0]), destinations)
    assert isinstance(result, np.ndarray)  # TF returns the tensor, not a Mirrored
    np.testing.assert_array_equal(result, [1.0, 2.0])


async def test_broadcast_to_returns_a_distributed_value_unchanged() -> None:
    two = strategy(2)
    pr = ar.PerReplica([np.zeros(1), np.ones(1)])
    assert await two.extended.broadcast_to(pr, "CPU:0") is pr
    assert await two.extended.broadcast_to(pr, pr) is pr


async def test_broadcast_to_refuses_an_array_destination_as_tf_does() -> None:
    two = strategy(2)
    with pytest.raises(ValueError, match="only reduce_to takes an array"):
        await two.extended.broadcast_to(np.ones(2), np.zeros(1))
