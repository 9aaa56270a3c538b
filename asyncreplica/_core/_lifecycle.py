"""The replica lifecycle: how a replica's task can start and end, as one table.

Rules of this module (as h11's ``_state.py``):

1. Every way a replica's task can start or end is an :class:`Event`, every place it can
   be in is a :class:`State`, and :data:`TRANSITIONS` says, for *every* pair, the next
   state or that the pair is illegal. The table is total: a test checks that no pair is
   missing, and another test exercises each cell.
2. An illegal pair is a broken invariant of asyncreplica, never the user's doing: it
   raises :class:`~asyncreplica.InternalError`, from the one raise site in
   :meth:`Lifecycle.handle`.
3. No event loop, no arrays, no clock. The runtime decides which event happened (it can
   look at tasks and cancel scopes) and reports it here; what the run then does with
   each final state is the table :data:`OUTCOME`.

Theory. A replica's task is started once. While it runs, its position among the
collectives (running, or waiting at a key) is the ledger's business
(:mod:`._ledger`); this table only sees the task's two ends:

* it is never run (``SKIP``: the run failed before its task started), or it starts
  (``START``) and then ends exactly once;
* it ends by returning (``RETURN``), by raising an ``Exception`` of the user's
  (``RAISE``), by raising ``KeyboardInterrupt``, ``SystemExit`` or another
  ``BaseException`` of the user's (``INTERRUPT``), by a cancellation that a cancel scope
  of the run or around it requested (``CANCEL``), by a cancellation that no such scope
  requested (``CANCEL_OUTSIDE``: ``task.cancel()`` on the replica's task, or a
  ``CancelledError`` raised by a library inside the step or a merge_fn), by
  ``GeneratorExit`` (``CLOSE``: only the interpreter closing a coroutine should raise
  it), or by an exception that asyncreplica's own code raised by mistake (``BUG``);
* a task cancelled before its first step never runs the replica's code: at the run's
  end it gets ``SKIP``, ``CANCEL`` or ``CANCEL_OUTSIDE`` from ``NOT_STARTED``.

Only ``RETURNED`` gives a result. Every other final state either fails the run with a
named error (:data:`OUTCOME` ``ROOT_CAUSE``) or is the consequence of a run that already
failed or was cancelled (``CONSEQUENCE``): ``Strategy.run`` never returns ``None`` in
place of a replica's result.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

from .._exceptions import InternalError

__all__ = ["OUTCOME", "TRANSITIONS", "Event", "Lifecycle", "Outcome", "State"]


class State(enum.Enum):
    """Where a replica's task is in its life."""

    NOT_STARTED = "not started"
    RUNNING = "running"
    # Final states: the task ended.
    RETURNED = "returned"
    RAISED = "raised an exception"
    INTERRUPTED = "raised a BaseException"
    CANCELLED = "cancelled by the run"
    CANCELLED_OUTSIDE = "cancelled from outside the run"
    CLOSED = "closed by GeneratorExit"
    BROKEN = "stopped by an internal error"
    SKIPPED = "never run (the run had failed)"


class Event(enum.Enum):
    """What happened to a replica's task (the runtime decides which, see the module doc)."""

    START = "start"
    SKIP = "skip"
    RETURN = "return"
    RAISE = "raise"
    INTERRUPT = "interrupt"
    CANCEL = "cancel"
    CANCEL_OUTSIDE = "cancel from outside"
    CLOSE = "close"
    BUG = "internal error"


class Outcome(enum.Enum):
    """What a replica's final state means for the run."""

    RESULT = "result"  # its result goes into Strategy.run's PerReplica
    ROOT_CAUSE = "root cause"  # the run fails with it (a named error)
    CONSEQUENCE = "consequence"  # the run already failed or was cancelled


class _Illegal:
    """The marker of a cell that never happens unless asyncreplica has a bug."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "ILLEGAL"


ILLEGAL = _Illegal()

_S = State
_E = Event
_FINAL = (
    _S.RETURNED,
    _S.RAISED,
    _S.INTERRUPTED,
    _S.CANCELLED,
    _S.CANCELLED_OUTSIDE,
    _S.CLOSED,
    _S.BROKEN,
    _S.SKIPPED,
)

#: state -> event -> next state, or ILLEGAL. Every (state, event) pair is listed.
TRANSITIONS: dict[State, dict[Event, State | _Illegal]] = {
    _S.NOT_STARTED: {
        _E.START: _S.RUNNING,
        _E.SKIP: _S.SKIPPED,
        # Its task was cancelled before its first step (seen when the run ends).
        _E.CANCEL: _S.CANCELLED,
        _E.CANCEL_OUTSIDE: _S.CANCELLED_OUTSIDE,
        # Nothing of the replica's ran: it cannot return, raise or be closed.
        _E.RETURN: ILLEGAL,
        _E.RAISE: ILLEGAL,
        _E.INTERRUPT: ILLEGAL,
        _E.CLOSE: ILLEGAL,
        _E.BUG: ILLEGAL,
    },
    _S.RUNNING: {
        _E.START: ILLEGAL,  # a replica runs once per run
        _E.SKIP: ILLEGAL,  # it already runs
        _E.RETURN: _S.RETURNED,
        _E.RAISE: _S.RAISED,
        _E.INTERRUPT: _S.INTERRUPTED,
        _E.CANCEL: _S.CANCELLED,
        _E.CANCEL_OUTSIDE: _S.CANCELLED_OUTSIDE,
        _E.CLOSE: _S.CLOSED,
        _E.BUG: _S.BROKEN,
    },
    # A task ends once: no event follows a final state.
    **{final: dict.fromkeys(_E, ILLEGAL) for final in _FINAL},
}

#: final state -> what it means for the run.
OUTCOME: dict[State, Outcome] = {
    _S.RETURNED: Outcome.RESULT,
    _S.RAISED: Outcome.ROOT_CAUSE,  # the user's exception, re-raised with a note
    _S.INTERRUPTED: Outcome.ROOT_CAUSE,  # KeyboardInterrupt etc., re-raised with a note
    _S.CANCELLED_OUTSIDE: Outcome.ROOT_CAUSE,  # ReplicaCancelledError
    _S.CLOSED: Outcome.ROOT_CAUSE,  # ReplicaCancelledError
    _S.BROKEN: Outcome.ROOT_CAUSE,  # InternalError
    _S.CANCELLED: Outcome.CONSEQUENCE,  # the run failed, or was cancelled from around it
    _S.SKIPPED: Outcome.CONSEQUENCE,  # the run failed before this replica started
}


class Lifecycle:
    """The lifecycle state of each replica of one run, driven only through the table.

    Args:
        num_replicas: How many replicas the run has (local ids ``0..num_replicas-1``).
        offset: The global id of replica 0, for messages.
    """

    __slots__ = ("_offset", "states")

    def __init__(self, num_replicas: int, *, offset: int = 0) -> None:
        self.states: list[State] = [State.NOT_STARTED] * num_replicas
        self._offset = offset

    def handle(self, replica: int, event: Event) -> State:
        """Apply ``event`` to ``replica``: its next state, from :data:`TRANSITIONS`.

        Raises:
            InternalError: The transition is illegal (a bug in asyncreplica).
        """
        state = self.states[replica]
        nxt = TRANSITIONS[state][event]
        if isinstance(nxt, _Illegal):
            raise InternalError(
                f"replica {replica + self._offset} got the lifecycle event "
                f"{event.name} in state {state.name}, which the replica lifecycle "
                "table does not allow"
            )
        self.states[replica] = nxt
        return nxt

    def final(self, replica: int) -> bool:
        """Whether ``replica``'s task has ended (or will never run)."""
        return self.states[replica] in _FINAL

    def outcome(self, replica: int) -> Outcome | None:
        """What ``replica``'s final state means for the run; None while it is not final."""
        return OUTCOME.get(self.states[replica])

    def replicas_in(self, states: Sequence[State]) -> list[int]:
        """The replicas now in one of ``states``, in replica order."""
        return [r for r, s in enumerate(self.states) if s in states]
