"""Array-API arrays without ``__len__`` are batches of ``experimental_distribute_dataset``.

Found by an independent attack (F2): the batch axis was recognised by ``len``, which the
array API standard does not define (array_api_strict leaves it out). A
``(features, labels)`` tuple of array_api_strict arrays on 3 replicas was then split
across the tuple (replica 0 got all features, replica 1 the labels, replica 2 nothing),
silently, while the same numpy data split 2 samples per replica; a single array or a
dict of them was refused as unbatched. The rule now reads ``shape``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import asyncreplica as ar
from asyncreplica._runtime._input import UnbatchedElementError

xp = pytest.importorskip("array_api_strict")

DEVICES = ["CPU:0", "CPU:1", "CPU:2"]


def _features(mod: Any) -> Any:
    return mod.asarray(np.arange(12, dtype=np.float32).reshape(6, 2))


def _labels(mod: Any) -> Any:
    return mod.asarray(np.arange(6, dtype=np.int32))


def _local(s: ar.MirroredStrategy, element: Any) -> list[Any]:
    return [
        [np.asarray(leaf).tolist() for leaf in (r if isinstance(r, tuple) else (r,))]
        if not isinstance(r, dict)
        else {k: np.asarray(v).tolist() for k, v in r.items()}
        for r in s.experimental_local_results(element)
    ]


def _split(element: Any) -> list[list[Any]]:
    s = ar.MirroredStrategy(DEVICES)
    return [_local(s, el) for el in s.experimental_distribute_dataset([element])]


@pytest.mark.parametrize("kind", ["tuple", "dict", "single"])
def test_array_api_batches_split_as_numpy_ones(kind: str) -> None:
    def element(mod: Any) -> Any:
        f, y = _features(mod), _labels(mod)
        return {"tuple": (f, y), "dict": {"f": f, "l": y}, "single": f}[kind]

    got = _split(element(xp))
    assert got == _split(element(np))
    s = ar.MirroredStrategy(DEVICES)
    for el in s.experimental_distribute_dataset([element(xp)]):
        for r, local in enumerate(s.experimental_local_results(el)):
            leaves = (
                local.values()
                if isinstance(local, dict)
                else (local if isinstance(local, tuple) else (local,))
            )
            for leaf in leaves:
                assert hasattr(leaf, "__array_namespace__")  # same library out
                assert leaf.shape[0] == 2, (r, leaf.shape)


def test_uneven_array_api_batch_splits_as_tensorflow() -> None:
    # 5 samples on 3 replicas: 2, 2, 1, as the numpy batch splits
    f = xp.asarray(np.arange(10, dtype=np.float32).reshape(5, 2))
    s = ar.MirroredStrategy(DEVICES)
    (el,) = list(s.experimental_distribute_dataset([f]))
    assert [x.shape for x in s.experimental_local_results(el)] == [(2, 2), (2, 2), (1, 2)]


def test_a_0d_array_api_array_is_refused_as_unbatched() -> None:
    s = ar.MirroredStrategy(DEVICES)
    with pytest.raises(UnbatchedElementError, match="0-d array"):
        list(s.experimental_distribute_dataset([(xp.asarray(1.0), xp.asarray(2.0))]))


def test_a_list_of_array_api_arrays_is_structure() -> None:
    # as a list of numpy arrays: split leaf by leaf, never along the list
    s = ar.MirroredStrategy(DEVICES)
    (el,) = list(s.experimental_distribute_dataset([[_features(xp), _labels(xp)]]))
    for local in s.experimental_local_results(el):
        assert [tuple(x.shape) for x in local] == [(2, 2), (2,)]


def test_datasets_from_function_pads_array_api_batches() -> None:
    # a shorter last step: the replica left without data gets an empty batch, rank kept
    batches = [xp.asarray(np.ones((2, 3), dtype=np.float32))] * 3 + [
        xp.asarray(np.ones((1, 3), dtype=np.float32))
    ]
    s = ar.MirroredStrategy(DEVICES)
    steps = list(s.distribute_datasets_from_function(lambda ctx: batches))
    assert [[x.shape for x in s.experimental_local_results(e)] for e in steps] == [
        [(2, 3), (2, 3), (2, 3)],
        [(1, 3), (0, 3), (0, 3)],
    ]


def test_jax_arrays_follow_the_same_rule() -> None:
    jnp = pytest.importorskip("jax.numpy")
    assert _split((_features(jnp), _labels(jnp))) == _split((_features(np), _labels(np)))
    s = ar.MirroredStrategy(DEVICES)
    with pytest.raises(UnbatchedElementError, match="0-d array"):
        list(s.experimental_distribute_dataset([jnp.asarray(1.0)]))
