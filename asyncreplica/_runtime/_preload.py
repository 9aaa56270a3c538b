"""Import anyio's event-loop backends before a run, not during one.

anyio imports its backend for the running loop (``anyio._backends._asyncio``, with the
modules it needs) the first time a task group or event is used under that loop. Inside
the first ``Strategy.run`` of a process that import blocked the event loop for 70-100 ms
(``asyncio.run(..., debug=True)`` logged it as a slow callback). A strategy therefore
imports the backends when it is built: asyncio's always (uvloop uses it too), trio's when
trio is already imported (a program that runs on trio has imported it by then).
"""

from __future__ import annotations

import importlib
import sys

__all__ = ["preload_async_backends"]


def _backend_module(library: str) -> str:
    # anyio resolves the running library to this module (anyio._core._eventloop).
    return f"anyio._backends._{library}"


def preload_async_backends() -> None:
    """Import anyio's backend for asyncio, and for trio when trio is imported."""
    libraries = ["asyncio"]
    if "trio" in sys.modules:
        libraries.append("trio")
    for library in libraries:
        name = _backend_module(library)
        if name not in sys.modules:
            importlib.import_module(name)
