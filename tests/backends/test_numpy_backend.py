"""The numpy backend: the conformance suite, plus what is specific to numpy."""

from __future__ import annotations

import importlib.metadata
from typing import ClassVar

import anyio
import numpy as np
import pytest
from asyncreplica_numpy import NumpyBackend

import asyncreplica as ar
from asyncreplica._registry import GROUP, load_backend_class
from asyncreplica.abc import Backend, LeafSpec, ReduceOp
from asyncreplica.testing import BackendConformanceTests


class TestNumpyBackend(BackendConformanceTests):
    def make_backend(self, devices: list[str]) -> Backend:
        return NumpyBackend(devices)


class TestNumpyBackendOnOneReplica(BackendConformanceTests):
    """One replica: nothing to combine, so results must still be copies, never the input."""

    devices: ClassVar[list[str]] = ["CPU:0"]

    def make_backend(self, devices: list[str]) -> Backend:
        return NumpyBackend(devices)


# Booleans -------------------------------------------------------------------------------------


def _bools() -> list[list[object]]:
    return [[np.array([True, False, r == 1])] for r in range(3)]


def test_describe_accepts_bool() -> None:
    spec = NumpyBackend(["CPU:0"]).describe(np.array([True, False]))
    assert spec == LeafSpec((2,), "bool")


@pytest.mark.parametrize("op", list(ReduceOp), ids=lambda op: op.value)
def test_all_reduce_rejects_bool(op: ReduceOp) -> None:
    backend = NumpyBackend(["CPU:0", "CPU:1", "CPU:2"])
    with pytest.raises(TypeError, match=r"dtype bool.*astype"):
        anyio.run(backend.all_reduce, op, _bools())


def test_reduce_scatter_rejects_bool() -> None:
    backend = NumpyBackend(["CPU:0", "CPU:1", "CPU:2"])
    values = [[np.array([True, False, True])] for _ in range(3)]
    with pytest.raises(TypeError, match=r"dtype bool"):
        anyio.run(backend.reduce_scatter, ReduceOp.SUM, values, 0)


@pytest.mark.parametrize("axis", [None, (0,)], ids=["axis-None", "axis-(0,)"])
def test_reduce_rejects_bool(axis: tuple[int, ...] | None) -> None:
    backend = NumpyBackend(["CPU:0", "CPU:1"])
    components = [np.array([True, False]), np.array([False, False])]
    with pytest.raises(TypeError, match=r"dtype bool"):
        anyio.run(backend.reduce, ReduceOp.SUM, components, axis)


def test_bool_can_still_be_gathered_and_broadcast() -> None:
    backend = NumpyBackend(["CPU:0", "CPU:1", "CPU:2"])
    gathered = anyio.run(backend.all_gather, _bools(), 0)
    np.testing.assert_array_equal(
        gathered[2][0], [True, False, False, True, False, True, True, False, False]
    )
    copies = anyio.run(backend.broadcast, [np.array([True, False])], 2)
    assert copies[1][0].dtype == np.bool_


@pytest.mark.parametrize("dtype", [">f8", ">i4", ">c16", ">u2", "<f8", "|u1"])
@pytest.mark.parametrize("n", [3, 40_000])  # a small copy and a pooled buffer
def test_broadcast_results_are_in_native_byte_order(dtype: str, n: int) -> None:
    # One rule for every result (asyncreplica.abc.native_order): broadcast kept '>f8'
    # in one process where MultiWorkerMirroredStrategy, all_gather and all_reduce give
    # '<f8' (on a little-endian machine).
    backend = NumpyBackend(["CPU:0", "CPU:1"])
    source = np.arange(n, dtype=dtype)
    copies = anyio.run(backend.broadcast, [source], 2)
    want = np.dtype(dtype).newbyteorder("=") if np.dtype(dtype).byteorder != "|" else dtype
    for copy in copies:
        assert copy[0].dtype.str == np.dtype(want).str
        np.testing.assert_array_equal(copy[0], source)


# Devices --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "devices",
    [["GPU:0"], ["CPU:0", "GPU:0"], ["GPU:0", "GPU:1"]],
    ids=["gpu", "cpu-and-gpu", "two-gpus"],
)
def test_gpu_devices_are_rejected(devices: list[str]) -> None:
    with pytest.raises(ValueError, match=r"CPU only.*GPU:0"):
        NumpyBackend(devices)


def test_strategy_with_numpy_backend_on_a_gpu_is_value_error() -> None:
    with pytest.raises(ValueError, match=r"CPU only"):
        ar.MirroredStrategy(["CPU:0", "GPU:0"], backend="numpy")


def test_python_numbers_and_numpy_scalars_are_accepted() -> None:
    backend = NumpyBackend(["CPU:0", "CPU:1"])
    assert backend.describe(1.5) == LeafSpec((), "float64")
    assert backend.describe(np.float32(1.5)) == LeafSpec((), "float32")
    results = anyio.run(backend.all_reduce, ReduceOp.SUM, [[1.5], [np.float64(2.0)]])
    assert float(results[0][0]) == 3.5  # type: ignore[arg-type]


# Discovery ------------------------------------------------------------------------------------


def test_entry_point_loads_numpy_backend() -> None:
    (entry,) = [ep for ep in importlib.metadata.entry_points(group=GROUP) if ep.name == "numpy"]
    assert entry.value == "asyncreplica_numpy:NumpyBackend"
    assert entry.load() is NumpyBackend
    assert load_backend_class("numpy") is NumpyBackend
    assert NumpyBackend.name == "numpy"


def test_strategy_by_name_uses_numpy_backend() -> None:
    strategy = ar.MirroredStrategy(["CPU:0", "CPU:1"], backend="numpy")
    assert type(strategy.backend) is NumpyBackend
    assert strategy.backend.devices == ("CPU:0", "CPU:1")
