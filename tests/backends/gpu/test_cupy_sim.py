"""The cupy backend's device logic against a recording stand-in for CuPy (no GPU, no CuPy).

``SimCupy`` (``_cupy_fakes.py``) logs which stream each copy, event and wait goes to, and
where and on which thread each kernel is compiled, so the ordering rules of the backend
are checked on any machine: what runs on the user's stream, what waits for what, what
blocks the event loop.
"""

from __future__ import annotations

import sys
import threading
from types import ModuleType, SimpleNamespace
from typing import Any, ClassVar

import anyio
import numpy as np
import pytest
from _cupy_fakes import SimArray, SimCompileException, SimCupy
from asyncreplica_cupy import CupyBackend, _backend
from asyncreplica_cupy._plan import Fold, Route, reduction_folds, reduction_variants

import asyncreplica as ar
from asyncreplica import _registry
from asyncreplica._tools import _doctor
from asyncreplica.abc import Backend, ReduceOp


@pytest.fixture
def sim(monkeypatch: pytest.MonkeyPatch) -> SimCupy:
    cp = SimCupy(gpus=2)
    monkeypatch.setitem(sys.modules, "cupy", cp)
    monkeypatch.setitem(sys.modules, "cupy.cuda", cp.cuda)  # type: ignore[arg-type]
    monkeypatch.setattr(_backend, "_kernels", {})
    monkeypatch.setattr(_backend, "_loaded", set())
    return cp


# Cross-GPU copies of strided arrays ------------------------------------------------------------


def test_strided_source_is_made_contiguous_on_the_backend_stream_before_the_handoff(
    sim: SimCupy,
) -> None:
    backend = CupyBackend(["GPU:0", "GPU:1"])
    work = _backend._Work(backend)
    strided = SimArray(sim, 0, contiguous=False)
    sim.log.clear()
    work.copy_to(strided, 0, 1)
    log = sim.log
    # Nothing of the copy runs on the user's stream, which nothing here orders.
    assert [e for e in log if e[0] == "contiguous"] == [("contiguous", 0, "ours0")]
    handoff = next(e for e in log if e[0] == "record" and e[2] == "ours0" and log.index(e) > 0)
    staged = log.index(("contiguous", 0, "ours0"))
    recorded = log.index(handoff)
    waited = log.index(("wait", "ours1", handoff[1]))
    copied = log.index(("copy", 0, 1, "ours1"))
    assert staged < recorded < waited < copied, log


def test_contiguous_source_is_copied_as_it_is(sim: SimCupy) -> None:
    backend = CupyBackend(["GPU:0", "GPU:1"])
    work = _backend._Work(backend)
    sim.log.clear()
    work.copy_to(SimArray(sim, 0), 0, 1)
    assert not [e for e in sim.log if e[0] == "contiguous"]
    assert ("copy", 0, 1, "ours1") in sim.log


# __cuda_array_interface__ with a stream ---------------------------------------------------------


class _Producer:
    """A foreign GPU array whose producer names its stream (CAI v3)."""

    def __init__(self, stream: int | None, device: int = 1) -> None:
        self.__cuda_array_interface__ = {
            "shape": (4,),
            "typestr": "<f4",
            "data": (4096, False),
            "version": 3,
            "stream": stream,
            "device": device,  # read by SimCupy.asarray only
        }


def test_cai_stream_is_waited_for_with_an_event_not_a_host_sync(sim: SimCupy) -> None:
    backend = CupyBackend(["GPU:0", "GPU:1"])
    work = _backend._Work(backend)
    array = work.to_gpu(_Producer(stream=77), 1)
    assert array.device.id == 1
    assert ("streamSynchronize", 77) not in sim.log  # cupy.asarray never saw the stream
    record = next(e for e in sim.log if e[0] == "record" and e[2] == "external77")
    assert ("wait", "ours1", record[1]) in sim.log
    assert sim.log.index(record) < sim.log.index(("wait", "ours1", record[1]))


def test_cai_without_a_stream_needs_no_wait(sim: SimCupy) -> None:
    backend = CupyBackend(["GPU:0", "GPU:1"])
    _backend._Work(backend).to_gpu(_Producer(stream=None, device=0), 0)
    assert not any(e[0] == "record" and str(e[2]).startswith("external") for e in sim.log)
    assert not any(e[0] == "streamSynchronize" for e in sim.log)


# NCCL communicators: made when the strategy is built -------------------------------------------


class _Comm:
    def __init__(self, gpu: int, destroyed: list[int]) -> None:
        self.gpu, self.destroyed = gpu, destroyed

    def destroy(self) -> None:
        self.destroyed.append(self.gpu)


def _with_nccl(sim: SimCupy, init_all: Any) -> None:
    sim.cuda.nccl = SimpleNamespace(  # type: ignore[attr-defined]
        available=True, NcclCommunicator=SimpleNamespace(initAll=init_all)
    )


def test_communicators_are_made_at_construction_once(sim: SimCupy) -> None:
    calls: list[list[int]] = []
    destroyed: list[int] = []

    def init_all(gpus: list[int]) -> list[_Comm]:
        calls.append(list(gpus))
        return [_Comm(g, destroyed) for g in gpus]

    _with_nccl(sim, init_all)
    backend = CupyBackend(["GPU:1", "GPU:0", "GPU:1"])
    assert calls == [[1, 0]]  # before any collective: initAll holds the GIL while it runs
    assert backend._route(ReduceOp.SUM, "int32") is Route.NCCL
    anyio.run(backend.aclose)
    assert destroyed == [1, 0]
    # Closed: integer reductions still work, by peer copies.
    assert backend._route(ReduceOp.SUM, "int32") is Route.CHAIN
    CupyBackend(["GPU:0", "GPU:0"])  # one GPU: no communicators
    assert calls == [[1, 0]]


def test_communicator_failure_is_a_backend_error_at_construction(sim: SimCupy) -> None:
    def init_all(gpus: list[int]) -> list[_Comm]:
        raise RuntimeError("ncclUnhandledCudaError: Call to CUDA function failed")

    _with_nccl(sim, init_all)
    with pytest.raises(ar.BackendError, match=r"NCCL communicators of GPUs \[0, 1\]") as info:
        CupyBackend(["GPU:0", "GPU:1"])
    assert "NCCL_DEBUG=INFO" in str(info.value)
    assert isinstance(info.value.__cause__, RuntimeError)


def test_without_libnccl_there_are_no_communicators(sim: SimCupy) -> None:
    backend = CupyBackend(["GPU:0", "GPU:1"])
    assert backend._comms is None
    assert backend._route(ReduceOp.SUM, "int32") is Route.CHAIN


# Kernels: compiled off the event loop, before the work starts ----------------------------------


def test_kernels_compile_in_a_worker_thread_once(sim: SimCupy) -> None:
    backend = CupyBackend(["GPU:0", "GPU:1", "GPU:0"])
    values = [[np.ones(4, np.float32), np.ones(2, np.int32)] for _ in range(3)]
    anyio.run(backend._prepare_kernels, ReduceOp.MEAN, values)
    expected = reduction_variants(backend.plan, ReduceOp.MEAN, "float32", Route.CHAIN)
    expected |= reduction_variants(backend.plan, ReduceOp.MEAN, "int32", Route.CHAIN)
    assert {(name, gpu) for name, gpu, _ in sim.compiled} == {
        (v.name, g) for v in expected for g in (0, 1)
    }
    assert threading.current_thread().name not in {thread for _, _, thread in sim.compiled}
    sim.compiled.clear()
    anyio.run(backend._prepare_kernels, ReduceOp.MEAN, values)
    assert sim.compiled == []  # loaded: nothing to do on later calls


def test_complex_and_indexed_slices_compile_what_they_run(sim: SimCupy) -> None:
    backend = CupyBackend(["GPU:0", "GPU:0"])
    complex_values = [[np.ones(2, np.complex64)] for _ in range(2)]
    anyio.run(backend._prepare_kernels, ReduceOp.SUM, complex_values)
    assert sim.compiled == []  # complex values use CuPy's ufuncs
    slices = [
        [ar.IndexedSlices(np.ones((1, 2), np.float64), np.array([r]), (4, 2))] for r in range(2)
    ]
    anyio.run(backend._prepare_kernels, ReduceOp.MEAN, slices)
    assert [name for name, _, _ in sim.compiled] == ["asyncreplica_fold_MEAN_1_mean_float64"]


@pytest.mark.parametrize(
    ("devices", "op"),
    [
        (["GPU:0"] * 3, ReduceOp.MEAN),
        (["GPU:0"] * 20, ReduceOp.SUM),
        (["GPU:0", "GPU:1", "GPU:0"], ReduceOp.MEAN),
        (["GPU:0", "GPU:0", "GPU:1", "GPU:1", "GPU:1"], ReduceOp.MAX),
    ],
)
def test_reduce_dense_runs_the_folds_that_were_compiled(
    sim: SimCupy, monkeypatch: pytest.MonkeyPatch, devices: list[str], op: ReduceOp
) -> None:
    backend = CupyBackend(devices)
    work = _backend._Work(backend)
    folds: list[Fold] = []

    def fold(op: ReduceOp, arrays: list[Any], gpu: int, divide_by: int | None) -> Any:
        folds.append(Fold(gpu, len(arrays), divide_by is not None))
        return arrays[0]

    monkeypatch.setattr(work, "to_gpu", lambda value, gpu: value)
    monkeypatch.setattr(work, "copy_to", lambda array, src, dst: array)
    monkeypatch.setattr(work, "fold", fold)
    work.reduce_dense(op, [np.ones(3, np.float32)] * len(devices))
    route = backend._route(op, "float32")
    assert folds == reduction_folds(backend.plan, op, route)


@pytest.mark.parametrize(
    ("op", "axis", "names"),
    [
        (ReduceOp.SUM, None, ["asyncreplica_fold_SUM_3_plain_int16"]),
        # An integer MEAN: widened to int64, summed exactly, divided once.
        (
            ReduceOp.MEAN,
            None,
            [
                "asyncreplica_fold_MEAN_1_mean_to_float64_int64",
                "asyncreplica_fold_SUM_3_plain_int64",
            ],
        ),
        # Along an axis CuPy first sums each component, widening int16 to int64.
        (
            ReduceOp.MEAN,
            (0,),
            [
                "asyncreplica_fold_MEAN_1_mean_to_float64_int64",
                "asyncreplica_fold_SUM_3_plain_int64",
            ],
        ),
        (ReduceOp.MAX, (0,), ["asyncreplica_fold_MAX_3_plain_int16"]),
    ],
)
def test_strategy_reduce_compiles_its_kernels_first(
    sim: SimCupy, op: ReduceOp, axis: tuple[int, ...] | None, names: list[str]
) -> None:
    variants = _backend._reduce_on_variants(op, 3, "int16", axis)
    assert sorted(v.name for v in variants) == names


# Compile errors are BackendErrors ---------------------------------------------------------------


def test_compile_exception_while_preparing_is_a_backend_error(sim: SimCupy) -> None:
    sim.compile_error = SimCompileException('kern.cu(3): error: identifier "__half" is undefined')
    backend = CupyBackend(["GPU:0", "GPU:0"])
    values = [[np.ones(2, np.float16)] for _ in range(2)]
    with pytest.raises(ar.BackendError) as info:
        anyio.run(backend._prepare_kernels, ReduceOp.SUM, values)
    message = str(info.value)
    assert "could not be compiled" in message
    assert 'identifier "__half" is undefined' in message
    assert "cupy-cuda12x[ctk]" in message
    assert "asyncreplica doctor" in message
    assert info.value.__cause__ is sim.compile_error


@pytest.mark.parametrize(
    "error",
    [
        SimCompileException("kern.cu(1): error: expected a ;"),
        RuntimeError("Failed to find CUDA headers. Please install CUDA toolkit headers"),
    ],
    ids=["CompileException", "no-headers"],
)
def test_native_errors_wrap_compile_errors_with_their_cause(sim: SimCupy, error: Exception) -> None:
    work = _backend._Work(CupyBackend(["GPU:0", "GPU:1"]))
    with pytest.raises(ar.BackendError) as info, work.native_errors("all_reduce(SUM)"):
        raise error
    assert info.value.__cause__ is error
    assert "all_reduce(SUM)" in str(info.value)
    assert "GPU 0 (rank 0): replica 0" in str(info.value)
    assert "cupy-cuda12x[ctk]" in str(info.value)


def test_native_errors_let_user_errors_through(sim: SimCupy) -> None:
    work = _backend._Work(CupyBackend(["GPU:0"]))
    with pytest.raises(ValueError, match="a user error"), work.native_errors("all_gather"):
        raise ValueError("a user error")


# asyncreplica doctor: do kernels compile? -------------------------------------------------------


def _sim_compiler(sim: SimCupy, monkeypatch: pytest.MonkeyPatch, error: Exception | None) -> None:
    """``cupy._core.core`` and ``cupy.cuda.compiler`` as compile_offline uses them."""

    class Program:
        def __init__(self, code: str, name: str, method: str = "ptx") -> None:
            self.code = code

        def compile(self, options: tuple[str, ...]) -> tuple[bytes, None]:
            assert "-arch=sm_75" in options
            if error is not None:
                raise error
            return b"cubin", None

    core = ModuleType("cupy._core.core")
    core.assemble_cupy_compiler_options = lambda options: (*options, "--std=c++17")  # type: ignore[attr-defined]
    compiler = ModuleType("cupy.cuda.compiler")
    compiler._NVRTCProgram = Program  # type: ignore[attr-defined]
    sim.cuda.compiler = compiler  # type: ignore[attr-defined]
    sim._core = SimpleNamespace(core=core)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "cupy._core", sim._core)  # type: ignore[arg-type]
    monkeypatch.setitem(sys.modules, "cupy._core.core", core)
    monkeypatch.setitem(sys.modules, "cupy.cuda.compiler", compiler)


def test_kernel_check_says_kernels_compile(sim: SimCupy, monkeypatch: pytest.MonkeyPatch) -> None:
    _sim_compiler(sim, monkeypatch, None)
    assert CupyBackend.kernel_check() == (
        "compile (NVRTC and the CUDA headers found by CuPy 14.2.0-sim)"
    )


def test_kernel_check_says_why_kernels_cannot_compile(
    sim: SimCupy, monkeypatch: pytest.MonkeyPatch
) -> None:
    _sim_compiler(sim, monkeypatch, RuntimeError("Failed to find CUDA headers."))
    said = CupyBackend.kernel_check()
    assert said is not None
    assert said.startswith("cannot compile: ")
    assert "Failed to find CUDA headers" in said
    assert 'pip install "asyncreplica[gpu]"' in said


def test_kernel_check_without_cupy_says_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy raises ImportError
    assert CupyBackend.kernel_check() is None
    assert _backend.kernel_problem() is None


class _KernelBackend(Backend):
    """A backend whose kernels cannot compile (as CuPy without the CUDA headers)."""

    name: ClassVar[str] = "kernelled"

    @classmethod
    def kernel_check(cls) -> str:
        return "cannot compile: RuntimeError: Failed to find CUDA headers"


_KernelBackend.__abstractmethods__ = frozenset()  # never instantiated


def test_doctor_reports_kernel_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(_registry._registered, "kernelled", _KernelBackend)
    diagnosis = _doctor.diagnose()
    info = next(b for b in diagnosis.backends if b.name == "kernelled")
    assert info.kernels == "cannot compile: RuntimeError: Failed to find CUDA headers"
    assert next(b for b in diagnosis.backends if b.name == "numpy").kernels is None
    lines = _doctor.render_text(diagnosis).splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("  kernelled: "))
    assert lines[at + 1] == "    kernels: cannot compile: RuntimeError: Failed to find CUDA headers"
    by_name = {b["name"]: b for b in diagnosis.as_dict()["backends"]}
    assert by_name["kernelled"]["kernels"].startswith("cannot compile")
