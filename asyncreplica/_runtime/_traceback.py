"""Tracebacks of asyncreplica's errors show the user's frames, not the library's.

A collective error travels from the ledger that detects it, through the run's machinery
and the replica's task, to ``Strategy.run``: 20 to 50 traceback lines, most of them in
``_run.py`` and ``_ledger.py``, which say nothing about the user's bug. Before ``run``
re-raises such an error, :func:`hide_library_frames` drops the frames of asyncreplica,
its backends and anyio from the traceback and keeps the user's (the step function's
line that awaited the collective, the code that called ``run``). ``run`` then re-raises
it with a bare ``raise``, which adds no frame of its own.

``ASYNCREPLICA_FULL_TRACEBACK=1`` in the environment keeps the whole traceback; a note on
the error says so whenever frames were hidden.
"""

from __future__ import annotations

import os
from types import TracebackType
from typing import TypeVar

from .._registry import plugin_packages

__all__ = ["ENV", "NOTE", "hide_library_frames"]

ENV = "ASYNCREPLICA_FULL_TRACEBACK"
NOTE = f"(asyncreplica's own frames are hidden from this traceback; set {ENV}=1 to show them)"
_E = TypeVar("_E", bound=BaseException)


def _library_packages() -> frozenset[str]:
    """asyncreplica, anyio and the installed plugins: their frames are hidden."""
    return frozenset({"asyncreplica", "anyio", *plugin_packages()})


def _is_library(tb: TracebackType, packages: frozenset[str]) -> bool:
    # By the frame's module, never by a file path (a user's folder may share a name).
    name = tb.tb_frame.f_globals.get("__name__")
    return isinstance(name, str) and name.partition(".")[0] in packages


def hide_library_frames(error: _E) -> _E:
    """Drop the library's frames from ``error``'s traceback, unless the environment asks not to.

    Args:
        error: An error that is about to leave ``Strategy.run``.

    Returns:
        ``error`` itself, with a shorter ``__traceback__`` and a note saying how to see
        the full one when any frame was dropped.
    """
    if os.environ.get(ENV, "") not in ("", "0"):
        return error
    packages = _library_packages()
    kept: list[TracebackType] = []
    dropped = False
    tb = error.__traceback__
    while tb is not None:
        if _is_library(tb, packages):
            dropped = True
        else:
            kept.append(tb)
        tb = tb.tb_next
    if not dropped:
        return error
    chain: TracebackType | None = None
    for entry in reversed(kept):
        chain = TracebackType(chain, entry.tb_frame, entry.tb_lasti, entry.tb_lineno)
    error.__traceback__ = chain
    if NOTE not in getattr(error, "__notes__", ()):
        error.add_note(NOTE)
    return error
