"""The checks of a distributed value's components, by the match table (pure).

``Strategy.reduce``, ``gather`` and ``extended.reduce_to`` combine one component per
replica, as ``all_reduce`` and ``all_gather`` combine one value per replica; these are
the checks one process makes of them. The MPI process group makes the same checks of
every process's components (each process's own replicas agree already) when the
processes' cross-replica reduces differ, so that it raises what one process with every
replica raises: one rule, in one place.
"""

from __future__ import annotations

from collections.abc import Sequence

from .._exceptions import CollectiveMismatchError
from ._match import differing_fields
from ._signature import CollectiveKind, LeafSpec, ReduceOp, Signature

__all__ = [
    "by_shape",
    "check_components",
    "check_reduced",
    "empty_extremum_error",
    "normalize_axes",
]


def normalize_axes(axes: tuple[int, ...], shape: tuple[int, ...]) -> tuple[int, ...]:
    """Non-negative axes of a value of this shape, in ascending order.

    Sorted here, once: the order in which ``axis`` names them does not change the
    reduction, so it must not change its bits either (a complex ``PROD`` over
    ``(1, 0)`` rounded differently from one over ``(0, 1)``).

    Raises:
        ValueError: An axis is out of range or named twice.
    """
    rank = len(shape)
    out = []
    for a in axes:
        if not -rank <= a < rank:
            raise ValueError(f"`axis` = {a} out of range for `value` with rank {rank}")
        out.append(a % rank)
    if len(set(out)) != len(out):
        raise ValueError(f"`axis` {axes} names the same axis twice")
    return tuple(sorted(out))


def _replicas(ids: Sequence[int]) -> str:
    return f"replica{'s' if len(ids) > 1 else ''} {', '.join(map(str, ids))}"


def by_shape(shapes: Sequence[tuple[int, ...]], first: int = 0) -> str:
    """Which replicas hold which shape; ``first``: the global id of ``shapes[0]``'s replica."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, shape in enumerate(shapes, first):
        groups.setdefault(shape, []).append(i)
    return "; ".join(
        f"{_replicas(ids)} {'hold' if len(ids) > 1 else 'holds'} shape {shape}"
        for shape, ids in groups.items()
    )


def check_components(
    api: str,
    kind: CollectiveKind,
    op: ReduceOp | None,
    specs: Sequence[LeafSpec],
    axis: int | None = None,
    first: int = 0,
) -> None:
    """Hold a distributed value's components to the match table, as a collective is held.

    ``Strategy.reduce``, ``gather`` and ``extended.reduce_to``/``batch_reduce_to``
    combine one component per replica, as ``all_reduce`` and ``all_gather`` combine
    one value per replica: the same rules of :data:`~.._core._match.RULES` decide
    whether they may (dtype, sparse or dense, array type). Shapes are checked by the
    callers, whose rule depends on ``axis``; ``gather`` passes its (non-negative)
    ``axis``, and its components are held to ``all_gather``'s shape row too (one rank,
    one size in every other dimension). ``first``: the global id of the first
    component's replica (under MPI, this process's first), for the message.

    Raises:
        CollectiveMismatchError: Components differ in a field of the match table.
    """
    if len(specs) < 2:
        return
    signatures = {
        i: Signature(
            kind,
            op=op,
            axis=axis,
            leaves=(LeafSpec(() if axis is None else s.shape, s.dtype, s.sparse, s.array_type),),
        )
        for i, s in enumerate(specs, first)
    }
    base = signatures[first]
    fields: list[str] = []
    for sig in signatures.values():
        fields.extend(
            f for f in differing_fields(base, sig, check_call_sites=False) if f not in fields
        )
    if not fields:
        return
    groups: dict[str, list[int]] = {}
    for i, spec in enumerate(specs, first):
        what = f"IndexedSlices of {spec.dtype}" if spec.sparse else spec.dtype
        if spec.array_type is not None:
            what = f"{spec.array_type} of {what}"
        if "shape" in fields:
            what = f"{what}{list(spec.shape)}"
        groups.setdefault(what, []).append(i)
    held = "; ".join(
        f"{_replicas(ids)} {'hold' if len(ids) > 1 else 'holds'} {what}"
        for what, ids in groups.items()
    )
    advice = {
        "array type": "Convert every component to one array type (np.asarray, jnp.asarray).",
        "sparsity": "Pass IndexedSlices on every replica or dense values on every replica.",
        "dtype": "Cast every component to one dtype first (TensorFlow raises here too).",
        "shape": (
            f"Give every component one rank, and one size in every dimension but axis {axis}."
        ),
    }
    raise CollectiveMismatchError(
        0,
        signatures,
        fields,
        num_replicas=len(specs),
        message=(
            f"{api} combines one component per replica, and they must agree as a "
            f"collective's values must ({', '.join(fields)}), but {held}. "
            + " ".join(advice[f] for f in fields if f in advice)
        ),
    )


def check_reduced(
    op: ReduceOp, specs: Sequence[LeafSpec], axes: tuple[int, ...] | None, first: int
) -> tuple[int, ...] | None:
    """Check the components ``Strategy.reduce`` combines; the axes it reduces (normalized).

    ``first``: the global id of the first component's replica (under MPI, this
    process's first), for the messages.

    Raises:
        CollectiveMismatchError: Components differ in a field of the match table.
        ValueError: Shapes that ``axes`` cannot combine, or an axis out of range.
    """
    check_components("Strategy.reduce", CollectiveKind.ALL_REDUCE, op, specs, first=first)
    shapes = [tuple(s.shape) for s in specs]
    if axes is None:
        if len(set(shapes)) > 1:
            raise ValueError(
                f"Strategy.reduce with axis=None combines the replicas' values "
                f"element-wise, so they need one shape, but {by_shape(shapes, first)}. Pass "
                "axis=0 to reduce along the batch axis too (then only the other "
                "dimensions must agree)."
            )
        return None
    if len({len(s) for s in shapes}) > 1:
        raise ValueError(
            f"Strategy.reduce with axis={axes} needs values of one rank on every "
            f"replica, but {by_shape(shapes, first)}. TensorFlow raises here too; give every "
            "replica a value of the same rank (an empty batch has shape (0, ...), not (0,))."
        )
    norm = normalize_axes(axes, shapes[0])
    kept = [tuple(d for k, d in enumerate(s) if k not in norm) for s in shapes]
    if len(set(kept)) > 1:
        raise ValueError(
            f"Strategy.reduce with axis={axes} sums each replica's value along those "
            f"axes, then across replicas element-wise, so the other dimensions must "
            f"agree, but {by_shape(shapes, first)}."
        )
    error = empty_extremum_error(op, shapes, norm, first)
    if error is not None:
        raise error
    return norm


def empty_extremum_error(
    op: ReduceOp,
    shapes: Sequence[tuple[int, ...]],
    axes: tuple[int, ...],
    first: int = 0,
    plain: bool = False,
) -> ValueError | None:
    """The error of a MAX or MIN along ``axes`` (normalized) of a component with no elements.

    Each replica's value is reduced along ``axes`` first: MAX or MIN of no elements has
    no identity (SUM's is 0, PROD's 1, MEAN's NaN), so there is no value to give. The one
    rule, for ``Strategy.reduce``, ``reduce_to`` and the reference semantics alike.
    ``plain``: ``shapes`` is one value that is not distributed (held by every replica).
    """
    if op is not ReduceOp.MAX and op is not ReduceOp.MIN:
        return None
    empty = [i for i, shape in enumerate(shapes, first) if any(shape[k] == 0 for k in axes)]
    if not empty:
        return None
    name = op.value
    return ValueError(
        f"Strategy.reduce({name}, axis={axes}): "
        f"{'the value (not distributed)' if plain else _replicas(empty)} "
        f"{'hold values with' if len(empty) > 1 else 'has' if plain else 'holds a value with'} "
        "no elements along "
        f"axis {axes} (shape{'s' if len(empty) > 1 else ''} "
        f"{', '.join(str(shapes[i - first]) for i in empty)}), "
        f"and {name} of no elements has no identity (SUM's is 0, PROD's 1), so there is no "
        f"value to give. An uneven last batch gives some replicas empty batches: reduce each "
        f"replica's value first with an initial value, e.g. "
        f"np.{name.lower()}(x, axis=0, initial={'-np.inf' if name == 'MAX' else 'np.inf'}), "
        f"then Strategy.reduce({name}, ..., axis=None)."
    )
