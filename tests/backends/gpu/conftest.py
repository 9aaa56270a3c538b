"""The cupy backend's tests: the ``gpu`` marker, and how they find out whether a GPU is there.

Tests marked ``gpu`` need a CUDA GPU and CuPy; they skip, with the reason, where either
is missing. Everything else in this folder runs on any machine, with or without CuPy.
Run only the device tests with ``pytest -m gpu tests/backends/gpu``.
"""

from __future__ import annotations

import sys

import pytest
from _cupy_fakes import FakeCudaError, fake_cupy
from asyncreplica_cupy import CupyBackend, visible_gpu_count

from asyncreplica import BackendError, _registry


def _why_no_gpu() -> str:
    try:
        CupyBackend.check_available()
    except BackendError as exc:
        return f"needs a CUDA GPU and CuPy: {' '.join(str(exc).split())}"
    return "needs a CUDA GPU and CuPy"


GPUS = visible_gpu_count()
NO_GPU_REASON = "" if GPUS else _why_no_gpu()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "gpu: needs a CUDA GPU and CuPy; skipped with the reason where there is none"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip every ``gpu`` test (with the reason) where no GPU is visible."""
    if GPUS:
        return
    skip = pytest.mark.skip(reason=NO_GPU_REASON)
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


@pytest.fixture
def no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """CuPy is 'installed' but its CUDA runtime finds no device (as on a CPU-only machine)."""
    error = FakeCudaError("cudaErrorNoDevice: no CUDA-capable device is detected")
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy(error))


@pytest.fixture
def cupy_entry_point(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ``cupy`` entry point as an installed asyncreplica declares it, loaded afresh."""
    import importlib.metadata

    entry = importlib.metadata.EntryPoint(
        name="cupy", value="asyncreplica_cupy:CupyBackend", group=_registry.GROUP
    )
    monkeypatch.setattr(_registry, "_entry_points", {**_registry._discover(), "cupy": entry})
    monkeypatch.setattr(_registry, "_classes", {})
    monkeypatch.setattr(_registry, "_load_errors", {})
