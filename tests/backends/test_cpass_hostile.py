"""The C pass (``asyncreplica_numpy._cpass``) called directly, with hostile arguments.

Anyone can import the extension and call it, so each function must check its arguments as
if the caller were hostile: it returns its documented result or raises ``TypeError``,
``ValueError``, ``OverflowError`` or ``MemoryError``, and never reads or writes memory it
was not given, whatever it is passed. The named attacks below each crashed the process or
broke a promise before the checks existed; the generated calls (hypothesis, derandomized)
try the rest. ``scripts/sanitize_cpass.sh`` runs this module against a build of the
extension with AddressSanitizer and UndefinedBehaviorSanitizer, which turns an invalid
read, an overflowing offset or a NULL pointer passed to ``memcmp`` (0-d arrays) into a
failure even where the normal build happens to survive it.

Results of the numpy backend must not be made writable by anyone, through either pass:
those tests run whether the extension was built or not.
"""

from __future__ import annotations

import copy
import gc
import pathlib
import pickle
import sys
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import anyio
import numpy as np
import pytest
from asyncreplica_numpy import NumpyBackend, _backend
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from asyncreplica import IndexedSlices, _compiled
from asyncreplica.abc import LeafSpec, ReduceOp

MODULE = "asyncreplica_numpy._cpass"
SOURCE = pathlib.Path(_backend.__file__).with_name("_cpass.c")


def _load_cpass() -> ModuleType | None:
    """The extension when it was built; a build that says so but cannot import fails."""
    try:
        from asyncreplica_numpy import _cpass
    except ImportError as error:
        if _compiled.c_extension_reason(MODULE, SOURCE) is None:
            raise AssertionError(
                f"the build compiled {MODULE} but it cannot be imported"
            ) from error
        return None
    return _cpass


cpass = _load_cpass()
needs_cpass = pytest.mark.skipif(cpass is None, reason="the C pass was not compiled by this build")

FUZZ = settings(
    max_examples=150,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
# hypothesis's draw function (data.draw).
Draw = Callable[..., Any]
# What a function may raise for arguments it refuses.
REFUSALS = (TypeError, ValueError, OverflowError, MemoryError)


def _address(array: np.ndarray) -> int:
    return int(array.__array_interface__["data"][0])


def _base_chain(array: np.ndarray) -> Iterator[object]:
    base: object = array
    while isinstance(base, np.ndarray):
        yield base
        base = base.base
    yield base


def _assert_never_writable(result: np.ndarray) -> None:
    """Neither ``result`` nor anything in its base chain can be made writable."""
    assert not result.flags.writeable
    chain = list(_base_chain(result))
    for link in chain:
        if isinstance(link, np.ndarray):
            with pytest.raises(ValueError, match="WRITEABLE"):
                link.setflags(write=True)
    for link in chain:  # the attack, in its order: the base first, then the view
        if isinstance(link, np.ndarray):
            with pytest.raises(ValueError, match="WRITEABLE"):
                link.flags.writeable = True
    owner = chain[-1]
    assert not isinstance(owner, np.ndarray | bytearray | memoryview)
    try:
        exported = memoryview(owner)  # type: ignore[arg-type]
    except TypeError:
        pass
    else:
        assert exported.readonly


# ---- Results that no one can make writable (either pass) -------------------------------


def _frozen_implementations() -> list[Any]:
    python = pytest.param(lambda a: np.asarray(_backend._ReadOnly(a)), id="python")
    c = pytest.param(lambda a: cpass.freeze(a), id="c", marks=needs_cpass)  # type: ignore[union-attr]
    return [python, c]


@pytest.mark.parametrize("freeze", _frozen_implementations())
@pytest.mark.parametrize(
    "array",
    [
        np.arange(12.0),
        np.arange(12.0).reshape(3, 4)[:, ::2],
        np.array(3.5),
        np.zeros(0, np.int8),
        np.arange(6, dtype=">i4"),
        np.array([True, False]),
        np.arange(4, dtype=np.complex64).reshape(2, 2).T,
    ],
    ids=["1-d", "strided", "0-d", "empty", "big-endian", "bool", "transposed"],
)
def test_a_frozen_array_is_the_same_memory_and_can_never_be_made_writable(
    freeze: Callable[[np.ndarray], np.ndarray], array: np.ndarray
) -> None:
    frozen = freeze(array)
    assert type(frozen) is np.ndarray
    assert (frozen.shape, frozen.dtype) == (array.shape, array.dtype)
    assert frozen.strides == array.strides or not array.size
    assert _address(frozen) == _address(array)
    assert frozen.tobytes() == array.tobytes()
    _assert_never_writable(frozen)
    _assert_never_writable(frozen.view())
    if frozen.ndim:
        _assert_never_writable(frozen[::-1])
    assert array.flags.writeable  # the backend's own array stays writable, and private


@needs_cpass
def test_the_owner_of_results_exposes_nothing_and_cannot_be_made_or_copied() -> None:
    assert cpass is not None
    owner = cpass.freeze(np.arange(3.0)).base
    assert type(owner).__name__ == "_Owner"
    assert gc.get_referents(owner) == []
    assert not [name for name in dir(owner) if not name.startswith("__")]
    for attempt in (
        lambda: type(owner)(),
        lambda: copy.copy(owner),
        lambda: pickle.dumps(owner),
        lambda: memoryview(owner),
    ):
        with pytest.raises(TypeError):
            attempt()


class _Subclass(np.ndarray):
    """An ndarray subclass that np.concatenate keeps (as np.matrix, which warns): its
    all_gather results keep their type, as views of a frozen array."""

    __array_priority__ = 15.0


def _results_of_every_path(backend: NumpyBackend) -> dict[str, list[np.ndarray]]:
    """One result per replica of each way the backend makes results, for 3 replicas."""
    rng = np.random.default_rng(0)
    leaf = [rng.standard_normal(5) for _ in range(3)]
    batch = [[rng.standard_normal(4).astype(np.float32) for _ in range(6)] for _ in range(3)]
    mixed = [[rng.standard_normal(s) for s in [(2, 2), (3,), ()]] for _ in range(3)]
    ints = [[np.arange(4, dtype=np.int16) + r for _ in range(3)] for r in range(3)]
    slices = [IndexedSlices(np.ones((1, 2)), np.array([r]), (3, 2)) for r in range(3)]

    async def main() -> dict[str, list[list[object]]]:
        return {
            "one leaf": await backend.all_reduce(ReduceOp.SUM, [[x] for x in leaf]),
            "batch": await backend.all_reduce(ReduceOp.SUM, batch),
            "batch in packs": await backend.all_reduce(ReduceOp.MAX, batch, bytes_per_pack=40),
            "batch of shapes": await backend.all_reduce(ReduceOp.PROD, mixed),
            "integer MEAN": await backend.all_reduce(ReduceOp.MEAN, ints),
            "IndexedSlices": await backend.all_reduce(ReduceOp.SUM, [[s] for s in slices]),
            "all_gather": await backend.all_gather([[x] for x in leaf], 0),
            "all_gather of a subclass": await backend.all_gather(
                [[x.view(_Subclass)] for x in leaf], 0
            ),
            "broadcast": await backend.broadcast([leaf[0]], 3),
            "reduce_scatter": await backend.reduce_scatter(
                ReduceOp.SUM, [[np.arange(6.0)] for _ in range(3)], 0
            ),
        }

    out: dict[str, list[np.ndarray]] = {}
    for name, rows in anyio.run(main).items():
        arrays: list[np.ndarray] = []
        for row in rows:
            for value in row:
                if isinstance(value, IndexedSlices):
                    arrays += [value.values, value.indices]  # type: ignore[list-item]
                else:
                    assert isinstance(value, np.ndarray)
                    arrays.append(value)
        out[name] = arrays
    return out


@pytest.mark.parametrize(
    "pass_",
    ["python", pytest.param("c", marks=needs_cpass)],
)
def test_no_result_of_the_backend_can_be_made_writable(
    pass_: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``v.base.setflags(write=True); v.setflags(write=True)`` let one replica write into
    every replica's result (the base owned its data); now every result refuses."""
    monkeypatch.setattr(_backend, "_CPASS", cpass if pass_ == "c" else None)
    backend = NumpyBackend(["CPU:0", "CPU:1", "CPU:2"])
    backend._cpass = cpass if pass_ == "c" else None
    for name, results in _results_of_every_path(backend).items():
        # Subclass inputs are combined as plain views (their __array_finalize__ never sees
        # a writable array of the result): the results are plain read-only arrays.
        assert all(type(r) is np.ndarray for r in results)
        before = [r.copy() for r in results]
        for result in results:
            try:
                _assert_never_writable(result)
            except AssertionError as error:
                raise AssertionError(f"{name}: {error}") from error
        for result, copied in zip(results, before, strict=True):
            np.testing.assert_array_equal(result, copied)


# ---- views -------------------------------------------------------------------------------


@needs_cpass
@pytest.mark.parametrize(
    ("shapes", "lo", "hi"),
    [
        ([(2**59,), (2**59,)], 0, 2),  # 4 EiB each: their offsets' sum overflowed, unchecked
        ((2**59,), 0, 2),  # the same with one shape for every leaf
        ((2**62,), 0, 1),  # a size in bytes that overflows
        ((2**32, 2**32), 0, 1),  # a product of dimensions that overflows
        ((2**63 - 1,), 0, 1),
        ((2**64,), 0, 1),  # not an npy_intp at all
        ((1,), 0, 2**62),  # more leaves than fit
        ([(1,)] * 5, 0, 5),
        ((-1,), 0, 1),
        ([(2,), (-3,)], 0, 2),
    ],
)
def test_views_refuses_shapes_that_do_not_fit_even_when_their_sums_overflow(
    shapes: Any, lo: int, hi: int
) -> None:
    assert cpass is not None
    flat = np.zeros(4)
    with pytest.raises(ValueError, match="do not fit"):
        cpass.views(flat, 1, shapes, lo, hi)


@needs_cpass
@pytest.mark.parametrize(
    ("args", "error"),
    [
        ((np.zeros(4).view(np.ma.MaskedArray), 1, (2,), 0, 1), TypeError),
        ((np.zeros(4, object), 1, (2,), 0, 1), TypeError),
        ((np.zeros(4, "U1"), 1, (2,), 0, 1), TypeError),
        ((np.zeros(4, [("a", "f4")]), 1, (2,), 0, 1), TypeError),
        ((np.zeros((2, 2)), 1, (2,), 0, 1), ValueError),
        ((np.zeros(8)[::2], 1, (2,), 0, 1), ValueError),
        ((np.zeros(9, np.uint8)[1:].view(np.float64), 1, (1,), 0, 1), ValueError),  # unaligned
        ((np.zeros(4), -1, (2,), 0, 1), ValueError),
        ((np.zeros(4), 1, (2,), -1, 1), ValueError),
        ((np.zeros(4), 1, (2,), 1, 0), ValueError),
        ((np.zeros(4), 1, [(2,)], 0, 2), ValueError),  # fewer shapes than leaves
        ((np.zeros(4), 1, {(2,)}, 0, 1), TypeError),
        ((np.zeros(4), 1, [[2]], 0, 1), TypeError),
        ((np.zeros(4), 1, (2.0,), 0, 1), TypeError),
        ((np.zeros(4), 1, (np.int64(2),), 0, 1), TypeError),  # no __index__ is called
        ((np.zeros(4), 1, (True,), 0, 1), TypeError),
        ((np.zeros(4), 2**62, (2,), 0, 1), MemoryError),
    ],
)
def test_views_refuses_hostile_arguments(args: tuple[Any, ...], error: type) -> None:
    assert cpass is not None
    with pytest.raises(error):
        cpass.views(*args)


@needs_cpass
def test_views_of_0d_and_empty_leaves_are_read_only_and_in_bounds() -> None:
    assert cpass is not None
    flat = np.arange(3, dtype=np.int32)
    rows = cpass.views(flat, 2, [(), (0,), (), (1, 0), (1,)], 0, 5)
    assert [[v.shape for v in row] for row in rows] == [[(), (0,), (), (1, 0), (1,)]] * 2
    assert [v.tolist() for v in rows[1]] == [0, [], 1, [[]], [2]]
    for row in rows:
        for view in row:
            _assert_never_writable(view)


# ---- pack --------------------------------------------------------------------------------


@needs_cpass
def test_pack_refuses_an_object_out_where_it_wrote_raw_bytes_over_references() -> None:
    assert cpass is not None
    out = np.empty(2, object)
    with pytest.raises(TypeError, match="dtype"):
        cpass.pack([np.zeros(2)], 0, 1, np.dtype(np.float64), (2,), out)
    with pytest.raises(TypeError, match="dtype"):
        cpass.pack([np.empty(2, object)], 0, 1, np.dtype(object), (2,), out)
    assert out.tolist() == [None, None]


@needs_cpass
@pytest.mark.parametrize(
    ("leaf", "out"),
    [
        (slice(0, 4), slice(2, 6)),  # out starts inside the leaf
        (slice(2, 6), slice(0, 4)),  # the leaf starts inside out
        (slice(0, 8), slice(0, 8)),  # the same memory
        (slice(3, 4), slice(0, 8)),
    ],
)
def test_pack_refuses_an_out_that_shares_memory_with_a_leaf(leaf: slice, out: slice) -> None:
    assert cpass is not None
    buffer = np.arange(8.0)
    source = buffer[leaf]
    with pytest.raises(ValueError, match="shares memory"):
        cpass.pack([source], 0, 1, buffer.dtype, source.shape, buffer[out])
    np.testing.assert_array_equal(buffer, np.arange(8.0))


@needs_cpass
@pytest.mark.parametrize(
    ("args", "error"),
    [
        (([np.zeros(2)], 0, 1, np.dtype("f8"), (2,), np.zeros(2, "f4")), TypeError),
        (([np.zeros(2)], 0, 1, np.dtype("f8"), (2,), np.zeros(2, ">f8")), TypeError),
        (
            ([np.zeros(2)], 0, 1, np.dtype("f8"), (2,), np.zeros(2).view(np.ma.MaskedArray)),
            TypeError,
        ),
        (([np.zeros(2)], 0, 1, np.dtype("f8"), (2,), [0.0, 0.0]), TypeError),
        (([np.zeros(2)], 0, 1, np.dtype("f8"), (2,), np.zeros(4)[::2]), ValueError),
        (([np.zeros(4)], 0, 1, np.dtype("f8"), (4,), np.zeros((2, 2)).T), ValueError),
        (([np.zeros(2)], 0, 1, np.dtype("U1"), (2,), np.zeros(2, "U1")), TypeError),
        (
            ([np.zeros(2)], 0, 1, np.dtype([("a", "f8")]), (2,), np.zeros(2, [("a", "f8")])),
            TypeError,
        ),
        (([np.zeros(2)], 0, 1, "f8", (2,), np.zeros(2)), TypeError),
        (([np.zeros(2)], -1, 1, np.dtype("f8"), (2,), np.zeros(2)), ValueError),
        (([np.zeros(2)], 0, 2, np.dtype("f8"), (2,), np.zeros(2)), ValueError),
        (([np.zeros(2)], 1, 0, np.dtype("f8"), (2,), np.zeros(2)), ValueError),
        (([np.zeros(2)], 0, 1, np.dtype("f8"), [(2,), (2,)], np.zeros(2)), ValueError),
        (([np.zeros(2)], 0, 1, np.dtype("f8"), {(2,)}, np.zeros(2)), TypeError),
        (([np.zeros(2)], 0, 1, np.dtype("f8"), (np.int64(2),), np.zeros(2)), TypeError),
        (([np.zeros(2)], 0, 1, np.dtype("f8"), [[2]], np.zeros(2)), TypeError),
        ((3, 0, 1, np.dtype("f8"), (2,), np.zeros(2)), TypeError),
        (([np.zeros(2)], 2**64, 1, np.dtype("f8"), (2,), np.zeros(2)), OverflowError),
    ],
)
def test_pack_refuses_hostile_arguments(args: tuple[Any, ...], error: type) -> None:
    assert cpass is not None
    with pytest.raises(error):
        cpass.pack(*args)


@needs_cpass
def test_pack_of_a_read_only_out_refuses() -> None:
    assert cpass is not None
    out = np.zeros(2)
    out.flags.writeable = False
    with pytest.raises(ValueError, match="writable"):
        cpass.pack([np.ones(2)], 0, 1, out.dtype, (2,), out)
    assert not out.any()


@needs_cpass
def test_pack_and_describe_of_0d_leaves() -> None:
    """0-d arrays' dimensions may be a NULL pointer, once passed to memcmp (undefined
    behaviour: only the sanitizer build shows it)."""
    assert cpass is not None
    dtype = np.dtype(np.float64)
    leaves = [np.array(1.5), np.array(2.5), np.array(-1.0)]
    out = np.zeros(3)
    assert cpass.pack(leaves, 0, 3, dtype, (), out) == 24
    assert out.tolist() == [1.5, 2.5, -1.0]
    assert cpass.pack(leaves, 0, 3, dtype, [()] * 3, out) == 24
    assert cpass.pack([*leaves[:2], np.zeros(1)], 0, 3, dtype, (), out) == -1
    spec = LeafSpec((), "float64")
    found = cpass.describe(leaves, {dtype: {(): spec}})
    assert found == ((spec,) * 3, dtype, ())
    assert cpass.describe([np.zeros(1), *leaves], {dtype: {(): spec, (1,): spec}}) == (
        (spec,) * 4,
        dtype,
        [(1,), (), (), ()],
    )


# ---- describe ----------------------------------------------------------------------------


@needs_cpass
@pytest.mark.skipif(
    sys.version_info >= (3, 12),
    reason="from Python 3.12 an allocation in C code defers the collection to the next "
    "bytecode boundary: the finalizer cannot be made to run inside describe this way",
)
def test_describe_holds_the_cache_while_a_finalizer_clears_it() -> None:
    """describe kept a borrowed reference to the cache's inner dict across allocations,
    which run the garbage collector: a finalizer that cleared the cache freed the dict,
    and describe read a new dict made at the same address ('WRONG' specs)."""
    assert cpass is not None
    dtype = np.dtype(np.float32)
    by_dtype: dict[Any, Any] = {dtype: {(3,): "right"}}
    kept: list[object] = []

    class Finalizer:
        def __del__(self) -> None:
            by_dtype.clear()  # frees the inner dict: its last reference
            kept.append({(3,): "WRONG"})  # made where it was (the dict free list)

    def leaves() -> Iterator[np.ndarray]:
        # Read by describe itself: the cycle becomes garbage and collection is armed for
        # the next allocation, which is describe's own.
        for _ in range(30):
            yield np.zeros(3, dtype)
        cycle = Finalizer()
        cycle.self = cycle  # type: ignore[attr-defined]
        del cycle
        gc.enable()
        gc.set_threshold(1)

    threshold = gc.get_threshold()
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        found = cpass.describe(leaves(), by_dtype)
    finally:
        gc.set_threshold(*threshold)
        if enabled:
            gc.enable()
        else:
            gc.disable()
    assert kept, "the finalizer did not run during describe: the test proves nothing"
    assert found is not None
    assert found[0] == ("right",) * 30


@needs_cpass
def test_describe_survives_a_finalizer_that_clears_the_leaves_list() -> None:
    """describe copied a list of leaves with PySequence_Tuple, which keeps the list's item
    array while it allocates the tuple: a collection run by that allocation, whose
    finalizer cleared the list, freed the leaves being copied (a segfault). Found by an
    independent attack; each threshold below makes the collection land elsewhere."""
    assert cpass is not None
    leaves = [np.ones(2) for _ in range(50)]

    class Clear:
        def __init__(self) -> None:
            self.cycle = self

        def __del__(self) -> None:
            leaves.clear()

    threshold = gc.get_threshold()
    try:
        for t in range(1, 8):
            gc.collect()
            gc.set_threshold(t)
            Clear()
            found = cpass.describe(leaves, {})
            assert found is None  # no spec for these leaves, or the list changed
            gc.set_threshold(*threshold)
            leaves[:] = [np.ones(2) for _ in range(50)]
    finally:
        gc.set_threshold(*threshold)


@needs_cpass
def test_describe_survives_a_key_whose_eq_clears_the_cache() -> None:
    """A shape key's ``__eq__`` runs during the lookup: the inner dict must stay alive."""
    assert cpass is not None
    dtype = np.dtype(np.float64)
    by_dtype: dict[Any, Any] = {}

    class Collider:
        def __hash__(self) -> int:
            return hash((2,))

        def __eq__(self, other: object) -> bool:
            by_dtype.clear()  # frees the inner dict: its last reference
            kept.append({(2,): "WRONG"})  # made where it was (the dict free list)
            return False

    kept: list[object] = []
    by_dtype[dtype] = {Collider(): "collider", (2,): "right"}
    found = cpass.describe([np.zeros(2), np.zeros(2)], by_dtype)
    assert found == (("right", "right"), dtype, (2,))
    assert by_dtype == {}


@needs_cpass
@pytest.mark.parametrize(
    ("values", "by_dtype", "error"),
    [
        ([np.zeros(2)], [], TypeError),
        ([np.zeros(2)], {np.dtype("f8"): [((2,), 1)]}, TypeError),
        (3, {}, TypeError),
        ([np.zeros(2)], type("D", (dict,), {})(), TypeError),
    ],
)
def test_describe_refuses_hostile_arguments(values: Any, by_dtype: Any, error: type) -> None:
    assert cpass is not None
    with pytest.raises(error):
        cpass.describe(values, by_dtype)


# ---- Generated hostile calls --------------------------------------------------------------

DTYPES = ["f8", ">f8", "f4", "f2", "i1", "u2", ">i4", "u8", "c8", ">c16", "?"]
ODD_DTYPES = ["O", "U2", "S3", "V8", "M8[s]", "m8[s]", [("a", "f4"), ("b", "i2")], "(2,)f4"]
SIZES = [0, 1, 2, 3, 4, 7, 2**31, 2**32, 2**59, 2**62, 2**63 - 1, 2**63, 2**64]


def _array(draw: Draw, base: np.ndarray | None = None) -> Any:
    """An array, often plain, sometimes anything but: another dtype, strided, a subclass,
    read-only, 0-d, a view of ``base`` (to overlap with it), or not an array at all."""
    kind = draw(
        st.sampled_from(
            ["plain"] * 6
            + ["odd dtype", "strided", "subclass", "read-only", "0-d", "view", "other"]
        )
    )
    shape = tuple(draw(st.lists(st.integers(0, 4), max_size=3)))
    dtype = np.dtype(draw(st.sampled_from(DTYPES)))
    if kind == "odd dtype":
        return np.zeros(shape, np.dtype(draw(st.sampled_from(ODD_DTYPES))))
    array = np.arange(int(np.prod(shape)), dtype=np.int64).astype(dtype).reshape(shape)
    if kind == "strided":
        return np.repeat(array.reshape(-1), 2)[::2].reshape(shape)
    if kind == "subclass":
        return array.view(np.ma.MaskedArray)
    if kind == "read-only":
        array.flags.writeable = False
    if kind == "0-d":
        return np.array(array.reshape(-1)[:1].sum(), dtype)
    if kind == "view" and base is not None and base.size:
        lo = draw(st.integers(0, base.size - 1))
        hi = draw(st.integers(lo, base.size))
        return base.reshape(-1)[lo:hi]
    if kind == "other":
        return draw(st.sampled_from([None, 1.5, "leaf", [1.0, 2.0], b"\0" * 8, object()]))
    return array


def _flat(draw: Draw) -> Any:
    """views()'s buffer: mostly what the backend passes (1-d, contiguous, of a number dtype),
    sometimes anything :func:`_array` makes."""
    if draw(st.integers(0, 3)) == 0:
        return _array(draw)
    flat = np.zeros(draw(st.integers(0, 16)), np.dtype(draw(st.sampled_from(DTYPES))))
    flat.flags.writeable = draw(st.booleans())
    return flat


def _shape(draw: Draw) -> Any:
    kind = draw(st.sampled_from(["tuple"] * 3 + ["huge"] * 2 + ["negative", "odd", "long"]))
    if kind == "huge":
        return tuple(draw(st.lists(st.sampled_from(SIZES), min_size=1, max_size=3)))
    if kind == "negative":
        return (draw(st.integers(-(2**63), -1)),)
    if kind == "odd":
        return draw(st.sampled_from([[2], 2, (2.0,), (np.int64(2),), (True,), None, "ab"]))
    if kind == "long":
        return (1,) * draw(st.integers(30, 70))
    return tuple(draw(st.lists(st.integers(0, 4), max_size=3)))


def _shapes(draw: Draw, m: int) -> Any:
    if draw(st.booleans()):
        return _shape(draw)
    count = draw(st.sampled_from([m, m, 0, m + 1, max(m - 1, 0)]))
    return [_shape(draw) for _ in range(count)]


def _index(draw: Draw, m: int) -> int:
    return int(
        draw(st.one_of(st.integers(0, max(m, 2)), st.integers(-3, m + 3), st.sampled_from(SIZES)))
    )


def _check_views(rows: Any, flat: np.ndarray, n: int, count: int) -> None:
    assert isinstance(rows, list)
    assert len(rows) == n
    lo, hi = _address(flat), _address(flat) + flat.nbytes
    for row in rows:
        assert len(row) == count
        for view in row:
            assert type(view) is np.ndarray
            assert view.dtype == flat.dtype
            assert lo <= _address(view)
            assert _address(view) + view.nbytes <= hi
            view.tobytes()  # reads every byte: the sanitizer build checks it is ours
            _assert_never_writable(view)


@needs_cpass
@FUZZ
@given(st.data())
def test_generated_hostile_calls_of_views(data: st.DataObject) -> None:
    assert cpass is not None
    draw = data.draw
    flat = _flat(draw)
    n = draw(st.sampled_from([1, 1, 2, 3, 0, -1, 2**62, 2**64]))
    m = draw(st.integers(0, 5))
    shapes = _shapes(draw, m)
    lo, hi = _index(draw, m), _index(draw, m)
    if isinstance(shapes, tuple) and all(isinstance(d, int) for d in shapes):
        # Each of n rows holds hi - lo views: millions of empty ones are not an attack.
        empty = any(d == 0 for d in shapes)
        if n > 0 and (empty or not shapes) and hi - lo > 10_000:
            return
    try:
        rows = cpass.views(flat, n, shapes, lo, hi)
    except REFUSALS as error:
        event(f"views: {type(error).__name__}")
        return
    event("views: made")
    _check_views(rows, flat, n, hi - lo)


@needs_cpass
@FUZZ
@given(st.data())
def test_generated_hostile_calls_of_pack(data: st.DataObject) -> None:
    assert cpass is not None
    draw = data.draw
    buffer = np.arange(64.0)
    m = draw(st.integers(0, 5))
    if draw(st.integers(0, 2)):
        # What the backend passes, with some of it wrong: leaves of one dtype and shape
        # (some replaced by anything, or by views of `buffer`), an output of that dtype
        # (or a view of `buffer`, which the leaves may overlap), a range within them.
        dtype = np.dtype(draw(st.sampled_from(DTYPES)))
        shape = tuple(draw(st.lists(st.integers(0, 3), max_size=2)))
        row = [
            _array(draw, buffer) if draw(st.integers(0, 4)) == 0 else np.ones(shape, dtype)
            for _ in range(m)
        ]
        shapes: Any = shape if draw(st.booleans()) else [shape] * m
        if draw(st.integers(0, 3)) == 0:
            shapes = _shapes(draw, m)
        size = draw(st.integers(0, m * int(np.prod(shape)) + 1))
        out = draw(
            st.sampled_from(
                [np.zeros(size, dtype), buffer[draw(st.integers(0, 64)) :], _array(draw, buffer)]
            )
        )
        lo = draw(st.integers(0, m))
        hi = draw(st.integers(lo, m))
        if draw(st.integers(0, 3)) == 0:
            lo, hi = _index(draw, m), _index(draw, m)
    else:
        row = [_array(draw, buffer) for _ in range(m)]
        dtype = np.dtype(draw(st.sampled_from(DTYPES + ODD_DTYPES)))
        shapes = _shapes(draw, m)
        out = _array(draw, buffer)
        lo, hi = _index(draw, m), _index(draw, m)
    before = [leaf.copy() if isinstance(leaf, np.ndarray) else leaf for leaf in row]
    try:
        written = cpass.pack(row, lo, hi, dtype, shapes, out)
    except REFUSALS as error:
        event(f"pack: {type(error).__name__}")
        return
    assert isinstance(written, int)
    event(f"pack: {'-1' if written == -1 else 'copied'}")
    if written == -1:
        return
    assert written >= 0
    assert isinstance(out, np.ndarray)
    assert out.dtype == dtype
    assert out.flags.c_contiguous
    assert out.flags.writeable
    expected = b"".join(leaf.tobytes() for leaf in before[lo:hi])
    assert written == len(expected) <= out.nbytes
    assert out.tobytes()[:written] == expected
    for leaf, copied in zip(row, before, strict=True):  # inputs untouched
        if isinstance(leaf, np.ndarray):
            assert leaf.tobytes() == copied.tobytes()


@needs_cpass
@FUZZ
@given(st.data())
def test_generated_hostile_calls_of_describe(data: st.DataObject) -> None:
    assert cpass is not None
    draw = data.draw
    m = draw(st.integers(0, 5))
    leaves = [_array(draw) for _ in range(m)]
    if draw(st.booleans()) and leaves:
        leaves = [leaves[0]] * m
    form = draw(st.sampled_from(["list", "tuple", "iterator", "number", "None"]))
    values = {"list": leaves, "tuple": tuple(leaves), "iterator": iter(leaves)}.get(form, 3)
    specs: dict[Any, Any] = {}
    for v in leaves:
        if isinstance(v, np.ndarray) and draw(st.booleans()):
            specs.setdefault(v.dtype, {})[v.shape] = ("spec", v.shape, v.dtype.str)
    by_dtype = draw(st.sampled_from([specs, {}, [], {np.dtype("f8"): [1]}, None]))
    try:
        found = cpass.describe(values, by_dtype)
    except REFUSALS as error:
        event(f"describe: {type(error).__name__}")
        return
    event(f"describe: {'None' if found is None else 'specs'}")
    if found is None:
        return
    assert form in ("list", "tuple", "iterator")
    got, dtype, shapes = found
    assert len(got) == len(leaves)
    assert all(type(v) is np.ndarray and v.dtype == dtype for v in leaves)
    if isinstance(shapes, tuple):
        assert all(v.shape == shapes for v in leaves)
    else:
        assert shapes == [v.shape for v in leaves]
    assert list(got) == [by_dtype[dtype][v.shape] for v in leaves]


@needs_cpass
@FUZZ
@given(st.data())
def test_generated_hostile_calls_of_freeze(data: st.DataObject) -> None:
    assert cpass is not None
    array = _array(data.draw)
    try:
        frozen = cpass.freeze(array)
    except REFUSALS as error:
        event(f"freeze: {type(error).__name__}")
        return
    event("freeze: made")
    assert type(array) is np.ndarray
    assert (frozen.shape, frozen.dtype) == (array.shape, array.dtype)
    assert frozen.strides == array.strides
    assert _address(frozen) == _address(array)
    assert frozen.tobytes() == array.tobytes()
    _assert_never_writable(frozen)
