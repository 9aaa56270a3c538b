"""The MPI process group: agreement between processes, polled from the event loop.

See :mod:`._protocol` for the exchange itself. This module owns the communicators
(two duplicates of the user's: one for agreement, one for data, so that neither
ever shares traffic with the user's own), the polling of non-blocking requests from
the event loop, and the stall warnings and timeouts of every wait. Creating a group's
arrival notes live in :mod:`._arrival`; its lifecycle table in :mod:`._lifecycle`; the
goodbye at exit (and at ``MPI.Finalize()``) and the release of dropped groups in
:mod:`._exit`; merged timelines in :mod:`._trace`.

Cancellation: once a process has posted its part of an MPI collective it must finish
it, or the processes fall out of step. Every wait between posting a request and its
completion is therefore shielded from cancellation, and so is every wait between an
agreement and the data movement it allows (see :meth:`MPIProcessGroup.collective`).
A wait that completes at once needs no shield: nothing can cancel code that does not
yield to the loop, which is what makes the common case cheap.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import json
import math
import os
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Generator, Hashable, Mapping, Sequence
from typing import Any, NoReturn, TypeVar

import anyio
import anyio.lowlevel
import anyio.to_thread
import numpy as np

from asyncreplica import (
    BackendError,
    CollectiveDeadlockError,
    CollectiveMismatchError,
    CollectiveTimeoutError,
    ReplicaContextError,
    ReplicaExitedError,
)
from asyncreplica.abc import Backend, CollectiveKind, ProcessGroup, Signature

from . import _exit
from ._arrival import _arrive, _created, _logger, agree_options
from ._lifecycle import Event, Refusal, State, advance
from ._protocol import (
    HEADER,
    HEADER_BYTES,
    HEADER_WORDS,
    MAGIC,
    REFUSALS,
    Status,
    at_position,
    collective_error,
    describe_exception,
    differing_fields,
    error_fields,
    fingerprint,
    first_refusal,
    key_text,
    outcome_message,
    position_code,
    rebuild_signature,
    refusal_fields,
    signature_fields,
)
from ._trace import TraceMerger

__all__ = [
    "INLINE_BYTES",
    "MPIProcessGroup",
    "thread_multiple",
]

#: A partial result up to this size travels inside the agreement exchange. Every
#: exchange moves a row this size (plus its header) per process, whatever it carries:
#: at 2 KiB a barrier costs what it did at 256 bytes (callgrind: 265k against 277k
#: instructions per round, 2 processes x 4 replicas), and a 1 KiB all_reduce makes one
#: exchange instead of two (384k against 485k).
INLINE_BYTES = 2048
_ROW_BYTES = HEADER_BYTES + INLINE_BYTES  # one process's part of an exchange

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
_NOTE_TAG = 1
_BELL_TAG = 2  # an empty message after each note: it wakes a parked wait
_DRAIN_EVERY = 1023  # read the notes at every 1024th exchange (a mask)

# The per-signature and per-position caches are cleared past this many entries.
_MAX_CACHED = 4096

_sched_yield = getattr(os, "sched_yield", lambda: None)  # POSIX only


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


_serials = iter(range(1 << 62))
_thread_level: list[bool] = []


def thread_multiple() -> bool:
    """Whether MPI was initialised with MPI_THREAD_MULTIPLE."""
    if not _thread_level:
        from mpi4py import MPI

        _thread_level.append(MPI.Query_thread() == MPI.THREAD_MULTIPLE)
    return _thread_level[0]


class _Expired(Exception):
    """An exchange's deadline (the group's timeout) passed before it completed."""


# What a collective agrees on: its fields (with the first position's text), the detail
# shown on a mismatch, its fingerprint at its position, and the position.
_Agreement = tuple[dict[str, Any], dict[str, Any], int, Hashable]

# What :meth:`MPIProcessGroup._fields` returns for a signature (see there).
_Fields = tuple[dict[str, Any], int, dict[str, Any], bool, bool]

_NO_SHIELD = contextlib.nullcontext()
_LIVE = (State.JOINED, State.RUNNING)
_BELL = np.zeros(1, np.int64)  # what a bell carries (nothing that is read)


class MPIProcessGroup(ProcessGroup):
    """The processes of one ``MultiWorkerMirroredStrategy``.

    Creating it is collective: every process of ``communicator`` must create one, in
    the same order.

    Args:
        communicator: An ``mpi4py`` communicator (default ``MPI.COMM_WORLD``); it is
            duplicated, never used directly.
        local_replicas: How many replicas this process runs.
        check_call_sites: Whether call sites must agree across processes.
        timeout: Seconds to wait for the other processes at one exchange; None
            waits for ever.
        options: The strategy's options that every process must give alike (by
            name, JSON values), compared when the group is created: a difference
            raises ``ValueError`` on every process (see ``_arrival.agree_options``).
    """

    def __init__(
        self,
        communicator: Any = None,
        local_replicas: int = 1,
        *,
        check_call_sites: bool = True,
        timeout: float | None = None,
        stall_warning_seconds: float | None = None,
        options: Mapping[str, object] | None = None,
    ) -> None:
        from mpi4py import MPI

        self._MPI = MPI
        base = MPI.COMM_WORLD if communicator is None else communicator
        if not isinstance(base, MPI.Intracomm):
            raise TypeError(f"communicator must be an mpi4py Intracomm, got {base!r}")
        self._state = State.CREATED
        self.rank = base.Get_rank() if not MPI.Is_finalized() else -1
        if MPI.Is_finalized():
            # No MPI routine may run any more (MPICH would abort the process).
            self._to(Event.FINALIZE)
            self._refuse(Refusal.FINALIZED)
        _exit.install_hooks(finalize=True)
        self._base = base
        self._base_serial = _created.get(base.py2f(), (base, 0))[1]
        self._holder: Callable[[], Any] | None = None  # the backend (see wrap)
        # Every process announces itself before the first collective call, so that a
        # process that never creates its strategy is named (and bounded by timeout)
        # instead of leaving the others inside MPI_Comm_dup for ever.
        try:
            counts = _arrive(base, local_replicas, timeout, stall_warning_seconds)
        except BaseException:
            self._to(Event.ARRIVAL_FAILED)
            raise
        _exit.release_dropped(base)
        self._ctl = base.Dup()
        try:
            agree_options(self._ctl, options or {})
        except BaseException:
            self._ctl.Free()  # no communicator is left behind
            self._to(Event.ARRIVAL_FAILED)
            raise
        self._data = base.Dup()
        self._side = base.Dup()  # notes: who waits where, and failures after agreement
        self.rank = self._ctl.Get_rank()
        self.size = self._ctl.Get_size()
        self.replica_counts: tuple[int, ...] = tuple(counts)
        self.offsets: tuple[int, ...] = tuple(
            int(sum(self.replica_counts[:r])) for r in range(self.size)
        )
        self.num_replicas = int(sum(self.replica_counts))
        self.offset = self.offsets[self.rank]
        self.check_call_sites = check_call_sites
        self.timeout = timeout
        # The timeout of the exchange in progress: a collective's own (its options), or
        # the group's.
        self._limit = timeout
        self.stall_warning_seconds = stall_warning_seconds
        # Notes from peers (side communicator): the ranks seen waiting at each exchange,
        # a peer's failure after an agreement, and the sends of our own notes.
        self._seen_waiting: dict[int, set[int]] = {}
        self._peer_failure: dict[str, Any] | None = None
        self._failed_here = False  # this process failed after an agreement
        self._sends: list[Any] = []
        # A receive of any peer's bell, always posted (see _park).
        self._bell_buf = np.zeros(1, np.int64)
        self._bell: Any = self._side.Irecv(self._bell_buf, source=MPI.ANY_SOURCE, tag=_BELL_TAG)
        self._agreed = False  # the current collective's agreement is made
        self._agreed_at = 0.0  # when (perf_counter), for the data transfer's timeout
        self._acks: set[int] = set()  # peers that reported our failure (at exit)
        self._acked = False  # this process acknowledged a peer's failure (at exit)
        self._failed_peers: set[int] = set()  # peers that told us they failed
        # Peers that wait on another group (strategy): (its label, where), by rank.
        self._elsewhere: dict[int, tuple[str, str]] = {}
        # What the current exchange agrees on, and the last one every process made:
        # (position or None, detail), formatted only for messages.
        self._pending: tuple[Hashable, dict[str, Any]] | None = None
        self._last: tuple[Hashable, dict[str, Any]] | None = None
        self.current: Signature | None = None  # the collective being dispatched
        # Its agreement, until the backend makes it (see settle, settle_with).
        self._deferred: _Agreement | None = None
        self._shielded = False  # whether collective() shields the dispatch itself
        self._busy = False
        self._waiters: collections.deque[anyio.Event] = collections.deque()
        self._positions: dict[Hashable, int] = {}
        self._number = 0  # exchanges so far
        self._run_ended = True  # no run in progress
        # The details of the exchange that ended the current run on every process.
        self._ended: list[dict[str, Any]] | None = None
        # The error raised for them, raised again (the same object) by a collective
        # queued behind that exchange: the run's one failure, not a second one.
        self._ended_error: BaseException | None = None
        self._running = False  # between begin_run and end_run
        self._broken: str | None = None
        self._departed: list[int] = []  # ranks seen exiting: no exchange can complete
        self._freed = False
        self._noted_peers: set[int] = set()  # peers that sent exit notes (at exit)
        self._abandoned: list[Any] = []  # posted requests never completed (see abandon)
        self._serial = next(_serials)
        self._fields_cache: dict[Signature, _Fields] = {}
        self._fields_by_id: dict[int, tuple[Signature, _Fields]] = {}
        # Every exchange moves one row per process: the header, then room for a small
        # payload (a small all_reduce's partial result travels with its agreement). The
        # rows are reused: what an exchange received is read before the next one starts.
        self._send = bytearray(_ROW_BYTES)
        self._header = memoryview(self._send)[:HEADER_BYTES]
        self._recv = self._send if self.size == 1 else bytearray(_ROW_BYTES * self.size)
        rows = np.frombuffer(self._recv, np.uint8).reshape(self.size, _ROW_BYTES)
        self._parts = rows[:, HEADER_BYTES:]
        self._heads = rows.view(np.int64)[:, :HEADER_WORDS]
        self._row_starts = range(0, _ROW_BYTES * self.size, _ROW_BYTES)
        self._in_flight = False  # an exchange was posted and has not completed
        self._spun = False  # the posted exchange completed within _spin
        self._gather: Any = None
        if self.size > 1:
            # A persistent allgather costs less to start than an Iallgather to post
            # (creating it is collective, like this constructor).
            with contextlib.suppress(NotImplementedError):
                self._gather = self._ctl.Allgather_init(self._send, self._recv)
        self._owed_refusals = 0  # refused concurrent runs, told at the run's end
        self._to(Event.ARRIVED)
        _exit.register(self)

    @staticmethod
    def process_ends(error: BaseException | None, *, exiting: bool) -> None:
        """Before any group exists: an uncaught ``error``, or the exit (see ``_exit``)."""
        _exit.process_ends(error, exiting=exiting)

    def wrap(self, local: Backend) -> Backend:
        """An :class:`~asyncreplica_mpi.MPIBackend`: ``local`` combined across processes.

        The group holds the backend weakly: once the strategy (which holds it) is gone
        on every process, the next strategy created on the same communicator frees
        this group's communicators (see :func:`_release_dropped`).
        """
        from ._backend import MPIBackend

        backend = MPIBackend(local, self)
        self._holder = weakref.ref(backend)
        return backend

    # -- the lifecycle (see _lifecycle) --------------------------------------------------

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

    def is_closed(self) -> bool:
        """Whether this group said goodbye, was released, or MPI was finalized."""
        return self._state is State.CLOSED or self._state is State.FINALIZED

    def closed(self, *, finalized: bool) -> None:
        """MPI was finalized without a goodbye (it was never initialised for the hook)."""
        self._to(Event.FINALIZE if finalized else Event.EXIT)

    # -- look-ups -----------------------------------------------------------------------

    @property
    def data_comm(self) -> Any:
        """The communicator that carries collectives' data."""
        return self._data

    def process_of(self, replica: int) -> int:
        """The rank of the process that runs global replica ``replica``."""
        for rank in range(self.size - 1, -1, -1):
            if replica >= self.offsets[rank] and self.replica_counts[rank]:
                return rank
        raise ValueError(f"no process runs replica {replica}")

    # -- the exchange -------------------------------------------------------------------

    def _post(self, status: Status, fp: int, payload: Sequence[np.ndarray[Any, Any]] = ()) -> Any:
        """Start this process's part of the next exchange; its request (None alone).

        ``payload``: arrays whose bytes (C order) follow the header, back to back.
        """
        number = self._number
        self._number = number + 1
        send = self._send
        HEADER.pack_into(send, 0, MAGIC, status, fp, number)
        start = HEADER_BYTES
        for array in payload:
            data = array.tobytes()
            end = start + len(data)
            send[start:end] = data  # the same length: the row never resizes
            start = end
        if self.size == 1:
            return None  # nobody to disagree with
        self._in_flight = True
        gather = self._gather
        if gather is None:
            return self._ctl.Iallgather(send, self._recv)
        gather.Start()
        return gather

    def _unanimous(self) -> bool:
        """After the exchange completed: whether every process sent this one's header."""
        self._in_flight = False
        if self.size > 16:
            heads = self._heads
            return bool((heads == heads[0]).all())
        recv, mine = self._recv, self._header
        for start in self._row_starts:  # noqa: SIM110 -- a loop costs less than all()
            if not recv.startswith(mine, start):
                return False
        return True

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
        }
        payload = np.frombuffer(json.dumps(detail).encode(), np.uint8)
        lengths = np.empty(self.size, np.int64)
        yield self._ctl.Iallgather(np.array([payload.size], np.int64), lengths)
        counts = [int(n) for n in lengths]
        displs = [sum(counts[:r]) for r in range(self.size)]
        buf = np.empty(sum(counts), np.uint8)
        yield self._ctl.Iallgatherv(payload, [buf, counts, displs, MPI.BYTE])
        return [
            json.loads(bytes(buf[d : d + n]).decode()) for d, n in zip(displs, counts, strict=True)
        ]

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
        except BaseException:
            # Abandoned while posted (a timeout, or an interruption no shield stops):
            # the processes are out of step.
            self._break("a cross-process exchange was abandoned")
            raise

    # -- waiting: notes from peers, stall warnings ------------------------------------

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
        try:
            while True:
                self._read_notes()
                if test():
                    break
                waited = time.perf_counter() - start
                while due and waited >= due[0][0]:
                    _, what = due.pop(0)
                    assert key is not None
                    if what == "announce":
                        announced = True
                        self._tell_peers({"kind": "waiting", "number": key})
                        self._tell_other_groups(True)
                    else:
                        warned = True
                        _logger.warning(self._stall_message(key, waited, data=data))
                until = due[0][0] - waited if due else None
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

    def _tell_other_groups(self, waiting: bool) -> None:
        """Tell the peers of this process's other groups that it waits here (or no more)."""
        note = {"kind": "elsewhere", "label": self.label(), "what": self._waiting_what()}
        if not waiting:
            note = {"kind": "elsewhere done"}
        for group in _exit._groups:
            if group is not self and group.size > 1 and group._state in _LIVE:
                with contextlib.suppress(Exception):  # best effort: it only names a place
                    group._tell_peers(note)

    def _waiting_what(self) -> str:
        return _exchange_text(self._pending)

    def _stall_message(self, exchange: int, waited: float, *, data: bool = False) -> str:
        """The warning for an exchange that has waited ``stall_warning_seconds``.

        ``exchange`` is the key of the wait (``-1 - number`` for a data transfer).
        """
        seen = self._seen_waiting.get(exchange, set())
        missing = [r for r in range(self.size) if r != self.rank and r not in seen]
        waiting = [r for r in range(self.size) if r == self.rank or r in seen]
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

    def _process(self, rank: int) -> str:
        """``process 1 (replicas 2, 3)``."""
        first, count = self.offsets[rank], self.replica_counts[rank]
        ids = (
            ", ".join(str(i) for i in range(first, first + count))
            if count <= 2
            else (f"{first}-{first + count - 1}")
        )
        return f"process {rank} (replica{'' if count == 1 else 's'} {ids or 'none'})"

    def _tell_peers(self, note: dict[str, Any]) -> None:
        """Send ``note`` (JSON) to every other process on the side communicator."""
        payload = np.frombuffer(json.dumps({**note, "rank": self.rank}).encode(), np.uint8)
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
                note = json.loads(bytes(buf).decode())
            except ValueError:
                continue
            kind = note.get("kind")
            if kind == "waiting":
                if len(self._seen_waiting) > 64:
                    self._seen_waiting = {
                        k: v for k, v in self._seen_waiting.items() if k >= self._number - 2
                    }
                self._seen_waiting.setdefault(int(note["number"]), set()).add(source)
            elif kind == "failed":
                self._failed_peers.add(source)  # it waits for no ack from us at exit
                if self._peer_failure is None:
                    self._peer_failure = note
            elif kind == "ack":
                self._acks.add(source)
            elif kind == "elsewhere":
                self._elsewhere[source] = (str(note.get("label")), str(note.get("what")))
            elif kind == "elsewhere done":
                self._elsewhere.pop(source, None)
        failure = self._peer_failure
        if failure is not None and not self._failed_here:
            self._raise_peer_failure(failure)

    def _raise_peer_failure(self, failure: dict[str, Any]) -> NoReturn:
        rank = int(failure["rank"])
        timeout = failure.get("timeout")
        self._break(
            f"process {rank} timed out waiting for the others"
            if timeout is not None
            else f"process {rank} failed after the processes agreed on a collective"
        )
        self._run_ended = True
        what = failure.get("what") or "a collective"
        first = (
            f"Process {rank} failed while moving the data of {what}, after every process "
            "had agreed on it, so this collective cannot complete on any process."
        )
        if timeout is not None:
            first = (
                f"Process {rank} timed out after {timeout:g} s waiting for the other "
                f"processes at {what}, so no collective can complete on any process any more."
            )
        lines = [
            first,
            "",
            f"  * {self._process(rank)} failed: {failure.get('error') or 'an exception'}",
        ]
        for r in range(self.size):
            if r != rank and timeout is None:
                lines.append(f"  * {self._process(r)} waited for its data")
        lines += [
            "",
            (
                "A process that times out leaves the processes out of step: the job cannot "
                "continue (the exit hook ends the MPI job)."
                if timeout is not None
                else "A process that fails after an agreement leaves the others inside the "
                "data transfer: the processes are now out of step and the job cannot "
                "continue (the exit hook ends the MPI job)."
            ),
            "Look at the failing process's own error (it is raised there, with its traceback).",
        ]
        current = self.current
        failed = range(self.offsets[rank], self.offsets[rank] + self.replica_counts[rank])
        waiting = (
            {g: current for g in range(self.num_replicas) if g not in failed}
            if current is not None
            else {}
        )
        raise ReplicaExitedError(
            self.offsets[rank],
            int(failure.get("position", 0) or 0),
            waiting,
            exited_count=0,
            exited_last=None,
            name=failure.get("name"),
            message="\n".join(lines),
        )

    def failed_after_agreement(self, error: BaseException) -> None:
        """This process failed after an agreement: tell the peers, who wait for its data.

        The processes are out of step from here on: no further exchange is made (the
        run's end is not told with one), and the exit hook ends the job once every
        peer has reported the failure.
        """
        if self._broken is not None or self.size == 1:
            return
        self._break("this process failed after the processes agreed on a collective")
        self._failed_here = True
        self._run_ended = True
        self._tell_peers(self._failure_note(error))

    def _failure_note(self, error: BaseException) -> dict[str, Any]:
        """The note that tells the peers this process failed at its pending exchange."""
        position = None if self._pending is None else self._pending[0]
        return {
            "kind": "failed",
            "error": describe_exception(error),
            "what": _exchange_text(self._pending),
            "position": position
            if isinstance(position, int)
            else (position[1] if isinstance(position, tuple) else 0),
            "name": position[0] if isinstance(position, tuple) else None,
        }

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

    def _start(
        self,
        status: Status,
        detail: dict[str, Any],
        fp: int,
        payload: Sequence[np.ndarray[Any, Any]],
        position: Hashable,
    ) -> Any:
        """Check that an exchange may be made, and post it; its request (None alone)."""
        if self._state is State.FINALIZED:
            # MPI.Finalize() ran (its hook moved every group here): an MPI call now
            # would make MPICH abort the process instead of raising.
            self._refuse(Refusal.FINALIZED)
        if self._departed or self._broken is not None:
            self._check_usable()
        if self._ended is not None and self._running and status is Status.COLLECTIVE:
            # This run already ended on every process, at an exchange they all saw
            # differ: no peer posts another exchange in it, so neither may this process
            # (another replica's collective, queued behind that exchange, would pair
            # with the peers' next run and leave the processes out of step).
            if self._ended_error is not None:
                _consequence()
                raise self._ended_error
            self._raise_for(self._ended)
        self._pending = (position, detail)
        if not self._number & _DRAIN_EVERY:
            # A process that never waits long never reads its peers' notes there: read
            # them now and then, so that they do not pile up in MPI's queues.
            self._read_notes()
        return self._post(status, fp, payload)

    def _agreed_at_once(self, request: Any) -> bool:
        """Whether a posted exchange completed within :func:`_spin`, every header equal.

        The fast path: nothing is awaited, so nothing needs a shield. False when it
        has not completed yet, or completed with headers that differ: the caller then
        awaits :meth:`_complete`, which finishes either.
        """
        if _spin(request.Test):
            self._spun = True
            if self._unanimous():
                self._last = self._pending
                return True
        else:
            self._spun = False
        return False

    async def _agree(
        self,
        status: Status,
        fields: dict[str, Any] | None,
        detail: dict[str, Any],
        fp: int,
        payload: Sequence[np.ndarray[Any, Any]] = (),
        position: Hashable = None,
    ) -> list[dict[str, Any]] | None:
        """One exchange, bounded by the timeout; every process's detail if they differ.

        ``position`` (when not None) completes ``fields`` for the details. The waits
        are shielded; the caller shields what must follow the agreement.
        """
        request = self._start(status, detail, fp, payload, position)
        if request is None or self._agreed_at_once(request):
            return None
        return await self._complete(request, status, fields, detail, position)

    async def _complete(
        self,
        request: Any,
        status: Status,
        fields: dict[str, Any] | None,
        detail: dict[str, Any],
        position: Hashable,
    ) -> list[dict[str, Any]] | None:
        """The rest of an exchange that :meth:`_agreed_at_once` did not finish.

        Its timeout counts from here (at most 20 µs after it was posted).
        """
        pending = self._pending
        deadline = None if self._limit is None else anyio.current_time() + self._limit
        try:
            if not self._spun:
                await self._wait(request, deadline)
                if self._unanimous():
                    self._last = pending
                    return None
            if position is not None and fields is not None:
                fields = {**fields, "position": key_text(position)}
                detail = {**detail, "key": _key_json(position)}
            details = await self._drive(self._details(status, fields, detail), deadline)
        except _Expired:
            self._timed_out(position, fields)
        # Every process sees the same details and raises: the run ends everywhere.
        self._run_ended = True
        if self._running:
            self._ended = details
        gone = [d["rank"] for d in details if Status(d["status"]) is Status.EXITED]
        if gone:
            self._departed = gone
            self._to(Event.PEER_EXITED)
        return details

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
        error = CollectiveTimeoutError(
            0,
            float(self._limit or 0),
            {},
            {},
            message=(
                f"{first}{what} within {self._limit:g} s (this is process {self.rank} of "
                f"{self.size}).\n\nA process that is alive but busy (I/O, a long "
                "computation) or stuck delays every other one. The processes are now out "
                "of step: the job cannot continue."
            ),
        )
        self._failed_here = True
        self._tell_peers({**self._failure_note(error), "timeout": self._limit})
        raise error from None

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
        refused = first_refusal(details)
        if refused is not None:
            name, text, *rest = refused["refused"]
            message = (
                f"{text}\n\n({self._process(int(refused['rank']))} refused this "
                "cross-replica operation, so every process raises this error.)"
            )
            if name == "CollectiveMismatchError":
                fields = [str(f) for f in rest[0]] if rest else []
                raise CollectiveMismatchError(
                    0, {}, fields, num_replicas=self.num_replicas, message=message
                )
            raise REFUSALS.get(name, ValueError)(message)
        failed = next((d for d in details if d.get("collective_error")), None)
        if failed is not None:
            # A process's own ledger found the error: every process raises it, with the
            # same attributes (global replica ids), and this process's message.
            raise self._global_error(failed["collective_error"], details)
        kind, message = outcome_message(details)
        signatures: dict[int, Signature] = {}
        key: Any = None
        for d in details:
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
            cycle = _cycle(details)
            if cycle is not None:
                raise cycle
            raise CollectiveMismatchError(
                position,
                signatures,
                differing_fields(details),
                num_replicas=self.num_replicas,
                name=name,
                message=message,
            )
        gone = [d for d in details if Status(d["status"]) is not Status.COLLECTIVE]
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

    def _global_error(
        self, fields: dict[str, Any], details: list[dict[str, Any]], message: str | None = None
    ) -> CollectiveMismatchError | ReplicaExitedError:
        """A process's collective error (:func:`error_fields`), for every process.

        Completed by every process's waiting replicas: the same attributes everywhere.
        """
        waiting: dict[int, Signature] = {}
        for d in details:
            if Status(d["status"]) is Status.COLLECTIVE and d["fields"]:
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
        found = collective_error(error)
        fields = error_fields(error, check_call_sites=self.check_call_sites)
        if found is None or fields is None:
            return
        glob = self._global_error(fields, details, message="")
        if isinstance(found, CollectiveMismatchError) and isinstance(glob, CollectiveMismatchError):
            found.signatures = glob.signatures
        elif isinstance(found, ReplicaExitedError) and isinstance(glob, ReplicaExitedError):
            found.waiting = glob.waiting

    async def refuse(self, error: Exception) -> NoReturn:
        """Take part in the agreement with a refusal: every process raises ``error``'s class."""
        fields = refusal_fields(error)
        detail = {
            "describe": f"a refused cross-replica operation ({describe_exception(error)})",
            "refused": [type(error).__name__, str(error), list(getattr(error, "fields", []))],
        }
        await self._acquire()
        try:
            with anyio.CancelScope(shield=True):
                details = await self._agree(Status.COLLECTIVE, fields, detail, fingerprint(fields))
        finally:
            self._release()
        if details is not None:
            self._raise_for(details)
        raise error

    def _fields(self, signature: Signature) -> _Fields:
        """What to agree on for ``signature``, whatever its position (cached).

        Returns:
            The fields (with the first position's text), their fingerprint (see
            :func:`at_position` for the position's), the detail shown on a mismatch,
            whether dispatching it moves no data beyond the agreement exchange (a
            barrier, a small dense all_reduce), and whether it is a merge_call.
        """
        # Signatures are interned, so the same object comes back at every round: look it
        # up by identity (hashing a signature hashes its whole call path, every time).
        # The entry holds the signature, so its id is not reused while it is cached.
        entry = self._fields_by_id.get(id(signature))
        if entry is not None and entry[0] is signature:
            return entry[1]
        cached = self._fields_cache.get(signature)
        if cached is not None:
            self._remember(signature, cached)
            return cached
        if len(self._fields_cache) > _MAX_CACHED:
            self._fields_cache.clear()
        fields = signature_fields(signature, 0, check_call_sites=self.check_call_sites)
        site = signature.call_site
        detail = {
            "describe": signature.describe(),
            "site": None if site is None else f"{site.filename}:{site.lineno} in {site.function}",
        }
        cached = self._fields_cache[signature] = (
            fields,
            fingerprint(fields),
            detail,
            _light(signature),
            signature.kind is CollectiveKind.MERGE_CALL,
        )
        self._remember(signature, cached)
        return cached

    def _remember(self, signature: Signature, fields: _Fields) -> None:
        if len(self._fields_by_id) > _MAX_CACHED:
            self._fields_by_id.clear()
        self._fields_by_id[id(signature)] = (signature, fields)

    def _at(self, base: int, position: Hashable) -> int:
        """``base`` (a signature's fingerprint) at ``position``."""
        if type(position) is int:
            return at_position(base, position)
        code = self._positions.get(position)
        if code is None:
            if len(self._positions) > _MAX_CACHED:
                self._positions.clear()
            code = self._positions[position] = position_code(position)
        return at_position(base, code)

    # -- what the runtime calls ----------------------------------------------------------

    def begin_run(self) -> None:
        """A run starts: it will end with one final exchange (or an earlier one).

        Raises:
            ReplicaContextError: A run of this group is in progress: two runs at once
                would interleave their collectives differently on each process.
        """
        if self._departed or self._broken is not None:
            self._check_usable()
        self._to(Event.BEGIN_RUN)
        self._running = True
        self._run_ended = False
        self._ended = None
        self._ended_error = None

    # A FIFO lock without checkpoints when nobody contends (anyio.Lock yields twice):
    # exchanges and their data must leave every process in the same order.

    async def _acquire(self) -> None:
        if not self._busy:
            self._busy = True
            return
        turn = anyio.Event()
        self._waiters.append(turn)
        try:
            await turn.wait()  # the releaser hands the lock over
        except BaseException:
            if turn.is_set():
                self._release()
            else:
                self._waiters.remove(turn)
            raise

    def _release(self) -> None:
        if self._waiters:
            self._waiters.popleft().set()
        else:
            self._busy = False

    async def collective(
        self,
        signature: Signature,
        position: Hashable,
        local: Callable[[], Awaitable[_T]],
        *,
        timeout: float | None = None,  # noqa: ASYNC109 -- applied to each wait inside
    ) -> _T:
        """Agree on ``signature`` at ``position`` with every process, then run ``local``.

        Once a process has posted its part of an MPI collective it must finish it, or
        the processes fall out of step: the exchange and the data movement are shielded
        from cancellation. A collective that moves nothing beyond its agreement (a
        barrier, a small all_reduce whose data travels with it) yields to the loop only
        inside the exchange, whose waits shield themselves; any other dispatch is
        shielded whole, as the backend's data movement follows the agreement.
        """
        fields, base, detail, light, merge = self._fields(signature)
        fp = at_position(base, position) if type(position) is int else self._at(base, position)
        if self._busy:
            await self._acquire()
        else:
            self._busy = True
        self._limit = self.timeout if timeout is None else timeout
        if merge:
            try:
                await self._agree_or_raise((fields, detail, fp, position))
            finally:
                self._limit = self.timeout
                self._release()
            # merge_fn runs unlocked: its strategy.reduce calls take the lock themselves.
            return await local()
        try:
            # The backend settles the agreement before it moves data (a small
            # all_reduce sends its partial result along with it).
            self._deferred = (fields, detail, fp, position)
            self.current = signature
            self._agreed = False
            try:
                if light:
                    try:
                        result = await local()
                        if self._deferred is not None:
                            await self.settle()  # local() moved nothing
                    except BaseException as exc:
                        # A light collective's data may still follow its agreement (an
                        # integer MEAN travels as two halves, twice its size).
                        if self._agreed:
                            self.failed_after_agreement(exc)
                        raise
                else:
                    with anyio.CancelScope(shield=True):
                        self._shielded = True
                        try:
                            result = await local()
                            await self.settle()  # if local() moved nothing
                        except BaseException as exc:
                            if self._agreed:  # the peers wait for this process's data
                                self.failed_after_agreement(exc)
                            raise
            finally:
                self.current = None
                self._deferred = None
                self._shielded = False
                self._agreed = False
        finally:
            self._limit = self.timeout
            self._release()
        return result

    @contextlib.contextmanager
    def call_timeout(self, seconds: float | None) -> Generator[None, None, None]:
        """Bound each cross-replica operation (:meth:`cross`) made inside by ``seconds``.

        A context variable: only the task that entered it (and tasks it starts) sees it.
        """
        token = _CALL_TIMEOUT.set(seconds)
        try:
            yield
        finally:
            _CALL_TIMEOUT.reset(token)

    def committed(self) -> contextlib.AbstractContextManager[Any]:
        """A shield for what follows an agreement (the data movement), where needed.

        The backend enters it before it settles an agreement that data movement
        follows; it shields nothing (costs nothing) when the dispatch is shielded
        whole already.
        """
        return _NO_SHIELD if self._shielded else anyio.CancelScope(shield=True)

    async def _agree_or_raise(
        self, agreement: _Agreement, payload: Sequence[np.ndarray[Any, Any]] = ()
    ) -> None:
        fields, detail, fp, position = agreement
        details = await self._agree(Status.COLLECTIVE, fields, detail, fp, payload, position)
        if details is not None:
            self._raise_for(details)

    async def settle(self) -> None:
        """Make the deferred agreement of the current collective now, if not made yet."""
        deferred = self._deferred
        if deferred is not None:
            self._deferred = None
            await self._agree_or_raise(deferred)
            self._agreed = True
            self._agreed_at = time.perf_counter()

    async def refuse_collective(self, error: Exception) -> NoReturn:
        """The current collective cannot be dispatched here: agree on it first, then raise.

        Its agreement compares every field of the match table (sparsity included), so
        where the processes called different collectives every process raises that
        mismatch; where they agree, every process refuses alike with ``error``.
        """
        deferred = self._deferred
        if deferred is not None:
            self._deferred = None
            await self._agree_or_raise(deferred)
        raise error

    async def settle_with(
        self, arrays: Sequence[np.ndarray[Any, Any]]
    ) -> np.ndarray[Any, Any] | None:
        """Agree and exchange a small payload at once: every process's bytes, by rank.

        The payload is the bytes of ``arrays`` (C order), back to back. Returns a
        ``(processes, nbytes)`` uint8 view of the group's receive buffer, valid until
        the next exchange: read it before awaiting anything, and hand out copies.

        Returns None (having made no exchange) when there is no deferred agreement or
        the payload does not fit: the caller settles and moves its data as usual.
        """
        deferred = self._deferred
        nbytes = 0
        for array in arrays:
            nbytes += array.nbytes
        if deferred is None or nbytes > INLINE_BYTES:
            return None
        self._deferred = None
        fields, detail, fp, position = deferred
        # _agree inlined: the common case (every process there within the spin, in
        # agreement) creates and awaits no coroutine.
        request = self._start(Status.COLLECTIVE, detail, fp, arrays, position)
        if request is not None and not self._agreed_at_once(request):
            details = await self._complete(request, Status.COLLECTIVE, fields, detail, position)
            if details is not None:
                self._raise_for(details)
        return self._parts[:, :nbytes]

    async def cross(self, fields: dict[str, Any], local: Callable[[], Awaitable[_T]]) -> _T:
        """A cross-replica operation (``Strategy.reduce``, ``gather``): agree, then run."""
        detail = {"describe": f"{fields['kind']}({fields['op'] or ''}) on {fields['value']}"}
        await self._acquire()
        limit = _CALL_TIMEOUT.get()
        self._limit = self.timeout if limit is None else limit
        try:
            with anyio.CancelScope(shield=True):
                self._shielded = True
                try:
                    details = await self._agree(
                        Status.COLLECTIVE, fields, detail, fingerprint(fields)
                    )
                    if details is not None:
                        self._raise_for(details)
                    try:
                        result = await local()
                    except BaseException as exc:
                        self.failed_after_agreement(exc)  # the peers wait for its data
                        raise
                finally:
                    self._shielded = False
        finally:
            self._limit = self.timeout
            self._release()
        return result

    async def end_run(self, error: BaseException | None) -> None:
        """The local run ended: tell the other processes (the run's last exchange).

        Raises:
            ReplicaExitedError: This process finished, but another failed or issued
                more collectives.
        """
        if not self._running:
            return  # not this group's run (begin_run refused it)
        details = None
        try:
            if (
                self._run_ended
                or self._broken is not None
                or self._departed
                or self._state is State.FINALIZED
            ):
                self._run_ended = True
            else:
                status = Status.FINISHED if error is None else Status.FAILED
                detail: dict[str, Any] = {"error": None}
                if error is not None:
                    detail["error"] = describe_exception(error)
                    detail["collective_error"] = error_fields(
                        error, check_call_sites=self.check_call_sites
                    )
                await self._acquire()
                try:
                    details = await self._agree(status, None, detail, 0)
                finally:
                    self._release()
                self._run_ended = True
            await self._tell_refusals()
        finally:
            self._running = False
            if self._state is State.RUNNING:
                self._to(Event.END_RUN)
        if details is not None and error is None:
            self._raise_for(details)
        if details is not None and error is not None:
            self._complete_error(error, details)

    async def _tell_refusals(self) -> None:
        """One exchange per run refused while this one ran (see :meth:`_refuse`).

        Each says FAILED with the refusal: where every process refused the same run,
        the exchanges agree and nothing happens; where a process ran it instead (its
        runs did not overlap), that run meets this exchange and fails on every
        process in step, naming the refusal.
        """
        while (
            self._owed_refusals
            and self._broken is None
            and not self._departed
            and self._state is not State.FINALIZED
        ):
            self._owed_refusals -= 1
            detail = {
                "error": (
                    "ReplicaContextError: it refused a concurrent run of this strategy "
                    "(another run was in progress there)"
                )
            }
            await self._acquire()
            try:
                await self._agree(Status.FAILED, None, detail, 0)
            finally:
                self._release()

    def trace_session(self) -> TraceMerger:
        """Start a merged trace (collective: every process calls it)."""
        return TraceMerger(self)


# A per-call timeout of the cross-replica operations made inside call_timeout().
_CALL_TIMEOUT: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "asyncreplica_mpi_call_timeout", default=None
)


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


def _exchange_text(pending: tuple[Hashable, dict[str, Any]] | None) -> str:
    """``the 2nd collective (position 1): all_reduce(SUM) on float64[3] at f.py:9 in g``."""
    if pending is None:
        return "their exchange"
    position, detail = pending
    describe = detail.get("describe")
    if describe is None:
        return "the end of their run"
    where = f" at {detail['site']}" if detail.get("site") else ""
    if position is None:
        return f"a cross-replica {describe}"
    return f"the {key_text(position)}: {describe}{where}"


def _key_json(position: Hashable) -> Any:
    """A ledger key as JSON: an index, or ``[name, occurrence]``."""
    if isinstance(position, tuple) and len(position) == 2:
        return [str(position[0]), int(position[1])]
    return position if isinstance(position, int) else None


def _light(signature: Signature) -> bool:
    """Whether dispatching ``signature`` moves no data beyond its agreement exchange."""
    kind = signature.kind
    if kind is CollectiveKind.BARRIER:
        return True
    if kind is not CollectiveKind.ALL_REDUCE and kind is not CollectiveKind.REDUCE_SCATTER:
        return False
    nbytes = 0
    for spec in signature.leaves:
        if spec.sparse:
            return False
        try:
            itemsize = np.dtype(spec.dtype).itemsize
        except TypeError:
            return False
        nbytes += int(np.prod(spec.shape, dtype=np.int64)) * itemsize
    return nbytes <= INLINE_BYTES
