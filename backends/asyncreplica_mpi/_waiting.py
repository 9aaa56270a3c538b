"""Waiting for the other processes: polled from the event loop, with stall warnings.

Split from :mod:`._group`. Every wait of a process group between posting a request and
its completion is here: it spins, then parks a thread in MPI (or sleeps), reads the
peers' notes meanwhile (who waits where, a peer's failure after an agreement), tells
the peers where this process waits, and warns when it stalls, naming the processes
that have not arrived. :class:`Waiting` is a base of
:class:`~asyncreplica_mpi.MPIProcessGroup`, which sets every attribute declared here.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import threading
import time
from collections.abc import Callable, Generator, Hashable, Mapping
from typing import Any, TypeVar

import anyio
import anyio.lowlevel
import numpy as np

from asyncreplica import CollectiveDeadlockError
from asyncreplica.abc import Signature

from . import _exit
from ._arrival import _logger, comm_key, interrupt_pending, take_interrupt
from ._failures import Failures, _exchange_text
from ._lifecycle import State
from ._protocol import Status, from_wire, to_wire

__all__ = ["Waiting", "tell_creating", "thread_multiple"]

_T = TypeVar("_T")

# Waiting: tests without yielding for up to _BUSY_SECONDS (peers that are nearly there
# complete the request within them, and a wait that never yields needs no shield from
# cancellation, see the module docstring), then tests that yield to the loop and to the
# OS (sched_yield) in between, for up to _SPIN_SECONDS. MPICH progresses only inside
# MPI calls, so Test() drives it, and the loop's timers cannot sleep less than about a
# millisecond, hence the generous spin. Then the wait is *parked*: a daemon thread
# blocks in MPI until the request completes or a peer rings this process's bell (it
# sends one after each note), and wakes the loop, so that no delivery waits for a
# timer (MPI's blocking calls drive progress themselves). Without MPI_THREAD_MULTIPLE
# the loop sleeps instead, from _MIN_SLEEP growing to _MAX_SLEEP between tests.
_BUSY_SECONDS = 20e-6
_SPIN_SECONDS = 0.01
_MIN_SLEEP = 1e-4
_MAX_SLEEP = 0.001
# A parked wait reads the peers' notes when its bell rings (a sleeping one, every
# _NOTES_SECONDS at most); a wait at an exchange tells the peers it waits there once it
# has waited _ANNOUNCE_SECONDS (so that a stall warning can name the processes that
# have not arrived).
_NOTES_SECONDS = 0.002
_ANNOUNCE_SECONDS = 0.05
# Under asyncio's runner, the first Ctrl-C only cancels the main task, which a shielded
# wait defers: a long wait looks at the runner's count this often, to say so at once.
_INTERRUPT_POLL_SECONDS = 0.2
# A run spanning several processes reads the peers' notes this often while no wait of
# its own reads them (see Waiting.watch_peers): a process whose replicas are at no
# collective learns of a peer's failure within it. One Iprobe per tick, on a timer.
_LISTEN_SECONDS = 0.02
_NOTE_TAG = 1
_BELL_TAG = 2  # an empty message after each note: it wakes a parked wait

_sched_yield = getattr(os, "sched_yield", lambda: None)  # POSIX only
_thread_level: list[bool] = []
_LIVE = (State.JOINED, State.RUNNING)
_CREATING = "creating"  # an "elsewhere" note's place: the process creates a strategy


def tell_creating(label: str, waiting: bool) -> None:
    """Tell the peers of this process's groups that it waits creating ``label`` (or no more).

    Their stall warnings then say so (see :meth:`Waiting._stall_message`), instead of
    calling this process busy outside collectives.
    """
    note = {"kind": "elsewhere", "label": label, "what": _CREATING}
    if not waiting:
        note = {"kind": "elsewhere done"}
    for group in _exit._groups:
        if group.size > 1 and group._state in _LIVE:
            with contextlib.suppress(Exception):  # best effort: it only names a place
                group._tell_peers(note)


def peers_waiting_on(base: Any, ranks: list[int]) -> dict[int, str]:
    """Where each of ``ranks`` waits at a collective of a strategy on ``base``, if it does.

    For the stall warning of a process creating a strategy (see ``_arrival``): a peer
    that waits at an exchange of an older strategy, which this process has not
    reached, told so (its "waiting" note): ``"at <what> of <label>"`` by rank.
    """
    found: dict[int, str] = {}
    handle = comm_key(base)
    for group in _exit._groups:
        if group.size == 1 or group._state not in _LIVE or group._base_key != handle:
            continue
        with contextlib.suppress(Exception):  # a peer's failure is raised by its next use
            group._read_notes()
        for rank in ranks:
            at = group._peer_at.get(rank)
            if (
                rank not in found
                and at is not None
                and at[0] in (group._number, -1 - group._number)
            ):
                found[rank] = f"at {at[1]} of {group.label()}"
    return found


_BELL = np.zeros(1, np.int64)  # what a bell carries (nothing that is read)


def _spin(test: Callable[[], bool]) -> bool:
    """Call ``test`` for up to _BUSY_SECONDS without yielding; whether it returned True."""
    if test():
        return True
    until = time.perf_counter() + _BUSY_SECONDS
    while time.perf_counter() < until:
        if test():
            return True
    return False


def _waker(event: anyio.Event) -> Callable[[], None]:
    """A function that any thread may call to set ``event`` (on this loop)."""
    loop = asyncio._get_running_loop()
    if loop is not None:
        call = loop.call_soon_threadsafe

        def wake() -> None:
            with contextlib.suppress(RuntimeError):  # the loop has closed
                call(event.set)

        return wake
    import trio

    token = trio.lowlevel.current_trio_token()

    def wake_trio() -> None:
        with contextlib.suppress(trio.RunFinishedError):
            token.run_sync_soon(event.set)

    return wake_trio


def thread_multiple() -> bool:
    """Whether MPI was initialised with MPI_THREAD_MULTIPLE."""
    if not _thread_level:
        from mpi4py import MPI

        _thread_level.append(MPI.Query_thread() == MPI.THREAD_MULTIPLE)
    return _thread_level[0]


class _Expired(Exception):
    """An exchange's deadline (the group's timeout) passed before it completed."""


class Waiting(Failures):
    """The waiting half of :class:`~asyncreplica_mpi.MPIProcessGroup` (a base of it).

    The attributes below are set by the group's constructor (see there).
    """

    stall_warning_seconds: float | None
    _side: Any
    _bell: Any
    _bell_buf: np.ndarray[Any, Any]
    _number: int
    _sends: list[Any]
    _seen_waiting: dict[int, set[int]]
    _peer_at: dict[int, tuple[int, str]]
    _base: Any
    _base_key: int
    _peer_failure: dict[str, Any] | None
    _failed_peers: set[int]
    _acks: set[int]
    _told_peers: set[int]
    _endings: dict[int, dict[str, Any]]
    _busy: bool
    _elsewhere: dict[int, tuple[str, str]]
    _blocked_elsewhere: dict[int, int]
    _in_flight: bool
    _last: tuple[Hashable, dict[str, Any]] | None
    _agreed_at: float
    _abandoned: list[Any]
    _local_waits: Mapping[Hashable, tuple[Signature, tuple[int, ...]]]
    _told_arrival: tuple[int, Any, tuple[int, ...]] | None
    _partial: dict[int, tuple[int, Any, list[int]]]

    async def _wait(self, request: Any, deadline: float | None) -> None:
        """Wait for a posted request that :func:`_spin` did not see complete.

        The wait is shielded from cancellation: the request must complete.

        Raises:
            _Expired: ``deadline`` (``anyio.current_time()``) passed first.
        """
        test = request.Test
        number = self._number - 1
        try:
            with anyio.CancelScope(shield=True):
                if deadline is None:
                    await self._watch(test, number, request)
                    return
                with anyio.CancelScope(deadline=deadline):
                    await self._watch(test, number, request)
                    return
            raise _Expired
        except _Expired:
            self._break("a cross-process exchange was abandoned")  # _timed_out tells
            raise
        except BaseException as exc:
            # Abandoned while posted (an interruption no shield stops: Ctrl-C outside
            # asyncio's runner, a second one under it): the processes are out of step,
            # and the peers are told why.
            self.abandoned_by(exc, "a cross-process exchange was abandoned", stage="exchange")
            raise

    async def _watch(
        self,
        test: Callable[[], bool],
        exchange: int | None = None,
        request: Any = None,
        *,
        data: bool = False,
    ) -> None:
        """Call ``test`` until it returns True, yielding; read the peers' notes meanwhile.

        It tests yielding to the loop (``asyncio.sleep(0)`` on asyncio) and to the OS in
        between for up to _SPIN_SECONDS, then parks (see :meth:`_park`): ``request``,
        when given, is what ``test`` tests; without it, whatever makes ``test`` true
        rings this process's bell. Without MPI_THREAD_MULTIPLE it sleeps up to
        _MAX_SLEEP between tests instead of parking.

        A peer's failure after an agreement raises here (see :meth:`_read_notes`).
        For an exchange (``exchange``: its number), a wait that passes
        ``_ANNOUNCE_SECONDS`` tells the peers that this process waits there, and one
        that passes ``stall_warning_seconds`` logs a warning naming the processes
        that have not arrived. The announcement also goes to the peers of this
        process's other groups (strategies), so that a peer waiting on another strategy
        names where this process waits, instead of calling it busy. With ``data``, the
        wait is for the data transfer after the agreement ``exchange``.
        """
        on_asyncio = asyncio._get_running_loop() is not None
        start = time.perf_counter()
        spin_until = start + _SPIN_SECONDS
        if data and self._agreed_at:
            start = min(start, self._agreed_at)  # a data wait counts from its agreement
        while not test():
            if time.perf_counter() >= spin_until:
                break
            # The peer may share this core (the machine is busy): a spin that does not
            # give it the core waits a whole time slice for it, an MPI blocking call
            # alike. With nothing else runnable here this returns at once.
            _sched_yield()
            if on_asyncio:
                await asyncio.sleep(0)
            else:
                await anyio.lowlevel.checkpoint()
        else:
            return
        stall = self.stall_warning_seconds
        announce = _ANNOUNCE_SECONDS if not stall else min(_ANNOUNCE_SECONDS, stall / 2)
        warned = False
        announced = False
        key = -1 - exchange if data and exchange is not None else exchange
        timers = exchange is not None and self.size > 1
        # The timed checks: (seconds into the wait, what to do), earliest first.
        due: list[tuple[float, str]] = []
        if timers:
            due.append((announce, "announce"))
            if stall:
                due.append((stall, "stall"))
            due.sort()
        parked = thread_multiple()
        delay = _MIN_SLEEP
        # Under asyncio's runner, a Ctrl-C that the shield defers is said at once.
        interrupts = on_asyncio  # whether to look for one
        try:
            while True:
                self._read_notes()
                if test():
                    break
                if interrupts and interrupt_pending():
                    interrupts = False  # said once
                    take_interrupt()
                    _logger.warning(self._interrupt_message(key, data=data))
                waited = time.perf_counter() - start
                while due and waited >= due[0][0]:
                    _, what = due.pop(0)
                    assert key is not None
                    if what == "announce":
                        announced = True
                        what = self._waiting_what()
                        if data:
                            what = f"the data transfer of {what}"
                        self._tell_peers({"kind": "waiting", "number": key, "what": what})
                        self._tell_other_groups(True)
                    else:
                        warned = True
                        _logger.warning(self._stall_message(key, waited, data=data))
                until = due[0][0] - waited if due else None
                if interrupts:
                    poll = _INTERRUPT_POLL_SECONDS
                    until = poll if until is None else min(until, poll)
                if parked:
                    await self._park(request, until)
                else:
                    nap = delay if until is None else min(delay, max(until, 0.0))
                    await anyio.sleep(min(nap, _NOTES_SECONDS))
                    delay = min(delay * 2, _MAX_SLEEP)
        finally:
            if announced:
                self._tell_other_groups(False)
        if warned:
            _logger.warning(
                f"Collective resumed: the processes completed {self._waiting_what()} after "
                f"{time.perf_counter() - start:.1f} s; the stall warning above was not a hang."
            )

    async def _park(self, request: Any, seconds: float | None) -> None:
        """Block a daemon thread in MPI until ``request`` completes or the bell rings.

        The bell is a receive from any peer, always posted; a peer rings it after each
        note it sends (see :meth:`_tell_peers`), and a transfer thread rings this
        process's own when it is done. The thread wakes the loop; this returns then,
        with the bell posted again if it rang. After ``seconds`` (a timed check is due)
        it rings its own bell and returns once the thread has; cancelled (a deadline),
        it rings its own bell and raises at once (the exchange is abandoned).
        """
        bell = self._bell
        woke = anyio.Event()
        wake = _waker(woke)
        MPI = self._MPI

        def park() -> None:
            try:
                if request is None:
                    bell.Wait()
                else:
                    MPI.Request.Waitany([request, bell])
            finally:
                wake()

        threading.Thread(target=park, name="asyncreplica MPI wait", daemon=True).start()
        try:
            with anyio.move_on_after(math.inf if seconds is None else seconds):
                await woke.wait()
        except BaseException:  # cancelled: release the thread, which tests nothing more
            with contextlib.suppress(Exception):  # the cancellation is the news
                self._ring(self.rank)
            raise
        if not woke.is_set():  # a timed check is due: release the thread first
            self._ring(self.rank)
            with anyio.CancelScope(shield=True):
                await woke.wait()
        if bell.Test():  # it rang: listen again
            self._bell = self._side.Irecv(self._bell_buf, source=MPI.ANY_SOURCE, tag=_BELL_TAG)

    def _tell_other_groups(self, waiting: bool, *, blocked: bool = False) -> None:
        """Tell the peers of this process's other groups that it waits here (or no more).

        ``blocked``: the wait blocks this process's thread (a trace merge, see
        :meth:`_raise_if_blocked_cycle`): the note carries the exchange's number.
        """
        note: dict[str, Any] = {
            "kind": "elsewhere",
            "label": self.label(),
            "what": self._waiting_what(),
        }
        if blocked:
            note["blocked"] = self._number - 1
        if not waiting:
            note = {"kind": "elsewhere done"}
        for group in _exit._groups:
            if group is not self and group.size > 1 and group._state in _LIVE:
                with contextlib.suppress(Exception):  # best effort: it only names a place
                    group._tell_peers(note)

    def _raise_if_blocked_cycle(self, exchange: int) -> None:
        """Raise where this blocked wait and a peer's wait on another group form a cycle.

        Called from a wait that blocks this process's thread (a trace merge: nothing
        else of this process can run meanwhile) once it has told the peers of its
        other groups so. The cycle is certain when a peer that has not arrived here
        waits, blocked likewise, at an exchange of another group of this process, on
        which this process has no exchange posted and no run in progress: that peer
        waits for this process, which cannot reach that exchange before this one
        completes, which needs that peer. The peer sees the same from this process's
        note and raises the same error (the message lists the processes in rank
        order). Both groups are then out of step on both processes (each has an
        exchange posted that the other never matches): the job must be restarted,
        and the exit hook aborts it. A wait inside a run is never decided so: it
        yields to the event loop, where another task may still issue the exchange a
        peer waits for (see the stall warning).

        Raises:
            CollectiveDeadlockError: The cycle, naming both strategies and processes.
        """
        for peer in self._missing(exchange):
            number = self._blocked_elsewhere.get(peer)
            where = self._elsewhere.get(peer)
            if number is None or where is None:
                continue
            label, what = where
            other = next(
                (
                    g
                    for g in _exit._groups
                    if g is not self
                    and g.label() == label
                    and g._state is State.JOINED
                    and not g._in_flight
                    and g._broken is None
                ),
                None,
            )
            if other is None:
                continue
            raise self._blocked_cycle(peer, other, what, number, exchange)

    def _blocked_cycle(
        self, peer: int, other: Waiting, peer_what: str, peer_number: int, number: int
    ) -> CollectiveDeadlockError:
        """The error of :meth:`_raise_if_blocked_cycle` (both groups are out of step)."""
        waits = {
            self.rank: (self.label(), self._waiting_what(), number, peer, other.label()),
            peer: (other.label(), peer_what, peer_number, self.rank, self.label()),
        }
        first, second = sorted(waits)
        lines = [
            (
                f"Processes {first} and {second} wait for each other on two strategies, in "
                "a cycle: neither wait can ever complete."
            ),
            "",
        ]
        for rank in (first, second):
            label, what, at, needs, theirs = waits[rank]
            lines.append(
                f"  * process {rank} waits at {what} of {label} (its exchange {at} on that "
                f"strategy), which process {needs} has not reached: process {needs} waits "
                f"on {theirs}"
            )
        lines += [
            "",
            (
                "Each wait blocks its process (the end of a strategy.trace(...) block), so "
                "nothing else of either process can release the other. The processes use "
                "their strategies in different orders: nest strategy.trace(...) blocks, and "
                "make the runs, of every strategy in the same order on every process."
            ),
            (
                f"Every process of the cycle raises this error. {waits[first][0]} and "
                f"{waits[second][0]} are now out of step (each process has an exchange "
                "posted that the other never matches): the job cannot go on with them, "
                "and the exit hook aborts the MPI job. Restart it."
            ),
        ]
        reason = "the processes waited for each other on two strategies: a deadlock"
        self._break(reason)
        other._break(reason)
        error = CollectiveDeadlockError((), message="\n".join(lines))
        error.cycle = tuple(
            (rank, f"{waits[rank][1]} of {waits[rank][0]}") for rank in (first, second)
        )
        return error

    def _missing(self, exchange: int | None) -> list[int]:
        """The peers not seen waiting at ``exchange`` (the key of a wait)."""
        seen = self._seen_waiting.get(exchange, set()) if exchange is not None else set()
        return [r for r in range(self.size) if r != self.rank and r not in seen]

    def _absent_text(self, rank: int) -> str:
        """Where process ``rank``, not seen at this process's exchange, is (a timeout's roll call)."""
        elsewhere = self._elsewhere.get(rank)
        if elsewhere is not None and elsewhere[1] == _CREATING:
            return (
                f"process {rank} is creating {elsewhere[0]}, while this one waits on {self.label()}"
            )
        if elsewhere is not None:
            return (
                f"process {rank} waits at {elsewhere[1]} of {elsewhere[0]}, another strategy, "
                f"while this one waits on {self.label()}"
            )
        return (
            f"process {rank} is busy outside collectives (a computation, I/O, a blocking "
            "call) or its replicas await something else (one of its own replicas, an "
            "event, I/O)"
        )

    def _interrupt_message(self, exchange: int | None, *, data: bool = False) -> str:
        """Ctrl-C came (asyncio's runner cancelled the main task) while this wait is shielded."""
        what = self._waiting_what()
        if data:
            what = f"the data transfer of {what}"
        missing = self._missing(exchange)
        return (
            f"asyncreplica: {self._process(self.rank)} was interrupted (SIGINT, Ctrl-C) "
            f"while it waits at {what} for "
            + (", ".join(self._process(r) for r in missing) or "the other processes")
            + ". The interruption takes effect once the processes complete it, so that "
            "they stay in step (this process has posted its part of it). Press Ctrl-C "
            "again to stop now: the other processes are told, and the MPI job is aborted "
            "at exit."
        )

    def _stall_message(self, exchange: int, waited: float, *, data: bool = False) -> str:
        """The warning for an exchange that has waited ``stall_warning_seconds``.

        ``exchange`` is the key of the wait (``-1 - number`` for a data transfer).
        """
        missing = self._missing(exchange)
        waiting = [r for r in range(self.size) if r not in missing]
        what = self._waiting_what()
        if data:
            what = f"the data transfer of {what} (every process agreed on it)"
        lines = [
            (
                f"Collective stalled across processes: {self._process(self.rank)} has "
                f"waited {waited:.1f} s at {what} for "
                + (", ".join(self._process(r) for r in missing) or "the other processes")
                + "."
            ),
            "",
        ]
        for r in waiting:
            lines.append(f"  * {self._process(r)} reached it and waits")
        for r in missing:
            elsewhere = self._elsewhere.get(r)
            if elsewhere is not None and elsewhere[1] == _CREATING:
                lines.append(
                    f"  * {self._process(r)} did not arrive: it is creating {elsewhere[0]} "
                    f"(it waits there for this process), while this process waits on "
                    f"{self.label()}. Every process must create its strategies at the same "
                    "point of the program, between the same collectives: each waits for the "
                    "other (a deadlock, unless another task of this process creates it)"
                )
                continue
            if elsewhere is not None:
                label, there = elsewhere
                lines.append(
                    f"  * {self._process(r)} did not arrive: it waits at {there} of "
                    f"{label}, another strategy, while this process waits on "
                    f"{self.label()}. The processes use their strategies in different "
                    "orders: each waits for the other (a deadlock, unless another task of "
                    "one of them issues the missing collective)"
                )
                continue
            if data:
                lines.append(
                    f"  * {self._process(r)} agreed on it but has not sent its data: it "
                    "is stopped, blocked in a call that does not yield, or died"
                )
                continue
            place = (
                f"its last exchange with the others was {_exchange_text(self._last)}"
                if self._last is not None
                else "it has made no exchange with the others yet"
            )
            lines.append(
                f"  * {self._process(r)} did not arrive: {place}; it is busy outside "
                "collectives (a computation, I/O, a blocking call) or waits for one of its own "
                "replicas (its own log then has a stall warning)"
            )
        lines += [
            "",
            (
                "This is a warning, not an error: the run goes on, and a message follows if "
                "the collective completes. Set CommunicationOptions(timeout_seconds=...) to "
                "fail instead."
            ),
        ]
        return "\n".join(lines)

    def _tell_peers(self, note: dict[str, Any]) -> None:
        """Send ``note`` (JSON) to every other process on the side communicator."""
        payload = to_wire(json.dumps({**note, "rank": self.rank}))
        self._sends = [r for r in self._sends if not r.Test()]
        for r in range(self.size):
            if r != self.rank:
                self._sends.append(self._side.Isend(payload, dest=r, tag=_NOTE_TAG))
                self._ring(r)

    def _ring(self, rank: int) -> None:
        """Ring ``rank``'s bell (this process's own: release this process's parked wait)."""
        if len(self._sends) > 64:
            self._sends = [r for r in self._sends if not r.Test()]
        self._sends.append(self._side.Isend(_BELL, dest=rank, tag=_BELL_TAG))

    def _read_notes(self) -> None:
        """Receive the peers' notes; raise if one failed after an agreement.

        Raises:
            ReplicaExitedError: A peer failed after the processes agreed on a
                collective (its data will never come): its own error, by name.
        """
        MPI = self._MPI
        side = self._side
        status = MPI.Status()
        while side.Iprobe(source=MPI.ANY_SOURCE, tag=_NOTE_TAG, status=status):
            source = status.Get_source()
            buf = np.empty(status.Get_count(MPI.BYTE), np.uint8)
            side.Recv(buf, source=source, tag=_NOTE_TAG)
            try:
                note = json.loads(from_wire(buf))
            except ValueError:
                continue
            kind = note.get("kind")
            if kind == "waiting":
                if len(self._seen_waiting) > 64:
                    self._seen_waiting = {
                        k: v for k, v in self._seen_waiting.items() if k >= self._number - 2
                    }
                self._seen_waiting.setdefault(int(note["number"]), set()).add(source)
                if isinstance(note.get("what"), str):
                    self._peer_at[source] = (int(note["number"]), note["what"])
            elif kind == "arrived":
                replicas = [int(r) for r in note.get("replicas", ())]
                self._partial[source] = (int(note["number"]), note.get("key"), replicas)
            elif kind == "failed":
                self._failed_peers.add(source)  # it waits for no ack from us at exit
                if self._peer_failure is None:
                    self._peer_failure = note
            elif kind == "ack":
                self._acks.add(source)
            elif kind == "told":
                self._told_peers.add(source)
            elif kind == "ending":
                if len(self._endings) > 16:
                    self._endings = {k: v for k, v in self._endings.items() if k >= self._number}
                self._endings.setdefault(int(note["number"]), {**note, "rank": source})
            elif kind == "elsewhere":
                self._elsewhere[source] = (str(note.get("label")), str(note.get("what")))
                if isinstance(note.get("blocked"), int):
                    self._blocked_elsewhere[source] = int(note["blocked"])
                else:
                    self._blocked_elsewhere.pop(source, None)
            elif kind == "elsewhere done":
                self._elsewhere.pop(source, None)
                self._blocked_elsewhere.pop(source, None)
        failure = self._peer_failure
        if failure is not None and not self._failed_here:
            self._raise_peer_failure(failure)

    #: How often a run reads the peers' notes while no wait of its own does (see
    #: :meth:`watch_peers`).
    peer_watch_seconds: float | None = _LISTEN_SECONDS

    def watch_peers(self) -> None:
        """Raise a peer's failure told while this process waits nowhere (every tick of a run).

        A collective's wait reads the peers' notes and raises a peer's failure; a run
        whose replicas are at no collective (each awaits something else, or computes)
        has no such wait, so the run calls this every :attr:`peer_watch_seconds`, on
        its event loop (``ProcessGroup.watch_peers``): an ``Iprobe`` of the notes only
        (never the exchanges', the data's or the bell's messages), no thread, no task
        on asyncio. It raises:

        * a peer's failure note (a timeout, a failure after an agreement, an abandoned
          exchange): the peer's error, as a collective's wait raises it;
        * a peer's ``"ending"`` note: it waits, with a failed run's end or its goodbye at
          exit, at the exchange this process makes next, and this process has no
          exchange or data transfer in progress: :meth:`_stop_run`'s error, after which
          the run's end makes that exchange (the processes stay in step).
        """
        if self._state is not State.RUNNING or self._run_ended or self._stopped is not None:
            return  # (finalized, closed or failed: no MPI call, nothing more to end)
        if self._busy or self._in_flight:
            return  # an exchange or data transfer in progress: its wait reads the notes
        self._read_notes()  # a peer's failure note raises here
        self._tell_arrival()
        ending = self._endings.get(self._number)
        if ending is not None:
            raise self._stop_run(ending)

    def _tell_arrival(self) -> None:
        """Tell the peers which replicas of this process wait at its next collective.

        While another replica of this process has not reached it, the collective does
        not cross (no exchange is posted): a peer that times out there names these
        replicas as arrived, as one process does, instead of calling this process busy.
        Told once per change (see ``local_waits``).
        """
        told = None
        for key, (_, replicas) in self._local_waits.items():
            if len(replicas) < self.replica_counts[self.rank]:
                told = (self._number, key, replicas)
            break
        if told == self._told_arrival or (told is None and self._told_arrival is None):
            return
        self._told_arrival = told
        with contextlib.suppress(Exception):  # best effort: it only names replicas
            if told is None:
                self._tell_peers({"kind": "arrived", "number": -1, "replicas": []})
            else:
                number, key, replicas = told
                self._tell_peers(
                    {
                        "kind": "arrived",
                        "number": number,
                        "key": list(key) if isinstance(key, tuple) else key,
                        "replicas": list(replicas),
                    }
                )

    def _tell_ending(self, status: Status) -> None:
        """Tell the peers that this process waits at its last posted exchange with ``status``.

        A failed run's end (or a refused run's exchange), or the goodbye at exit: a peer
        whose replicas are at no collective makes that exchange then (see
        :meth:`watch_peers`) instead of leaving this process waiting.
        """
        with contextlib.suppress(Exception):  # best effort: a waiting peer meets it anyway
            self._tell_peers({"kind": "ending", "number": self._number - 1, "status": int(status)})

    async def wait_data(self, request: Any) -> None:
        """Wait for a posted data transfer (the caller shields it), watching for failures.

        The wait has the exchange's stall warning and timeout, counted from the
        agreement: a peer that stops after agreeing is named, and past
        ``timeout_seconds`` this process raises and tells the others (the processes
        are out of step then, as after any timeout).
        """
        if _spin(request.Test):
            return
        deadline = None
        if self._limit is not None:
            start = self._agreed_at or time.perf_counter()
            deadline = anyio.current_time() + max(0.0, start + self._limit - time.perf_counter())
        try:
            with anyio.CancelScope(deadline=math.inf if deadline is None else deadline):
                await self._watch(request.Test, self._number - 1, request, data=True)
                return
        except BaseException:
            self.abandon(request)
            raise
        self.abandon(request)
        self._timed_out(None, None, data=True)

    def abandon(self, request: Any, *buffers: Any) -> None:
        """A posted data transfer will not be waited for: out of step, and kept alive.

        MPI may still read and write the request's ``buffers`` (an mpi4py request does
        not hold them), so they are held until exit, when the job is aborted.
        """
        self._abandoned.append((request, buffers))
        self._break("a data transfer was abandoned")

    async def _drive(self, steps: Generator[Any, None, _T], deadline: float | None) -> _T:
        try:
            request = next(steps)
            while True:
                if not _spin(request.Test):
                    await self._wait(request, deadline)
                request = steps.send(None)
        except StopIteration as stop:
            result: _T = stop.value
            return result
