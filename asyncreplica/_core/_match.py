"""The one table of what must agree across replicas at one position.

Every rule about which parts of two signatures must be equal lives in :data:`RULES`;
nothing else in the package compares signatures (the cross-replica APIs hold their
components to it too: ``_runtime._extended.check_components``). A rule is a field name (as printed
in error messages) and a function that extracts the comparable key from a
:class:`~._signature.Signature`. Two signatures match when every rule's keys are equal.

The call path is compared separately because it can be switched off: by the
strategy's ``check_call_sites=False``, or per collective by giving it a ``name=``
(a name says "these calls are the same collective" explicitly).
"""

from __future__ import annotations

from collections.abc import Callable

from ._signature import CollectiveKind, Signature

__all__ = ["RULES", "differing_fields"]


def _dtypes(sig: Signature) -> object:
    return tuple(leaf.dtype for leaf in sig.leaves)


def _sparsity(sig: Signature) -> object:
    # IndexedSlices are reduced by concatenation, dense values element-wise: a leaf
    # sparse on some replicas and dense on others cannot be combined.
    return tuple(leaf.sparse for leaf in sig.leaves)


def _array_types(sig: Signature) -> object:
    return tuple(leaf.array_type for leaf in sig.leaves)


def _shapes(sig: Signature) -> object:
    if sig.kind is CollectiveKind.ALL_GATHER and sig.axis is not None:
        # all_gather concatenates along `axis`: only that dimension may differ.
        axis = sig.axis
        return tuple(
            (len(leaf.shape), leaf.shape[:axis] + leaf.shape[axis + 1 :]) for leaf in sig.leaves
        )
    return tuple(leaf.shape for leaf in sig.leaves)


RULES: tuple[tuple[str, Callable[[Signature], object]], ...] = (
    ("kind", lambda s: s.kind),
    ("reduce op", lambda s: s.op),
    ("axis", lambda s: s.axis),
    ("source", lambda s: s.source),
    ("merge_fn", lambda s: s.merge_fn),
    ("name", lambda s: s.name),
    ("structure", lambda s: s.structure),
    ("array type", _array_types),
    ("sparsity", _sparsity),
    ("dtype", _dtypes),
    ("shape", _shapes),
)


# The rows that compare leaves one by one (meaningless when the structures differ).
_LEAF_FIELDS = ("array type", "sparsity", "dtype", "shape")


def differing_fields(
    reference: Signature, other: Signature, *, check_call_sites: bool
) -> tuple[str, ...]:
    """Return the names of the fields in which ``other`` disagrees with ``reference``.

    Args:
        reference: The signature of the first replica to arrive at the position.
        other: The signature of a later arrival.
        check_call_sites: Whether call paths must agree (unless a name is given).

    Returns:
        The differing field names in table order; empty when the signatures match.
    """
    if reference == other:
        return ()
    fields = [name for name, key in RULES if key(reference) != key(other)]
    if "structure" in fields:
        # Leaves of different structures cannot be compared one by one.
        fields = [f for f in fields if f not in _LEAF_FIELDS]
    if (
        check_call_sites
        and reference.name is None
        and other.name is None
        and reference.call_path != other.call_path
    ):
        fields.append("call site")
    return tuple(fields)
