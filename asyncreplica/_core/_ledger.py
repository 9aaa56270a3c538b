"""The ledger: every replica's position, state and recent collectives, for one run.

Rules of this module (h11-style: they are what make the rest trustworthy):

1. Every decision about whether replicas agree is made here, from plain data, the
   moment it is certain -- never by a timeout. The runtime reports events
   (:meth:`Ledger.arrive`, :meth:`Ledger.finish`, :meth:`Ledger.fail`,
   :meth:`Ledger.cancel`) and acts on the answer; it holds no rule of its own.
2. No I/O, no event loop, no arrays, no clock. Time enters only as a number the
   caller passes (:meth:`Ledger.timeout_error`).
3. Which signature fields must agree is the table in :mod:`._match`.

Theory of operation. Replicas issue collectives one at a time (an unnamed collective
while another is in flight is an error). A replica's *position* is the 0-based index
of the collective it is issuing, so replicas meet at equal positions. The first
replica to arrive at a position sets the reference signature; every later arrival is
compared with it at once, so a mismatch is raised by the first disagreeing replica.
The last arrival completes the position and the runtime dispatches it.

A replica that *finishes* after ``k`` collectives can never arrive at position ``k``
or later. So the moment it finishes, any replica waiting at a position ``>= k`` is
stuck forever (:class:`ReplicaExitedError`), and so is any replica that arrives at
such a position afterwards. Keeping the smallest ``k`` over finished replicas makes
that check O(1) per arrival.

Invariant (checked by the property tests): for any sequence of events, every replica
that waits at a position is either released by the position's completion or is
reported in a :class:`CollectiveError` -- never left waiting.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass

from .._exceptions import (
    CollectiveError,
    CollectiveMismatchError,
    CollectiveTimeoutError,
    ReplicaExitedError,
)
from . import _report
from ._match import differing_fields
from ._signature import CallSite, Signature, ordinal

__all__ = ["Ledger", "ReplicaRow", "ReplicaState", "Report"]

HISTORY_SIZE = 16


class ReplicaState(enum.Enum):
    """Where a replica is in its run."""

    RUNNING = "running"
    WAITING = "waiting"
    FINISHED = "finished"
    FAILED = "failed"
    CANCELLED = "cancelled"


@dataclass(frozen=True, slots=True)
class ReplicaRow:
    """One replica's line in a :class:`Report`.

    Attributes:
        replica_id: The replica.
        state: Its state when the report was taken.
        position: The position it waits at (waiting), or the number of collectives
            it has issued (otherwise).
        signature: The collective it waits at, or its last one.
        history: Its most recent collectives as ``(position, signature)``, oldest
            first (at most 16: the flight recorder).
    """

    replica_id: int
    state: ReplicaState
    position: int
    signature: Signature | None
    history: tuple[tuple[int, Signature], ...]

    @property
    def call_site(self) -> CallSite | None:
        """Where :attr:`signature` was called, if known."""
        return None if self.signature is None else self.signature.call_site

    def __str__(self) -> str:
        where = "" if self.call_site is None else f" at {self.call_site}"
        what = "" if self.signature is None else f" {self.signature.describe()}{where}"
        return f"replica {self.replica_id}: {self.state.value}, position {self.position}{what}"


@dataclass(frozen=True, slots=True)
class Report:
    """The state of every replica of a run when an error was raised.

    Attributes:
        rows: One :class:`ReplicaRow` per replica, in replica order.
    """

    rows: tuple[ReplicaRow, ...]

    def __str__(self) -> str:
        return "\n".join(str(row) for row in self.rows)


class _Round:
    """The replicas that have arrived at one position."""

    __slots__ = ("reference", "signatures")

    def __init__(self, replica: int, signature: Signature) -> None:
        self.reference = signature
        self.signatures = {replica: signature}


class Ledger:
    """Tracks one run's replicas and decides, from their events, whether they agree.

    Args:
        num_replicas: How many replicas are in sync.
        check_call_sites: Whether unnamed collectives must also agree on their call path.
    """

    __slots__ = (
        "_check_call_sites",
        "_exit_bound",
        "_exited",
        "_history",
        "_next",
        "_rounds",
        "_states",
        "_waiting_at",
        "num_replicas",
    )

    def __init__(self, num_replicas: int, *, check_call_sites: bool = True) -> None:
        self.num_replicas = num_replicas
        self._check_call_sites = check_call_sites
        self._next = [0] * num_replicas
        self._states = [ReplicaState.RUNNING] * num_replicas
        self._waiting_at: list[int | None] = [None] * num_replicas
        self._history: list[deque[tuple[int, Signature]]] = [
            deque(maxlen=HISTORY_SIZE) for _ in range(num_replicas)
        ]
        self._rounds: dict[int, _Round] = {}
        # The smallest collective count of a finished replica, and that replica.
        self._exit_bound = -1
        self._exited = -1

    def arrive(self, replica: int, signature: Signature) -> tuple[int, bool]:
        """Record that ``replica`` issued a collective.

        Args:
            replica: The replica id.
            signature: The collective's signature.

        Returns:
            ``(position, complete)``: the position of this collective, and whether
            this arrival completed it (then the caller dispatches it).

        Raises:
            CollectiveMismatchError: The signature disagrees with the first arrival's.
            ReplicaExitedError: A replica finished before reaching this position.
            CollectiveError: The replica has another collective in flight, or has
                already finished.
        """
        state = self._states[replica]
        position = self._next[replica]
        if state is not ReplicaState.RUNNING:
            if state is ReplicaState.WAITING:
                pending_at = self._waiting_at[replica]
                assert pending_at is not None
                pending = self._rounds[pending_at].signatures[replica]
                raise CollectiveError(
                    _report.in_flight_message(replica, signature, pending, pending_at),
                    report=self.report(),
                )
            raise CollectiveError(
                f"Replica {replica} issued {signature.describe()} after it {state.value}.\n\n"
                "A collective belongs to the run of the replica that issues it: issue it from "
                "the step function (or a coroutine it awaits), not from a task that outlives "
                f"it.\nSee {_report.DOCS}#collectiveerror in the asyncreplica documentation.",
                report=self.report(),
            )
        round_ = self._rounds.get(position)
        if round_ is None:
            round_ = self._rounds[position] = _Round(replica, signature)
        else:
            fields = differing_fields(
                round_.reference, signature, check_call_sites=self._check_call_sites
            )
            if fields:
                round_.signatures[replica] = signature
                signatures = dict(round_.signatures)
                self._record(replica, position, signature)
                raise CollectiveMismatchError(
                    position,
                    signatures,
                    fields,
                    num_replicas=self.num_replicas,
                    report=self.report(),
                )
            round_.signatures[replica] = signature
        self._record(replica, position, signature)
        if 0 <= self._exit_bound <= position:
            raise self._exited_error(self._exited, position)
        if len(round_.signatures) < self.num_replicas:
            return position, False
        del self._rounds[position]
        for rid in round_.signatures:
            self._states[rid] = ReplicaState.RUNNING
            self._waiting_at[rid] = None
            self._next[rid] = position + 1
        return position, True

    def _record(self, replica: int, position: int, signature: Signature) -> None:
        self._states[replica] = ReplicaState.WAITING
        self._waiting_at[replica] = position
        self._history[replica].append((position, signature))

    def finish(self, replica: int) -> None:
        """Record that ``replica`` returned from its step function.

        Raises:
            ReplicaExitedError: Other replicas wait at a position this replica never
                reached; they would wait forever.
        """
        count = self._next[replica]
        self._states[replica] = ReplicaState.FINISHED
        if self._exit_bound < 0 or count < self._exit_bound:
            self._exit_bound = count
            self._exited = replica
        stuck = [p for p in self._rounds if p >= count]
        if stuck:
            raise self._exited_error(replica, min(stuck))

    def _exited_error(self, exited: int, position: int) -> ReplicaExitedError:
        history = self._history[exited]
        last = history[-1][1] if history else None
        return ReplicaExitedError(
            exited,
            position,
            dict(self._rounds[position].signatures),
            exited_count=self._next[exited],
            exited_last=last,
            report=self.report(),
        )

    def fail(self, replica: int) -> None:
        """Record that ``replica`` raised an exception."""
        self._states[replica] = ReplicaState.FAILED

    def cancel(self, replica: int) -> None:
        """Record that ``replica`` was cancelled."""
        if self._states[replica] in (ReplicaState.RUNNING, ReplicaState.WAITING):
            self._states[replica] = ReplicaState.CANCELLED

    def timeout_error(
        self, position: int, timeout: float, whereabouts: dict[int, str]
    ) -> CollectiveTimeoutError:
        """Build the error for a rendezvous at ``position`` that passed its timeout.

        Args:
            position: The position that timed out.
            timeout: The timeout that passed, in seconds.
            whereabouts: For missing replicas, where each one is now (free text
                from the runtime); replicas not in it are described from the ledger.

        Returns:
            The error, with the report attached (the caller raises it).
        """
        round_ = self._rounds.get(position)
        arrived = dict(round_.signatures) if round_ is not None else {}
        missing = {
            rid: whereabouts.get(rid, self._describe_state(rid))
            for rid in range(self.num_replicas)
            if rid not in arrived
        }
        return CollectiveTimeoutError(position, timeout, arrived, missing, report=self.report())

    def _describe_state(self, replica: int) -> str:
        state = self._states[replica]
        if state is ReplicaState.WAITING:
            at = self._waiting_at[replica]
            assert at is not None
            return f"waiting at its {ordinal(at + 1)} collective (position {at})"
        return f"{state.value} after {self._next[replica]} collective(s)"

    def report(self) -> Report:
        """Return the state of every replica now."""
        rows = []
        for rid in range(self.num_replicas):
            history = tuple(self._history[rid])
            at = self._waiting_at[rid]
            if at is not None:
                position = at
                signature: Signature | None = self._rounds[at].signatures.get(rid)
            else:
                position = self._next[rid]
                signature = history[-1][1] if history else None
            rows.append(ReplicaRow(rid, self._states[rid], position, signature, history))
        return Report(tuple(rows))
