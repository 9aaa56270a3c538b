"""Helpers on distributed values for the runtime (the types live in asyncreplica._values)."""

from __future__ import annotations

from collections.abc import Sequence

from .._core._nest import flatten, treedef_str, unflatten
from .._values import DistributedValues, PerReplica

__all__ = ["component", "regroup_always_wrap"]


def component(replica_id: int, leaf: object, *, num_replicas: int) -> object:
    """Return replica ``replica_id``'s component of ``leaf`` (``leaf`` if not distributed).

    Raises:
        ValueError: ``leaf`` has a different number of components than replicas.
    """
    if isinstance(leaf, DistributedValues):
        if len(leaf.values) != num_replicas:
            raise ValueError(
                f"a {type(leaf).__name__} with {len(leaf.values)} "
                f"component{'' if len(leaf.values) == 1 else 's'} was given to {num_replicas} "
                "replicas: it needs exactly one component per replica"
            )
        return leaf.values[replica_id]
    return leaf


def regroup_always_wrap(values: Sequence[object], first_replica: int = 0) -> object:
    """Merge one structure per replica, wrapping *every* leaf in a ``PerReplica``.

    TensorFlow's ``regroup(..., always_wrap=True)`` (used by
    ``experimental_distribute_values_from_function``): containers are rebuilt as in
    ``run``'s regroup, but a leaf is wrapped even when every replica holds the same
    object, and with one replica. ``first_replica`` is the global id of ``values[0]``'s
    replica (under MPI, this process's first), for the error message.

    Raises:
        ValueError: The replicas' values have different structures.
    """
    flat = [flatten(v) for v in values]
    leaves0, treedef = flat[0]
    for i, (_, t) in enumerate(flat):
        if t != treedef:
            raise ValueError(
                f"value_fn returned values of different structure: replica {first_replica} gave "
                f"{treedef_str(treedef)} but replica {first_replica + i} gave {treedef_str(t)}; "
                "every replica "
                "must return the same structure (same containers, lengths and keys)"
            )
    return unflatten(treedef, [PerReplica([f[0][j] for f in flat]) for j in range(len(leaves0))])
