"""The process group's lifecycle, as a table: (state, event) -> next state or a refusal.

Pure: no MPI, no event loop, no clock. :class:`~asyncreplica_mpi.MPIProcessGroup`
moves through these states by calling :func:`advance`; every transition the table
does not allow is refused here, at one place, with the :class:`Refusal` that names
it, and the group turns a refusal into the user's error at one raise site
(``MPIProcessGroup._refuse``). A pair the table has no entry for is a bug in
asyncreplica: :class:`LifecycleBug`, never an error blamed on the program.

States:

* ``CREATED``: the constructor runs: this process announced itself and waits for
  the others (``_arrival``); no communicator exists yet.
* ``JOINED``: every process created the group; no run in progress.
* ``RUNNING``: a ``Strategy.run`` is in progress on this process.
* ``FAILED``: the processes can no longer exchange on this group: a peer exited,
  or they fell out of step (a failure after an agreement, a timeout). Every later
  use raises at once.
* ``CLOSED``: this process said goodbye on the group (at interpreter exit, or the
  group was released by every process).
* ``FINALIZED``: MPI was finalized (``MPI.Finalize()``, explicit or at exit): the
  goodbye was said first, from MPI's finalize hook.

Events (what happens to a group): see :class:`Event`.
"""

from __future__ import annotations

import enum

__all__ = ["TABLE", "Event", "LifecycleBug", "Refusal", "State", "advance"]


class State(enum.Enum):
    """Where a process group is in its life (see the module docstring)."""

    CREATED = "created"
    JOINED = "joined"
    RUNNING = "running"
    FAILED = "failed"
    CLOSED = "closed"
    FINALIZED = "finalized"


class Event(enum.Enum):
    """What happens to a process group."""

    #: Every process announced itself and the communicators exist.
    ARRIVED = "arrived"
    #: Creating failed: a peer did not arrive in time, gave up, or exited (before or
    #: inside its constructor), or the options that must agree differ; this process's
    #: constructor raises.
    ARRIVAL_FAILED = "arrival failed"
    #: ``Strategy.run`` starts.
    BEGIN_RUN = "begin run"
    #: The run ended in step on every process (finished, or failed at one exchange
    #: every process saw).
    END_RUN = "end run"
    #: A peer exited (its goodbye met this process's exchange): no exchange can
    #: complete any more.
    PEER_EXITED = "peer exited"
    #: The processes fell out of step (a failure after an agreement, here or in a
    #: peer; a timeout; an abandoned exchange).
    OUT_OF_STEP = "out of step"
    #: ``strategy.trace(path)`` ends: the merge of every process's timeline.
    TRACE_MERGE = "trace merge"
    #: ``MPI.Finalize()`` (explicit, or mpi4py's at exit).
    FINALIZE = "finalize"
    #: The interpreter exits: the goodbye exchange.
    EXIT = "exit"
    #: Every process dropped its strategy: the group's communicators are freed.
    RELEASE = "release"


class Refusal(enum.Enum):
    """Why an event is refused in a state (each maps to one user-facing error)."""

    #: A second run of one strategy while one is in progress.
    CONCURRENT_RUN = "concurrent run"
    #: The group failed: a peer exited or the processes are out of step.
    FAILED = "failed"
    #: The group was closed (goodbye said, or released).
    CLOSED = "closed"
    #: MPI was finalized.
    FINALIZED = "finalized"
    #: The trace merge was reached inside a run of the same strategy.
    MERGE_IN_RUN = "merge inside a run"
    #: The constructor is still running (nothing may use the group yet).
    NOT_JOINED = "not joined"


class LifecycleBug(RuntimeError):
    """asyncreplica's own lifecycle invariant broke (a bug to report, not a user error)."""


S, E, R = State, Event, Refusal

#: Every (state, event) pair: the next state, or the refusal. A state's missing pair is a
#: bug (:class:`LifecycleBug`). A refusal leaves the state as it is.
TABLE: dict[tuple[State, Event], State | Refusal] = {
    # The constructor.
    (S.CREATED, E.ARRIVED): S.JOINED,
    (S.CREATED, E.ARRIVAL_FAILED): S.FAILED,
    (S.CREATED, E.BEGIN_RUN): R.NOT_JOINED,
    (S.CREATED, E.TRACE_MERGE): R.NOT_JOINED,
    (S.CREATED, E.FINALIZE): S.FINALIZED,
    (S.CREATED, E.EXIT): S.CLOSED,
    # Idle.
    (S.JOINED, E.BEGIN_RUN): S.RUNNING,
    (S.JOINED, E.PEER_EXITED): S.FAILED,
    (S.JOINED, E.OUT_OF_STEP): S.FAILED,
    (S.JOINED, E.TRACE_MERGE): S.JOINED,
    (S.JOINED, E.FINALIZE): S.FINALIZED,
    (S.JOINED, E.EXIT): S.CLOSED,
    (S.JOINED, E.RELEASE): S.CLOSED,
    # A run.
    (S.RUNNING, E.BEGIN_RUN): R.CONCURRENT_RUN,
    (S.RUNNING, E.END_RUN): S.JOINED,
    (S.RUNNING, E.PEER_EXITED): S.FAILED,
    (S.RUNNING, E.OUT_OF_STEP): S.FAILED,
    (S.RUNNING, E.TRACE_MERGE): R.MERGE_IN_RUN,
    (S.RUNNING, E.FINALIZE): S.FINALIZED,
    (S.RUNNING, E.EXIT): S.CLOSED,
    # Failed: only the end of the run that saw the failure, and the end of the process.
    (S.FAILED, E.BEGIN_RUN): R.FAILED,
    (S.FAILED, E.END_RUN): S.FAILED,
    (S.FAILED, E.PEER_EXITED): S.FAILED,
    (S.FAILED, E.OUT_OF_STEP): S.FAILED,
    (S.FAILED, E.TRACE_MERGE): R.FAILED,
    (S.FAILED, E.FINALIZE): S.FINALIZED,
    (S.FAILED, E.EXIT): S.CLOSED,
    # Closed: said goodbye (at exit) or released.
    (S.CLOSED, E.BEGIN_RUN): R.CLOSED,
    (S.CLOSED, E.END_RUN): S.CLOSED,
    (S.CLOSED, E.PEER_EXITED): S.CLOSED,
    (S.CLOSED, E.OUT_OF_STEP): S.CLOSED,
    (S.CLOSED, E.TRACE_MERGE): R.CLOSED,
    (S.CLOSED, E.FINALIZE): S.FINALIZED,
    (S.CLOSED, E.EXIT): S.CLOSED,
    # Finalized: MPI is gone.
    (S.FINALIZED, E.BEGIN_RUN): R.FINALIZED,
    (S.FINALIZED, E.END_RUN): S.FINALIZED,
    (S.FINALIZED, E.PEER_EXITED): S.FINALIZED,
    (S.FINALIZED, E.OUT_OF_STEP): S.FINALIZED,
    (S.FINALIZED, E.TRACE_MERGE): R.FINALIZED,
    (S.FINALIZED, E.FINALIZE): S.FINALIZED,
    (S.FINALIZED, E.EXIT): S.FINALIZED,
}


def advance(state: State, event: Event) -> State | Refusal:
    """The state after ``event`` in ``state``, or why ``event`` is refused there.

    Raises:
        LifecycleBug: The table has no entry for the pair: asyncreplica sent an event
            that cannot happen in that state.
    """
    after = TABLE.get((state, event))
    if after is None:
        raise LifecycleBug(
            f"asyncreplica internal error: a process group in state {state.value!r} got "
            f"the event {event.value!r}, which cannot happen there. Please report this "
            "bug with the program that triggered it."
        )
    return after
