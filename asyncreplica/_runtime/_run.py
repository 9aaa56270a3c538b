"""One ``Strategy.run``: replica tasks, rendezvous, failure handling.

Rendezvous: the last replica to arrive at a collective dispatches the backend
operation in its own task, then wakes the others. Nobody polls; no thread per
replica. The ledger decides everything about agreement; this module only acts on its
answers: dispatch, wait, or fail the run.

Failure: the first error (a replica's exception, a ledger error, a timeout) is
recorded as a *root cause* and the run's cancel scope is cancelled, so every other
replica is cancelled, not reported. ``Strategy.run`` raises the root cause itself
(with a note naming the replica) or, if several replicas failed independently before
the cancellation reached them, an ``ExceptionGroup`` of them in replica order. A run
that spans several processes also asks its group, on a timer, for another process's
failure told while none of this process's replicas is at a collective, and fails
with it (``ProcessGroup.watch_peers``).

Time enters only here: a waiter that has waited ``stall_warning_seconds`` logs a
warning (and logs again if the collective completes after all); one that has waited
``timeout_seconds`` fails the run. Deadlocks and exits are decided without time.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import random
import threading
import types
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel

from .._core._ledger import Key, Ledger, key_index
from .._core._lifecycle import Event, Lifecycle
from .._core._report import (
    combine_timeout_message,
    key_text,
    merge_fn_timeout_message,
    see_also,
)
from .._core._report import error_text as _describe
from .._core._signature import CollectiveKind, ReduceOp
from .._exceptions import (
    CollectiveError,
    CollectiveTimeoutError,
    ReplicaCancelledError,
    ReplicaContextError,
    made_mark,
)
from . import _inspect, _ownership, _tasks
from ._clock import loop_clock
from ._collective import (
    NO_TREE,
    Collective,
    Rendezvous,
    Slot,
    fail_waiters,
    result_of,
)
from ._deadlock import Watching
from ._ending import refuse_generator_result, stop_iteration_error
from ._mode import MODE, Mode
from ._ownership import DROVE
from ._park import _add_note, _cancelled, _leaves, _retrieve
from ._waiter import Waiter

if TYPE_CHECKING:
    from ..abc import Backend, ProcessGroup
    from ._protocols import RunStrategy
    from ._trace import Tracer

__all__ = ["NO_TREE", "Collective", "Dispatch", "Run", "logger"]

logger = logging.getLogger("asyncreplica")

Dispatch = Callable[["Run", "Collective", list[Any]], Awaitable[Sequence[Any]]]


# Loop turns a run's end gives the helper tasks it woke or cancelled to finish.
_LEFTOVER_TURNS = 8

# The runs whose replicas are running now (any thread, any loop): a task of one of their
# replicas that finds no replica context in its context (a fresh contextvars.Context())
# is told so (see _context.get_replica_context), never given the default context.
LIVE_RUNS: list[Run] = []


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
        mode = MODE.get()
        replica = run.watch.replica_of(task)
        if replica < 0 and mode is not None and mode.replica is not None:
            replica = mode.replica._replica_id
        # First: the note goes on before anything else looks at the task's end.
        task.add_done_callback(functools.partial(run.note_interrupt, replica))
        task.add_done_callback(_inspect.forget_spawn)
        # A replica's helper task that ends may leave its replica blocked for good.
        task.add_done_callback(run.task_done)


def _on_trio_task_spawned(task: object) -> None:
    """Trio instrument hook: record a task started inside a replica (any nursery)."""
    if _trio_system_task(task):
        _refuse_system_task(task)
        return
    _spawned_in_replica(task)


def _trio_system_task(task: object) -> bool:
    """Whether trio ``task`` is a system task (``trio.lowlevel.spawn_system_task``).

    System tasks run in the nursery of trio's root task; the only other task there, the
    main one, starts before any run can watch.
    """
    import trio

    nursery = getattr(task, "parent_nursery", None)
    return nursery is not None and nursery.parent_task is trio.lowlevel.current_root_task()


def _refuse_fresh_system_task(context: Any) -> None:
    """A replica's task started a trio system task in a context with no replica in it.

    In a fresh ``contextvars.Context()`` the task would see the default replica context,
    whose collectives are the identity: its "all_reduce" would silently reduce nothing.
    """
    spawner = MODE.get()
    if spawner is None or spawner.replica is None:
        return  # not started from a replica's code
    run = spawner.replica._run
    if run is None or run.closed:
        return
    replica = run.watch.replica_of(run._current_task())
    if replica < 0:
        return
    where = _tasks.where_called()
    run._fail(
        replica,
        ReplicaContextError(
            f"Replica {replica + run.strategy._replica_offset} started a trio system task "
            f"(trio.lowlevel.spawn_system_task) in a context with no replica context (a fresh "
            f"contextvars.Context())" + (f", at {where}" if where else "") + ". There "
            "get_replica_context() would be the default replica context, whose collectives "
            "reduce nothing across replicas. Start the task in a nursery the step function "
            "opens (async with trio.open_nursery()), without context=.\n"
            + see_also("ReplicaContextError")
        ),
    )


def _refuse_system_task(task: Any) -> None:
    """A trio system task was started in a copy of a replica's context: refuse it.

    A system task is no replica's task: it outlives the run, and any exception leaving it
    (a collective's refusal or the run's end, raised there) crashes trio with
    ``TrioInternalError``. The run fails with a ``ReplicaContextError`` instead, and the
    task runs outside any replica (its copy of the context is reset, so a collective
    there is the default context's identity, never one of the run's).
    """
    context = getattr(task, "context", None)
    if context is None:
        return
    mode = context.get(MODE, None)
    if mode is None or mode.replica is None:
        _refuse_fresh_system_task(context)
        return  # the default: a copy of the context trio.run was called in
    run = mode.replica._run
    context.run(MODE.set, None)
    if run is None or run.closed:
        return
    replica = mode.replica._replica_id
    where = _tasks.where_called()
    run._fail(
        replica,
        ReplicaContextError(
            f"Replica {replica + run.strategy._replica_offset} started a trio system task "
            f"(trio.lowlevel.spawn_system_task) in a copy of its context"
            + (f", at {where}" if where else "")
            + ". A system task is not the replica's: it outlives the run, and an exception "
            "leaving it (a collective refused there) crashes trio with TrioInternalError. "
            "Start the task in a nursery the step function opens (async with "
            "trio.open_nursery()), or spawn the system task without the replica's context "
            "(leave out context=).\n" + see_also("ReplicaContextError")
        ),
    )


class Run(Watching):
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
        # Every asyncreplica error this run makes is made after this mark (_root_cause).
        self._born = made_mark()
        # Errors of replicas cancelled while waiting: root causes unless the run itself
        # was cancelled (then they are its consequences).
        self._abandonments: list[CollectiveError] = []
        self._left: list[tuple[int, Key]] = []  # their replicas and collectives
        self._results: list[object] = [None] * self.num_replicas
        self._cancel_scope: anyio.CancelScope | None = None
        # The reason the run cancels its scope with (see _cancel_run, _by_run), and
        # whether the loop's anyio took it.
        self._reason = f"asyncreplica: run {id(self):x} ended its replicas"
        self._reason_given = False
        # Replicas whose task had a cancellation pending when the run first cancelled its
        # scope (asked by no scope of the run's), and replicas whose leaving a collective
        # is already told by an error of its own (see _abandoned, _dispatch_ended).
        self._pending_outside: set[int] = set()
        self._left_replicas: set[int] = set()
        # Errors that already carry a note saying where they came from.
        self._noted: set[int] = set()
        # Errors raised because the run had already failed (ids): never root causes.
        self._consequences: set[int] = set()
        # A replica's errors that its own task group's failure replaced (kept alive: their
        # ids are in _consequences).
        self._forgotten: list[BaseException] = []
        # Each replica's coroutine (see execute).
        self._mains: list[Coroutine[Any, Any, None]] = []
        # Set when the run fails (see _cancel_run): _wake_shielded wakes the waiters that
        # a shielded scope kept from the run's cancellation; _mains_done once every
        # replica's task ended (then cancelling _wake_shielded is the run's own end).
        self._stopping: anyio.Event | None = None
        # Replicas cancelled in the same turn at a collective every replica had arrived
        # at (by key), and the errors that name the first of them (see _abandoned).
        self._also_left: dict[Key, list[int]] = {}
        self._after_left: list[tuple[int, Key, str, CollectiveError]] = []
        self._mains_done = False
        # The timer that watches the other processes (asyncio; see _peer_tick).
        self._peer_timer: asyncio.TimerHandle | None = None

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

    async def _collective(self, call: Collective) -> Any:
        """:meth:`collective` as a coroutine: every loop, timeouts, tracing, shuffling."""
        if self._errors or self._rv.stopped or (self.closed and self._ended != "ended"):
            # The run is being torn down; this raises the cancellation in a replica's
            # task. A task outside the run's scope (a helper the replica did not await)
            # learns that the run is over instead.
            await anyio.lowlevel.checkpoint()
            # (Or a replica under a shielded scope: the run's consequence, not a cause.)
            ended = self._helper_ended(None, call._signature)
            self._consequences.add(id(ended))
            raise ended
        replica = call.replica
        rv = self._rv
        task = rv.task()
        if task is not rv.mains[replica] and rv.helpers.get(id(task), -1) != replica:
            # Its __await__() iterator, taken by the replica's own task, driven by
            # another's (replica 1 calling next() on replica 0's): the arrival would be
            # parked in the wrong task (on trio, a wake trio's scheduler cannot take).
            raise _ownership.foreign_await(rv, call, task, DROVE)
        signature = call._signature
        try:
            key, complete = self.ledger.arrive(replica, signature)
        except CollectiveError as exc:
            self._fail(replica, exc)
            raise
        tracer = self.tracer
        if tracer is not None:
            tracer.arrive(replica, key, signature)
        slot = self._rv.arrive_at(key, replica, signature, call.payload, complete)
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
            except GeneratorExit:
                # Closed by hand (or by the garbage collector after the run, where no
                # async library is running to name its cancellation class): as below.
                if slot.error is None:
                    self._left_by_hand(replica, key, slot, task)
                raise
            except anyio.get_cancelled_exc_class() as exc:
                # Not the run's own cancellation: another replica cancelled in the same
                # turn may have failed the run meanwhile; this one left all the same.
                self._abandoned(replica, key, slot, outside=self._by_run(exc) is False)
                raise
            except Exception:
                # Thrown in by hand (close() or throw() on the collective's iterator after
                # a send() issued it): the replica leaves a collective its peers count on.
                # (An error the slot woke it with, slot.error, is the collective's own.)
                if slot.error is None:
                    self._left_by_hand(replica, key, slot, task)
                raise
            finally:
                del parked[id(task)]
            if slot.error is not None:
                raise slot.error()
            if tracer is not None:
                tracer.resume(replica, key)
        if self.shuffle is not None:
            await self._jitter_after(replica, key, slot)
        return result_of(call, slot.results[replica])

    def _left_by_hand(self, replica: int, key: Key, slot: Slot, task: object) -> None:
        """``replica`` left the collective at ``key`` without a cancellation: it fails the run.

        Its peers' results are (or would be) computed with its value while it goes on
        without its own: values that disagree, as for a cancellation there. On trio its
        task is taken out of the event it was parked on, which would otherwise reschedule
        a task that no longer waits (``TrioInternalError``).
        """
        if self._loop is None and slot.waiters:
            # trio.Event keeps its waiting tasks in a set (``_tasks``, trio 0.25+) or a
            # parking lot (``_lot._parked``, older): no public call forgets one.
            event = slot.waiters[0]
            tasks = getattr(event, "_tasks", None)
            if isinstance(tasks, set):
                tasks.discard(task)
            parked = getattr(getattr(event, "_lot", None), "_parked", None)
            if isinstance(parked, dict):
                parked.pop(task, None)
        self._abandoned_by_hand(replica, key, slot)

    def _unparked_by_hand(self, slot: Slot, event: Any) -> None:
        """On trio, before ``event`` (``slot``'s) is set: tasks it holds that do not wait on it.

        A replica that drove its collective's ``__await__()`` iterator by hand registered
        its task in the event and then went on (or waits elsewhere): rescheduling it would
        crash trio (``TrioInternalError``). It is taken out of the event, and its
        replica, which would never take its result, fails the run as one that left by hand.
        A task waits on the event exactly when its abort function (trio's, of
        ``Event.wait``) closes over the event.
        """
        tasks = getattr(event, "_tasks", None)
        if not isinstance(tasks, set):
            return
        rv = self._rv
        for task in list(tasks):
            abort = getattr(task, "_abort_func", None)
            cells = getattr(abort, "__closure__", None) or ()
            if any(getattr(cell, "cell_contents", None) is event for cell in cells):
                continue
            tasks.discard(task)
            replica = next((r for r, main in enumerate(rv.mains) if main is task), -1)
            if replica < 0:
                replica = rv.helpers.get(id(task), -1)
            if replica >= 0:
                self._abandoned_by_hand(replica, slot.key, slot, awaited=False)

    def _abandoned_by_hand(
        self, replica: int, key: Key, slot: Slot, *, awaited: bool = True
    ) -> None:
        """``replica`` left the collective at ``key`` by hand: the run fails (one error).

        ``awaited``: False when no task awaited the collective as its result arrived
        (``Slot.release``): its ``__await__()`` iterator was driven by hand and left, or
        is still held by code that is not the event loop.
        """
        told = len(self._errors)
        self._abandoned(replica, key, slot, outside=True)
        if len(self._errors) > told:
            rid = replica + self.strategy._replica_offset
            _add_note(
                self._errors[told][1],
                f"(replica {rid} left it by hand, not by a cancellation: close() or "
                "throw() on the collective's __await__() iterator after send() issued it; "
                "only the event loop drives a collective)"
                if awaited
                else f"(replica {rid} left it by hand, not by a cancellation: no task was "
                "awaiting it when its result arrived, because its __await__() iterator was "
                "driven by hand (send(), then close(), throw() or nothing); only the event "
                "loop drives a collective: write `await collective`)",
            )

    def _check_left_waiting(self, replica: int) -> None:
        """``replica`` returned while a waiter of its own is pending with no task on it.

        A collective driven by hand on the fast path (``__await__().send(None)``, then
        ``close()`` or ``throw()``) leaves its waiter behind: no task waits on it, and its
        replica ended without the result. That fails the run (see :meth:`_left_by_hand`).
        """
        for slot in list(self._rv.slots.values()):
            replicas = slot.fast_replicas
            if replica not in replicas:
                continue
            waiter = slot.fast_waiters[replicas.index(replica)]
            if waiter.done() or getattr(waiter, "_callbacks", None):
                continue  # set, or a task (a helper) still waits on it
            replicas.remove(replica)
            slot.fast_waiters.remove(waiter)
            asyncio.Future.cancel(waiter)  # not Waiter.cancel: told here, once
            self._abandoned_by_hand(replica, slot.key, slot)

    async def _jitter_after(self, replica: int, key: Key, slot: Slot) -> None:
        """:meth:`_jitter` after a collective completed, before its result is returned.

        A cancellation there leaves the collective as one at the wait does.
        """
        try:
            await self._jitter()
        except anyio.get_cancelled_exc_class() as exc:
            self._abandoned(replica, key, slot, outside=self._by_run(exc) is False)
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
                try:
                    slot.results = await self._merge(call, key, slot)
                except Exception as exc:
                    # Every replica parked there gets the merge_fn's error (a copy): one
                    # that catches it must not leave the others waiting for ever.
                    fail_waiters(slot, exc)
                    raise
                except BaseException as exc:  # cancelled inside the merge_fn
                    self._dispatch_ended(replica, slot, exc, merge=True)
                    raise
            else:
                try:
                    slot.results = await (
                        self._combine(call, key, slot)
                        if call.timeout
                        else call.dispatch(self, call, slot.payloads)
                    )
                except Exception as exc:
                    fail_waiters(slot, exc)
                    raise
                except BaseException as exc:  # cancelled inside the backend call
                    self._dispatch_ended(replica, slot, exc)
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
            except BaseException as exc:  # cancelled inside the process group's call
                self._dispatch_ended(replica, slot, exc)
                raise
        if tracer is not None:
            tracer.dispatch_end(key)
            tracer.resume(replica, key)
        slot.release()
        self._rv.gen += 1  # the waiters are runnable again
        if slot.warned:
            self._log_resumed(slot)
        return result_of(call, slot.results[replica])

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

    async def _combine(self, call: Collective, key: Key, slot: Slot) -> Sequence[Any]:
        """The backend's combine of a collective, bounded by its ``timeout_seconds``.

        Counted from when the combine starts, as a ``merge_fn`` is (see :meth:`_merge`):
        an ``async`` backend waiting for ever (on a peer, a device) is a hang every
        replica shares.
        """
        limit = call.timeout
        assert limit
        where_stuck = "unknown"
        with anyio.move_on_after(limit):
            try:
                return await call.dispatch(self, call, slot.payloads)
            except anyio.get_cancelled_exc_class() as exc:
                where_stuck = _tasks.where_raised(exc.__traceback__)
                raise
        if self.failed:
            await anyio.lowlevel.checkpoint()  # the run is being torn down: cancelled here
        signature = call._signature
        backend = self.backend
        method = signature.kind.value
        name = getattr(backend, "name", "") or type(backend).__name__
        where = key_text(key)
        error = CollectiveTimeoutError(
            key_index(key),
            limit,
            dict.fromkeys(range(self.num_replicas), signature),
            {},
            where=where,
            report=self.ledger.report(),
            message=combine_timeout_message(
                where,
                limit,
                f"the {name!r} backend's {method} ({type(backend).__name__}.{method})",
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

        # Cancelled by no scope of the run (a shutdown routine that cancels every
        # task): stop watching. Re-raised, it would cancel the whole run as if it had
        # ended; the replicas cancelled with it fail the run themselves.

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
            raise _ownership.never_awaited(
                replica + self.strategy._replica_offset,
                [c.describe() for c in pending],
                self.ledger.report(),
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
            refuse_generator_result(fn, result)
            if inspect.isawaitable(result):
                result = await result
            self._check_awaited(replica)
            if self._rv.slots:
                self._check_left_waiting(replica)
        except BaseException as exc:
            if isinstance(exc, StopIteration):
                # A plain step's StopIteration: Python would turn it into a RuntimeError
                # at the run's own coroutine, after the replica's note went on the
                # StopIteration (PEP 479). Turned here, it is the replica's error.
                exc = stop_iteration_error(exc, "the step function")
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
        LIVE_RUNS.append(self)
        stall = self.stall_warning_seconds
        if self.tracer is not None:
            self.tracer.run_begin(self.num_replicas, self.strategy.extended.worker_devices)
        cancelled = False
        try:
            async with anyio.create_task_group() as outer:
                if stall and self.num_replicas > 1:
                    outer.start_soon(self._watch_stalls, stall, name="asyncreplica stall watch")
                group = self.group
                seconds = None if group is None or group.size < 2 else group.peer_watch_seconds
                if seconds is not None:
                    assert group is not None
                    if loop is not None:  # a timer costs less than a task, every run
                        self._peer_timer = loop.call_later(
                            seconds, self._peer_tick, loop, group, seconds
                        )
                    else:
                        outer.start_soon(
                            self._watch_peers, group, seconds, name="asyncreplica peer watch"
                        )
                if self.num_replicas > 1:
                    self._stopping = anyio.Event()
                    outer.start_soon(
                        self._wake_shielded, self._stopping, name="asyncreplica shield watch"
                    )
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
                self._mains_done = True
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
            if self._peer_timer is not None:
                self._peer_timer.cancel()
                self._peer_timer = None
            await self._tear_down(loop, cancelled)
        if self._errors:
            raise self._root_cause()
        return self._results

    async def _wake_shielded(self, stopping: anyio.Event) -> None:
        """Wake the waiters a shielded scope keeps from the run's cancellation.

        The run fails (``stopping`` is set by :meth:`_cancel_run`) or is cancelled from
        outside: its scope's cancellation unwinds every replica parked at a collective,
        except one that awaits it inside ``anyio.CancelScope(shield=True)``, which would
        wait for ever (and the run with it). Those collectives can never complete: each
        waiter still parked one loop turn later (the cancellation reached the others
        at once) is woken with the run's "can never complete" error, a consequence of
        the root cause, and any later arrival gets it too.
        """
        try:
            await stopping.wait()
        except anyio.get_cancelled_exc_class():
            if not self._mains_done:  # cancelled from outside, replicas still running
                self._ended = self._ended or "was cancelled"
                self._abort_pending()
            raise
        self._abort_pending()

    def _abort_pending(self) -> None:
        """The collectives a replica's own task still waits at can never complete: wake them.

        Those of its helpers too while its main task has not ended (a helper in the
        replica's own task group, shielded, keeps the main task waiting). Only those: a helper task outside the run's scope (in a nursery the step was
        given) parked elsewhere is told when the run ends (:meth:`_close_leftovers`), after
        its own scope had the chance to cancel it.
        """
        self._rv.stopped = True
        stuck: dict[int, Slot] = {}

        def parked_at(task: object) -> None:
            slot = self._parked.get(id(task))
            if slot is None:
                waiter = getattr(task, "_fut_waiter", None)  # asyncio: the fast path
                slot = waiter._ar_slot if type(waiter) is Waiter else None
            if slot is not None and slot.run is self and not slot.done:
                stuck[id(slot)] = slot

        for replica, task in enumerate(self._rv.mains):
            if task is None:
                continue
            parked_at(task)
            if not _task_ended(task):
                # Its main task still runs (its own task group waits for its helpers):
                # a helper there, shielded, would keep it, and the run, for ever.
                for helper in self.watch.tasks(replica)[1:]:
                    parked_at(helper)
        if not stuck:
            return
        if self._loop is not None:
            for task in self.watch.helpers():
                if (
                    isinstance(task, asyncio.Task)
                    and not task.done()
                    and self._is_parked(None, task)
                ):
                    # Its error is the run's consequence, already raised by Strategy.run.
                    task.add_done_callback(_retrieve)
        for slot in stuck.values():
            slot.abort(functools.partial(self._consequence, slot.key))
        self._rv.gen += 1

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
                if self in LIVE_RUNS:
                    LIVE_RUNS.remove(self)
                if loop is not None:
                    _tasks.uninstall_factory(loop)
                else:
                    _tasks.uninstall_trio_watch(self.task_done, _on_trio_task_spawned)


def _task_ended(task: object) -> bool:
    """Whether ``task`` (an asyncio task, or a trio task) has finished."""
    if isinstance(task, asyncio.Task):
        return task.done()
    coro = getattr(task, "coro", None)  # trio.lowlevel.Task
    return coro is None or getattr(coro, "cr_frame", None) is None


# A replica's call paths end at its driver (the user's frames are above it).
_inspect.register_driver(Run._replica_main.__code__)
