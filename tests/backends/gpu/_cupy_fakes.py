"""Stand-ins for CuPy on machines without it (imported by the tests of this folder)."""

from __future__ import annotations

import sys
from types import ModuleType, SimpleNamespace

import pytest


class FakeCudaError(RuntimeError):
    """What CuPy raises when the driver or the device is missing."""


def hide_real_cupy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make CuPy's submodules unimportable for one test, so that a stand-in ``cupy`` is all
    there is: ``from cupy.cuda import nccl`` must not find the real NCCL (on a machine with
    CuPy and fewer GPUs than the stand-in reports, it would try to use GPUs that are not
    there).
    """
    for name in [m for m in sys.modules if m.startswith("cupy.") or m == "cupy"]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "cupy.cuda", None)  # type: ignore[arg-type]


def fake_cupy(device_count: int | Exception) -> ModuleType:
    """A stand-in ``cupy`` module whose runtime reports ``device_count`` GPUs (or raises it)."""

    def get_device_count() -> int:
        if isinstance(device_count, Exception):
            raise device_count
        return device_count

    module = ModuleType("cupy")
    module.ndarray = type("ndarray", (), {})  # type: ignore[attr-defined]
    module.cuda = SimpleNamespace(  # type: ignore[attr-defined]
        runtime=SimpleNamespace(getDeviceCount=get_device_count)
    )
    return module


# A recording stand-in for the parts of CuPy a collective touches ---------------------------------


class SimCompileException(Exception):
    """Stands for ``cupy.cuda.compiler.CompileException`` (derives from Exception only)."""


SimCompileException.__module__ = "cupy.cuda.compiler"


class SimStream:
    """A CUDA stream: ``with stream:`` makes it current on its device."""

    def __init__(self, cp: SimCupy, name: str, device: int, ptr: int = 0) -> None:
        self.cp, self.name, self.device_id, self.ptr = cp, name, device, ptr

    def __enter__(self) -> SimStream:
        self.cp.stream_stack.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        self.cp.stream_stack.pop()

    def wait_event(self, event: SimEvent) -> None:
        self.cp.log.append(("wait", self.name, event.name))


class SimEvent:
    """A CUDA event; recording it logs which stream it was recorded on."""

    def __init__(self, cp: SimCupy, disable_timing: bool = False) -> None:
        cp.events += 1
        self.cp, self.name, self.done = cp, f"event{cp.events}", True

    def record(self, stream: SimStream) -> None:
        self.cp.log.append(("record", self.name, stream.name))


class SimFlags:
    def __init__(self, c: bool, f: bool) -> None:
        self.c_contiguous, self.f_contiguous = c, f


class SimArray:
    """A CuPy array: where it lives, its layout, and the log of what made it."""

    def __init__(
        self, cp: SimCupy, device: int, contiguous: bool = True, shape: tuple[int, ...] = (4,)
    ) -> None:
        self.cp, self.shape, self.size = cp, shape, 4
        self.device = SimpleNamespace(id=device)
        self.flags = SimFlags(contiguous, False)
        self.dtype = __import__("numpy").dtype("float32")

    def copy(self) -> SimArray:
        cp = self.cp
        if not (self.flags.c_contiguous or self.flags.f_contiguous):
            # As CuPy does: a contiguous temporary on the source GPU's *current* stream.
            cp.log.append(("contiguous", self.device.id, cp.stream_on(self.device.id).name))
        cp.log.append(("copy", self.device.id, cp.device, cp.current_stream().name))
        return SimArray(cp, cp.device)


class SimCupy(ModuleType):
    """A ``cupy`` module with ``gpus`` GPUs that logs streams, events, copies and compiles."""

    def __init__(self, gpus: int = 2) -> None:
        super().__init__("cupy")
        self.__version__ = "14.2.0-sim"
        self.log: list[tuple[object, ...]] = []
        self.compiled: list[tuple[str, int, str]] = []  # (kernel, GPU, thread name)
        self.compile_error: Exception | None = None
        self.device = 0
        self.events = 0
        self.stream_stack: list[SimStream] = []
        self.users = {g: SimStream(self, f"user{g}", g) for g in range(gpus)}
        cp = self
        self.ndarray = SimArray

        class Device:
            def __init__(self, gpu: int) -> None:
                self.gpu = gpu

            def __enter__(self) -> None:
                self.previous, cp.device = cp.device, self.gpu

            def __exit__(self, *exc: object) -> None:
                cp.device = self.previous

        class RawKernel:
            def __init__(self, code: str, name: str) -> None:
                self.code, self.name = code, name

            @property
            def kernel(self) -> RawKernel:
                import threading

                if cp.compile_error is not None:
                    raise cp.compile_error
                cp.compiled.append((self.name, cp.device, threading.current_thread().name))
                return self

        def stream(non_blocking: bool = False) -> SimStream:
            return SimStream(cp, f"ours{cp.device}", cp.device)

        def external(ptr: int, device_id: int = -1) -> SimStream:
            return SimStream(cp, f"external{ptr}", cp.device, ptr)

        self.RawKernel = RawKernel
        self.cuda = SimpleNamespace(
            Device=Device,
            Stream=stream,
            ExternalStream=external,
            Event=lambda disable_timing=False: SimEvent(cp, disable_timing),
            get_current_stream=self.current_stream,
            runtime=SimpleNamespace(getDeviceCount=lambda: gpus),
        )

    def stream_on(self, gpu: int) -> SimStream:
        """The current stream of ``gpu``: the innermost ``with stream`` of it, else the user's."""
        for stream in reversed(self.stream_stack):
            if stream.device_id == gpu:
                return stream
        return self.users[gpu]

    def current_stream(self) -> SimStream:
        return self.stream_on(self.device)

    def ascontiguousarray(self, array: SimArray) -> SimArray:
        self.log.append(("contiguous", array.device.id, self.current_stream().name))
        return SimArray(self, self.device)

    def asarray(self, value: object) -> SimArray:
        cai = value.__cuda_array_interface__  # type: ignore[attr-defined]
        if cai.get("stream") is not None:
            self.log.append(("streamSynchronize", cai["stream"]))  # what CuPy would do
        self.log.append(("asarray", cai["device"]))
        return SimArray(self, cai["device"])


# A GPU array library that is neither CuPy nor numpy (as PyTorch on CUDA, JAX on GPU) ----------


class FakeGpuNamespace(ModuleType):
    """``fakegpu``: an array-API namespace whose ``from_dlpack`` wraps what it is given.

    ``refuse`` makes ``from_dlpack`` raise ``BufferError`` that many times first (as JAX
    does for a GPU buffer that is not aligned); ``imported`` records each producer.
    """

    def __init__(self) -> None:
        super().__init__("fakegpu")
        self.refuse = 0
        self.imported: list[object] = []

    def from_dlpack(self, x: object) -> FakeGpuTensor:
        if self.refuse:
            self.refuse -= 1
            raise BufferError("fakegpu imports aligned buffers only")
        self.imported.append(x)
        return FakeGpuTensor(x, self)


class FakeGpuTensor:
    """A tensor of ``fakegpu`` on a CUDA device: it wraps its producer, never copies.

    Every DLPack call goes to ``inner`` (a CuPy array on a GPU, or a stand-in for one),
    so ``inner`` is the buffer the tensor reads: zero-copy is ``tensor.inner is result``.
    """

    def __init__(
        self, inner: object, namespace: FakeGpuNamespace, device: int | None = None
    ) -> None:
        self.inner, self.namespace = inner, namespace
        self.moved_from: int | None = None
        self._device = int(inner.__dlpack_device__()[1]) if device is None else device  # type: ignore[attr-defined]

    def __array_namespace__(self, api_version: str | None = None) -> FakeGpuNamespace:
        return self.namespace

    def __dlpack__(self, **kwargs: object) -> object:
        return self.inner.__dlpack__(**kwargs)  # type: ignore[attr-defined]

    def __dlpack_device__(self) -> tuple[int, int]:
        return (2, self._device)

    @property
    def device(self) -> str:
        return f"cuda:{self._device}"

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.inner.shape)  # type: ignore[attr-defined]

    @property
    def dtype(self) -> object:
        return self.inner.dtype  # type: ignore[attr-defined]

    def to_device(self, device: str, /, *, stream: object = None) -> FakeGpuTensor:
        moved = FakeGpuTensor(self.inner, self.namespace, int(device.removeprefix("cuda:")))
        moved.moved_from = self._device
        return moved


FakeGpuTensor.__module__ = "fakegpu"

#: The one ``fakegpu`` namespace: ``array_api_compat`` finds a type's namespace once and
#: the backends cache it per type, so every test uses (and resets) this one.
FAKEGPU = FakeGpuNamespace()
