"""The default replica context's collectives: a replica's await lifecycle, for one replica.

Outside any strategy, ``ar.get_replica_context()``'s collectives are the identity (one
replica, nothing to combine), but they are used as a replica's are: issued, then awaited
once. :class:`DefaultCollective` is what they return. It keeps the rules that
:class:`~._collective.Collective` keeps, with the same errors (``_ownership`` builds each
message once, for both), so that a program written against the default strategy meets no
new refusal on its first run of a ``MirroredStrategy``:

* it is issued by code running on an event loop, and used (awaited, sent into, closed)
  only in that loop's thread: a worker thread (``asyncio.to_thread``) is not the code
  that issues collectives (``ReplicaContextError``, as a replica's);
* one name is in flight at most once at a time, and unnamed collectives are awaited in the
  order they were issued (``CollectiveError``);
* it runs once: awaited again after it completed, while it is in flight, after it was
  closed, or driven by hand (``send()`` not from the task that runs it), it raises
  ``CollectiveError``;
* one that is never awaited has no replica's end to be reported at: when it is
  collected, a ``RuntimeWarning`` at the line that created it says what a run raises
  (``Replica 0 created 1 collective that it never awaited``), in place of Python's own
  "coroutine ... was never awaited".

"In flight" and "issued earlier" are per thread and event loop: the thread's loop plays
the part of a run's replica (a later loop in the same thread starts afresh). A loop is
known by the loop object itself (trio's: its run's root task), held weakly, never by its
``id()``: a new loop allocated at a closed loop's address is a new loop, and inherits
none of its collectives.
"""

from __future__ import annotations

import asyncio
import collections.abc
import itertools
import sys
import threading
import warnings
import weakref
from collections.abc import Callable, Coroutine, Generator
from typing import Any, Final

from .._core._signature import Signature
from . import _ownership

__all__ = ["DefaultCollective", "issue", "loop_here"]

_get_ident: Final = threading.get_ident
_keys: Final = itertools.count()


class _Closed:
    """What a default collective's ``_coro`` holds once it was closed before it started."""


_CLOSED: Final[Any] = _Closed()


class _Issued:
    """One thread's default collectives in flight, held weakly (see DefaultCollective).

    A collective leaves ``unawaited`` when it starts, is closed or is collected. The newest
    collective of each name is in ``names``; it is in flight until it completes (entries
    of completed or collected ones are dropped when there are many).
    """

    __slots__ = ("limit", "loop", "names", "unawaited")

    def __init__(self) -> None:
        # The loop they were issued on (loop_here), as _held_loop holds it; None: none yet.
        self.loop: Callable[[], object] | None = None
        # Unnamed ones not started yet, in the order they were issued (by issue number).
        self.unawaited: dict[int, weakref.ref[DefaultCollective]] = {}
        self.names: dict[str, weakref.ref[DefaultCollective]] = {}
        self.limit = _NAMES  # names held before the ones not in flight are dropped


_NAMES: Final = 256
_local: Final = threading.local()


def _issued() -> _Issued:
    """This thread's :class:`_Issued`."""
    try:
        state: _Issued = _local.state
    except AttributeError:
        state = _local.state = _Issued()
    return state


def _prune(state: _Issued) -> None:
    """Drop the names whose collective completed or was collected (many names were used)."""
    names = state.names
    for name, ref in names.copy().items():
        call = ref()
        if call is None or call._finished():
            del names[name]
    state.limit = max(_NAMES, 2 * len(names))


def loop_here() -> object | None:
    """The event loop running in this thread: asyncio's loop, trio's root task; None if none.

    The object itself, not its ``id()``: an id is reused once the loop is collected, and
    a new loop must not inherit a closed one's collectives (see :func:`issue`).
    """
    loop = asyncio._get_running_loop()
    if loop is not None:
        return loop
    trio = sys.modules.get("trio")
    if trio is not None:
        try:
            root: object = trio.lowlevel.current_root_task()
        except RuntimeError:
            pass
        else:
            return root
    return None


def _held_loop(loop: object) -> Callable[[], object]:
    """A reference to ``loop`` that gives it back while it lives (a weak one if it can be).

    asyncio's loops (uvloop's too) and trio's tasks take weak references; a loop that
    does not is held strongly, until a later loop of the thread replaces it.
    """
    try:
        return weakref.ref(loop)
    except TypeError:
        return lambda: loop


def _running_task() -> object:
    """The task running in this thread (asyncio's or trio's), or None (none, or a callback)."""
    loop = asyncio._get_running_loop()
    if loop is not None:
        return asyncio.current_task(loop)
    trio = sys.modules.get("trio")
    if trio is not None:
        try:
            return trio.lowlevel.current_task()
        except RuntimeError:
            pass
    return None


def issue(
    signature: Signature,
    loop: object | None,
    body: Callable[..., Coroutine[Any, Any, Any]],
    *args: Any,
) -> DefaultCollective:
    """The default collective ``signature``, whose first await runs ``body(*args)``.

    ``loop`` is :func:`loop_here`, taken when the call began. Refuses what issuing a
    replica's collective refuses: another thread than an event loop's, and a name in
    flight.
    """
    if loop is None:
        raise _ownership.thread_error("Collective", signature.describe(), 0)
    state = _issued()
    held = state.loop
    if held is None or held() is not loop:
        # A new loop in this thread (compared as objects: an old loop collected leaves a
        # dead reference, never a match): what an old one left is not in flight.
        state.loop = _held_loop(loop)
        state.unawaited.clear()
        state.names.clear()
    name = signature[6]
    if name is not None:
        ref = state.names.get(name)
        earlier = None if ref is None else ref()
        if earlier is not None and not earlier._finished():
            raise _ownership.name_taken(0, name, _described(signature), earlier)
    call = DefaultCollective(signature, state, body, args)
    if name is None:
        state.unawaited[call._key] = weakref.ref(call)
    else:
        state.names[name] = weakref.ref(call)
        if len(state.names) > state.limit:
            _prune(state)
    return call


def _described(signature: Signature) -> str:
    """``all_reduce(SUM) on float32[4] at train.py:12`` (as ``Collective.describe``)."""
    site = signature.call_site
    return signature.describe() + ("" if site is None else f" at {site}")


class DefaultCollective:
    """A default context's collective: await it once, in its loop's thread.

    A coroutine (``asyncio.create_task``, ``asyncio.gather`` and task groups take it) whose
    body, the identity or ``merge_fn``'s call, is created when it starts. See the module
    docstring for what it refuses.

    Args:
        signature: The collective's signature (its call site included).
        state: The issuing thread's collectives in flight.
        body: Makes the coroutine that the first await runs, with ``args``.
        args: ``body``'s arguments.
    """

    __slots__ = (
        "__weakref__",
        "_args",
        "_body",
        "_coro",
        "_driver",
        "_key",
        "_signature",
        "_state",
        "_thread",
        "replica",
    )

    def __init__(
        self,
        signature: Signature,
        state: _Issued,
        body: Callable[..., Coroutine[Any, Any, Any]],
        args: tuple[Any, ...],
    ) -> None:
        self.replica = 0
        self._signature = signature
        self._state = state
        self._body: Callable[..., Coroutine[Any, Any, Any]] | None = body
        self._args: tuple[Any, ...] = args
        self._thread = _get_ident()
        self._key = next(_keys)
        # None until it starts; then its coroutine, or _CLOSED.
        self._coro: Any = None
        # The task that runs it as its own coroutine, which alone may send into it.
        self._driver: object = None

    @property
    def signature(self) -> Signature:
        """The collective's signature."""
        return self._signature

    def describe(self) -> str:
        """``all_reduce(SUM) on float32[4] at train.py:12``."""
        return _described(self._signature)

    def _finished(self) -> bool:
        """Whether it ran to its end or was closed: nothing of it runs any more."""
        coro = self._coro
        return coro is _CLOSED or (coro is not None and coro.cr_frame is None)

    def _start(self) -> Coroutine[Any, Any, Any]:
        """Start it for its first use: unnamed ones in the order they were issued."""
        state = self._state
        unawaited = state.unawaited
        if self._signature[6] is None:
            if len(unawaited) > 1:
                # A copy: a collective collected meanwhile (by another thread's collection,
                # say) leaves the dict.
                for key, ref in unawaited.copy().items():
                    if key == self._key:
                        break
                    older = ref()
                    if older is not None and older._coro is None:
                        raise _ownership.out_of_turn(0, self, older)
            unawaited.pop(self._key, None)
        body, args = self._body, self._args
        assert body is not None
        self._body, self._args = None, ()
        coro = self._coro = body(*args)
        return coro

    def _reused(self, use: str) -> BaseException:
        """The error for ``use`` once it started, or was closed."""
        coro = self._coro
        if coro is _CLOSED:
            return _ownership.closed_before(0, use, self.describe())
        if self._finished():
            return _ownership.completed_again(0, use, self.describe())
        how = "is being awaited" if self._driver is None else "runs as a task"
        return _ownership.second_awaiter(0, use, self.describe(), how)

    def __await__(self) -> Generator[Any, None, Any]:
        if _get_ident() != self._thread:
            raise _ownership.used_in_thread(0, self.describe())
        if self._coro is None:
            return self._start().__await__()
        raise self._reused("awaited")

    def send(self, value: Any) -> Any:
        """Run it to its next suspension (coroutine protocol): the task running it only."""
        coro = self._coro
        if coro is not None and self._driver is not None and _running_task() is self._driver:
            return coro.send(value)
        return self._drive("called send() on").send(value)

    def throw(self, *args: Any) -> Any:
        """Raise an exception inside it (coroutine protocol), as :meth:`send`."""
        coro = self._coro
        if coro is not None and self._driver is not None and _running_task() is self._driver:
            return coro.throw(*args)
        return self._drive("called throw() on").throw(*args)

    def _drive(self, use: str) -> Coroutine[Any, Any, Any]:
        """Its coroutine, for the first ``send``/``throw`` of the task that runs it."""
        if _get_ident() != self._thread:
            raise _ownership.used_in_thread(0, self.describe(), use)
        if self._coro is not None:
            raise self._reused(use)
        task = _running_task()
        if not _ownership.runs_as(task, self):
            raise _ownership.used_by_hand(0, use, self.describe())
        self._driver = task
        return self._start()

    def close(self) -> None:
        """Discard it without running it; one in flight is refused (cancel its awaiter)."""
        if _get_ident() != self._thread:
            raise _ownership.used_in_thread(0, self.describe(), "closed")
        coro = self._coro
        if coro is None:
            self._coro = _CLOSED
            self._body, self._args = None, ()
            self._state.unawaited.pop(self._key, None)
        elif coro is not _CLOSED and coro.cr_frame is not None:
            raise _ownership.closed_in_flight(0, self.describe())

    def __del__(self) -> None:
        if self._coro is not None or sys.is_finalizing():
            return
        self._state.unawaited.pop(self._key, None)
        _warn_never_awaited(self._signature)

    def __repr__(self) -> str:
        coro = self._coro
        state = "closed" if coro is _CLOSED else "not awaited" if coro is None else "awaited"
        return f"<collective {self.describe()} ({state})>"


# A coroutine for asyncio.create_task, gather and inspect.isawaitable, as Collective is.
collections.abc.Coroutine.register(DefaultCollective)


def _warn_never_awaited(signature: Signature) -> None:
    """Say, at the line that created it, that a default collective was never awaited."""
    error = _ownership.never_awaited(0, [_described(signature)])
    message = (
        f"{error}\n(The default replica context tells this when the collective is "
        "collected; Strategy.run raises it as a CollectiveError when the replica ends.)"
    )
    site = signature.call_site
    if site is None or site.lineno <= 0:
        warnings.warn(message, RuntimeWarning, stacklevel=2)
    else:
        warnings.warn_explicit(message, RuntimeWarning, site.filename, site.lineno)
