"""The cupy backend on a machine without a GPU: imports, errors, fallbacks, device checks.

Nothing here needs CuPy or a GPU. Where a test needs "CuPy installed", a stand-in module
(``conftest.fake_cupy``) reports a number of GPUs, or fails like CUDA without a device.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
from _cupy_fakes import FakeCudaError, fake_cupy, hide_real_cupy
from asyncreplica_cupy import INSTALL_HINT, CupyBackend, visible_gpu_count
from asyncreplica_numpy import NumpyBackend

import asyncreplica as ar
from asyncreplica.abc import Backend, LeafSpec
from asyncreplica.testing import BackendConformanceTests

ROOT = Path(__file__).resolve().parents[3]


def _run_without_cupy(code: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter where ``import cupy`` fails, as without CuPy."""
    prelude = textwrap.dedent(
        """
        import sys, importlib.abc

        class _NoCupy(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name == "cupy" or name.startswith(("cupy.", "cupy_backends")):
                    raise ModuleNotFoundError(f"No module named {name!r}", name=name)
                return None

        sys.meta_path.insert(0, _NoCupy())
        """
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT), str(ROOT / "backends"), *filter(None, [env.get("PYTHONPATH")])]
    )
    return subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


# Without CuPy -----------------------------------------------------------------------------------


def test_package_imports_without_cupy_and_says_how_to_install_it() -> None:
    proc = _run_without_cupy(
        """
        import asyncreplica as ar
        import asyncreplica_cupy
        from asyncreplica_cupy import CupyBackend, visible_gpu_count

        assert "cupy" not in sys.modules, "importing the backend imported cupy"
        assert visible_gpu_count() == 0
        for call in (CupyBackend.check_available, CupyBackend.default_devices,
                     lambda: CupyBackend(["GPU:0"])):
            try:
                call()
            except ar.BackendError as exc:
                assert "CuPy is not installed" in str(exc), exc
                assert 'pip install "asyncreplica[gpu]"' in str(exc), exc
                assert isinstance(exc.__cause__, ImportError), exc.__cause__
            else:
                raise AssertionError(f"{call} did not raise BackendError")
        print("ok")
        """
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip() == "ok"


def test_strategy_without_cupy_falls_back_to_cpu_and_refuses_gpus() -> None:
    proc = _run_without_cupy(
        """
        import asyncreplica as ar
        from asyncreplica.abc import register_backend
        from asyncreplica_cupy import CupyBackend

        # As when asyncreplica is installed with its `cupy` entry point.
        register_backend("cupy", CupyBackend, replace=True)

        strategy = ar.MirroredStrategy()
        assert strategy.extended.worker_devices == ("CPU:0",), strategy.extended.worker_devices
        assert type(strategy.backend).name == "numpy"

        for devices in (["GPU:0"], ["GPU:0", "GPU:0"], ["/gpu:1"]):
            try:
                ar.MirroredStrategy(devices)
            except ar.BackendError as exc:
                assert "CuPy is not installed" in str(exc), exc
                assert 'pip install "asyncreplica[gpu]"' in str(exc), exc
            else:
                raise AssertionError(f"MirroredStrategy({devices}) did not raise")
        assert "cupy" not in sys.modules
        print("ok")
        """
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip() == "ok"


# CuPy installed, but no GPU ---------------------------------------------------------------------


@pytest.mark.usefixtures("no_gpu")
def test_no_device_is_a_backend_error_that_says_what_to_check() -> None:
    assert visible_gpu_count() == 0
    with pytest.raises(ar.BackendError) as info:
        CupyBackend.check_available()
    message = str(info.value)
    assert "no usable GPU" in message
    assert "cudaErrorNoDevice" in message
    assert "nvidia-smi" in message
    assert "CUDA_VISIBLE_DEVICES" in message
    assert isinstance(info.value.__cause__, FakeCudaError)
    with pytest.raises(ar.BackendError, match="no usable GPU"):
        CupyBackend.default_devices()
    with pytest.raises(ar.BackendError, match="no usable GPU"):
        CupyBackend(["GPU:0"])


def test_zero_devices_is_a_backend_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy(0))
    with pytest.raises(ar.BackendError, match=r"no CUDA device is visible.*nvidia-smi"):
        CupyBackend.check_available()
    assert visible_gpu_count() == 0


@pytest.mark.usefixtures("no_gpu", "cupy_entry_point")
def test_strategy_with_no_gpu_picks_cpu_and_refuses_gpu_devices() -> None:
    strategy = ar.MirroredStrategy()
    assert strategy.extended.worker_devices == ("CPU:0",)
    assert type(strategy.backend).name == "numpy"
    with pytest.raises(ar.BackendError, match=r"no usable GPU.*CUDA_VISIBLE_DEVICES"):
        ar.MirroredStrategy(["GPU:0", "GPU:0"])
    with pytest.raises(ar.BackendError, match="no usable GPU"):
        ar.MirroredStrategy(backend="cupy")


# CuPy installed with GPUs (a stand-in: nothing runs on them here) -------------------------------


@pytest.fixture
def two_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    hide_real_cupy(monkeypatch)
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy(2))


@pytest.mark.usefixtures("two_gpus", "cupy_entry_point")
def test_strategy_with_gpus_picks_every_gpu_and_the_cupy_backend() -> None:
    assert visible_gpu_count() == 2
    assert CupyBackend.default_devices() == ["GPU:0", "GPU:1"]
    strategy = ar.MirroredStrategy()
    assert strategy.extended.worker_devices == ("GPU:0", "GPU:1")
    assert isinstance(strategy.backend, CupyBackend)
    # GPU devices select the cupy backend; a GPU may hold several replicas.
    shared = ar.MirroredStrategy(["GPU:0", "/device:GPU:0", "GPU:1"])
    assert shared.num_replicas_in_sync == 3
    assert isinstance(shared.backend, CupyBackend)
    assert shared.backend.plan.gpus == (0, 1)
    assert shared.backend.plan.replicas_on(0) == (0, 1)
    # CPU devices still may not repeat.
    with pytest.raises(ValueError, match="listed twice"):
        ar.MirroredStrategy(["CPU:0", "CPU:0"])


@pytest.mark.usefixtures("two_gpus")
def test_backend_refuses_gpus_cuda_does_not_show() -> None:
    with pytest.raises(ValueError, match=r"GPU 2, 5 requested, but CUDA shows 2 GPU\(s\)") as info:
        CupyBackend(["GPU:0", "GPU:2", "GPU:5"])
    assert "CUDA_VISIBLE_DEVICES" in str(info.value)


@pytest.mark.parametrize("devices", [["CPU:0"], ["GPU:0", "CPU:1"]])
def test_backend_refuses_cpu_devices_before_looking_for_cupy(devices: list[str]) -> None:
    # The device check needs no CuPy: it is the same message with or without it.
    with pytest.raises(ValueError, match=r"GPUs only.*backend='numpy'"):
        CupyBackend(devices)


@pytest.mark.usefixtures("two_gpus")
def test_backend_keeps_its_devices_and_options() -> None:
    backend = CupyBackend(["GPU:1", "GPU:1"], exact_order=False)
    assert isinstance(backend, Backend)
    assert backend.devices == ("GPU:1", "GPU:1")
    assert backend.name == "cupy"
    assert backend.exact_order is False
    assert backend.plan.gpus == (1,)
    assert CupyBackend(["GPU:0"]).exact_order is True


# describe: host values and foreign GPU arrays need no device ------------------------------------


class _CudaArray:
    """An array on a GPU seen only through ``__cuda_array_interface__`` (as Numba's)."""

    def __init__(self, shape: tuple[int, ...], typestr: str) -> None:
        self.__cuda_array_interface__ = {
            "shape": shape,
            "typestr": typestr,
            "data": (0, False),
            "version": 3,
        }


@pytest.mark.usefixtures("two_gpus")
@pytest.mark.parametrize(
    ("value", "spec"),
    [
        (np.zeros((2, 3), np.float32), LeafSpec((2, 3), "float32")),
        (np.int64(3), LeafSpec((), "int64")),
        (1.5, LeafSpec((), "float64")),
        (np.array([True, False]), LeafSpec((2,), "bool")),
        (_CudaArray((4, 2), "<f2"), LeafSpec((4, 2), "float16")),
        (_CudaArray((), "<i4"), LeafSpec((), "int32")),
        (
            ar.IndexedSlices(np.zeros((2, 4), np.float32), np.array([0, 3]), (10, 4)),
            LeafSpec((10, 4), "float32", sparse=True),
        ),
    ],
    ids=["ndarray", "numpy-scalar", "float", "bool", "cai-float16", "cai-0d", "indexed-slices"],
)
def test_describe(value: object, spec: LeafSpec) -> None:
    backend = CupyBackend(["GPU:0", "GPU:1"])
    assert backend.describe(value) == spec


@pytest.mark.usefixtures("two_gpus")
@pytest.mark.parametrize(
    "value",
    ["text", b"bytes", None, object(), np.array([object()]), _CudaArray((2,), "|O")],
    ids=["str", "bytes", "None", "object", "object-array", "cai-object"],
)
def test_describe_rejects_what_a_gpu_cannot_hold(value: object) -> None:
    backend = CupyBackend(["GPU:0"])
    with pytest.raises(TypeError, match=r"CuPy or numpy array.*DLPack"):
        backend.describe(value)


# Packaging --------------------------------------------------------------------------------------


def test_pyproject_registers_the_backend_and_the_gpu_extra() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    entry_points = project["project"]["entry-points"]["asyncreplica.backends"]
    assert entry_points["cupy"] == "asyncreplica_cupy:CupyBackend"
    # CuPy 14 compiles kernels with NVRTC and needs the CUDA headers: the [ctk] extra.
    assert any(
        dep.startswith("cupy-cuda12x[ctk]")
        for dep in project["project"]["optional-dependencies"]["gpu"]
    )
    assert (
        "backends/asyncreplica_cupy"
        in project["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"]
    )
    assert 'pip install "asyncreplica[gpu]"' in INSTALL_HINT


# The conformance suite's read-only check on CuPy -----------------------------------------------


class _CupyLike:
    """A result as the cupy backend returns it: an array without a read-only flag."""

    __module__ = "cupy._core.core"

    def __init__(self, array: np.ndarray[Any, Any]) -> None:
        self.array = array


class _CupyLikeResults(NumpyBackend):
    """The numpy backend, with all_reduce results wrapped like CuPy arrays."""

    async def all_reduce(
        self, op: ar.ReduceOp, values: Sequence[Sequence[object]], *, bytes_per_pack: int = 0
    ) -> list[list[object]]:
        rows = await super().all_reduce(op, values, bytes_per_pack=bytes_per_pack)
        return [[_CupyLike(leaf) for leaf in row] for row in rows]  # type: ignore[arg-type]


class _CupyLikeConformance(BackendConformanceTests):
    devices: ClassVar[list[str]] = ["CPU:0", "CPU:1"]

    def make_backend(self, devices: list[str]) -> Backend:
        return _CupyLikeResults(devices)


def test_read_only_check_says_it_is_not_enforceable_on_cupy() -> None:
    suite = _CupyLikeConformance()
    suite.backend = suite.make_backend(list(suite.devices))
    with pytest.raises(pytest.skip.Exception, match="not enforceable on CuPy"):
        suite.test_shared_results_are_read_only("all_reduce")
