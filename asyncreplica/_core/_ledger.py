"""The ledger: every replica's position, state and recent collectives, for one run.

Rules of this module (h11-style: they are what make the rest trustworthy):

1. Every decision about whether replicas agree is made here, from plain data, the
   moment it is certain -- never by a timeout. The runtime reports events
   (:meth:`Ledger.arrive`, :meth:`Ledger.finish`, :meth:`Ledger.fail`,
   :meth:`Ledger.cancel`) and acts on the answer; it holds no rule of its own.
2. No I/O, no event loop, no arrays, no clock. Time enters only as a number the
   caller passes (:meth:`Ledger.timeout_error`).
3. Which signature fields must agree is the table in :mod:`._match`.

Theory of operation. Each collective has a *key*: unnamed collectives match by their
index among the replica's unnamed collectives (its *position* when no names are
used), named ones by ``(name, occurrence of that name)``. An unnamed collective
issued while the same replica has another in flight is an error (its index would
depend on task scheduling); named ones may be in flight together. The first replica
to arrive at a key sets the reference signature; every later arrival is compared
with it at once, so a mismatch is raised by the first disagreeing replica. The last
arrival completes the key and the runtime dispatches it.

A replica that *finishes* after ``k`` unnamed collectives can never arrive at index
``k`` or later (likewise per name). So the moment it finishes, any replica waiting
at such a key is stuck forever (:class:`ReplicaExitedError`), and so is any replica
that arrives at such a key afterwards. Keeping the smallest ``k`` over finished
replicas makes that check O(1) per unnamed arrival.

When every replica is finished or waiting, and the runtime has seen that none of
their tasks can still issue a collective, no key can ever complete: the replicas
wait on each other in a cycle (:class:`CollectiveDeadlockError`).

Invariant (checked by the property tests): for any sequence of events, every replica
that waits at a position is either released by the position's completion or is
reported in a :class:`CollectiveError` -- never left waiting.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from .._exceptions import (
    CollectiveDeadlockError,
    CollectiveError,
    CollectiveMismatchError,
    CollectiveTimeoutError,
    ReplicaExitedError,
)
from . import _report
from ._match import differing_fields
from ._signature import CallSite, Signature

__all__ = ["Key", "Ledger", "ReplicaRow", "ReplicaState", "Report", "key_index"]

HISTORY_SIZE = 16

_V = TypeVar("_V")


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


Key = int | tuple[str, int]
"""What matches collectives across replicas: the index among a replica's unnamed
collectives, or ``(name, occurrence of that name)`` for a named one."""


def key_index(key: Key) -> int:
    """The 0-based position a key stands for (its index, or its name's occurrence)."""
    return key if isinstance(key, int) else key[1]


class _Round:
    """The replicas that have arrived at one key."""

    __slots__ = ("reference", "signatures")

    def __init__(self, replica: int, signature: Signature) -> None:
        self.reference = signature
        self.signatures = {replica: signature}


class _Replica:
    """One replica's bookkeeping."""

    __slots__ = ("inflight", "left", "names", "ring", "seq", "state", "unnamed")

    def __init__(self) -> None:
        self.state = ReplicaState.RUNNING
        # The collective it was cancelled at (it left it unfinished), for its report row.
        self.left: tuple[Key, Signature] | None = None
        self.unnamed = 0  # unnamed collectives issued
        self.names: dict[str, int] = {}  # named collectives issued, per name
        self.seq = 0  # collectives issued in all
        self.inflight: dict[Key, Signature] = {}
        # The flight recorder: collective ``s`` is at ``ring[s % HISTORY_SIZE]`` while
        # ``seq - HISTORY_SIZE <= s < seq``. One slot write per collective, no tuple per
        # entry: with many replicas, entries that live for 16 collectives are what
        # CPython's garbage collector would otherwise scan again and again.
        self.ring: list[Signature | None] = [None] * HISTORY_SIZE

    @property
    def history(self) -> tuple[tuple[int, Signature], ...]:
        """The most recent collectives as ``(position, signature)``, oldest first."""
        ring = self.ring
        entries = []
        for s in range(max(0, self.seq - HISTORY_SIZE), self.seq):
            signature = ring[s % HISTORY_SIZE]
            assert signature is not None
            entries.append((s, signature))
        return tuple(entries)

    def last(self) -> Signature | None:
        """The signature of the last collective issued, if any."""
        return self.ring[(self.seq - 1) % HISTORY_SIZE] if self.seq else None

    def count(self, key: Key) -> int:
        """How many collectives of ``key``'s kind (unnamed, or that name) were issued."""
        return self.unnamed if isinstance(key, int) else self.names.get(key[0], 0)


class Ledger:
    """Tracks one run's replicas and decides, from their events, whether they agree.

    Args:
        num_replicas: How many replicas are in sync (in this process).
        check_call_sites: Whether unnamed collectives must also agree on their call path.
        offset: The global id of replica 0 (under MPI, this process's first replica):
            every error, message and report names replicas by ``offset + local id``;
            the methods take local ids.
    """

    __slots__ = (
        "_check_call_sites",
        "_exit_bound",
        "_exited",
        "_finished",
        "_offset",
        "_replicas",
        "_rounds",
        "_settled",
        "num_replicas",
    )

    def __init__(
        self, num_replicas: int, *, check_call_sites: bool = True, offset: int = 0
    ) -> None:
        self.num_replicas = num_replicas
        self._offset = offset
        self._check_call_sites = check_call_sites
        self._replicas = [_Replica() for _ in range(num_replicas)]
        self._rounds: dict[Key, _Round] = {}
        self._finished: list[int] = []
        # How many replicas are waiting (something in flight) or finished: when all of
        # them are and nothing completes, they may be deadlocked (O(1) to ask).
        self._settled = 0
        # The smallest unnamed-collective count of a finished replica, and that replica:
        # no replica can complete an unnamed collective at or beyond it (O(1) per arrival).
        self._exit_bound = -1
        self._exited = -1

    def arrive(self, replica: int, signature: Signature) -> tuple[Key, bool]:
        """Record that ``replica`` issued a collective.

        Args:
            replica: The replica id.
            signature: The collective's signature (its ``name`` decides the matching).

        Returns:
            ``(key, complete)``: what this collective matches by, and whether this
            arrival completed it (then the caller dispatches it).

        Raises:
            CollectiveMismatchError: The signature disagrees with the first arrival's.
            ReplicaExitedError: A replica finished without reaching this collective.
            CollectiveError: An unnamed collective while the replica has another in
                flight, or a collective after the replica finished.
        """
        rep = self._replicas[replica]
        name = signature.name
        if name is None and not rep.inflight and rep.state is ReplicaState.RUNNING:
            # Fast path: an unnamed collective from a running replica with nothing in
            # flight (the common case). The same checks as below, in fewer steps.
            index = rep.unnamed
            key: Key = index
            rep.unnamed = index + 1
            self._settled += 1
            rep.state = ReplicaState.WAITING
            rep.inflight[key] = signature
            seq = rep.seq
            rep.ring[seq % HISTORY_SIZE] = signature
            rep.seq = seq + 1
            round_ = self._rounds.get(key)
            if round_ is None:
                round_ = self._rounds[key] = _Round(replica, signature)
                signatures = round_.signatures
            else:
                signatures = round_.signatures
                signatures[replica] = signature
                reference = round_.reference
                if reference is not signature and reference != signature:
                    self._check_match(key, round_, signature)
            if self._finished and 0 <= self._exit_bound <= index:
                raise self._exited_error(self._exited, key)
            if len(signatures) < self.num_replicas:
                return key, False
            self._complete(key, round_)
            return key, True
        if rep.state is not ReplicaState.RUNNING and rep.state is not ReplicaState.WAITING:
            raise CollectiveError(
                f"Replica {replica + self._offset} issued {signature.describe()} after it "
                f"{rep.state.value}.\n\n"
                "A collective belongs to the run of the replica that issues it: issue it from "
                "the step function (or a coroutine it awaits), not from a task that outlives "
                "it.\n" + _report.see_also("CollectiveError"),
                report=self.report(),
            )
        if name is None:
            if rep.inflight:
                pending_key, pending = next(iter(rep.inflight.items()))
                raise CollectiveError(
                    _report.in_flight_message(
                        replica + self._offset, signature, pending, _report.key_text(pending_key)
                    ),
                    report=self.report(),
                )
            key = rep.unnamed
            rep.unnamed += 1
        else:
            key = (name, rep.names.get(name, 0))
            rep.names[name] = key[1] + 1
        if not rep.inflight:
            self._settled += 1
        rep.state = ReplicaState.WAITING
        rep.inflight[key] = signature
        rep.ring[rep.seq % HISTORY_SIZE] = signature
        rep.seq += 1
        round_ = self._rounds.get(key)
        if round_ is None:
            round_ = self._rounds[key] = _Round(replica, signature)
        else:
            round_.signatures[replica] = signature
            self._check_match(key, round_, signature)
        if self._finished:
            exited = self._exited_before(key)
            if exited is not None:
                raise self._exited_error(exited, key)
        if len(round_.signatures) < self.num_replicas:
            return key, False
        self._complete(key, round_)
        return key, True

    def _check_match(self, key: Key, round_: _Round, signature: Signature) -> None:
        """Raise if ``signature`` disagrees with the first arrival's at ``key``."""
        fields = differing_fields(
            round_.reference, signature, check_call_sites=self._check_call_sites
        )
        if fields:
            raise CollectiveMismatchError(
                key_index(key),
                self._global(round_.signatures),
                fields,
                num_replicas=self.num_replicas,
                name=None if isinstance(key, int) else key[0],
                report=self.report(),
                first_replica=self._offset,
            )

    def _global(self, by_replica: dict[int, _V]) -> dict[int, _V]:
        """``by_replica`` (local ids) keyed by global ids."""
        offset = self._offset
        return {rid + offset: v for rid, v in by_replica.items()} if offset else dict(by_replica)

    def _complete(self, key: Key, round_: _Round) -> None:
        """Every replica arrived at ``key``: none of them waits there any more."""
        del self._rounds[key]
        replicas = self._replicas
        waiting = ReplicaState.WAITING
        running = ReplicaState.RUNNING
        settled = 0
        for rid in round_.signatures:
            other = replicas[rid]
            inflight = other.inflight
            if inflight.pop(key, None) is not None and not inflight:
                settled += 1
                if other.state is waiting:
                    other.state = running
        self._settled -= settled

    def _exited_before(self, key: Key) -> int | None:
        """A finished replica that never reached ``key``, if any."""
        if isinstance(key, int):
            return self._exited if 0 <= self._exit_bound <= key else None
        for rid in self._finished:
            if self._replicas[rid].count(key) <= key[1]:
                return rid
        return None

    def finish(self, replica: int) -> None:
        """Record that ``replica`` returned from its step function.

        Raises:
            ReplicaExitedError: Other replicas wait at a collective this replica never
                reached; they would wait forever.
        """
        rep = self._replicas[replica]
        if not rep.inflight:
            self._settled += 1
        rep.state = ReplicaState.FINISHED
        self._finished.append(replica)
        if self._exit_bound < 0 or rep.unnamed < self._exit_bound:
            self._exit_bound = rep.unnamed
            self._exited = replica
        stuck = [
            key
            for key, round_ in self._rounds.items()
            if replica not in round_.signatures and rep.count(key) <= key_index(key)
        ]
        if stuck:
            raise self._exited_error(replica, min(stuck, key=_key_order))

    def _exited_error(self, exited: int, key: Key) -> ReplicaExitedError:
        rep = self._replicas[exited]
        last = rep.last()
        return ReplicaExitedError(
            exited + self._offset,
            key_index(key),
            self._global(self._rounds[key].signatures),
            exited_count=rep.seq,
            exited_last=last,
            name=None if isinstance(key, int) else key[0],
            report=self.report(),
        )

    def abandon(self, replica: int, key: Key) -> CollectiveError | None:
        """Record that ``replica`` stopped waiting at ``key`` (its task was cancelled).

        Returns:
            The error to fail the run with when the collective was still pending (the
            other replicas would wait for ever), or None when it had completed.
        """
        round_ = self._rounds.get(key)
        rep = self._replicas[replica]
        if round_ is None or replica not in round_.signatures:
            return None
        signature = rep.inflight.pop(key, None)
        if signature is not None:
            rep.left = (key, signature)
            if not rep.inflight:
                self._settled -= 1
                if rep.state is ReplicaState.WAITING or rep.state is ReplicaState.RUNNING:
                    rep.state = ReplicaState.CANCELLED
        return self.abandoned_error(replica, key, None)

    def cancelled_after(
        self, replica: int, key: Key, *, during: str = "", also: Sequence[int] = ()
    ) -> CollectiveError:
        """The error for ``replica`` cancelled at ``key`` after that collective completed.

        Its value went into its peers' results, but the cancellation reached it before it
        took its own result: its peers and it would go on with values that disagree. The
        run fails as when the cancellation lands before the collective completes.

        ``during``: what ran when every replica had arrived and the collective had not
        completed yet ("the backend combined their values", "their merge_fn ran"): the
        cancellation came then, with the same consequence: its peers would receive results
        computed with its value (none has one yet).

        ``also``: other replicas (local ids) cancelled there in the same loop turn.
        """
        rep = self._replicas[replica]
        if rep.state is ReplicaState.WAITING or rep.state is ReplicaState.RUNNING:
            rep.state = ReplicaState.CANCELLED
        when = (
            f"after every replica had arrived there, while {during}"
            if during
            else "after that collective had completed"
        )
        if also:
            others = [r + self._offset for r in also]
            verb = "was" if len(others) == 1 else "were"
            when += f" ({_report.format_replicas(others)} {verb} cancelled there too)"
        told = (
            "its peers would receive results computed with its value, and it would never "
            "take its own"
            if during
            else "its peers received results computed with its value, and it never took its own"
        )
        return CollectiveError(
            f"Replica {replica + self._offset} was cancelled while waiting at its "
            f"{_report.key_text(key)}, {when}: {told}, so the "
            "replicas would go on with values that disagree.\n\n"
            "A collective cannot be abandoned half-way: every replica must complete it. "
            "Cancel the whole run (the scope around Strategy.run) instead of one replica's "
            "collective, or put the time limit in CommunicationOptions(timeout_seconds=...).\n"
            + _report.see_also("CollectiveError"),
            report=self.report(),
        )

    def cancelled_combining(
        self, replica: int, key: Key, waiting: Sequence[int]
    ) -> CollectiveError:
        """The error for ``replica`` cancelled while its backend call combined ``key``.

        The last replica to arrive runs the backend's combine in its own task; cancelled
        there, the combine is abandoned half-way: no replica gets a result, and the
        replicas in ``waiting`` (local ids) are woken with this error instead of waiting
        for ever.
        """
        rep = self._replicas[replica]
        if rep.state is ReplicaState.WAITING or rep.state is ReplicaState.RUNNING:
            rep.state = ReplicaState.CANCELLED
        last = rep.last()
        if last is not None:
            rep.left = (key, last)  # the report shows it cancelled there
        others = [r + self._offset for r in waiting if r != replica]
        told = (
            f"; {_report.format_replicas(others)} "
            f"{'waits' if len(others) == 1 else 'wait'} there and get{'s' if len(others) == 1 else ''} "
            "this error"
            if others
            else ""
        )
        return CollectiveError(
            f"Replica {replica + self._offset} was cancelled while the backend combined its "
            f"{_report.key_text(key)} (it arrived last, and the combine runs in its task): "
            f"the collective can never complete{told}.\n\n"
            "A collective cannot be abandoned half-way: every replica must complete it. "
            "Cancel the whole run (the scope around Strategy.run) instead of one replica's "
            "collective, or put the time limit in CommunicationOptions(timeout_seconds=...).\n"
            + _report.see_also("CollectiveError"),
            report=self.report(),
        )

    def _left_at(self, replica: int, key: Key) -> bool:
        """Whether ``replica`` was cancelled while waiting at ``key`` (see :meth:`abandon`)."""
        rep = self._replicas[replica]
        left = rep.left
        return rep.state is ReplicaState.CANCELLED and left is not None and left[0] == key

    def abandoned_error(self, replica: int, key: Key, taken: Report | None) -> CollectiveError:
        """The error for ``replica`` cancelled while waiting at ``key`` (see :meth:`abandon`).

        Args:
            replica: The replica that was cancelled there.
            key: The collective.
            taken: The report taken when the run failed (its rows are kept, except those
                of replicas waiting at ``key`` then and cancelled since), or None: now.
        """
        round_ = self._rounds.get(key)
        participants = [] if round_ is None else list(round_.signatures)
        waiting = []
        cancelled = []
        for r in participants:
            if r == replica:
                continue
            if self._left_at(r, key):
                cancelled.append(r + self._offset)
            elif key in self._replicas[r].inflight:
                waiting.append(r + self._offset)
        parts = []
        if cancelled:
            verb = "was" if len(cancelled) == 1 else "were"
            parts.append(f"{_report.format_replicas(cancelled)} {verb} cancelled there too")
        if waiting:
            verb = "waits" if len(waiting) == 1 else "wait"
            parts.append(f"{_report.format_replicas(waiting)} {verb} there")
        if not parts:
            parts.append("no other replica has arrived yet")
        now = self.report()
        if taken is None:
            report = now
        else:
            index = key_index(key)
            rows = []
            for r, (old, new) in enumerate(zip(taken.rows, now.rows, strict=True)):
                moved = old.state is ReplicaState.WAITING and old.position == index
                rows.append(new if moved and self._left_at(r, key) else old)
            report = Report(tuple(rows))
        where = _report.key_text(key)
        return CollectiveError(
            f"Replica {replica + self._offset} was cancelled while waiting at its {where}; "
            f"{' and '.join(parts)}: the collective can never complete.\n\n"
            "A collective cannot be abandoned half-way: every replica must complete it. "
            "Cancel the whole run (the scope around Strategy.run) instead of one replica's "
            "collective, or put the time limit in CommunicationOptions(timeout_seconds=...).\n"
            + _report.see_also("CollectiveError"),
            report=report,
        )

    def fail(self, replica: int) -> None:
        """Record that ``replica`` raised an exception."""
        self._replicas[replica].state = ReplicaState.FAILED

    def cancel(self, replica: int) -> None:
        """Record that ``replica`` was cancelled."""
        rep = self._replicas[replica]
        if rep.state in (ReplicaState.RUNNING, ReplicaState.WAITING):
            rep.state = ReplicaState.CANCELLED

    def last_signature(self, replica: int) -> Signature | None:
        """The signature of the last collective ``replica`` (a local id) issued, if any."""
        return self._replicas[replica].last()

    def all_waiting(self) -> bool:
        """Whether every replica is finished or has a collective in flight (and some wait).

        Only then can replicas be deadlocked; the runtime checks whether their tasks
        can still issue anything before calling :meth:`deadlock_error`.
        """
        return self._settled == self.num_replicas and bool(self._rounds)

    def deadlock_error(self) -> CollectiveDeadlockError:
        """Build the error for replicas that wait on each other in a cycle.

        Call it only when no replica can issue another collective (every replica is
        finished or blocked on its collectives in flight) and none can complete.
        """
        waits: dict[int, tuple[Key, Signature, tuple[int, ...]]] = {}
        for rid, rep in enumerate(self._replicas):
            for key, sig in rep.inflight.items():
                round_ = self._rounds[key]
                missing = tuple(r for r in range(self.num_replicas) if r not in round_.signatures)
                waits[rid] = (key, sig, missing)
                break
        # Follow "waits for" edges from the lowest waiting replica until one repeats.
        cycle: list[int] = []
        rid = min(waits)
        while rid not in cycle and rid in waits:
            cycle.append(rid)
            rid = waits[rid][2][0]
        if rid in cycle:
            cycle = cycle[cycle.index(rid) :]
        off = self._offset
        edges = tuple(
            (
                r + off,
                _report.key_text(waits[r][0]),
                waits[r][1],
                tuple(m + off for m in waits[r][2]),
            )
            for r in cycle
        )
        keys = tuple(waits[r][0] for r in cycle)
        return CollectiveDeadlockError(edges, keys=keys, report=self.report())

    def timeout_error(
        self, key: Key, timeout: float, whereabouts: dict[int, str]
    ) -> CollectiveTimeoutError:
        """Build the error for a rendezvous at ``key`` that passed its timeout.

        Args:
            key: The collective that timed out.
            timeout: The timeout that passed, in seconds.
            whereabouts: For missing replicas, where each one is now (free text
                from the runtime); replicas not in it are described from the ledger.

        Returns:
            The error, with the report attached (the caller raises it).
        """
        arrived, missing = self._roll_call(key, whereabouts)
        return CollectiveTimeoutError(
            key_index(key),
            timeout,
            arrived,
            missing,
            where=_report.key_text(key),
            report=self.report(),
        )

    def stall_message(self, key: Key, waited: float, whereabouts: dict[int, str]) -> str:
        """The text of a stall warning for the rendezvous at ``key`` (see timeout_error)."""
        arrived, missing = self._roll_call(key, whereabouts)
        return _report.stall_message(_report.key_text(key), waited, arrived, missing)

    def _roll_call(
        self, key: Key, whereabouts: dict[int, str]
    ) -> tuple[dict[int, Signature], dict[int, str]]:
        """Who arrived at ``key`` (their signatures) and where the others are.

        ``whereabouts`` is keyed by local ids; the result by global ids.
        """
        round_ = self._rounds.get(key)
        arrived = dict(round_.signatures) if round_ is not None else {}
        missing = {
            rid: whereabouts.get(rid, self._describe_state(rid))
            for rid in range(self.num_replicas)
            if rid not in arrived
        }
        return self._global(arrived), self._global(missing)

    def pending(self, key: Key) -> bool:
        """Whether the collective at ``key`` is still waiting for replicas."""
        return key in self._rounds

    def missing(self, key: Key) -> list[int]:
        """The replicas that have not arrived at ``key``."""
        round_ = self._rounds.get(key)
        arrived = round_.signatures if round_ is not None else {}
        return [r for r in range(self.num_replicas) if r not in arrived]

    def _describe_state(self, replica: int) -> str:
        rep = self._replicas[replica]
        if rep.inflight:
            where = ", ".join(_report.key_text(k) for k in rep.inflight)
            return f"waiting at its {where}"
        return f"{rep.state.value} after {rep.seq} collective{'' if rep.seq == 1 else 's'}"

    def report(self) -> Report:
        """Return the state of every replica now."""
        rows = []
        for rid, rep in enumerate(self._replicas):
            history = rep.history
            signature: Signature | None
            left = rep.left
            if rep.inflight:
                key, signature = next(iter(rep.inflight.items()))
                position = key_index(key)
            elif left is not None and rep.state is ReplicaState.CANCELLED:
                position = key_index(left[0])  # where it was cancelled
                signature = left[1]
            else:
                position = rep.seq
                signature = rep.last()
            rows.append(ReplicaRow(rid + self._offset, rep.state, position, signature, history))
        return Report(tuple(rows))


def _key_order(key: Key) -> tuple[int, str]:
    return (key, "") if isinstance(key, int) else (key[1], key[0])
