"""Deadlocks and stalls of a run: what it decides without time, and what with it.

The watching half of :class:`~._run.Run` (a base class of it): the incremental check
that no replica can ever complete a collective again (:meth:`Watching._check_deadlock`,
made on events: arrivals, task ends, abandoned waits; it looks at tasks through
:mod:`._tasks`), and the one task per run that logs a stall warning for a collective
that waits too long (:meth:`Watching._watch_stalls`). Time enters only through the stall
warning and the timeouts; a deadlock is decided without it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Hashable
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel

from .._core._ledger import Key
from .._core._report import (
    key_text,
    merge_fn_stall_message,
    resumed_message,
)
from .._exceptions import (
    CollectiveDeadlockError,
    CollectiveError,
)
from . import _ending, _tasks
from ._collective import Slot
from ._park import Parking

if TYPE_CHECKING:
    from ..abc import ProcessGroup

__all__ = ["Watching"]


logger = logging.getLogger("asyncreplica")


class Watching(Parking):
    """The state of a run that its deadlock checks and stall watch read (set by ``Run``)."""

    closed: bool
    group: ProcessGroup | None
    inspections: int
    _scan_gen: int
    _scan_rid: int
    _deferred: int
    _mains_done: bool
    _peer_timer: asyncio.TimerHandle | None

    def _log_resumed(self, slot: Slot) -> None:
        """A collective that was reported stalled completed after all."""
        waited = self._rv.clock() - slot.since
        logger.warning(resumed_message(key_text(slot.key), waited))

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

    def _hear_peers(self, group: ProcessGroup) -> bool:
        """Fail the run with another process's failure (:meth:`ProcessGroup.watch_peers`).

        A replica at a collective hears of a peer's failure in the collective's own
        wait; this hears of it while no replica is at one (each awaits something else),
        and fails the run with it, as a replica's error would: the replicas are
        cancelled and the run raises it. Whether to call it again.
        """
        if self.failed or self.closed or self._mains_done:
            return False
        try:
            waits: dict[Hashable, tuple[Any, tuple[int, ...]]] = {}
            for key, slot in self._slots.items():
                if slot.done:
                    continue
                arrived = [(i, s) for i, s in enumerate(slot.signatures) if s is not None]
                if arrived:
                    offset = group.offset
                    waits[key] = (arrived[0][1], tuple(offset + i for i, _ in arrived))
            group.local_waits(waits)
            group.watch_peers()
        except Exception as error:
            self._fail(-1, error)
            return False
        return True

    def _peer_tick(
        self, loop: asyncio.AbstractEventLoop, group: ProcessGroup, seconds: float
    ) -> None:
        """asyncio: :meth:`_hear_peers` from a timer, every ``seconds`` (no task, no thread)."""
        if self._hear_peers(group):
            self._peer_timer = loop.call_later(seconds, self._peer_tick, loop, group, seconds)

    async def _watch_peers(self, group: ProcessGroup, seconds: float) -> None:
        """trio: :meth:`_hear_peers` every ``seconds``, in a task of the run's."""
        try:
            while True:
                await anyio.sleep(seconds)
                if not self._hear_peers(group):
                    return
        except anyio.get_cancelled_exc_class():
            if _ending.requested():
                raise  # the run's end (or a scope around it); else see _watch_stalls

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

    def task_done(self, task: object) -> None:
        """A task of some replica ended: replicas may now be deadlocked."""
        self.watch.forget(task)
        self._rv.gen += 1  # whoever joined it may run again
        if self.closed or self.failed or not self.ledger.all_waiting():
            return
        # A deadlock is recorded as the run's root cause and the run is cancelled.
        with contextlib.suppress(CollectiveError):
            self._check_deadlock(-1)
