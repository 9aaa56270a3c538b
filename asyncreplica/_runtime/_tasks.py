"""Looking at tasks without disturbing them: which tasks a replica runs, and where each waits.

The runtime needs two facts that no event loop offers directly:

* every task a replica runs -- its main task and every task created inside it (which
  inherits its context, so only those can issue its collectives). On trio they are the
  main task's nursery descendants; on asyncio a task factory, installed while a run is
  active, records each task created in a replica's context;
* where a task waits: the await chain of its coroutine, from the outermost frame to the
  innermost awaitable.

From them, :func:`blocked` decides whether a task can still issue a collective without
another replica's help. Everything here is read-only introspection.
"""

from __future__ import annotations

import asyncio
import os
import threading
import weakref
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

__all__ = ["TaskWatch", "blocked", "current_task", "whereabouts"]

_RUNTIME_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
# Frames of the event loops and of the runtime are not where a user's code waits.
_INTERNAL = (
    *tuple(
        os.path.dirname(os.path.abspath(m.__file__)) + os.sep
        for m in (asyncio,)
        if m.__file__ is not None
    ),
    _RUNTIME_DIR,
)


def _internal(filename: str) -> bool:
    return (
        filename.startswith(_INTERNAL)
        or f"{os.sep}anyio{os.sep}" in filename
        or (f"{os.sep}trio{os.sep}" in filename)
    )


def current_task() -> object:
    """Return the running task object (an asyncio task or a trio task)."""
    try:
        task = asyncio.current_task()
    except RuntimeError:
        task = None
    if task is not None:
        return task
    import trio

    return trio.lowlevel.current_task()


def _coro(task: object) -> Any:
    if isinstance(task, asyncio.Task):
        return task.get_coro()
    return getattr(task, "coro", None)


def _chain(task: object) -> tuple[list[FrameType], object]:
    """The frames of ``task``'s await chain, outermost first, and the innermost awaitable."""
    frames: list[FrameType] = []
    obj: Any = _coro(task)
    while obj is not None:
        frame = getattr(obj, "cr_frame", None) or getattr(obj, "gi_frame", None)
        if frame is None:
            return frames, obj
        frames.append(frame)
        nxt = getattr(obj, "cr_await", None)
        if nxt is None:
            nxt = getattr(obj, "gi_yieldfrom", None)
        if nxt is None:
            return frames, obj
        obj = nxt
    return frames, None


def _done(task: object) -> bool:
    if isinstance(task, asyncio.Task):
        return task.done()
    coro = getattr(task, "coro", None)
    return coro is None or getattr(coro, "cr_frame", None) is None


def whereabouts(task: object) -> str:
    """Where ``task`` waits, for people: ``awaiting at io.py:12 in load()``."""
    if _done(task):
        return "finished"
    frames, _ = _chain(task)
    if not frames:
        return "not started yet"
    if frames[-1].f_lasti < 0:
        return "not started yet"
    for frame in reversed(frames):
        if not _internal(frame.f_code.co_filename):
            code = frame.f_code
            return f"awaiting at {_short(code.co_filename)}:{frame.f_lineno} in {code.co_name}()"
    frame = frames[-1]
    return f"awaiting in {frame.f_code.co_name}()"


def _short(filename: str) -> str:
    parts = filename.replace("\\", "/").rsplit("/", 2)
    return "/".join(parts[-2:]) if len(parts) > 2 else filename


def _joining(frames: list[FrameType], innermost: object) -> bool:
    """Whether the task only waits for its child tasks (a task group's exit, gather)."""
    if hasattr(innermost, "_children") and isinstance(innermost, asyncio.Future):
        return True  # asyncio.gather's future
    for frame in frames:
        name = frame.f_code.co_name
        if name in ("__aexit__", "_nested_child_finished") and _internal(frame.f_code.co_filename):
            owner = frame.f_locals.get("self")
            if owner is not None and (
                hasattr(owner, "_tasks")
                or hasattr(owner, "_nursery")
                or name == "_nested_child_finished"
            ):
                return True
    return False


def blocked(task: object, parked: Callable[[object], bool]) -> bool:
    """Whether ``task`` cannot issue a collective until another replica acts.

    True when it is finished, parked on one of the run's collectives still in flight
    (``parked(task)``), or only waiting for its own child tasks. False when it is
    runnable, not started, or waiting for anything else (I/O, a sleep, an event).
    """
    if _done(task) or parked(task):
        return True
    frames, innermost = _chain(task)
    if not frames or frames[-1].f_lasti < 0:
        return False
    return _joining(frames, innermost)


def _trio_descendants(task: Any) -> Iterator[object]:
    for nursery in getattr(task, "child_nurseries", ()):
        for child in nursery.child_tasks:
            yield child
            yield from _trio_descendants(child)


class TaskWatch:
    """Records the tasks each replica of a run creates.

    On asyncio it installs a task factory on the running loop for as long as any run
    is active (chaining to a factory that was already there); on trio the tasks are
    found from each replica's main task when asked.

    Args:
        owner: Given a context's replica, which run and replica id it belongs to.
    """

    def __init__(self) -> None:
        self.main: dict[int, object] = {}
        self._children: dict[int, weakref.WeakSet[Any]] = {}

    def adopt(self, replica: int, task: object) -> None:
        """Record ``task`` as one of ``replica``'s tasks."""
        self._children.setdefault(replica, weakref.WeakSet()).add(task)

    def tasks(self, replica: int) -> list[object]:
        """Every live task of ``replica`` that is known."""
        main = self.main.get(replica)
        if main is None:
            return []
        found = [main, *self._children.get(replica, ())]
        if not isinstance(main, asyncio.Task):
            found.extend(_trio_descendants(main))
        return found


_factories: dict[asyncio.AbstractEventLoop, tuple[int, Any]] = {}


def install_factory(
    loop: asyncio.AbstractEventLoop, on_create: Callable[[asyncio.Task[Any]], None]
) -> None:
    """Install (or count another user of) the recording task factory on ``loop``."""
    users, previous = _factories.get(loop, (0, None))
    if users == 0:
        previous = loop.get_task_factory()

        def factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
            if previous is not None:
                task: Any = previous(loop, coro, **kwargs)
            else:
                task = asyncio.Task(coro, loop=loop, **kwargs)
            on_create(task)
            return task  # type: ignore[no-any-return]

        loop.set_task_factory(factory)
    _factories[loop] = (users + 1, previous)


def uninstall_factory(loop: asyncio.AbstractEventLoop) -> None:
    """Undo one :func:`install_factory`; the last one restores the previous factory."""
    users, previous = _factories[loop]
    if users == 1:
        del _factories[loop]
        loop.set_task_factory(previous)
    else:
        _factories[loop] = (users - 1, previous)


# One task-exit instrument per trio run (a RunVar), created on first use: trio's
# instruments belong to a run, and two runs may be going at once in two threads.
_trio_watch: Any = None
_trio_watch_lock = threading.Lock()


def _trio_watch_var() -> Any:
    """The ``RunVar`` that holds the current trio run's task-exit instrument."""
    global _trio_watch
    with _trio_watch_lock:
        if _trio_watch is None:
            import trio

            class _ExitWatch(trio.abc.Instrument):
                """Calls every active run's ``on_exit`` when a task of this trio run exits."""

                def __init__(self) -> None:
                    self.callbacks: list[Callable[[object], None]] = []

                def task_exited(self, task: trio.lowlevel.Task) -> None:
                    for callback in list(self.callbacks):
                        callback(task)

            _trio_watch = (trio.lowlevel.RunVar("asyncreplica_exit_watch"), _ExitWatch)
        return _trio_watch


def install_trio_watch(on_exit: Callable[[object], None]) -> None:
    """Call ``on_exit(task)`` whenever a task of this trio run exits, until uninstalled."""
    import trio

    var, watch_class = _trio_watch_var()
    instrument = var.get(None)
    if instrument is None:
        instrument = watch_class()
        trio.lowlevel.add_instrument(instrument)
        var.set(instrument)
    instrument.callbacks.append(on_exit)


def uninstall_trio_watch(on_exit: Callable[[object], None]) -> None:
    """Undo one :func:`install_trio_watch` (in the same trio run)."""
    import trio

    var, _ = _trio_watch_var()
    instrument = var.get()
    instrument.callbacks.remove(on_exit)
    if not instrument.callbacks:
        trio.lowlevel.remove_instrument(instrument)
        var.set(None)
