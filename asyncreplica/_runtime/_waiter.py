"""The future a replica parked at a collective awaits on asyncio (interpreted on purpose).

It subclasses ``asyncio.Future`` (the C future: the replica's task awaits it directly, with
no Python frame when it resumes), which a mypyc native class cannot do, so it lives in a
module of its own that is never compiled; :mod:`._collective` creates it.
"""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["Waiter"]


class Waiter(asyncio.Future):  # type: ignore[type-arg]
    """A replica parked at a collective on asyncio (or uvloop): the fast path.

    The last arrival sets each waiter's result to its replica's result, already rebuilt. A
    task is parked at one of a run's collectives exactly when its ``_fut_waiter`` is one of
    the run's pending waiters, so parking costs no bookkeeping. Cancelling the waiter (the
    replica's task was cancelled) tells the run, before the task resumes, that the replica
    abandoned the collective.

    It holds one reference, its collective's slot (which knows its run and key), so that
    waking thousands of replicas touches few objects (docs/performance.md, "scale").
    """

    __slots__ = ("_ar_slot",)

    _ar_slot: Any  # the ``_collective.Slot`` it waits at

    def cancel(self, msg: Any = None) -> bool:
        """Cancel the wait; the run hears of it before the replica's task resumes.

        A waiter that already has its result cannot be cancelled, but its task is: it
        resumes with ``CancelledError`` instead of the result. The run hears of that too
        (a replica cancelled after its collective completed, see ``Run._abandoned``).
        """
        slot = self._ar_slot
        run = slot.run
        # Whether the run had asked for it is decided now: by the time the callback
        # runs, another replica cancelled in the same turn may have failed the run.
        scope = run._cancel_scope
        outside = scope is None or not scope.cancel_called
        if not self.done():
            replica = slot.fast_replicas[slot.fast_waiters.index(self)]
            # Scheduled before the task's own wake-up (which super().cancel schedules).
            self.get_loop().call_soon(run._abandoned, replica, slot.key, slot, outside)
        elif outside and not self.cancelled() and self.exception() is None:
            late = run._replica_awaiting(self)
            if late is not None:
                self.get_loop().call_soon(run._abandoned, late, slot.key, slot, outside)
        return super().cancel(msg)
