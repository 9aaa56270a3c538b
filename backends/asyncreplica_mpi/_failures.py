"""How a process group fails: refused lifecycle events and the cross-process errors.

Split from :mod:`._group`. Every process that sees an exchange's details differ (a
mismatch, a peer that finished, failed or exited, a deadlock of named collectives)
builds the same error from them here, with the same attributes (global replica ids);
the details themselves are exchanged here, after the headers differ; the refusals
of the lifecycle table (:mod:`._lifecycle`) are raised at one place; and a
failure after an agreement or a timeout is told to the peers with a note, which they
raise as the failing process's error. :class:`Failures` is the base of
:class:`~asyncreplica_mpi.MPIProcessGroup`, which sets every attribute declared here.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import threading
from collections.abc import Generator, Hashable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np

from asyncreplica import (
    BackendError,
    CollectiveDeadlockError,
    CollectiveError,
    CollectiveMismatchError,
    CollectiveTimeoutError,
    ReplicaContextError,
    ReplicaExitedError,
)
from asyncreplica.abc import CollectiveKind, Signature

from ._arrival import interrupt_count
from ._lifecycle import Event, Refusal, State, advance
from ._protocol import (
    HEADER_WORDS,
    MAGIC,
    REFUSALS,
    Status,
    _leaf_exceptions,
    collective_error,
    components_error,
    describe_exception,
    differing_fields,
    error_fields,
    first_refusal,
    from_wire,
    issued_before,
    key_text,
    outcome_message,
    rebuild_signature,
    refusal_wins,
    timeout_fields,
    to_wire,
)

__all__ = ["Failures"]


def _exchange_text(pending: tuple[Hashable, dict[str, Any]] | None) -> str:
    """``the 2nd collective (position 1): all_reduce(SUM) on float64[3] at f.py:9 in g``."""
    if pending is None:
        return "their exchange"
    position, detail = pending
    describe = detail.get("describe")
    if describe is None:
        return "the end of their run"
    where = f" at {detail['site']}" if detail.get("site") else ""
    if position is None:  # outside a run: the detail names itself ("the end of ...")
        return (
            describe
            if describe.startswith(("a ", "an ", "the "))
            else f"a cross-replica {describe}"
        )
    return f"the {key_text(position)}: {describe}{where}"


def describe_failure(error: BaseException) -> str:
    """:func:`describe_exception` for the peers, naming an interruption (Ctrl-C) as such.

    Under asyncio's runner (``asyncio.run``, ``anyio.run``) SIGINT cancels the main task:
    the run ends with a ``CancelledError`` that says nothing of the interruption, and
    the peers would read that this process "failed: CancelledError".
    """
    if isinstance(error, KeyboardInterrupt) or (_cancellation(error) and _interrupted()):
        return "KeyboardInterrupt: the process was interrupted (SIGINT, Ctrl-C)"
    return describe_exception(error)


def _cancellation(error: BaseException) -> bool:
    """Whether ``error`` is a cancellation (or a group of nothing else)."""
    if isinstance(error, BaseExceptionGroup):
        return error.split(asyncio.CancelledError)[1] is None
    return isinstance(error, asyncio.CancelledError)


def _interrupted() -> bool:
    """Whether asyncio's runner got SIGINT (see :func:`._arrival.interrupt_count`)."""
    return interrupt_count() > 0


def _ordinal(n: int) -> str:
    """``1st``, ``2nd``, ``11th``."""
    tail = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{tail}"


def _cycle(details: list[dict[str, Any]]) -> CollectiveDeadlockError | None:
    """The deadlock of processes that wait at different collectives, one named.

    Named collectives match by name, so in one process replicas that await them in
    different orders wait for each other in a cycle (``CollectiveDeadlockError``).
    Across processes each process's replicas wait at the collective of this exchange,
    which the others have not issued: the same cycle, built as the one-process ledger
    builds it (from the lowest waiting replica, each waiting for the first replica
    that has not issued its collective), so every process raises the same error.
    None when every process waits at the same collective (a mismatch of its fields), or
    when a process has another collective queued behind this exchange: its replicas
    issued them concurrently, in another order than a peer's (a mismatch of the name,
    the documented limit of named collectives across processes).
    """
    waits: dict[int, tuple[int | tuple[str, int], Signature, tuple[int, ...]]] = {}
    keys: list[int | tuple[str, int]] = []
    spans: list[range] = []
    for d in details:
        raw = d.get("key")
        if Status(d["status"]) is not Status.COLLECTIVE or not d["fields"] or raw is None:
            return None
        if d.get("queued"):
            return None
        key: int | tuple[str, int] = (str(raw[0]), int(raw[1])) if isinstance(raw, list) else raw
        first, count = d["replicas"]
        keys.append(key)
        spans.append(range(first, first + count))
    if len(set(keys)) < 2 or all(isinstance(k, int) for k in keys):
        return None
    for d, key, span in zip(details, keys, spans, strict=True):
        signature = rebuild_signature(d["fields"], d.get("site"))
        missing = tuple(r for s, k in zip(spans, keys, strict=True) if k != key for r in s)
        for replica in span:
            waits[replica] = (key, signature, missing)
    cycle: list[int] = []
    rid = min(waits)
    while rid not in cycle and rid in waits:
        cycle.append(rid)
        rid = waits[rid][2][0]
    cycle = cycle[cycle.index(rid) :]
    edges = tuple((r, key_text(waits[r][0]), waits[r][1], waits[r][2]) for r in cycle)
    return CollectiveDeadlockError(edges, keys=tuple(waits[r][0] for r in cycle))


def _consequence() -> None:
    """The current task raises the run's error again: mark it retrieved once it ends.

    Strategy.run already raised that error; a replica's helper task that nobody awaits
    any more must not log "Task exception was never retrieved" for it.
    """
    task = asyncio.current_task() if asyncio._get_running_loop() is not None else None
    if task is not None:
        task.add_done_callback(_retrieve)


def _retrieve(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


def _this_process(rank: int, size: int) -> str:
    """``(This is process 0 of 2.)``: in a timeout's message, replaced where a peer raises it."""
    return f"(This is process {rank} of {size}.)"


IN_STEP = "_ar_in_step"


def in_step(error: BaseException) -> bool:
    """Whether ``error`` was raised alike on every process after the data moved.

    The backend marks such an error (numpy's ``FloatingPointError`` under the user's
    ``np.seterr``, computed from the same bits everywhere): nothing waits for this
    process's data, so the processes stay in step and each raises it.
    """
    # The instance's own __dict__, never getattr: a user's exception whose __getattr__
    # raises (a dict-backed one's KeyError) must stay the user's error (as
    # asyncreplica._exceptions.own_mark reads the runtime's marks).
    try:
        return object.__getattribute__(error, "__dict__").get(IN_STEP) is True
    except Exception:
        return False


class Failures:
    """The failure half of :class:`~asyncreplica_mpi.MPIProcessGroup` (its base).

    The attributes below are set by the group's constructor (see there).
    """

    rank: int
    size: int
    offsets: tuple[int, ...]
    replica_counts: tuple[int, ...]
    num_replicas: int
    check_call_sites: bool
    current: Signature | None
    _state: State
    _base_serial: int
    _limit: float | None
    _pending: tuple[Hashable, dict[str, Any]] | None
    _broken: str | None
    _departed: list[int]
    _failed_here: bool
    _peer_failure: dict[str, Any] | None
    _peer_error: CollectiveError | None  # the error built for it (see _raise_peer_failure)
    _stopped: ReplicaExitedError | None  # see _stop_run
    _run_ended: bool
    _running: bool
    _run_thread: threading.Thread | None  # where the run in progress began
    _owed_refusals: int
    _ended: list[dict[str, Any]] | None
    _ended_error: BaseException | None
    _MPI: Any
    _ctl: Any
    _heads: np.ndarray[Any, Any]
    _call_name: str  # the strategy call entered last (see call_begins)
    _number: int  # exchanges so far
    offset: int
    _waiters: collections.deque[Any]
    _partial: dict[int, tuple[int, Any, list[int]]]

    if TYPE_CHECKING:

        def _tell_peers(self, note: dict[str, Any]) -> None: ...  # see _waiting
        def _read_notes(self) -> None: ...  # see _waiting
        def _missing(self, exchange: int | None) -> list[int]: ...  # see _waiting
        def _absent_text(self, rank: int) -> str: ...  # see _waiting

    def _to(self, event: Event) -> None:
        """Move to the state after ``event`` (see :data:`._lifecycle.TABLE`), or refuse."""
        after = advance(self._state, event)
        if isinstance(after, Refusal):
            self._refuse(after)
        self._state = after

    def _refuse(self, refusal: Refusal) -> NoReturn:
        """The one raise site of every refused lifecycle event."""
        if refusal is Refusal.CONCURRENT_RUN:
            # The refusal is local, and on another process the same two runs may not
            # overlap: this process owes the others one exchange for the refused run,
            # made at the end of the run in progress (see end_run), so that every
            # process stays in step whichever runs it refused.
            self._owed_refusals += 1
            raise ReplicaContextError(
                "Another MultiWorkerMirroredStrategy.run of this strategy is still in "
                f"progress on process {self.rank}: one strategy runs one step at a time "
                "across processes (two concurrent runs would interleave their "
                "collectives in a different order on each process).\n\nAwait each run "
                "before starting the next (no asyncio.gather / task group of runs of one "
                "MultiWorkerMirroredStrategy), or issue both steps' collectives from one "
                "step function."
            )
        if refusal is Refusal.FAILED:
            self._check_usable()
        if refusal is Refusal.MERGE_IN_RUN:
            raise ReplicaContextError(
                "strategy.trace(...) ended inside a run of the same strategy: the merge "
                "of every process's timeline is collective, so it must be reached "
                "outside Strategy.run (leave the `with` block after the run returns)."
            )
        what = {
            Refusal.CLOSED: "was closed (this process is exiting)",
            Refusal.FINALIZED: (
                "cannot be used any more: MPI was finalized on this process (MPI.Finalize()); "
                "every strategy said goodbye to the other processes then"
            ),
            Refusal.NOT_JOINED: "is still being created",
            Refusal.FAILED: "failed",
        }[refusal]
        raise BackendError(f"This MultiWorkerMirroredStrategy {what} (process {self.rank}).")

    def _break(self, reason: str) -> None:
        """The processes are out of step on this group (the first reason is kept)."""
        if self._broken is None:
            self._broken = reason
        self._to(Event.OUT_OF_STEP)

    def label(self) -> str:
        """``MultiWorkerMirroredStrategy #2``: this group by creation order (for messages)."""
        return f"MultiWorkerMirroredStrategy #{self._base_serial + 1}"

    def _process(self, rank: int) -> str:
        """``process 1 (replicas 2, 3)``."""
        first, count = self.offsets[rank], self.replica_counts[rank]
        ids = (
            ", ".join(str(i) for i in range(first, first + count))
            if count <= 2
            else (f"{first}-{first + count - 1}")
        )
        return f"process {rank} (replica{'' if count == 1 else 's'} {ids or 'none'})"

    def _waiting_what(self) -> str:
        return _exchange_text(self._pending)

    def _details(
        self, status: Status, fields: dict[str, Any] | None, detail: dict[str, Any]
    ) -> Generator[Any, None, list[dict[str, Any]]]:
        """After headers differ: every process's JSON detail, in rank order (two rounds)."""
        MPI = self._MPI
        if (self._heads[:, 0] != MAGIC).any():
            self._break("a peer sent a malformed header")
            raise BackendError(
                "asyncreplica received a malformed message from another process: the "
                "processes' communicators are out of step. Restart the job."
            )
        numbers = self._heads[:, HEADER_WORDS - 1]
        if (numbers != numbers[0]).any():
            # Every process sees the same headers, so every one raises this, at once:
            # pairing exchanges of different numbers would report a false disagreement.
            self._break("they made different numbers of exchanges")
            made = ", ".join(f"process {r}: {int(n)}" for r, n in enumerate(numbers))
            raise BackendError(
                "The processes of this MultiWorkerMirroredStrategy are out of step: they "
                f"made different numbers of exchanges before this one ({made}), so "
                "their collectives can no longer be matched. This is a bug in asyncreplica "
                "or a process that used the strategy's communicators directly; restart the "
                "job (the exit hook ends it)."
            )
        detail = {
            **detail,
            "rank": self.rank,
            "replicas": [self.offset, self.replica_counts[self.rank]],
            "status": int(status),
            "fields": fields or {},
            # Another collective of this process waits for this exchange (issued
            # concurrently): processes at different named collectives then differ in
            # order, not in a cycle (see _cycle).
            "queued": bool(self._waiters),
            # The strategy call this exchange belongs to (its header's count; see
            # call_begins), and that call's name.
            "call": [int(self._heads[self.rank, HEADER_WORDS - 2]), self._call_name],
        }
        payload = to_wire(json.dumps(detail))
        lengths = np.empty(self.size, np.int64)
        yield self._ctl.Iallgather(np.array([payload.size], np.int64), lengths)
        counts = [int(n) for n in lengths]
        displs = [sum(counts[:r]) for r in range(self.size)]
        buf = np.empty(sum(counts), np.uint8)
        yield self._ctl.Iallgatherv(payload, [buf, counts, displs, MPI.BYTE])
        return [json.loads(from_wire(buf[d : d + n])) for d, n in zip(displs, counts, strict=True)]

    def _check_usable(self) -> None:
        if self._departed:
            ranks = ", ".join(map(str, self._departed))
            raise ReplicaExitedError(
                self.offsets[self._departed[0]],
                0,
                {},
                exited_count=0,
                exited_last=None,
                message=(
                    f"Process {ranks} of this MultiWorkerMirroredStrategy has exited, so no "
                    "collective can complete any more (this is process "
                    f"{self.rank} of {self.size}).\n\nEvery process must run the same "
                    "collectives; see the earlier error for where they diverged."
                ),
            )
        if self._broken is not None:
            raise BackendError(
                f"The processes of this MultiWorkerMirroredStrategy are out of step "
                f"({self._broken}); no further collective can be matched. Restart the job."
            )

    def _raise_peer_failure(self, failure: dict[str, Any]) -> NoReturn:
        """Raise a peer's failure, told by its note: the same error object at every call.

        A collective's wait and the run's watch (:meth:`watch_peers`) may both read it:
        the run records one root cause. The first call tells the peers that this process
        read it (a ``"told"`` note: the failed process then knows that this one's event
        loop runs, see ``_exit.settle_failure``).
        """
        error = self._peer_error
        if error is None:
            error = self._peer_error = self._peer_failure_error(failure)
            with contextlib.suppress(Exception):  # best effort: it only names a state
                self._tell_peers({"kind": "told"})
        raise error

    def _peer_failure_error(self, failure: dict[str, Any]) -> CollectiveError:
        """The error for a peer's failure note; the processes are out of step from here."""
        rank = int(failure["rank"])
        timeout = failure.get("timeout")
        self._break(
            f"process {rank} timed out waiting for the others"
            if timeout is not None
            else f"process {rank} left an exchange it had posted"
            if failure.get("stage") == "exchange"
            else f"process {rank} failed after the processes agreed on a collective"
        )
        self._run_ended = True
        timed_out = failure.get("timeout_error")
        if timeout is not None and isinstance(timed_out, dict):
            # The peer's own CollectiveTimeoutError, with its fields (global ids): one
            # process raises it for the run, so every process does, whether its replicas
            # waited at that collective, at none (idle), or were busy elsewhere.
            return self._told_timeout(rank, timed_out)
        what = failure.get("what") or "a collective"
        first = (
            f"Process {rank} failed while moving the data of {what}, after every process "
            "had agreed on it, so this collective cannot complete on any process."
        )
        if failure.get("stage") == "exchange":
            first = (
                f"Process {rank} stopped waiting for the other processes at {what} (it "
                "had posted its part of that exchange), so no collective can complete on "
                "any process any more."
            )
        if failure.get("exited"):  # it exited with a run in progress in another thread
            first = (
                f"Process {rank} {failure.get('error')}, so no collective can complete "
                "on any process any more."
            )
        elif timeout is not None:
            first = (
                f"Process {rank} timed out after {timeout:g} s waiting for the other "
                f"processes at {what}, so no collective can complete on any process any more."
            )
        lines = [
            first,
            "",
            f"  * {self._process(rank)} failed: {failure.get('error') or 'an exception'}",
        ]
        exchange = failure.get("stage") == "exchange"
        for r in range(self.size):
            if r != rank and timeout is None:
                lines.append(
                    f"  * {self._process(r)} waited for {'it' if exchange else 'its data'}"
                )
        if timeout is not None:
            why = (
                "A process that times out leaves the processes out of step: the job cannot "
                "continue (the exit hook ends the MPI job)."
            )
        elif exchange:
            why = (
                "A process that leaves an exchange it has posted leaves the processes out of "
                "step: the job cannot continue (the exit hook ends the MPI job)."
            )
        else:
            why = (
                "A process that fails after an agreement leaves the others inside the data "
                "transfer: the processes are now out of step and the job cannot continue "
                "(the exit hook ends the MPI job)."
            )
        lines += [
            "",
            why,
            "Look at the failing process's own error (it is raised there, with its traceback).",
        ]
        current = self.current
        failed = range(self.offsets[rank], self.offsets[rank] + self.replica_counts[rank])
        waiting = (
            {g: current for g in range(self.num_replicas) if g not in failed}
            if current is not None
            else {}
        )
        return ReplicaExitedError(
            self.offsets[rank],
            int(failure.get("position", 0) or 0),
            waiting,
            exited_count=0,
            exited_last=None,
            name=failure.get("name"),
            message="\n".join(lines),
        )

    def _told_timeout(self, rank: int, fields: dict[str, Any]) -> CollectiveTimeoutError:
        """Process ``rank``'s timeout (its note's ``fields``), as this process raises it.

        The same class, ``position``, ``timeout``, ``arrived`` and ``missing`` as the
        peer's error; its message too, saying which process timed out.
        """
        placeholder = self.current or Signature(CollectiveKind.BARRIER)
        message = str(fields.get("message") or "").replace(
            _this_process(rank, self.size),
            f"(Process {rank} timed out and told this process, process {self.rank} of "
            f"{self.size}.)",
        )
        return CollectiveTimeoutError(
            int(fields.get("position", 0)),
            float(fields.get("timeout", 0.0)),
            dict.fromkeys((int(r) for r in fields.get("arrived", ())), placeholder),
            dict.fromkeys((int(r) for r in fields.get("missing", ())), ""),
            message=message or None,
        )

    def _stop_run(self, ending: dict[str, Any]) -> ReplicaExitedError:
        """A peer waits at this process's next exchange with a failed run's end, or exits.

        Told by its ``"ending"`` note (see ``_waiting.Waiting.watch_peers``) while no
        replica of this process is at a collective: the run cannot complete. The error
        returned fails the run (its replicas are cancelled, as one process cancels the
        other replicas of a failed run); no collective exchange may be posted in this run
        any more (see ``_start``); the run's end then makes the exchange the peer waits
        at, saying so (``"stopped"``), and raises what every process raises for it (see
        ``_end_run``), so that the processes stay in step. This error is raised itself
        only where that exchange cannot be made.
        """
        rank = int(ending["rank"])
        what = "exited" if Status(int(ending["status"])) is Status.EXITED else "failed"
        error = ReplicaExitedError(
            self.offsets[rank],
            0,
            {},
            exited_count=0,
            exited_last=None,
            message=(
                f"Process {rank} {what} while no replica of this process was at a collective "
                f"(this is process {self.rank} of {self.size}), so this run cannot complete "
                "on any process: its replicas were cancelled.\n\nLook at the failing "
                "process's own error (it is raised there, with its traceback)."
            ),
        )
        self._stopped = error
        self._ended = []  # this run posts no collective exchange any more (see _start)
        self._ended_error = error
        return error

    def failed_after_agreement(self, error: BaseException) -> None:
        """This process failed after an agreement: tell the peers, who wait for its data.

        The processes are out of step from here on: no further exchange is made (the
        run's end is not told with one), and the exit hook ends the job once every
        peer has reported the failure.
        """
        if in_step(error):  # raised alike everywhere: the processes stay in step
            return
        self.abandoned_by(error, "this process failed after the processes agreed on a collective")

    def abandoned_by(self, error: BaseException | str, reason: str, *, stage: str = "data") -> None:
        """This process left an exchange or data transfer it had posted: out of step.

        ``reason`` is why (see :meth:`_break`); ``stage`` what it left: ``"data"``, the
        data transfer after an agreement, or ``"exchange"``, the agreement itself (an
        interruption, Ctrl-C, while it waited there or just after it posted its part).
        Unless the peers know already (this process told them, or a peer's failure is
        the cause), they are told ``error``, so that they raise ReplicaExitedError
        naming it at once instead of being ended by this process's exit hook without a
        word.
        """
        self._break(reason)
        if self.size == 1 or self._failed_here or self._peer_failure is not None:
            return
        self._failed_here = True
        self._run_ended = True
        self._tell_peers({**self._failure_note(error), "stage": stage})

    def _failure_note(self, error: BaseException | str) -> dict[str, Any]:
        """The note that tells the peers this process failed at its pending exchange.

        ``error``: the exception, or its description (an uncaught one, at exit).
        """
        position = None if self._pending is None else self._pending[0]
        if error == "KeyboardInterrupt":  # an uncaught Ctrl-C, described at exit
            error = KeyboardInterrupt()
        return {
            "kind": "failed",
            "error": error if isinstance(error, str) else describe_failure(error),
            "what": _exchange_text(self._pending),
            "position": position
            if isinstance(position, int)
            else (position[1] if isinstance(position, tuple) else 0),
            "name": position[0] if isinstance(position, tuple) else None,
        }

    def _timed_out(
        self, position: Hashable, fields: dict[str, Any] | None, *, data: bool = False
    ) -> NoReturn:
        """An exchange (or, with ``data``, the data transfer after one) timed out: raise.

        The peers that still wait (they may have started waiting a little later, or
        wait elsewhere) raise at once, with this cause, instead of being ended by this
        process's exit hook before they can report anything.
        """
        if position is not None and fields is not None:
            fields = {**fields, "position": key_text(position)}
        self._break("a cross-process exchange timed out")
        if data:
            what = f" for {self._waiting_what()}"
            first = "The other processes did not all send their data"
        else:
            what = "" if fields is None else f" at their {fields['position']}"
            first = "The other processes did not all reach the same point"
        after = (
            f"{_this_process(self.rank, self.size)} A process that is alive but "
            "busy (I/O, a long computation) or stuck delays every other one. The processes "
            "are now out of step: the job cannot continue."
        )
        error = CollectiveTimeoutError(
            0,
            float(self._limit or 0),
            {},
            {},
            message=f"{first}{what} within {self._limit:g} s. {after}",
        )
        if not data and fields is not None:
            # The roll call one process gives: which replicas (global ids) arrived and
            # which did not, by the peers' announcements that they wait here.
            error = self._timeout_roll_call(position, fields, after) or error
        self._failed_here = True
        # Its fields travel with the note: the peers raise this error (see _told_timeout).
        timed_out = {
            "position": error.position,
            "timeout": error.timeout,
            "arrived": sorted(error.arrived),
            "missing": sorted(error.missing),
            "message": str(error),
        }
        self._tell_peers(
            {**self._failure_note(error), "timeout": self._limit, "timeout_error": timed_out}
        )
        raise error from None

    def _raise_out_of_step(self, details: list[dict[str, Any]]) -> None:
        """Raise, alike on every process, where the processes are at different calls.

        Each exchange carries the count of the strategy's calls (``run``, the
        cross-replica operations) its process entered (see ``call_begins``). Where the
        counts differ, a process raised before its part of a call the others made (an
        error it alone found, which the program caught): pairing its next call with the
        others' would combine values of different calls, a silently wrong result. Every
        process raises ``CollectiveMismatchError`` naming each process's call instead.
        A failed or exiting process is told by the usual report.
        """
        calls: list[list[Any]] = [d.get("call") or [] for d in details]
        if any(not c for c in calls) or len({int(c[0]) for c in calls}) < 2:
            return
        if any(Status(d["status"]) not in (Status.COLLECTIVE, Status.FINISHED) for d in details):
            return  # a failed or exiting process: its own report tells
        head = (
            "The processes are out of step: they are at different calls of this "
            "MultiWorkerMirroredStrategy, so their values cannot be combined."
        )
        why = (
            "A process raised before taking part in a call that the other processes made "
            "(an error only it found, in its arguments or values, caught by the program), "
            "so its next call would be paired with the others' current one. Every process "
            "raises this error instead of combining values of different calls."
        )
        fix = (
            "Do not catch and go on after an error raised on some processes only, or make "
            "every process make the same calls (the process's own earlier error says "
            "which call it refused)."
        )
        lines = [head, ""]
        for d, (number, name) in zip(details, calls, strict=True):
            lines.append(
                f"  * {self._process(int(d['rank']))} is at its {_ordinal(int(number))} call "
                f"({name or 'a call'})"
            )
        lines += ["", why, fix]
        raise CollectiveMismatchError(
            0, {}, ["call"], num_replicas=self.num_replicas, message="\n".join(lines)
        )

    def _timeout_roll_call(
        self, position: Hashable, fields: dict[str, Any], after: str
    ) -> CollectiveTimeoutError | None:
        """The timeout of an exchange as one process raises it, or None if unknown.

        Its ``arrived`` and ``missing`` are global replica ids: this process's replicas
        and those of the peers that announced they wait at this exchange arrived; the
        other processes' replicas did not. Its message has the same roll call, then
        ``after`` (what the timeout means across processes).
        """
        with contextlib.suppress(Exception):  # a peer's failure: its own error tells
            self._read_notes()  # the peers' latest announcements
        missing_ranks = self._missing(self._number - 1)
        signature = self.current
        if signature is None:
            signature = rebuild_signature(fields, (self._pending or (None, {}))[1].get("site"))
        arrived: dict[int, Signature] = {}
        missing: dict[int, str] = {}
        key: Any = position
        if isinstance(position, tuple):
            key = list(position)
        for rank in range(self.size):
            first, count = self.offsets[rank], self.replica_counts[rank]
            # A peer some of whose replicas wait at this collective while another of its
            # replicas keeps it from crossing (its "arrived" note, see _tell_arrival).
            partial = self._partial.get(rank)
            there: list[int] = []
            if partial is not None and partial[0] == self._number - 1 and partial[1] == key:
                there = partial[2]
            for replica in range(first, first + count):
                if rank not in missing_ranks or replica in there:
                    arrived[replica] = signature
                elif there:
                    missing[replica] = (
                        f"it is elsewhere on process {rank}, whose "
                        f"replica{'' if len(there) == 1 else 's'} {', '.join(map(str, there))} "
                        f"wait{'s' if len(there) == 1 else ''} at this collective"
                    )
                else:
                    missing[replica] = self._absent_text(rank)
        if not missing:
            return None
        if type(position) is int:
            at, where = position, None
        elif position is None:
            at, where = 0, str(fields.get("position"))
        else:
            at, where = 0, key_text(position)
        text = str(
            CollectiveTimeoutError(at, float(self._limit or 0), arrived, missing, where=where)
        )
        lines = text.split("\n")
        lines[-1:-1] = [after]  # before the last line (`asyncreplica explain`)
        return CollectiveTimeoutError(
            at, float(self._limit or 0), arrived, missing, message="\n".join(lines)
        )

    def _raise_for(self, details: list[dict[str, Any]]) -> NoReturn:
        """Raise the error every process raises for these (non-unanimous) details.

        The error that ends a run is remembered: a collective queued behind the
        exchange raises the same object again (see :meth:`_start`).
        """
        try:
            self._raise_new(details)
        except BaseException as error:
            if self._ended is details and self._running:
                self._ended_error = error
            raise

    def _raise_new(self, details: list[dict[str, Any]]) -> NoReturn:
        """Raise the error every process raises for these (non-unanimous) details.

        Its attributes agree with its message: global replica ids (every replica of a
        process that reached the collective, with that process's signature), and the
        position and name of the collective the processes wait at.
        """
        self._raise_out_of_step(details)
        refused = first_refusal(details)
        lost = refused is not None and not refusal_wins(details, refused)
        before: list[Mapping[str, Any]] = []
        if lost:
            assert refused is not None
            before = issued_before(details, refused)
            refused = None  # an error found before it, in replica order
        if refused is not None and refused.get("components"):
            # Strategy.reduce's components differ inside a process: one process's own
            # check of every replica's component, raised alike everywhere.
            found = components_error(details)
            if found is not None:
                raise found
        if refused is not None:
            name, text, *rest = refused["refused"]
            what = rest[1] if len(rest) > 1 else "cross-replica operation"
            message = (
                f"{text}\n\n({self._process(int(refused['rank']))} refused this "
                f"{what}, so every process raises this error.)"
            )
            if name == "CollectiveMismatchError" and refused.get("refused_error"):
                # Strategy.gather's components differ inside one process: its error's
                # signatures, completed by the other processes' replicas (one rule).
                raise self._global_error(refused["refused_error"], details, message)
            if name == "CollectiveMismatchError":
                fields = [str(f) for f in rest[0]] if rest else []
                raise CollectiveMismatchError(
                    0, {}, fields, num_replicas=self.num_replicas, message=message
                )
            raise REFUSALS.get(name, ValueError)(message)
        timed = next((d for d in details if d.get("timeout_error")), None)
        if timed is not None:
            raise self._timeout_everywhere(timed, details)
        failed = next((d for d in details if d.get("collective_error")), None)
        if failed is not None:
            # A process's own ledger found the error: every process raises it, with the
            # same attributes (global replica ids), and this process's message.
            fields = failed["collective_error"]
            headline = fields.get("headline")
            told: str | None = None
            if headline:  # the first line one process's ledger gave, then what happened
                told = f"{headline}\n\n{outcome_message(details)[1]}"
            raise self._global_error(fields, details, told)
        kind, message = outcome_message(details)
        compared: Sequence[Mapping[str, Any]] = details
        if lost:
            # The collectives issued before the refusal differ (those of the processes
            # below the refusing one, and its own replicas' before the refusing one):
            # one process finds that mismatch before the refusal (see refusal_wins).
            compared = before
            kind, message = outcome_message(compared)
        signatures: dict[int, Signature] = {}
        key: Any = None
        for d in [*details, *before[-1:]] if lost else details:
            if Status(d["status"]) is Status.COLLECTIVE and d["fields"]:
                signature = rebuild_signature(d["fields"], d.get("site"))
                first, count = d["replicas"]
                for replica in range(first, first + count):
                    signatures[replica] = signature
                if key is None:
                    key = d.get("key")
        name = key[0] if isinstance(key, list) else None
        position = key[1] if isinstance(key, list) else key if isinstance(key, int) else 0
        if kind == "mismatch":
            found = components_error(details)  # Strategy.reduce: one process's check
            if found is not None:
                raise found
            cycle = _cycle(details)
            if cycle is not None:
                raise cycle
            raise CollectiveMismatchError(
                position,
                signatures,
                differing_fields(compared),
                num_replicas=self.num_replicas,
                name=name,
                message=message,
            )
        for d in details:
            at = d.get("at")  # a stopped process's replicas at a collective (see _end_run)
            if d.get("stopped") and at:
                signature = rebuild_signature(at["fields"], at.get("site"))
                for replica in at["replicas"]:
                    signatures.setdefault(int(replica), signature)
        gone = [d for d in details if Status(d["status"]) is not Status.COLLECTIVE]
        # The process that ended the run, not one stopped by its end (see _stop_run).
        gone = [d for d in gone if not d.get("stopped")] or gone
        first = gone[0]["replicas"][0] if gone else 0
        raise ReplicaExitedError(
            first,
            position,
            signatures,
            exited_count=0,
            exited_last=None,
            name=name,
            message=message,
        )

    def _timeout_everywhere(
        self, timed: Mapping[str, Any], details: list[dict[str, Any]]
    ) -> CollectiveTimeoutError:
        """The timeout a process found on its own replicas, as every process raises it.

        Its ``position``, ``timeout`` and ``missing``; ``arrived`` completed by the
        replicas of every process that waited at that collective (their details) or
        that timed out there too: what one process's timeout lists. Its message is the
        timed-out process's, with the other processes' arrived replicas added.
        """
        fields = timed["timeout_error"]
        position = int(fields["position"])
        arrived = {int(r) for r in fields["arrived"]}
        missing = {int(r) for r in fields["missing"]}
        others: list[str] = []
        for d in details:
            if d is timed:
                continue
            key = d.get("key")
            at = key[1] if isinstance(key, list) else key
            if Status(d["status"]) is Status.COLLECTIVE and at == position:
                first, count = d["replicas"]
                there = [r for r in range(first, first + count) if r not in missing]
            elif d.get("timeout_error"):
                there = [int(r) for r in d["timeout_error"]["arrived"]]
            else:
                continue
            if there and not set(there) <= arrived:
                arrived.update(there)
                where = f" at {d['site']}" if d.get("site") else ""
                what = f" {d['describe']}{where}" if d.get("describe") else " it"
                others.append(
                    f"  * {self._process(int(d['rank']))}: replica"
                    f"{'' if len(there) == 1 else 's'} {', '.join(map(str, there))} called"
                    f"{what} and waited"
                )
        message = str(fields.get("message") or "")
        lines = message.split("\n")
        if others and len(lines) > 2:
            lines[2:2] = others  # after the first line and the blank one: the roll call
        rank = int(timed["rank"])
        if rank != self.rank:
            lines.insert(
                1,
                f"(Process {rank} timed out on its own replicas; this is process "
                f"{self.rank} of {self.size}.)",
            )
        placeholder = self.current or Signature(CollectiveKind.BARRIER)
        return CollectiveTimeoutError(
            position,
            float(fields["timeout"]),
            dict.fromkeys(sorted(arrived), placeholder),
            dict.fromkeys(sorted(missing - arrived), ""),
            message="\n".join(lines),
        )

    def _global_error(
        self, fields: dict[str, Any], details: list[dict[str, Any]], message: str | None = None
    ) -> CollectiveMismatchError | ReplicaExitedError:
        """A process's collective error (:func:`error_fields`), for every process.

        Completed by every process's waiting replicas: the same attributes everywhere.
        """
        waiting: dict[int, Signature] = {}
        for d in details:
            if Status(d["status"]) is Status.COLLECTIVE and d["fields"] and not d.get("refused"):
                signature = rebuild_signature(d["fields"], d.get("site"))
                first, count = d["replicas"]
                for replica in range(first, first + count):
                    waiting[replica] = signature
        if message is None:
            message = outcome_message(details)[1]
        if fields["class"] == "CollectiveMismatchError":
            signatures = {
                int(r): rebuild_signature(f, site) for r, (f, site) in fields["signatures"].items()
            }
            for replica, signature in waiting.items():
                signatures.setdefault(replica, signature)
            return CollectiveMismatchError(
                int(fields["position"]),
                signatures,
                fields["fields"],
                num_replicas=self.num_replicas,
                name=fields["name"],
                message=message,
            )
        placeholder = next(iter(waiting.values()), Signature(CollectiveKind.BARRIER))
        for replica in fields["waiting"]:
            waiting.setdefault(int(replica), placeholder)
        return ReplicaExitedError(
            int(fields["replica_id"]),
            int(fields["position"]),
            waiting,
            exited_count=0,
            exited_last=None,
            name=fields["name"],
            message=message,
        )

    def _complete_error(self, error: BaseException, details: list[dict[str, Any]]) -> None:
        """Give this process's own collective error the other processes' waiting replicas.

        Its attributes then equal those every other process raises.
        """
        refused = first_refusal(details)
        if refused is not None and refusal_wins(details, refused):
            # A replica of a lower rank refused its collective before this process's
            # ledger found its error: one process raises that refusal, so every one does.
            try:
                self._raise_for(details)
            except Exception as alike:
                raise alike from error
        timed = next((d for d in details if d.get("timeout_error")), None)
        if timed is not None:
            # A timeout on some process's own replicas: one error, the lowest such
            # process's, completed by every process's replicas that waited there.
            everywhere = self._timeout_everywhere(timed, details)
            own = timeout_fields(error)
            if own is None or int(timed["rank"]) != self.rank:
                raise everywhere from error
            leaves = _leaf_exceptions(error) if isinstance(error, BaseExceptionGroup) else [error]
            for leaf in leaves:
                if isinstance(leaf, CollectiveTimeoutError):
                    leaf.arrived, leaf.missing = everywhere.arrived, everywhere.missing
                    leaf.args = everywhere.args
            return
        if type(error) is CollectiveError:
            # Each process's ledger found it in its own replicas (global ids): one
            # process finds the lowest replica's, so every process raises the lowest
            # rank's (the same class, the same replica named).
            first = next((d for d in details if d.get("ledger_error")), None)
            if first is not None and first["ledger_error"] != str(error):
                raise CollectiveError(first["ledger_error"], report=error.report) from error
        found = collective_error(error)
        fields = error_fields(error, check_call_sites=self.check_call_sites)
        if found is None or fields is None:
            return
        glob = self._global_error(fields, details, message="")
        if isinstance(found, CollectiveMismatchError) and isinstance(glob, CollectiveMismatchError):
            found.signatures = glob.signatures
        elif isinstance(found, ReplicaExitedError) and isinstance(glob, ReplicaExitedError):
            found.waiting = glob.waiting
