"""Helpers on distributed values for the runtime (the types live in asyncreplica._values)."""

from __future__ import annotations

from .._values import DistributedValues

__all__ = ["component"]


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
