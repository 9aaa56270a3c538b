"""Defects found by attack 23e (the seventh round): each test failed before its fix.

F1: an unbatched (feature, label) tuple or namedtuple of scalars in a distributed
    dataset was split across the tuple (a silently wrong number) instead of refused.
"""

from __future__ import annotations

import collections
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
