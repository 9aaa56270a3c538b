"""Arrays of other libraries on the numpy backend: same library in, same library out.

JAX and array_api_strict are in ``[test]``; PyTorch tests run where torch is installed.
"""

from __future__ import annotations

import ctypes
import importlib.util
import types
from collections.abc import Callable
from typing import Any

import anyio
import numpy as np
import pytest
from asyncreplica_numpy import NumpyBackend
from asyncreplica_numpy._foreign import library_of, to_host

import asyncreplica as ar
from asyncreplica.abc import LeafSpec, ReduceOp

DEVICES = ["CPU:0", "CPU:1", "CPU:2"]


def _have(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _numpy(a: np.ndarray) -> Any:
    return a


def _strict(a: np.ndarray) -> Any:
    import array_api_strict as xp

    return xp.asarray(a)


def _jax(a: np.ndarray) -> Any:
    import jax.numpy as jnp

    return jnp.asarray(a)


def _torch(a: np.ndarray) -> Any:
    import torch

    return torch.from_numpy(a.copy())


# (array type as the signature names it, constructor, module), one per library.
LIBRARIES: list[Any] = [
    pytest.param((None, _numpy), id="numpy"),
    pytest.param(
        ("array_api_strict.Array", _strict),
        id="array_api_strict",
        marks=pytest.mark.skipif(not _have("array_api_strict"), reason="array_api_strict missing"),
    ),
    pytest.param(
        ("jax.Array", _jax),
        id="jax",
        marks=pytest.mark.skipif(not _have("jax"), reason="jax missing (pip install 'jax[cpu]')"),
    ),
    pytest.param(
        ("torch.Tensor", _torch),
        id="torch",
        marks=pytest.mark.skipif(
            not _have("torch"), reason="torch is not installed (too heavy for CI)"
        ),
    ),
]


def _host(x: object) -> np.ndarray:
    return np.asarray(np.from_dlpack(x))  # type: ignore[arg-type]


def _same_type(result: object, made: Callable[[np.ndarray], Any]) -> None:
    expected = type(made(np.zeros(1, np.float32)))
    assert type(result) is expected, f"{type(result)} is not {expected}"


def _run(step: Callable[..., Any], *args: Any) -> tuple[Any, ...]:
    """Each replica's result of ``step``."""
    strategy = ar.MirroredStrategy(DEVICES)

    async def main() -> Any:
        return await strategy.run(step, args=args)

    return strategy.experimental_local_results(anyio.run(main))


def _inputs(make: Callable[[np.ndarray], Any], shape: tuple[int, ...] = (6,)) -> ar.PerReplica:
    size = int(np.prod(shape))
    return ar.PerReplica(
        [make(np.arange(size, dtype=np.float32).reshape(shape) + r) for r in range(len(DEVICES))]
    )


@pytest.fixture(params=LIBRARIES)
def library(request: pytest.FixtureRequest) -> tuple[str | None, Callable[[np.ndarray], Any]]:
    return request.param  # type: ignore[no-any-return]


# describe -------------------------------------------------------------------------------------


def test_describe_names_the_array_type(library: Any) -> None:
    name, make = library
    spec = NumpyBackend(["CPU:0"]).describe(make(np.zeros((2, 3), np.float32)))
    assert spec == LeafSpec((2, 3), "float32", array_type=name)
    assert str(spec) == ("float32[2,3]" if name is None else f"{name}(float32[2,3])")


def test_numpy_specs_are_unchanged() -> None:
    # Pure-numpy signatures are exactly what they were: no array type.
    spec = NumpyBackend(["CPU:0"]).describe(np.zeros(3, np.float32))
    assert spec == LeafSpec((3,), "float32")
    assert spec.array_type is None
    assert tuple(spec) == ((3,), "float32", False, None)


# round trips through the strategy -------------------------------------------------------------


def test_all_reduce_nest_round_trip(library: Any) -> None:
    _, make = library

    async def step(x: Any) -> Any:
        ctx = ar.get_replica_context()
        return await ctx.all_reduce("sum", {"w": x, "b": [x, x]})

    out = _run(step, _inputs(make))
    expected = sum(np.arange(6, dtype=np.float32) + r for r in range(3))
    for r in range(3):
        result = out[r]
        for leaf in (result["w"], *result["b"]):
            _same_type(leaf, make)
            np.testing.assert_array_equal(_host(leaf), expected)


@pytest.mark.parametrize("op", ["mean", "max", "min", "prod"])
def test_all_reduce_ops(library: Any, op: str) -> None:
    _, make = library

    async def step(x: Any) -> Any:
        return await ar.get_replica_context().all_reduce(op, x)

    out = _run(step, _inputs(make))
    parts = [np.arange(6, dtype=np.float32) + r for r in range(3)]
    ref = NumpyBackend(DEVICES)
    expected = anyio.run(ref.all_reduce, ReduceOp.parse(op), [[p] for p in parts])[0][0]
    for r in range(3):
        _same_type(out[r], make)
        np.testing.assert_array_equal(_host(out[r]), expected)


def test_all_gather_round_trip(library: Any) -> None:
    _, make = library

    async def step(x: Any) -> Any:
        return await ar.get_replica_context().all_gather(x, axis=0)

    out = _run(step, _inputs(make, (2, 2)))
    expected = np.concatenate(
        [np.arange(4, dtype=np.float32).reshape(2, 2) + r for r in range(3)], axis=0
    )
    for r in range(3):
        _same_type(out[r], make)
        np.testing.assert_array_equal(_host(out[r]), expected)


def test_broadcast_round_trip(library: Any) -> None:
    _, make = library

    async def step(x: Any) -> Any:
        return await ar.get_replica_context().broadcast(x, source=1)

    out = _run(step, _inputs(make))
    for r in range(3):
        _same_type(out[r], make)
        np.testing.assert_array_equal(_host(out[r]), np.arange(6, dtype=np.float32) + 1)


def test_reduce_scatter_round_trip(library: Any) -> None:
    _, make = library

    async def step(x: Any) -> Any:
        return await ar.get_replica_context().reduce_scatter("sum", x, axis=0)

    out = _run(step, _inputs(make))
    total = sum(np.arange(6, dtype=np.float32) + r for r in range(3))
    for r in range(3):
        _same_type(out[r], make)
        np.testing.assert_array_equal(_host(out[r]), total[2 * r : 2 * r + 2])


def test_merge_call_reduce_and_gather(library: Any) -> None:
    _, make = library

    async def merge_fn(strategy: ar.Strategy, value: Any) -> Any:
        total = await strategy.reduce("sum", value, axis=None)
        joined = await strategy.gather(value, axis=0)
        return total, joined

    async def step(x: Any) -> Any:
        return await ar.get_replica_context().merge_call(merge_fn, args=(x,))

    out = _run(step, _inputs(make))
    parts = [np.arange(6, dtype=np.float32) + r for r in range(3)]
    for r in range(3):
        total, joined = out[r]
        _same_type(total, make)
        _same_type(joined, make)
        np.testing.assert_array_equal(_host(total), sum(parts))
        np.testing.assert_array_equal(_host(joined), np.concatenate(parts))


# checks ---------------------------------------------------------------------------------------


def _foreign_libraries() -> list[Any]:
    return [p for p in LIBRARIES if p.id != "numpy"]


@pytest.mark.parametrize("library", _foreign_libraries())
def test_mixed_array_types_are_a_mismatch(library: Any) -> None:
    name, make = library

    async def step() -> Any:
        ctx = ar.get_replica_context()
        r = ctx.replica_id_in_sync_group
        value = np.ones(3, np.float32) if r == 0 else make(np.ones(3, np.float32))
        return await ctx.all_reduce("sum", value)

    with pytest.raises(ar.CollectiveMismatchError) as info:
        _run(step)
    message = str(info.value)
    assert "array type differs" in message
    assert name in message
    assert "numpy.ndarray" in message
    assert "replica 0 passed" in message


def test_two_foreign_types_are_a_mismatch() -> None:
    pytest.importorskip("jax", reason="jax missing (pip install 'jax[cpu]')")
    pytest.importorskip("array_api_strict", reason="array_api_strict missing")

    async def step() -> Any:
        ctx = ar.get_replica_context()
        make = _jax if ctx.replica_id_in_sync_group == 2 else _strict
        return await ctx.all_reduce("sum", [make(np.ones(2, np.float32))])

    with pytest.raises(ar.CollectiveMismatchError) as info:
        _run(step)
    message = str(info.value)
    assert "jax.Array" in message
    assert "array_api_strict.Array" in message
    assert "replica 2 passed jax.Array" in message


# bad input ------------------------------------------------------------------------------------


class _Opaque:
    pass


def test_unsupported_leaf_names_replica_path_and_type() -> None:
    async def step() -> Any:
        ctx = ar.get_replica_context()
        leaf: object = _Opaque() if ctx.replica_id_in_sync_group == 1 else np.ones(2)
        return await ctx.all_reduce("sum", {"a": [np.ones(2), leaf]})

    with pytest.raises(TypeError) as info:
        _run(step)
    message = str(info.value)
    assert "replica 1" in message
    assert "value['a'][1]" in message
    assert "_Opaque" in message
    assert "array API standard or DLPack" in message


def test_unsupported_single_leaf_names_replica_and_type() -> None:
    async def step() -> Any:
        return await ar.get_replica_context().all_reduce("sum", _Opaque())

    for _ in range(2):  # the second time the leaf type takes the runtime's one-leaf path
        with pytest.raises(TypeError, match=r"replica \d passed value of type .*_Opaque"):
            _run(step)


class _FakeNamespace:
    __name__ = "fake_gpu_lib"


class _CudaArray:
    """An array-API object whose DLPack device is CUDA (no GPU needed)."""

    shape = (3,)
    device = "cuda:0"

    def __array_namespace__(self, api_version: str | None = None) -> Any:
        return _FakeNamespace()

    def __dlpack_device__(self) -> tuple[int, int]:
        return (2, 0)

    def __dlpack__(self, **kwargs: object) -> object:
        raise AssertionError("never exported: the device is checked first")


def test_array_on_a_gpu_is_a_backend_error() -> None:
    with pytest.raises(ar.BackendError, match=r"CUDA.*cupy backend.*asyncreplica\[gpu\]"):
        NumpyBackend(["CPU:0"]).describe(_CudaArray())


# zero-copy ------------------------------------------------------------------------------------


def test_strict_input_and_output_are_zero_copy() -> None:
    pytest.importorskip("array_api_strict", reason="array_api_strict missing")
    import array_api_strict as xp

    x = xp.asarray(np.arange(4, dtype=np.float32))
    library = library_of(x)
    assert library is not None
    # In: the numpy view shares the array's buffer.
    assert to_host(x, library).ctypes.data == _host(x).ctypes.data
    # Out: every replica's result is a view of one shared, read-only buffer.
    backend = NumpyBackend(DEVICES)
    out = anyio.run(backend.all_reduce, ReduceOp.SUM, [[x], [x], [x]])
    addresses = {_host(row[0]).ctypes.data for row in out}
    assert len(addresses) == 1
    assert len({id(row[0]) for row in out}) == 3
    with pytest.raises(ValueError, match="read-only"):
        out[0][0][0] = 1.0


def test_jax_input_is_zero_copy() -> None:
    pytest.importorskip("jax", reason="jax missing (pip install 'jax[cpu]')")
    import jax.numpy as jnp

    x = jnp.arange(256, dtype=jnp.float32)
    library = library_of(x)
    assert library is not None
    assert to_host(x, library).ctypes.data == x.unsafe_buffer_pointer()


def test_jax_output_is_one_copy_shared_by_the_replicas() -> None:
    # JAX cannot import the backend's read-only buffer through DLPack: each result is
    # copied once, into an aligned buffer every replica's (immutable) JAX array views.
    pytest.importorskip("jax", reason="jax missing (pip install 'jax[cpu]')")
    import jax.numpy as jnp

    backend = NumpyBackend(DEVICES)
    x = jnp.arange(256, dtype=jnp.float32)
    for _ in range(2):  # the first call learns that JAX refuses read-only buffers
        out = anyio.run(backend.all_reduce, ReduceOp.SUM, [[x], [x], [x]])
        pointers = {row[0].unsafe_buffer_pointer() for row in out}  # type: ignore[attr-defined]
        assert len(pointers) == 1
        assert len({id(row[0]) for row in out}) == 3
        for row in out:
            np.testing.assert_array_equal(_host(row[0]), 3 * np.arange(256, dtype=np.float32))


def test_jax_reduce_scatter_chunks_are_distinct() -> None:
    pytest.importorskip("jax", reason="jax missing (pip install 'jax[cpu]')")
    import jax.numpy as jnp

    backend = NumpyBackend(DEVICES)
    x = jnp.arange(6, dtype=jnp.float32)
    out = anyio.run(backend.reduce_scatter, ReduceOp.SUM, [[x], [x], [x]], 0)
    for r, row in enumerate(out):
        np.testing.assert_array_equal(_host(row[0]), 3 * np.arange(2 * r, 2 * r + 2))


_NUMPY_ONLY = """
import sys, anyio, numpy as np
import asyncreplica as ar

async def step():
    ctx = ar.get_replica_context()
    a = await ctx.all_reduce("sum", np.ones(3, np.float32))
    b = await ctx.all_reduce("sum", [np.ones(3), np.ones(2), 1.0, {"k": np.int32(2)}])
    c = await ctx.all_gather(np.ones((1, 2)), axis=0)
    return a, b, c

strategy = ar.MirroredStrategy(["CPU:0", "CPU:1"])
anyio.run(strategy.run, step)
loaded = sorted(m for m in sys.modules if m.startswith("array_api"))
assert not loaded, loaded
"""


def test_numpy_programs_never_import_array_api_compat() -> None:
    # The numpy paths decide on type(x) is np.ndarray (or a number) before anything else.
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-c", _NUMPY_ONLY], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr


def test_array_type_is_compared_by_the_ledger() -> None:
    from asyncreplica._core._match import differing_fields
    from asyncreplica.abc import CollectiveKind, Signature

    def sig(spec: LeafSpec) -> Signature:
        return Signature(CollectiveKind.ALL_REDUCE, ReduceOp.SUM, leaves=(spec,))

    numpy_spec = LeafSpec((3,), "float32")
    jax_spec = LeafSpec((3,), "float32", array_type="jax.Array")
    assert differing_fields(sig(numpy_spec), sig(jax_spec), check_call_sites=True) == (
        "array type",
    )
    assert differing_fields(sig(jax_spec), sig(jax_spec), check_call_sites=True) == ()


# cost -----------------------------------------------------------------------------------------


class _Counted:
    """An array-API array (array_api_strict's namespace, DLPack) counting its exports."""

    exports = 0

    def __init__(self, array: np.ndarray) -> None:
        self._wrapped = array

    def __array_namespace__(self, api_version: str | None = None) -> Any:
        import array_api_strict

        return array_api_strict

    def __dlpack__(self, **kwargs: Any) -> Any:
        type(self).exports += 1
        return self._wrapped.__dlpack__(**kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._wrapped.__dlpack_device__()  # type: ignore[no-any-return]

    @property
    def shape(self) -> tuple[int, ...]:
        return self._wrapped.shape

    @property
    def dtype(self) -> Any:
        return self._wrapped.dtype


@pytest.mark.skipif(not _have("array_api_strict"), reason="array_api_strict missing")
@pytest.mark.parametrize("leaves", [1, 2])
def test_a_dlpack_leaf_is_exported_once_by_describe_and_once_by_the_collective(
    leaves: int,
) -> None:
    # Nothing is kept from describe for the collective (a failed collective would keep
    # it): a library reached through DLPack only is exported twice. JAX and
    # array_api_strict give their numpy view without an export (see to_host).
    backend = NumpyBackend(DEVICES)
    values = [
        [_Counted(np.arange(4, dtype=np.float32) + r + j) for j in range(leaves)]
        for r in range(len(DEVICES))
    ]
    _Counted.exports = 0
    for row in values:
        backend.describe_leaves(row)
    assert _Counted.exports == len(DEVICES) * leaves
    out = anyio.run(backend.all_reduce, ReduceOp.SUM, values)
    assert _Counted.exports == 2 * len(DEVICES) * leaves
    expected = sum(np.arange(4, dtype=np.float32) + r for r in range(len(DEVICES)))
    for j in range(leaves):
        np.testing.assert_array_equal(_host(out[0][j]), expected + len(DEVICES) * j)


@pytest.mark.skipif(not _have("array_api_strict"), reason="array_api_strict missing")
def test_strict_leaf_is_held_as_its_own_numpy_array() -> None:
    import array_api_strict as xp

    x = xp.asarray(np.arange(6, dtype=np.float32))
    library = library_of(x)
    assert library is not None
    # No DLPack round trip: the numpy array inside (guarded, see to_host).
    assert to_host(x, library) is x._array


@pytest.mark.skipif(not _have("array_api_strict"), reason="array_api_strict missing")
def test_a_failed_collective_retains_no_foreign_leaf() -> None:
    # Every replica's leaves are described before the ledger finds the mismatch; the
    # collective never reaches the backend. The backend must keep nothing of them.
    import gc
    import weakref

    import array_api_strict as xp

    strategy = ar.MirroredStrategy(DEVICES)
    refs: list[weakref.ref[Any]] = []

    async def step() -> None:
        ctx = ar.get_replica_context()
        assert ctx is not None
        r = ctx.replica_id_in_sync_group
        x = xp.asarray(np.zeros(4 + (r == 1), np.float32))  # replica 1: another shape
        refs.append(weakref.ref(x))
        await ctx.all_reduce(ReduceOp.SUM, [x])

    async def main() -> None:
        with pytest.raises(ar.CollectiveMismatchError, match="shape"):
            await strategy.run(step)

    anyio.run(main)
    gc.collect()
    assert len(refs) >= 2  # replicas 0 and 1 met; replica 2 may be cancelled before
    alive = [r for r, ref in enumerate(refs) if ref() is not None]
    assert not alive, f"leaves of arrivals {alive} are still held"


@pytest.mark.parametrize("direct", [True, False], ids=["constructor", "public"])
def test_large_jax_result_is_reduced_into_the_buffer_jax_imports(
    monkeypatch: pytest.MonkeyPatch, direct: bool
) -> None:
    # 1 MiB: reduced straight into an aligned buffer that JAX imports zero-copy, so
    # every replica's result is on the buffer the backend wrote, never a pooled one.
    pytest.importorskip("jax", reason="jax missing (pip install 'jax[cpu]')")
    import asyncreplica_numpy._backend as numpy_backend
    import jax.numpy as jnp

    made: list[int] = []
    aligned_empty = numpy_backend.aligned_empty

    def spy(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        out = aligned_empty(shape, dtype)
        made.append(out.ctypes.data)
        return out

    monkeypatch.setattr(numpy_backend, "aligned_empty", spy)
    # Both ways of giving each replica its own array (see _another): the guarded
    # constructor where this JAX has it, and the public function otherwise.
    import asyncreplica_numpy._foreign as foreign

    monkeypatch.setattr(foreign, "_JAX_DIRECT", [] if direct else [False])
    backend = NumpyBackend(DEVICES)
    size = (1 << 20) // 4
    xs = [jnp.arange(size, dtype=jnp.float32) + r for r in range(len(DEVICES))]
    expected = sum(np.arange(size, dtype=np.float32) + r for r in range(len(DEVICES)))
    held = []
    for step in range(3):
        out = anyio.run(backend.all_reduce, ReduceOp.SUM, [[x] for x in xs])
        assert len(made) == step + 1
        assert {row[0].unsafe_buffer_pointer() for row in out} == {made[-1]}
        assert len({id(row[0]) for row in out}) == len(DEVICES)  # one array per replica
        assert all(type(row[0]) is type(xs[0]) for row in out)
        held.append(out[0][0])
    assert not backend._pool  # the buffers belong to JAX: nothing pooled
    assert foreign._JAX_DIRECT[0] is direct  # this JAX's constructor passes the guard
    for result in held:  # later steps never wrote into an earlier step's result
        np.testing.assert_array_equal(np.asarray(result), expected)


def test_strict_results_are_full_array_api_strict_arrays() -> None:
    # Results after the first of a dtype are built on its template (see _strict_array):
    # the same type, dtype and device as from_dlpack's, on the shared read-only buffer.
    pytest.importorskip("array_api_strict", reason="array_api_strict missing")
    import array_api_strict as xp

    backend = NumpyBackend(DEVICES)
    for dtype in (xp.float32, xp.int64, xp.float32):
        xs = [xp.asarray(np.arange(5) + r, dtype=dtype) for r in range(len(DEVICES))]
        out = anyio.run(backend.all_reduce, ReduceOp.SUM, [[x] for x in xs])
        reference = xp.from_dlpack(np.arange(5, dtype=np.dtype(str(dtype).split(".")[-1])))
        for row in out:
            result = row[0]
            assert type(result) is type(reference)
            assert result.dtype == dtype
            assert result.device == reference.device
            assert xp.all(result == xp.asarray(3 * np.arange(5) + 3, dtype=dtype))
            with pytest.raises(ValueError, match="read-only"):
                result[0] = 1
        assert len({_host(row[0]).ctypes.data for row in out}) == 1


def _lax_from_dlpack(x: Any) -> _Lax:
    array = np.from_dlpack(x)  # read-only where x is
    # What a library with no read-only arrays does: the same memory, writable.
    memory = (ctypes.c_char * array.nbytes).from_address(array.ctypes.data)
    writable = np.frombuffer(memory, array.dtype).reshape(array.shape)
    return _Lax(writable)


def _lax_asarray(x: Any, copy: bool | None = None) -> _Lax:
    return _Lax(np.array(x, copy=copy))


# A library whose from_dlpack imports a read-only buffer as a writable array.
_LAX = types.ModuleType("lax")
_LAX.from_dlpack = _lax_from_dlpack  # type: ignore[attr-defined]
_LAX.asarray = _lax_asarray  # type: ignore[attr-defined]


class _Lax:
    def __init__(self, array: np.ndarray) -> None:
        self.data = array

    def __array_namespace__(self, api_version: str | None = None) -> Any:
        return _LAX

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self.data.__dlpack__(**kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self.data.__dlpack_device__()  # type: ignore[no-any-return]


def test_a_library_without_read_only_arrays_gets_a_copy_per_replica() -> None:
    # PyTorch has no read-only tensors: a zero-copy import of the shared result would
    # let one replica write into every replica's result (docs/concepts.md).
    backend = NumpyBackend(DEVICES)
    xs = [_Lax(np.arange(4, dtype=np.float32) + r) for r in range(len(DEVICES))]
    out = anyio.run(backend.all_reduce, ReduceOp.SUM, [[x] for x in xs])
    results = [row[0].data for row in out]
    assert all(a.flags.writeable for a in results)
    assert len({a.ctypes.data for a in results}) == len(DEVICES)
    results[0][0] = -1.0
    for a in results[1:]:
        np.testing.assert_array_equal(a, 3 * np.arange(4, dtype=np.float32) + 3)
