"""One ``Strategy.run``: replica tasks, rendezvous, failure handling.

Rendezvous: the last replica to arrive at a collective dispatches the backend
operation in its own task, then wakes the others. Nobody polls; no thread per
replica. The ledger decides everything about agreement; this module only acts on its
answers: dispatch, wait, or fail the run.

Failure: the first error (a replica's exception, a ledger error, a timeout) is
recorded as a *root cause* and the run's cancel scope is cancelled, so every other
replica is cancelled, not reported. ``Strategy.run`` raises the root cause itself
(with a note naming the replica) or, if several replicas failed independently before
the cancellation reached them, an ``ExceptionGroup`` of them in replica order.

Time enters only here: a waiter that has waited ``stall_warning_seconds`` logs a
warning (and logs again if the collective completes after all); one that has waited
``timeout_seconds`` fails the run. Deadlocks and exits are decided without time.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import random
import threading
import types
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel

from .._core._dtypes import same_refusal
from .._core._ledger import Key, Ledger, key_index
from .._core._lifecycle import Event, Lifecycle, Outcome, State
from .._core._report import (
    ended_message,
    key_text,
    merge_fn_stall_message,
    merge_fn_timeout_message,
    resumed_message,
    see_also,
)
from .._core._signature import CollectiveKind, ReduceOp, Signature
from .._exceptions import (
    CollectiveDeadlockError,
    CollectiveError,
    CollectiveTimeoutError,
    InternalError,
    ReplicaCancelledError,
)
from . import _ending, _inspect, _tasks
from ._clock import loop_clock
from ._collective import NO_TREE, Collective, Rendezvous, Slot, fail_waiters, rebuild
from ._mode import MODE, Mode
from ._waiter import Waiter

if TYPE_CHECKING:
    from ..abc import Backend, ProcessGroup
    from ._protocols import RunStrategy
    from ._trace import Tracer

__all__ = ["NO_TREE", "Collective", "Dispatch", "Run", "logger"]

logger = logging.getLogger("asyncreplica")

Dispatch = Callable[["Run", "Collective", list[Any]], Awaitable[Sequence[Any]]]


def _result(call: Collective, result: Any) -> Any:
    """A replica's result, rebuilt into the structure of its value."""
    treedef = call.treedef
    if treedef is None:
        return result[0]
    return rebuild(treedef, result)


# Loop turns a run's end gives the helper tasks it woke or cancelled to finish.
_LEFTOVER_TURNS = 8


# Whether a backend class's all_reduce takes ``bytes_per_pack``: decided once per class.
_ACCEPTS_PACK: dict[type, bool] = {}


def accepts_bytes_per_pack(backend: Backend) -> bool:
    """Whether ``backend.all_reduce`` accepts the ``bytes_per_pack`` keyword argument.

    Backends written before the keyword existed are still called correctly, without
    it. The answer is computed once per backend class.
    """
    cls = type(backend)
    found = _ACCEPTS_PACK.get(cls)
    if found is None:
        try:
            params = inspect.signature(backend.all_reduce).parameters
        except (TypeError, ValueError):
            found = False
        else:
            found = "bytes_per_pack" in params or any(
                p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()
            )
        _ACCEPTS_PACK[cls] = found
    return found


def _cancelled(error: BaseException) -> bool:
    """Whether ``error`` unwinds a task rather than reports a failure (a cancellation)."""
    return isinstance(error, anyio.get_cancelled_exc_class())


def _not_a_cancellation(error: BaseException) -> bool:
    """``split`` condition: a replica's failures, without any cancellation of any loop."""
    return not isinstance(error, BaseExceptionGroup) and not _ending.cancellation(error)


def _leaves(error: BaseException) -> Iterator[BaseException]:
    """The exceptions in ``error``, a (nested) group or a single exception."""
    if isinstance(error, BaseExceptionGroup):
        for inner in error.exceptions:
            yield from _leaves(inner)
    else:
        yield error


def _describe(error: BaseException) -> str:
    """``Type: first line of its message`` for ``error``; never raises.

    A user's exception may have a ``__str__`` that raises: the run's own messages must
    still be built, and the user's exception still re-raised.
    """
    name = type(error).__name__
    try:
        text = str(error)
    except Exception:
        return f"{name} (its message could not be read: its __str__ raised)"
    first = text.splitlines()[0] if text else ""
    return f"{name}: {first}" if first else name


def _add_note(error: BaseException, note: str) -> None:
    """Add ``note`` to ``error`` if it accepts one (a user's exception may refuse)."""
    with contextlib.suppress(Exception):
        error.add_note(note)


def _given(coroutine: Coroutine[Any, Any, None]) -> Coroutine[Any, Any, None]:
    """``start_soon``'s function for a coroutine created beforehand."""
    return coroutine


def _spawned_in_replica(task: object) -> Run | None:
    """Record ``task``, created in a replica's context; the run, if it is active.

    A task created by one of a replica's own tasks is owned by that replica (even when
    started in a copy of another replica's context), and the line that created it goes
    on the call path of its collectives. One created in the replica's context from
    anywhere else (a loop callback) is watched by the deadlock check, but its
    collectives are refused (the line that started it is unknown).
    """
    mode = MODE.get()
    if mode is None or mode.replica is None:
        return None
    run: Run | None = mode.replica._run
    if run is None or run.closed:
        return None
    creator = run.watch.replica_of(run._current_task())
    if creator >= 0:
        # Who created the task decides its replica, not the context it runs in (replica
        # 0's code may start one in a copy of replica 1's context).
        run.watch.adopt(creator, task)
        _inspect.record_spawn(task)
    else:
        run.watch.adopt(mode.replica._replica_id, task, owned=False)  # the local index
    return run


def _on_task_created(task: asyncio.Task[Any]) -> None:
    """Task factory hook: record tasks created inside a replica (asyncio)."""
    run = _spawned_in_replica(task)
    if run is not None:
        task.add_done_callback(_inspect.forget_spawn)
        # A replica's helper task that ends may leave its replica blocked for good.
        task.add_done_callback(run.task_done)


def _on_trio_task_spawned(task: object) -> None:
    """Trio instrument hook: record a task started inside a replica (any nursery)."""
    _spawned_in_replica(task)


def _retrieve(task: asyncio.Task[Any]) -> None:
    """Mark a task's exception as retrieved (the run already reported the failure)."""
    if not task.cancelled():
        task.exception()


class Run:
    """The state of one ``Strategy.run`` call.

    Args:
        strategy: The strategy that runs.
        backend: Its backend.
        check_call_sites: Whether call paths must agree.
        stall_warning_seconds: Log a stall warning after this wait; None disables it.
        tracer: Receives the run's events for a timeline; None when tracing is off.
        shuffle: For ``schedule="random"``: varies the order in which replicas start
            and resume after collectives, reproducibly from its seed.
    """

    def __init__(
        self,
        strategy: RunStrategy,
        backend: Backend,
        *,
        check_call_sites: bool,
        stall_warning_seconds: float | None,
        tracer: Tracer | None = None,
        shuffle: random.Random | None = None,
    ) -> None:
        self.strategy = strategy
        # The processes this run spans (MultiWorkerMirroredStrategy); None within one.
        self.group: ProcessGroup | None = strategy._group
        self.tracer = tracer
        self.shuffle = shuffle
        self.backend = backend
        self._packs = accepts_bytes_per_pack(backend)
        self.describe = backend.describe
        self.num_replicas = strategy._num_local
        self.ledger = Ledger(
            self.num_replicas, check_call_sites=check_call_sites, offset=strategy._replica_offset
        )
        # How each replica's task started and ended: driven only through the table of
        # _core._lifecycle (see _replica_main, _ended_with).
        self.life = Lifecycle(self.num_replicas, offset=strategy._replica_offset)
        self.closed = False
        self.stall_warning_seconds = stall_warning_seconds
        # What every arrival reads, in one native object (_collective.Rendezvous); the
        # run shares its lists and dicts under the names below.
        self._rv = rv = Rendezvous(self, self.ledger, self.num_replicas)
        self.watch = _tasks.TaskWatch(rv.mains, rv.helpers)
        rv.local = self.group is None
        # Collectives issued and not awaited yet (see Collective): each replica's
        # newest, and any older ones by id.
        self.issued: list[Collective | None] = rv.issued
        self.unawaited: list[dict[int, Collective]] = rv.unawaited
        self._slots: dict[Key, Slot] = rv.slots
        self._loop: asyncio.AbstractEventLoop | None = None  # set when the run starts
        self._current_task: Callable[[], object] = _tasks.current_task
        self._parked: dict[int, Slot] = {}  # id(task) -> the collective it waits at
        # merge_calls every replica arrived at, whose merge_fn runs now.
        self._dispatching: dict[Key, tuple[Slot, Collective]] = {}
        # The incremental deadlock check (see _check_deadlock): replicas before
        # ``_scan_rid`` were seen blocked in generation ``_scan_gen``; ``_gen`` moves on
        # whenever a blocked task may have become runnable (a collective completes, a
        # task ends, a wait is abandoned): ``_rv.gen``.
        self._scan_gen = -1
        self._scan_rid = 0
        self._deferred = -1  # the generation whose deadlock check waited a loop turn
        self.inspections = 0  # tasks inspected by deadlock checks (tests count them)
        self._ended = ""  # how the run ended ("failed", "was cancelled"), once closed
        self._errors: list[tuple[int, BaseException]] = rv.errors
        # Errors of replicas cancelled while waiting: root causes unless the run itself
        # was cancelled (then they are its consequences).
        self._abandonments: list[CollectiveError] = []
        self._left: list[tuple[int, Key]] = []  # their replicas and collectives
        self._results: list[object] = [None] * self.num_replicas
        self._cancel_scope: anyio.CancelScope | None = None
        # Errors that already carry a note saying where they came from.
        self._noted: set[int] = set()
        # Errors raised because the run had already failed (ids): never root causes.
        self._consequences: set[int] = set()
        # Each replica's coroutine (see execute).
        self._mains: list[Coroutine[Any, Any, None]] = []

    @property
    def failed(self) -> bool:
        """Whether a root cause has been recorded."""
        return bool(self._errors)

    def note(self, error: BaseException, note: str) -> None:
        """Attach ``note`` to ``error`` instead of the usual "raised in replica k" note."""
        _add_note(error, note)
        self._noted.add(id(error))

    def _recorded(self, error: BaseException) -> bool:
        """Whether ``error`` is a recorded root cause, or only wraps recorded ones.

        A replica's own task group wraps the collective error it re-raises in an
        ``ExceptionGroup``; that group is not a second failure.
        """
        if any(e is error for _, e in self._errors) or id(error) in self._consequences:
            return True
        origin = getattr(error, "_ar_twin_of", None)
        if origin is not None and any(e is origin for _, e in self._errors):
            return True  # a waiter's copy of a dispatch error (_collective.fail_waiters)
        if isinstance(error, BaseExceptionGroup):
            return all(
                self._recorded(e) or isinstance(e, anyio.get_cancelled_exc_class())
                for e in error.exceptions
            )
        return False

    def _fail(self, replica: int, error: BaseException) -> None:
        # replica is -1 when no replica raised it (found by a callback).
        if not self._recorded(error):
            self._errors.append((replica, error))
            if self.tracer is not None:
                self.tracer.failed(error, getattr(error, "report", None))
        if self._cancel_scope is not None:
            self._cancel_scope.cancel()

    # -- collectives ----------------------------------------------------------------

    def all_reduce(
        self, op: ReduceOp, payloads: list[Any], bytes_per_pack: int
    ) -> Awaitable[list[list[object]]]:
        """Call the backend's ``all_reduce``, with ``bytes_per_pack`` if it accepts it."""
        if self._packs:
            return self.backend.all_reduce(op, payloads, bytes_per_pack=bytes_per_pack)
        return self.backend.all_reduce(op, payloads)

    def collective(self, call: Collective) -> Any:
        """Meet the other replicas at this replica's next collective (a coroutine).

        ``await collective`` takes ``Rendezvous.arrive_fast`` where it can; this coroutine
        serves every other case (trio, a timeout, a tracer, ``schedule="random"``, a
        collective run as a task), with the same steps and checks.

        Args:
            call: The issued collective: its replica, signature, payload, dispatch
                function, timeout and result structure.

        Returns:
            A coroutine whose result is this replica's result, rebuilt into
            ``call.treedef``'s structure.
        """
        return self._collective(call)

    def _abandoned(self, replica: int, key: Key, slot: Slot, outside: bool = False) -> None:
        """A waiter was cancelled: its replica left the collective at ``key``.

        Unless the whole run is being cancelled (then the run ends with that
        cancellation, see :meth:`execute`), this is the root cause: the others would
        wait for ever. The run fails at once; the tracer hears of it when the run ends.

        ``outside``: the cancellation is known to have been asked for before the run's
        own (asyncio's waiter tells): when another replica's abandonment failed the run
        meanwhile, this replica is still shown cancelled at ``key`` in that error.
        """
        self._rv.gen += 1
        scope = self._cancel_scope
        if scope is not None and scope.cancel_called:
            if outside and not slot.done:
                self.ledger.abandon(replica, key)  # the first abandonment is the error
            # The run's own scope cancelled it: a consequence. (With no root cause recorded
            # the scope was cancelled for a task that ended cancelled before it ran, which
            # the run's end tells as that replica's: see _account_for_every_replica.)
            return
        if not self._errors and slot.error is None:
            # After the collective completed (its peers have their results, computed
            # with this replica's value) the cancellation fails the run all the same:
            # it never took its result, and would go on with a value its peers lack.
            error = (
                self.ledger.cancelled_after(replica, key)
                if slot.done
                else self.ledger.abandon(replica, key)
            )
            if error is not None:
                self._errors.append((replica, error))
                self._abandonments.append(error)
                if not slot.done:
                    self._left.append((replica, key))
                else:
                    self._left.append((-1, key))  # told as it is
                if self._cancel_scope is not None:
                    self._cancel_scope.cancel()

    def _replica_awaiting(self, waiter: object) -> int | None:
        """The replica whose task awaits ``waiter`` (a completed fast-path waiter), if any.

        Only asked when such a task is cancelled (rare): it looks at the run's tasks.
        """
        for replica in range(self.num_replicas):
            for task in self.watch.tasks(replica):
                if getattr(task, "_fut_waiter", None) is waiter:
                    return replica
        return None

    async def _collective(self, call: Collective) -> Any:
        """:meth:`collective` as a coroutine: every loop, timeouts, tracing, shuffling."""
        if self._errors or (self.closed and self._ended != "ended"):
            # The run is being torn down; this raises the cancellation in a replica's
            # task. A task outside the run's scope (a helper the replica did not await)
            # learns that the run is over instead.
            await anyio.lowlevel.checkpoint()
            raise self._helper_ended(None, call._signature)
        replica = call.replica
        signature = call._signature
        try:
            key, complete = self.ledger.arrive(replica, signature)
        except CollectiveError as exc:
            self._fail(replica, exc)
            raise
        tracer = self.tracer
        if tracer is not None:
            tracer.arrive(replica, key, signature)
        slot = self._rv.arrive_at(key, replica, call.payload, complete)
        call._slot = slot
        if complete:
            result = await self._dispatch(call, key, slot)
            if self.shuffle is not None:
                await self._jitter_after(replica, key, slot)
            return result
        else:
            task = self._current_task()
            parked = self._parked
            parked[id(task)] = slot
            try:
                if self.ledger.all_waiting():
                    self._check_deadlock(replica, current=task)
                loop = self._loop
                if call.timeout:
                    await self._wait(slot, key, replica, call.timeout)
                elif loop is not None:
                    future = loop.create_future()
                    slot.waiters.append(future)
                    await future
                else:
                    await self._park(slot)
            except anyio.get_cancelled_exc_class():
                self._abandoned(replica, key, slot)
                raise
            finally:
                del parked[id(task)]
            if slot.error is not None:
                raise slot.error()
            if tracer is not None:
                tracer.resume(replica, key)
        if self.shuffle is not None:
            await self._jitter_after(replica, key, slot)
        return _result(call, slot.results[replica])

    async def _jitter_after(self, replica: int, key: Key, slot: Slot) -> None:
        """:meth:`_jitter` after a collective completed, before its result is returned.

        A cancellation there leaves the collective as one at the wait does.
        """
        try:
            await self._jitter()
        except anyio.get_cancelled_exc_class():
            self._abandoned(replica, key, slot)
            raise

    async def _dispatch(self, call: Collective, key: Key, slot: Slot) -> Any:
        """The last arrival at ``key``: run the collective, wake the others.

        Returns:
            This replica's result (rebuilt).
        """
        replica = call.replica
        signature = call._signature
        tracer = self.tracer
        if tracer is not None:
            tracer.dispatch_begin(key, replica, signature)
        group = self.group
        if group is None:
            if signature.kind is CollectiveKind.MERGE_CALL:
                slot.results = await self._merge(call, key, slot)
            else:
                try:
                    slot.results = await call.dispatch(self, call, slot.payloads)
                except Exception as exc:
                    fail_waiters(slot, exc)
                    raise
        else:
            # Scale-out: the processes agree on this position first (MPI).
            payloads = slot.payloads
            try:
                slot.results = await group.collective(
                    signature,
                    key,
                    lambda: call.dispatch(self, call, payloads),
                    timeout=call.timeout or None,
                )
            except CollectiveError as exc:
                # The processes disagree (or one failed): the run's root cause, as a
                # disagreement of this process's replicas is, so that a replica's own
                # task group around the collective does not make it a group.
                self._fail(replica, exc)
                raise
            except Exception as exc:
                fail_waiters(slot, exc)
                if self.failed:
                    # Another collective of this run failed across processes first
                    # (e.g. timed out, leaving the processes out of step): this one's
                    # error is its consequence, not a second root cause.
                    self._consequences.add(id(exc))
                raise
        if tracer is not None:
            tracer.dispatch_end(key)
            tracer.resume(replica, key)
        slot.release()
        self._rv.gen += 1  # the waiters are runnable again
        if slot.warned:
            self._log_resumed(slot)
        return _result(call, slot.results[replica])

    def _log_resumed(self, slot: Slot) -> None:
        """A collective that was reported stalled completed after all."""
        waited = self._rv.clock() - slot.since
        logger.warning(resumed_message(key_text(slot.key), waited))

    async def _merge(self, call: Collective, key: Key, slot: Slot) -> Sequence[Any]:
        """Run a merge_call's ``merge_fn``, watched by the stall warning and the timeout.

        ``merge_fn`` is user code: while it runs, every replica waits for it. It is
        bounded by the collective's ``timeout_seconds`` (counted from when it starts)
        and reported by the stall warning like a missing replica.
        """
        merging = slot.task = call.dispatch(self, call, slot.payloads)  # where it waits
        dispatching = self._dispatching
        dispatching[key] = (slot, call)
        limit = call.timeout
        where_stuck = "unknown"
        try:
            if limit is None or not limit:
                return await merging
            with anyio.move_on_after(limit):
                try:
                    return await merging
                except anyio.get_cancelled_exc_class() as exc:
                    where_stuck = _tasks.where_raised(exc.__traceback__)
                    raise
        finally:
            del dispatching[key]
        if self.failed:
            await anyio.lowlevel.checkpoint()  # the run is being torn down: cancelled here
        signature = call._signature
        where = key_text(key)
        error = CollectiveTimeoutError(
            key_index(key),
            limit,
            dict.fromkeys(range(self.num_replicas), signature),
            {},
            where=where,
            report=self.ledger.report(),
            message=merge_fn_timeout_message(
                where,
                limit,
                signature.merge_fn_name or "merge_fn",
                call.replica,
                where_stuck,
                self.num_replicas,
            ),
        )
        self._fail(call.replica, error)
        raise error

    async def _jitter(self) -> None:
        """Yield to the loop a seeded random number of times (``schedule="random"``)."""
        assert self.shuffle is not None
        for _ in range(self.shuffle.randrange(4)):
            await anyio.lowlevel.checkpoint()

    async def _park(self, slot: Slot) -> None:
        loop = self._loop
        if loop is not None:
            future = loop.create_future()
            slot.waiters.append(future)
            await future
            return
        if not slot.waiters:
            import trio

            slot.waiters.append(trio.Event())
        await slot.waiters[0].wait()

    async def _wait(self, slot: Slot, key: Key, replica: int, wait_limit: float | None) -> None:
        if not wait_limit:
            await self._park(slot)
            return
        with anyio.move_on_after(wait_limit):
            await self._park(slot)
        if slot.done:
            return
        if self._slots.get(key) is not slot and not self.failed:
            # Every replica arrived and the dispatch is under way (under MPI it waits
            # for the other processes, and bounds that wait itself): not a timeout here.
            await self._park(slot)
            return
        self._deadlocked(replica, current=self._current_task())  # a cycle, not a timeout?
        if self.failed:
            # The run failed meanwhile: a replica's task is cancelled here; a helper
            # task outside the run's scope gets the run's end, not a second root cause.
            await anyio.lowlevel.checkpoint()
            raise self._helper_ended(key, None)
        error = self.ledger.timeout_error(key, wait_limit, self._whereabouts(key))
        self._fail(replica, error)
        raise error

    async def _watch_stalls(self, stall: float) -> None:
        """Log a warning for each collective that has waited ``stall`` seconds.

        One task per run; it sleeps until the oldest unwarned collective would stall,
        so it costs nothing per collective.
        """
        try:
            await self._watch_stalls_loop(stall)
        except anyio.get_cancelled_exc_class():
            if _ending.requested():
                raise
            # Cancelled by no scope of the run (a shutdown routine that cancels every
            # task): stop watching. Re-raised, it would cancel the whole run as if it had
            # ended; the replicas cancelled with it fail the run themselves.

    async def _watch_stalls_loop(self, stall: float) -> None:
        while True:
            now = self._rv.clock()
            due = [s.since + stall for s in self._slots.values() if not s.warned]
            due += [s.since + stall for s, _ in self._dispatching.values() if not s.warned]
            await anyio.sleep(max(min(due, default=now + stall) - now, 0.0))
            now = self._rv.clock()
            if self._deadlocked():
                return
            for key, slot in list(self._slots.items()):
                if not slot.warned and now - slot.since >= stall and not slot.done:
                    slot.warned = True
                    message = self.ledger.stall_message(
                        key, now - slot.since, self._whereabouts(key)
                    )
                    logger.warning(message)
            if self.group is not None:
                continue  # across processes, the process group bounds and reports its waits
            for key, (slot, call) in list(self._dispatching.items()):
                if not slot.warned and now - slot.since >= stall and not slot.done:
                    # Every replica arrived; their merge_fn is what does not return.
                    slot.warned = True
                    message = merge_fn_stall_message(
                        key_text(key),
                        now - slot.since,
                        call._signature.merge_fn_name or "merge_fn",
                        call.replica,
                        _tasks.where_awaits(slot.task),
                        self.num_replicas,
                    )
                    logger.warning(message)

    def _deadlocked(self, replica: int = -1, current: object = None) -> bool:
        """Check for a cycle now; whether the run failed with one.

        Checks run on events (arrivals, task ends); a replica that began to join its
        parked helpers after they parked made none. The stall watcher and an expired
        timeout ask again, so such a cycle is reported as a cycle, not as a stall.
        """
        if self.failed or self.closed or not self.ledger.all_waiting():
            return False
        self._scan_gen = -1  # a full look: no event marked what changed
        with contextlib.suppress(CollectiveDeadlockError):
            self._check_deadlock(replica, current=current)
        return self.failed

    def _whereabouts(self, key: Key) -> dict[int, str]:
        found = {}
        for rid in self.ledger.missing(key):
            main = self.watch.main.get(rid)
            if main is not None:
                found[rid] = _tasks.whereabouts(main)
        return found

    def _check_deadlock(self, replica: int, *, current: object = None) -> None:
        """Fail the run if no replica can ever complete a collective again.

        Incremental: a task seen blocked (finished, parked at a pending collective,
        or joining tasks of the run) stays blocked until an event the run sees moves
        ``_gen`` on (a collective completes, a task ends, a wait is abandoned). So a
        check resumes where the previous one of the same generation stopped: at the
        first replica that had a task able to act. Over a generation each replica is
        passed at most once, so an arrival's cost does not grow with the replicas.
        When every replica has been passed, one fresh look at all of them confirms
        the deadlock before it is reported (a stale look never reports one).

        Args:
            replica: The replica whose event triggered the check (-1: a callback).
            current: The running task, about to park (it counts as parked).
        """
        if not self.ledger.all_waiting():
            return
        if self._scan_gen != self._rv.gen:
            self._scan_gen = self._rv.gen
            self._scan_rid = 0
        rid = self._scan_rid
        n = self.num_replicas
        while rid < n:
            if not self._replica_blocked(rid, current):
                self._scan_rid = rid
                return
            rid += 1
        for rid in range(n):  # confirm with a fresh look
            if not self._replica_blocked(rid, current):
                self._scan_rid = rid
                return
        unseen = self._adopt_unseen()
        if unseen == "adopted":
            # Tasks of a replica that the run had not seen (asyncio.Task(coro) called
            # directly, a callback's task): look again with them.
            self._scan_gen = -1
            self._check_deadlock(replica, current=current)
            return
        if unseen == "deferred":
            return
        self._scan_rid = n
        error = self.ledger.deadlock_error()
        self._fail(replica, error)
        raise error

    def _adopt_unseen(self) -> str:
        """Watch the unfinished tasks of the loop that run in a replica's context unseen.

        A task created without the task factory (``asyncio.Task(coro)``) or before it was
        chained again is found here, before a deadlock is reported: its context says
        which replica it belongs to (read from the future it awaits on Python 3.11). A
        task whose context cannot be read yet (it has not started) may be one: the check
        is made again on the next loop turn, once per generation.

        Returns:
            ``"adopted"`` (look again), ``"deferred"`` (a check is scheduled) or ``""``.
        """
        loop = self._loop
        if loop is None:
            return ""
        found = False
        unread = False
        for task in asyncio.all_tasks(loop):
            if task.done() or self.watch.knows(task):
                continue
            context = _tasks.context_replica(task)
            if context is None:
                unread = unread or getattr(task, "_fut_waiter", None) is None
                continue
            if context._run is self:
                self.watch.adopt(context._replica_id, task, owned=False)
                task.add_done_callback(self.task_done)
                found = True
        if found:
            return "adopted"
        if unread and self._deferred != self._rv.gen:
            self._deferred = self._rv.gen
            loop.call_soon(self._recheck)
            return "deferred"
        return ""

    def _recheck(self) -> None:
        """A deadlock check deferred to the next loop turn (see :meth:`_adopt_unseen`)."""
        if self.closed or self.failed or not self.ledger.all_waiting():
            return
        self._scan_gen = -1
        with contextlib.suppress(CollectiveError):
            self._check_deadlock(-1)

    def _replica_blocked(self, replica: int, current: object) -> bool:
        """Whether no task of ``replica`` can issue a collective without another's help."""
        watch = self.watch
        for task in watch.tasks(replica):
            self.inspections += 1
            if not _tasks.blocked(task, functools.partial(self._is_parked, current), watch.knows):
                return False
        return True

    def _is_parked(self, current: object, task: object) -> bool:
        """Whether ``task`` waits at one of this run's pending collectives."""
        if task is current:
            return True
        slot = self._parked.get(id(task))
        if slot is not None:
            return not slot.done
        waiter = getattr(task, "_fut_waiter", None)  # asyncio: the fast path
        return type(waiter) is Waiter and waiter._ar_slot.run is self and not waiter.done()

    def task_done(self, task: object) -> None:
        """A task of some replica ended: replicas may now be deadlocked."""
        self.watch.forget(task)
        self._rv.gen += 1  # whoever joined it may run again
        if self.closed or self.failed or not self.ledger.all_waiting():
            return
        # A deadlock is recorded as the run's root cause and the run is cancelled.
        with contextlib.suppress(CollectiveError):
            self._check_deadlock(-1)

    # -- replicas ---------------------------------------------------------------------

    def _unawaited(self, replica: int) -> list[Collective]:
        """The collectives ``replica`` issued and has not awaited, oldest first."""
        pending = list(self.unawaited[replica].values())
        newest = self.issued[replica]
        if newest is not None:
            pending.append(newest)
        return pending

    def _check_awaited(self, replica: int) -> None:
        pending = self._unawaited(replica)
        for c in pending:
            c.close()
        self.unawaited[replica].clear()
        self.issued[replica] = None
        if pending:
            sites = "\n".join(f"  * {c.describe()}" for c in pending)
            raise CollectiveError(
                f"Replica {replica + self.strategy._replica_offset} created {len(pending)} "
                f"collective"
                f"{'' if len(pending) == 1 else 's'} that it never awaited:\n\n{sites}\n\n"
                "A collective runs only when awaited; without `await` this replica skips it "
                "while its peers wait for it. Write `await ctx.all_reduce(...)`.\n"
                + see_also("CollectiveError"),
                report=self.ledger.report(),
            )

    async def _replica_main(
        self,
        replica: int,
        mode: Mode,
        fn: Callable[..., Any],
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
    ) -> None:
        if self.failed:
            # Another replica failed before this one started: like TensorFlow, replicas
            # do not start a segment after a failure; this one is cancelled, not run.
            self.life.handle(replica, Event.SKIP)
            self.ledger.cancel(replica)
            return
        self.life.handle(replica, Event.START)
        MODE.set(mode)
        task = self._current_task()
        self.watch.started(replica, task)
        called = False
        try:
            if self.shuffle is not None:
                await self._jitter()
            called = True
            result = fn(*args, **kwargs)
            if inspect.isawaitable(result):
                result = await result
            self._check_awaited(replica)
        except BaseException as exc:
            if self._ended_with(replica, exc, called):
                raise
            return
        finally:
            for c in self._unawaited(replica):
                c.close()
        self.life.handle(replica, Event.RETURN)
        self._results[replica] = result
        try:
            self.ledger.finish(replica)
            if not self.failed:  # once failed, the run is being torn down: no deadlock
                self._check_deadlock(replica, current=task)  # this task is ending
        except CollectiveError as exc:
            # Once the run has failed, later replicas that finish see the same stuck
            # collective: the root cause is already recorded.
            if not self.failed:
                self._fail(replica, exc)
        except Exception as exc:
            # asyncreplica's own bookkeeping broke after the replica returned: never the
            # user's error (it would get a note blaming the replicas).
            self._fail(
                replica,
                self._internal_error(
                    f"Bookkeeping failed after replica "
                    f"{replica + self.strategy._replica_offset} returned: {_describe(exc)}",
                    exc,
                    replica,
                ),
            )

    def _ended_with(self, replica: int, error: BaseException, called: bool = True) -> bool:
        """``replica``'s task is ending with ``error``: drive its lifecycle, record the cause.

        Called in that task (see :func:`._ending.event_of`). Every way a replica can end
        without returning goes through the lifecycle table here; each final state either
        is the run's root cause (recorded, the run fails with it) or the consequence of
        a run that already failed or was cancelled.

        Args:
            replica: The replica.
            error: What ended its task.
            called: Whether its step function had been called.

        Returns:
            Whether the task must re-raise ``error`` (a cancellation the run asked for).
        """
        if isinstance(error, BaseExceptionGroup) and not isinstance(error, Exception):
            # A replica's own task group mixes a failure with its children's
            # cancellations (trio): the failure is what counts. The same on every loop:
            # asyncio's CancelledError is a cancellation on trio too (see _ending).
            failures, _ = error.split(_not_a_cancellation)
            if failures is None:
                event = Event.CANCEL if _ending.requested() else Event.CANCEL_OUTSIDE
            else:
                error = failures
                event = Event.RAISE if isinstance(failures, Exception) else Event.INTERRUPT
        else:
            event = _ending.event_of(error)
        state = self.life.handle(replica, event)
        if state is State.CANCELLED:
            self.ledger.cancel(replica)
            return True
        if state is State.CANCELLED_OUTSIDE or state is State.CLOSED:
            self.ledger.cancel(replica)
        else:
            self.ledger.fail(replica)
        if state is State.CANCELLED_OUTSIDE or state is State.CLOSED:
            cause: BaseException = self._replica_cancelled(
                replica, "closed" if state is State.CLOSED else "cancelled", error, called
            )
        elif state is State.BROKEN:
            cause = self._internal_error(
                f"An exception escaped asyncreplica's own code in the task of replica "
                f"{replica + self.strategy._replica_offset}: {_describe(error)}",
                error,
                replica,
            )
        else:
            # RAISED, INTERRUPTED: the user's own exception (KeyboardInterrupt and
            # SystemExit included) is the root cause, re-raised as it is by the run.
            cause = error
        self._fail(replica, cause)
        return False

    def _replica_cancelled(
        self, replica: int, how: str, error: BaseException | None, called: bool = False
    ) -> ReplicaCancelledError:
        """The run's error for a replica cancelled from outside it (or closed).

        ``called``: whether its step function was called (it may have returned an
        awaitable, whose cancellation ended the replica with no line of it running).
        """
        cancelled = ReplicaCancelledError(
            replica + self.strategy._replica_offset,
            how,
            None if error is None else _ending.where_ended(error),
            num_replicas=self.strategy.num_replicas_in_sync,
            strategy=type(self.strategy).__name__,
            report=self.ledger.report(),
            called=called,
        )
        cancelled.__cause__ = error
        return cancelled

    def _internal_error(
        self, message: str, error: BaseException | None, replica: int | None
    ) -> InternalError:
        """An :class:`InternalError` with ``error`` chained; never noted as a replica's."""
        internal = InternalError(
            message,
            replica_id=None if replica is None else replica + self.strategy._replica_offset,
        )
        internal.__cause__ = error
        self._noted.add(id(internal))
        return internal

    def _account_for_every_replica(self) -> None:
        """The run's task group ended without an error: every replica must have returned.

        A replica whose task was cancelled before its first step never ran our code; it
        is told to the lifecycle here. Any other replica not ``RETURNED`` while no root
        cause is recorded is a broken invariant (it would become a ``None`` result).
        """
        life = self.life
        for replica in range(self.num_replicas):
            if life.states[replica] is State.NOT_STARTED:
                event = Event.SKIP if self.failed else Event.CANCEL_OUTSIDE
                if life.handle(replica, event) is State.CANCELLED_OUTSIDE:
                    self.ledger.cancel(replica)
                    self._fail(replica, self._replica_cancelled(replica, "cancelled", None))
        if self.failed:
            return
        for replica in range(self.num_replicas):
            if life.outcome(replica) is not Outcome.RESULT:
                self._fail(
                    replica,
                    self._internal_error(
                        f"Replica {replica + self.strategy._replica_offset} ended in state "
                        f"{life.states[replica].name} while the run recorded no failure; "
                        "it would have returned no result",
                        None,
                        replica,
                    ),
                )

    async def execute(
        self,
        modes: Sequence[Mode],
        fn: Callable[..., Any],
        args: Sequence[Sequence[Any]],
        kwargs: Sequence[Mapping[str, Any]],
    ) -> list[object]:
        """Run every replica to completion; return their results in replica order.

        Raises:
            Exception: The root cause of a failed run (see the module docstring).
        """
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        self._loop = self._rv.loop = loop
        self._rv.clock = loop_clock(loop)
        self._rv.fast_await = loop is not None and self.tracer is None and self.shuffle is None
        self._current_task = _tasks.current_task
        if loop is not None:
            self._current_task = asyncio.current_task
            current_tasks = getattr(asyncio.tasks, "_current_tasks", None)
            if isinstance(asyncio.current_task, types.FunctionType) and isinstance(
                current_tasks, dict
            ):
                # Python 3.11's current_task is Python code reading this dict: read it
                # directly (one C call per waiting replica instead of two Python calls).
                self._current_task = functools.partial(current_tasks.get, loop)
                self._rv.running = current_tasks
        self._rv.current_task = self._current_task
        self._rv.thread = threading.get_ident()
        if loop is not None:
            _tasks.install_factory(loop, _on_task_created)
        else:
            import trio

            # Not _tasks.current_task, which asks asyncio first: on trio that raises
            # (and catches) a RuntimeError at every waiting replica's arrival.
            self._current_task = self._rv.current_task = trio.lowlevel.current_task
            _tasks.install_trio_watch(self.task_done, _on_trio_task_spawned)
        stall = self.stall_warning_seconds
        if self.tracer is not None:
            self.tracer.run_begin(self.num_replicas, self.strategy.extended.worker_devices)
        cancelled = False
        try:
            async with anyio.create_task_group() as outer:
                if stall and self.num_replicas > 1:
                    outer.start_soon(self._watch_stalls, stall, name="asyncreplica stall watch")
                async with anyio.create_task_group() as tg:
                    self._cancel_scope = tg.cancel_scope
                    order = list(range(self.num_replicas))
                    if self.shuffle is not None:
                        self.shuffle.shuffle(order)
                    for i in order:
                        # Created here, not by the task group: a task cancelled before
                        # its first step never runs it, and the run's end closes it.
                        main = self._replica_main(i, modes[i], fn, args[i], kwargs[i])
                        self._mains.append(main)
                        tg.start_soon(_given, main, name=f"asyncreplica replica {i}")
                outer.cancel_scope.cancel()
            self._account_for_every_replica()
        except BaseException as exc:
            self._ended = "was cancelled"
            escaped = [e for e in _leaves(exc) if not _cancelled(e)]
            # The run itself was cancelled: replicas cancelled while waiting are not
            # root causes, nor (by a cancellation alone) replicas cancelled meanwhile:
            # a shutdown that cancels every task cancels the run and its replicas apart.
            self._errors[:] = [  # the list is shared with self._rv
                (r, e)
                for r, e in self._errors
                if not any(e is a for a in self._abandonments)
                and (escaped or not (isinstance(e, ReplicaCancelledError) and e.how == "cancelled"))
            ]
            self._abandonments.clear()
            self._left.clear()
            # The run failed before (or while) a scope around it was cancelled: then the
            # failure is what the caller hears, as from a plain task group (the caller's
            # scope stays cancelled).
            if not escaped and not self._errors:
                cancelled = True  # from outside: a scope around Strategy.run
                raise
            # Not a replica's: a KeyboardInterrupt that trio delivered to this task.
            for error in escaped:
                self._fail(-1, error)
        finally:
            await self._tear_down(loop, cancelled)
        if self._errors:
            raise self._root_cause()
        return self._results

    async def _tear_down(self, loop: asyncio.AbstractEventLoop | None, cancelled: bool) -> None:
        """The run's end, whatever ended it: every step runs even if one before it raised.

        Pending collectives are aborted and helper tasks told (:meth:`_close_leftovers`),
        the tracer hears the end, and the task factory (or trio instrument) is removed.
        """
        try:
            self.closed = True
            for main in self._mains:
                if inspect.getcoroutinestate(main) == inspect.CORO_CREATED:
                    main.close()  # its task was cancelled before it started
            self._mains.clear()
            if self._errors:
                self._ended = "failed"
            leftovers = self._close_leftovers()
            if leftovers:
                # Give the helper tasks just woken with an error (or cancelled) the few
                # loop turns they need to finish, so none outlives the run. Bounded: a
                # helper that swallows its error and goes on is its own business.
                with anyio.CancelScope(shield=True):
                    for _ in range(_LEFTOVER_TURNS):
                        if all(task.done() for task in leftovers):
                            break
                        await anyio.lowlevel.checkpoint()
        finally:
            try:
                self._retell_abandonments()
                if self.tracer is not None:
                    for error in self._abandonments:
                        self.tracer.failed(error, error.report)
                    self.tracer.run_end(cancelled=cancelled)
            finally:
                if loop is not None:
                    _tasks.uninstall_factory(loop)
                else:
                    _tasks.uninstall_trio_watch(self.task_done, _on_trio_task_spawned)

    def _retell_abandonments(self) -> None:
        """Rebuild the errors of replicas cancelled while waiting, now that the run is over.

        Replicas cancelled in the same loop turn hear of it one after the other: when the
        first one's error was built, the others were still waiting. Now their rows and
        the message say they were cancelled too.
        """
        for i, (replica, key) in enumerate(self._left):
            if replica < 0:
                continue
            old = self._abandonments[i]
            new = self.ledger.abandoned_error(replica, key, old.report)
            new.__cause__ = old.__cause__
            self._abandonments[i] = new
            self._errors[:] = [(r, new if e is old else e) for r, e in self._errors]

    def _close_leftovers(self) -> list[asyncio.Task[Any]]:
        """The run is over: no collective still pending can complete; tasks are told.

        A collective awaited by a task that outlived its replica (one started with
        ``asyncio.ensure_future`` or ``create_task`` and not awaited) is woken with a
        ``CollectiveError`` saying the run ended, so whoever awaits that task later
        gets an error, never a hang. When the run failed or was cancelled, the other
        unfinished tasks its replicas created are cancelled, as the replicas were.

        Returns:
            The tasks that were woken or cancelled: they finish within a loop turn or two.
        """
        ended = self._ended or "ended"
        self._ended = ended
        helpers = self.watch.helpers() if self._loop is not None else []
        # Decided before the collectives are resolved: a parked helper gets the error.
        parked: list[asyncio.Task[Any]] = []
        idle: list[asyncio.Task[Any]] = []
        for task in helpers:
            if isinstance(task, asyncio.Task) and not task.done():
                (parked if self._is_parked(None, task) else idle).append(task)
        for key, slot in list(self._slots.items()):
            slot.abort(functools.partial(self._ended_error, key, None))
        self._slots.clear()
        for task in parked:
            # Its error is the run's consequence, already raised by Strategy.run.
            task.add_done_callback(_retrieve)
        if ended != "ended":
            for task in idle:
                task.cancel()
            return parked + idle
        return parked

    def _helper_ended(self, key: Key | None, signature: Signature | None) -> CollectiveError:
        """:meth:`_ended_error`, raised in a helper task that outlived its replica.

        Nobody may await that task: its error is the run's consequence, already raised by
        ``Strategy.run``, so it is marked retrieved once the task ends.
        """
        task = self._current_task() if self._loop is not None else None
        if isinstance(task, asyncio.Task):
            task.add_done_callback(_retrieve)
        return self._ended_error(key, signature)

    def _ended_error(self, key: Key | None, signature: Signature | None) -> CollectiveError:
        """The error for a collective that can never complete: its run failed or ended.

        Args:
            key: The collective, if it was issued (else ``signature`` describes it).
            signature: The collective's signature, when it was never issued.
        """
        cause = None
        if self._errors:
            cause = _describe(sorted(self._errors, key=lambda item: item[0])[0][1])
        return CollectiveError(
            ended_message(
                key_text(key) if key is not None else None,
                signature.describe() if signature is not None else None,
                self._ended or "failed",
                cause,
                self.ledger.missing(key) if key is not None else (),
                type(self.strategy).__name__,
            ),
            report=self.ledger.report(),
        )

    def _root_cause(self) -> BaseException:
        errors = sorted(self._errors, key=lambda item: item[0])
        name = f"{type(self.strategy).__name__}.run"
        for replica, error in errors:
            if isinstance(error, (CollectiveError, InternalError)) or id(error) in self._noted:
                continue  # they name their replicas themselves (an InternalError, none)
            if replica < 0:
                _add_note(
                    error,
                    f"(raised while {name} waited for its {self.num_replicas} replicas, "
                    "which were cancelled)",
                )
            else:
                _add_note(
                    error,
                    f"(raised in replica {replica + self.strategy._replica_offset} of "
                    f"{self.strategy.num_replicas_in_sync} in {name})",
                )
        if len(errors) == 1:
            return errors[0][1]
        exceptions = [e for _, e in errors]
        if same_refusal(exceptions):
            return exceptions[0]  # one collective refused alike by every replica
        if all(isinstance(e, Exception) for e in exceptions):
            return ExceptionGroup(
                f"{len(exceptions)} replicas failed in {type(self.strategy).__name__}.run",
                [e for e in exceptions if isinstance(e, Exception)],
            )
        return BaseExceptionGroup(
            f"{len(exceptions)} replicas failed in {type(self.strategy).__name__}.run", exceptions
        )


# A replica's call paths end at its driver (the user's frames are above it).
_inspect.register_driver(Run._replica_main.__code__)
