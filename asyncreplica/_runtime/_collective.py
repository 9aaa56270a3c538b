"""The rendezvous's hot objects, written for mypyc: a collective, its slot, the fast arrival.

Every replica runs this code at every collective, so it is compiled (pyproject.toml lists it)
into native classes with typed attributes: reading a field is a C struct access, and calls
between these classes and the compiled ledger are C calls. It runs interpreted too
(``ASYNCREPLICA_NO_EXTENSIONS=1``), with the same behaviour. What it needs from the
interpreted :class:`~._run.Run` (failures, deadlock checks, the general coroutine) it calls
there: those are the rare paths. It names no class above it, not even for types: the run
it is handed is an ``IssuingRun`` (``_protocols``), called through ``Any``.

* :class:`Rendezvous`: the fields of a run that every arrival reads, in one native object
  (the run holds it as ``run._rv`` and shares its lists and dicts).
* :class:`Slot`: one pending collective's payloads, waiters and results.
* :class:`Collective`: what ``ctx.all_reduce(...)`` returns; ``await`` on it arrives.
"""

from __future__ import annotations

import asyncio
import collections.abc
import copy
import functools
import time
from collections.abc import Awaitable, Callable, Generator, Sequence
from threading import get_ident
from typing import TYPE_CHECKING, Any, Final

from .._core._ledger import Key, Ledger
from .._core._nest import unflatten
from .._core._signature import CollectiveKind, Signature
from .._exceptions import CollectiveError
from . import _ownership
from ._inspect import UNCHECKED
from ._tasks import current_task
from ._waiter import Waiter

if TYPE_CHECKING:
    from ._protocols import IssuingRun

__all__ = ["NO_TREE", "Collective", "Rendezvous", "Slot", "rebuild"]


class _NoTree:
    """Marks a collective whose result is not rebuilt into a structure."""


NO_TREE: Final[Any] = _NoTree()
_get_ident: Final = get_ident
_UNCHECKED: Final = UNCHECKED


class Rendezvous:
    """The fields of one run that every arrival reads (the run shares these objects).

    Args:
        run: The run (its methods serve the rare paths: failures, deadlocks, timeouts).
        ledger: The run's ledger.
        num_replicas: The replicas of this process.
    """

    def __init__(self, run: Any, ledger: Ledger, num_replicas: int) -> None:
        self.run: Any = run
        self.ledger = ledger
        self.num_replicas = num_replicas
        # Collectives issued and not awaited yet: each replica's newest, older ones by id.
        self.issued: list[Any] = [None] * num_replicas
        self.unawaited: list[dict[int, Any]] = [{} for _ in range(num_replicas)]
        self.slots: dict[Key, Slot] = {}  # pending collectives
        self.errors: list[tuple[int, BaseException]] = []  # the run's root causes
        # The run failed or was cancelled: no collective can complete any more.
        self.stopped = False
        # Whether ``await collective`` takes the fast path (asyncio, no tracer, no shuffle).
        self.fast_await = False
        self.loop: Any = None  # the asyncio loop, once the run starts (None on trio)
        self.gen = 0  # moves on when a blocked task may have become runnable
        self.local = True  # whether the run is within one process (no process group)
        # The event loop's clock (_clock.loop_clock), set when the run starts.
        self.clock: Callable[[], float] = time.monotonic
        # Who may issue and await each replica's collectives (see Collective): the run's
        # thread, each replica's main task, and the helper tasks seen created inside a
        # replica (id(task) -> replica; an entry goes when its task ends).
        self.thread = get_ident()
        self.current_task: Callable[[], object] = current_task
        # asyncio's running-task dict on Python 3.11 (read directly: a native dict look-up
        # instead of a call), else None and ``current_task`` is called.
        self.running: dict[Any, Any] | None = None
        self.mains: list[Any] = [None] * num_replicas
        self.helpers: dict[int, int] = {}
        # Each replica's newest collective of each name (in flight until its slot is done).
        self.names: list[dict[str, Any]] = [{} for _ in range(num_replicas)]
        # merge_fns running now: while one runs, an await is checked for cross-replica
        # context (a replica's collective awaited inside merge_fn can never complete).
        self.merging = 0

    def task(self) -> object:
        """The running task, or None off the run's thread (it may not touch collectives)."""
        if _get_ident() != self.thread:
            return None
        running = self.running
        if running is not None:
            return running.get(self.loop)
        return self.current_task()

    def arrive_at(
        self, key: Key, replica: int, signature: Signature, payload: object, complete: bool
    ) -> Slot:
        """Put ``payload`` in the slot of ``key``; a complete slot leaves the pending ones."""
        slots = self.slots
        slot = slots.get(key)
        if slot is None:
            slot = Slot(self, key, self.num_replicas, self.clock())
            slots[key] = slot
        slot.payloads[replica] = payload
        slot.signatures[replica] = signature
        if complete:
            del slots[key]
        return slot

    def arrive_fast(self, call: Collective) -> Generator[Any, None, Any]:
        """``await call`` on asyncio without a timeout, tracer or shuffle.

        The arrival is made now. A waiter gets a :class:`Waiter` future to await (the last
        arrival sets it to this replica's rebuilt result); the last arrival gets the
        dispatch coroutine. Returns the iterator the ``await`` drives.
        """
        run = self.run
        if self.errors or self.stopped:
            # The run failed meanwhile: the coroutine raises the cancellation.
            return run._collective(call).__await__()  # type: ignore[no-any-return]
        replica = call.replica
        ledger = self.ledger
        try:
            key, complete = ledger.arrive(replica, call._signature)
        except CollectiveError as exc:
            run._fail(replica, exc)
            raise
        slot = self.arrive_at(key, replica, call._signature, call.payload, complete)
        call._slot = slot
        if complete:
            if self.local and call._signature.kind is not CollectiveKind.MERGE_CALL:
                return _dispatch(self, call, slot).__await__()
            return run._dispatch(call, key, slot).__await__()  # type: ignore[no-any-return]
        if ledger.all_waiting():
            run._check_deadlock(replica, current=run._current_task())
        waiter = Waiter(loop=self.loop)
        waiter._ar_slot = slot
        slot.fast_waiters.append(waiter)
        slot.fast_replicas.append(replica)
        slot.trees[replica] = call.treedef
        return waiter.__await__()


async def _dispatch(rv: Rendezvous, call: Collective, slot: Slot) -> Any:
    """The last arrival at a collective of one process (not merge_call), on the fast path.

    :meth:`~._run.Run._dispatch` is the general form (tracing, merge_call, processes).
    """
    try:
        results = await call.dispatch(rv.run, call, slot.payloads)
    except Exception as exc:
        fail_waiters(slot, exc)
        raise
    except BaseException as exc:  # cancelled inside the backend call: no waiter is left
        rv.run._dispatch_ended(call.replica, slot, exc)
        raise
    slot.results = results
    slot.release()
    rv.gen += 1  # the waiters are runnable again
    if slot.warned:
        rv.run._log_resumed(slot)
    return result_of(call, results[call.replica])


def result_of(call: Collective, result: Any) -> Any:
    """``call``'s replica's result leaves, rebuilt into the structure of its value."""
    treedef = call.treedef
    if treedef is None:
        return result[0]
    try:
        return rebuild(treedef, result)
    except TypeError as error:
        # The user's container type refused its items (see not_rebuilt).
        offset: int = call._run.strategy._replica_offset
        raise not_rebuilt(error, call.replica + offset, call.describe())  # noqa: B904


def fail_waiters(slot: Slot, exc: BaseException) -> None:
    """The dispatch of ``slot``'s collective raised ``exc``: every waiting replica gets it.

    The replica that dispatched raises ``exc`` itself; each replica parked at the
    collective wakes with a copy of it (one exception object is not raised in several
    tasks: each gets its own traceback; uncaught, a copy is not a second root cause).
    Whether the run fails is then each replica's
    business, as for a refusal at issue: one that catches the error goes on, and no
    replica is left waiting for a result that never comes.
    """
    if not slot.done:
        slot.abort(functools.partial(_twin, exc))
        slot.run._rv.gen += 1  # the waiters are runnable again


def _twin(exc: BaseException) -> BaseException:
    """A fresh copy of ``exc`` (``exc`` itself where it cannot be copied)."""
    try:
        twin = copy.copy(exc)
    except BaseException:
        # Whatever stops the copy (a KeyboardInterrupt from the class's __reduce_ex__
        # included) must not stop the abort: a waiter left unwoken is a hang, and the
        # copy's own error would be told as the replica's, losing the error itself.
        return exc
    if type(twin) is not type(exc):
        return exc
    try:
        twin.__cause__ = exc.__cause__
        # Uncaught, a copy is the dispatching replica's error again, not a second root
        # cause (Run._recorded reads this).
        twin._ar_twin_of = exc  # type: ignore[attr-defined]
    except BaseException:
        # A user's exception may refuse attributes (a __setattr__ that raises): every
        # waiter gets the error itself then, never our AttributeError, never a waiter
        # left unwoken (the abort wakes them one by one).
        return exc
    return twin


class Slot:
    """The payloads of one collective and, once dispatched, the results.

    Waiters park on one native waiter each (an asyncio future, or a trio event per
    collective), chosen once per run: no polling, no anyio.Event per collective.

    Args:
        rv: The run's rendezvous.
        key: The collective's key in the ledger.
        num_replicas: The replicas of this process.
        since: When the first replica arrived (the run's clock: ``Rendezvous.clock``).
    """

    def __init__(self, rv: Rendezvous, key: Key, num_replicas: int, since: float) -> None:
        self.run: Any = rv.run
        self.key: Key = key
        self.payloads: list[Any] = [None] * num_replicas
        # Each replica's signature, as it issued the collective: an all_gather's differ
        # along the axis, and each replica's leaves are held to its own in flight.
        self.signatures: list[Any] = [None] * num_replicas
        self.results: Sequence[Any] = ()
        self.done = False  # results are set
        self.waiters: list[Any] = []  # asyncio futures, or one trio event
        # Fast-path waiters (each gets its result), their replicas, and every replica's
        # result structure (set by the fast path only).
        self.fast_waiters: list[Waiter] = []
        self.fast_replicas: list[int] = []
        self.trees: list[Any] = [None] * num_replicas
        self.since = since
        self.warned = False  # whether a stall warning was logged for it
        self.error: Callable[[], BaseException] | None = None  # set: it can never complete
        self.task: object = None  # a merge_call's running merge (where it waits)

    def release(self) -> None:
        """Wake every waiter (the results are set)."""
        self.done = True
        results = self.results
        fast = self.fast_waiters
        if fast:
            trees = self.trees
            rids = self.fast_replicas
            unread: list[int] = []
            for i, waiter in enumerate(fast):
                if not waiter.done():  # a cancelled one is left alone
                    replica = rids[i]
                    if not getattr(waiter, "_callbacks", True):
                        # No task awaits it: the replica drove its collective's
                        # __await__() iterator by hand (send(), then close(), throw() or
                        # nothing). A C future has no hook for "result read", so it is
                        # told now, as the result arrives with no task to take it.
                        unread.append(replica)
                    result = results[replica]
                    tree = trees[replica]
                    if tree is None:
                        waiter.set_result(result[0])
                        continue
                    try:
                        value = rebuild(tree, result)
                    except TypeError as error:
                        # The user's container type refused its items: that replica's
                        # error, raised in its own task; the others still get theirs.
                        waiter.set_exception(self._not_rebuilt(replica, error))
                    else:
                        waiter.set_result(value)
            fast.clear()  # no slot <-> waiter cycle outlives the collective
            for replica in unread:
                self.run._abandoned_by_hand(replica, self.key, self, awaited=False)
        waiters = self.waiters
        if waiters and isinstance(waiters[0], asyncio.Future):
            for future in waiters:  # futures (asyncio), all of them
                if not future.done():
                    future.set_result(None)
            return
        for event in waiters:
            if getattr(event, "_tasks", None):  # (trio.Event's waiting tasks, trio 0.25+)
                self.run._unparked_by_hand(self, event)
            event.set()

    def _not_rebuilt(self, replica: int, error: TypeError) -> TypeError:
        """The error of ``replica`` whose result's container type refused its items."""
        signature = self.run.ledger.last_signature(replica)
        if signature is None:
            collective = "its collective"
        else:
            site = signature.call_site
            collective = signature.describe() + ("" if site is None else f" at {site}")
        return not_rebuilt(error, replica + self.run.strategy._replica_offset, collective)

    def abort(self, error: Callable[[], BaseException]) -> None:
        """Wake every waiter with a fresh ``error()``: the collective can never complete."""
        self.error = error
        self.done = True
        for waiter in [*self.fast_waiters, *self.waiters]:
            if isinstance(waiter, asyncio.Future):
                if not waiter.done():
                    waiter.set_exception(error())
            else:
                waiter.set()
        self.fast_waiters.clear()


def rebuild(treedef: Any, result: Any) -> Any:
    """``result`` (a replica's result leaves) rebuilt into ``treedef`` (not None)."""
    if treedef is NO_TREE:
        return result
    if treedef[0] is list and treedef[1] is None and not any(treedef[2]):
        return list(result)  # a flat list of leaves
    return unflatten(treedef, result)


def not_rebuilt(error: TypeError, replica: int, collective: str) -> TypeError:
    """``error`` of :func:`rebuild`, told as replica ``replica``'s at ``collective``.

    ``error`` says which container type refused its items; ``replica`` is a global id.
    """
    told = TypeError(f"Replica {replica}'s result of {collective}: {error}")
    told.__cause__ = error.__cause__ if error.__cause__ is not None else error
    return told


class _Marker:
    """What a collective's ``_coro`` holds when no coroutine of it can run (see below)."""

    def __init__(self, name: str) -> None:
        self.name = name


# Awaited on the fast path (the arrival is made; the replica's task awaits a waiter).
_SPENT: Final[Any] = _Marker("spent")
# Closed before it started: it never runs.
_CLOSED: Final[Any] = _Marker("closed")


class Collective:
    """An issued collective: await it to take part in the rendezvous.

    It is a coroutine (so ``asyncio.create_task``, ``asyncio.gather`` and task groups
    accept it: registered as a ``collections.abc.Coroutine``) that refuses to be used as a
    value, so that a forgotten ``await`` fails where it happens rather than as a silently
    skipped collective.

    It carries everything the rendezvous needs as plain fields (no closure, no coroutine
    per call): the run creates the one coroutine, :meth:`~._run.Run.collective`, when the
    collective is first awaited or sent into, unless ``await`` takes the fast path.

    Args:
        run: The run the replica belongs to.
        replica: The issuing replica.
        signature: The collective's signature.
        payload: What the replica contributes (its leaves, or merge_call's arguments).
        dispatch: Called once, by the last arrival, as ``dispatch(run, collective,
            payloads)`` with every replica's payload in replica order; returns one
            result per replica.
        bytes_per_pack: An all_reduce's pack size for the backend (None for the other
            collectives).
        timeout: Seconds to wait before ``CollectiveTimeoutError``; None or 0 waits
            for ever.
        treedef: The structure to rebuild the result into, or :data:`NO_TREE`.
    """

    def __init__(
        self,
        run: IssuingRun,
        replica: int,
        signature: Signature,
        payload: object,
        dispatch: Callable[[Any, Collective, list[Any]], Awaitable[Sequence[Any]]],
        bytes_per_pack: int | None = None,
        timeout: float | None = None,
        treedef: Any = NO_TREE,
    ) -> None:
        rv: Rendezvous = run._rv
        self._rv = rv
        self._run: Any = run
        self.replica = replica
        self._signature = signature
        self.payload = payload
        self.dispatch = dispatch
        self.bytes_per_pack = bytes_per_pack
        self.timeout = timeout
        self.treedef = treedef
        # None until it starts; then the coroutine, or _SPENT / _CLOSED (see Collective).
        self._coro: Any = None
        # The task that runs it as its own coroutine (asyncio.create_task(collective)),
        # which alone may send into it; None when it is awaited (or not started).
        self._driver: object = None
        self.awaited = False
        self._slot: Slot | None = None  # where it arrived (set at the arrival)
        # Only the replica's own tasks, on the run's thread, issue its collectives: the
        # replica's main task (an identity check), else a helper seen created inside it.
        task = rv.task()
        if task is not rv.mains[replica] and rv.helpers.get(id(task), -1) != replica:
            error = _ownership.foreign_issue(rv, self, task)
            if error is not None:
                raise error
        if signature[9] is _UNCHECKED:
            _ownership.unchecked(rv, signature)
        name = signature[6]
        if name is not None:
            names = rv.names[replica]
            earlier = names.get(name)
            if earlier is not None:
                slot = earlier._slot
                if slot is None or not slot.done:
                    raise _ownership.name_in_flight(rv, replica, name, self.describe())
            names[name] = self
        # Registered until awaited, so that the replica's end can report it: the newest in
        # the replica's slot of ``issued`` (one list for the run, read in replica order: no
        # dict per replica touched per collective), any older one still unawaited in
        # ``unawaited``.
        issued = rv.issued
        older = issued[replica]
        if older is not None:
            rv.unawaited[replica][id(older)] = older
        issued[replica] = self

    def _unregister(self) -> None:
        """Awaited: no longer reported at the replica's end."""
        rv = self._rv
        self._check_awaiter(rv)
        self.awaited = True
        issued = rv.issued
        replica = self.replica
        if issued[replica] is self:
            issued[replica] = None
        else:
            rv.unawaited[replica].pop(id(self), None)

    def _check_awaiter(self, rv: Rendezvous) -> None:
        """Refuse an await by code that is not this replica's task (or out of order)."""
        replica = self.replica
        task = rv.task()
        if task is not rv.mains[replica] and rv.helpers.get(id(task), -1) != replica:
            raise _ownership.foreign_await(rv, self, task)
        if rv.merging and _ownership.in_merge_fn():
            raise _ownership.awaited_in_merge_fn(rv, self)
        if rv.unawaited[replica] and self._signature[6] is None:
            error = _ownership.out_of_order(rv, self)
            if error is not None:
                raise error

    @property
    def signature(self) -> Signature:
        """The collective's signature."""
        return self._signature

    def _started(self) -> Any:
        """Start the collective for an ``await`` by the running task (checked)."""
        self._unregister()
        coro = self._coro = self._run.collective(self)
        return coro

    def __await__(self) -> Generator[Any, None, Any]:
        if self._coro is None:
            rv = self._rv
            if rv.fast_await and not self.timeout and not rv.merging:
                # The common case: arrive now; a waiter awaits its future directly.
                # (_unregister, inline: this runs once per replica and collective.)
                replica = self.replica
                task = rv.task()
                if (task is not rv.mains[replica] and rv.helpers.get(id(task), -1) != replica) or (
                    rv.unawaited[replica] and self._signature[6] is None
                ):
                    self._check_awaiter(rv)
                self.awaited = True
                issued = rv.issued
                if issued[replica] is self:
                    issued[replica] = None
                else:
                    rv.unawaited[replica].pop(id(self), None)
                self._coro = _SPENT
                return rv.arrive_fast(self)
            return self._started().__await__()  # type: ignore[no-any-return]
        # Awaited (or run, or closed) already: a second consumer would drive the one
        # coroutine from two places, or take another replica's result.
        raise _ownership.reused(
            self._rv, self, "awaited", self._finished(), closed=self._coro is _CLOSED
        )

    def send(self, value: Any) -> Any:
        """Run the collective to its next suspension (coroutine protocol).

        Only the task that runs the collective as its own coroutine sends into it (as
        ``asyncio.create_task(collective)`` or a task group does); anything else raises.
        """
        coro = self._coro
        if coro is not None and self._driver is not None and self._rv.task() is self._driver:
            return coro.send(value)
        return self._drive("called send() on").send(value)

    def throw(self, *args: Any) -> Any:
        """Raise an exception inside the collective (coroutine protocol), as :meth:`send`."""
        coro = self._coro
        if coro is not None and self._driver is not None and self._rv.task() is self._driver:
            return coro.throw(*args)
        return self._drive("called throw() on").throw(*args)

    def _drive(self, use: str) -> Any:
        """The coroutine for the first ``send``/``throw`` of the task that runs it.

        Raises for anything else: another replica's task or a thread, the replica's own
        code calling ``send`` by hand, or a collective already awaited, run or closed.
        """
        rv = self._rv
        if self._coro is not None:
            raise _ownership.reused(rv, self, use, self._finished(), closed=self._coro is _CLOSED)
        replica = self.replica
        task = rv.task()
        if task is not rv.mains[replica] and rv.helpers.get(id(task), -1) != replica:
            raise _ownership.foreign_await(rv, self, task, use)
        if not _ownership.runs_as(task, self):
            raise _ownership.driven_by_hand(rv, self, use)
        self._driver = task
        return self._started()

    def close(self) -> None:
        """Discard the collective without running it (it is no longer pending).

        Closing one that has completed does nothing; one in flight is not closed (cancel
        the task that awaits it instead); another replica's is refused.
        """
        rv = self._rv
        replica = self.replica
        task = rv.task()
        if task is not rv.mains[replica] and rv.helpers.get(id(task), -1) != replica:
            raise _ownership.foreign_await(rv, self, task, "closed")
        coro = self._coro
        if coro is None:
            self._coro = _CLOSED
            issued = rv.issued
            if issued[replica] is self:
                issued[replica] = None
            else:
                rv.unawaited[replica].pop(id(self), None)
            name = self._signature[6]
            if name is not None and rv.names[replica].get(name) is self:
                del rv.names[replica][name]
        elif coro is not _CLOSED and not self._finished():
            raise _ownership.close_in_flight(rv, self)

    def _finished(self) -> bool:
        """Whether the collective ran to its end (or was closed): nothing of it runs."""
        coro = self._coro
        if coro is _CLOSED:
            return True
        if coro is _SPENT:
            slot = self._slot
            return slot is not None and slot.done
        return coro is not None and getattr(coro, "cr_frame", None) is None

    def describe(self) -> str:
        """``all_reduce(SUM) on float32[4] at train.py:12``."""
        site = self._signature.call_site
        return self._signature.describe() + ("" if site is None else f" at {site}")

    def _refuse(self, use: str) -> TypeError:
        return TypeError(
            f"A collective that has not run cannot be used as a value ({use}): "
            f"{self.describe()}. Did you forget `await`? "
            "Write `result = await ctx.all_reduce(...)`; an un-awaited collective is skipped "
            "by this replica and its peers would wait for it."
        )

    # One method per use (a compiled class has no class-body aliases).
    def __bool__(self) -> bool:
        raise self._refuse("truth value")

    def __float__(self) -> float:
        raise self._refuse("float()")

    def __int__(self) -> int:
        raise self._refuse("int()")

    def __index__(self) -> int:
        raise self._refuse("index")

    def __complex__(self) -> complex:
        raise self._refuse("complex()")

    def __iter__(self) -> Any:
        raise self._refuse("iteration")

    def __len__(self) -> int:
        raise self._refuse("len()")

    def __array__(self, *args: object, **kwargs: object) -> Any:
        raise self._refuse("array conversion")

    def __getitem__(self, item: object) -> Any:
        raise self._refuse("indexing")

    def __lt__(self, other: object) -> Any:
        raise self._refuse("arithmetic or comparison")

    def __le__(self, other: object) -> Any:
        raise self._refuse("arithmetic or comparison")

    def __gt__(self, other: object) -> Any:
        raise self._refuse("arithmetic or comparison")

    def __ge__(self, other: object) -> Any:
        raise self._refuse("arithmetic or comparison")

    def __add__(self, other: object) -> Any:
        raise self._refuse("arithmetic or comparison")

    def __radd__(self, other: object) -> Any:
        raise self._refuse("arithmetic or comparison")

    def __sub__(self, other: object) -> Any:
        raise self._refuse("arithmetic or comparison")

    def __rsub__(self, other: object) -> Any:
        raise self._refuse("arithmetic or comparison")

    def __mul__(self, other: object) -> Any:
        raise self._refuse("arithmetic or comparison")

    def __rmul__(self, other: object) -> Any:
        raise self._refuse("arithmetic or comparison")

    def __truediv__(self, other: object) -> Any:
        raise self._refuse("arithmetic or comparison")

    def __rtruediv__(self, other: object) -> Any:
        raise self._refuse("arithmetic or comparison")

    def __floordiv__(self, other: object) -> Any:
        raise self._refuse("arithmetic or comparison")

    def __rfloordiv__(self, other: object) -> Any:
        raise self._refuse("arithmetic or comparison")

    def __pow__(self, other: object) -> Any:
        raise self._refuse("arithmetic or comparison")

    def __rpow__(self, other: object) -> Any:
        raise self._refuse("arithmetic or comparison")

    def __matmul__(self, other: object) -> Any:
        raise self._refuse("arithmetic or comparison")

    def __rmatmul__(self, other: object) -> Any:
        raise self._refuse("arithmetic or comparison")

    def __neg__(self) -> Any:
        raise self._refuse("arithmetic or comparison")

    def __pos__(self) -> Any:
        raise self._refuse("arithmetic or comparison")

    def __abs__(self) -> Any:
        raise self._refuse("arithmetic or comparison")

    def __hash__(self) -> int:
        # By identity, as an object's (a compiled class with comparison methods has no
        # hash unless it defines one, and asyncio.gather hashes its awaitables).
        return id(self)

    def __repr__(self) -> str:
        state = "closed" if self._coro is _CLOSED else "awaited" if self.awaited else "not awaited"
        return f"<collective {self.describe()} ({state})>"


# A coroutine for asyncio.create_task, gather and inspect.isawaitable; a native class
# cannot inherit the ABC, so it is registered.
collections.abc.Coroutine.register(Collective)
