"""The dtype rules of reductions, once: which dtypes reduce, and the dtype of each result.

Every path that reduces (the backends' single-leaf, batch, packed and large paths,
``Strategy.reduce``, ``extended.reduce_to``/``batch_reduce_to``, the cross-process
paths) and the reference semantics (:mod:`asyncreplica.testing._reference`) ask
these functions; none of them decides a result dtype by itself. Dtypes are named as
the array API standard names them (``"float32"``), plus ``"bfloat16"``.

The rules, as TensorFlow 2.21 applies them (measured: docs/migration.md):

* ``SUM``, ``MIN``, ``MAX`` and ``PROD`` keep the input dtype.
* ``MEAN`` of a float or complex dtype keeps it (the sum, divided by the count).
* ``MEAN`` of an integer dtype is ``float64``, computed exactly: the true sum,
  divided, rounded once (see :data:`EXACT_MEAN_COUNT`). TensorFlow's ``truediv``
  gives ``float32`` for 8- and 16-bit integers in ``Strategy.reduce`` (and refuses
  them in ``all_reduce``); here every integer MEAN follows the one float64 rule, as
  every backend implements it (docs/migration.md lists the difference).
* Booleans are held (broadcast, all_gather, gather) but never reduced.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from ._signature import LeafSpec, ReduceOp

__all__ = [
    "EXACT_MEAN_COUNT",
    "FLOATING_DTYPES",
    "INTEGER_DTYPES",
    "REDUCIBLE_DTYPES",
    "REFUSAL_MARK",
    "is_refusal",
    "is_integer",
    "is_reducible",
    "not_reducible_message",
    "number_dtype",
    "reduce_refusal",
    "refusal",
    "reduced_dtype",
    "same_refusal",
    "sparse_op_message",
]

#: Integer dtypes, by name.
INTEGER_DTYPES = frozenset(
    ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
)
#: Float and complex dtypes, by name.
FLOATING_DTYPES = frozenset(
    ("float16", "bfloat16", "float32", "float64", "complex64", "complex128")
)
#: Every dtype a reduction accepts.
REDUCIBLE_DTYPES = INTEGER_DTYPES | FLOATING_DTYPES
#: Floats of extended precision (numpy's longdouble, clongdouble), by name: refused.
EXTENDED_DTYPES = frozenset(("float96", "float128", "complex192", "complex256", "longdouble"))


def is_integer(dtype: str) -> bool:
    """Whether ``dtype`` (a name) is a signed or unsigned integer dtype."""
    return dtype in INTEGER_DTYPES


def is_reducible(dtype: str) -> bool:
    """Whether values of ``dtype`` (a name) can be reduced (SUM, MEAN, MIN, MAX, PROD)."""
    return dtype in REDUCIBLE_DTYPES


def not_reducible_message(dtype: str) -> str:
    """Why values of ``dtype`` (a name, not reducible) are refused by a reduction."""
    if dtype in EXTENDED_DTYPES:
        # A float all the same: "reductions need float values" would say the opposite.
        return (
            f"cannot reduce values of dtype {dtype}: extended precision (numpy's "
            "longdouble) is not supported, because its size and bits differ between "
            "platforms and processes could not be held to one result bit for bit; "
            "reductions take float16, bfloat16, float32, float64, complex64, complex128 "
            "and the integer dtypes: cast first, e.g. x.astype(np.float64)"
        )
    return (
        f"cannot reduce values of dtype {dtype}: reductions need integer, float or "
        "complex values (cast booleans first: x.astype(np.int32) in numpy, "
        "xp.astype(x, xp.int32) in other array API libraries, x.int() in PyTorch)"
    )


def sparse_op_message(op: ReduceOp) -> str:
    """Why ``IndexedSlices`` are refused by a reduction with ``op`` (not SUM or MEAN)."""
    return f"IndexedSlices can be reduced with SUM or MEAN only, not {op.value}"


def reduce_refusal(op: ReduceOp, leaves: Sequence[LeafSpec]) -> TypeError | ValueError | None:
    """The error a reduction of leaves described by ``leaves`` must raise, or None.

    Both refusals follow from the signature alone, so a replica raises them when it
    issues the collective, before any replica waits on it: a refusal found when the
    last replica dispatched would reach that replica only (its peers, parked, would
    wait for a result that never comes if it caught the error).
    """
    for spec in leaves:
        if spec.sparse and op is not ReduceOp.SUM and op is not ReduceOp.MEAN:
            return _refusal(ValueError(sparse_op_message(op)))
        if spec.dtype not in REDUCIBLE_DTYPES:
            return _refusal(TypeError(not_reducible_message(spec.dtype)))
    return None


#: The attribute that marks an error as a refusal of the collective a replica issues (by
#: :func:`reduce_refusal`, or of a value the backend cannot hold), raised before any wait:
#: every replica that issues the same collective raises the same one, and the run reports
#: it once; under MPI every process raises the first process's (see ``end_run``).
REFUSAL_MARK = "_asyncreplica_refusal"

_Refused = TypeVar("_Refused", bound=Exception)


def refusal(error: _Refused) -> _Refused:
    """``error``, marked as a refusal of the collective a replica issues (see REFUSAL_MARK)."""
    setattr(error, REFUSAL_MARK, True)
    return error


_refusal = refusal


def is_refusal(error: BaseException) -> bool:
    """Whether ``error`` is a refusal of the collective a replica issued (see REFUSAL_MARK)."""
    return bool(getattr(error, REFUSAL_MARK, False))


def same_refusal(errors: Sequence[BaseException]) -> bool:
    """Whether ``errors`` (two or more) are one refusal raised by every replica alike.

    Each replica refuses the collective it issues, before any waits, so a refused
    collective fails every replica with the same error: one error, not a group of copies
    (its class must not depend on how many replicas a process holds).
    """
    first = errors[0]
    key = (type(first), str(first))
    return all(getattr(e, REFUSAL_MARK, False) and (type(e), str(e)) == key for e in errors)


def reduced_dtype(op: ReduceOp, dtype: str) -> str:
    """The dtype of the result of reducing values of ``dtype`` with ``op``.

    Args:
        op: The reduce op.
        dtype: The inputs' dtype name (every replica's is the same: see ``_match``).

    Returns:
        The result's dtype name.
    """
    if op is ReduceOp.MEAN and dtype in INTEGER_DTYPES:
        return "float64"
    return dtype


#: Integer MEAN is the float64 nearest the true mean for fewer values than this per
#: element: their sum is then below ``2**53`` for 32-bit integers and is taken in int64
#: (exact), converted to float64 (exact) and divided (one rounding); wider integers,
#: or more values, are summed in Python integers, whose ``/`` rounds once too.
EXACT_MEAN_COUNT = 1 << 20


def number_dtype(value: int | float | complex) -> str:
    """The dtype a Python number reduces in: TensorFlow's conversion of a Python number.

    ``float`` is ``float32``; ``int`` is ``int32``, or ``int64`` past int32's range;
    ``complex`` is ``complex128``. This is for a plain (non-distributed) number only:
    a collective's Python numbers, and a ``PerReplica`` of them in every cross-replica
    API, are described as the backend describes them (numpy: int64, float64) instead:
    see docs/migration.md.
    """
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int32" if -(1 << 31) <= value < (1 << 31) else "int64"
    if isinstance(value, float):
        return "float32"
    return "complex128"
