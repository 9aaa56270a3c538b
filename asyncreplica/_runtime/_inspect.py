"""Capture a collective's call path cheaply, from frame objects.

The call path is the whole chain of user frames from the collective call down to
the replica's step function: there is no depth limit, because a swapped pair of
collectives that differs only in a frame beyond the limit would pair silently. What
keeps it cheap is that the walk reads only ``f_code`` and ``f_lasti`` (no line table
lookup) and finds the finished path in a dictionary keyed by those, so a call site
seen before costs one step per frame and one lookup; the path's frames (file, line,
column, function) are computed once per distinct chain.

Three kinds of frames:

* the runtime's own (the module ``asyncreplica._runtime`` and its submodules): the
  collective method above the user's frames, the replica driver below them, where
  the walk stops;
* the event loops' own (the real modules of asyncio, trio, anyio, uvloop, sniffio,
  outcome, told by module identity, never by a file's path): skipped, so that a task
  group's ``start_soon`` or ``asyncio.wait_for`` between user frames says nothing;
* everything else is the user's, including a user package that happens to live in a
  directory named ``asyncio``.

The walk also stops where a scheduler resumed a coroutine: a frame that is not a
coroutine's, below a coroutine's frame, can only have resumed it (``send``), as the
event loop's task step does for a helper task. Frames below it belong to whatever
started the loop, not to the replica.

A helper task's path goes on where the task was started: when a replica creates a
task, :func:`record_spawn` captures the call path of the line that created it (that
line's own task's spawn path included), and every collective the task issues has its
own frames followed by those. Two helper tasks started from different lines in a
different order per replica therefore differ, as two direct calls would.
"""

from __future__ import annotations

import functools
import inspect
import linecache
import sys
import weakref
from itertools import islice
from types import CodeType, FrameType, FunctionType
from typing import Any, Final

from .._core._signature import CallSite
from ._tasks import current_task

__all__ = [
    "LOOP_PACKAGES",
    "UNCHECKED",
    "call_path",
    "clear_caches",
    "forget_spawn",
    "record_spawn",
    "register_driver",
    "warn_unchecked",
]

# The packages whose frames are an event loop's own (by module identity).
LOOP_PACKAGES = frozenset({"asyncio", "trio", "anyio", "uvloop", "sniffio", "outcome"})
_RUNTIME: Final = __name__.rpartition(".")[0]  # "asyncreplica._runtime"
_RUNTIME_PREFIX: Final = _RUNTIME + "."

# A code's kind: bit 0 says a coroutine's (or async generator's) frame; the rest says
# whose frame it is (the user's, an event loop's own: skipped, the runtime's: a stop).
# (Final: compiled, they are constants, and the caches below static references, not
# look-ups in the module's namespace on every use.)
_USER: Final = 0
_USER_ASYNC: Final = 1
_SKIP: Final = 2
_SKIP_ASYNC: Final = 3
_STOP: Final = 4
_STOP_ASYNC: Final = 5  # a runtime coroutine: the replica's driver
_CO_ASYNC: Final = inspect.CO_COROUTINE | inspect.CO_ITERABLE_COROUTINE | inspect.CO_ASYNC_GENERATOR

# Each code object's kind, by id(code): looking up an int costs far less than hashing a
# code object (which hashes its bytecode and constants on every lookup). _codes holds
# every code object seen, so that its id stays its own.
_kinds: Final[dict[int, int]] = {}
_codes: Final[dict[int, CodeType]] = {}
# Interned call paths keyed by the flat chain ``(id(code), f_lasti, ...)``: a frame's
# instruction offset costs nothing to read, while its line number is looked up in the
# code's line table on every access. Every code in a key is held by _codes.
_paths_at: Final[dict[tuple[int, ...], tuple[CallSite, ...]]] = {}
# The same paths by value: chains of offsets that resolve to the same places share one
# tuple, so comparing two replicas' paths is usually an identity check.
_paths: Final[dict[tuple[CallSite, ...], tuple[CallSite, ...]]] = {}
# Each frame's place, by (id(code), f_lasti).
_sites: Final[dict[tuple[int, int], CallSite]] = {}
# The caches are cleared past this many paths, or this many frames in all (a deep
# recursion that issues collectives at many depths must not grow them without bound).
# (Not Final: read on the slow path only, and tests lower them.)
_MAX_PATHS = 100_000
_MAX_FRAMES = 2_000_000
# Every cache is cleared past this many code objects: code generated per step (exec,
# compile) makes new code objects for ever, and each one held costs kilobytes.
_MAX_CODES = 8_192
_cached_frames: Final = [0]  # the frames of every path in _paths_at
# The runtime coroutines that drive a replica (register_driver): the walk stops there.
# Other runtime coroutines above the user's frames are passed through.
_DRIVERS: Final[set[int]] = set()
_DRIVER_CODES: Final[list[CodeType]] = []  # keeps each driver's id its own


# Caches of other modules keyed by the paths made here (_issuing's interned signatures):
# cleared with these, so that what they hold goes with the paths.
DEPENDENT_CACHES: Final[list[dict[Any, Any]]] = []


def clear_caches() -> None:
    """Forget every code, site and path seen (they are found again on the next walk)."""
    for cache in DEPENDENT_CACHES:
        cache.clear()
    _kinds.clear()
    _codes.clear()
    _paths_at.clear()
    _paths.clear()
    _sites.clear()
    _joined.clear()
    _cached_frames[0] = 0


def register_driver(code: CodeType) -> None:
    """Mark ``code`` (a runtime coroutine's) as a replica's driver: call paths end there."""
    _DRIVER_CODES.append(code)
    _DRIVERS.add(id(code))


def _is_module(name: str, namespace: dict[str, Any]) -> bool:
    """Whether ``namespace`` is the globals of the imported module called ``name``."""
    module = sys.modules.get(name)
    return module is not None and getattr(module, "__dict__", None) is namespace


def _kind(frame: FrameType) -> int:
    code = frame.f_code
    namespace = frame.f_globals
    name = namespace.get("__name__")
    kind = _USER
    if isinstance(name, str):
        if (name == _RUNTIME or name.startswith(_RUNTIME_PREFIX)) and _is_module(name, namespace):
            kind = _STOP
        elif name.partition(".")[0] in LOOP_PACKAGES and _is_module(name, namespace):
            kind = _SKIP
    if code.co_flags & _CO_ASYNC:
        kind += 1
    if len(_codes) >= _MAX_CODES:
        # The walk that asked goes on: _resolve holds the codes of the path it makes.
        clear_caches()
    _codes[id(code)] = code
    _kinds[id(code)] = kind
    return kind


_getframe: Final = sys._getframe

# The call path of the line that started each live helper task, by id(task), beside
# a weak reference to the task (an entry is dropped when its task ends, forget_spawn,
# or is freed; the reference tells a task from a later one that reuses the id).
_spawned: Final[dict[int, tuple[weakref.ref[Any], tuple[CallSite, ...]]]] = {}
# A task's own path followed by its spawn path, interned: keyed by the ids of both
# (each entry holds both, so the ids stay theirs) and cleared with the other caches.
_joined: Final[dict[tuple[int, int], tuple[Any, Any, tuple[CallSite, ...]]]] = {}


def call_path() -> tuple[CallSite, ...]:
    """Return the frames from the collective's caller down to the replica's step function.

    The walk starts at the first frame outside the runtime and stops at the runtime's
    replica driver, or where a scheduler resumed the coroutines above it. Coroutines
    that await each other are chained through ``f_back`` while they run, so the step
    function's frame is on this chain. Event-loop frames are skipped. In a helper task
    the replica started, the path goes on with the call path of the line that started
    the task (:func:`record_spawn`).
    """
    # The caller's frame. Compiled (mypyc), this function has no frame of its own, so the
    # caller's is the innermost one; interpreted, it is one up. (Starting at this
    # function's own frame would make it reference itself: a cycle per collective.)
    path = _path_from(_getframe(_CALLER_DEPTH))
    if _spawned:
        path = _with_spawn(path)
    return path


# The path of a collective whose caller has no Python frame (code compiled with mypyc or
# Cython, a C function): no line of it can be compared. An interned constant, so that
# the check costs an identity comparison.
UNCHECKED: Final[tuple[CallSite, ...]] = (
    CallSite("<code without Python frames>", 0, "<compiled code>", None),
)
_warned_unchecked: Final = [False]


def warn_unchecked() -> None:
    """Say, once per process, that a call site could not be checked (see UNCHECKED)."""
    if _warned_unchecked[0]:
        return
    _warned_unchecked[0] = True
    import warnings

    warnings.warn(
        "asyncreplica: a collective was issued by code that has no Python frames (a module "
        "compiled with mypyc or Cython, or a C function calling the collective), so its "
        "call site cannot be checked: collectives issued there pair by position only, and "
        "two of them in swapped order would pair silently. Give such collectives a name=, "
        "or run that code interpreted. (Warned once per process.)",
        RuntimeWarning,
        stacklevel=4,
    )


def record_spawn(task: object) -> None:
    """Record where ``task`` was started: the call path of the code creating it.

    Call it synchronously from the task's creation (a task factory, trio's
    ``task_spawned``), inside the replica that creates it; the runtime's and the event
    loop's frames above the creating line are skipped. A task started with no user
    frame on the stack (by the runtime itself) gets no entry.
    """
    path = _path_from(sys._getframe(_CALLER_DEPTH))  # the caller's frame, as call_path's
    if path is UNCHECKED:
        return  # no user frame (the runtime's own task, or compiled code): nothing to add
    if _spawned:
        path = _with_spawn(path)
    if path:
        key = id(task)
        _spawned[key] = (weakref.ref(task, functools.partial(_freed, key)), path)


def _freed(key: int, ref: weakref.ref[Any]) -> None:
    entry = _spawned.get(key)
    if entry is not None and entry[0] is ref:
        del _spawned[key]


def forget_spawn(task: object) -> None:
    """Drop ``task``'s spawn path (call it when the task ends)."""
    entry = _spawned.get(id(task))
    if entry is not None and entry[0]() is task:
        del _spawned[id(task)]


def _with_spawn(path: tuple[CallSite, ...]) -> tuple[CallSite, ...]:
    """``path`` followed by the running task's spawn path, if it has one."""
    try:
        task = current_task()
    except RuntimeError:  # no task is running (called outside an event loop)
        return path
    entry = _spawned.get(id(task))
    if entry is None or entry[0]() is not task:
        return path
    spawn = entry[1]
    key = (id(path), id(spawn))
    joined = _joined.get(key)
    if joined is not None and joined[0] is path and joined[1] is spawn:
        return joined[2]
    if len(_joined) >= _MAX_PATHS:
        _joined.clear()
    candidate = path + spawn
    whole = _paths.setdefault(candidate, candidate)
    _joined[key] = (path, spawn, whole)
    return whole


def _path_from(first: FrameType) -> tuple[CallSite, ...]:
    """The interned call path of the user frames from ``first`` down (see call_path)."""
    frame: FrameType | None = first
    # Direct calls on the typed containers (no bound-method locals): compiled, they are
    # native dict and list operations.
    kinds = _kinds
    key: list[int] = []
    inner_async = 0
    skipped = False  # the event loop's frames came first, before any user frame
    while frame is not None:
        code = frame.f_code
        code_id = id(code)
        kind = kinds.get(code_id)
        if kind is None:
            kind = _kind(frame)
        if kind == _USER_ASYNC:
            key.append(code_id)
            key.append(frame.f_lasti)
        elif kind == _USER:
            if inner_async and key:
                break  # a scheduler (or a driver) that resumed the coroutines above
            if skipped and not key:
                # The first user frame is below the event loop's: whatever started the
                # loop. The task's own frames are not Python's.
                key.clear()
                break
            key.append(code_id)
            key.append(frame.f_lasti)
        elif kind == _STOP:
            if key:
                break  # the runtime's own frames, below the user's
        elif kind == _STOP_ASYNC:
            if key or id(frame.f_code) in _DRIVERS:
                break  # the replica driver: below the user's frames (none: compiled code)
            # A runtime coroutine that issues a collective for the user (extended.update's
            # merge_call): the user's frames that called it come next.
        elif kind == _SKIP and inner_async and key:
            break
        else:
            skipped = not key and kind == _SKIP
        inner_async = kind & 1
        frame = frame.f_back
    if not key:
        return UNCHECKED
    at = tuple(key)
    path = _paths_at.get(at)
    if path is None:
        path = _resolve(at, first)
    return path


# 1 when this module runs interpreted, 0 when compiled: then call_path is not a Python
# function and has no frame (see call_path).
_CALLER_DEPTH: Final = 1 if isinstance(call_path, FunctionType) else 0


def _resolve(at: tuple[int, ...], first: FrameType) -> tuple[CallSite, ...]:
    """The interned path of the chain ``at``, read from the frames from ``first`` on."""
    if len(_paths_at) >= _MAX_PATHS or _cached_frames[0] >= _MAX_FRAMES:
        _paths_at.clear()
        _paths.clear()
        _cached_frames[0] = 0
    if len(_sites) >= _MAX_PATHS:
        _sites.clear()
    # The same walk as call_path's, collecting the frames of the key's pairs.
    frames: list[FrameType] = []
    frame: FrameType | None = first
    while frame is not None and len(frames) * 2 < len(at):
        pair = (id(frame.f_code), frame.f_lasti)
        if at[2 * len(frames) : 2 * len(frames) + 2] == pair:
            frames.append(frame)
        frame = frame.f_back
    sites = []
    for frame in frames:
        code = frame.f_code
        _codes[id(code)] = code  # every id in the key stays its code's (see clear_caches)
        site_key = (id(code), frame.f_lasti)
        site = _sites.get(site_key)
        if site is None:
            site = _sites[site_key] = _site(frame)
        sites.append(site)
    candidate = tuple(sites)
    path = _paths.setdefault(candidate, candidate)
    _paths_at[at] = path
    _cached_frames[0] += len(path)
    return path


def _site(frame: FrameType) -> CallSite:
    """Where ``frame`` is: its file, line, 1-based column and function."""
    code = frame.f_code
    lineno: int | None = None
    column: int | None = None
    if frame.f_lasti >= 0:
        position = next(islice(code.co_positions(), frame.f_lasti // 2, None), None)
        if position is not None:
            lineno, _, offset, _ = position
            if offset is not None and lineno is not None:
                column = _char_column(code.co_filename, lineno, offset) + 1
    if lineno is None:
        lineno = frame.f_lineno
    return CallSite(code.co_filename, lineno, code.co_name, column)


def _char_column(filename: str, lineno: int, offset: int) -> int:
    """The character column of UTF-8 byte ``offset`` in the line (as tracebacks count)."""
    line = linecache.getline(filename, lineno)
    if not line or line.isascii():
        return offset
    return len(line.encode("utf-8")[:offset].decode("utf-8", errors="replace"))
