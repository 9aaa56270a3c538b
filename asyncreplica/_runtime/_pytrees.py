"""JAX's registered pytree nodes as containers of a collective's value (where JAX is used).

A parameters object registered with ``jax.tree_util.register_dataclass`` (or any
registered pytree node: ``register_pytree_node``, ``register_pytree_with_keys``, Flax
structs, Equinox modules) is traversed like a tuple: its children are flattened with
JAX's own tree utilities one level at a time, its structure (type and metadata) is part
of the collective's signature, and the results come back in the same type.

Nothing here imports JAX: the finder looks for ``jax.tree_util`` in ``sys.modules``, so
a program that never imported JAX pays one dictionary look-up per new leaf type.
"""

from __future__ import annotations

import sys
from typing import Any

from .._core._nest import Node, register_node_finder

__all__ = ["jax_node"]


def _label(value: object, treedef: Any) -> str:
    """``Params`` or, with static metadata, ``Params[(0.1,)]``."""
    name = type(value).__name__
    try:
        _, aux = treedef.node_data()
    except (AttributeError, TypeError, ValueError):  # an older JAX: the type alone
        return name
    return name if aux is None or aux == () or aux == [] else f"{name}[{aux!r}]"


def jax_node(value: object) -> tuple[list[object], Node] | None:
    """``(children, node)`` when ``value`` is a registered JAX pytree node, else None.

    Lists, tuples, mappings and ``None`` never get here (asyncreplica's own rules apply to
    them); JAX arrays and everything JAX does not know are leaves.
    """
    tree_util = sys.modules.get("jax.tree_util")
    if tree_util is None:
        return None
    children, treedef = tree_util.tree_flatten(value, is_leaf=lambda x: x is not value)
    if len(children) == 1 and children[0] is value:
        return None  # a leaf to JAX (a node with no children has none)

    def rebuild(new: list[object]) -> object:
        return tree_util.tree_unflatten(treedef, new)

    return list(children), Node(treedef, rebuild, _label(value, treedef))


register_node_finder(jax_node)
