"""CupyBackend: replicas' values on CUDA GPUs, combined with CuPy kernels and NCCL.

CuPy is imported lazily, inside functions, so this module imports without CuPy and
without a GPU; :meth:`CupyBackend.check_available` says what is missing.

CuPy's current device and current stream are per thread. Every collective therefore
enqueues all its device work in plain (non-async) code, inside short
``with Device(g), stream:`` blocks, and only then awaits: it records one CUDA event per
stream it used and polls them (:func:`wait_for_events`), so the event loop keeps running
other replicas meanwhile. No ``with`` block is ever open across an ``await``.
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar

import anyio
import anyio.to_thread
import numpy as np

# The one exact integer-MEAN rule, used here for sums that may need more than 64 bits.
from asyncreplica_numpy.interop import mean_of_integers

from asyncreplica import BackendError, IndexedSlices
from asyncreplica.abc import Backend, LeafSpec, ReduceOp, value_text

from ._plan import (
    EXACT_SUM_DIVISION,
    FOLD_DTYPES,
    NCCL_DTYPES,
    NCCL_OPS,
    FoldMode,
    FoldVariant,
    GpuPlan,
    PollSchedule,
    Route,
    fold_chunks,
    fold_kernel_source,
    fold_steps,
    integer_mean_dtype,
    mean_divisor,
    reduction_route,
    reduction_variants,
)
from ._routing import CUDA_DLPACK, Foreign, foreign_of, host_leaf, restore

__all__ = [
    "INSTALL_HINT",
    "CupyBackend",
    "compile_offline",
    "kernel_problem",
    "visible_gpu_count",
    "wait_for_events",
]

Leaves = Sequence[Sequence[object]]

#: How to install CuPy for this backend.
INSTALL_HINT = (
    'pip install "asyncreplica[gpu]" (CuPy for CUDA 12; for another CUDA version install '
    "the matching cupy-cudaXXx wheel, see https://docs.cupy.dev/en/stable/install.html)"
)
_DEVICE_HINT = "check that `nvidia-smi` lists a GPU and that CUDA_VISIBLE_DEVICES, if set, names it"

# dtype kinds a value may have (bool and numbers), and those reductions accept.
_HOLDABLE_KINDS = frozenset("biufc")
_NUMERIC_KINDS = frozenset("iufc")

_POLL = PollSchedule()

# Per-GPU reductions of one component along axes (Strategy.reduce with an axis).
_LOCAL = {
    ReduceOp.SUM: "sum",
    ReduceOp.PROD: "prod",
    ReduceOp.MIN: "min",
    ReduceOp.MAX: "max",
}
_UFUNC = {
    ReduceOp.SUM: "add",
    ReduceOp.MEAN: "add",
    ReduceOp.PROD: "multiply",
    ReduceOp.MIN: "minimum",
    ReduceOp.MAX: "maximum",
}

_KERNEL_HINT = (
    "CuPy compiles its kernels with NVRTC and needs the CUDA headers: install CuPy with its "
    'toolkit wheels (pip install "asyncreplica[gpu]", which installs cupy-cuda12x[ctk]) or '
    "set CUDA_PATH to a CUDA toolkit; `asyncreplica doctor` checks it"
)
# Threads per block of a fold kernel, and the most blocks one launch uses (each thread
# then loops over the elements with a grid stride).
_BLOCK = 256
_MAX_BLOCKS = 8192

# Compiled fold kernels (cupy.RawKernel), and the (variant, GPU) pairs loaded on a GPU.
_kernels: dict[FoldVariant, Any] = {}
_loaded: set[tuple[FoldVariant, int]] = set()
_specs: dict[tuple[tuple[int, ...], str, str | None], LeafSpec] = {}


def _import_cupy() -> Any:
    """``import cupy``, or a ``BackendError`` saying how to install it."""
    try:
        import cupy
    except ImportError as exc:
        raise BackendError(
            f"the cupy backend cannot run: CuPy is not installed ({exc}). Install it with: "
            f"{INSTALL_HINT}; or run on CPU devices with the numpy backend "
            "(MirroredStrategy(['CPU:0', ...]))"
        ) from exc
    return cupy


def _device_count() -> int:
    """How many GPUs CUDA shows; a ``BackendError`` saying why when it shows none."""
    cupy = _import_cupy()
    try:
        count = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as exc:  # CUDARuntimeError: no driver, driver too old, no device
        raise BackendError(
            f"the cupy backend cannot run: CuPy is installed but CUDA reports no usable GPU "
            f"({type(exc).__name__}: {exc}). To fix it, {_DEVICE_HINT}; a driver older than "
            "CuPy's CUDA version also shows up here (update the driver, or install the CuPy "
            "wheel of your CUDA version)"
        ) from exc
    if count < 1:
        raise BackendError(
            f"the cupy backend cannot run: no CUDA device is visible; {_DEVICE_HINT}"
        )
    return count


def visible_gpu_count() -> int:
    """How many CUDA devices CuPy sees: 0 without CuPy, a driver or a GPU.

    Returns:
        The number of visible GPUs.
    """
    try:
        return _device_count()
    except BackendError:
        return 0


def _is_cupy_array(value: object) -> bool:
    cupy = sys.modules.get("cupy")  # a cupy array exists only once cupy is imported
    return cupy is not None and isinstance(value, cupy.ndarray)


def _cuda_array_interface(value: object) -> dict[str, Any] | None:
    try:
        cai = getattr(value, "__cuda_array_interface__", None)
    except Exception:  # a property that fails (e.g. a CPU tensor) means: not on a GPU
        return None
    return cai if isinstance(cai, dict) else None


def _dlpack_cuda_device(value: object) -> int | None:
    """The GPU of a DLPack producer whose memory is on a GPU, else None."""
    if not hasattr(value, "__dlpack__"):
        return None
    try:
        kind, device_id = value.__dlpack_device__()  # type: ignore[attr-defined]
    except Exception:
        return None
    return int(device_id) if int(kind) in CUDA_DLPACK else None


def _not_holdable(value: object, what: str) -> str:
    return (
        f"{what} must be a number, a CuPy or numpy array, an array on a GPU exposing DLPack or "
        "__cuda_array_interface__ (PyTorch, JAX, ...), a CPU array of a library that implements "
        "the array API standard or DLPack, or a nest (list, tuple, dict) of them, "
        f"got {type(value).__name__} {value_text(value, 60)}"
    )


def _host_array(value: object, what: str) -> np.ndarray[Any, Any]:
    """A host value (numpy array or scalar, Python number) as a numpy array, checked."""
    if value is None or isinstance(value, str | bytes):
        raise TypeError(_not_holdable(value, what))
    try:
        array = np.asarray(value)
    except Exception as exc:
        raise TypeError(_not_holdable(value, what)) from exc
    if array.dtype.kind not in _HOLDABLE_KINDS:
        raise TypeError(_not_holdable(value, what))
    return array


def _shape_and_dtype(
    value: object, what: str, foreign: Foreign | None = None
) -> tuple[tuple[int, ...], np.dtype[Any]]:
    """Shape and dtype of a leaf, without copying it anywhere."""
    if foreign is not None and not foreign.on_gpu:
        value = host_leaf(value, foreign)  # zero-copy numpy view of a host array
    if type(value) is np.ndarray or _is_cupy_array(value):
        shape, dtype = value.shape, value.dtype  # type: ignore[attr-defined]
    elif (cai := _cuda_array_interface(value)) is not None:
        shape, dtype = tuple(cai["shape"]), np.dtype(cai["typestr"])
    elif _dlpack_cuda_device(value) is not None:
        array = _import_cupy().from_dlpack(value)
        shape, dtype = array.shape, array.dtype
    else:
        array = _host_array(value, what)
        shape, dtype = array.shape, array.dtype
    if dtype.kind not in _HOLDABLE_KINDS:
        raise TypeError(_not_holdable(value, what))
    return tuple(shape), dtype


def _reducible(dtype: np.dtype[Any]) -> None:
    if dtype.kind not in _NUMERIC_KINDS:
        raise TypeError(
            f"cannot reduce values of dtype {dtype}: reductions need integer, float or complex "
            "values (cast booleans first, e.g. x.astype(cupy.int32))"
        )


def _is_compile_error(exc: BaseException) -> bool:
    """Whether ``exc`` is one of CuPy's compiler errors (they derive from ``Exception``)."""
    return type(exc).__module__ == "cupy.cuda.compiler" or "CUDA headers" in str(exc)


def _load_kernels(cupy: Any, pairs: Sequence[tuple[FoldVariant, int]]) -> None:
    """Compile (NVRTC) and load each fold kernel on its GPU; blocking, meant for a thread.

    NVRTC's compile releases the GIL, so the event loop keeps running meanwhile. CuPy
    caches the compiled code in memory and on disk (``~/.cupy/kernel_cache``).
    """
    for variant, gpu in pairs:
        kernel = _kernels.get(variant)
        if kernel is None:
            source = fold_kernel_source(variant.op, variant.arity, variant.mode, variant.dtype)
            kernel = _kernels.setdefault(variant, cupy.RawKernel(source.code, source.name))
        with cupy.cuda.Device(gpu):
            _ = kernel.kernel  # compiles for this GPU's architecture and loads the module
        _loaded.add((variant, gpu))


def _kernel_error(exc: BaseException, what: str) -> BackendError:
    return BackendError(
        f"{what}: the GPU kernel could not be compiled ({type(exc).__name__}: "
        f"{' '.join(str(exc).split())[:500]}). {_KERNEL_HINT}"
    )


def compile_offline(variants: Sequence[FoldVariant], arch: str = "90") -> int:
    """Compile fold kernels with NVRTC exactly as CuPy would, without a GPU.

    Uses CuPy's own compiler options (its include paths, the CUDA headers it finds, C++17,
    ``-ftz=true``) for ``sm_{arch}``; nothing is loaded on a device. This is what
    ``scripts/gpu_precheck.sh`` and :func:`kernel_problem` run.

    Args:
        variants: The kernels to compile (e.g. :func:`every_fold_variant`).
        arch: The compute capability, ``"90"`` for sm_90 (H100, H200).

    Returns:
        How many kernels compiled.

    Raises:
        BackendError: CuPy is missing, or a kernel does not compile (cause kept).
    """
    _import_cupy()
    from cupy._core import core
    from cupy.cuda import compiler

    done = 0
    for variant in variants:
        source = fold_kernel_source(variant.op, variant.arity, variant.mode, variant.dtype)
        try:
            options = core.assemble_cupy_compiler_options(())
            options += ("-ftz=true", f"-arch=sm_{arch}", "--device-as-default-execution-space")
            compiler._NVRTCProgram(source.code, f"{source.name}.cu", method="cubin").compile(
                options
            )
        except Exception as exc:
            raise _kernel_error(exc, f"compiling {source.name} for sm_{arch}") from exc
        done += 1
    return done


def kernel_problem() -> str | None:
    """Why the cupy backend's kernels cannot compile here, or None when they can.

    Compiles one float16 fold kernel (it needs the CUDA headers) with NVRTC, without a
    GPU. ``asyncreplica doctor`` reports the answer. Without CuPy there is nothing to
    compile with: None (``CupyBackend.check_available`` says that CuPy is missing).

    Returns:
        A one-line reason with the fix, or None.
    """
    try:
        import cupy  # noqa: F401
    except ImportError:
        return None
    try:
        compile_offline([FoldVariant(ReduceOp.SUM, 2, FoldMode.PLAIN, "float16")], arch="75")
    except BackendError as exc:
        return str(exc)
    return None


def _kernel(cupy: Any, variant: FoldVariant, gpu: int) -> Any:
    """The fold kernel ``variant``, loaded on ``gpu``.

    Collectives compile their kernels before they start (``CupyBackend._compile``, off the
    event loop); a kernel not compiled yet is compiled here, on the calling thread.
    """
    if (variant, gpu) not in _loaded:
        _load_kernels(cupy, [(variant, gpu)])
    return _kernels[variant]


class _StreamHandle:
    """A CUDA stream handle in the CUDA stream protocol (``__cuda_stream__``)."""

    def __init__(self, ptr: int) -> None:
        self.ptr = ptr

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.ptr)


def _external_stream(cupy: Any, ptr: int) -> Any:
    """A CuPy stream object for another library's stream ``ptr`` (it stays theirs).

    CuPy 14 deprecates ``cupy.cuda.ExternalStream`` for ``Stream.from_external``, which
    takes an object of the CUDA stream protocol; older CuPy has only the former.
    """
    from_external = getattr(cupy.cuda.Stream, "from_external", None)
    if from_external is not None:
        return from_external(_StreamHandle(ptr))
    return cupy.cuda.ExternalStream(ptr)


class _WithoutStream:
    """A ``__cuda_array_interface__`` value seen without its stream (no host sync)."""

    def __init__(self, owner: object, cai: dict[str, Any]) -> None:
        self.owner = owner  # the view keeps this object, which keeps the memory's owner
        self.__cuda_array_interface__ = {**cai, "stream": None}


async def wait_for_events(
    events: Sequence[Any],
    *,
    schedule: PollSchedule = _POLL,
    clock: Callable[[], float] = time.perf_counter,
    sleep: Callable[[float], Any] = anyio.sleep,
) -> None:
    """Wait until every CUDA event is done, without blocking the event loop.

    Polls ``event.done`` (``cudaEventQuery``, which never blocks), yielding to the
    event loop between polls as ``schedule`` says.

    Args:
        events: Objects with a ``done`` property (``cupy.cuda.Event``).
        schedule: How long to wait between polls.
        clock: The clock that measures how long the wait has lasted.
        sleep: The awaitable sleep (``anyio.sleep``).
    """
    pending = [e for e in events if not e.done]
    start = clock()
    delay = 0.0
    while pending:
        delay = schedule.next_delay(clock() - start, delay)
        await sleep(delay)
        pending = [e for e in pending if not e.done]


class CupyBackend(Backend):
    """Values are CuPy arrays on CUDA GPUs; several replicas may share one GPU.

    Replicas on one GPU are combined by one fused CuPy kernel on that GPU's stream, in
    replica order (each input read once, the output written once). Across GPUs, the
    result is the replica-order fold too: the running result hops from GPU to GPU in
    replica order (peer copies) and the final value is copied to the other GPUs. NCCL
    (one communicator rank per distinct GPU, created once, lazily, all ranks' calls in
    one ``groupStart()``/``groupEnd()``) carries the reductions whose result does not
    depend on the order: integers, and floats between two GPUs of one replica each.
    ``exact_order=False`` lets NCCL reduce floats in its own order too (faster across
    many GPUs; every replica still gets the same bits). ``MEAN`` is always a sum
    divided by the total replica count.

    Inputs may be CuPy arrays, anything on a GPU exposing DLPack or
    ``__cuda_array_interface__`` (PyTorch, JAX: read in place, never through the host),
    or numpy arrays, Python numbers and CPU arrays of other libraries (JAX,
    ``array_api_strict``, ...), which are copied to the replica's GPU once. Each replica
    gets its results in its own input's array type: CuPy arrays for CuPy, numpy and
    number inputs; a tensor of the input's library, on the input's GPU, for a CUDA
    array of another library (its ``from_dlpack``: zero-copy); an array of the input's
    library on its device for a CPU array (one copy back per result buffer; see
    ``asyncreplica_cupy._routing``). Replicas on one GPU get views of one result
    buffer: CuPy arrays and PyTorch tensors cannot be made read-only, so do not write
    to a result in place.

    Args:
        devices: Each local replica's device; all GPUs (``"GPU:0"``), possibly repeated.
        exact_order: Whether cross-GPU float reductions must be bitwise the
            replica-order fold (the backend contract). False lets NCCL choose the order.

    Raises:
        ValueError: A device is not a GPU, or names a GPU that is not visible.
        BackendError: CuPy is not installed, or CUDA shows no GPU.
    """

    name: ClassVar[str] = "cupy"
    #: CUDA arrays of other libraries (PyTorch, JAX) and their CPU arrays come back in
    #: their own type (``asyncreplica_cupy._routing``).
    accepts_foreign_arrays: ClassVar[bool] = True

    def __init__(self, devices: Sequence[str], *, exact_order: bool = True) -> None:
        super().__init__(devices)
        self.plan = GpuPlan.from_devices(self.devices)
        self.exact_order = exact_order
        count = _device_count()
        missing = sorted({g for g in self.plan.gpus if g >= count})
        if missing:
            raise ValueError(
                f"GPU {', '.join(map(str, missing))} requested, but CUDA shows {count} GPU(s) "
                f"(GPU:0 .. GPU:{count - 1}); {_DEVICE_HINT}"
            )
        self._streams: dict[int, Any] = {}
        self._nccl: Any = None
        self._nccl_checked = False
        # Made now, when the strategy is built: initAll holds the GIL while it runs, so
        # making them inside a run would stall the event loop, even from a thread.
        self._comms: list[Any] | None = self._make_communicators()

    # -- availability ----------------------------------------------------------------------

    @classmethod
    def check_available(cls) -> None:
        """Raise ``BackendError`` if CuPy is missing or CUDA shows no GPU, saying how to fix it."""
        _device_count()

    @classmethod
    def kernel_check(cls) -> str | None:
        """Whether this backend's kernels compile here, for ``asyncreplica doctor``.

        Needs no GPU: one kernel is compiled with NVRTC (see :func:`kernel_problem`).

        Returns:
            ``"compile (NVRTC ...)"``, ``"cannot compile: <reason and fix>"``, or None
            without CuPy (then ``check_available`` says what is missing).
        """
        try:
            import cupy
        except ImportError:
            return None
        problem = kernel_problem()
        if problem is not None:
            return f"cannot compile: {problem}"
        return f"compile (NVRTC and the CUDA headers found by CuPy {cupy.__version__})"

    @classmethod
    def default_devices(cls) -> list[str]:
        """Every visible GPU, ``["GPU:0", "GPU:1", ...]``.

        Raises:
            BackendError: CuPy is not installed, or CUDA shows no GPU.
        """
        return [f"GPU:{i}" for i in range(_device_count())]

    # -- describe --------------------------------------------------------------------------

    def describe(self, value: object) -> LeafSpec:
        """Describe a CuPy, DLPack, ``__cuda_array_interface__`` or host array, or ``IndexedSlices``."""
        if isinstance(value, IndexedSlices):
            _, dtype = _shape_and_dtype(value.values, "IndexedSlices.values")
            _shape_and_dtype(value.indices, "IndexedSlices.indices")
            return LeafSpec(value.dense_shape, dtype.name, sparse=True)
        foreign = foreign_of(value)
        shape, dtype = _shape_and_dtype(value, "a collective's value", foreign)
        array_type = None if foreign is None else foreign.library.name
        key = (shape, dtype.str, array_type)
        spec = _specs.get(key)
        if spec is None:
            if len(_specs) > 4096:
                _specs.clear()
            spec = _specs[key] = LeafSpec(shape, dtype.name, array_type=array_type)
        return spec

    # -- collectives -----------------------------------------------------------------------

    async def all_reduce(
        self, op: ReduceOp, values: Leaves, *, bytes_per_pack: int = 0
    ) -> list[list[object]]:
        """Combine each leaf across replicas; see :meth:`Backend.all_reduce`.

        Each leaf is reduced on its own (``bytes_per_pack`` does not change results,
        and one fused kernel per leaf already reads each input once).
        """
        n, m = len(values), len(values[0])
        inputs, kinds = values, _foreign_leaves(values[0])
        if kinds is not None:
            values = _held(values, kinds)
        await self._prepare_kernels(op, values)
        work = _Work(self)
        out: list[list[object]] = [[None] * m for _ in range(n)]
        with work.native_errors(f"all_reduce({op.value})"):
            for j in range(m):
                leaf = [row[j] for row in values]
                if isinstance(leaf[0], IndexedSlices):
                    results: Sequence[object] = work.reduce_slices(op, leaf)
                else:
                    per_gpu = work.reduce_dense(op, leaf)
                    results = [per_gpu[self.plan.gpu_of(r)].view() for r in range(n)]
                for r in range(n):
                    out[r][j] = results[r]
        await work.finish()
        return work.restore(out, kinds, inputs)

    async def all_gather(self, values: Leaves, axis: int) -> list[list[object]]:
        """Concatenate each leaf along ``axis`` on every GPU; see :meth:`Backend.all_gather`."""
        n, m = len(values), len(values[0])
        inputs, kinds = values, _foreign_leaves(values[0])
        if kinds is not None:
            values = _held(values, kinds)
        work = _Work(self)
        out: list[list[object]] = [[None] * m for _ in range(n)]
        with work.native_errors("all_gather"):
            for j in range(m):
                per_gpu = work.concatenate_everywhere([row[j] for row in values], axis)
                for r in range(n):
                    out[r][j] = per_gpu[self.plan.gpu_of(r)].view()
        await work.finish()
        return work.restore(out, kinds, inputs)

    async def reduce_scatter(self, op: ReduceOp, values: Leaves, axis: int) -> list[list[object]]:
        """Reduce each leaf, then replica ``r`` gets chunk ``r`` of its GPU's result buffer."""
        n, m = len(values), len(values[0])
        inputs, kinds = values, _foreign_leaves(values[0])
        if kinds is not None:
            values = _held(values, kinds)
        await self._prepare_kernels(op, values)
        work = _Work(self)
        out: list[list[object]] = [[None] * m for _ in range(n)]
        with work.native_errors(f"reduce_scatter({op.value})"):
            for j in range(m):
                per_gpu = work.reduce_dense(op, [row[j] for row in values])
                chunks = {g: work.cupy.split(buf, n, axis=axis) for g, buf in per_gpu.items()}
                for r in range(n):
                    out[r][j] = chunks[self.plan.gpu_of(r)][r]
        await work.finish()
        return work.restore(out, kinds, inputs)

    async def broadcast(self, values: Sequence[object], num_replicas: int) -> list[list[object]]:
        """Copy the source's leaves once to each GPU; see :meth:`Backend.broadcast`.

        Replica ``r`` lives on the GPU of replica ``r % len(devices)``. Foreign leaves
        come back in the source's array type, on each replica's GPU (host arrays: on
        the source's device).
        """
        inputs, kinds = values, _foreign_leaves(values)
        if kinds is not None:
            values = _held([values], kinds)[0]
        work = _Work(self)
        targets = list(dict.fromkeys(self.plan.gpu_of(r) for r in range(num_replicas)))
        out: list[list[object]] = [[] for _ in range(num_replicas)]
        with work.native_errors("broadcast"):
            for value in values:
                home = work.home_gpu(value, targets[0])
                source = work.to_gpu(value, home)
                copies = {g: work.copy_to(source, home, g) for g in targets}
                for r in range(num_replicas):
                    out[r].append(copies[self.plan.gpu_of(r)].view())
        await work.finish()
        return work.restore(out, kinds, [inputs] * num_replicas, place_gpu=False)

    async def reduce(
        self, op: ReduceOp, components: Sequence[object], axis: tuple[int, ...] | None
    ) -> object:
        """Reduce onto replica 0's GPU, one new writable array; see :meth:`Backend.reduce`.

        The result is a CuPy array, or in the first component's array type (and on its
        device) when that is another library's.
        """
        inputs, components, kinds = _held_components(components)
        if components:
            spec = self.describe(components[0])
            _reducible(np.dtype(spec.dtype))
            await self._compile(_reduce_on_variants(op, len(components), spec.dtype, axis))
        work = _Work(self)
        gpu = self.plan.gpu_of(0)
        with work.native_errors(f"reduce({op.value})"):
            arrays = [work.to_gpu(c, gpu) for c in components]
            _reducible(arrays[0].dtype)
            result = work.reduce_on(op, arrays, gpu, axis)
        await work.finish()
        return work.restore([[result]], kinds, [inputs[:1]])[0][0]

    async def gather(self, components: Sequence[object], axis: int) -> object:
        """Concatenate onto replica 0's GPU, one new array; see :meth:`Backend.gather`.

        The result is a CuPy array, or in the first component's array type (and on its
        device) when that is another library's.
        """
        inputs, components, kinds = _held_components(components)
        work = _Work(self)
        gpu = self.plan.gpu_of(0)
        with work.native_errors("gather"):
            arrays = [work.to_gpu(c, gpu) for c in components]
            with work.use(gpu):
                result = work.cupy.concatenate(arrays, axis=axis)
        await work.finish()
        return work.restore([[result]], kinds, [inputs[:1]])[0][0]

    async def aclose(self) -> None:
        """Destroy the NCCL communicators and drop the streams."""
        comms, self._comms = self._comms, None
        for comm in comms or ():
            comm.destroy()
        self._streams.clear()

    # -- helpers ---------------------------------------------------------------------------

    def _stream(self, cupy: Any, gpu: int) -> Any:
        """This backend's stream on ``gpu`` (made on first use, with ``gpu`` current)."""
        stream = self._streams.get(gpu)
        if stream is None:
            with cupy.cuda.Device(gpu):
                stream = self._streams[gpu] = cupy.cuda.Stream(non_blocking=True)
        return stream

    def _nccl_module(self) -> Any:
        """``cupy.cuda.nccl`` when CuPy found libnccl, else None (peer copies are used)."""
        if not self._nccl_checked:
            self._nccl_checked = True
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # CuPy warns when libnccl is missing
                try:
                    from cupy.cuda import nccl
                except ImportError:
                    nccl = None
            self._nccl = nccl if getattr(nccl, "available", False) else None
        return self._nccl

    def _route(self, op: ReduceOp, dtype: str) -> Route:
        if not self.plan.multi_gpu:
            return Route.LOCAL
        return reduction_route(
            self.plan,
            op,
            dtype,
            exact_order=self.exact_order,
            # No communicators (no libnccl, or after aclose()): peer copies, same result.
            nccl=self._comms is not None,
        )

    def _make_communicators(self) -> list[Any] | None:
        """One NCCL communicator per distinct GPU (``initAll``), or None without NCCL."""
        if not self.plan.multi_gpu:
            return None
        nccl = self._nccl_module()
        if nccl is None:
            return None
        gpus = list(self.plan.gpus)
        try:
            return list(nccl.NcclCommunicator.initAll(gpus))
        except Exception as exc:
            raise BackendError(
                f"could not create the NCCL communicators of GPUs {gpus} "
                f"({type(exc).__name__}: {exc}); check that each GPU is visible and healthy "
                "(nvidia-smi), or set NCCL_DEBUG=INFO to see why"
            ) from exc

    async def _prepare_kernels(self, op: ReduceOp, values: Leaves) -> None:
        """Compile, off the event loop, the fold kernels this reduction will run."""
        variants: set[FoldVariant] = set()
        for leaf in values[0]:
            spec = self.describe(leaf)
            if spec.dtype not in FOLD_DTYPES:
                continue  # complex: CuPy's ufuncs; bool: refused when the work starts
            if isinstance(leaf, IndexedSlices):
                if op is ReduceOp.MEAN:
                    integer = not spec.dtype.startswith("float")
                    dtype = "int64" if integer else spec.dtype
                    variants.update(fold_steps(1, op, dtype, divide=True))
                continue
            route = self._route(op, spec.dtype)
            variants |= reduction_variants(self.plan, op, spec.dtype, route)
        await self._compile(variants)

    async def _compile(self, variants: set[FoldVariant] | Sequence[FoldVariant]) -> None:
        """Compile and load ``variants`` on every GPU of the plan, in a worker thread.

        The first use of a kernel compiles it (NVRTC, ~0.1 s); NVRTC releases the GIL, so
        the loop keeps running. Later calls find them loaded and return at once.
        """
        missing = [(v, g) for v in variants for g in self.plan.gpus if (v, g) not in _loaded]
        if not missing:
            return
        cupy = _import_cupy()
        try:
            await anyio.to_thread.run_sync(_load_kernels, cupy, missing)
        except Exception as exc:
            if _is_compile_error(exc):
                raise _kernel_error(exc, "preparing the collective") from exc
            if isinstance(exc, RuntimeError | MemoryError):
                raise BackendError(
                    f"loading the GPU kernels failed ({type(exc).__name__}: {exc})"
                ) from exc
            raise


def _reduce_on_variants(
    op: ReduceOp, count: int, dtype: str, axis: tuple[int, ...] | None
) -> list[FoldVariant]:
    """The fold kernels ``Strategy.reduce`` of ``count`` components runs (see ``reduce_on``)."""
    if op is ReduceOp.MEAN and dtype in FOLD_DTYPES and not dtype.startswith("float"):
        # Widened to int64 and summed exactly, then one division (integer_mean_on); the
        # kernels are compiled even where the MEAN ends up taken on the host.
        sums = fold_steps(count, ReduceOp.SUM, "int64", divide=False) if count > 1 else []
        return [*sums, EXACT_SUM_DIVISION]
    if axis is None:
        if dtype not in FOLD_DTYPES:
            return []
        return fold_steps(count, op, dtype, divide=op is ReduceOp.MEAN)
    # Each component is first reduced along the axes by CuPy: sums and products of small
    # integers widen as numpy's do.
    local = np.dtype(dtype)
    if op is not ReduceOp.MIN and op is not ReduceOp.MAX:
        local = np.zeros(1, local).sum().dtype
    if local.name not in FOLD_DTYPES:
        return []
    if op is not ReduceOp.MEAN:
        return fold_steps(count, op, local.name, divide=False)
    return fold_steps(count, ReduceOp.SUM, local.name, divide=False) + fold_steps(
        1, ReduceOp.MEAN, local.name, divide=True
    )


def _foreign_leaves(row: Sequence[object]) -> list[Foreign | None] | None:
    """How each leaf of ``row`` is foreign (see :func:`foreign_of`); None when none is.

    Replica 0's leaves decide: the ledger checked that every replica's leaf ``j`` has
    the same array type.
    """
    kinds = [foreign_of(v) for v in row]
    return None if kinds.count(None) == len(kinds) else kinds


def _held(values: Leaves, kinds: Sequence[Foreign | None]) -> list[list[object]]:
    """``values`` with host foreign leaves as numpy arrays (CUDA ones as they are)."""
    return [
        [v if k is None else host_leaf(v, k) for v, k in zip(row, kinds, strict=True)]
        for row in values
    ]


def _held_components(
    components: Sequence[object],
) -> tuple[Sequence[object], Sequence[object], list[Foreign | None] | None]:
    """``Strategy.reduce``/``gather`` components: as given, as held, and the first's kind."""
    if not components:
        return components, components, None
    first = foreign_of(components[0])
    if first is None:
        return components, components, None
    held = []
    for c in components:
        kind = foreign_of(c)
        held.append(c if kind is None else host_leaf(c, kind))
    return components, held, [first]


class _Work:
    """The device work of one collective: streams it touched, buffers it must keep alive.

    Every method enqueues work and returns at once; :meth:`finish` awaits it all.
    """

    def __init__(self, backend: CupyBackend) -> None:
        self.backend = backend
        self.plan = backend.plan
        self.cupy = _import_cupy()
        self.touched: list[int] = []
        # Temporaries read by another stream (peer copies): freeing them early could let
        # CuPy's pool hand their memory to new work before the reader is done.
        self.keep: list[Any] = []

    # -- streams ---------------------------------------------------------------------------

    def enter(self, gpu: int) -> None:
        """Make this backend's stream on ``gpu`` wait for the work the user queued there."""
        if gpu in self.touched:
            return
        self.touched.append(gpu)
        cupy = self.cupy
        ours = self.backend._stream(cupy, gpu)
        with cupy.cuda.Device(gpu):
            user = cupy.cuda.get_current_stream()
            event = cupy.cuda.Event(disable_timing=True)
            event.record(user)
            ours.wait_event(event)

    @contextlib.contextmanager
    def use(self, gpu: int) -> Iterator[Any]:
        """Make ``gpu`` and this backend's stream on it current (never across an await)."""
        self.enter(gpu)
        cupy = self.cupy
        stream = self.backend._stream(cupy, gpu)
        with cupy.cuda.Device(gpu), stream:
            yield stream

    def handoff(self, src: int, dst: int) -> None:
        """Make ``dst``'s stream wait for the work queued so far on ``src``'s stream."""
        if src == dst:
            return
        self.enter(src)
        self.enter(dst)
        cupy = self.cupy
        with cupy.cuda.Device(src):
            event = cupy.cuda.Event(disable_timing=True)  # made on src: recorded on src
            event.record(self.backend._stream(cupy, src))
        with cupy.cuda.Device(dst):
            self.backend._stream(cupy, dst).wait_event(event)

    async def finish(self) -> None:
        """Await every stream this collective used (shielded: buffers stay alive till done)."""
        cupy = self.cupy
        with self.native_errors("waiting for the GPUs"):
            events = []
            for gpu in self.touched:
                with cupy.cuda.Device(gpu):
                    event = cupy.cuda.Event(disable_timing=True)
                    event.record(self.backend._stream(cupy, gpu))
                events.append(event)
        with anyio.CancelScope(shield=True), self.native_errors("waiting for the GPUs"):
            await wait_for_events(events)
        self.keep.clear()

    def restore(
        self,
        results: list[list[object]],
        kinds: Sequence[Foreign | None] | None,
        inputs: Sequence[Sequence[object]],
        *,
        place_gpu: bool = True,
    ) -> list[list[object]]:
        """Foreign leaves' results in their input's type (after :meth:`finish`).

        See :func:`asyncreplica_cupy._routing.restore`; ``results`` as they are when no
        leaf is foreign.
        """
        if kinds is None:
            return results
        with self.native_errors("giving the results back in the inputs' array types"):
            return restore(
                self.cupy,
                results,
                kinds,
                inputs,
                place_gpu=place_gpu,
                stream_of=lambda gpu: self.backend._stream(self.cupy, gpu),
            )

    @contextlib.contextmanager
    def native_errors(self, what: str) -> Iterator[None]:
        """Turn CUDA, NCCL and out-of-memory errors into ``BackendError`` (cause kept)."""
        try:
            yield
        except BackendError:
            raise
        except Exception as exc:
            if _is_compile_error(exc):
                raise _kernel_error(exc, f"{what} on the GPUs ({self.plan.describe()})") from exc
            if not isinstance(exc, RuntimeError | MemoryError):
                raise
            raise BackendError(
                f"{what} failed on the GPUs ({self.plan.describe()}): "
                f"{type(exc).__name__}: {exc}. Out of memory: free arrays or use fewer "
                "replicas per GPU; other CUDA errors: run with CUDA_LAUNCH_BLOCKING=1 to see "
                "where it happens"
            ) from exc

    # -- moving values -----------------------------------------------------------------------

    def home_gpu(self, value: object, default: int) -> int:
        """The GPU a value already lives on, or ``default`` for a host value."""
        if _is_cupy_array(value):
            return int(value.device.id)  # type: ignore[attr-defined]
        device = _dlpack_cuda_device(value)
        return default if device is None else device

    def to_gpu(self, value: object, gpu: int) -> Any:
        """``value`` as a CuPy array on ``gpu``: in place when it is already there."""
        cupy = self.cupy
        if isinstance(value, cupy.ndarray):
            array, home = value, int(value.device.id)
        elif (device := _dlpack_cuda_device(value)) is not None:
            with self.use(device):  # the producer syncs its stream with ours (DLPack)
                array = cupy.from_dlpack(value)
            home = device
        elif (cai := _cuda_array_interface(value)) is not None:
            array = self.from_cuda_array_interface(value, cai)
            home = int(array.device.id)
        else:
            host = _host_array(value, "a collective's value")
            with self.use(gpu):
                array = cupy.asarray(host)  # the one host-to-device copy
            self.keep.append(array)
            return array
        if array.dtype.kind not in _HOLDABLE_KINDS:
            raise TypeError(_not_holdable(value, "a collective's value"))
        if home != gpu:
            return self.copy_to(array, home, gpu)
        self.enter(gpu)
        return array

    def from_cuda_array_interface(self, value: object, cai: dict[str, Any]) -> Any:
        """A CuPy view of a ``__cuda_array_interface__`` value, ordered after its producer.

        ``cupy.asarray`` of a v3 interface that names a stream calls
        ``cudaStreamSynchronize`` on it: a host wait, on the event loop. Instead the view
        is made from the interface without its stream, and this backend's stream waits on
        an event recorded on the producer's stream (no host wait).
        """
        cupy = self.cupy
        producer = cai.get("stream")
        array = cupy.asarray(_WithoutStream(value, cai))  # a view: no copy, no kernel
        gpu = int(array.device.id)
        self.enter(gpu)
        if producer is not None:
            with cupy.cuda.Device(gpu):
                event = cupy.cuda.Event(disable_timing=True)
                event.record(_external_stream(cupy, int(producer)))
                self.backend._stream(cupy, gpu).wait_event(event)
        return array

    def copy_to(self, array: Any, src: int, dst: int) -> Any:
        """A new copy of ``array`` (on ``src``) on ``dst``.

        CuPy copies between GPUs only from a contiguous array, and makes a strided source
        contiguous on the source GPU's *current* stream (the user's), which nothing here
        orders. So the source is made contiguous first, on this backend's stream of
        ``src``, and only then handed to ``dst``'s stream.
        """
        if src != dst and not (array.flags.c_contiguous or array.flags.f_contiguous):
            with self.use(src):
                array = self.cupy.ascontiguousarray(array)
        self.handoff(src, dst)
        with self.use(dst):
            copy = array.copy()  # CuPy copies onto the current device, peer to peer
        self.keep.append(array)
        self.keep.append(copy)
        return copy

    # -- combining -------------------------------------------------------------------------

    def fold(self, op: ReduceOp, arrays: Sequence[Any], gpu: int, divide_by: int | None) -> Any:
        """A new array: ``arrays`` (all on ``gpu``) folded left to right, then divided.

        ``divide_by`` is ``None`` or the ``MEAN`` divisor; integers are divided into
        float64. Fused kernels read each input once; complex values use CuPy's ufuncs.
        """
        cupy = self.cupy
        dtype = arrays[0].dtype
        with self.use(gpu):
            if dtype.kind == "c":
                ufunc = getattr(cupy, _UFUNC[op])
                acc = arrays[0].copy()
                for a in arrays[1:]:
                    ufunc(acc, a, out=acc)
                if divide_by is not None:
                    cupy.true_divide(acc, divide_by, out=acc)
                return acc
            if dtype.name not in FOLD_DTYPES:  # pragma: no cover - describe refuses others
                raise TypeError(f"cannot reduce values of dtype {dtype}")
            steps = fold_steps(len(arrays), op, dtype.name, divide=divide_by is not None)
            acc = None
            for chunk, variant in zip(fold_chunks(len(arrays)), steps, strict=True):
                inputs = ([] if acc is None else [acc]) + [
                    cupy.ascontiguousarray(arrays[k]) for k in chunk
                ]
                out = cupy.empty(arrays[0].shape, variant.out_dtype)
                args: list[Any] = [*inputs, out]
                if variant.mode is FoldMode.MEAN:  # the divisor as numpy rounds it
                    args.append(np.float64(dtype.type(divide_by)))
                elif variant.mode is FoldMode.MEAN_TO_FLOAT64:
                    args.append(np.float64(divide_by))
                size = int(out.size)
                args.append(np.int64(size))
                if size:
                    blocks = min(-(-size // _BLOCK), _MAX_BLOCKS)
                    _kernel(cupy, variant, gpu)((blocks,), (_BLOCK,), tuple(args))
                self.keep.extend(inputs)
                acc = out
            return acc

    def reduce_dense(self, op: ReduceOp, leaf: Sequence[object]) -> dict[int, Any]:
        """Every replica's dense leaf combined; the result buffer of each GPU, by GPU."""
        plan = self.plan
        arrays = [self.to_gpu(v, plan.gpu_of(r)) for r, v in enumerate(leaf)]
        dtype = arrays[0].dtype
        _reducible(dtype)
        if op is ReduceOp.MEAN and dtype.kind in "iu":
            return self.integer_mean(arrays)
        divisor = mean_divisor(plan) if op is ReduceOp.MEAN else None
        route = self.backend._route(op, dtype.name)
        if route is Route.LOCAL:
            gpu = plan.gpus[0]
            return {gpu: self.fold(op, arrays, gpu, divisor)}
        if route is Route.NCCL:
            return self._reduce_nccl(op, arrays, divisor)
        # CHAIN: the running result visits the replicas in replica order.
        acc: Any = None
        at = -1
        segments = plan.segments
        for i, segment in enumerate(segments):
            inputs = [arrays[r] for r in segment.replicas]
            if acc is not None:
                inputs.insert(0, self.copy_to(acc, at, segment.gpu))
            last = i == len(segments) - 1
            if acc is not None:
                self.keep.append(acc)
            acc = self.fold(op, inputs, segment.gpu, divisor if last else None)
            at = segment.gpu
        per_gpu = {at: acc}
        for gpu in plan.gpus:
            if gpu != at:
                per_gpu[gpu] = self.copy_to(acc, at, gpu)
        return per_gpu

    def integer_mean(self, arrays: Sequence[Any]) -> dict[int, Any]:
        """The ``MEAN`` of every replica's integer array (``arrays[r]`` on its GPU), by GPU.

        Exact, as on the host: the values are never summed in their own dtype, which
        wraps around. 8 to 32-bit integers are widened to int64 on their GPU, all-reduced
        as an int64 ``SUM`` on the usual route (exact: :func:`integer_mean_dtype`), and
        each GPU divides that sum once into float64. Otherwise (64-bit integers, whose
        sum may need more bits) the MEAN is taken on the host by the numpy backend's rule
        and copied to each GPU.
        """
        plan = self.plan
        n = mean_divisor(plan)
        if integer_mean_dtype(arrays[0].dtype.name, n) is None:
            mean = self.mean_on_host(arrays, None)
            return {gpu: self.from_host(mean, gpu) for gpu in plan.gpus}
        wide = [self.widen(a, plan.gpu_of(r)) for r, a in enumerate(arrays)]
        sums = self.reduce_dense(ReduceOp.SUM, wide)
        return {gpu: self.fold(ReduceOp.MEAN, [total], gpu, n) for gpu, total in sums.items()}

    def widen(self, array: Any, gpu: int) -> Any:
        """A new int64 copy of the integer ``array`` (on ``gpu``), made on ``gpu``."""
        with self.use(gpu):
            wide = array.astype(self.cupy.int64)
        self.keep.append(array)
        return wide

    def mean_on_host(self, arrays: Sequence[Any], axis: tuple[int, ...] | None) -> Any:
        """The exact ``MEAN`` of integer ``arrays`` by the numpy backend's rule, on the host.

        Each array is copied to the host on this backend's stream of its GPU (a blocking
        copy: the price of an exact MEAN of 64-bit integers; see docs/gpu.md).
        """
        cupy = self.cupy
        host = []
        for a in arrays:
            gpu = int(a.device.id)
            with self.use(gpu) as stream:
                host.append(cupy.asnumpy(a, stream=stream))
        return mean_of_integers(host, axis)

    def from_host(self, array: Any, gpu: int) -> Any:
        """A new CuPy copy of the numpy ``array`` on ``gpu``."""
        with self.use(gpu):
            out = self.cupy.asarray(array)
        self.keep.append(array)
        return out

    def _reduce_nccl(
        self, op: ReduceOp, arrays: Sequence[Any], divisor: int | None
    ) -> dict[int, Any]:
        """Fold each GPU's replicas, then one NCCL all-reduce per rank, in one group."""
        cupy, plan, backend = self.cupy, self.plan, self.backend
        nccl = backend._nccl_module()
        comms = backend._comms
        if nccl is None or comms is None:  # pragma: no cover - _prepare_nccl made them
            raise AssertionError("the NCCL route needs communicators; _prepare_nccl makes them")
        sends: dict[int, Any] = {}
        recvs: dict[int, Any] = {}
        for gpu in plan.gpus:
            mine = [arrays[r] for r in plan.replicas_on(gpu)]
            if len(mine) == 1:
                with self.use(gpu):
                    send = cupy.ascontiguousarray(mine[0])
            else:  # MEAN folds as SUM here; the division comes after NCCL
                send = self.fold(op, mine, gpu, None)
            with self.use(gpu):
                recvs[gpu] = cupy.empty(send.shape, send.dtype)
            sends[gpu] = send
        dtype = arrays[0].dtype
        count = int(arrays[0].size)
        if count:
            code, reduction = getattr(nccl, NCCL_DTYPES[dtype.name]), getattr(nccl, NCCL_OPS[op])
            nccl.groupStart()
            try:
                for gpu in plan.gpus:
                    with cupy.cuda.Device(gpu):
                        comms[plan.rank_of(gpu)].allReduce(
                            sends[gpu].data.ptr,
                            recvs[gpu].data.ptr,
                            count,
                            code,
                            reduction,
                            backend._stream(cupy, gpu).ptr,
                        )
            finally:
                nccl.groupEnd()
        self.keep.extend(sends.values())
        if divisor is None:
            return recvs
        return {gpu: self.fold(ReduceOp.MEAN, [buf], gpu, divisor) for gpu, buf in recvs.items()}

    def everywhere(self, arrays: Sequence[Any]) -> dict[int, list[Any]]:
        """For each GPU, every replica's array (``arrays[r]`` on replica ``r``'s GPU) on it."""
        plan = self.plan
        out: dict[int, list[Any]] = {}
        for gpu in plan.gpus:
            out[gpu] = [
                a if plan.gpu_of(r) == gpu else self.copy_to(a, plan.gpu_of(r), gpu)
                for r, a in enumerate(arrays)
            ]
        return out

    def concatenate_everywhere(self, leaf: Sequence[object], axis: int) -> dict[int, Any]:
        """Every replica's leaf concatenated in replica order, once on each GPU."""
        arrays = [self.to_gpu(v, self.plan.gpu_of(r)) for r, v in enumerate(leaf)]
        joined = {}
        for gpu, pieces in self.everywhere(arrays).items():
            with self.use(gpu):
                joined[gpu] = self.cupy.concatenate(pieces, axis=axis)
        return joined

    def reduce_slices(self, op: ReduceOp, leaf: Sequence[object]) -> list[IndexedSlices]:
        """``IndexedSlices`` all-reduced: values and indices concatenated in replica order."""
        if op not in (ReduceOp.SUM, ReduceOp.MEAN):
            raise ValueError(f"IndexedSlices can be reduced with SUM or MEAN only, not {op.value}")
        parts = [s for s in leaf if isinstance(s, IndexedSlices)]
        values = self.concatenate_everywhere([s.values for s in parts], 0)
        indices = self.concatenate_everywhere([s.indices for s in parts], 0)
        if op is ReduceOp.MEAN:
            n = mean_divisor(self.plan)
            if values[self.plan.gpus[0]].dtype.kind in "iu":  # one division of each value
                values = {g: self.widen(v, g) for g, v in values.items()}
            values = {g: self.fold(ReduceOp.MEAN, [v], g, n) for g, v in values.items()}
        out = []
        for r, part in enumerate(parts):
            gpu = self.plan.gpu_of(r)
            out.append(IndexedSlices(values[gpu].view(), indices[gpu].view(), part.dense_shape))
        return out

    def reduce_on(
        self, op: ReduceOp, arrays: Sequence[Any], gpu: int, axis: tuple[int, ...] | None
    ) -> Any:
        """``Strategy.reduce`` of components all on ``gpu``: a new array."""
        if op is ReduceOp.MEAN and arrays[0].dtype.kind in "iu":
            return self.integer_mean_on(arrays, gpu, axis)
        if axis is None:
            return self.fold(op, arrays, gpu, len(arrays) if op is ReduceOp.MEAN else None)
        cupy = self.cupy
        with self.use(gpu):
            if op is ReduceOp.MEAN:
                locals_ = [cupy.asarray(a.sum(axis=axis)) for a in arrays]
            else:
                locals_ = [cupy.asarray(getattr(a, _LOCAL[op])(axis=axis)) for a in arrays]
        self.keep.extend(locals_)
        if op is not ReduceOp.MEAN:
            return self.fold(op, locals_, gpu, None)
        total = self.fold(ReduceOp.SUM, locals_, gpu, None)
        count = sum(int(np.prod([a.shape[k] for k in axis])) for a in arrays)
        if count == 0:
            with self.use(gpu):
                return cupy.true_divide(total, count)
        return self.fold(ReduceOp.MEAN, [total], gpu, count)

    def integer_mean_on(self, arrays: Sequence[Any], gpu: int, axis: tuple[int, ...] | None) -> Any:
        """``Strategy.reduce(MEAN)`` of integer components all on ``gpu``, exactly.

        As :meth:`integer_mean`: widened to int64 and summed there when that is exact,
        else on the host by the numpy backend's rule.
        """
        if axis is None:
            count = len(arrays)
        else:
            count = sum(math.prod(int(a.shape[k]) for k in axis) for a in arrays)
        if count == 0 or integer_mean_dtype(arrays[0].dtype.name, count) is None:
            return self.from_host(self.mean_on_host(arrays, axis), gpu)
        wide = [self.widen(a, gpu) for a in arrays]
        if axis is not None:
            with self.use(gpu):
                wide = [self.cupy.asarray(w.sum(axis=axis)) for w in wide]
            self.keep.extend(wide)
        total = self.fold(ReduceOp.SUM, wide, gpu, None) if len(wide) > 1 else wide[0]
        return self.fold(ReduceOp.MEAN, [total], gpu, count)
