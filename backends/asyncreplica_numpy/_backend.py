"""NumpyBackend: reductions in replica order into one shared, read-only buffer."""

from __future__ import annotations

import io
import itertools
import math
import operator
import os
import pathlib
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar, Protocol, TypeVar, cast

import anyio.lowlevel
import anyio.to_thread
import numpy as np
import numpy.typing as npt

from asyncreplica import IndexedSlices, _compiled
from asyncreplica.abc import (
    EXACT_MEAN_COUNT,
    Backend,
    LeafSpec,
    ReduceOp,
    not_reducible_message,
    number_dtype,
    value_text,
)

from ._combine import (
    INDEX_LIMIT,
    _as_array,
    _binary,
    _combine,
    _concat_slices,
    _densify,
    _divide,
    _dtype_name,
    _exact_quotient,
    _holdable,
    _internal,
    _local,
    _mean_of_ints,
    _native,
    _reducible_dtype,
)
from ._devices import place_like, restore_host
from ._foreign import (
    Library,
    aligned_empty,
    from_host_owned,
    from_host_shared,
    library_of,
    takes_ownership,
    to_host,
)

__all__ = ["NumpyBackend", "batch_pass", "group_by_size"]

Leaves = Sequence[Sequence[object]]
Array = npt.NDArray[Any]


def _check_described(values: Leaves, layouts: dict[int, _Layout]) -> None:
    """Refuse a batch whose leaves changed shape or dtype since ``describe_leaves``.

    ``describe_leaves`` ran when each replica issued the collective, and its signature
    says what it found; the leaves are read when the last replica arrives. The fast
    batch paths check every leaf against that (the C pack refuses a leaf of another
    shape); this general path, taken when they decline, checks here, so that a leaf
    reshaped in flight is refused rather than reduced in its new shape.
    """
    for r, row in enumerate(values):
        found = layouts.get(id(row))
        if found is None or found[0] is not row:
            continue
        _, dtype, shapes = found
        expected = [shapes] * len(row) if isinstance(shapes, tuple) else shapes
        try:
            # No Python call per leaf on the common path (attribute reads and list
            # comparisons run in C): the batch path's cost must not grow with the leaves.
            arrays = cast("list[np.ndarray[Any, Any]]", row)  # else AttributeError below
            now_shapes = [leaf.shape for leaf in arrays]
            if now_shapes == expected and [leaf.dtype for leaf in arrays] == [dtype] * len(row):
                continue
        except AttributeError:
            now_shapes = [getattr(leaf, "shape", None) for leaf in row]
        for j, leaf in enumerate(row):
            if now_shapes[j] != expected[j] or getattr(leaf, "dtype", None) != dtype:
                raise ValueError(
                    f"replica {r}'s batch changed while its all_reduce was in flight: leaf {j} "
                    f"was {dtype}{list(expected[j])} when the collective was issued and is "
                    f"{getattr(leaf, 'dtype', type(leaf).__name__)}{list(now_shapes[j] or ())} "
                    "now. A collective reads its inputs when the last replica arrives: do not "
                    "reshape, resize or write to a value until the await of its collective "
                    "returns (pass a copy, x.copy(), to keep using the original)."
                )


# What NumpyBackend.convert returns as it is: arrays (a subclass is held to its shape and
# dtype in flight, as an ndarray is) and immutable numbers.
_READ_AS_IS = (np.ndarray, np.generic, int, float, complex)

# Leaf specs by (shape, dtype): the same spec object for the same kind of leaf.
_specs: dict[tuple[tuple[int, ...], np.dtype[Any]], LeafSpec] = {}
# The same specs by dtype, then shape: for describing a batch of one dtype at once.
_specs_by_dtype: dict[np.dtype[Any], dict[tuple[int, ...], LeafSpec]] = {}
# Specs of foreign leaves (JAX, array_api_strict, ...) by (shape, dtype, array type).
_foreign_specs: dict[tuple[tuple[int, ...], np.dtype[Any], str], LeafSpec] = {}


def _host_values(values: Leaves) -> tuple[Leaves, list[Library | None] | None]:
    """``values`` with foreign leaves (JAX, array_api_strict, ...) as numpy arrays.

    Returns ``(values, None)``, unchanged, when no leaf is foreign: replica 0's leaves
    decide, because the ledger checked that every replica's leaf ``j`` has the same
    array type. Otherwise also the library of each leaf (None where not foreign).
    Nothing is kept from one collective to the next (see :func:`to_host`: JAX and
    array_api_strict arrays give their numpy view for a few attribute reads).
    """
    first = values[0]
    if list(map(type, first)).count(np.ndarray) == len(first):
        return values, None
    libraries = list(map(library_of, first))
    if libraries.count(None) == len(libraries):
        return values, None
    host = [
        [v if lib is None else to_host(v, lib) for v, lib in zip(row, libraries, strict=True)]
        for row in values
    ]
    return host, libraries


def _host_components(components: Sequence[object]) -> tuple[list[object], Library | None]:
    """Components as numpy arrays, and the library of the first one (None if numpy)."""
    libraries = [None if type(c) is np.ndarray else library_of(c) for c in components]
    host = [
        c if lib is None else to_host(c, lib) for c, lib in zip(components, libraries, strict=True)
    ]
    return host, libraries[0] if libraries else None


class _ReadOnly:
    """What :func:`_frozen`'s result is based on in the Python pass: its memory, read-only.

    numpy makes an array of it through ``__array_interface__`` (marked read-only) and
    keeps it as the array's base. It exports no buffer, so numpy refuses to make that
    array, or any view of it, writable; the array it holds is in a private slot.
    """

    __slots__ = ("_array", "_interface")

    def __init__(self, array: Array) -> None:
        self._array = array  # keeps the memory alive
        interface = array.__array_interface__
        interface["data"] = (interface["data"][0], True)
        self._interface = interface

    @property
    def __array_interface__(self) -> dict[str, Any]:
        # A new dict each time: one handed out and changed (its data flag, its shape)
        # must not change what the next reader gets.
        return dict(self._interface)


def _is_masked(value: object) -> bool:
    """Whether ``value`` is a numpy masked array, without importing ``numpy.ma``.

    ``np.ma`` is imported on first use; where nothing imported it, nothing can be one.
    """
    ma = sys.modules.get("numpy.ma")
    return ma is not None and isinstance(value, ma.MaskedArray)


def _frozen(array: Array) -> Array:
    """A read-only array of ``array``'s memory that no one can make writable again.

    Every result the backend shares between replicas is made of one: ``setflags`` on it,
    on a view of it or on anything in its ``base`` chain raises, because that chain ends
    in an object that exports no writable buffer (``_cpass.freeze``'s ``_Owner`` when
    the C pass runs, else :class:`_ReadOnly`), not in an array that owns its data. The
    backend keeps ``array`` writable (a pooled buffer is written again once no result
    refers to it) and never hands it out. Inputs of an ndarray subclass are combined as
    plain views (``_combine._as_array``), so results are plain arrays; a subclass
    ``array`` given here anyway stays one: a view of the frozen array, whose base chain
    ends the same way.
    """
    base = array if type(array) is np.ndarray else array.view(np.ndarray)
    carrier = base
    if base.dtype.isbuiltin != 1 or base.dtype.kind not in "biufc":
        # A dtype of another package (ml_dtypes' bfloat16), or not in native byte order:
        # frozen as unsigned integers of its size (the C pass takes numpy's own number
        # dtypes only, and ``__array_interface__`` spells bfloat16 as void, ``|V2``),
        # then viewed with its own dtype again: the same bytes, still read-only.
        carrier = base.view(_UINT_OF_SIZE[base.dtype.itemsize])
    frozen = _CPASS.freeze(carrier) if _CPASS is not None else np.asarray(_ReadOnly(carrier))
    if carrier is not base:
        frozen = frozen.view(base.dtype)
    return frozen if base is array else frozen.view(type(array))


_UINT_OF_SIZE = {
    1: np.uint8,
    2: np.uint16,
    4: np.uint32,
    8: np.uint64,
    16: np.complex128,
}  # 16: complex128 only carries bytes


def _shared(out: Array, n: int) -> list[Array]:
    """One read-only view of ``out`` per replica (see :func:`_frozen`)."""
    return list(map(np.ndarray.view, [_frozen(out)] * n))


# Large reductions: above OFFLOAD_BYTES per leaf the sum runs off the event loop, split
# across WORKERS threads (numpy releases the GIL), each walking cache-sized blocks so
# the accumulator stays in L2. Above POOL_BYTES output buffers are reused once no
# replica holds a view of them (a fresh 64 MiB buffer costs ~20% in page faults).
OFFLOAD_BYTES = 4 << 20
POOL_BYTES = 1 << 20
BLOCK_BYTES = 256 << 10
WORKERS = max(1, min(4, os.cpu_count() or 1))
_POOL_PER_SHAPE = 2
# The batch path's scratch (two replicas' leaves of a pack) is kept up to this size.
_SCRATCH_KEEP_BYTES = 32 << 20


def _blocked(
    ufunc: Callable[..., Array], arrays: Sequence[Array], out: Array, lo: int, hi: int
) -> None:
    """``out[lo:hi] = a0 op a1 op ...`` in replica order, block by block (flat views)."""
    step = max(BLOCK_BYTES // out.itemsize, 1)
    first, rest = arrays[0], arrays[1:]
    for start in range(lo, hi, step):
        stop = min(start + step, hi)
        block = out[start:stop]
        if rest:
            ufunc(first[start:stop], rest[0][start:stop], out=block)
            for a in rest[1:]:
                ufunc(block, a[start:stop], out=block)
        else:
            block[...] = first[start:stop]


_T = TypeVar("_T")


def group_by_size(items: Sequence[_T], sizes: Sequence[int], bytes_per_pack: int) -> list[list[_T]]:
    """Split ``items`` into packs by TensorFlow's ``group_by_size`` rule.

    ``bytes_per_pack == 0`` gives one pack. Otherwise items are added in order and a
    pack is closed only once it *exceeds* ``bytes_per_pack`` bytes, so every pack but
    the last holds more than ``bytes_per_pack`` bytes ("prefer larger packs").

    Args:
        items: The items to pack, in order.
        sizes: Each item's size in bytes.
        bytes_per_pack: The pack size; 0 for one pack.

    Returns:
        The packs, in order; ``[]`` for no items.
    """
    if not items:
        return []
    if bytes_per_pack == 0:
        return [list(items)]
    packs: list[list[_T]] = []
    last = 0
    for item, size in zip(items, sizes, strict=True):
        if not packs or last > bytes_per_pack:
            packs.append([])
            last = 0
        packs[-1].append(item)
        last += size
    return packs


_dtype_of = operator.attrgetter("dtype")
_shape_of = operator.attrgetter("shape")
_nbytes_of = operator.attrgetter("nbytes")


# What describe_leaves found of a batch, by the id of the leaves' list: the list itself
# (so that the id stays its own while the entry lives), the one dtype of every leaf (all
# numpy arrays), and the one shape of every leaf (a tuple) or each leaf's (a list).
_Layout = tuple[Sequence[object], np.dtype[Any], "tuple[int, ...] | list[tuple[int, ...]]"]


def _batch_layout(
    values: Leaves, layouts: dict[int, _Layout]
) -> tuple[np.dtype[Any], tuple[int, ...] | list[tuple[int, ...]]] | None:
    """The dtype and shapes of a batch for :func:`_reduce_batch`, or None.

    Every leaf of every replica must be a numpy array of one dtype (compared exactly:
    the ledger compared dtype *names*, and ``'>f4'`` and ``'<f4'`` are both float32).
    What ``describe_leaves`` found of each replica's leaves (``layouts``) answers
    that without another look at them; a replica it did not see is checked here, in
    a few C-level sweeps over its leaves.
    """
    first = values[0]
    m = len(first)
    ndarray = np.ndarray
    shapes: tuple[int, ...] | list[tuple[int, ...]]
    found = layouts.get(id(first))
    if found is not None and found[0] is first:
        dtype, shapes = found[1], found[2]
    else:
        if list(map(type, first)).count(ndarray) != m:
            return None
        dtypes = list(map(_dtype_of, first))
        dtype = dtypes[0]
        if dtypes.count(dtype) != m:
            return None
        shapes = list(map(_shape_of, first))
        if shapes.count(shapes[0]) == m:
            shapes = shapes[0]
    for r in range(1, len(values)):
        row = values[r]
        if len(row) != m:
            return None
        found = layouts.get(id(row))
        if found is not None and found[0] is row:
            if found[1] != dtype:
                return None
        elif (
            list(map(type, row)).count(ndarray) != m or list(map(_dtype_of, row)).count(dtype) != m
        ):
            return None
    return dtype, shapes


def _combine_packed(
    op: ReduceOp, parts: Leaves, dtype: np.dtype[Any], scratch: io.BytesIO
) -> Array | None:
    """Each replica's leaves of one pack, joined flat and combined in replica order.

    Replica 0's and 1's leaves are written byte for byte into ``scratch`` (one C call
    each, which refuses a non-contiguous leaf) and combined into a new array, then
    every other replica's, written over them, is combined into it in place: exactly
    the operations :func:`_combine` makes for one leaf. The result is a new array
    (never a view of the ``bytearray``), which the caller freezes (:func:`_frozen`).
    Integers' MEAN is summed exactly in int64 and rounded once,
    as :func:`_mean_of_ints` does for 32-bit and smaller integers. Returns None when
    a replica's leaves do not fill as many bytes as replica 0's.
    """
    n = len(parts)
    exact_mean = op is ReduceOp.MEAN and dtype.kind in "iu"
    ufunc = np.add if exact_mean else _binary(op, dtype)
    scratch.seek(0)
    scratch.writelines(parts[0])  # type: ignore[arg-type]
    nbytes = scratch.tell()
    count = nbytes // dtype.itemsize
    if n > 1:
        scratch.writelines(parts[1])  # type: ignore[arg-type]
        if scratch.tell() != 2 * nbytes:
            return None
    total: Array
    with scratch.getbuffer() as buffer:
        first = np.frombuffer(buffer, dtype, count)
        if exact_mean:
            total = first.astype(np.int64)
            if n > 1:
                np.add(total, np.frombuffer(buffer, dtype, count, nbytes), out=total)
        elif n > 1:
            total = ufunc(first, np.frombuffer(buffer, dtype, count, nbytes))
        else:
            total = first.copy()
        del first  # releases the buffer, so the scratch can be written again
    for r in range(2, n):
        scratch.seek(0)
        scratch.writelines(parts[r])  # type: ignore[arg-type]
        if scratch.tell() != nbytes:
            return None
        with scratch.getbuffer() as buffer:
            other = np.frombuffer(buffer, dtype, count)
            ufunc(total, other, out=total)
            del other
    if exact_mean:
        return _exact_quotient(total, n, dtype)
    if op is ReduceOp.MEAN:
        return _divide(total, n)
    return total


def _reduce_batch(
    op: ReduceOp,
    values: Leaves,
    bytes_per_pack: int,
    scratch: io.BytesIO,
    layouts: dict[int, _Layout],
) -> list[list[object]] | None:
    """all_reduce of a batch of small contiguous arrays of one native dtype, or None.

    The fast path for the common batch (a list of gradients), in one pass over the
    leaves: :func:`_batch_layout` takes their dtype and shapes from what
    ``describe_leaves`` found (``layouts``), then each replica's leaves of a pack are
    joined byte for byte into one flat buffer (``join`` over their buffers: one C
    call, which also refuses a non-contiguous leaf; every other replica's into
    ``scratch``, reused from call to call) and the buffers are combined in replica
    order exactly as :func:`_combine` combines one leaf (integers' MEAN exactly, as
    :func:`_mean_of_ints`). Each replica's results are read-only views of the one
    result buffer: for leaves of one shape, the rows of one reshaped view, made in C.
    Returns None (the caller takes the general path) for anything else: mixed dtypes
    or types, a non-native byte order, a non-contiguous or large leaf, an empty batch.
    """
    layout = _batch_layout(values, layouts)
    if layout is None:
        return None
    # The layouts are what the leaves were at issue; ``join`` reads bytes, so a leaf
    # reinterpreted in flight (``x.dtype = ...``) is refused here, as the C pack refuses
    # it (and the general path, and a single leaf: one rule).
    _check_described(values, layouts)
    dtype, shapes = layout
    if not _reducible_dtype(dtype) or not dtype.isnative:
        return None
    n = len(values)
    first = values[0]
    m = len(first)
    sizes: list[int] | None = None
    if isinstance(shapes, tuple):
        shape = shapes
        leaf_bytes = math.prod(shape) * dtype.itemsize
        if not leaf_bytes or leaf_bytes >= POOL_BYTES:
            return None
    else:
        shape = None
        leaf_bytes = 0
        sizes = list(map(_nbytes_of, first))
        if max(sizes) >= POOL_BYTES or not sum(sizes):
            return None
    if bytes_per_pack:
        # As TensorFlow: the last leaves go first into packs (results are the same).
        every = [leaf_bytes] * m if sizes is None else sizes
        packs = group_by_size(range(m - 1, -1, -1), every[::-1], bytes_per_pack)
        ranges = [(pack[-1], pack[0] + 1) for pack in packs]
    else:
        ranges = [(0, m)]
    integers = dtype.kind in "iu"
    if op is ReduceOp.MEAN and integers and (dtype.itemsize > 4 or n >= EXACT_MEAN_COUNT):
        return None  # may need Python integers to stay exact: see _mean_of_ints
    out: list[list[object]] = [[None] * m for _ in range(n)]
    for lo, hi in ranges:
        whole = lo == 0 and hi == m
        try:
            flat = _combine_packed(
                op, values if whole else [row[lo:hi] for row in values], dtype, scratch
            )
        except (TypeError, ValueError, BufferError):  # a non-contiguous leaf has no plain buffer
            return None
        if flat is None:
            return None
        flat = _frozen(flat)  # the views cannot be made writable
        if shape:
            # Leaves of one shape: the rows of one reshaped view, made in C.
            rows = flat.reshape((hi - lo, *shape))
            if whole:
                return [list(rows) for _ in range(n)]
            for r in range(n):
                out[r][lo:hi] = list(rows)
            continue
        counts = (
            [leaf_bytes // dtype.itemsize] * (hi - lo)
            if sizes is None
            else [size // dtype.itemsize for size in sizes[lo:hi]]
        )
        ends = list(itertools.accumulate(counts))
        bases = list(map(flat.__getitem__, map(slice, [0, *ends[:-1]], ends)))
        if shape is not None:
            leaf_shapes = [shape] * (hi - lo)
        else:
            leaf_shapes = cast(list[tuple[int, ...]], shapes)[lo:hi]
        for k, leaf_shape in enumerate(leaf_shapes):
            if len(leaf_shape) != 1:
                bases[k] = bases[k].reshape(leaf_shape)
        out[0][lo:hi] = bases
        for r in range(1, n):
            out[r][lo:hi] = list(map(np.ndarray.view, bases))
    return out


class _Pass(Protocol):
    """The C single pass over a batch (``_cpass.c``, where each function is documented)."""

    def describe(
        self, values: object, by_dtype: dict[np.dtype[Any], dict[tuple[int, ...], LeafSpec]], /
    ) -> tuple[tuple[LeafSpec, ...], np.dtype[Any], tuple[int, ...] | list[tuple[int, ...]]] | None:
        """Specs, dtype and shapes of one replica's plain leaves, or None."""

    def pack(
        self,
        row: object,
        lo: int,
        hi: int,
        dtype: np.dtype[Any],
        shapes: tuple[int, ...] | list[tuple[int, ...]],
        out: Array,
        /,
    ) -> int:
        """Copy row[lo:hi] (checked) to the start of ``out``; bytes written, or -1."""

    def views(
        self,
        flat: Array,
        n: int,
        shapes: tuple[int, ...] | list[tuple[int, ...]],
        lo: int,
        hi: int,
        /,
    ) -> list[list[Array]]:
        """Each replica's read-only views of leaves lo..hi-1 of ``flat``."""

    def freeze(self, array: Array, /) -> Array:
        """A read-only array of ``array``'s memory that cannot be made writable."""


def _load_pass() -> tuple[_Pass | None, str]:
    """The C single pass (``_cpass``) when it was compiled and may run, else None and why."""
    reason = _compiled.c_extension_reason(
        "asyncreplica_numpy._cpass", pathlib.Path(__file__).with_name("_cpass.c")
    )
    if reason is not None:
        return None, reason
    try:
        from . import _cpass
    except ImportError as error:  # e.g. built against another numpy's C API
        return None, f"cannot import asyncreplica_numpy._cpass: {error}"
    return _cpass, ""


_CPASS, _CPASS_REASON = _load_pass()


def batch_pass() -> str:
    """Which single pass over a batched all_reduce runs, in one line (``asyncreplica doctor``).

    Returns:
        ``"compiled (C): asyncreplica_numpy._cpass"`` or ``"interpreted: <why>"``.
    """
    if _CPASS is not None:
        return "compiled (C): asyncreplica_numpy._cpass"
    return f"interpreted: {_CPASS_REASON}"


def _combine_c(
    cpass: _Pass,
    op: ReduceOp,
    values: Leaves,
    lo: int,
    hi: int,
    dtype: np.dtype[Any],
    shapes: tuple[int, ...] | list[tuple[int, ...]],
    nbytes: int,
    scratch: Array,
) -> Array | None:
    """:func:`_combine_packed` with the C pack: leaves lo..hi-1 of every replica, combined.

    Replica 0's leaves are copied straight into the result (a new array that numpy owns),
    every other replica's into ``scratch`` (bytes, at least ``nbytes``), which is then
    combined into it in replica order: element by element the operations
    :func:`_combine` makes for one leaf, so the bits are the same. Returns None when a
    replica's leaf is not exactly a C-contiguous numpy array of ``dtype`` and its shape.
    """
    n = len(values)
    count = nbytes // dtype.itemsize
    other = scratch[:nbytes].view(dtype)
    pack = cpass.pack
    if op is ReduceOp.MEAN and dtype.kind in "iu":
        # Summed exactly in int64 and rounded once, as _mean_of_ints does for these.
        if pack(values[0], lo, hi, dtype, shapes, other) != nbytes:
            return None
        total = other.astype(np.int64)
        for r in range(1, n):
            if pack(values[r], lo, hi, dtype, shapes, other) != nbytes:
                return None
            np.add(total, other, out=total)
        return _exact_quotient(total, n, dtype)
    total = np.empty(count, dtype)
    if pack(values[0], lo, hi, dtype, shapes, total) != nbytes:
        return None
    ufunc = _binary(op, dtype)
    for r in range(1, n):
        if pack(values[r], lo, hi, dtype, shapes, other) != nbytes:
            return None
        ufunc(total, other, out=total)
    if op is ReduceOp.MEAN:
        return _divide(total, n)
    return total


def _reduce_batch_c(
    cpass: _Pass,
    op: ReduceOp,
    values: Leaves,
    bytes_per_pack: int,
    scratch: list[Array],
    layouts: dict[int, _Layout],
) -> list[list[object]] | None:
    """:func:`_reduce_batch` in one C-level pass per replica: the same results, or None.

    Replica 0's dtype and shapes come from what ``describe_leaves`` found (or from a
    look at its leaves); every replica's leaves are then checked (exact type, dtype,
    shape, C-contiguity) and copied in one C loop (:func:`_combine_c`), and each
    replica's read-only views are made in another. Returns None, for the general path,
    exactly where :func:`_reduce_batch` does, and also for a replica whose leaves do
    not all match replica 0's (the general path then gives the same results).
    """
    layout = _batch_layout(values[:1], layouts)
    if layout is None:
        return None
    dtype, shapes = layout
    if not _reducible_dtype(dtype) or not dtype.isnative or dtype.isbuiltin != 1:  # not bfloat16
        return None
    n = len(values)
    first = values[0]
    m = len(first)
    for r in range(1, n):
        if len(values[r]) != m:
            return None
    sizes: list[int]
    if isinstance(shapes, tuple):
        leaf_bytes = math.prod(shapes) * dtype.itemsize
        if not leaf_bytes or leaf_bytes >= POOL_BYTES:
            return None
        sizes = [leaf_bytes] * m
    else:
        sizes = list(map(_nbytes_of, first))
        if max(sizes) >= POOL_BYTES or not sum(sizes):
            return None
    if bytes_per_pack:
        # As TensorFlow: the last leaves go first into packs (results are the same).
        packs = group_by_size(range(m - 1, -1, -1), sizes[::-1], bytes_per_pack)
        ranges = [(pack[-1], pack[0] + 1) for pack in packs]
    else:
        ranges = [(0, m)]
    if op is ReduceOp.MEAN and dtype.kind in "iu" and (dtype.itemsize > 4 or n >= EXACT_MEAN_COUNT):
        return None  # may need Python integers to stay exact: see _mean_of_ints
    largest = max(sum(sizes[lo:hi]) for lo, hi in ranges)
    if scratch[0].nbytes < largest:
        scratch[0] = np.empty(largest, np.uint8)
    out: list[list[object]] = [[None] * m for _ in range(n)]
    for lo, hi in ranges:
        nbytes = sum(sizes[lo:hi]) if len(ranges) > 1 else sum(sizes)
        flat = _combine_c(cpass, op, values, lo, hi, dtype, shapes, nbytes, scratch[0])
        if flat is None:
            return None
        views = cpass.views(flat, n, shapes, lo, hi)  # based on a frozen owner of flat
        if lo == 0 and hi == m:
            return cast(list[list[object]], views)
        for r in range(n):
            out[r][lo:hi] = views[r]
    return out


async def _off_loop(fn: Callable[[], object]) -> None:
    """Run ``fn()`` in a worker thread, which keeps no reference to it afterwards.

    anyio's worker thread holds the last callable it ran (and so whatever that closes
    over) until it is handed the next one: a pooled output referenced from there would
    look held by a replica and could not be reused.
    """
    box = [fn]

    def call() -> None:
        f = box.pop()
        f()

    await anyio.to_thread.run_sync(call)


class NumpyBackend(Backend):
    """Values are numpy arrays (numpy scalars and Python numbers are accepted) on the CPU.

    Results that several replicas receive share one read-only buffer; each replica gets
    its own view. Reductions run in replica-id order, so results are bitwise identical
    on every replica whatever the arrival order.

    Args:
        devices: Each local replica's device; all must be CPU devices.

    Raises:
        ValueError: A device is not a CPU device.
    """

    name: ClassVar[str] = "numpy"
    #: JAX, ``array_api_strict``, PyTorch (CPU) ... arrays are held as numpy arrays and
    #: come back in their own type (``asyncreplica_numpy._foreign``).
    accepts_foreign_arrays: ClassVar[bool] = True

    def __init__(self, devices: Sequence[str]) -> None:
        super().__init__(devices)
        self._pool: dict[tuple[tuple[int, ...], str], list[Array]] = {}
        # Where other replicas' leaves of a batch are joined (reused; see _reduce_batch).
        self._scratch = io.BytesIO()
        # The C single pass over a batch, when compiled (see batch_pass), and its scratch.
        self._cpass: _Pass | None = _CPASS
        self._cscratch: list[Array] = [np.empty(0, np.uint8)]
        # What describe_leaves found of each replica's batch, for the all_reduce that
        # follows (see _batch_layout); emptied by every collective.
        self._layouts: dict[int, _Layout] = {}
        # Room for every replica's batch of a few collectives in flight at once.
        self._max_layouts = 4 * len(self.devices) + 16
        self._threads: ThreadPoolExecutor | None = None
        others = [d for d in self.devices if not d.startswith("CPU:")]
        if others:
            raise ValueError(
                f"the numpy backend holds values on the CPU only, but devices {others} were "
                "requested: use CPU devices ('CPU:0', 'CPU:1', ...) or a GPU backend "
                "(backend='cupy')"
            )

    def describe(self, value: object) -> LeafSpec:
        """Describe a numpy array, numpy scalar, Python number or ``IndexedSlices``."""
        if type(value) is np.ndarray:
            spec = _specs.get((value.shape, value.dtype))
            if spec is not None:
                return spec
        if type(value) is not np.ndarray:
            library = library_of(value)
            if library is not None:
                return self._describe_foreign(value, library)
        if isinstance(value, IndexedSlices):
            values = self._checked(value.values, "IndexedSlices.values")
            indices = self._checked(value.indices, "IndexedSlices.indices")
            _check_slices(values, indices, value.dense_shape)
            return LeafSpec(value.dense_shape, _dtype_name(values.dtype), sparse=True)
        array = self._checked(value, "a collective's value")
        key = (array.shape, array.dtype)
        spec = _specs.get(key)
        if spec is None:
            if len(_specs) > 4096:
                _specs.clear()
                _specs_by_dtype.clear()
            spec = _specs[key] = LeafSpec(array.shape, _dtype_name(array.dtype))
            if type(value) is np.ndarray:
                _specs_by_dtype.setdefault(array.dtype, {})[array.shape] = spec
        return spec

    def describe_leaves(self, values: Sequence[object]) -> tuple[LeafSpec, ...]:
        """``tuple(map(self.describe, values))``, in one pass for a batch of one dtype.

        The runtime calls this (when a backend has it) to describe a collective's
        leaves; a batch of arrays of one dtype whose shapes were seen before costs a
        few C-level passes instead of one Python call per leaf (one, compiled: see
        :func:`batch_pass`).
        """
        cpass = self._cpass
        if cpass is not None:
            found = cpass.describe(values, _specs_by_dtype)
            if found is None:
                return self._describe_each(values)
            self._keep_layout(values, found[1], found[2])
            return found[0]
        m = len(values)
        if m and list(map(type, values)).count(np.ndarray) == m:
            dtypes = list(map(_dtype_of, values))
            dtype = dtypes[0]
            if dtypes.count(dtype) == m:
                by_shape = _specs_by_dtype.get(dtype)
                if by_shape is not None:
                    shapes = list(map(_shape_of, values))
                    shape = shapes[0]
                    specs: tuple[LeafSpec | None, ...]
                    if shapes.count(shape) == m:  # one shape: one lookup
                        spec = by_shape.get(shape)
                        specs = (spec,) * m
                        if spec is not None:
                            self._keep_layout(values, dtype, shape)
                            return specs  # type: ignore[return-value]
                    specs = tuple(map(by_shape.get, shapes))
                    if None not in specs:
                        self._keep_layout(values, dtype, shapes)
                        return specs  # type: ignore[return-value]
        return self._describe_each(values)

    def convert(self, value: object) -> object:
        """``value`` as a collective reads it, converted once; see :meth:`Backend.convert`.

        Numpy arrays (a subclass too: a change of its shape or dtype in flight is
        refused), numpy scalars, Python numbers and foreign arrays (JAX, PyTorch, ...)
        are read as they are. Anything else this backend holds (an object with only
        ``__array__``, a ``memoryview``, a ``bytearray``) is converted now, as
        :meth:`describe` converts it, and refused as it refuses it; ``IndexedSlices``
        come back as new ones whose parts are converted so. The collective then reads
        the converted array, never the value again.
        """
        if type(value) is np.ndarray or isinstance(value, _READ_AS_IS):
            return value
        if isinstance(value, IndexedSlices):
            # A new one every time (its parts decide, not its type: see Backend.convert).
            return IndexedSlices(
                self._converted(value.values, "IndexedSlices.values"),
                self._converted(value.indices, "IndexedSlices.indices"),
                value.dense_shape,
            )
        if library_of(value) is not None:
            return value
        return self._checked(value, "a collective's value")

    def _converted(self, part: object, what: str) -> object:
        """A part of ``IndexedSlices``, converted as :meth:`convert` converts a leaf."""
        if isinstance(part, _READ_AS_IS) or library_of(part) is not None:
            return part
        return self._checked(part, what)

    def _describe_each(self, values: Sequence[object]) -> tuple[LeafSpec, ...]:
        """Describe leaf by leaf (shapes not seen before); keep a plain batch's layout too.

        The layout is what the collective's signature says; the batch paths check the
        leaves against it when the last replica arrives (see :func:`_check_described`).
        """
        specs = tuple(map(self.describe, values))
        m = len(values)
        if m > 1 and list(map(type, values)).count(np.ndarray) == m:
            dtypes = list(map(_dtype_of, values))
            if dtypes.count(dtypes[0]) == m:
                shapes = list(map(_shape_of, values))
                one = shapes.count(shapes[0]) == m
                self._keep_layout(values, dtypes[0], shapes[0] if one else shapes)
        return specs

    def _keep_layout(
        self,
        values: Sequence[object],
        dtype: np.dtype[Any],
        shapes: tuple[int, ...] | list[tuple[int, ...]],
    ) -> None:
        """Keep what describe_leaves found of a batch for the collective that follows.

        Entries hold their leaves' list, so a list's id stays its own while its entry
        lives; every collective empties the store (see :meth:`_take_layouts`), and
        describes that no collective follows (a mismatch raised) are bounded.
        """
        layouts = self._layouts
        if len(layouts) >= self._max_layouts:
            layouts.clear()
        layouts[id(values)] = (values, dtype, shapes)

    def _take_layouts(self) -> dict[int, _Layout]:
        """The layouts kept so far, leaving the store empty: nothing outlives a collective."""
        layouts = self._layouts
        if layouts:
            self._layouts = {}
        return layouts

    def _describe_foreign(self, value: object, library: Library) -> LeafSpec:
        # Converted again by the collective (cheap, see to_host) rather than kept here:
        # a collective that fails after its leaves were described must not hold them.
        array = to_host(value, library)
        if not _holdable(array.dtype):
            raise TypeError(
                f"a collective's value must have a boolean or numeric dtype, got a "
                f"{library.name} of dtype {array.dtype}"
            )
        key = (array.shape, array.dtype, library.name)
        spec = _foreign_specs.get(key)
        if spec is None:
            if len(_foreign_specs) > 4096:
                _foreign_specs.clear()
            spec = _foreign_specs[key] = LeafSpec(
                array.shape, _dtype_name(array.dtype), array_type=library.name
            )
        return spec

    @staticmethod
    def _checked(value: object, what: str) -> Array:
        if type(value) is np.ndarray and _holdable(value.dtype):
            return value
        if value is None or isinstance(value, str | bytes):
            raise TypeError(_not_numeric(value, what))
        if _is_masked(value):
            raise TypeError(_masked(value, what))
        try:
            array = _as_array(value)
        except Exception as exc:
            raise TypeError(_not_numeric(value, what, exc)) from exc
        if not _holdable(array.dtype):
            raise TypeError(_not_numeric(value, what))
        return array

    @staticmethod
    def _reducible(array: Array) -> Array:
        if type(array) is not np.ndarray and _is_masked(array):
            raise TypeError(_masked(array, "a reduced value"))
        if not _reducible_dtype(array.dtype):
            if array.dtype == object and any(isinstance(v, IndexedSlices) for v in array.flat):
                raise _internal("a dense reduction was given IndexedSlices")
            raise TypeError(not_reducible_message(str(array.dtype)))
        return array

    async def all_reduce(
        self, op: ReduceOp, values: Leaves, *, bytes_per_pack: int = 0
    ) -> list[list[object]]:
        """Combine each leaf across replicas; see :meth:`Backend.all_reduce`.

        Small dense leaves of one dtype are packed (TensorFlow's ``group_by_size`` rule,
        see :func:`group_by_size`): each replica's leaves of a pack are concatenated
        into one flat buffer, the buffers are combined once in replica order, and each
        leaf's result is a read-only view of its slice. Reductions are element-wise,
        so the results are bitwise identical for every ``bytes_per_pack``.
        """
        n = len(values)
        first_values = values[0]
        m = len(first_values)
        layouts = self._take_layouts()
        # numpy first: foreign leaves (JAX, ...) are looked for only off the fast paths.
        if m == 1:
            first = first_values[0]
            if type(first) is np.ndarray:
                return [[view] for view in await self._reduce_leaf(op, [v[0] for v in values])]
            library = library_of(first)
            if library is None:
                return [[view] for view in await self._reduce_leaf(op, [v[0] for v in values])]
            if takes_ownership(library) and not isinstance(first, IndexedSlices):
                owned = await self._reduce_owned(op, [to_host(v[0], library) for v in values])
                return [[x] for x in from_host_owned(owned, n, library)]
        elif type(first_values[0]) is np.ndarray and self._cpass is not None:
            batch = _reduce_batch_c(
                self._cpass, op, values, bytes_per_pack, self._cscratch, layouts
            )
            if self._cscratch[0].nbytes > _SCRATCH_KEEP_BYTES:
                self._cscratch[0] = np.empty(0, np.uint8)  # a large batch's scratch is not kept
            if batch is not None:
                return batch
        elif type(first_values[0]) is np.ndarray:
            batch = _reduce_batch(op, values, bytes_per_pack, self._scratch, layouts)
            if self._scratch.seek(0, io.SEEK_END) > _SCRATCH_KEEP_BYTES:
                self._scratch = io.BytesIO()  # a large batch's scratch is not kept
            if batch is not None:
                return batch
        if m > 1 and layouts:
            _check_described(values, layouts)
        host, libraries = _host_values(values)
        if libraries is not None:
            return restore_host(
                await self.all_reduce(op, host, bytes_per_pack=bytes_per_pack), libraries, values
            )
        out: list[list[object]] = [[None] * m for _ in range(n)]
        # Packable leaves per dtype: (leaf index, shape, element count).
        groups: dict[np.dtype[Any], list[tuple[int, tuple[int, ...], int]]] = {}
        ndarray = np.ndarray
        for j in range(m):
            first = first_values[j]
            if type(first) is ndarray or not isinstance(first, IndexedSlices):
                if any(isinstance(v[j], IndexedSlices) for v in values):
                    raise _internal(
                        "one leaf is IndexedSlices on some replicas and dense on others"
                    )
                array = first if type(first) is ndarray else _as_array(first)
                if not _reducible_dtype(array.dtype):
                    self._reducible(array)
                if array.nbytes < POOL_BYTES:
                    # The ledger checked that every replica's leaf j has this dtype and shape.
                    groups.setdefault(array.dtype, []).append((j, array.shape, array.size))
                    continue
            views = await self._reduce_leaf(op, [v[j] for v in values])
            for r in range(n):
                out[r][j] = views[r]
        for dtype, leaves in groups.items():
            # As TensorFlow: the last leaves go first into packs (results are the same).
            leaves.reverse()
            for pack in group_by_size(
                leaves, [size * dtype.itemsize for _, _, size in leaves], bytes_per_pack
            ):
                if len(pack) == 1:
                    j = pack[0][0]
                    views = await self._reduce_leaf(op, [v[j] for v in values])
                    for r in range(n):
                        out[r][j] = views[r]
                else:
                    self._reduce_pack(op, values, dtype, pack, out)
        return out

    async def _reduce_leaf(self, op: ReduceOp, leaf: Sequence[object]) -> Sequence[object]:
        """Every replica's view of one leaf combined across replicas."""
        n = len(leaf)
        first = leaf[0]
        arrays: Sequence[Array]
        if type(first) is np.ndarray and list(map(type, leaf)).count(np.ndarray) == n:
            # Arrays of one dtype kind (the ledger compared dtypes): one check for all.
            self._reducible(first)
            arrays = leaf  # type: ignore[assignment]
        elif isinstance(first, IndexedSlices):
            return self._reduce_slices(op, leaf)
        else:
            if any(isinstance(v, IndexedSlices) for v in leaf):
                raise _internal("one leaf is IndexedSlices on some replicas and dense on others")
            arrays = [self._reducible(_as_array(v)) for v in leaf]
        if arrays[0].nbytes >= POOL_BYTES:
            return _shared(await self._combine_large(op, arrays), n)
        return _shared(_combine(op, arrays), n)

    async def _reduce_owned(self, op: ReduceOp, arrays: Sequence[Array]) -> Array:
        """One leaf combined across replicas into a new, writable buffer, never pooled.

        For libraries that take the result over (JAX, see ``from_host_owned``): a large
        result is summed as :meth:`_combine_large` sums it, into a ``_ALIGN``-aligned
        buffer that the library imports zero-copy; a small one is :func:`_combine`'s.
        """
        arrays = [self._reducible(a) for a in arrays]
        first = arrays[0]
        if first.nbytes >= POOL_BYTES:
            return await self._combine_large(
                op, arrays, out=aligned_empty(first.shape, _native(first.dtype))
            )
        return _combine(op, arrays)

    @staticmethod
    def _reduce_pack(
        op: ReduceOp,
        values: Leaves,
        dtype: np.dtype[Any],
        pack: Sequence[tuple[int, tuple[int, ...], int]],
        out: list[list[object]],
    ) -> None:
        """Combine one pack of leaves of ``dtype`` in one pass; write views into ``out``.

        Replica ``r``'s leaves are concatenated into one flat buffer; the buffers are
        combined in replica order exactly as :func:`_combine` combines one leaf, so
        every element sees the same operations in the same order.
        """
        n = len(values)
        dtype = _native(dtype)  # the result's dtype is the rule's, by name
        total = sum(size for _, _, size in pack)
        indices = [j for j, _, _ in pack]
        pick = operator.itemgetter(*indices)  # a pack holds two leaves or more
        if op is ReduceOp.MEAN and dtype.kind in "iu":
            # Never summed in the input dtype, which can overflow: see _mean_of_ints.
            flat = _mean_of_ints([np.concatenate(pick(v), axis=None, dtype=dtype) for v in values])
        else:
            flat = np.concatenate(pick(values[0]), axis=None, dtype=dtype)
            if n > 1:
                ufunc = _binary(op, dtype)
                scratch = np.empty(total, dtype)
                for r in range(1, n):
                    np.concatenate(pick(values[r]), axis=None, out=scratch)
                    ufunc(flat, scratch, out=flat)
            if op is ReduceOp.MEAN:
                flat = _divide(flat, n)
        flat = _frozen(flat)
        slices = []
        shaped = False
        offset = 0
        for _, shape, size in pack:
            slices.append(slice(offset, offset + size))
            offset += size
            shaped = shaped or len(shape) != 1
        if not shaped and len(pack) == len(out[0]) and indices[0] == len(indices) - 1:
            # Every leaf is 1-d and in this one pack (in reverse order): each replica's
            # views in one C-level pass over its own view of the buffer.
            slices.reverse()
            for r in range(n):
                out[r] = list(map(flat.view().__getitem__, slices))
            return
        for (j, shape, _), where in zip(pack, slices, strict=True):
            base = flat[where]
            if len(shape) != 1:
                base = base.reshape(shape)
            out[0][j] = base
            for r in range(1, n):
                out[r][j] = base.view()

    async def _buffer(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> Array:
        """An output buffer: a pooled one no replica still views, or a new one.

        When every pooled buffer of the shape is still viewed and the buffer is of
        :data:`OFFLOAD_BYTES` or more, the loop gets one turn first: the replica
        dispatching this collective was usually woken by a callback that still holds
        its previous result (an asyncio handle holds the future it completed until the
        loop's next turn), and that one view would otherwise make a training loop
        alternate between two buffers, keeping twice the memory. Smaller buffers
        alternate: two of them stay in cache, and a turn of the loop costs more.
        """
        pooled = self._pool.setdefault((shape, dtype.str), [])
        wait = dtype.itemsize * math.prod(shape) >= OFFLOAD_BYTES
        for attempt in range(2):
            for buf in pooled:
                # The pool's list, this loop and getrefcount's argument: nobody else (a
                # result holds it through its _frozen base; buf itself stays writable).
                if sys.getrefcount(buf) == 3:
                    return buf
            if wait and not attempt and pooled:
                # Not a cancellation point: the dispatch must finish once it started.
                await anyio.lowlevel.cancel_shielded_checkpoint()
        buf = np.empty(shape, dtype)
        if len(pooled) < _POOL_PER_SHAPE:
            pooled.append(buf)
        return buf

    async def _combine_large(
        self, op: ReduceOp, arrays: Sequence[Array], out: Array | None = None
    ) -> Array:
        """:func:`_combine` for large leaves: pooled output, worker threads, blocks.

        ``out``, when given, is written instead of a pooled buffer (C-contiguous, of
        the leaves' shape and dtype); unless :func:`_combine` runs, which allocates.
        """
        first = arrays[0]
        if not all(a.flags.c_contiguous for a in arrays) or (
            op is ReduceOp.MEAN and first.dtype.kind not in "fc"
        ):
            return _combine(op, arrays)
        if out is None:
            out = await self._buffer(first.shape, _native(first.dtype))
        flat_in = [a.reshape(-1) for a in arrays]
        flat_out = out.reshape(-1)
        ufunc = _binary(op, first.dtype)
        n = len(arrays)

        def work() -> None:
            size = flat_out.size
            workers = WORKERS if first.nbytes >= OFFLOAD_BYTES else 1
            bounds = [size * w // workers for w in range(workers + 1)]
            if workers > 1:
                if self._threads is None:
                    self._threads = ThreadPoolExecutor(WORKERS - 1, "asyncreplica-numpy")
                futures = [
                    self._threads.submit(
                        _blocked, ufunc, flat_in, flat_out, bounds[w], bounds[w + 1]
                    )
                    for w in range(1, workers)
                ]
                _blocked(ufunc, flat_in, flat_out, bounds[0], bounds[1])
                for f in futures:
                    f.result()
            else:
                _blocked(ufunc, flat_in, flat_out, 0, size)
            if op is ReduceOp.MEAN:
                _divide(flat_out, n)

        if first.nbytes >= OFFLOAD_BYTES:
            # Off the event loop, so other coroutines keep running meanwhile.
            await _off_loop(work)
        else:
            work()
        return out

    async def aclose(self) -> None:
        """Stop the worker threads and drop pooled buffers."""
        if self._threads is not None:
            self._threads.shutdown(wait=False)
            self._threads = None
        self._pool.clear()
        self._scratch = io.BytesIO()
        self._cscratch[0] = np.empty(0, np.uint8)
        self._layouts.clear()

    def _reduce_slices(self, op: ReduceOp, slices: Sequence[object]) -> list[IndexedSlices]:
        values, indices, dense_shape = _concat_slices(op, slices)
        n = len(slices)
        return [
            IndexedSlices(v, i, dense_shape)
            for v, i in zip(_shared(values, n), _shared(indices, n), strict=True)
        ]

    async def all_gather(self, values: Leaves, axis: int) -> list[list[object]]:
        """Concatenate each leaf along ``axis``; see :meth:`Backend.all_gather`.

        Outputs of :data:`POOL_BYTES` and more come from the pool (a fresh large
        buffer costs its page faults on every call), and when a replica's value has
        :data:`OFFLOAD_BYTES` or more the copy runs off the event loop.
        """
        self._take_layouts()  # for all_reduce only: nothing outlives a collective
        host, libraries = _host_values(values)
        if libraries is not None:
            return restore_host(await self.all_gather(host, axis), libraries, values)
        n = len(values)
        out: list[list[object]] = [[] for _ in range(n)]
        for j in range(len(values[0])):
            joined = await self._gather_leaf([_as_array(v[j]) for v in values], axis)
            for r, view in enumerate(_shared(joined, n)):
                out[r].append(view)
        return out

    async def _gather_leaf(self, arrays: list[Array], axis: int) -> Array:
        nbytes = sum(a.nbytes for a in arrays)
        if nbytes < POOL_BYTES:
            return np.concatenate(arrays, axis=axis)
        first = arrays[0]
        shape = list(first.shape)
        shape[axis] = sum(a.shape[axis] for a in arrays)
        buf = await self._buffer(tuple(shape), np.result_type(*arrays))
        if max(a.nbytes for a in arrays) >= OFFLOAD_BYTES:
            # By the size of one replica's value, as all_reduce decides by a leaf's:
            # handing over to a thread costs a few hundred µs on a small machine.
            # Off the event loop, so other coroutines keep running meanwhile.
            await _off_loop(lambda: np.concatenate(arrays, axis=axis, out=buf))
        else:
            np.concatenate(arrays, axis=axis, out=buf)
        return buf

    async def reduce_scatter(self, op: ReduceOp, values: Leaves, axis: int) -> list[list[object]]:
        """Reduce each leaf, then scatter equal chunks; see :meth:`Backend.reduce_scatter`."""
        self._take_layouts()  # for all_reduce only: nothing outlives a collective
        host, libraries = _host_values(values)
        if libraries is not None:
            return restore_host(await self.reduce_scatter(op, host, axis), libraries, values)
        n = len(values)
        out: list[list[object]] = [[] for _ in range(n)]
        for j in range(len(values[0])):
            arrays = [self._reducible(_as_array(v[j])) for v in values]
            if arrays[0].nbytes >= POOL_BYTES:
                # Pooled output, summed in cache-sized blocks (and threads), as all_reduce.
                reduced = await self._combine_large(op, arrays)
            else:
                reduced = _combine(op, arrays)
            reduced = _frozen(reduced)
            # The chunks np.split(reduced, n, axis) gives, as plain slices (np.split's
            # Python-level loop costs more than a pooled 1 MiB sum's blocks).
            size = reduced.shape[axis] // n
            lead = (slice(None),) * axis
            for r in range(n):
                out[r].append(reduced[(*lead, slice(r * size, (r + 1) * size))])
        return out

    async def broadcast(self, values: Sequence[object], num_replicas: int) -> list[list[object]]:
        """Copy the source's leaves once; see :meth:`Backend.broadcast`.

        Leaves of :data:`POOL_BYTES` and more are copied into a pooled buffer (reused
        once no replica holds a view of it), as all_reduce outputs are.
        """
        self._take_layouts()  # for all_reduce only: nothing outlives a collective
        host, libraries = _host_values([values])
        if libraries is not None:
            return restore_host(
                await self.broadcast(host[0], num_replicas), libraries, [values] * num_replicas
            )
        copies = []
        for v in values:
            array = _as_array(v)
            native = _native(array.dtype)  # every result in native order (_core._dtypes)
            if array.nbytes >= POOL_BYTES:
                copy = await self._buffer(array.shape, native)
                np.copyto(copy, array)
            else:
                copy = np.array(array, dtype=native, copy=True)
            copies.append(_shared(copy, num_replicas))
        return [[views[r] for views in copies] for r in range(num_replicas)]

    async def reduce(
        self, op: ReduceOp, components: Sequence[object], axis: tuple[int, ...] | None
    ) -> object:
        """Reduce to one writable result; see :meth:`Backend.reduce`.

        The result is in the array type, and on the device, of the first component.
        """
        if type(components[0]) is not np.ndarray:
            host, library = _host_components(components)
            if library is not None:
                result = from_host_shared([await self._reduce(op, host, axis)], library)
                return place_like(result, components[:1])[0]
        return await self._reduce(op, components, axis)

    async def _reduce(
        self, op: ReduceOp, components: Sequence[object], axis: tuple[int, ...] | None
    ) -> Any:
        """The one cross-replica reduce: ``all_reduce``'s combine, each value reduced first.

        ``axis=None`` is :func:`_combine`, the rule every all_reduce path follows (the
        MEAN of integers exact, in the MEAN's dtype). Otherwise each value is reduced
        along ``axis`` in its own dtype first (:func:`_local`), then combined; MEAN
        divides the global sum by the global element count.
        """
        if isinstance(components[0], IndexedSlices):
            if axis is not None:
                raise ValueError(
                    "Strategy.reduce of IndexedSlices combines the replicas' slices; it "
                    f"cannot also reduce along axis={axis}: densify them first"
                )
            values, indices, dense_shape = _concat_slices(op, components)
            return IndexedSlices(values, indices, dense_shape)
        if any(isinstance(c, IndexedSlices) for c in components):
            raise _internal("one leaf is IndexedSlices on some replicas and dense on others")
        if all(type(c) in (int, float, complex) for c in components):
            # Python numbers reduce in TensorFlow's dtypes (2.5 is float32) to a scalar.
            numbers = [np.asarray(c, np.dtype(number_dtype(c))) for c in components]  # type: ignore[arg-type]
            if len({a.dtype for a in numbers}) > 1:
                numbers = [a.astype(np.result_type(*numbers)) for a in numbers]
            return (await self._reduce(op, numbers, axis))[()]
        arrays = [self._reducible(_as_array(c)) for c in components]
        if axis is None:
            return _combine(op, arrays)
        if op is ReduceOp.MEAN:
            if arrays[0].dtype.kind in "iu":
                return _mean_of_ints(arrays, axis)
            total = _combine(ReduceOp.SUM, [_local(ReduceOp.SUM, a, axis) for a in arrays])
            count = sum(math.prod(a.shape[k] for k in axis) for a in arrays)
            with np.errstate(invalid="ignore", divide="ignore"):  # no elements: nan, as TF
                return _divide(total, count)
        return _combine(op, [_local(op, a, axis) for a in arrays])

    async def gather(self, components: Sequence[object], axis: int) -> object:
        """Concatenate components into one new array; see :meth:`Backend.gather`.

        The result is in the array type, and on the device, of the first component.
        ``IndexedSlices`` components are densified first, as in TensorFlow.
        """
        if any(isinstance(c, IndexedSlices) for c in components):
            if not all(isinstance(c, IndexedSlices) for c in components):
                raise _internal("one leaf is IndexedSlices on some replicas and dense on others")
            components = [_densify(cast(IndexedSlices, c)) for c in components]
        if type(components[0]) is not np.ndarray:
            host, library = _host_components(components)
            if library is not None:
                result = from_host_shared(
                    [np.concatenate([_as_array(c) for c in host], axis=axis)], library
                )
                return place_like(result, components[:1])[0]
        return np.concatenate([_as_array(c) for c in components], axis=axis)


def _check_slices(values: Array, indices: Array, dense_shape: tuple[int, ...]) -> None:
    """Raise in the replica that built them when ``IndexedSlices`` do not fit together.

    Otherwise numpy's error would come from concatenating every replica's slices, in
    whichever replica dispatched the collective.
    """
    if indices.dtype.kind not in "iu":
        raise TypeError(
            f"IndexedSlices.indices must be integers (row numbers of the dense value), got "
            f"{indices.dtype} {value_text(indices, 60)}: pass np.asarray(indices, dtype=np.int64)"
        )
    if indices.ndim != 1:
        raise ValueError(
            f"IndexedSlices.indices must be one row number per row, shape (n,), got shape "
            f"{indices.shape}"
        )
    if not dense_shape or values.shape[1:] != dense_shape[1:] or values.ndim != len(dense_shape):
        raise ValueError(
            f"IndexedSlices.values has shape {values.shape}, but dense_shape {dense_shape} "
            f"needs values of shape (n, {', '.join(map(str, dense_shape[1:]))}): each row is "
            "one row of the dense value"
        )
    if values.shape[0] != indices.shape[0]:
        raise ValueError(
            f"IndexedSlices has {values.shape[0]} rows of values but {indices.shape[0]} "
            "indices: give one row number per row"
        )
    if indices.shape[0]:
        # Row numbers of the dense value: a negative one would be read from the end by a
        # later densify, one past dense_shape[0] fails there, and one above int64 would
        # wrap when replicas' index dtypes differ (they are combined as int64).
        low, high = int(indices.min()), int(indices.max())
        rows = min(dense_shape[0], INDEX_LIMIT)
        if low < 0 or high >= rows:
            bad = low if low < 0 else high
            limit = (
                f"{dense_shape[0]} (dense_shape {dense_shape})"
                if rows == dense_shape[0]
                else f"2**63 (int64, the dtype replicas' indices are combined in; "
                f"dense_shape {dense_shape})"
            )
            raise ValueError(
                f"IndexedSlices.indices must be row numbers of the dense value, 0 <= i < "
                f"{limit}, got {bad}: every index must name a row of the dense value (a "
                "negative index is not read from the end)"
            )


def _masked(value: object, what: str) -> str:
    return (
        f"{what} is a numpy masked array ({type(value).__name__}): collectives do not "
        "carry masks, and reducing its data would count the masked-out elements. Pass "
        "np.ma.filled(x, fill) with the fill value the reduction should see (0 for SUM), "
        "or the data and the mask as two values (np.ma.getdata(x), np.ma.getmaskarray(x))"
    )


def _not_numeric(value: object, what: str, error: Exception | None = None) -> str:
    """``error``: what converting ``value`` to an array raised (the user's own error, told)."""
    why = ""
    if error is not None:
        try:
            told = f"{type(error).__name__}: {error}"
        except Exception:
            told = type(error).__name__
        why = f" (converting it to an array raised {told})"
    return (
        f"{what} must be a number, a numpy array, a CPU array of a library that implements "
        "the array API standard or DLPack (JAX, PyTorch, array_api_strict, ...) or a nest "
        f"(list, tuple, dict) of them, got {type(value).__name__} {value_text(value, 60)}{why}"
    )
