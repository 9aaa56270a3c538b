"""How the numpy backend combines values: the library's one set of reduce rules, in numpy.

Every path of the backend (one leaf, a batch, the C pass, packs, large values summed in
blocks and threads, ``Backend.reduce``) takes from here which dtypes it holds and reduces,
the one element-wise operation of an op (:func:`_binary`), the MEAN's division
(:func:`_divide`) and the exact integer MEAN (:func:`_mean_of_ints`,
:func:`_exact_quotient`); the result dtypes come from ``asyncreplica.abc.reduced_dtype``.
``asyncreplica.testing._reference`` states the same rules element by element, and
``tests/semantics`` holds every path to it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from asyncreplica import BackendError, IndexedSlices
from asyncreplica.abc import (
    EXACT_MEAN_COUNT,
    ReduceOp,
    is_reducible,
    native_order,
    reduced_dtype,
    sparse_op_message,
)

Array = npt.NDArray[Any]

# dtype kinds a value may have at all (bool and the numeric kinds); bfloat16 (kind "V")
# is held and reduced too: see _holdable and _reducible_dtype.
_HOLDABLE_KINDS = frozenset("biufc")

# IndexedSlices row numbers stay below this bound on every path: replicas' indices of
# different dtypes are combined as int64, where a larger uint64 index would wrap
# (describe refuses one in the replica that passed it; _concat_slices holds to it).
INDEX_LIMIT = 2**63
try:  # ml_dtypes comes with JAX and TensorFlow; without it there are no bfloat16 arrays
    import ml_dtypes

    _BFLOAT16: np.dtype[Any] | None = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - ml_dtypes is installed with the test extras
    _BFLOAT16 = None


def _holdable(dtype: np.dtype[Any]) -> bool:
    """Whether a value of ``dtype`` can be a collective's leaf (bool, numbers, bfloat16)."""
    return dtype.kind in _HOLDABLE_KINDS or dtype == _BFLOAT16


def _native(dtype: np.dtype[Any]) -> np.dtype[Any]:
    """``dtype`` in this machine's byte order: a result's dtype is the rule's, by name.

    ``'>f8'`` and ``'<f8'`` are both float64 (the signature names dtypes): every path
    returns float64 in native order, whatever order the inputs had.
    """
    return dtype if dtype.isnative else np.dtype(native_order(dtype.str))


def _reducible_dtype(dtype: np.dtype[Any]) -> bool:
    """Whether values of ``dtype`` reduce: the library's one rule (``_core._dtypes``)."""
    return is_reducible(_dtype_name(dtype))


def _complex_multiply(a: Array, b: Array, out: Array | None = None) -> Array:
    """``a * b`` for complex arrays, as four real products: the same bits at every size.

    numpy's complex multiply loops differ by array length (a vectorised loop for long
    arrays, a scalar one for short ones, and one of them contracts into fused
    multiply-adds), so the same element could round differently alone, in a pack, or
    in place. Here every element is ``(ar*br - ai*bi) + (ar*bi + ai*br)j``, each
    operation a separate, correctly rounded real ufunc call.
    """
    ar, ai, br, bi = a.real, a.imag, b.real, b.imag
    real = np.subtract(np.multiply(ar, br), np.multiply(ai, bi))
    imag = np.add(np.multiply(ar, bi), np.multiply(ai, br))
    if out is None:
        out = np.empty(real.shape, np.result_type(a, b))
    out.real = real
    out.imag = imag
    return out


_BINARY: dict[ReduceOp, Callable[..., Array]] = {
    ReduceOp.SUM: np.add,
    ReduceOp.MEAN: np.add,
    ReduceOp.MIN: np.minimum,
    ReduceOp.MAX: np.maximum,
    ReduceOp.PROD: np.multiply,
}


def _binary(op: ReduceOp, dtype: np.dtype[Any]) -> Callable[..., Array]:
    """How two replicas' values of ``dtype`` combine under ``op``: the one choice.

    Every path (one leaf, a pack, the C pass, large blocked leaves, ``reduce``) takes
    its element-wise operation from here, so that no path rounds differently.
    """
    if op is ReduceOp.PROD and dtype.kind == "c":
        return _complex_multiply
    return _BINARY[op]


_dtype_names: dict[np.dtype[Any], str] = {}


def _dtype_name(dtype: np.dtype[Any]) -> str:
    # dtype.name is computed on each access (slow); the set of dtypes is small.
    name = _dtype_names.get(dtype)
    if name is None:
        name = _dtype_names[dtype] = dtype.name
    return name


def _as_array(value: object) -> Array:
    """``value`` as an exact ``numpy.ndarray`` (a subclass as a plain view of its memory).

    A subclass's own code runs on every array made from it (``__array_finalize__``): given
    the arrays the backend combines into, it could keep a writable alias of the result
    every replica shares. Plain views of the inputs give it nothing to see.
    """
    if type(value) is np.ndarray:
        return value
    if isinstance(value, np.ndarray):
        return value.view(np.ndarray)
    return np.asarray(value)


def _combine(op: ReduceOp, arrays: Sequence[Array]) -> Array:
    """Combine arrays in replica order into one new array (inputs untouched)."""
    arrays = [a if type(a) is np.ndarray else _as_array(a) for a in arrays]
    if op is ReduceOp.MEAN and arrays[0].dtype.kind in "iu":
        return _mean_of_ints(arrays)
    ufunc = _binary(op, arrays[0].dtype)
    if len(arrays) == 1:
        out = np.array(arrays[0], dtype=_native(arrays[0].dtype), copy=True)
    else:
        # np.asarray: a ufunc of two 0-d arrays returns a numpy scalar, not an array.
        out = np.asarray(ufunc(arrays[0], arrays[1]))
        for a in arrays[2:]:
            ufunc(out, a, out=out)
    if op is ReduceOp.MEAN:
        out = _divide(out, len(arrays))
    return out


# Integers below this magnitude are exact in float64 (and, being below 2**63, in int64).
_EXACT_IN_FLOAT64 = 1 << 53


def _magnitude(array: Array) -> int:
    """The largest absolute value in an integer array, as a Python int (0 when empty)."""
    if not array.size:
        return 0
    return max(-int(array.min()), int(array.max()))


def _mean_dtype(dtype: np.dtype[Any]) -> np.dtype[Any]:
    """The dtype of the MEAN of integers of ``dtype``: the library's one rule."""
    return np.dtype(reduced_dtype(ReduceOp.MEAN, _dtype_name(dtype)))


def _exact_quotient(total: Array, count: int, dtype: np.dtype[Any]) -> Array:
    """An exact int64 sum of integers of ``dtype`` divided by ``count``, in the MEAN's dtype.

    ``total`` is below ``2**53`` in magnitude (so exact in float64): it is divided in
    float64, one rounding, and given the dtype ``_core._dtypes.reduced_dtype`` names
    (float64). ``count == 0`` gives NaN, as TensorFlow.
    """
    with np.errstate(invalid="ignore", divide="ignore"):
        quotient = np.asarray(np.true_divide(total, count, dtype=np.float64))
    result = _mean_dtype(dtype)
    return quotient if result == quotient.dtype else quotient.astype(result)


def _mean_of_ints(
    arrays: Sequence[Array], axis: tuple[int, ...] | None = None, *, count: int = 0
) -> Array:
    """The MEAN of integer arrays: the exact sum, divided, rounded once.

    The sum is never taken in the input dtype (int8 ``100 + 100`` wraps to -56, int64
    near ``2**62`` wraps negative). When every partial sum is provably below ``2**53``
    (always so for 32-bit and smaller integers on fewer than a million replicas), it is
    taken in int64, where it is exact, then converted to float64 (exactly) and divided
    (one rounding). Otherwise it is taken in Python integers, whose ``/`` is correctly
    rounded too, so both paths give the same bits: the float64 nearest to the true mean,
    then rounded to the MEAN's dtype (:func:`_exact_quotient`). Exact sums do not
    depend on the order of the replicas.

    Args:
        arrays: One integer array per replica, all of one shape (``axis`` None) or rank.
        axis: Also sum each array along these axes first (``Backend.reduce``); the
            count is then the number of elements summed.
        count: The divisor, when not the number of values summed: ``IndexedSlices``
            MEAN divides each replica's rows (one array, their concatenation) by the
            number of replicas.

    Returns:
        A new, writable array of the MEAN's dtype (``_core._dtypes.reduced_dtype``).
    """
    dtype = arrays[0].dtype
    if axis is None:
        count = count or len(arrays)
        small = dtype.itemsize <= 4 and count < EXACT_MEAN_COUNT
        bound = 0 if small else sum(map(_magnitude, arrays))
    else:
        count = sum(math.prod(a.shape[k] for k in axis) for a in arrays)
        bound = sum(_magnitude(a) * a.size for a in arrays)
    if bound < _EXACT_IN_FLOAT64:
        # Every value is below 2**53 too: int64 holds it (uint64 included).
        parts = [a.astype(np.int64) for a in arrays]
        if axis is not None:
            parts = [p.sum(axis=axis) for p in parts]
        total = np.array(parts[0], dtype=np.int64)
        for part in parts[1:]:
            np.add(total, part, out=total)
        return _exact_quotient(total, count, dtype)
    # astype(object) holds Python ints (np.asarray(..., dtype=object) of a numpy
    # scalar would hold the numpy scalar, whose + wraps around).
    exact = [np.asarray(a).astype(object) for a in arrays]
    if axis is not None:
        exact = [np.asarray(e.sum(axis=axis), dtype=object) for e in exact]
    sums = exact[0]
    for part in exact[1:]:
        sums = sums + part
    sums = np.asarray(sums, dtype=object)
    means = [t / count for t in sums.ravel().tolist()]
    quotient = np.array(means, dtype=np.float64).reshape(sums.shape)
    result = _mean_dtype(dtype)
    return quotient if result == quotient.dtype else quotient.astype(result)


def _divide(out: Array, n: int) -> Array:
    """The MEAN's division of a float or complex sum by ``n``, in place, in its dtype.

    Complex sums are divided part by part (two real divisions, correctly rounded at
    every array size), not by numpy's complex division, whose algorithm for a
    complex divisor ``n + 0j`` makes NaN of infinite parts.
    """
    if out.dtype.kind == "c":
        parts = out.reshape(-1).view(out.real.dtype) if out.flags.c_contiguous else None
        if parts is not None:
            np.true_divide(parts, n, out=parts)
        else:
            out.real = out.real / n
            out.imag = out.imag / n
        return out
    np.true_divide(out, n, out=out)
    return out


def _local(op: ReduceOp, array: Array, axis: tuple[int, ...]) -> Array:
    """One replica's value reduced along ``axis``, in its own dtype (as TensorFlow).

    numpy's sum and prod would promote small integers to int64; TensorFlow keeps int32.
    The PROD of complex values is folded row by row with :func:`_complex_multiply`.
    """
    if op is ReduceOp.PROD and array.dtype.kind == "c":
        rows = np.moveaxis(array, axis, tuple(range(len(axis))))
        kept = rows.shape[len(axis) :]
        rows = rows.reshape((-1, *kept))
        if not len(rows):
            return np.ones(kept, _native(array.dtype))  # the empty product
        # np.array, not rows[0].copy(): a 1-D ``rows`` (the whole value reduced, a 0-d
        # result) gives a numpy scalar from rows[0], whose parts cannot be written.
        out: Array = np.array(rows[0], copy=True)
        for row in rows[1:]:
            _complex_multiply(out, row, out=out)
        return out
    if op in (ReduceOp.SUM, ReduceOp.MEAN):
        return np.asarray(np.sum(array, axis=axis, dtype=_native(array.dtype)))
    if op is ReduceOp.PROD:
        return np.asarray(np.prod(array, axis=axis, dtype=_native(array.dtype)))
    local = np.min if op is ReduceOp.MIN else np.max
    return np.asarray(local(array, axis=axis))


def _densify(slices: IndexedSlices) -> Array:
    """The dense value of ``slices``: rows at their indices, duplicates summed (as TF)."""
    values = _as_array(slices.values)
    dense = np.zeros(slices.dense_shape, values.dtype)
    np.add.at(dense, _as_array(slices.indices), values)
    return dense


def _concat_slices(op: ReduceOp, slices: Sequence[object]) -> tuple[Array, Array, tuple[int, ...]]:
    """Every replica's ``IndexedSlices`` of one leaf reduced, as TensorFlow reduces them.

    The rows are concatenated in replica order, not densified (SUM keeps duplicate
    indices); MEAN divides the values by the number of replicas, in the MEAN's dtype.

    Returns:
        New values, new indices and the dense shape.

    Raises:
        ValueError: ``op`` is not SUM or MEAN.
        BackendError: A component is not ``IndexedSlices`` (the runtime checks that
            every replica's leaf is sparse or none is: a bug in asyncreplica).
    """
    if op not in (ReduceOp.SUM, ReduceOp.MEAN):
        raise ValueError(sparse_op_message(op))
    parts = [s for s in slices if isinstance(s, IndexedSlices)]
    if len(parts) != len(slices):
        raise _internal("one leaf is IndexedSlices on some replicas and dense on others")
    values = np.concatenate([_as_array(s.values) for s in parts], axis=0)
    index_arrays = [_as_array(s.indices) for s in parts]
    # Row numbers stay integers: int32 with int64 is int64, but numpy makes int64
    # with uint64 float64 (describe refused non-integer indices already).
    same = all(a.dtype == index_arrays[0].dtype for a in index_arrays)
    if any(a.size and int(a.max()) >= INDEX_LIMIT for a in index_arrays if a.dtype.kind == "u"):
        raise _internal("an IndexedSlices index does not fit int64 (describe refuses it)")
    indices = np.concatenate(index_arrays, axis=0, dtype=None if same else np.int64)
    if op is ReduceOp.MEAN:
        if values.dtype.kind in "iu":
            # Each value divided (not summed), by the one exact rule: rounded once.
            values = _mean_of_ints([values], count=len(parts))
        else:
            values = _divide(values, len(parts))
    return values, indices, parts[0].dense_shape


def _internal(what: str) -> BackendError:
    """An invariant the runtime guarantees did not hold: a bug in asyncreplica, not the user's."""
    return BackendError(
        f"internal error in the numpy backend: {what}. The runtime checks every replica's "
        "value before a collective runs, so this is a bug in asyncreplica; please report it "
        "with the program that raised it"
    )
