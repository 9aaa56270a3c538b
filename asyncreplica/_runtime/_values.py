"""Helpers on distributed values for the runtime (the types live in asyncreplica._values)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from .._core._nest import TreeDef, flatten, is_nest, treedef_str, unflatten
from .._values import DistributedValues, PerReplica

__all__ = ["component", "flatten_distributed", "regroup_always_wrap"]


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

    def mismatch(i: int, first: TreeDef, other: TreeDef) -> str:
        return (
            f"value_fn returned values of different structure: replica {first_replica} gave "
            f"{treedef_str(first)} but replica {first_replica + i} gave {treedef_str(other)}; "
            "every replica "
            "must return the same structure (same containers, lengths and keys)"
        )

    return _wrap_leaves(values, PerReplica, mismatch)


def _wrap_leaves(
    values: Sequence[object],
    wrap: type[DistributedValues[object]],
    mismatch: Callable[[int, TreeDef, TreeDef], str],
) -> object:
    """One structure per replica -> that structure with ``wrap`` of each leaf's values.

    ``mismatch(i, first, other)`` words the error when replica ``i``'s structure
    (``other``) differs from the first replica's (``first``).
    """
    flat = [flatten(v) for v in values]
    leaves0, treedef = flat[0]
    for i, (_, t) in enumerate(flat):
        if t != treedef:
            raise ValueError(mismatch(i, treedef, t))
    return unflatten(treedef, [wrap([f[0][j] for f in flat]) for j in range(len(leaves0))])


_AS_ARRAY = (
    "; to reduce each component as one array (a batch sliced from a Python list), "
    "convert it first: PerReplica([np.asarray(c) for c in value.values])."
)


def _flat_sequence(treedef: TreeDef) -> bool:
    """Whether ``treedef`` is a list or tuple of leaves (a Python list of numbers, say)."""
    return (
        treedef is not None
        and treedef[0] in (list, tuple)
        and all(child is None for child in treedef[2])
    )


def _nested(leaf: object) -> bool:
    return isinstance(leaf, DistributedValues) and any(is_nest(c) for c in leaf.values)


def flatten_distributed(
    value: object, api: str, first_replica: int = 0
) -> tuple[list[object], TreeDef]:
    """Flatten ``value`` for a cross-replica API, looking inside distributed values too.

    A distributed value whose components are nests (``PerReplica([{"a": x0}, {"a":
    x1}])``) stands for the nest of distributed values ``{"a": PerReplica([x0, x1])}``
    (a ``Mirrored`` stays ``Mirrored``): its components are flattened by the rule that
    flattens ``all_reduce``'s values, so ``Strategy.reduce`` and ``extended.reduce_to``
    reduce it leaf by leaf and return that structure, as ``all_reduce`` of a nest does.

    Raises:
        ValueError: The components of one distributed value differ in structure.
    """
    leaves, treedef = flatten(value)
    if not any(_nested(leaf) for leaf in leaves):
        return leaves, treedef
    split: list[object] = []
    for leaf in leaves:
        if not (isinstance(leaf, DistributedValues) and _nested(leaf)):
            split.append(leaf)
            continue
        kind = type(leaf).__name__

        def mismatch(i: int, first: TreeDef, other: TreeDef, kind: str = kind) -> str:
            return (
                f"{api} combines a {kind} of nests leaf by leaf, as all_reduce combines a "
                "nest, so its components need one structure, but replica "
                f"{first_replica}'s is {treedef_str(first)} and replica {first_replica + i}'s "
                f"is {treedef_str(other)}. Give every replica's component the same "
                f"containers, lengths and keys, or pass a nest of {kind} values (what "
                "strategy.run returns)"
                + (_AS_ARRAY if _flat_sequence(first) and _flat_sequence(other) else ".")
            )

        split.append(_wrap_leaves(leaf.values, type(leaf), mismatch))
    return flatten(unflatten(treedef, split))
