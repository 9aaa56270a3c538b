"""Stand-ins for CuPy on machines without it (imported by the tests of this folder)."""

from __future__ import annotations

from types import ModuleType, SimpleNamespace


class FakeCudaError(RuntimeError):
    """What CuPy raises when the driver or the device is missing."""


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
