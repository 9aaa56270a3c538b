"""``BackendConformanceTests``: the :class:`~asyncreplica.abc.Backend` contract as pytest tests.

Every rule written on the contract's docstrings is checked here, on the backend
directly (``values[r][j]`` in, ``results[r][j]`` out, as the runtime calls it) and
once end to end through :class:`~asyncreplica.MirroredStrategy`. The tests are plain
``def`` methods that drive coroutines with :func:`anyio.run`, so they need no pytest
async plugin and work however the project under test configures one.

Inputs are built with numpy and handed to the backend through
:meth:`BackendConformanceTests.from_numpy`; results come back through
:meth:`BackendConformanceTests.to_numpy`. Expected values are computed with numpy,
combining in replica order as the contract requires, and compared bitwise.

This is the only module of asyncreplica that imports pytest.
"""

from __future__ import annotations

import abc
import functools
from collections.abc import Callable, Coroutine, Iterator, Sequence
from typing import Any, ClassVar, TypeVar

import anyio
import numpy as np
import numpy.typing as npt
import pytest

import asyncreplica
from asyncreplica import IndexedSlices, PerReplica, ReduceOp
from asyncreplica.abc import Backend, LeafSpec

__all__ = ["BackendConformanceTests"]

T = TypeVar("T")
Array = npt.NDArray[Any]
Rows = list[list[object]]

DTYPES = ("float32", "float64", "int32", "int64")
SHAPES = ((), (2, 3))
OPS = tuple(ReduceOp)

# Collectives whose results the backend hands to every replica.
COLLECTIVES = (
    "all_reduce",
    "all_reduce_mean_of_ints",
    "all_reduce_indexed_slices",
    "all_gather",
    "reduce_scatter",
    "broadcast",
)
# Collectives whose one result several replicas share (reduce_scatter gives each its own chunk).
SHARED = tuple(kind for kind in COLLECTIVES if kind != "reduce_scatter")
# Everything that receives arrays: collectives and the cross-replica reduce and gather.
EVERY_CALL = (*COLLECTIVES, "reduce", "reduce_along_axis", "gather")

_FOLD: dict[ReduceOp, Callable[[Array, Array], Any]] = {
    ReduceOp.SUM: np.add,
    ReduceOp.MEAN: np.add,
    ReduceOp.MIN: np.minimum,
    ReduceOp.MAX: np.maximum,
    ReduceOp.PROD: np.multiply,
}
_LOCAL: dict[ReduceOp, Callable[..., Any]] = {
    ReduceOp.SUM: np.sum,
    ReduceOp.MIN: np.min,
    ReduceOp.MAX: np.max,
    ReduceOp.PROD: np.prod,
}
_READ_ONLY = r"(?i)read-only|read only|writeable|writable"


def _mean_dtype(dtype: np.dtype[Any]) -> np.dtype[Any]:
    return dtype if dtype.kind in "fc" else np.dtype(np.float64)


def _exact_mean(totals: Sequence[Array], count: int) -> Array:
    """The float64 nearest to ``sum(totals) / count``, the totals being integer arrays.

    The sum is taken in Python integers (which cannot overflow) and Python's ``int / int``
    is correctly rounded: the mean of integers as the contract defines it.
    """
    exact = sum(
        (np.asarray(t).astype(object) for t in totals[1:]), np.asarray(totals[0]).astype(object)
    )
    exact = np.asarray(exact, dtype=object)
    means = [int(t) / count for t in exact.ravel().tolist()]
    return np.array(means, dtype=np.float64).reshape(exact.shape)


def _fold(op: ReduceOp, arrays: Sequence[Array]) -> Array:
    """Combine ``arrays`` left to right, in replica order; ``MEAN`` divides by their count."""
    if op is ReduceOp.MEAN and np.asarray(arrays[0]).dtype.kind in "iu":
        return _exact_mean(arrays, len(arrays))
    out = np.array(arrays[0], copy=True)
    for a in arrays[1:]:
        out = np.asarray(_FOLD[op](out, a))
    if op is ReduceOp.MEAN:
        out = np.asarray(np.true_divide(out, len(arrays), dtype=_mean_dtype(out.dtype)))
    return out


def _reduce_along(op: ReduceOp, arrays: Sequence[Array], axis: tuple[int, ...]) -> Array:
    """What ``Backend.reduce`` returns with an axis tuple: MEAN weights by element count."""
    if op is ReduceOp.MEAN:
        count = sum(int(np.prod([a.shape[k] for k in axis])) for a in arrays)
        if arrays[0].dtype.kind in "iu":
            return _exact_mean([np.asarray(a).astype(object).sum(axis=axis) for a in arrays], count)
        total = _fold(ReduceOp.SUM, [np.asarray(np.sum(a, axis=axis)) for a in arrays])
        return np.asarray(np.true_divide(total, count, dtype=_mean_dtype(total.dtype)))
    return _fold(op, [np.asarray(_LOCAL[op](a, axis=axis)) for a in arrays])


def _random(
    n: int, dtype: str, shape: Sequence[int] | Callable[[int], Sequence[int]]
) -> list[Array]:
    """One array per replica: small integers, or floats of widely varying magnitude.

    Float sums of such values round differently in a different order, so a backend
    that does not combine in replica order fails the bitwise comparisons.
    """
    rng = np.random.default_rng(20240611)
    out = []
    for r in range(n):
        s = tuple(shape(r) if callable(shape) else shape)
        if np.dtype(dtype).kind == "f":
            raw = rng.standard_normal(s) * 10.0 ** rng.integers(-3, 4, size=s)
        else:
            raw = rng.integers(-3, 4, size=s)
        out.append(np.asarray(raw, dtype=dtype))
    return out


# Array libraries whose (CPU) arrays the foreign-array tests pass, by the array type the
# signature names: (module to import, pip requirement).
FOREIGN = {
    "array_api_strict.Array": ("array_api_strict", "array-api-strict"),
    "jax.Array": ("jax.numpy", "jax[cpu]"),
    # Where installed (its default wheel brings the CUDA libraries: not in [test]).
    "torch.Tensor": ("torch", "torch"),
}
# Collectives the foreign-array tests run (dtypes every library holds without x64 modes).
FOREIGN_COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")


def _namespace(array_type: str) -> Any:
    """The namespace that makes ``array_type`` arrays; skips the test when it is missing."""
    module, requirement = FOREIGN[array_type]
    return pytest.importorskip(
        module, reason=f"{array_type} inputs need {module} (pip install '{requirement}')"
    )


def _host(value: object) -> Array:
    """A foreign array's contents as numpy: through DLPack, else ``numpy.asarray``."""
    try:
        return np.from_dlpack(value)  # type: ignore[arg-type]
    except (AttributeError, BufferError, TypeError, RuntimeError):
        return np.asarray(value)


def _arrays_of(value: object) -> list[object]:
    """The arrays a leaf is made of: an ``IndexedSlices`` has two."""
    if isinstance(value, IndexedSlices):
        return [value.values, value.indices]
    return [value]


def _writeable(value: object) -> bool | None:
    """The ``flags.writeable`` of a numpy-like array, None when it has no such flag."""
    flag = getattr(getattr(value, "flags", None), "writeable", None)
    return None if flag is None else bool(flag)


class BackendConformanceTests(abc.ABC):
    """Tests every backend must pass; inherit them in a ``Test...`` class and implement one hook.

    Subclasses implement :meth:`make_backend`. They may override :attr:`devices` (the
    replicas' devices, three CPU devices by default), :meth:`from_numpy` (how an input
    reaches a replica's device) and :meth:`to_numpy` (how a result is read back).

    Example::

        from asyncreplica.testing import BackendConformanceTests

        class TestMyBackend(BackendConformanceTests):
            devices = ["GPU:0", "GPU:1"]

            def make_backend(self, devices):
                return MyBackend(devices)

    Each test gets a new backend from :meth:`make_backend` (as :attr:`backend`) and
    closes it with ``aclose()`` afterwards.
    """

    #: The replicas' devices; ``make_backend`` receives a copy.
    devices: ClassVar[list[str]] = ["CPU:0", "CPU:1", "CPU:2"]

    #: The backend under test, made by ``make_backend(devices)`` before each test.
    backend: Backend

    # -- hooks -------------------------------------------------------------------------------

    @abc.abstractmethod
    def make_backend(self, devices: list[str]) -> Backend:
        """Return a new backend whose replicas live on ``devices``.

        Args:
            devices: The replicas' devices, in replica order.

        Returns:
            A new instance of the backend under test.
        """

    def to_numpy(self, value: object) -> Array:
        """Read a backend's result (an array leaf) back as a numpy array.

        Args:
            value: An array the backend returned.

        Returns:
            Its contents as a numpy array (the default is :func:`numpy.asarray`).
        """
        return np.asarray(value)

    def from_numpy(self, array: Array, device: str) -> object:
        """Turn an input built with numpy into a value a replica on ``device`` holds.

        Args:
            array: The input, a numpy array (possibly 0-d).
            device: The device of the replica that passes it.

        Returns:
            The value to pass to the backend; the default passes ``array`` itself. An
            override must return a mutable array-like (``x[...] = y`` works) so that
            tests can check results do not alias inputs.
        """
        return array

    # -- plumbing ----------------------------------------------------------------------------

    @pytest.fixture(autouse=True)
    def _conformance_backend(self) -> Iterator[None]:
        backend = self.make_backend(list(self.devices))
        self.backend = backend
        try:
            yield
        finally:
            anyio.run(backend.aclose)

    @staticmethod
    def _run(fn: Callable[[], Coroutine[Any, Any, T]]) -> T:
        return anyio.run(fn)

    @property
    def _n(self) -> int:
        return len(self.devices)

    def _on_replicas(self, arrays: Sequence[Array]) -> list[object]:
        """Place ``arrays[r]`` on replica ``r``'s device (replica ids wrap around)."""
        return [self.from_numpy(a, self.devices[r % self._n]) for r, a in enumerate(arrays)]

    def _rows(self, *leaves: Sequence[Array]) -> Rows:
        """Build ``values[r][j]`` from one list of per-replica arrays per leaf ``j``."""
        placed = [self._on_replicas(arrays) for arrays in leaves]
        return [[placed[j][r] for j in range(len(leaves))] for r in range(len(leaves[0]))]

    def _slices(self, rows: Sequence[int], *, seed: int = 0) -> list[IndexedSlices]:
        """One ``IndexedSlices`` per replica, ``rows[r]`` rows of a (10, 4) float32 value."""
        rng = np.random.default_rng(seed)
        out = []
        for r, k in enumerate(rows):
            device = self.devices[r % self._n]
            values = np.asarray(rng.standard_normal((k, 4)), dtype=np.float32)
            indices = np.asarray(rng.integers(0, 10, size=k), dtype=np.int64)
            out.append(
                IndexedSlices(
                    self.from_numpy(values, device), self.from_numpy(indices, device), (10, 4)
                )
            )
        return out

    def _check(self, actual: object, expected: Array, what: str) -> None:
        """Assert ``actual`` has ``expected``'s dtype, shape and exact bits."""
        got = self.to_numpy(actual)
        assert got.dtype == expected.dtype, f"{what}: dtype {got.dtype}, expected {expected.dtype}"
        assert got.shape == expected.shape, f"{what}: shape {got.shape}, expected {expected.shape}"
        np.testing.assert_array_equal(got, expected, err_msg=what, strict=True)
        assert got.tobytes() == expected.tobytes(), f"{what}: equal but not bitwise identical"

    def _check_layout(self, results: object, replicas: int, leaves: int) -> Rows:
        """Assert ``results`` is ``results[r][j]`` with ``replicas`` rows of ``leaves`` leaves."""
        assert isinstance(results, Sequence), f"results must be a list of rows, got {results!r:.80}"
        assert len(results) == replicas, f"{len(results)} rows of results for {replicas} replicas"
        rows = [list(row) for row in results]
        for r, row in enumerate(rows):
            assert len(row) == leaves, f"replica {r} got {len(row)} leaves, expected {leaves}"
        return rows

    def _snapshot(self, value: object) -> list[tuple[str, tuple[int, ...], bytes, bool | None]]:
        """Dtype, shape, bytes and writeable flag of every array of a leaf."""
        out = []
        for a in _arrays_of(value):
            data = np.array(self.to_numpy(a), copy=True)
            out.append((data.dtype.str, data.shape, data.tobytes(), _writeable(a)))
        return out

    def _prepare(self, kind: str) -> tuple[list[object], Callable[[], Coroutine[Any, Any, Rows]]]:
        """Build the inputs of one call of ``kind``: every input leaf, and the call itself.

        The call returns its results as rows; ``reduce`` and ``gather`` give one row of
        one leaf.
        """
        n = self._n
        backend = self.backend

        async def one(result: Coroutine[Any, Any, object]) -> Rows:
            return [[await result]]

        if kind == "all_reduce":
            values = self._rows(_random(n, "float32", (2, 3)), _random(n, "int64", ()))
            return _flat(values), lambda: backend.all_reduce(ReduceOp.SUM, values)
        if kind == "all_reduce_mean_of_ints":
            values = self._rows(_random(n, "int32", (4,)))
            return _flat(values), lambda: backend.all_reduce(ReduceOp.MEAN, values)
        if kind == "all_reduce_indexed_slices":
            values = [[s] for s in self._slices([r + 1 for r in range(n)])]
            return _flat(values), lambda: backend.all_reduce(ReduceOp.SUM, values)
        if kind == "all_gather":
            values = self._rows(_random(n, "float64", lambda r: (r + 1, 3)))
            return _flat(values), lambda: backend.all_gather(values, 0)
        if kind == "reduce_scatter":
            values = self._rows(_random(n, "float32", (2 * n, 3)))
            return _flat(values), lambda: backend.reduce_scatter(ReduceOp.SUM, values, 0)
        if kind == "broadcast":
            source = self._rows(_random(1, "float32", (2, 3)), _random(1, "int64", ()))[0]
            return list(source), lambda: backend.broadcast(source, n)
        if kind == "reduce":
            comps = self._on_replicas(_random(n, "float64", (2, 3)))
            return comps, lambda: one(backend.reduce(ReduceOp.SUM, comps, None))
        if kind == "reduce_along_axis":
            comps = self._on_replicas(_random(n, "int64", lambda r: (r + 1, 3)))
            return comps, lambda: one(backend.reduce(ReduceOp.MEAN, comps, (0,)))
        if kind == "gather":
            comps = self._on_replicas(_random(n, "float32", lambda r: (r + 1, 2)))
            return comps, lambda: one(backend.gather(comps, 0))
        raise AssertionError(f"unknown kind {kind!r}")  # pragma: no cover

    def _call(self, kind: str) -> tuple[list[object], Rows]:
        """Make one call of ``kind``; return every input leaf and the results as rows."""
        inputs, call = self._prepare(kind)
        return inputs, self._run(call)

    # -- the backend itself ----------------------------------------------------------------

    def test_make_backend_returns_a_backend_on_the_devices(self) -> None:
        """``make_backend`` returns a named ``Backend`` holding the devices it was given."""
        assert isinstance(self.backend, Backend)
        assert tuple(self.backend.devices) == tuple(self.devices)
        name = type(self.backend).name
        assert isinstance(name, str)
        assert name, "Backend subclasses must set the class attribute `name`"

    def test_check_available_passes_for_a_backend_that_was_made(self) -> None:
        """A backend that could be made reports itself available."""
        assert type(self.backend).check_available() is None

    # -- describe --------------------------------------------------------------------------

    @pytest.mark.parametrize("shape", SHAPES, ids=str)
    @pytest.mark.parametrize("dtype", DTYPES)
    def test_describe_reports_shape_and_dtype(self, dtype: str, shape: tuple[int, ...]) -> None:
        """``describe`` gives an array's shape and dtype name."""
        value = self.from_numpy(np.zeros(shape, dtype=dtype), self.devices[0])
        assert self.backend.describe(value) == LeafSpec(shape, dtype)

    def test_describe_leaves_equals_describing_each_leaf(self) -> None:
        """``describe_leaves`` of a batch (one dtype, or mixed) equals ``describe`` per leaf."""
        device = self.devices[0]
        for batch in (
            [self.from_numpy(np.full((i % 3 + 1,), i, "float32"), device) for i in range(20)],
            [
                self.from_numpy(np.zeros((2, 3), "float64"), device),
                self.from_numpy(np.zeros((), "int32"), device),
                self.from_numpy(np.zeros((4,), "float32"), device),
            ],
        ):
            assert self.backend.describe_leaves(batch) == tuple(map(self.backend.describe, batch))

    def test_convert_reads_the_backends_own_arrays_as_they_are(self) -> None:
        """``convert`` returns the backend's own arrays themselves, described the same.

        The runtime remembers a type ``convert`` returned as it is and converts no value of
        it again (see ``Backend.convert``); what it returns for any value must describe as
        that value does.
        """
        for dtype in DTYPES:
            value = self.from_numpy(np.zeros((2, 3), dtype=dtype), self.devices[0])
            assert self.backend.convert(value) is value
            assert self.backend.describe(self.backend.convert(value)) == LeafSpec((2, 3), dtype)

    def test_describe_indexed_slices_gives_the_dense_shape(self) -> None:
        """An ``IndexedSlices`` is described by its dense shape and its values' dtype."""
        (value,) = self._slices([2])
        assert self.backend.describe(value) == LeafSpec((10, 4), "float32", sparse=True)

    @pytest.mark.parametrize(
        "value",
        ["text", None, object(), np.array([object(), object()], dtype=object)],
        ids=["str", "None", "object", "object-array"],
    )
    def test_describe_rejects_values_it_cannot_hold(self, value: object) -> None:
        """Strings, ``None`` and arbitrary objects raise ``TypeError`` with a message."""
        with pytest.raises(TypeError) as info:
            self.backend.describe(value)
        assert str(info.value), "the TypeError must say what is accepted"

    # -- all_reduce ------------------------------------------------------------------------

    @pytest.mark.parametrize("shape", SHAPES, ids=str)
    @pytest.mark.parametrize("dtype", DTYPES)
    @pytest.mark.parametrize("op", OPS, ids=lambda op: op.value)
    def test_all_reduce(self, op: ReduceOp, dtype: str, shape: tuple[int, ...]) -> None:
        """Every replica gets the replica-order combination, bitwise, with the right dtype."""
        arrays = _random(self._n, dtype, shape)
        values = self._rows(arrays)
        results = self._check_layout(
            self._run(lambda: self.backend.all_reduce(op, values)), self._n, 1
        )
        expected = _fold(op, arrays)
        for r in range(self._n):
            self._check(results[r][0], expected, f"all_reduce({op.value}) on replica {r}")

    @pytest.mark.parametrize("dtype", ["int32", "int64"])
    def test_all_reduce_mean_of_integers_is_float64(self, dtype: str) -> None:
        """``MEAN`` of integers is float64 and not truncated."""
        n = self._n
        arrays = [np.asarray([r, 1 if r == 0 else 0], dtype=dtype) for r in range(n)]
        results = self._run(lambda: self.backend.all_reduce(ReduceOp.MEAN, self._rows(arrays)))
        expected = np.asarray([sum(range(n)) / n, 1 / n], dtype=np.float64)
        for r in range(n):
            self._check(results[r][0], expected, f"MEAN of {dtype} on replica {r}")

    @pytest.mark.parametrize("leaves", [1, 3], ids=["one-leaf", "batch"])
    @pytest.mark.parametrize("dtype", ["int8", "int16", "int32", "int64", "uint8", "uint64"])
    def test_all_reduce_mean_of_integers_does_not_overflow(self, dtype: str, leaves: int) -> None:
        """``MEAN`` of integers is the float64 nearest the exact mean, even near the limits.

        It is never summed in the input dtype (int8 ``100`` on two replicas is 100.0, not
        -28.0), and a batch of leaves (packed or not) gives what each leaf gives alone.
        """
        n = self._n
        info = np.iinfo(dtype)
        big, small = int(info.max), int(info.min)
        arrays = [
            np.asarray(
                [big, big - r, small + r, small, 100, 2**53 + 1 if info.bits == 64 else 1],
                dtype=dtype,
            )
            for r in range(n)
        ]
        values = self._rows(*[arrays] * leaves)
        results = self._check_layout(
            self._run(lambda: self.backend.all_reduce(ReduceOp.MEAN, values)), n, leaves
        )
        expected = _exact_mean(arrays, n)
        for r in range(n):
            for j in range(leaves):
                self._check(results[r][j], expected, f"MEAN of {dtype} leaf {j} on replica {r}")

    @pytest.mark.parametrize("dtype", ["int8", "int64", "uint64"])
    def test_reduce_scatter_and_reduce_mean_of_integers_do_not_overflow(self, dtype: str) -> None:
        """``reduce_scatter`` and ``reduce`` (with and without axes) take MEAN exactly too."""
        n = self._n
        big = int(np.iinfo(dtype).max)
        arrays = [np.asarray([[big - r, big], [big, 7]] * n, dtype=dtype) for r in range(n)]
        results = self._check_layout(
            self._run(lambda: self.backend.reduce_scatter(ReduceOp.MEAN, self._rows(arrays), 0)),
            n,
            1,
        )
        chunks = np.split(_exact_mean(arrays, n), n, axis=0)
        for r in range(n):
            self._check(results[r][0], chunks[r], f"reduce_scatter(MEAN) of {dtype}, replica {r}")
        comps = self._on_replicas(arrays)
        whole = self._run(lambda: self.backend.reduce(ReduceOp.MEAN, comps, None))
        self._check(whole, _exact_mean(arrays, n), f"reduce(MEAN) of {dtype}")
        along = self._run(lambda: self.backend.reduce(ReduceOp.MEAN, comps, (0,)))
        self._check(along, _reduce_along(ReduceOp.MEAN, arrays, (0,)), f"reduce(MEAN, 0) {dtype}")

    @pytest.mark.parametrize("dtype", ["float32", "float64"])
    def test_all_reduce_combines_in_replica_order(self, dtype: str) -> None:
        """Float sums are the left-to-right sum in replica order, identical on every replica."""
        n = self._n
        arrays = _random(n, dtype, (64,))
        # Element 0 rounds differently in any other order: 1 + 1e8 rounds back to 1e8.
        big = 1e8 if dtype == "float32" else 1e17
        for r, a in enumerate(arrays):
            a[0] = 1.0 if r == 0 else big if r == 1 else -big if r == n - 1 else 0.0
        results = self._run(lambda: self.backend.all_reduce(ReduceOp.SUM, self._rows(arrays)))
        first = self.to_numpy(results[0][0]).tobytes()
        for r in range(n):
            assert self.to_numpy(results[r][0]).tobytes() == first, (
                f"replica {r}'s result differs from replica 0's"
            )
            self._check(results[r][0], _fold(ReduceOp.SUM, arrays), f"replica {r}")

    def test_all_reduce_several_leaves_keep_their_order(self) -> None:
        """A call with several leaves reduces each leaf and returns them in order."""
        n = self._n
        leaves = [
            _random(n, "float32", (3,)),
            _random(n, "int64", ()),
            _random(n, "float64", (2, 2)),
        ]
        for op in (ReduceOp.SUM, ReduceOp.MEAN):
            call = functools.partial(self.backend.all_reduce, op, self._rows(*leaves))
            results = self._check_layout(self._run(call), n, len(leaves))
            for j, arrays in enumerate(leaves):
                expected = _fold(op, arrays)
                for r in range(n):
                    self._check(results[r][j], expected, f"{op.value}: leaf {j} of replica {r}")

    @pytest.mark.parametrize("op", [ReduceOp.SUM, ReduceOp.MEAN], ids=lambda op: op.value)
    def test_all_reduce_indexed_slices(self, op: ReduceOp) -> None:
        """``IndexedSlices`` are concatenated in replica order; ``MEAN`` also scales values."""
        n = self._n
        slices = self._slices([r + 1 for r in range(n)], seed=1)
        values = [[s] for s in slices]
        results = self._check_layout(self._run(lambda: self.backend.all_reduce(op, values)), n, 1)
        rows = np.concatenate([self.to_numpy(s.values) for s in slices], axis=0)
        if op is ReduceOp.MEAN:
            rows = np.true_divide(rows, n, dtype=np.float32)
        indices = np.concatenate([self.to_numpy(s.indices) for s in slices], axis=0)
        for r in range(n):
            result = results[r][0]
            assert isinstance(result, IndexedSlices), f"replica {r} got {result!r:.80}"
            assert result.dense_shape == (10, 4)
            self._check(result.values, rows, f"values on replica {r}")
            self._check(result.indices, indices, f"indices on replica {r}")

    # -- all_gather ------------------------------------------------------------------------

    @pytest.mark.parametrize("dtype", ["float32", "int64"])
    @pytest.mark.parametrize(
        ("rank", "axis"), [(1, 0), (2, 0), (2, 1), (3, 2)], ids=lambda v: str(v)
    )
    def test_all_gather_concatenates_uneven_values(self, rank: int, axis: int, dtype: str) -> None:
        """Values of different sizes along ``axis`` are concatenated in replica order."""

        def shape(r: int) -> tuple[int, ...]:
            base = [2, 3, 4][:rank]
            base[axis] = r + 1
            return tuple(base)

        arrays = _random(self._n, dtype, shape)
        values = self._rows(arrays)
        results = self._check_layout(
            self._run(lambda: self.backend.all_gather(values, axis)), self._n, 1
        )
        expected = np.concatenate(arrays, axis=axis)
        for r in range(self._n):
            self._check(results[r][0], expected, f"all_gather(axis={axis}) on replica {r}")

    # -- reduce_scatter --------------------------------------------------------------------

    @pytest.mark.parametrize("dtype", ["float32", "int64"])
    @pytest.mark.parametrize("axis", [0, 1])
    @pytest.mark.parametrize("op", OPS, ids=lambda op: op.value)
    def test_reduce_scatter_gives_replica_r_chunk_r(
        self, op: ReduceOp, axis: int, dtype: str
    ) -> None:
        """The combined value is split in equal chunks; replica ``r`` gets chunk ``r``."""
        n = self._n
        shape = (2 * n, 3) if axis == 0 else (3, 2 * n)
        arrays = _random(n, dtype, shape)
        values = self._rows(arrays)
        results = self._check_layout(
            self._run(lambda: self.backend.reduce_scatter(op, values, axis)), n, 1
        )
        chunks = np.split(_fold(op, arrays), n, axis=axis)
        for r in range(n):
            self._check(results[r][0], chunks[r], f"reduce_scatter chunk of replica {r}")

    # -- broadcast -------------------------------------------------------------------------

    @pytest.mark.parametrize("extra", [0, 1], ids=["to-every-device", "to-one-more"])
    def test_broadcast_copies_the_source(self, extra: int) -> None:
        """Every replica gets the source's leaves; changing the source later changes nothing."""
        count = self._n + extra
        leaves = [
            _random(1, "float32", (2, 3))[0],
            _random(1, "int64", ())[0],
            _random(1, "float64", (4,))[0],
        ]
        expected = [np.array(a, copy=True) for a in leaves]
        source = [self.from_numpy(a, self.devices[0]) for a in leaves]
        results = self._check_layout(
            self._run(lambda: self.backend.broadcast(source, count)), count, len(leaves)
        )
        for value in source:
            value[...] = 7  # type: ignore[index]
        for r in range(count):
            for j in range(len(leaves)):
                assert results[r][j] is not source[j], f"replica {r} got the source object itself"
                self._check(results[r][j], expected[j], f"leaf {j} on replica {r}")

    # -- reduce and gather (cross-replica) ---------------------------------------------------

    @pytest.mark.parametrize("shape", SHAPES, ids=str)
    @pytest.mark.parametrize("dtype", DTYPES)
    @pytest.mark.parametrize("op", OPS, ids=lambda op: op.value)
    def test_reduce_elementwise(self, op: ReduceOp, dtype: str, shape: tuple[int, ...]) -> None:
        """With ``axis=None`` components combine element-wise, in replica order."""
        arrays = _random(self._n, dtype, shape)
        comps = self._on_replicas(arrays)
        result = self._run(lambda: self.backend.reduce(op, comps, None))
        self._check(result, _fold(op, arrays), f"reduce({op.value}, axis=None)")

    @pytest.mark.parametrize("dtype", ["int64", "float64"])
    @pytest.mark.parametrize(
        ("shape", "axis"),
        [
            (lambda r: (r + 2,), (0,)),
            (lambda r: (r + 1, 3), (0,)),
            (lambda r: (r + 1, 3), (0, 1)),
            (lambda r: (2, 3), (1,)),
            (lambda r: (2, 3, 2), (0, 2)),
        ],
        ids=["1-D-uneven-(0,)", "2-D-uneven-(0,)", "2-D-uneven-(0,1)", "2-D-(1,)", "3-D-(0,2)"],
    )
    @pytest.mark.parametrize("op", OPS, ids=lambda op: op.value)
    def test_reduce_along_axes(
        self,
        op: ReduceOp,
        shape: Callable[[int], tuple[int, ...]],
        axis: tuple[int, ...],
        dtype: str,
    ) -> None:
        """With an axis tuple, components are reduced along it; MEAN weights by element count."""
        arrays = _random(self._n, dtype, shape)
        comps = self._on_replicas(arrays)
        result = self._run(lambda: self.backend.reduce(op, comps, axis))
        expected = _reduce_along(op, arrays, axis)
        got = self.to_numpy(result)
        what = f"reduce({op.value}, axis={axis})"
        assert got.dtype == expected.dtype, f"{what}: dtype {got.dtype}, expected {expected.dtype}"
        if expected.dtype.kind == "f":  # the order of a local sum is the backend's choice
            np.testing.assert_allclose(got, expected, rtol=1e-12, err_msg=what, strict=True)
        else:
            self._check(result, expected, what)

    def test_reduce_mean_weights_uneven_components(self) -> None:
        """``[0, 1, 2, 3]`` and ``[4, 5]`` have MEAN 2.5 along axis 0, not (1.5 + 4.5) / 2 = 3."""
        comps = self._on_replicas([np.arange(4, dtype=np.int64), np.arange(4, 6, dtype=np.int64)])
        result = self._run(lambda: self.backend.reduce(ReduceOp.MEAN, comps, (0,)))
        self._check(result, np.asarray(2.5, dtype=np.float64), "reduce(MEAN, axis=(0,))")

    @pytest.mark.parametrize("axis", [None, (0,)], ids=["axis-None", "axis-(0,)"])
    def test_reduce_returns_a_new_writable_value(self, axis: tuple[int, ...] | None) -> None:
        """The result belongs to the caller: writable, and writing it leaves the inputs alone."""
        arrays = [np.arange(1, 5, dtype=np.float64)]  # one component: nothing to combine
        comps = self._on_replicas(arrays)
        before = [self._snapshot(c) for c in comps]
        result = self._run(lambda: self.backend.reduce(ReduceOp.MEAN, comps, axis))
        assert result is not comps[0], "reduce returned its input"
        self._check(
            result,
            arrays[0] if axis is None else np.asarray(2.5),
            f"reduce(MEAN, axis={axis}) of one component",
        )
        writeable = _writeable(result)
        assert writeable is not False, "the result of reduce must be writable"
        if writeable:
            result[...] = -1  # type: ignore[index]
        assert [self._snapshot(c) for c in comps] == before, "writing the result changed an input"

    @pytest.mark.parametrize("dtype", ["float32", "int64"])
    @pytest.mark.parametrize(
        ("rank", "axis"), [(1, 0), (2, 0), (2, 1), (2, -1), (3, -2)], ids=lambda v: str(v)
    )
    def test_gather_concatenates_uneven_components(self, rank: int, axis: int, dtype: str) -> None:
        """``gather`` concatenates uneven components along ``axis`` (negative counts from the end)."""

        def shape(r: int) -> tuple[int, ...]:
            base = [2, 3, 4][:rank]
            base[axis] = r + 1
            return tuple(base)

        arrays = _random(self._n, dtype, shape)
        comps = self._on_replicas(arrays)
        result = self._run(lambda: self.backend.gather(comps, axis))
        self._check(result, np.concatenate(arrays, axis=axis), f"gather(axis={axis})")

    # -- rules common to every call ----------------------------------------------------------

    @pytest.mark.parametrize("kind", EVERY_CALL)
    def test_inputs_are_not_modified(self, kind: str) -> None:
        """No call changes its inputs: contents, dtype, shape or writeable flag."""
        inputs, call = self._prepare(kind)
        before = [self._snapshot(v) for v in inputs]
        self._run(call)
        after = [self._snapshot(v) for v in inputs]
        assert after == before, f"{kind} modified one of its inputs"

    @pytest.mark.parametrize("kind", EVERY_CALL)
    def test_results_do_not_alias_inputs(self, kind: str) -> None:
        """Changing an input after the call does not change any result."""
        inputs, results = self._call(kind)
        before = [[self._snapshot(v) for v in row] for row in results]
        for value in inputs:
            for array in _arrays_of(value):
                try:
                    array[...] = 7  # type: ignore[index]
                except (TypeError, ValueError) as exc:  # pragma: no cover - immutable inputs
                    pytest.skip(f"inputs are immutable ({exc}); results cannot alias them")
        after = [[self._snapshot(v) for v in row] for row in results]
        assert after == before, f"a result of {kind} shares memory with an input"

    @pytest.mark.parametrize("kind", COLLECTIVES)
    def test_each_replica_gets_its_own_result_object(self, kind: str) -> None:
        """No two replicas get the same result object (``Strategy.run`` regroups by identity)."""
        if self._n < 2:
            pytest.skip("needs two replicas or more")
        _, results = self._call(kind)
        rows = self._check_layout(results, self._n, len(results[0]))
        for j in range(len(rows[0])):
            ids = [id(row[j]) for row in rows]
            assert len(set(ids)) == len(ids), f"replicas share the result object of leaf {j}"

    @pytest.mark.parametrize("kind", SHARED)
    def test_shared_results_are_read_only(self, kind: str) -> None:
        """A result several replicas share cannot be written (numpy-like arrays raise)."""
        _, results = self._call(kind)
        checked = 0
        for r, row in enumerate(results):
            for j, leaf in enumerate(row):
                for array in _arrays_of(leaf):
                    if type(array).__module__.split(".")[0] == "cupy":
                        # CuPy arrays have no read-only flag: say so, do not pass silently.
                        pytest.skip(
                            "read-only results are not enforceable on CuPy: CuPy arrays have "
                            "no read-only flag; each replica gets its own view object "
                            "(test_each_replica_gets_its_own_result_object), see docs/gpu.md"
                        )
                    writeable = _writeable(array)
                    if writeable is None:
                        continue
                    assert not writeable, f"leaf {j} of replica {r} is writable"
                    with pytest.raises(ValueError, match=_READ_ONLY):
                        array[...] = 0  # type: ignore[index]
                    checked += 1
        if not checked:
            pytest.skip("results have no flags.writeable; read-only cannot be checked generically")

    @pytest.mark.parametrize("kind", SHARED)
    def test_shared_results_are_identical_on_every_replica(self, kind: str) -> None:
        """Every replica sees the same bits."""
        if self._n < 2:
            pytest.skip("needs two replicas or more")
        _, results = self._call(kind)
        for j, leaf in enumerate(results[0]):
            first = self._snapshot(leaf)
            for r, row in enumerate(results):
                got = [(d, s, b) for d, s, b, _ in self._snapshot(row[j])]
                assert got == [(d, s, b) for d, s, b, _ in first], (
                    f"replica {r}'s leaf {j} differs from replica 0's"
                )

    # -- foreign arrays (Backend.accepts_foreign_arrays) -------------------------------------

    def _foreign(self, array_type: str) -> Any:
        """The namespace of ``array_type``; skips unless the backend accepts foreign arrays."""
        kind = type(self.backend)
        if not kind.accepts_foreign_arrays:
            pytest.skip(
                f"{kind.__name__} does not accept arrays of other libraries "
                "(Backend.accepts_foreign_arrays is False)"
            )
        return _namespace(array_type)

    @pytest.mark.parametrize("array_type", list(FOREIGN))
    def test_foreign_describe_names_the_array_type(self, array_type: str) -> None:
        """A foreign leaf's ``LeafSpec`` has its shape, dtype and ``array_type``."""
        xp = self._foreign(array_type)
        value = xp.asarray(np.zeros((2, 3), np.float32))
        assert self.backend.describe(value) == LeafSpec((2, 3), "float32", array_type=array_type)

    @pytest.mark.parametrize("kind", FOREIGN_COLLECTIVES)
    @pytest.mark.parametrize("array_type", list(FOREIGN))
    def test_foreign_results_keep_the_input_type(self, array_type: str, kind: str) -> None:
        """Foreign inputs give results of the input's own type with numpy's values, bitwise."""
        xp = self._foreign(array_type)
        n = self._n
        values = _random(n, "float32", (2 * n, 3))
        ints = _random(n, "int32", (n,))
        expected: list[list[Array]]
        if kind == "all_reduce":
            rows = [[xp.asarray(values[r]), xp.asarray(ints[r])] for r in range(n)]
            call = self.backend.all_reduce(ReduceOp.SUM, rows)
            combined = [_fold(ReduceOp.SUM, values), _fold(ReduceOp.SUM, ints)]
            expected = [combined] * n
        elif kind == "all_gather":
            rows = [[xp.asarray(values[r][: r + 1])] for r in range(n)]
            call = self.backend.all_gather(rows, 0)
            expected = [[np.concatenate([values[r][: r + 1] for r in range(n)])]] * n
        elif kind == "reduce_scatter":
            rows = [[xp.asarray(values[r])] for r in range(n)]
            call = self.backend.reduce_scatter(ReduceOp.MAX, rows, 0)
            chunks = np.split(_fold(ReduceOp.MAX, values), n, axis=0)
            expected = [[chunks[r]] for r in range(n)]
        else:
            rows = [[xp.asarray(values[0]), xp.asarray(ints[0])]]
            call = self.backend.broadcast(rows[0], n)
            expected = [[values[0], ints[0]]] * n
        results = self._check_layout(self._run(lambda: call), n, len(expected[0]))
        for r in range(n):
            for j, want in enumerate(expected[r]):
                got = results[r][j]
                what = f"{kind} of {array_type} inputs, leaf {j} on replica {r}"
                assert type(got) is type(rows[0][j]), (
                    f"{what}: a {type(got).__module__}.{type(got).__qualname__} came back"
                )
                host = _host(got)
                assert host.dtype == want.dtype, f"{what}: dtype {host.dtype}, not {want.dtype}"
                np.testing.assert_array_equal(host, want, err_msg=what, strict=True)

    @pytest.mark.parametrize("kind", FOREIGN_COLLECTIVES)
    @pytest.mark.parametrize("array_type", list(FOREIGN))
    def test_writing_a_foreign_result_changes_no_other_replica(
        self, array_type: str, kind: str
    ) -> None:
        """A library whose arrays can be written (PyTorch): each replica's result is its own.

        Writing into replica 0's result (``result[...] = 0``, where the library allows
        it) changes no other replica's result and no input. Read-only and immutable
        results (``array_api_strict``, JAX) refuse the write, which is as good.
        """
        xp = self._foreign(array_type)
        n = self._n
        if n < 2:
            pytest.skip("needs two replicas or more")
        values = [v + 1 for v in _random(n, "float32", (n, 2))]
        rows = [[xp.asarray(values[r])] for r in range(n)]
        inputs = [_host(row[0]).copy() for row in rows]
        if kind == "all_reduce":
            call = self.backend.all_reduce(ReduceOp.SUM, rows)
        elif kind == "all_gather":
            call = self.backend.all_gather(rows, 0)
        elif kind == "reduce_scatter":
            call = self.backend.reduce_scatter(ReduceOp.SUM, rows, 0)
        else:
            call = self.backend.broadcast(rows[0], n)
        results = self._check_layout(self._run(lambda: call), n, 1)
        before = [_host(row[0]).copy() for row in results]
        try:
            results[0][0][...] = 0  # type: ignore[index]
        except (TypeError, ValueError, RuntimeError, AttributeError):
            return  # read-only or immutable results: nothing can be written
        for r in range(1, n):
            np.testing.assert_array_equal(
                _host(results[r][0]),
                before[r],
                err_msg=f"{kind}: writing replica 0's {array_type} changed replica {r}'s",
            )
        for r, row in enumerate(rows):
            np.testing.assert_array_equal(
                _host(row[0]), inputs[r], err_msg=f"{kind}: writing a result changed input {r}"
            )

    @pytest.mark.parametrize("array_type", list(FOREIGN))
    def test_foreign_and_numpy_inputs_are_a_mismatch(self, array_type: str) -> None:
        """Replicas passing numpy and foreign arrays get a ``CollectiveMismatchError`` naming both."""
        xp = self._foreign(array_type)
        self._check_mixed(lambda r: xp if r == self._n - 1 else np, array_type, "numpy.ndarray")

    def test_two_foreign_types_are_a_mismatch(self) -> None:
        """JAX and ``array_api_strict`` inputs to one collective: a mismatch naming both."""
        jnp = self._foreign("jax.Array")
        strict = self._foreign("array_api_strict.Array")
        self._check_mixed(
            lambda r: jnp if r == self._n - 1 else strict, "jax.Array", "array_api_strict.Array"
        )

    def _check_mixed(self, namespace: Callable[[int], Any], last: str, others: str) -> None:
        """Run an all_reduce where the last replica's namespace differs; check the error."""
        n = self._n
        if n < 2:
            pytest.skip("needs two replicas or more")
        strategy = asyncreplica.MirroredStrategy(list(self.devices), backend=self.backend)
        arrays = _random(n, "float32", (3,))

        async def step(r: object) -> object:
            ctx = asyncreplica.get_replica_context()
            assert ctx is not None
            rid = ctx.replica_id_in_sync_group
            return await ctx.all_reduce(ReduceOp.SUM, namespace(rid).asarray(arrays[rid]))

        with pytest.raises(asyncreplica.CollectiveMismatchError) as info:
            self._run(lambda: strategy.run(step, args=(PerReplica(list(range(n))),)))
        message = str(info.value)
        assert "array type" in message, message
        assert f"replica {n - 1} passed {last}" in message, message
        assert others in message, message

    # -- end to end ------------------------------------------------------------------------

    def test_strategy_runs_a_step_that_all_reduces_and_all_gathers(self) -> None:
        """``MirroredStrategy(devices, backend=...)`` runs a step through this backend."""
        n = self._n
        strategy = asyncreplica.MirroredStrategy(list(self.devices), backend=self.backend)
        assert strategy.backend is self.backend
        ys = [np.asarray([r + 1.0, 2.0 * r, 0.5], dtype=np.float32) for r in range(n)]
        xs = _random(n, "int64", lambda r: (2, r + 1))  # uneven along the last axis

        async def step(x: object, y: object) -> tuple[object, object, object]:
            ctx = asyncreplica.get_replica_context()
            assert ctx is not None, "get_replica_context() is None inside Strategy.run"
            total = await ctx.all_reduce(ReduceOp.SUM, y)
            mean = await ctx.all_reduce("mean", y)
            gathered = await ctx.all_gather(x, axis=-1)
            return total, mean, gathered

        args = (PerReplica(self._on_replicas(xs)), PerReplica(self._on_replicas(ys)))
        total, mean, gathered = self._run(lambda: strategy.run(step, args=args))
        expected = {
            "all_reduce(SUM)": (total, _fold(ReduceOp.SUM, ys)),
            "all_reduce(MEAN)": (mean, _fold(ReduceOp.MEAN, ys)),
            "all_gather(axis=-1)": (gathered, np.concatenate(xs, axis=-1)),
        }
        for what, (value, want) in expected.items():
            if n > 1:  # one replica's result is returned as it is, as in TensorFlow
                assert isinstance(value, PerReplica), f"{what} did not give one result per replica"
            components = strategy.experimental_local_results(value)
            assert len(components) == n
            for r, component in enumerate(components):
                self._check(component, want, f"{what} on replica {r}")

    def test_strategy_reduce_and_gather_use_the_backend(self) -> None:
        """``Strategy.reduce`` (uneven MEAN along axis 0) and ``Strategy.gather`` go through it."""
        n = self._n
        strategy = asyncreplica.MirroredStrategy(list(self.devices), backend=self.backend)
        arrays = [np.arange(r + 1, dtype=np.int64) + 10 * r for r in range(n)]
        value = PerReplica(self._on_replicas(arrays))
        mean = self._run(lambda: strategy.reduce(ReduceOp.MEAN, value, axis=0))
        gathered = self._run(lambda: strategy.gather(value, axis=0))
        joined = np.concatenate(arrays)
        self._check(mean, np.asarray(joined.sum() / joined.size), "strategy.reduce(MEAN, axis=0)")
        self._check(gathered, joined, "strategy.gather(axis=0)")


def _flat(rows: Rows) -> list[object]:
    return [leaf for row in rows for leaf in row]


# Tracebacks, repr and help() name the module to import the class from (pickle finds it
# there too, through its __getattr__).
BackendConformanceTests.__module__ = "asyncreplica.testing"
