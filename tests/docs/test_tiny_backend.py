"""The example backend of docs/backends.md passes the conformance suite, as the page says.

The page tells plugin authors to inherit ``BackendConformanceTests``; this module does
exactly that for ``docs/examples/backends/tiny_backend.py``, so the example cannot
drift from the contract.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from asyncreplica import _registry
from asyncreplica.abc import Backend
from asyncreplica.testing import BackendConformanceTests

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "backends" / "tiny_backend.py"


def _load() -> ModuleType:
    # Importing the example runs it: it registers "tiny" and runs its own asserts. The
    # registration is undone afterwards, so that other tests (the pytest plugin's
    # `strategy` fixture runs over every registered backend) do not see it.
    registered = dict(_registry._registered)
    try:
        return _exec()
    finally:
        _registry._registered.clear()
        _registry._registered.update(registered)


def _exec() -> ModuleType:
    spec = importlib.util.spec_from_file_location("_docs_tiny_backend", EXAMPLE)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


tiny = _load()


class TestTinyBackend(BackendConformanceTests):
    def make_backend(self, devices: list[str]) -> Backend:
        backend: Backend = tiny.TinyBackend(devices)
        return backend
