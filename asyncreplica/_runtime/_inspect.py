"""Capture a collective's call path cheaply, from frame objects."""

from __future__ import annotations

import os
import sys

from .._core._signature import CallSite

__all__ = ["MAX_DEPTH", "call_path"]

# Frames in this directory are the runtime's own; the call path starts above them.
_RUNTIME_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
# Frames of the event loops' own code (a task group's start_soon calling the
# collective method, say) are left out of call paths: they say nothing about the user's.
_LOOP_DIRS = tuple(f"{os.sep}{name}{os.sep}" for name in ("asyncio", "anyio", "trio", "uvloop"))
# Enough frames to tell helpers apart, few enough to stay cheap.
MAX_DEPTH = 8


def call_path() -> tuple[CallSite, ...]:
    """Return the frames from the collective's caller up to the replica's step function.

    The walk starts at the first frame outside the runtime and stops at the runtime's
    replica driver (or after :data:`MAX_DEPTH` frames). Coroutines that await each
    other are chained through ``f_back`` while they run, so the step function's frame
    is on this chain.
    """
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_RUNTIME_DIR):
        frame = frame.f_back  # type: ignore[assignment]
    sites: list[CallSite] = []
    while (
        frame is not None
        and len(sites) < MAX_DEPTH
        and not frame.f_code.co_filename.startswith(_RUNTIME_DIR)
    ):
        code = frame.f_code
        if not any(d in code.co_filename for d in _LOOP_DIRS):
            sites.append(CallSite(code.co_filename, frame.f_lineno, code.co_name))
        frame = frame.f_back  # type: ignore[assignment]
    return tuple(sites)
