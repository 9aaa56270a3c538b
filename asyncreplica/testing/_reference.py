"""The reference semantics: what every collective and every reduce API returns.

Written to be obviously correct, not fast: one element at a time, in replica order,
with the dtype rules of :mod:`asyncreplica._core._dtypes` (the library's one copy of
them) and exact integer arithmetic where the library promises exactness. Every fast
path (a backend's single-leaf, batch, packed, C and large-value paths; ``Strategy.
reduce``, ``gather`` and ``extended.reduce_to``/``batch_reduce_to``; the cross-process
paths) is held to it, bit for bit, by the generated differential test in
``tests/semantics``. docs/design.md says why it exists.

Values are numpy arrays (numpy may be used here: this module is test support, not the
library's core). A replica's value is a list of leaves; results are new arrays.

The rules, element by element:

* ``all_reduce``: ``r_0 op r_1 op ... op r_{n-1}``, left to right in replica order,
  each ``op`` one correctly rounded operation of the input dtype. ``MIN`` and
  ``MAX`` are numpy's ``minimum``/``maximum`` (NaN wins). ``PROD`` of complex
  numbers is ``(ar*br - ai*bi) + (ar*bi + ai*br)j``, four real products. ``MEAN`` of
  floats divides that sum by ``n`` (complex: each part); ``MEAN`` of integers is the
  true mean (a fraction), rounded once to the result dtype, nearest, ties to even.
* The result dtype is :func:`~asyncreplica._core._dtypes.reduced_dtype`'s.
* ``all_gather``: the values concatenated along ``axis`` in replica order.
* ``reduce_scatter``: ``all_reduce``'s result split in ``n`` equal chunks along ``axis``.
* ``broadcast``: the source replica's value.
* ``Strategy.reduce(op, v, axis)``: each replica's value reduced along ``axis`` in
  its own dtype first (numpy's sum, prod, min, max; a complex PROD folded in index
  order as above), then combined as ``all_reduce`` combines; ``MEAN`` is the global
  sum over the global element count (integers: exactly).
* ``Strategy.reduce`` of a plain (non-distributed) value: the value itself, no
  arithmetic (TensorFlow's rule; what a merge_fn receives at one replica is plain).
* ``Strategy.gather``: ``all_gather``'s concatenation.
* ``IndexedSlices`` (SUM, MEAN): values as :func:`slices_values`; indices concatenated
  in replica order, in their dtype when every replica's is the same, else int64; an
  index outside ``0 <= i < min(dense_shape[0], 2**63)`` is a ``ValueError`` on every
  path (:func:`slices_indices`).
* Packing (``bytes_per_pack``), the batch a leaf is in, the replicas' arrival order
  and the path taken never change a result, but for which NaN (sign, payload) a NaN
  element is: IEEE 754 leaves that open, and numpy's loops pick differently by array
  length, so only that an element is NaN is a rule (docs/concepts.md).
"""

from __future__ import annotations

import contextlib
import fractions
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

with contextlib.suppress(ImportError):  # registers "bfloat16" with numpy, when installed
    import ml_dtypes  # noqa: F401

from .._core._components import empty_extremum_error
from .._core._dtypes import is_integer, is_reducible, native_order, reduced_dtype
from .._core._signature import ReduceOp

__all__ = [
    "all_gather",
    "all_reduce",
    "broadcast",
    "combine",
    "gather",
    "mismatch_fields",
    "nearest",
    "reduce",
    "reduce_plain",
    "reduce_scatter",
    "slices_indices",
    "slices_values",
]

Array = npt.NDArray[Any]


def _name(dtype: np.dtype[Any]) -> str:
    return dtype.name


def nearest(value: fractions.Fraction, dtype: np.dtype[Any]) -> Any:
    """The float of ``dtype`` nearest to ``value`` (ties to even), as a numpy scalar."""
    guess = dtype.type(float(value))  # within a unit in the last place of the answer
    best = guess
    for candidate in (
        np.nextafter(guess, dtype.type(-np.inf)),
        np.nextafter(guess, dtype.type(np.inf)),
    ):
        if not np.isfinite(candidate):
            continue
        error = abs(fractions.Fraction(float(candidate)) - value)
        best_error = abs(fractions.Fraction(float(best)) - value)
        if error < best_error or (
            error == best_error and int(candidate.view(f"u{dtype.itemsize}")) % 2 == 0
        ):
            best = candidate
    return best


def _times(a: Any, b: Any) -> Any:
    """One element of ``a op b`` for PROD: complex as four real products."""
    if isinstance(a, np.complexfloating):
        real = a.real * b.real - a.imag * b.imag
        imag = a.real * b.imag + a.imag * b.real
        out = np.zeros((), a.dtype)
        out.real = real
        out.imag = imag
        return out[()]
    return a * b


def _step(op: ReduceOp, a: Any, b: Any) -> Any:
    """One element of ``a op b`` in the elements' dtype."""
    with np.errstate(all="ignore"):
        if op in (ReduceOp.SUM, ReduceOp.MEAN):
            return a + b
        if op is ReduceOp.PROD:
            return _times(a, b)
        if op is ReduceOp.MIN:
            return np.minimum(a, b)
        return np.maximum(a, b)


def _divide(total: Any, n: int) -> Any:
    """A float or complex sum divided by ``n``, in its dtype (complex: each part)."""
    with np.errstate(all="ignore"):
        if isinstance(total, np.complexfloating):
            out = np.zeros((), total.dtype)
            out.real = total.real / total.real.dtype.type(n)
            out.imag = total.imag / total.imag.dtype.type(n)
            return out[()]
        return total / total.dtype.type(n)


def _check_reducible(dtype: np.dtype[Any]) -> None:
    if not is_reducible(_name(dtype)):
        raise TypeError(f"cannot reduce values of dtype {dtype}")


def combine(op: ReduceOp, values: Sequence[Array]) -> Array:
    """One leaf of every replica combined element-wise (the values share shape and dtype)."""
    first = values[0]
    _check_reducible(first.dtype)
    n = len(values)
    result = np.dtype(reduced_dtype(op, _name(first.dtype)))
    out = np.empty(first.shape, result)
    for index in np.ndindex(first.shape):
        if op is ReduceOp.MEAN and is_integer(_name(first.dtype)):
            total = sum(int(v[index]) for v in values)
            out[index] = nearest(fractions.Fraction(total, n), result)
            continue
        acc = first[index]
        for v in values[1:]:
            acc = _step(op, acc, v[index])
        out[index] = _divide(acc, n) if op is ReduceOp.MEAN else acc
    return out


def slices_values(op: ReduceOp, values: Sequence[Array]) -> Array:
    """The values of every replica's ``IndexedSlices`` reduced with SUM or MEAN.

    The rows are concatenated in replica order (not summed); MEAN divides each value
    by the number of replicas, in the MEAN's dtype (integers: the float64 nearest the
    exact quotient, as :func:`combine`).
    """
    if op not in (ReduceOp.SUM, ReduceOp.MEAN):
        raise ValueError(f"IndexedSlices can be reduced with SUM or MEAN only, not {op.value}")
    rows = np.concatenate(values, axis=0)
    _check_reducible(rows.dtype)
    if op is ReduceOp.SUM:
        return rows
    n = len(values)
    result = np.dtype(reduced_dtype(op, _name(rows.dtype)))
    out = np.empty(rows.shape, result)
    for index in np.ndindex(rows.shape):
        if is_integer(_name(rows.dtype)):
            out[index] = nearest(fractions.Fraction(int(rows[index]), n), result)
        else:
            out[index] = _divide(rows[index], n)
    return out


def slices_indices(indices: Sequence[Array], rows: int) -> Array:
    """The indices of every replica's ``IndexedSlices`` reduced (SUM or MEAN).

    Each index is a row number of the dense value, ``0 <= i < rows`` (``rows`` is
    ``dense_shape[0]``), and fits int64, the dtype replicas' indices of different dtypes
    are combined in. The result is the indices in replica order, as Python integers
    first, then in the one dtype every replica's indices have, else int64.

    Raises:
        ValueError: An index is negative, not below ``rows``, or not below ``2**63``.
    """
    numbers: list[int] = []
    for part in indices:
        for index in part.tolist():
            if not 0 <= index < min(rows, 2**63):
                raise ValueError(f"IndexedSlices index {index} is not a row number below {rows}")
            numbers.append(index)
    dtypes = {part.dtype for part in indices}
    return np.array(numbers, dtypes.pop() if len(dtypes) == 1 else np.int64)


def all_reduce(op: ReduceOp, per_replica: Sequence[Sequence[Array]]) -> list[Array]:
    """``ctx.all_reduce``: every leaf combined; every replica receives this list."""
    return [combine(op, [row[j] for row in per_replica]) for j in range(len(per_replica[0]))]


def all_gather(per_replica: Sequence[Sequence[Array]], axis: int) -> list[Array]:
    """``ctx.all_gather``: every leaf concatenated along ``axis`` in replica order."""
    return [
        np.concatenate([row[j] for row in per_replica], axis=axis)
        for j in range(len(per_replica[0]))
    ]


def reduce_scatter(
    op: ReduceOp, per_replica: Sequence[Sequence[Array]], axis: int
) -> list[list[Array]]:
    """``ctx.reduce_scatter``: replica ``r`` receives chunk ``r`` of each reduced leaf."""
    n = len(per_replica)
    return [
        [np.split(total, n, axis=axis)[r] for total in all_reduce(op, per_replica)]
        for r in range(n)
    ]


def broadcast(per_replica: Sequence[Sequence[Array]], source: int) -> list[Array]:
    """``ctx.broadcast``: the source's leaves, in native byte order (``native_order``)."""
    return [
        np.array(leaf, dtype=np.dtype(native_order(np.asarray(leaf).dtype.str)), copy=True)
        for leaf in per_replica[source]
    ]


def _local(op: ReduceOp, value: Array, axis: tuple[int, ...]) -> Array:
    """One replica's value reduced along ``axis`` in its own dtype."""
    if op is ReduceOp.PROD and value.dtype.kind == "c":
        rows = np.moveaxis(value, axis, tuple(range(len(axis))))
        kept = rows.shape[len(axis) :]
        rows = rows.reshape((-1, *kept))
        out = np.ones(kept, value.dtype)
        for index in np.ndindex(kept):
            if len(rows):
                acc = rows[0][index]
                for row in rows[1:]:
                    acc = _times(acc, row[index])
                out[index] = acc
        return out
    with np.errstate(all="ignore"):
        if op in (ReduceOp.SUM, ReduceOp.MEAN):
            return np.asarray(np.sum(value, axis=axis, dtype=value.dtype))
        if op is ReduceOp.PROD:
            return np.asarray(np.prod(value, axis=axis, dtype=value.dtype))
        local = np.min if op is ReduceOp.MIN else np.max
        return np.asarray(local(value, axis=axis))


def reduce(op: ReduceOp, components: Sequence[Array], axis: tuple[int, ...] | None) -> Array:
    """``Strategy.reduce`` of one leaf's components (``axis`` already non-negative)."""
    if axis is None:
        return combine(op, components)
    # The order in which ``axis`` names the axes is not part of the reduction: ascending.
    axis = tuple(sorted(axis))
    first = components[0]
    _check_reducible(first.dtype)
    error = empty_extremum_error(op, [tuple(c.shape) for c in components], axis)
    if error is not None:
        raise error  # numpy's bare "zero-size array" otherwise
    if op is not ReduceOp.MEAN:
        return combine(op, [_local(op, c, axis) for c in components])
    count = sum(math.prod(c.shape[k] for k in axis) for c in components)
    result = np.dtype(reduced_dtype(op, _name(first.dtype)))
    if is_integer(_name(first.dtype)):
        sums = [np.asarray(c.astype(object).sum(axis=axis), dtype=object) for c in components]
        kept = sums[0].shape
        out = np.empty(kept, result)
        for index in np.ndindex(kept):
            exact = sum(int(s[index]) for s in sums)
            # No elements: 0 / 0, the NaN a float MEAN of nothing gives too.
            out[index] = (
                nearest(fractions.Fraction(exact, count), result)
                if count
                else _divide(result.type(0), 0)
            )
        return out
    total = combine(ReduceOp.SUM, [_local(ReduceOp.SUM, c, axis) for c in components])
    out = np.empty(total.shape, result)
    for index in np.ndindex(total.shape):
        out[index] = _divide(total[index], count)
    return out


def reduce_plain(value: Array) -> Array:
    """``Strategy.reduce`` (and ``reduce_to``) of a plain, non-distributed value.

    One value, not one per replica: no arithmetic, as TensorFlow. The value itself
    comes back, in its dtype (``MEAN`` of a plain int32 is that int32 value); ``SUM``
    and ``PROD`` on several replicas raise ``ValueError`` instead (ambiguous).
    """
    return np.array(value, copy=True)


def gather(components: Sequence[Array], axis: int) -> Array:
    """``Strategy.gather``: the components concatenated along ``axis``."""
    return np.concatenate(components, axis=axis)


def mismatch_fields(specs: Sequence[tuple[tuple[int, ...], str]]) -> tuple[str, ...]:
    """The match-table fields in which replicas' one-leaf values ``(shape, dtype)`` differ.

    For element-wise collectives: replicas must agree on every leaf's dtype and shape.
    """
    fields = []
    if len({dtype for _, dtype in specs}) > 1:
        fields.append("dtype")
    if len({shape for shape, _ in specs}) > 1:
        fields.append("shape")
    return tuple(fields)
