"""The cupy backend's routing of other libraries' arrays, without a GPU.

Which leaves are foreign and how they are held (:func:`foreign_of`), what ``describe``
says about them, and how each replica's CuPy result is given back in its input's type
and on its device (:func:`restore`): with stand-ins for CuPy's results and for a CUDA
array library (``fakegpu``), and with real JAX and ``array_api_strict`` CPU arrays.
The same paths run on a GPU in ``test_cupy_gpu.py`` (and the conformance suite).
"""

from __future__ import annotations

import sys
from types import ModuleType, SimpleNamespace
from typing import Any

import numpy as np
import pytest
from _cupy_fakes import FAKEGPU, FakeGpuNamespace, FakeGpuTensor, fake_cupy, hide_real_cupy
from asyncreplica_cupy import CupyBackend
from asyncreplica_cupy._routing import Foreign, foreign_of, from_gpu, restore

import asyncreplica as ar
from asyncreplica.abc import LeafSpec


class _Result:
    """A CuPy result as the routing sees it: a buffer on a GPU, exported through DLPack."""

    def __init__(self, host: np.ndarray[Any, Any], gpu: int, ptr: int) -> None:
        self.host, self.shape, self.strides, self.dtype = host, host.shape, host.strides, host.dtype
        self.device = SimpleNamespace(id=gpu)
        self.data = SimpleNamespace(ptr=ptr)
        self.copies = 0

    def __dlpack__(self, **kwargs: object) -> object:
        raise AssertionError("the stand-in libraries never export a result")

    def __dlpack_device__(self) -> tuple[int, int]:
        return (2, self.device.id)

    def copy(self) -> _Result:
        self.copies += 1
        return _Result(self.host.copy(), self.device.id, self.data.ptr + 4096)


class _Cupy(ModuleType):
    """``cupy`` as the routing uses it: ``asnumpy`` (counted) and ``cuda.Device``."""

    def __init__(self) -> None:
        super().__init__("cupy")
        self.ndarray = _Result
        self.to_host: list[int] = []
        self.devices: list[int] = []
        cp = self

        class Device:
            def __init__(self, gpu: int) -> None:
                self.gpu = gpu

            def __enter__(self) -> None:
                cp.devices.append(self.gpu)

            def __exit__(self, *exc: object) -> None:
                pass

        self.cuda = SimpleNamespace(Device=Device)

    def asnumpy(self, a: _Result, stream: object = None) -> np.ndarray[Any, Any]:
        assert stream == f"ours{a.device.id}", "host copies run on the backend's stream"
        assert self.devices[-1] == a.device.id, "with the array's GPU current"
        self.to_host.append(a.data.ptr)
        return a.host.copy()


@pytest.fixture
def cp(monkeypatch: pytest.MonkeyPatch) -> _Cupy:
    module = _Cupy()
    monkeypatch.setitem(sys.modules, "cupy", module)
    return module


@pytest.fixture
def fakegpu() -> FakeGpuNamespace:
    FAKEGPU.refuse = 0
    FAKEGPU.imported.clear()
    return FAKEGPU


def _tensor(ns: FakeGpuNamespace, gpu: int, values: Any = (1.0, 2.0)) -> FakeGpuTensor:
    return FakeGpuTensor(_Result(np.asarray(values, np.float32), gpu, 0x1000 * (gpu + 1)), ns)


class _DeviceArray:
    """An array-API object on DLPack device ``(kind, 0)``."""

    def __init__(self, kind: int, device: str = "dev:0") -> None:
        self.kind, self.device = kind, device

    def __array_namespace__(self, api_version: str | None = None) -> Any:
        return SimpleNamespace(__name__="otherlib")

    def __dlpack_device__(self) -> tuple[int, int]:
        return (self.kind, 0)

    def __dlpack__(self, **kwargs: object) -> object:
        raise AssertionError("never exported: the device is checked first")


_DeviceArray.__module__ = "otherlib"


# Which leaves are foreign ----------------------------------------------------------------------


@pytest.mark.usefixtures("cp")
def test_cupy_numpy_and_numbers_are_not_foreign(fakegpu: FakeGpuNamespace) -> None:
    result = _Result(np.zeros(2, np.float32), 0, 1)
    for value in (result, np.zeros(2), np.float32(1), 1.5, 3):
        assert foreign_of(value) is None, value


def test_cuda_and_host_arrays_of_other_libraries_are_foreign(fakegpu: FakeGpuNamespace) -> None:
    kind = foreign_of(_tensor(fakegpu, 1))
    assert kind is not None
    assert (kind.library.name, kind.on_gpu) == ("fakegpu.FakeGpuTensor", True)
    managed = foreign_of(_DeviceArray(13))  # kDLCUDAManaged: a kernel reads it in place
    assert managed is not None
    assert managed.on_gpu
    pinned = foreign_of(_DeviceArray(3))  # kDLCUDAHost: pinned host memory
    assert pinned is not None
    assert not pinned.on_gpu
    jax = pytest.importorskip("jax", reason="jax missing (pip install 'jax[cpu]')")
    # On the CPU device explicitly: where JAX has a GPU, that is its default device.
    host = foreign_of(jax.device_put(jax.numpy.zeros(2), jax.devices("cpu")[0]))
    assert host is not None
    assert (host.library.name, host.on_gpu) == ("jax.Array", False)


@pytest.mark.parametrize(("kind", "name"), [(10, "ROCm"), (8, "Metal"), (4, "OpenCL")])
def test_array_on_a_device_no_backend_serves_is_a_backend_error(kind: int, name: str) -> None:
    with pytest.raises(ar.BackendError) as info:
        foreign_of(_DeviceArray(kind, f"{name.lower()}:0"))
    message = str(info.value)
    assert f"a otherlib._DeviceArray on {name} device {name.lower()}:0" in message, message
    assert "reached the cupy backend, which holds values on CUDA GPUs" in message, message
    assert f"No asyncreplica backend serves {name} devices yet" in message, message
    assert "move the value to the CPU first" in message, message


@pytest.mark.usefixtures("two_gpus")
def test_describe_names_foreign_array_types() -> None:
    backend = CupyBackend(["GPU:0", "GPU:1"])
    strict = pytest.importorskip("array_api_strict", reason="array_api_strict missing")
    value = strict.asarray(np.zeros((2, 3), np.float32))
    assert backend.describe(value) == LeafSpec(
        (2, 3), "float32", array_type="array_api_strict.Array"
    )
    assert backend.describe(np.zeros((2, 3), np.float32)) == LeafSpec((2, 3), "float32")
    with pytest.raises(ar.BackendError, match=r"ROCm.*reached the cupy backend"):
        backend.describe(_DeviceArray(10))


@pytest.fixture
def two_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    hide_real_cupy(monkeypatch)
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy(2))


# Results back in the input's type ------------------------------------------------------------


def test_cuda_results_are_imported_zero_copy_on_each_replica(
    cp: _Cupy, fakegpu: FakeGpuNamespace
) -> None:
    shared = _Result(np.asarray([3.0, 4.0], np.float32), 0, 0xA000)
    other = _Result(np.asarray([3.0, 4.0], np.float32), 1, 0xB000)
    results: list[list[object]] = [[shared, 7], [shared, 7], [other, 7]]
    inputs = [[_tensor(fakegpu, g), 1] for g in (0, 0, 1)]
    kinds = [foreign_of(inputs[0][0]), None]
    out = restore(cp, results, kinds, inputs)
    for r, row in enumerate(out):
        tensor = row[0]
        assert isinstance(tensor, FakeGpuTensor)
        if r == 1:
            # Replica 1 shares replica 0's buffer: a writable tensor library gets a
            # device copy of its own (see the test below), on the same GPU.
            assert tensor.inner is not shared
            assert tensor.inner.data.ptr != shared.data.ptr
        else:
            assert tensor.inner is results[r][0], "not the backend's own result buffer"
        assert tensor.device == inputs[r][0].device
        assert tensor.moved_from is None
        assert row[1] == 7  # a leaf that is not foreign stays as the backend made it
    assert cp.to_host == [], "a CUDA result went through the host"


def test_cuda_result_moves_to_its_input_gpu_except_for_broadcast(
    cp: _Cupy, fakegpu: FakeGpuNamespace
) -> None:
    result = _Result(np.ones(2, np.float32), 0, 0xA000)
    inputs = [[_tensor(fakegpu, 1)]]  # the replica runs on GPU 0; its input is on GPU 1
    kinds = [foreign_of(inputs[0][0])]
    moved = restore(cp, [[result]], kinds, inputs)[0][0]
    assert isinstance(moved, FakeGpuTensor)
    assert (moved.device, moved.moved_from) == ("cuda:1", 0)
    kept = restore(cp, [[result]], kinds, inputs, place_gpu=False)[0][0]
    assert isinstance(kept, FakeGpuTensor)
    assert kept.device == "cuda:0"


def test_a_refused_buffer_is_imported_from_a_fresh_copy(
    cp: _Cupy, fakegpu: FakeGpuNamespace
) -> None:
    chunk = _Result(np.ones(2, np.float32), 1, 0xA004)  # a reduce_scatter chunk, unaligned
    library = foreign_of(_tensor(fakegpu, 1))
    assert library is not None
    fakegpu.refuse = 1
    tensor = from_gpu(cp, chunk, library.library)
    assert isinstance(tensor, FakeGpuTensor)
    assert tensor.inner is not chunk
    assert chunk.copies == 1
    assert cp.devices == [1], "the copy is made on the chunk's GPU"
    fakegpu.refuse = 2
    with pytest.raises(ar.BackendError, match=r"fakegpu.FakeGpuTensor.*from_dlpack refused"):
        from_gpu(cp, chunk, library.library)


@pytest.mark.parametrize("module", ["jax.numpy", "array_api_strict"])
def test_host_results_come_back_once_per_buffer_in_the_input_type(cp: _Cupy, module: str) -> None:
    xp = pytest.importorskip(module, reason=f"{module} missing")
    inputs = [
        [_on_the_host(module, xp.asarray(np.arange(3, dtype=np.float32) + r))] for r in range(3)
    ]
    want = np.arange(3, dtype=np.float32) * 3 + 3
    shared = _Result(want, 0, 0xA000)  # replicas 0 and 1 share GPU 0's result
    results: list[list[object]] = [[shared], [shared], [_Result(want, 1, 0xB000)]]
    kind = foreign_of(inputs[0][0])
    assert isinstance(kind, Foreign)
    out = restore(cp, results, [kind], inputs, stream_of=lambda gpu: f"ours{gpu}")
    assert sorted(cp.to_host) == [0xA000, 0xB000], "one device-to-host copy per buffer"
    for row in out:
        assert type(row[0]) is type(inputs[0][0])
        host = np.from_dlpack(row[0])
        np.testing.assert_array_equal(host, want, strict=True)


def _on_the_host(module: str, array: Any) -> Any:
    """``array`` on the CPU: where JAX has a GPU, that is its default device."""
    if module != "jax.numpy":
        return array
    import jax

    return jax.device_put(array, jax.devices("cpu")[0])


def test_replicas_sharing_a_result_buffer_get_their_own_writable_tensor(
    cp: _Cupy, fakegpu: FakeGpuNamespace
) -> None:
    # Two replicas on GPU 0 get views of one result buffer: a library with writable
    # tensors (not JAX) gets a device copy for the second, so no replica's in-place
    # write changes another's result.
    from asyncreplica_cupy._routing import _from_gpu_column
    from asyncreplica_numpy._foreign import Library

    shared = _Result(np.ones(2, np.float32), 0, 0x1000)
    other = _Result(np.ones(2, np.float32), 1, 0x2000)
    library = Library("faketorch.Tensor", fakegpu)
    out = _from_gpu_column(cp, [shared, shared, other], library)
    assert shared.copies == 1  # the second replica's
    assert other.copies == 0
    assert len(out) == 3
    immutable = Library("jax.Array", fakegpu)
    _from_gpu_column(cp, [shared, shared], immutable)
    assert shared.copies == 1  # JAX arrays are immutable: one buffer is enough
