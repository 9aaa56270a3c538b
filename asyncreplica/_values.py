"""Distributed values: ``PerReplica``, ``Mirrored``, ``IndexedSlices`` and ``ValueContext``."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Generic, TypeVar, final

__all__ = ["DistributedValues", "IndexedSlices", "Mirrored", "PerReplica", "ValueContext"]

T = TypeVar("T")


class DistributedValues(Generic[T]):
    """One value per replica, in replica order (the base of ``PerReplica`` and ``Mirrored``).

    Args:
        values: One component per replica.

    Raises:
        ValueError: ``values`` is empty.
    """

    __slots__ = ("_values",)

    def __init__(self, values: Sequence[T]) -> None:
        values = tuple(values)
        if not values:
            raise ValueError(f"{type(self).__name__} needs at least one component, got none")
        self._values: tuple[T, ...] = values

    @property
    def values(self) -> tuple[T, ...]:
        """The components, one per replica, in replica order."""
        return self._values

    def __len__(self) -> int:
        return len(self._values)

    def __iter__(self) -> Iterator[T]:
        raise TypeError(
            f"{type(self).__name__} is not iterable over its components: use .values, or "
            "strategy.experimental_local_results(value)"
        )

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        assert isinstance(other, DistributedValues)
        return len(self._values) == len(other._values) and all(
            _same(a, b) for a, b in zip(self._values, other._values, strict=True)
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        body = ",\n".join(f"  {i}: {v!r}" for i, v in enumerate(self._values))
        return f"{type(self).__name__}:{{\n{body}\n}}"


def _same(a: object, b: object) -> bool:
    if a is b:
        return True
    result = a == b
    if isinstance(result, bool):
        return result
    # Arrays compare element-wise; equal means equal everywhere.
    all_ = getattr(result, "all", None)
    return bool(all_()) if callable(all_) else bool(result)


@final
class PerReplica(DistributedValues[T]):
    """Values that may differ per replica.

    ``Strategy.run`` returns one for each leaf whose replicas returned different objects.

    Passing a ``PerReplica`` in ``run``'s arguments gives replica ``i`` its ``i``-th
    component.

    Example:
        >>> import asyncreplica as ar
        >>> ar.PerReplica([1, 2])
        PerReplica:{
          0: 1,
          1: 2
        }
    """

    __slots__ = ()


@final
class Mirrored(DistributedValues[T]):
    """Values known to be equal on every replica, one component per replica.

    ``extended.reduce_to`` and ``extended.broadcast_to`` return ``Mirrored`` values; each
    component is its replica's own read-only view of one shared buffer.
    """

    __slots__ = ()


@final
class IndexedSlices:
    """A sparse update: rows ``indices`` of a dense value of shape ``dense_shape``.

    ``all_reduce`` with ``SUM`` concatenates the replicas' ``values`` and ``indices``
    (duplicate indices are kept, as TensorFlow does); ``MEAN`` also divides ``values``
    by the number of replicas. ``all_gather`` does not accept it.

    A collective checks the parts fit together before any data moves, in the replica
    that passed them: integer ``indices`` (``TypeError`` otherwise), one per row, and
    rows of shape ``dense_shape[1:]``, and row numbers ``0 <= i < dense_shape[0]``
    and below ``2**63`` (``ValueError`` otherwise: a negative index is not read from the
    end). Replicas whose indices have different integer dtypes get int64 indices. The
    cross-replica APIs (``Strategy.reduce``, ``extended.reduce_to``, ...) hold each
    component to the same rule and name its replica.

    Args:
        values: The rows, shape ``(n, *dense_shape[1:])``.
        indices: Their row indices (integers), shape ``(n,)``.
        dense_shape: The shape of the dense value.
    """

    __slots__ = ("dense_shape", "indices", "values")

    def __init__(self, values: object, indices: object, dense_shape: Sequence[int]) -> None:
        self.values = values
        self.indices = indices
        self.dense_shape = tuple(int(d) for d in dense_shape)

    @property
    def dtype(self) -> object:
        """The dtype of ``values``."""
        return getattr(self.values, "dtype", None)

    def __repr__(self) -> str:
        return (
            f"IndexedSlices(values={self.values!r}, indices={self.indices!r}, "
            f"dense_shape={self.dense_shape!r})"
        )


@final
class ValueContext:
    """What ``experimental_distribute_values_from_function`` passes to ``value_fn``.

    Args:
        replica_id_in_sync_group: The replica the value is for.
        num_replicas_in_sync: The number of replicas.
    """

    __slots__ = ("num_replicas_in_sync", "replica_id_in_sync_group")

    def __init__(self, replica_id_in_sync_group: int = 0, num_replicas_in_sync: int = 1) -> None:
        self.replica_id_in_sync_group = replica_id_in_sync_group
        self.num_replicas_in_sync = num_replicas_in_sync

    def __repr__(self) -> str:
        return (
            f"ValueContext(replica_id_in_sync_group={self.replica_id_in_sync_group}, "
            f"num_replicas_in_sync={self.num_replicas_in_sync})"
        )
