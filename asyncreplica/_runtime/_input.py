"""The input pipeline: distributed datasets and ``InputContext``.

``Strategy.experimental_distribute_dataset`` splits global batches across replicas
(:class:`DistributedDataset`); ``Strategy.distribute_datasets_from_function`` calls a
function once per input pipeline (one per process) with an :class:`InputContext`, and
each replica takes the next per-replica batch (:class:`DistributedDatasetsFromFunction`).
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator
from typing import Any, final

from .._core._nest import flatten, unflatten
from .._values import PerReplica

__all__ = ["DistributedDataset", "DistributedDatasetsFromFunction", "InputContext"]


@final
class InputContext:
    """What ``distribute_datasets_from_function`` passes to ``dataset_fn``, as in TensorFlow.

    There is one input pipeline per process: ``MirroredStrategy`` has one, a
    ``MultiWorkerMirroredStrategy`` has one per MPI process (``input_pipeline_id`` is
    the process rank). Use it to shard the input and to size per-replica batches.

    Args:
        num_input_pipelines: How many input pipelines (processes) there are.
        input_pipeline_id: This pipeline's id, ``0 .. num_input_pipelines - 1``.
        num_replicas_in_sync: How many replicas consume the input in sync.

    Example:
        >>> import asyncreplica as ar
        >>> ctx = ar.InputContext(num_input_pipelines=1, input_pipeline_id=0,
        ...                       num_replicas_in_sync=4)
        >>> ctx.get_per_replica_batch_size(64)
        16
        >>> ctx.get_per_replica_batch_size(10)
        Traceback (most recent call last):
        ...
        ValueError: The `global_batch_size` 10 is not divisible by `num_replicas_in_sync` 4...
    """

    __slots__ = ("_id", "_num_pipelines", "_num_replicas")

    def __init__(
        self,
        num_input_pipelines: int = 1,
        input_pipeline_id: int = 0,
        num_replicas_in_sync: int = 1,
    ) -> None:
        self._num_pipelines = num_input_pipelines
        self._id = input_pipeline_id
        self._num_replicas = num_replicas_in_sync

    @property
    def num_input_pipelines(self) -> int:
        """How many input pipelines (processes) there are."""
        return self._num_pipelines

    @property
    def input_pipeline_id(self) -> int:
        """This pipeline's id (the process rank), ``0 .. num_input_pipelines - 1``."""
        return self._id

    @property
    def num_replicas_in_sync(self) -> int:
        """How many replicas consume the input in sync (over all processes)."""
        return self._num_replicas

    def get_per_replica_batch_size(self, global_batch_size: int) -> int:
        """Return ``global_batch_size // num_replicas_in_sync``.

        Raises:
            ValueError: ``global_batch_size`` is not divisible by the number of replicas.
        """
        if global_batch_size % self._num_replicas != 0:
            raise ValueError(
                f"The `global_batch_size` {global_batch_size!r} is not divisible by "
                f"`num_replicas_in_sync` {self._num_replicas!r}: every replica must get the "
                "same batch size; choose a global batch size that is a multiple of the number "
                "of replicas."
            )
        return global_batch_size // self._num_replicas

    def __repr__(self) -> str:
        return (
            f"InputContext(num_input_pipelines={self._num_pipelines}, "
            f"input_pipeline_id={self._id}, num_replicas_in_sync={self._num_replicas})"
        )


def _one_shot(dataset: object) -> bool:
    """Whether iterating ``dataset`` consumes it (an iterator or a generator)."""
    if isinstance(dataset, AsyncIterable) and not isinstance(dataset, Iterable):
        return dataset.__aiter__() is dataset  # an async iterator returns itself
    return isinstance(dataset, Iterator)


class _Source:
    """An input that may be iterated once per epoch; a one-shot input only once."""

    def __init__(self, dataset: Iterable[Any] | AsyncIterable[Any], api: str) -> None:
        self._dataset = dataset
        self._api = api
        self._one_shot = _one_shot(dataset)
        self._started = False

    def _start(self) -> None:
        if self._one_shot and self._started:
            raise RuntimeError(
                f"this dataset ({self._api}) was built from a one-shot iterator "
                f"({type(self._dataset).__name__}), which the first pass consumed: a second "
                "epoch would silently see no batches. Pass a re-iterable input instead: a "
                "list, a tuple, or an object whose __iter__ starts over (for a generator, "
                "wrap the generator function in a class with __iter__)."
            )
        self._started = True

    def sync(self) -> Iterator[Any]:
        if not isinstance(self._dataset, Iterable):
            raise TypeError("this dataset is async: iterate it with `async for`")
        self._start()
        return iter(self._dataset)

    async def asynchronous(self) -> AsyncIterator[Any]:
        self._start()
        if isinstance(self._dataset, AsyncIterable):
            async for batch in self._dataset:
                yield batch
        else:
            for batch in self._dataset:
                yield batch


def _wrap(components: list[Any]) -> Any:
    """One replica's value as is (TensorFlow's one-replica rule), else a ``PerReplica``."""
    return components[0] if len(components) == 1 else PerReplica(components)


@final
class DistributedDataset:
    """Global batches split across replicas (see ``experimental_distribute_dataset``).

    Iterate it with ``for`` (or ``async for``) once per epoch; each element is a
    ``PerReplica`` (in a nest, each leaf is), or the plain batch when the strategy
    has one local replica, as in TensorFlow.
    """

    def __init__(
        self,
        dataset: Iterable[Any] | AsyncIterable[Any],
        num_replicas: int,
        local: range | None = None,
    ) -> None:
        self._source = _Source(dataset, "experimental_distribute_dataset")
        self._num_replicas = num_replicas
        # The global ids of this process's replicas: it keeps only their slices.
        self._local = range(num_replicas) if local is None else local

    def _split(self, batch: Any) -> Any:
        leaves, treedef = flatten(batch)
        if leaves and not any(hasattr(leaf, "__len__") for leaf in leaves):
            # A plain list (or tuple) of numbers is one batch, not a nest of scalars.
            leaves, treedef = [batch], None
        lengths = set()
        for leaf in leaves:
            lengths.add(_batch_length(leaf))
        if len(lengths) > 1:
            raise ValueError(f"the leaves of one batch have different lengths: {sorted(lengths)}")
        n = self._num_replicas
        size = lengths.pop() if lengths else 0
        per = math.ceil(size / n)
        bounds = [(min(i * per, size), min((i + 1) * per, size)) for i in self._local]
        split = [_wrap([leaf[a:b] for a, b in bounds]) for leaf in leaves]  # type: ignore[index]
        return unflatten(treedef, split)

    def __iter__(self) -> Iterator[Any]:
        for batch in self._source.sync():
            yield self._split(batch)

    async def __aiter__(self) -> AsyncIterator[Any]:
        async for batch in self._source.asynchronous():
            yield self._split(batch)


def _batch_length(leaf: object) -> int:
    if not hasattr(leaf, "__len__") or not hasattr(leaf, "__getitem__"):
        raise TypeError(
            "each element of a distributed dataset must be a batch (an array or a "
            f"sequence, or a nest of them) that can be split along its first axis, got "
            f"{type(leaf).__name__} {leaf!r:.60}"
        )
    if getattr(leaf, "ndim", None) == 0:
        raise TypeError(
            f"each element of a distributed dataset must be a batch with a first (batch) "
            f"axis to split across replicas, got a 0-d array {leaf!r:.60}: batch the "
            "samples first, e.g. np.stack(samples), or pass [np.array([3.0])] rather than "
            "[np.array(3.0)]"
        )
    return len(leaf)


def _empty(leaf: Any) -> Any:
    """An empty batch like ``leaf``: its first zero rows."""
    return leaf[:0]


@final
class DistributedDatasetsFromFunction:
    """Per-replica batches from ``dataset_fn`` (see ``distribute_datasets_from_function``).

    ``dataset_fn`` was called once for this process's input pipeline; each step,
    every local replica takes the next batch in replica order. When the input runs
    out in the middle of a step, the remaining replicas get empty batches (length 0),
    as in TensorFlow; the iteration ends when no replica gets a batch.
    """

    def __init__(self, dataset: Iterable[Any] | AsyncIterable[Any], num_local: int) -> None:
        self._source = _Source(dataset, "distribute_datasets_from_function")
        self._num_local = num_local

    def _step(self, batches: list[Any]) -> Any:
        n = self._num_local
        if len(batches) < n:
            empty_leaves, treedef = flatten(batches[-1])
            empty = unflatten(treedef, [_empty(leaf) for leaf in empty_leaves])
            batches = batches + [empty] * (n - len(batches))
        flat = [flatten(b) for b in batches]
        treedef = flat[0][1]
        for i, (_, t) in enumerate(flat):
            if t != treedef:
                raise ValueError(
                    f"dataset_fn's dataset gave batches of different structure: batch 0 of "
                    f"this step has {treedef!r} but batch {i} has {t!r}"
                )
        leaves = [_wrap([f[0][j] for f in flat]) for j in range(len(flat[0][0]))]
        return unflatten(treedef, leaves)

    def __iter__(self) -> Iterator[Any]:
        batches: list[Any] = []
        for batch in self._source.sync():
            batches.append(batch)
            if len(batches) == self._num_local:
                yield self._step(batches)
                batches = []
        if batches:
            yield self._step(batches)

    async def __aiter__(self) -> AsyncIterator[Any]:
        batches: list[Any] = []
        async for batch in self._source.asynchronous():
            batches.append(batch)
            if len(batches) == self._num_local:
                yield self._step(batches)
                batches = []
        if batches:
            yield self._step(batches)
