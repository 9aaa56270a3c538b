"""How a run's replicas leave it: waits abandoned, tasks ended, the error the run raises.

The parking and ending half of :class:`~._run.Run` (its base class): a replica parked at
a collective and cancelled there (:meth:`Parking._abandoned`), a backend combine
cancelled under the replica that runs it (:meth:`Parking._dispatch_ended`), a replica's
task ending any way (:meth:`Parking._ended_with`, through the lifecycle table of
:mod:`.._core._lifecycle`), the run's own cancellation of its replicas
(:meth:`Parking._cancel_run`), and, once the run is over, what is left of it: pending
collectives resolved, helper tasks told (:meth:`Parking._close_leftovers`), and the one
error ``Strategy.run`` raises (:meth:`Parking._root_cause`). ``_run`` keeps the set-up,
the rendezvous and the replica's driver; :mod:`._deadlock` the checks for cycles and
stalls.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel

from .._core._dtypes import same_refusal
from .._core._ledger import Key, Ledger
from .._core._lifecycle import Event, Lifecycle, Outcome, State
from .._core._report import (
    ended_message,
    key_text,
    told_once,
)
from .._core._report import error_text as _describe
from .._core._signature import Signature
from .._exceptions import (
    CollectiveError,
    InternalError,
    ReplicaCancelledError,
    made_before,
    own_mark,
)
from . import _ending, _tasks
from ._collective import Collective, Rendezvous, Slot, fail_waiters
from ._waiter import Waiter

if TYPE_CHECKING:
    from ._protocols import RunStrategy
    from ._trace import Tracer

__all__ = ["Parking"]


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


def _add_note(error: BaseException, note: str) -> None:
    """Add ``note`` to ``error`` if it accepts one (a user's exception may refuse)."""
    with contextlib.suppress(Exception):
        error.add_note(note)


def _retrieve(task: asyncio.Task[Any]) -> None:
    """Mark a task's exception as retrieved (the run already reported the failure)."""
    if not task.cancelled():
        task.exception()


def _retrieve_reported(error: BaseException, task: asyncio.Task[Any]) -> None:
    """Mark ``task``'s exception retrieved if it is ``error``, which the run raises.

    A helper task (``asyncio.ensure_future(collective)`` left to ``asyncio.wait``) that
    raised the run's root cause would otherwise be logged as "Task exception was never
    retrieved". Any other exception of the task is left for its owner to retrieve.
    """
    if not task.cancelled() and getattr(task, "_exception", None) is error:
        task.exception()


def twin_of(error: BaseException) -> BaseException | None:
    """The error ``error`` is a waiter's copy of (``_collective.twin``), or None."""
    found = own_mark(error, "_ar_twin_of")
    return found if isinstance(found, BaseException) else None


class Parking:
    """The state of a run that its endings read and write (set by ``Run.__init__``)."""

    strategy: RunStrategy
    tracer: Tracer | None
    num_replicas: int
    ledger: Ledger
    life: Lifecycle
    watch: _tasks.TaskWatch
    _rv: Rendezvous
    _slots: dict[Key, Slot]
    _loop: asyncio.AbstractEventLoop | None
    _current_task: Callable[[], object]
    _parked: dict[int, Slot]
    _ended: str
    _errors: list[tuple[int, BaseException]]
    _abandonments: list[CollectiveError]
    _left: list[tuple[int, Key]]
    _cancel_scope: anyio.CancelScope | None
    _reason: str
    _reason_given: bool
    _pending_outside: set[int]
    _left_replicas: set[int]
    _noted: set[int]
    _born: int
    _consequences: set[int]
    _forgotten: list[BaseException]
    _dispatching: dict[Key, tuple[Slot, Collective]]
    _stopping: anyio.Event | None
    _also_left: dict[Key, list[int]]
    _after_left: list[tuple[int, Key, str, CollectiveError]]

    @property
    def failed(self) -> bool:
        """Whether a root cause has been recorded."""
        return bool(self._errors)

    def note(self, error: BaseException, note: str) -> None:
        """Attach ``note`` to ``error`` instead of the usual "raised in replica k" note."""
        _add_note(error, note)
        self._noted.add(id(error))

    def note_interrupt(self, replica: int, task: asyncio.Task[Any]) -> None:
        """A helper task of ``replica`` ended: note a ``KeyboardInterrupt`` or ``SystemExit``.

        asyncio lets those leave the event loop at once, from the helper task, past the
        run (which never sees them): they go on as themselves, with the replica's note as
        any other error of a replica has. The note is added when the loop runs its
        callbacks again (``asyncio.run`` does, cancelling the tasks left).
        """
        if task.cancelled():
            return
        error = getattr(task, "_exception", None)  # not exception(): it is not retrieved
        if not isinstance(error, BaseException) or isinstance(error, Exception):
            return
        if isinstance(error, (asyncio.CancelledError, GeneratorExit)):
            return  # (a loop callback: anyio cannot tell which loop runs it)
        where = _ending.where_ended(error)
        self.note(
            error,
            f"(raised in a task started by replica {replica + self.strategy._replica_offset} "
            f"of {self.strategy.num_replicas_in_sync} in {type(self.strategy).__name__}.run"
            + (f", at {where})" if where else ")"),
        )

    def _recorded(self, error: BaseException) -> bool:
        """Whether ``error`` is a recorded root cause, or only wraps recorded ones.

        A replica's own task group wraps the collective error it re-raises in an
        ``ExceptionGroup``; that group is not a second failure.
        """
        if any(e is error for _, e in self._errors) or id(error) in self._consequences:
            return True
        origin = twin_of(error)
        if origin is not None and (
            any(
                e is origin or e.__cause__ is origin or twin_of(e) is origin
                for _, e in self._errors
            )
            or id(origin) in self._consequences
        ):
            # A waiter's copy of a dispatch error (_collective.fail_waiters), recorded as
            # it is or as the error that chains it (an InternalError, for a bug of ours).
            return True
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
            if self._loop is not None:
                task = self._current_task()
                if isinstance(task, asyncio.Task):
                    # The run raises it: the task it is raised in need not report it again.
                    task.add_done_callback(functools.partial(_retrieve_reported, error))
        self._cancel_run()

    def _cancel_run(self) -> None:
        """Cancel the run's scope (its replicas), with the run's reason.

        First, the replicas whose task already has a cancellation pending are noted:
        asked for before the run's, it is not the run's (``task.cancel()`` of several
        replica tasks in one turn: each is cancelled from outside, see
        :meth:`_cancelled_outside`).
        """
        scope = self._cancel_scope
        if scope is None or scope.cancel_called:
            return
        if self._loop is not None:
            for replica, task in enumerate(self._rv.mains):
                if (
                    isinstance(task, asyncio.Task)
                    and not task.done()
                    and task.cancelling()
                    and task is not self._current_task()
                ):
                    self._pending_outside.add(replica)
        try:
            scope.cancel(self._reason)  # type: ignore[call-arg,unused-ignore]
        except TypeError:  # anyio before 4.11 takes no reason
            scope.cancel()
        else:
            self._reason_given = True
        if self._stopping is not None:
            self._stopping.set()  # shielded waiters too (see Run._wake_shielded)

    def _by_run(self, error: BaseException) -> bool | None:
        """Whether the cancellation ``error`` is the run's own (None: cannot be told)."""
        scope = self._cancel_scope
        if scope is None or not scope.cancel_called:
            return False
        return _ending.delivered_by(error, scope, self._reason if self._reason_given else None)

    def _cancelled_outside(self, replica: int, error: BaseException) -> bool:
        """Whether ``replica``'s task, ended by ``error``, was cancelled from outside.

        By no scope of the run's nor around it, though the run's scope is cancelled now.
        Two replica tasks cancelled with ``task.cancel()`` in one turn: the first one's end
        cancels the run's scope; the second one's cancellation came first all the same.
        """
        return (
            replica in self._pending_outside
            and replica not in self._left_replicas
            and self._by_run(error) is False
            and not _ending.scope_cancellation(error)
        )

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
            if outside:
                self._left_replicas.add(replica)  # told by the first abandonment's error
                if not slot.done and self._slots.get(key) is not slot:
                    # Every replica arrived (combining, or its merge_fn runs): its row
                    # says cancelled, and the first one's error names it too.
                    self.ledger.cancelled_after(replica, key)
                    self._also_left.setdefault(key, []).append(replica)
                elif not slot.done:
                    self.ledger.abandon(replica, key)  # the first abandonment is the error
            # The run's own scope cancelled it: a consequence. (With no root cause recorded
            # the scope was cancelled for a task that ended cancelled before it ran, which
            # the run's end tells as that replica's: see _account_for_every_replica.)
            return
        if not self._errors and slot.error is None:
            # After the collective completed (its peers have their results, computed
            # with this replica's value) the cancellation fails the run all the same:
            # it never took its result, and would go on with a value its peers lack. The
            # same while the backend combines it (every replica arrived: it left _slots).
            combining = not slot.done and self._slots.get(key) is not slot
            during = ""
            if combining:
                merging = key in self._dispatching
                during = "their merge_fn ran" if merging else "the backend combined their values"
            error = (
                self.ledger.cancelled_after(replica, key, during=during)
                if slot.done or combining
                else self.ledger.abandon(replica, key)
            )
            if error is not None:
                self._left_replicas.add(replica)
                self._errors.append((replica, error))
                self._abandonments.append(error)
                if not slot.done and not combining:
                    self._left.append((replica, key))
                else:
                    self._left.append((-1, key))  # told as it is
                    if combining:  # unless others are cancelled there in the same turn
                        self._after_left.append((replica, key, during, error))
                self._cancel_run()

    def _dispatch_ended(
        self, replica: int, slot: Slot, error: BaseException, *, merge: bool = False
    ) -> None:
        """The call that combines ``slot``'s collective ended with ``error``.

        The backend's combine, or a merge_call's ``merge_fn`` (``merge``), runs in the task
        of the replica that arrived last. ``error`` is not an ``Exception`` (those go to
        every waiter as they are, see ``fail_waiters``). A cancellation abandons the
        combine half-way, so no replica waiting there can ever get a result: each is woken
        with an error now, never left waiting (a replica that catches its cancellation
        must not leave its peers parked for ever). One the run did not ask for is the
        run's root cause: a ``CollectiveError`` naming the replica whose combine was
        cancelled, or for a ``merge_fn`` the ``ReplicaCancelledError`` of its replica (its
        ``where`` is the merge_fn's line); otherwise the waiters learn that the run
        ended. ``GeneratorExit`` closes the combine as a cancellation does (the error
        says "closed" for a ``merge_fn``; a copy of it thrown into a waiter's task on
        asyncio would close its coroutine, not reach its step). ``KeyboardInterrupt``,
        ``SystemExit`` and any other ``BaseException`` fail the run when they leave the
        replica's task, which cancels the waiters; each waiter is woken with a copy at
        once all the same (``fail_waiters``, as for an ``Exception``): a replica that
        catches it (save and stop on Ctrl-C) must not leave its peers parked for ever.
        """
        if slot.done:
            return
        closed = isinstance(error, GeneratorExit)
        if not closed and not _ending.cancellation(error):
            fail_waiters(slot, error)
            return
        key = slot.key
        if not self._errors and slot.error is None and self._by_run(error) is not True:
            cause: CollectiveError
            if merge:
                self.ledger.cancel(replica)
                how = "closed" if closed else "cancelled"
                cause = self._replica_cancelled(replica, how, error, called=True)
            else:
                waiting = [r for r in range(self.num_replicas) if r != replica]
                cause = self.ledger.cancelled_combining(replica, key, waiting)
                cause.__cause__ = error
            self._left_replicas.add(replica)
            self._errors.append((replica, cause))
            self._abandonments.append(cause)
            self._left.append((-1, key))  # told as it is
            fail_waiters(slot, cause)  # each waiter raises a copy: not a second root cause
            self._cancel_run()
            return
        slot.abort(functools.partial(self._consequence, key))
        self._rv.gen += 1  # the waiters are runnable again

    def _consequence(self, key: Key) -> CollectiveError:
        """:meth:`_ended_error` for ``key``, raised because the run already failed."""
        error = self._ended_error(key, None)
        self._consequences.add(id(error))
        return error

    def _replica_awaiting(self, waiter: object) -> int | None:
        """The replica whose task awaits ``waiter`` (a completed fast-path waiter), if any.

        Only asked when such a task is cancelled (rare): it looks at the run's tasks.
        """
        for replica in range(self.num_replicas):
            for task in self.watch.tasks(replica):
                if getattr(task, "_fut_waiter", None) is waiter:
                    return replica
        return None

    def _is_parked(self, current: object, task: object) -> bool:
        """Whether ``task`` waits at one of this run's pending collectives."""
        if task is current:
            return True
        slot = self._parked.get(id(task))
        if slot is not None:
            return not slot.done
        waiter = getattr(task, "_fut_waiter", None)  # asyncio: the fast path
        return type(waiter) is Waiter and waiter._ar_slot.run is self and not waiter.done()

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
        grouped = isinstance(error, BaseExceptionGroup)
        if isinstance(error, BaseExceptionGroup) and not isinstance(error, Exception):
            # A replica's own task group mixes a failure with its children's
            # cancellations (trio): the failure is what counts. The same on every loop:
            # asyncio's CancelledError is a cancellation on trio too (see _ending).
            failures, cancellations = error.split(_not_a_cancellation)
            if failures is None:
                event = Event.CANCEL if _ending.requested() else Event.CANCEL_OUTSIDE
            else:
                if cancellations is not None:
                    # split made a new group. It is still a waiter's copy of a merge_fn's
                    # error (fail_waiters), or the error such copies were made of: marked,
                    # so that it does not count as a second failure (_recorded).
                    origin = twin_of(error) or error
                    with contextlib.suppress(Exception):
                        failures._ar_twin_of = origin  # type: ignore[attr-defined]
                    error = failures
                # Nothing split off: the group itself, whose identity tells a copy (split
                # would make a new group of the same exceptions, told as another failure).
                event = Event.RAISE if isinstance(error, Exception) else Event.INTERRUPT
        else:
            event = _ending.event_of(error)
            if event is Event.CANCEL and (
                not _cancelled(error) or self._cancelled_outside(replica, error)
            ):
                # Not the run's: asyncio's CancelledError raised on trio (trio cancels
                # with its own class), or a cancellation asked for before the run's.
                event = Event.CANCEL_OUTSIDE
        state = self.life.handle(replica, event)
        if state is State.CANCELLED:
            self.ledger.cancel(replica)
            # A group of cancellations (a merge_fn's, or a task group's inside the step)
            # is not the run's own cancellation: re-raised, it would escape the run's task
            # groups as anyio's "unhandled errors in a TaskGroup" instead of the error the
            # run recorded. The task ends here; the run is being cancelled anyway.
            return not grouped
        if (
            state is State.CANCELLED_OUTSIDE or state is State.CLOSED
        ) and replica in self._left_replicas:
            # Its leaving a collective is already told by an error of its own (the run's
            # root cause, or its consequence): not a second root cause.
            self.ledger.cancel(replica)
            return False
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
            if grouped:
                self._forget_own_cancellation(replica)
        self._fail(replica, cause)
        return False

    def _forget_own_cancellation(self, replica: int) -> None:
        """``replica`` ends with its own task group's failure: that is its one error.

        A task group cancels the code around it when a child fails: a collective (or a
        merge_fn) ``replica`` was awaiting there was left by that cancellation, which
        failed the run first as the replica's leaving. It was the failure's consequence,
        inside the replica: the replica's error is the failure (as trio tells it), not
        two errors of one replica.
        """
        mine = [
            e
            for r, e in self._errors
            if r == replica
            and (
                any(e is a for a in self._abandonments)
                or (isinstance(e, ReplicaCancelledError) and e.how == "cancelled")
            )
        ]
        if mine:
            self._errors[:] = [(r, e) for r, e in self._errors if not any(e is m for m in mine)]
            # Its peers woken with a copy of it (fail_waiters) tell no failure of theirs.
            self._consequences.update(id(e) for e in mine)
            self._forgotten.extend(mine)  # alive while their ids are kept

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
                # Neither anyio nor trio cancels a task before its first step (a replica
                # that starts after the run failed skips itself, in _replica_main): only
                # task.cancel() does, from outside, even in the turn the run failed.
                life.handle(replica, Event.CANCEL_OUTSIDE)
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
            for note in getattr(old, "__notes__", ()):
                _add_note(new, note)  # how it was left (by hand: see Run._left_by_hand)
            self._abandonments[i] = new
            self._errors[:] = [(r, new if e is old else e) for r, e in self._errors]
        for replica, key, during, old in self._after_left:
            also = [r for r in self._also_left.get(key, ()) if r != replica]
            if not also:
                continue
            new = self.ledger.cancelled_after(replica, key, during=during, also=also)
            new.__cause__ = old.__cause__
            self._abandonments[:] = [new if e is old else e for e in self._abandonments]
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
        offset = self.strategy._replica_offset
        once = told_once([(r + offset, e) for r, e in errors]) if errors[0][0] >= 0 else None
        if once is not None:
            return once  # one refusal, raised alike by each replica: its message names them
        name = f"{type(self.strategy).__name__}.run"
        for replica, error in errors:
            stale = made_before(error, self._born)
            if id(error) in self._noted or (
                isinstance(error, (CollectiveError, InternalError))
                and not stale
                and _ending.raised_in_library(error)
            ):
                # This run's own: they name their replicas themselves (an InternalError,
                # none). One the user's code made, or an earlier run's raised again, is
                # the user's error like any other.
                continue
            if stale and replica >= 0:
                _add_note(
                    error,
                    f"(raised in replica {replica + self.strategy._replica_offset} of "
                    f"{self.strategy.num_replicas_in_sync} in {name}: an earlier run made "
                    "this error, and the step raised it again)",
                )
            elif replica < 0:
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
