"""The cupy backend on a GPU: the conformance suite, streams, interop, NCCL.

Every test here is marked ``gpu`` and skips, with the reason, where CuPy sees no GPU
(see ``conftest.py``). ``scripts/gpu_check.sh`` runs them on a machine with a GPU.
"""

from __future__ import annotations

from typing import Any, ClassVar

import anyio
import numpy as np
import pytest
from _cupy_fakes import FAKEGPU, FakeGpuTensor
from asyncreplica_cupy import CupyBackend, visible_gpu_count
from asyncreplica_cupy._plan import gpu_ordinal

import asyncreplica as ar
from asyncreplica.abc import Backend, LeafSpec, ReduceOp
from asyncreplica.testing import BackendConformanceTests

pytestmark = pytest.mark.gpu

GPUS = visible_gpu_count()
needs_two_gpus = pytest.mark.skipif(GPUS < 2, reason=f"needs 2 GPUs, CuPy sees {GPUS}")


def _cp() -> Any:
    import cupy

    return cupy


def _on(array: np.ndarray[Any, Any], gpu: int = 0) -> Any:
    cp = _cp()
    with cp.cuda.Device(gpu):
        return cp.asarray(array)


def _host(value: Any) -> np.ndarray[Any, Any]:
    cp = _cp()
    return cp.asnumpy(value) if isinstance(value, cp.ndarray) else np.asarray(value)


class _CupyConformance(BackendConformanceTests):
    def make_backend(self, devices: list[str]) -> Backend:
        return CupyBackend(devices)

    def from_numpy(self, array: np.ndarray[Any, Any], device: str) -> object:
        return _on(array, gpu_ordinal(device))

    def to_numpy(self, value: object) -> np.ndarray[Any, Any]:
        return _host(value)


class TestCupyThreeReplicasOnOneGpu(_CupyConformance):
    devices: ClassVar[list[str]] = ["GPU:0", "GPU:0", "GPU:0"]


class TestCupyOneReplica(_CupyConformance):
    devices: ClassVar[list[str]] = ["GPU:0"]


@needs_two_gpus
class TestCupyUnevenAcrossTwoGpus(_CupyConformance):
    devices: ClassVar[list[str]] = ["GPU:0", "GPU:1", "GPU:0"]


@needs_two_gpus
class TestCupyOneReplicaPerGpu(_CupyConformance):
    devices: ClassVar[list[str]] = [f"GPU:{i}" for i in range(max(GPUS, 2))]


# Streams and the event loop ---------------------------------------------------------------------

_SPIN = r"""
extern "C" __global__ void spin(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) { }
}
"""


def test_waits_for_the_users_stream_without_blocking_the_loop() -> None:
    """Work queued before the call is seen; the loop runs other tasks while the GPU works."""
    cp = _cp()
    spin = cp.RawKernel(_SPIN, "spin")
    backend = CupyBackend(["GPU:0", "GPU:0"])
    x = cp.zeros(1 << 20, cp.float32)
    # Warm up: the first call of a kernel compiles it; the spin below must time the wait only.
    anyio.run(backend.all_reduce, ReduceOp.SUM, [[x], [x]])
    spin((1,), (1,), (np.int64(0),))
    cp.cuda.Device(0).synchronize()
    rate = cp.cuda.runtime.getDeviceProperties(0)["clockRate"] * 1000  # kHz -> Hz
    spin((1,), (1,), (np.int64(rate * 3 // 10),))  # ~300 ms on the user's (current) stream
    x.fill(2.0)  # queued after the spin: the all_reduce must see it
    ticks = 0

    async def main() -> list[list[object]]:
        nonlocal ticks
        done = anyio.Event()

        async def ticker() -> None:
            nonlocal ticks
            while not done.is_set():
                ticks += 1
                await anyio.sleep(0.001)

        async with anyio.create_task_group() as tg:
            tg.start_soon(ticker)
            try:
                return await backend.all_reduce(ReduceOp.SUM, [[x], [x]])
            finally:
                done.set()

    results = anyio.run(main)
    assert ticks > 5, f"the event loop ran {ticks} times while the GPU worked ~300 ms"
    np.testing.assert_array_equal(_host(results[1][0]), np.full(1 << 20, 4.0, np.float32))


def test_cai_of_a_busy_producer_stream_is_awaited_without_blocking_the_loop() -> None:
    """A __cuda_array_interface__ naming its stream: read after that stream, loop free."""
    cp = _cp()
    spin = cp.RawKernel(_SPIN, "spin")
    backend = CupyBackend(["GPU:0", "GPU:0"])
    base = cp.zeros(1 << 20, cp.float32)
    anyio.run(backend.all_reduce, ReduceOp.SUM, [[base], [base]])  # compiles the kernel
    spin((1,), (1,), (np.int64(0),))
    cp.cuda.Device(0).synchronize()
    producer = cp.cuda.Stream(non_blocking=True)
    rate = cp.cuda.runtime.getDeviceProperties(0)["clockRate"] * 1000  # kHz -> Hz
    with producer:
        spin((1,), (1,), (np.int64(rate * 3 // 10),))  # ~300 ms on the producer's stream
        base.fill(3.0)  # written after the spin, on the producer's stream

    class Cai:
        def __init__(self, array: Any) -> None:
            self.array = array
            self.__cuda_array_interface__ = {
                **array.__cuda_array_interface__,
                "stream": producer.ptr,
            }

    ticks = 0

    async def main() -> list[list[object]]:
        nonlocal ticks
        done = anyio.Event()

        async def ticker() -> None:
            nonlocal ticks
            while not done.is_set():
                ticks += 1
                await anyio.sleep(0.001)

        async with anyio.create_task_group() as tg:
            tg.start_soon(ticker)
            try:
                return await backend.all_reduce(ReduceOp.SUM, [[Cai(base)], [Cai(base)]])
            finally:
                done.set()

    results = anyio.run(main)
    assert ticks > 5, f"the event loop ran {ticks} times while the producer worked ~300 ms"
    np.testing.assert_array_equal(_host(results[0][0]), np.full(1 << 20, 6.0, np.float32))


def test_no_with_block_stays_open() -> None:
    """After a collective the current device and stream are what they were."""
    cp = _cp()
    backend = CupyBackend(["GPU:0", "GPU:0"])
    before = (cp.cuda.runtime.getDevice(), cp.cuda.get_current_stream().ptr)
    anyio.run(backend.all_reduce, ReduceOp.SUM, [[_on(np.ones(3))], [_on(np.ones(3))]])
    assert (cp.cuda.runtime.getDevice(), cp.cuda.get_current_stream().ptr) == before


def test_no_blocking_synchronize(monkeypatch: pytest.MonkeyPatch) -> None:
    cp = _cp()

    def refuse(*args: object) -> None:
        raise AssertionError("a blocking synchronize was called on the event loop")

    backend = CupyBackend(["GPU:0"] * 4)
    values = [[_on(np.full((256, 1024), r, np.float32))] for r in range(4)]
    # Only around the collective: reading the result back (cp.asnumpy) synchronizes.
    with monkeypatch.context() as patch:
        patch.setattr(cp.cuda.Stream, "synchronize", refuse)
        patch.setattr(cp.cuda.Event, "synchronize", refuse)
        results = anyio.run(backend.all_reduce, ReduceOp.MEAN, values)
    np.testing.assert_array_equal(_host(results[3][0]), np.full((256, 1024), 1.5, np.float32))


# Values ---------------------------------------------------------------------------------------


def test_replicas_on_one_gpu_get_views_of_one_buffer() -> None:
    backend = CupyBackend(["GPU:0", "GPU:0", "GPU:0"])
    values = [[_on(np.arange(4.0) * r)] for r in range(3)]
    results = anyio.run(backend.all_reduce, ReduceOp.SUM, values)
    leaves = [row[0] for row in results]
    assert len({id(leaf) for leaf in leaves}) == 3
    assert len({leaf.data.ptr for leaf in leaves}) == 1  # type: ignore[attr-defined]
    assert all(leaf.data.ptr not in {v[0].data.ptr for v in values} for leaf in leaves)  # type: ignore[attr-defined]


def test_numpy_and_python_inputs_are_moved_to_the_gpu() -> None:
    cp = _cp()
    backend = CupyBackend(["GPU:0", "GPU:0"])
    # One dtype per leaf across replicas (the ledger refuses mixed dtypes): 1.5 and 2.0.
    results = anyio.run(
        backend.all_reduce, ReduceOp.SUM, [[np.arange(3.0), 1.5], [_on(np.ones(3)), 2.0]]
    )
    assert all(isinstance(leaf, cp.ndarray) for row in results for leaf in row)
    np.testing.assert_array_equal(_host(results[0][0]), [1.0, 2.0, 3.0])
    assert float(_host(results[1][1])) == 3.5


def test_foreign_cuda_arrays_are_read_in_place() -> None:
    cp = _cp()

    class Cai:
        def __init__(self, array: Any) -> None:
            self.array = array
            self.__cuda_array_interface__ = array.__cuda_array_interface__

    base = _on(np.arange(6, dtype=np.int32).reshape(2, 3))
    backend = CupyBackend(["GPU:0", "GPU:0"])
    assert backend.describe(Cai(base)) == LeafSpec((2, 3), "int32")
    results = anyio.run(backend.all_reduce, ReduceOp.SUM, [[Cai(base)], [base]])
    np.testing.assert_array_equal(_host(results[0][0]), np.arange(6).reshape(2, 3) * 2)
    assert isinstance(results[0][0], cp.ndarray)


def test_torch_tensors_are_reduced_without_the_host() -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    a = torch.arange(4, dtype=torch.float32, device="cuda:0")
    b = torch.ones(4, dtype=torch.float32, device="cuda:0")
    backend = CupyBackend(["GPU:0", "GPU:0"])
    assert backend.describe(a) == LeafSpec((4,), "float32", array_type="torch.Tensor")
    results = anyio.run(backend.all_reduce, ReduceOp.SUM, [[a], [b]])
    for row in results:
        back = row[0]
        assert isinstance(back, torch.Tensor)  # the input's type, zero-copy (DLPack)
        assert back.device == torch.device("cuda:0")
        assert back.tolist() == [1.0, 2.0, 3.0, 4.0]
    # Torch tensors are writable: the second replica on the GPU gets its own copy of
    # the result buffer, so writing into one replica's result changes no other's.
    assert results[0][0].data_ptr() != results[1][0].data_ptr()  # type: ignore[attr-defined]
    results[0][0].mul_(0)
    assert results[1][0].tolist() == [1.0, 2.0, 3.0, 4.0]


def test_jax_gpu_arrays_come_back_as_jax_arrays() -> None:
    jax = pytest.importorskip("jax")
    gpus = [d for d in jax.devices() if d.platform == "gpu"] if _jax_has_gpu(jax) else []
    if not gpus:
        pytest.skip("JAX sees no GPU here (pip install 'jax[cuda12]')")
    x = jax.device_put(jax.numpy.arange(6, dtype=jax.numpy.float32), gpus[0])
    backend = CupyBackend(["GPU:0", "GPU:0"])
    results = anyio.run(backend.all_reduce, ReduceOp.SUM, [[x], [x]])
    for row in results:
        assert isinstance(row[0], jax.Array)
        assert row[0].devices() == {gpus[0]}
        np.testing.assert_array_equal(np.asarray(row[0]), np.arange(6, dtype=np.float32) * 2)


def _jax_has_gpu(jax: Any) -> bool:
    try:
        return bool(jax.devices("gpu"))
    except RuntimeError:  # no GPU backend in this jaxlib
        return False


def _fake(array: Any) -> FakeGpuTensor:
    """``array`` (CuPy, on a GPU) as a tensor of ``fakegpu``, another CUDA array library."""
    return FakeGpuTensor(array, FAKEGPU)


def test_cuda_arrays_of_another_library_come_back_in_its_type_zero_copy() -> None:
    """DLPack in and out, on the GPU: results are ``fakegpu`` tensors of the result buffer."""
    cp = _cp()
    backend = CupyBackend(["GPU:0", "GPU:0", "GPU:0"])
    FAKEGPU.refuse = 0
    base = [np.arange(6, dtype=np.float32).reshape(3, 2) * (r + 1) for r in range(3)]
    rows = [[_fake(_on(b)), _on(np.full(2, r, np.int32))] for r, b in enumerate(base)]
    assert backend.describe(rows[0][0]) == LeafSpec(
        (3, 2), "float32", array_type="fakegpu.FakeGpuTensor"
    )
    checks = {
        "all_reduce": (
            lambda: backend.all_reduce(ReduceOp.SUM, rows),
            [base[0] + base[1] + base[2]] * 3,
        ),
        "all_gather": (lambda: backend.all_gather(rows, 0), [np.concatenate(base)] * 3),
        "reduce_scatter": (
            lambda: backend.reduce_scatter(ReduceOp.MAX, [[_fake(_on(b))] for b in base], 0),
            list(np.split(np.maximum.reduce(base), 3, axis=0)),
        ),
        "broadcast": (lambda: backend.broadcast(rows[1], 3), [base[1]] * 3),
    }
    for what, (call, want) in checks.items():
        results = anyio.run(call)
        for r, row in enumerate(results):
            got = row[0]
            assert isinstance(got, FakeGpuTensor), (what, r, type(got))
            assert isinstance(got.inner, cp.ndarray), (what, r, type(got.inner))
            assert got.device == "cuda:0"
            np.testing.assert_array_equal(_host(got.inner), want[r], err_msg=what, strict=True)
            if len(row) > 1:  # the CuPy leaf beside it stays a CuPy array
                assert isinstance(row[1], cp.ndarray), (what, type(row[1]))
        if what in ("all_reduce", "all_gather"):
            # fakegpu's tensors are writable (it is not JAX): the first replica's tensor
            # wraps the GPU's result buffer, each other replica gets its own copy of it,
            # so writing into one replica's result changes no other's.
            assert len({row[0].inner.data.ptr for row in results}) == len(results), what
    reduced = anyio.run(backend.reduce, ReduceOp.SUM, [row[0] for row in rows], None)
    assert isinstance(reduced, FakeGpuTensor)
    np.testing.assert_array_equal(_host(reduced.inner), base[0] + base[1] + base[2])


def test_bool_cannot_be_reduced() -> None:
    backend = CupyBackend(["GPU:0", "GPU:0"])
    values = [[_on(np.array([True, False]))] for _ in range(2)]
    with pytest.raises(TypeError, match=r"dtype bool.*astype"):
        anyio.run(backend.all_reduce, ReduceOp.SUM, values)


def test_strategy_runs_replicas_that_share_a_gpu() -> None:
    cp = _cp()
    strategy = ar.MirroredStrategy(["GPU:0", "GPU:0"])
    assert isinstance(strategy.backend, CupyBackend)

    async def step() -> object:
        ctx = ar.get_replica_context()
        assert ctx is not None
        x = cp.full(3, ctx.replica_id_in_sync_group + 1, cp.float32)
        return await ctx.all_reduce("mean", x)

    result = anyio.run(lambda: strategy.run(step))
    for component in strategy.experimental_local_results(result):
        assert isinstance(component, cp.ndarray)
        np.testing.assert_array_equal(_host(component), [1.5, 1.5, 1.5])


def test_many_replicas_on_one_gpu_fold_in_chunks() -> None:
    n = 40  # more than one fused kernel takes
    rng = np.random.default_rng(3)
    arrays = [
        np.asarray(rng.standard_normal(257) * 10.0 ** (r % 7 - 3), np.float32) for r in range(n)
    ]
    backend = CupyBackend(["GPU:0"] * n)
    results = anyio.run(backend.all_reduce, ReduceOp.MEAN, [[_on(a)] for a in arrays])
    expected = arrays[0].copy()
    for a in arrays[1:]:
        expected = expected + a
    expected = expected / np.float32(n)
    assert _host(results[n - 1][0]).tobytes() == expected.tobytes()


# Across GPUs ------------------------------------------------------------------------------------


@needs_two_gpus
def test_mean_divides_by_all_replicas_when_gpus_hold_unequal_counts() -> None:
    backend = CupyBackend(["GPU:0", "GPU:0", "GPU:1"])
    values = [[_on(np.full(5, v, np.int32), g)] for v, g in ((1, 0), (2, 0), (6, 1))]
    results = anyio.run(backend.all_reduce, ReduceOp.MEAN, values)
    for r, row in enumerate(results):
        assert row[0].device.id == (0, 0, 1)[r]  # type: ignore[attr-defined]
        np.testing.assert_array_equal(_host(row[0]), np.full(5, 3.0))  # 9 / 3, not 9 / 2


@needs_two_gpus
def test_strided_values_cross_gpus_intact() -> None:
    """Transposed and sliced values are made contiguous on the backend's stream, then copied."""
    host = np.arange(24, dtype=np.float32).reshape(4, 6)
    transposed = _on(host[:, :3].copy().T.copy(), 0).T  # F-order on GPU 0
    sliced = _on(host * 10, 1)[:, ::2]  # strided on GPU 1
    backend = CupyBackend(["GPU:0", "GPU:1"])
    for _ in range(3):  # each time with fresh temporaries in the pool
        results = anyio.run(backend.all_gather, [[transposed], [sliced]], 0)
        expected = np.concatenate([_host(transposed), _host(sliced)])
        for r, row in enumerate(results):
            assert row[0].device.id == r  # type: ignore[attr-defined]
            np.testing.assert_array_equal(_host(row[0]), expected)


@needs_two_gpus
def test_nccl_communicators_are_made_once_one_rank_per_gpu() -> None:
    backend = CupyBackend(["GPU:1", "GPU:0", "GPU:1"])
    if backend._nccl_module() is None:
        pytest.skip("CuPy found no libnccl (pip install nvidia-nccl-cu12); peer copies are used")
    values = [[_on(np.arange(4, dtype=np.int64), g)] for g in (1, 0, 1)]
    anyio.run(backend.all_reduce, ReduceOp.SUM, values)
    comms = backend._comms
    assert comms is not None
    assert [c.device_id() for c in comms] == [1, 0]
    assert [c.rank_id() for c in comms] == [0, 1]
    anyio.run(backend.all_reduce, ReduceOp.MAX, values)
    assert backend._comms is comms
    anyio.run(backend.aclose)
    assert backend._comms is None


@needs_two_gpus
def test_unordered_floats_are_identical_on_every_replica() -> None:
    backend = CupyBackend(["GPU:0", "GPU:1", "GPU:1"], exact_order=False)
    rng = np.random.default_rng(5)
    arrays = [np.asarray(rng.standard_normal(1000), np.float32) for _ in range(3)]
    values = [[_on(a, g)] for a, g in zip(arrays, (0, 1, 1), strict=True)]
    results = anyio.run(backend.all_reduce, ReduceOp.SUM, values)
    first = _host(results[0][0]).tobytes()
    assert all(_host(row[0]).tobytes() == first for row in results)
    np.testing.assert_allclose(_host(results[0][0]), arrays[0] + arrays[1] + arrays[2], rtol=1e-5)
