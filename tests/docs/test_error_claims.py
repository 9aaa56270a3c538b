"""What docs/errors.md and docs/gpu.md say about GPU devices without CuPy is what happens.

The ``cupy`` backend ships with asyncreplica; CuPy comes with the ``[gpu]`` extra. GPU
devices without CuPy therefore raise ``BackendError`` (the backend is there and cannot
run), not ``BackendNotFoundError`` (no backend of that name), and both pages say so.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import asyncreplica as ar

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _section(page: str, anchor: str) -> str:
    text = (DOCS / page).read_text(encoding="utf-8")
    body = text.split(f'<a id="{anchor}"></a>', 1)[1]
    return body.split('<a id="', 1)[0]


def test_gpu_devices_without_cupy_raise_backend_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cupy", None)  # `import cupy` fails, as without CuPy

    with pytest.raises(ar.BackendError) as info:
        ar.MirroredStrategy(["GPU:0", "GPU:1"])

    assert not isinstance(info.value, ar.BackendNotFoundError)
    assert "CuPy is not installed" in str(info.value)
    assert 'pip install "asyncreplica[gpu]"' in str(info.value)


def test_the_pages_say_backend_error() -> None:
    backend_error = " ".join(_section("errors.md", "backenderror").split())
    assert 'MirroredStrategy(["GPU:0", "GPU:1"])` says that CuPy is not installed' in backend_error
    not_found = " ".join(_section("errors.md", "backendnotfounderror").split())
    assert "GPU devices without CuPy raise [BackendError]" in not_found
    gpu = " ".join((DOCS / "gpu.md").read_text(encoding="utf-8").split())
    assert "Asking for GPU devices where there are none raises `BackendError`" in gpu
