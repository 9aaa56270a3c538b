"""Capture a collective's call path cheaply, from frame objects."""

from __future__ import annotations

import os
import sys
from types import CodeType

from .._core._signature import CallSite

__all__ = ["MAX_DEPTH", "call_path"]

# Frames in this directory are the runtime's own; the call path starts above them.
_RUNTIME_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
# Frames of the event loops' own code (a task group's start_soon calling the
# collective method, say) are left out of call paths: they say nothing about the user's.
_LOOP_DIRS = tuple(f"{os.sep}{name}{os.sep}" for name in ("asyncio", "anyio", "trio", "uvloop"))
# Enough frames to tell helpers apart, few enough to stay cheap.
MAX_DEPTH = 8

_USER, _SKIP, _STOP = 0, 1, 2
# Each code object's kind, by id(code). The entry holds the code object, so its id stays
# its own: looking up an int costs far less than hashing a code object (which hashes
# its bytecode and constants on every lookup).
_kinds: dict[int, tuple[CodeType, int]] = {}
# Interned call paths: the same (code, line) chain always gives the same tuple object,
# so comparing two replicas' paths is usually an identity check. Keyed by the flat
# chain ``(id(code), line, id(code), line, ...)``: every code in it is held by _kinds.
_paths: dict[tuple[int, ...], tuple[CallSite, ...]] = {}
# The same paths keyed by ``(id(code), f_lasti, ...)``: a frame's instruction offset
# costs nothing to read, while its line number is looked up in the code's line table
# on every access. Lines are computed once per distinct chain of offsets.
_paths_at: dict[tuple[int, ...], tuple[CallSite, ...]] = {}
_MAX_PATHS = 100_000


def _kind(code: CodeType) -> int:
    entry = _kinds.get(id(code))
    if entry is not None:
        return entry[1]
    name = code.co_filename
    if name.startswith(_RUNTIME_DIR):
        kind = _STOP
    elif any(d in name for d in _LOOP_DIRS):
        kind = _SKIP
    else:
        kind = _USER
    _kinds[id(code)] = (code, kind)
    return kind


def call_path() -> tuple[CallSite, ...]:
    """Return the frames from the collective's caller up to the replica's step function.

    The walk starts at the first frame outside the runtime and stops at the runtime's
    replica driver (or after :data:`MAX_DEPTH` frames). Coroutines that await each
    other are chained through ``f_back`` while they run, so the step function's frame
    is on this chain. Event-loop frames are skipped.
    """
    frame = sys._getframe(1)
    kinds = _kinds
    key: list[int] = []
    frames = []
    while frame is not None:
        code = frame.f_code
        entry = kinds.get(id(code))
        kind = _kind(code) if entry is None else entry[1]
        if kind == _USER:
            key += (id(code), frame.f_lasti)
            frames.append(frame)
            if len(key) == 2 * MAX_DEPTH:
                break
        elif kind == _STOP and key:
            break  # the replica driver, below the user's frames
        frame = frame.f_back  # type: ignore[assignment]
    at = tuple(key)
    path = _paths_at.get(at)
    if path is None:
        if len(_paths_at) >= _MAX_PATHS:
            _paths_at.clear()
        path = _paths_at[at] = _intern(tuple(x for f in frames for x in (id(f.f_code), f.f_lineno)))
    return path


def _intern(frozen: tuple[int, ...]) -> tuple[CallSite, ...]:
    """The interned path of ``(id(code), line, ...)``."""
    path = _paths.get(frozen)
    if path is None:
        if len(_paths) >= _MAX_PATHS:
            _paths.clear()
        codes = [_kinds[code_id][0] for code_id in frozen[::2]]
        path = _paths[frozen] = tuple(
            CallSite(code.co_filename, line, code.co_name)
            for code, line in zip(codes, frozen[1::2], strict=True)
        )
    return path
