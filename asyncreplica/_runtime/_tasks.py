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
import inspect
import os
import sys
import threading
import types
import weakref
from collections.abc import Callable, Iterator
from types import FrameType, TracebackType
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
        or f"{os.sep}outcome{os.sep}" in filename  # trio's way of resuming a task
    )


_trio_current_task: Callable[[], object] | None = None


def current_task() -> object:
    """Return the running task object (an asyncio task or a trio task).

    Asks asyncio only when an asyncio loop runs in this thread: on trio, asking
    ``asyncio.current_task()`` raises (and catching that cost several times what
    finding the task does, once per collective of a helper task with a start path).
    """
    global _trio_current_task
    loop = asyncio._get_running_loop()
    if loop is not None:
        task = asyncio.current_task(loop)
        if task is not None:
            return task
    if _trio_current_task is None:
        import trio

        _trio_current_task = trio.lowlevel.current_task
    return _trio_current_task()


def _coro(task: object) -> Any:
    if isinstance(task, asyncio.Task):
        return task.get_coro()
    return getattr(task, "coro", None)


def _chain(task: object) -> tuple[list[FrameType], object]:
    """The frames of ``task``'s await chain, outermost first, and the innermost awaitable."""
    return _walk(_coro(task))


def _walk(obj: Any) -> tuple[list[FrameType], object]:
    """The frames of the await chain that starts at coroutine ``obj``, and its end."""
    frames: list[FrameType] = []
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
    return _describe(frames)


def where_awaits(coro: object) -> str:
    """Where the coroutine ``coro`` (suspended) waits, for people, as :func:`whereabouts`."""
    frames, _ = _walk(coro)
    return _describe(frames)


def _describe(frames: list[FrameType]) -> str:
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


def where_raised(tb: TracebackType | None) -> str:
    """Where a cancellation found a task, for people: its innermost frame of user code."""
    found = None
    while tb is not None:
        if not _internal(tb.tb_frame.f_code.co_filename):
            found = tb
        elif found is not None:
            break  # past the user's code, into the event loop's
        tb = tb.tb_next
    if found is None:
        return "unknown"
    code = found.tb_frame.f_code
    return f"awaiting at {_short(code.co_filename)}:{found.tb_lineno} in {code.co_name}()"


def where_called() -> str | None:
    """The innermost line of user code on the stack, ``file:line in function()``; or None.

    For a hook the loop calls synchronously from the user's call (trio's instruments).
    """
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_globals.get("__name__")
        own = isinstance(name, str) and name.partition(".")[0] == "asyncreplica"
        if not own and not _internal(frame.f_code.co_filename):
            code = frame.f_code
            return f"{_short(code.co_filename)}:{frame.f_lineno} in {code.co_name}()"
        frame = frame.f_back  # type: ignore[assignment]
    return None


def _short(filename: str) -> str:
    parts = filename.replace("\\", "/").rsplit("/", 2)
    return "/".join(parts[-2:]) if len(parts) > 2 else filename


def _joining(frames: list[FrameType], innermost: object) -> bool:
    """Whether the task only waits for its child tasks (a task group's or nursery's exit)."""
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


# asyncio's own code that a join runs in: recognised by identity, never by a path.
_WAIT_CODE = getattr(getattr(asyncio.tasks, "_wait", None), "__code__", None)
_SHIELD_CALLBACK = "shield.<locals>._outer_done_callback"


def asyncio_internals_missing() -> list[str]:
    """What deadlock detection reads of asyncio's private names, and this Python lacks.

    Each entry names the private name and what reading it gives: without it that way
    of waiting is not seen through, so a wait cycle behind it is found by the stall
    warning and ``timeout_seconds`` instead of at once. Empty on every Python the
    project supports (tests/runtime/test_asyncio_internals.py fails the day one changes).
    """
    missing = []
    task_members = dir(asyncio.Task)
    if "_fut_waiter" not in task_members:
        missing.append(
            "asyncio.Task._fut_waiter (which future a task awaits: replicas parked at a "
            "collective and every join)"
        )
    future_members = dir(asyncio.Future)
    for name in ("_callbacks", "_exception"):
        if name not in future_members:
            missing.append(
                f"asyncio.Future.{name} (asyncio.shield, failed joins, and collectives "
                "driven by hand whose result arrives with no task awaiting it)"
            )
    wait = _WAIT_CODE
    if wait is None or not {"fs", "timeout", "return_when", "waiter"} <= {
        *wait.co_varnames,
        *wait.co_cellvars,
    }:
        missing.append(
            "asyncio.tasks._wait's locals fs, timeout, return_when, waiter (asyncio.wait)"
        )
    gathering = getattr(asyncio.tasks, "_GatheringFuture", None)
    init = getattr(getattr(gathering, "__init__", None), "__code__", None)
    if init is None or "_children" not in init.co_names:
        missing.append("asyncio.tasks._GatheringFuture._children (asyncio.gather)")
    shield_code = getattr(asyncio.shield, "__code__", None)
    callbacks = [
        const
        for const in getattr(shield_code, "co_consts", ())
        if getattr(const, "co_qualname", None) == _SHIELD_CALLBACK
    ]
    if not callbacks or "inner" not in callbacks[0].co_freevars:
        missing.append(f"{_SHIELD_CALLBACK} and its cell 'inner' (asyncio.shield)")
    return missing


_warned_internals = False


def warn_if_internals_missing() -> None:
    """Warn, once per process, when deadlock detection cannot read what it needs."""
    global _warned_internals
    if _warned_internals:
        return
    _warned_internals = True
    missing = asyncio_internals_missing()
    if missing:
        import warnings

        warnings.warn(
            "asyncreplica's deadlock detection reads private names of asyncio that this "
            "Python does not have:\n"
            + "".join(f"  * {name}\n" for name in missing)
            + "A wait cycle through these is not reported at once: the stall warning "
            "names it, and CommunicationOptions(timeout_seconds=...) ends it. Please "
            "report this with your Python version.",
            RuntimeWarning,
            stacklevel=2,
        )


def _ended_badly(future: asyncio.Future[Any]) -> bool:
    """Whether a done future was cancelled or raised (read without marking it retrieved)."""
    return future.cancelled() or getattr(future, "_exception", None) is not None


def _shielded(future: asyncio.Future[Any]) -> asyncio.Future[Any] | None:
    """The inner future of an ``asyncio.shield`` outer future, if ``future`` is one."""
    for callback, _ in getattr(future, "_callbacks", None) or ():
        code = getattr(callback, "__code__", None)
        if (
            code is not None
            and getattr(callback, "__module__", None) == "asyncio.tasks"
            and getattr(callback, "__qualname__", None) == _SHIELD_CALLBACK
            and "inner" in code.co_freevars
        ):
            closure = callback.__closure__ or ()
            inner = closure[code.co_freevars.index("inner")].cell_contents
            if isinstance(inner, asyncio.Future):
                return inner
    return None


def _only_tasks(future: asyncio.Future[Any], watched: Callable[[object], bool]) -> bool:
    """Whether pending ``future`` completes only when tasks the run watches end.

    True for a watched task (checked on its own), ``asyncio.gather`` of such tasks (and
    of nested gathers), and ``asyncio.shield`` of one. False for anything else: a plain
    future, an event, a task the run does not know, or a gather whose child failed
    (which wakes the joiner).
    """
    if future.done():
        return False
    if isinstance(future, asyncio.Task):
        return watched(future)
    children = getattr(future, "_children", None)
    if isinstance(children, list):  # asyncio.gather
        for child in children:
            if child.done():
                if _ended_badly(child):
                    return False
            elif not _only_tasks(child, watched):
                return False
        return True
    inner = _shielded(future)
    return inner is not None and _only_tasks(inner, watched)


def _asyncio_join(
    task: asyncio.Task[Any], frames: list[FrameType], watched: Callable[[object], bool]
) -> bool | None:
    """Whether ``task`` waits only for tasks the run watches; None when it is not a join.

    Follows what the task awaits (``_fut_waiter``): a task awaited directly (also
    ``asyncio.wait_for`` without a timeout), ``asyncio.gather``, ``asyncio.shield``, and
    ``asyncio.wait`` without a timeout (found from its frame). A join with a timer can
    wake by itself, so it is not one.
    """
    future = getattr(task, "_fut_waiter", None)
    if not isinstance(future, asyncio.Future):
        return None
    if future.done():
        return False  # the task is about to resume
    if _WAIT_CODE is not None:
        for frame in reversed(frames):
            if frame.f_code is _WAIT_CODE:
                found = frame.f_locals
                if found.get("waiter") is not future:
                    break
                if found.get("timeout") is not None:
                    return False
                members = list(found.get("fs", ()))
                done = [f for f in members if f.done()]
                when = found.get("return_when")
                if done and (
                    when == asyncio.FIRST_COMPLETED
                    or (when == asyncio.FIRST_EXCEPTION and any(map(_ended_badly, done)))
                ):
                    return False
                return all(_only_tasks(f, watched) for f in members if not f.done())
    if isinstance(future, asyncio.Task) or isinstance(getattr(future, "_children", None), list):
        return _only_tasks(future, watched)
    if _shielded(future) is not None:
        return _only_tasks(future, watched)
    return None


def blocked(
    task: object,
    parked: Callable[[object], bool],
    watched: Callable[[object], bool] = lambda _: True,
) -> bool:
    """Whether ``task`` cannot issue a collective until another replica acts.

    True when it is finished, parked on one of the run's collectives still in flight
    (``parked(task)``), or only waiting for child tasks that the run watches
    (``watched(task)``; they are checked on their own): a task group's or nursery's
    exit, ``asyncio.gather``, a task awaited directly, ``asyncio.wait`` /
    ``asyncio.wait_for`` without a timeout, ``asyncio.shield``. False when it is
    runnable, not started, or waiting for anything else (I/O, a sleep, an event, a
    timer).
    """
    if _done(task) or parked(task):
        return True
    frames, innermost = _chain(task)
    if not frames or frames[-1].f_lasti < 0:
        return False
    if isinstance(task, asyncio.Task):
        joined = _asyncio_join(task, frames, watched)
        if joined is not None:
            return joined
    return _joining(frames, innermost)


def _trio_descendants(task: Any) -> Iterator[object]:
    for nursery in getattr(task, "child_nurseries", ()):
        for child in nursery.child_tasks:
            yield child
            yield from _trio_descendants(child)


class TaskWatch:
    """Records the tasks each replica of a run creates.

    On asyncio a task factory, installed on the running loop for as long as any run is
    active (chained to the factory that was there), reports each task created; on trio
    the instrument's ``task_spawned`` does, for a task started in any nursery (one
    passed into the step too). A task created from one of the replica's own tasks is
    *owned*: it may issue the replica's collectives (its spawn line is known). One
    created in the replica's context from elsewhere (a loop callback) is watched only:
    the deadlock check looks at it, but its collectives are refused.

    Args:
        mains: Each replica's main task, by replica (shared with the rendezvous).
        helpers: ``id(task) -> replica`` for the owned helper tasks (shared likewise).
    """

    def __init__(
        self, mains: list[Any] | None = None, helpers: dict[int, int] | None = None
    ) -> None:
        self.main: dict[int, object] = {}
        self._mains: list[Any] = mains if mains is not None else []
        self._helpers: dict[int, int] = helpers if helpers is not None else {}
        self._children: dict[int, weakref.WeakSet[Any]] = {}
        self._all: weakref.WeakSet[Any] = weakref.WeakSet()

    def started(self, replica: int, task: object) -> None:
        """Record ``task`` as ``replica``'s main task."""
        self.main[replica] = task
        if replica < len(self._mains):
            self._mains[replica] = task
        self._all.add(task)

    def replica_of(self, task: object) -> int:
        """The replica whose main task or owned helper ``task`` is; -1 for any other."""
        if task is None:
            return -1
        for replica, main in self.main.items():
            if main is task:
                return replica
        return self._helpers.get(id(task), -1)

    def adopt(self, replica: int, task: object, *, owned: bool = True) -> None:
        """Record ``task`` as one of ``replica``'s tasks (``owned``: see the class)."""
        self._children.setdefault(replica, weakref.WeakSet()).add(task)
        self._all.add(task)
        if owned:
            self._helpers[id(task)] = replica

    def forget(self, task: object) -> None:
        """``task`` ended: its id may be reused, so it no longer counts as owned."""
        if id(task) in self._helpers and task in self._all:
            del self._helpers[id(task)]

    def knows(self, task: object) -> bool:
        """Whether ``task`` is a replica's main task or one created inside a replica."""
        return task in self._all

    def helpers(self) -> list[object]:
        """Every live task created inside a replica (not the replicas' main tasks)."""
        return [task for children in self._children.values() for task in children]

    def tasks(self, replica: int) -> list[object]:
        """Every live task of ``replica`` that is known (each once)."""
        main = self.main.get(replica)
        if main is None:
            return []
        found = [main, *self._children.get(replica, ())]
        if not isinstance(main, asyncio.Task):
            found.extend(_trio_descendants(main))
            if len(found) > 1:
                found = list({id(task): task for task in found}.values())
        return found


def context_replica(task: object) -> Any:
    """The replica context whose context ``task`` runs in, if it can be read; else None.

    On Python 3.12+ a task's context is public (``get_context``); on 3.11 it is read from
    the wake-up callback the task left on the future it awaits (``_fut_waiter``).
    """
    from ._mode import MODE

    context = None
    get_context = getattr(task, "get_context", None)
    if get_context is not None:
        context = get_context()
    else:
        future = getattr(task, "_fut_waiter", None)
        for entry in getattr(future, "_callbacks", None) or ():
            if (
                isinstance(entry, tuple)
                and len(entry) == 2
                and getattr(entry[0], "__self__", None) is task
            ):
                context = entry[1]
                break
    if context is None:
        return None
    mode = context.get(MODE)
    return None if mode is None else mode.replica


class _Factory:
    """The recording task factory: calls the factory it chains to, then reports the task.

    While a run is active on the loop, asyncio's eager task factory (Python 3.12) is not
    called: tasks are created as plain tasks, so that each starts in a step of its own, as
    anyio's task groups and the run's bookkeeping (which must see a task before it runs)
    expect. After the run it is on the loop again. Another factory that runs the coroutine
    before returning its task is refused with a ``RuntimeError`` that says so.
    """

    def __init__(self, previous: Any, on_create: Callable[[asyncio.Task[Any]], None]) -> None:
        self.previous = previous
        self.on_create = on_create
        self.users = 0

    def __call__(
        self, loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any
    ) -> asyncio.Task[Any]:
        previous = self.previous
        if previous is None or _eager(previous):
            task: Any = asyncio.Task(coro, loop=loop, **kwargs)
        else:
            task = previous(loop, coro, **kwargs)
            if _started(coro):
                raise RuntimeError(
                    "The task factory installed on this event loop ran the coroutine before "
                    "returning its task (an eager task factory). asyncreplica's runs need each "
                    "task to start in its own step; install the factory outside Strategy.run, "
                    "or use asyncio.eager_task_factory, which asyncreplica recognises."
                )
        self.on_create(task)
        return task  # type: ignore[no-any-return]


def _eager(factory: Any) -> bool:
    """Whether ``factory`` is asyncio's eager task factory (Python 3.12+)."""
    eager = getattr(asyncio, "eager_task_factory", None)
    if eager is not None and factory is eager:
        return True
    # asyncio.create_eager_task_factory(custom) returns a closure named "factory" of it.
    return getattr(factory, "__qualname__", "").startswith("create_eager_task_factory.")


def _started(coro: Any) -> bool:
    """Whether coroutine ``coro`` already ran (a factory ran it eagerly)."""
    return (
        isinstance(coro, types.CoroutineType)
        and inspect.getcoroutinestate(coro) != inspect.CORO_CREATED
    )


_factories: dict[asyncio.AbstractEventLoop, _Factory] = {}


def install_factory(
    loop: asyncio.AbstractEventLoop, on_create: Callable[[asyncio.Task[Any]], None]
) -> None:
    """Install (or count another user of) the recording task factory on ``loop``."""
    warn_if_internals_missing()
    factory = _factories.get(loop)
    if factory is None:
        factory = _factories[loop] = _Factory(loop.get_task_factory(), on_create)
        loop.set_task_factory(factory)
    else:
        rechain_factory(loop)
    factory.users += 1


def rechain_factory(loop: asyncio.AbstractEventLoop) -> bool:
    """Install the recording factory again if someone replaced it; whether they had.

    The factory they set is chained: tasks go on being created by it, and it is what
    :func:`uninstall_factory` leaves on the loop.
    """
    factory = _factories.get(loop)
    if factory is None:
        return False
    current = loop.get_task_factory()
    if current is factory:
        return False
    factory.previous = current
    loop.set_task_factory(factory)
    return True


def uninstall_factory(loop: asyncio.AbstractEventLoop) -> None:
    """Undo one :func:`install_factory`; the last one restores the factory it chains to.

    That is the factory that was there before the first run, or the one set meanwhile
    (a factory set during a run stays set after it).
    """
    factory = _factories[loop]
    factory.users -= 1
    if factory.users == 0:
        del _factories[loop]
        current = loop.get_task_factory()
        loop.set_task_factory(factory.previous if current is factory else current)


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
                """Calls every active run's hooks when a task of this trio run starts or exits.

                ``on_spawn`` runs synchronously in the code that starts the task (trio
                calls ``task_spawned`` from ``start_soon``), so it sees who started it.
                """

                def __init__(self) -> None:
                    self.callbacks: list[Callable[[object], None]] = []
                    self.spawn_callbacks: list[Callable[[object], None]] = []

                def task_spawned(self, task: trio.lowlevel.Task) -> None:
                    for callback in list(self.spawn_callbacks):
                        callback(task)

                def task_exited(self, task: trio.lowlevel.Task) -> None:
                    for callback in list(self.callbacks):
                        callback(task)

            _trio_watch = (trio.lowlevel.RunVar("asyncreplica_exit_watch"), _ExitWatch)
        return _trio_watch


def install_trio_watch(
    on_exit: Callable[[object], None], on_spawn: Callable[[object], None]
) -> None:
    """Call ``on_exit(task)`` when a task of this trio run exits, until uninstalled.

    ``on_spawn(task)`` is called whenever one is started, from the code starting it.
    """
    import trio

    var, watch_class = _trio_watch_var()
    instrument = var.get(None)
    if instrument is None:
        instrument = watch_class()
        trio.lowlevel.add_instrument(instrument)
        var.set(instrument)
    instrument.callbacks.append(on_exit)
    instrument.spawn_callbacks.append(on_spawn)


def uninstall_trio_watch(
    on_exit: Callable[[object], None], on_spawn: Callable[[object], None]
) -> None:
    """Undo one :func:`install_trio_watch` (in the same trio run)."""
    import trio

    var, _ = _trio_watch_var()
    instrument = var.get()
    instrument.callbacks.remove(on_exit)
    instrument.spawn_callbacks.remove(on_spawn)
    if not instrument.callbacks:
        trio.lowlevel.remove_instrument(instrument)
        var.set(None)
