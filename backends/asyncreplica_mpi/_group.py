"""The MPI process group: agreement between processes, polled from the event loop.

See :mod:`._protocol` for the exchange itself. This module owns the communicators
(two duplicates of the user's: one for agreement, one for data, so that neither
ever shares traffic with the user's own) and the exchanges made on them. The waits
(polling non-blocking requests from the event loop, the peers' notes, the stall
warnings and timeouts) live in :mod:`._waiting`; the errors every process builds
alike from an exchange's details, and the refusals of the lifecycle, in
:mod:`._failures` (both are bases of :class:`MPIProcessGroup`). Creating a group's
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
import functools
import struct
import threading
import time
import weakref
from collections.abc import (
    Awaitable,
    Callable,
    Coroutine,
    Generator,
    Hashable,
    Mapping,
    Sequence,
)
from typing import Any, NoReturn, TypeVar

import anyio
import anyio.lowlevel
import anyio.to_thread
import numpy as np

from asyncreplica import BackendError, CollectiveError, ReplicaExitedError
from asyncreplica.abc import (
    Backend,
    CollectiveKind,
    LeafSpec,
    ProcessGroup,
    ReduceOp,
    Signature,
    structure_message,
    treedef_key,
    treedef_str,
)

from . import _exit
from ._arrival import _arrive, _created, agree_options, comm_key, interrupt_swallowed
from ._failures import _consequence, describe_failure
from ._lifecycle import Event, Refusal, State
from ._protocol import (
    HEADER,
    HEADER_BYTES,
    HEADER_WORDS,
    MAGIC,
    Status,
    at_position,
    cross_fields,
    describe_exception,
    error_fields,
    fingerprint,
    issued_refusal,
    key_text,
    position_code,
    refusal_fields,
    refused_detail,
    signature_fields,
    timeout_fields,
)
from ._trace import TraceMerger
from ._waiting import (
    _BELL_TAG,
    Waiting,
    _Expired,
    _spin,
    peers_waiting_on,
    tell_creating,
    thread_multiple,
)

__all__ = [
    "BATCH_FP",
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
# After the payload, one int64: the floating-point errors this process's own combine of
# its replicas met (the backend's bits, see asyncreplica_mpi._backend._FPLog), carried by
# the agreement every process makes anyway, so that every process acts on them alike.
# Not part of the header: processes whose bits differ still agree.
_FP_AT = HEADER_BYTES + INLINE_BYTES
_FP_SLOT = struct.Struct("=q")
_ROW_BYTES = _FP_AT + _FP_SLOT.size  # one process's part of an exchange

_T = TypeVar("_T")

_DRAIN_EVERY = 1023  # read the notes at every 1024th exchange (a mask)

# The per-signature and per-position caches are cleared past this many entries.
_MAX_CACHED = 4096


_serials = iter(range(1 << 62))


# What a collective agrees on: its fields (with the first position's text), the detail
# shown on a mismatch, its fingerprint at its position, and the position.
_Agreement = tuple[dict[str, Any], dict[str, Any], int, Hashable]

# What :meth:`MPIProcessGroup._fields` returns for a signature (see there).
_Fields = tuple[dict[str, Any], int, dict[str, Any], bool, bool]

_NO_SHIELD = contextlib.nullcontext()


class MPIProcessGroup(Waiting, ProcessGroup):
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

    @staticmethod
    def tell_refusal(
        communicator: Any,
        error: BaseException,
        *,
        timeout: float | None = None,
        stall_warning_seconds: float | None = None,
    ) -> None:
        """This process's constructor refused its own arguments (``error``): tell the others.

        Creating a strategy is collective: the others wait in their constructors for this
        process to create its own. It arrives with a refusal instead (see
        ``_arrival._arrive``): every process leaves the creation in step, the others
        raising ``error``'s class naming this process and its error; the caller raises
        ``error`` itself. Nothing is told where MPI is not in use, or ``communicator`` is
        not a communicator (the others cannot be known).
        """
        from mpi4py import MPI

        base = MPI.COMM_WORLD if communicator is None else communicator
        if not isinstance(base, MPI.Intracomm) or not MPI.Is_initialized():
            return
        if MPI.Is_finalized() or base == MPI.COMM_NULL or base.Get_size() == 1:
            return
        _exit.install_hooks(finalize=True)
        _arrive(base, 0, timeout, stall_warning_seconds, refusal=error)

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
            raise _finalized_before_creation(MPI)
        _exit.install_hooks(finalize=True)
        self._base = base
        # The key of the user's communicator, which the program may free (see comm_key).
        self._base_key = comm_key(base)
        self._base_serial = _created.get(self._base_key, (base, 0))[1]
        self._holder: Callable[[], Any] | None = None  # the backend (see wrap)
        # Every process announces itself before the first collective call, so that a
        # process that never creates its strategy is named (and bounded by timeout)
        # instead of leaving the others inside MPI_Comm_dup for ever.
        try:
            counts = _arrive(
                base,
                local_replicas,
                timeout,
                stall_warning_seconds,
                functools.partial(
                    tell_creating, f"MultiWorkerMirroredStrategy #{self._base_serial + 1}"
                ),
                functools.partial(peers_waiting_on, base),
            )
        except BaseException:
            self._to(Event.ARRIVAL_FAILED)
            raise
        _exit.release_dropped(base)
        _exit.release_freed()  # and those on communicators the program freed
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
        # Each peer's latest wait at an exchange of this group: (its number, what it is).
        self._peer_at: dict[int, tuple[int, str]] = {}
        self._peer_failure: dict[str, Any] | None = None
        self._peer_error: CollectiveError | None = None  # its error (see _raise_peer_failure)
        # A peer's failed run's end or goodbye, waiting for this process's exchange of
        # that number (its "ending" note, see watch_peers), and the error that stopped
        # this process's run for one (see _stop_run).
        self._endings: dict[int, dict[str, Any]] = {}
        self._stopped: ReplicaExitedError | None = None
        # Where this process's replicas wait while one of them keeps a collective from
        # crossing (see local_waits), what the peers were told of it, and each peer's
        # such note: (its exchange number, key, replicas that arrived).
        self._local_waits: Mapping[Hashable, tuple[Signature, tuple[int, ...]]] = {}
        self._told_arrival: tuple[int, Any, tuple[int, ...]] | None = None
        self._partial: dict[int, tuple[int, Any, list[int]]] = {}
        self._failed_here = False  # this process failed after an agreement
        self._sends: list[Any] = []
        # A receive of any peer's bell, always posted (see _park).
        self._bell_buf = np.zeros(1, np.int64)
        self._bell: Any = self._side.Irecv(self._bell_buf, source=MPI.ANY_SOURCE, tag=_BELL_TAG)
        self._agreed = False  # the current collective's agreement is made
        self._agreed_at = 0.0  # when (perf_counter), for the data transfer's timeout
        self._acks: set[int] = set()  # peers that reported our failure (at exit)
        self._told_peers: set[int] = set()  # peers that read our failure (a "told" note)
        self._acked = False  # this process acknowledged a peer's failure (at exit)
        self._failed_peers: set[int] = set()  # peers that told us they failed
        # Peers that wait on another group (strategy): (its label, where), by rank.
        self._elsewhere: dict[int, tuple[str, str]] = {}
        # Those of them whose wait blocks their process (a trace merge): its exchange number.
        self._blocked_elsewhere: dict[int, int] = {}
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
        # The strategy's calls that cross processes (run, the cross-replica operations)
        # entered so far, sent in every exchange's header (see call_begins), and the
        # name of the latest (for the message when processes are out of step).
        self._calls = 0
        self._call_name = ""
        self._run_ended = True  # no run in progress
        # The details of the exchange that ended the current run on every process.
        self._ended: list[dict[str, Any]] | None = None
        # The error raised for them, raised again (the same object) by a collective
        # queued behind that exchange: the run's one failure, not a second one.
        self._ended_error: BaseException | None = None
        self._running = False  # between begin_run and end_run
        self._run_thread: threading.Thread | None = None
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
        self._fp_out = 0  # the next exchange's floating-point error bits (see settle)
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
        group, call = _CALL.get()
        call = call if group is self._serial else self._calls
        HEADER.pack_into(send, 0, MAGIC, status, fp, call, number)
        _FP_SLOT.pack_into(send, _FP_AT, self._fp_out)
        self._fp_out = 0  # for this exchange only
        start = HEADER_BYTES
        for array in payload:
            data = array.tobytes()
            end = start + len(data)
            send[start:end] = data  # the same length: the row never resizes
            start = end
        if self.size == 1:
            return None  # nobody to disagree with
        # Recorded before it starts: a signal's exception (Ctrl-C outside asyncio's
        # runner) may land anywhere, and the next exchange must not start this
        # persistent request again (see _start and end_run).
        self._in_flight = True
        gather = self._gather
        if gather is None:
            return self._ctl.Iallgather(send, self._recv)
        gather.Start()
        return gather

    def fp_met(self) -> int:
        """The floating-point error bits every process sent with the last exchange, OR-ed.

        The same on every process once an agreement completed (read it before the next
        exchange on this group: the backend's data moves on its own communicator).
        """
        bits = 0
        recv = self._recv
        for start in self._row_starts:
            bits |= _FP_SLOT.unpack_from(recv, start + _FP_AT)[0]
        return int(bits)

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
        if self._in_flight:
            # The last exchange was posted and never waited for (an exception landed
            # in between): its request may still be active.
            self._break("an exchange was interrupted")
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
                if status is Status.FAILED:
                    self._tell_ending(status)  # a peer at no collective makes it (watch_peers)
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
            # Their exit notes (see _exit.goodbye_all), received before MPI_Finalize.
            self._noted_peers.update(
                int(d["rank"])
                for d in details
                if Status(d["status"]) is Status.EXITED and d.get("noted")
            )
            self._to(Event.PEER_EXITED)
        return details

    async def refuse(
        self,
        error: Exception,
        *,
        components: tuple[ReduceOp, tuple[int, ...] | None, Sequence[LeafSpec]] | None = None,
    ) -> NoReturn:
        """Take part in the agreement with a refusal: every process raises ``error``'s class.

        ``components`` (``Strategy.reduce``: see ``ProcessGroup.refuse``) travel with
        the refusal, as the processes that reduce send theirs, so that every process
        raises one process's own check of every replica's component.
        """
        fields = refusal_fields(error)
        detail: dict[str, Any] = {
            "describe": f"a refused cross-replica operation ({describe_exception(error)})",
            "refused": refused_detail(error, "cross-replica operation"),
        }
        if components is not None:
            op, axes, specs = components
            sent = cross_fields("reduce", op, axes, specs)
            # Unmasked along the reduced axes: a MAX or MIN refuses a component with no
            # elements there, and every process names every such replica (global ids),
            # as one process does (see components_error).
            sent["leaves"] = [[list(s.shape), s.dtype, s.sparse, s.array_type] for s in specs]
            detail["components"] = sent
        found = error_fields(error, check_call_sites=self.check_call_sites)
        if found is not None:
            # Its signatures (global ids) travel with it: every process raises it with
            # them, completed by the other processes' replicas, as one process's own
            # ledger error is (see _global_error).
            detail["refused_error"] = found
        await self._acquire()
        # A per-call timeout bounds this wait too, as it bounds the cross-replica
        # operation the others make (see cross).
        limit = _CALL_TIMEOUT.get()
        self._limit = self.timeout if limit is None else limit
        try:
            with anyio.CancelScope(shield=True):
                details = await self._agree(Status.COLLECTIVE, fields, detail, fingerprint(fields))
        finally:
            self._limit = self.timeout
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

    def call_begins(self, name: str) -> tuple[int, int, Any]:
        """The strategy enters ``name`` (``Strategy.run``, ``Strategy.reduce``, ...).

        Counted before its arguments are checked: every exchange carries the count, so
        a process that raised before its part of a call the others made (an error it
        alone found, caught by the program) is out of step at its next call, and every
        process raises that (see ``_failures._out_of_step``) instead of combining two
        different calls' values. Returns the token for :meth:`call_ends`.
        """
        self._calls += 1
        self._call_name = name
        # Its exchanges carry its number, whichever of its tasks makes them; reset when
        # it ends (a reduce in a merge_fn leaves its run's number to the run).
        token = _CALL.set((self._serial, self._calls))
        return self._calls, self._number, token

    def call_ends(self, token: object, *, raised: bool) -> None:
        """The call of ``token`` returned (or ``raised``).

        A call that returned without any exchange stayed in this process (a plain value
        reduced alone, on every process alike or on some only): it is not counted, so
        that a process may make such calls that the others do not. One that raised is
        counted, whatever it exchanged: the others may have made their part of it.
        """
        if not isinstance(token, tuple):
            return
        calls, number, reset = token
        with contextlib.suppress(ValueError):  # ended in another context than it began
            _CALL.reset(reset)
        if not raised and number == self._number and calls == self._calls:
            self._calls = calls - 1

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
        self._run_thread = threading.current_thread()
        self._run_ended = False
        self._ended = None
        self._ended_error = None
        self._stopped = None
        self._local_waits = {}
        self._told_arrival = None

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

    @contextlib.contextmanager
    def batch(self) -> Generator[None, None, None]:
        """The cross-replica operations made inside are one batch (``batch_reduce_to``).

        Each reduces its value alone (its own agreement), but acts on a floating-point
        error kind once per dtype in the batch, as one process's combine of the batch's
        values of one dtype does (see ``MPIBackend._raise_alike``). A context variable:
        only the task that entered it (and tasks it starts) sees it.
        """
        token = BATCH_FP.set({})
        try:
            yield
        finally:
            BATCH_FP.reset(token)

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

    async def settle(self, fp_bits: int = 0) -> None:
        """Make the deferred agreement of the current collective now, if not made yet.

        ``fp_bits``: the floating-point errors this process's own combine met, sent
        with the agreement (see :meth:`fp_met`).
        """
        deferred = self._deferred
        if deferred is not None:
            self._deferred = None
            self._fp_out = fp_bits
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
        self, arrays: Sequence[np.ndarray[Any, Any]], fp_bits: int = 0
    ) -> np.ndarray[Any, Any] | None:
        """Agree and exchange a small payload at once: every process's bytes, by rank.

        The payload is the bytes of ``arrays`` (C order), back to back. Returns a
        ``(processes, nbytes)`` uint8 view of the group's receive buffer, valid until
        the next exchange: read it before awaiting anything, and hand out copies.

        Returns None (having made no exchange) when there is no deferred agreement or
        the payload does not fit: the caller settles and moves its data as usual.
        ``fp_bits`` travel with it (see :meth:`settle`).
        """
        deferred = self._deferred
        nbytes = 0
        for array in arrays:
            nbytes += array.nbytes
        if deferred is None or nbytes > INLINE_BYTES:
            return None
        self._deferred = None
        fields, detail, fp, position = deferred
        self._fp_out = fp_bits
        # _agree inlined: the common case (every process there within the spin, in
        # agreement) creates and awaits no coroutine.
        request = self._start(Status.COLLECTIVE, detail, fp, arrays, position)
        if request is not None and not self._agreed_at_once(request):
            details = await self._complete(request, Status.COLLECTIVE, fields, detail, position)
            if details is not None:
                self._raise_for(details)
        return self._parts[:, :nbytes]

    def local_waits(self, waits: Mapping[Hashable, tuple[Signature, tuple[int, ...]]]) -> None:
        """Where this process's replicas wait (see :meth:`watch_peers`, which tells it)."""
        self._local_waits = waits

    async def agree(self, op: ReduceOp, axis: tuple[int, ...] | None, spec: LeafSpec) -> None:
        """A plain value's ``Strategy.reduce`` reduced here alone: agree on the call only.

        The fields of the crossing reduce (op, axis, shape, dtype), no data: where they
        differ, every process raises the mismatch one process's replicas raise.
        """

        async def nothing() -> None:
            return None

        await self.cross(cross_fields("reduce", op, axis, [spec]), nothing)

    async def agree_structure(self, api: str, structure: Any) -> None:
        """A cross-replica call's nest: agree on it (no data), as a collective's is."""

        async def nothing() -> None:
            return None

        fields = cross_fields(api, None, None, [])
        fields["structure"] = treedef_key(structure)
        fields["value"] = treedef_str(structure)
        await self.cross(fields, nothing)

    async def cross(
        self, fields: dict[str, Any], local: Callable[[], Awaitable[_T]], fp_bits: int = 0
    ) -> _T:
        """A cross-replica operation (``Strategy.reduce``, ``gather``): agree, then run.

        Awaited by the program's own task (the main task, which ``asyncio.run``'s first
        Ctrl-C cancels): finished first, as the run's end is (see :meth:`end_run`).
        ``fp_bits`` travel with the agreement (see :meth:`settle`); ``local`` reads
        every process's with :meth:`fp_met` before it awaits anything.
        """
        if asyncio._get_running_loop() is None:
            return await self._cross(fields, local, fp_bits)
        return await _to_the_end(self._cross(fields, local, fp_bits))

    async def _cross(
        self, fields: dict[str, Any], local: Callable[[], Awaitable[_T]], fp_bits: int
    ) -> _T:
        detail = {"describe": f"{fields['kind']}({fields['op'] or ''}) on {fields['value']}"}
        await self._acquire()
        limit = _CALL_TIMEOUT.get()
        self._limit = self.timeout if limit is None else limit
        try:
            with anyio.CancelScope(shield=True):
                self._shielded = True
                try:
                    self._fp_out = fp_bits
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

    async def end_run(
        self,
        error: BaseException | None,
        *,
        report: Any = None,
        structures: Sequence[Any] = (),
    ) -> None:
        """The local run ended: tell the other processes (see :meth:`_end_run`).

        Finished whatever cancels the caller meanwhile: its exchange, once posted, must
        complete, and anyio's shields inside it do not stop asyncio's own cancellation of
        the task (``asyncio.run``'s first Ctrl-C cancels the main task, which awaits
        this): a cancellation that lands here takes effect once the exchange completed,
        as in a collective's wait, instead of leaving the processes out of step.
        """
        if asyncio._get_running_loop() is None:
            await self._end_run(error, report=report, structures=structures)
            return
        await _to_the_end(self._end_run(error, report=report, structures=structures))
        if not isinstance(error, (asyncio.CancelledError, KeyboardInterrupt)) and (
            interrupt_swallowed()
        ):
            # asyncio.run's Ctrl-C cancelled this (main) task while the run's replicas
            # finished their collectives; the run ended without it (or with a peer's
            # error): it takes effect now, as the interruption this process got.
            raise asyncio.CancelledError("interrupted (SIGINT, Ctrl-C)") from error

    async def _end_run(
        self,
        error: BaseException | None,
        *,
        report: Any = None,
        structures: Sequence[Any] = (),
    ) -> None:
        """The local run ended: tell the other processes (the run's last exchange).

        ``report``: the ledger of the failed run; with a refusal, the collective that
        this process's replicas issued before the refusing one travels with it
        (``"issued"``, see :func:`._protocol.refusal_wins`).

        Raises:
            ReplicaExitedError: This process finished, but another failed or issued
                more collectives.
        """
        if not self._running:
            return  # not this group's run (begin_run refused it)
        details = None
        # The run's watch stopped it (see _stop_run): a peer waits at this exchange.
        stopped = error is not None and error is self._stopped
        refused = None if stopped else issued_refusal(error)
        if self._in_flight and self._broken is None:
            # An exchange this process posted was left before it completed: an
            # exception (Ctrl-C outside asyncio's runner) landed between posting and
            # waiting. The peers are told, instead of waiting for an exchange that
            # never comes until this process's exit ends the job.
            self.abandoned_by(
                KeyboardInterrupt() if error is None else error,
                "an exchange was interrupted",
                stage="exchange",
            )
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
                if stopped:
                    # Not a failure of this process's: it was told of the peer's. Its own
                    # fingerprint, so that the exchange is never unanimous with the
                    # peer's: every process builds the error from the details.
                    detail["stopped"] = True
                    at = self._stopped_at()
                    if at is not None:
                        detail["at"] = at
                elif error is not None:
                    detail["error"] = describe_failure(error)
                    detail["collective_error"] = error_fields(
                        error, check_call_sites=self.check_call_sites
                    )
                    timed_out = timeout_fields(error)
                    if timed_out is not None:
                        # A timeout on this process's own replicas: every process raises
                        # it (see _timeout_everywhere), never a ReplicaExitedError.
                        detail["timeout_error"] = timed_out
                    if type(error) is CollectiveError:
                        # Its own ledger's (a collective issued while another is in
                        # flight): every process raises the lowest rank's text.
                        detail["ledger_error"] = str(error)
                fp = fingerprint({"stopped": True}) if stopped else 0
                if detail.get("timeout_error") is not None:
                    fp = fingerprint({"timeout_error": detail["timeout_error"]})
                if "ledger_error" in detail:
                    # Processes whose ledgers' texts differ compare them (see
                    # _complete_error); where they agree the exchange is unanimous.
                    fp = fingerprint({"ledger_error": detail["ledger_error"]})
                if error is None and structures:
                    # The structures of the run's values: where replicas returned
                    # different ones, every process raises regroup's ValueError (below).
                    detail["structure"] = _structure_detail(structures)
                    fp = fingerprint({"structure": detail["structure"]})
                if refused is not None:
                    # A collective one of this process's replicas refused as it issued
                    # it: every process raises the first process's (global ids), as one
                    # process raises its first replica's. Its fingerprint makes
                    # processes whose refusals differ (their replica ids) compare them.
                    detail["refused"] = refused_detail(refused, "collective")
                    fp = fingerprint({"refused": detail["refused"]})
                    issued = self._issued_before(report)
                    if issued is not None:
                        detail["issued"] = issued
                await self._acquire()
                try:
                    details = await self._agree(status, None, detail, fp)
                finally:
                    self._release()
                self._run_ended = True
            await self._tell_refusals()
        finally:
            self._running = False
            if self._state is State.RUNNING:
                self._to(Event.END_RUN)
        if stopped:
            self._raise_stopped(details, report)
        if details is not None and error is None:
            self._raise_for_structure(details)
            self._raise_for(details)
        if details is not None and refused is not None:
            try:
                self._raise_for(details)  # the refusal every process raises alike
            except Exception as alike:
                raise alike from error
        if details is not None and error is not None:
            self._complete_error(error, details)

    def _stopped_at(self) -> dict[str, Any] | None:
        """The collective this process's replicas waited at when its run was stopped.

        As a COLLECTIVE detail's parts (``fields``, ``describe``, ``site``, ``replicas``
        as global ids, ``key``), or None when none waited at one.
        """
        for key, (signature, replicas) in self._local_waits.items():
            fields, _, detail, _, _ = self._fields(signature)
            return {
                **detail,
                "fields": {**fields, "position": key_text(key)},
                "replicas": list(replicas),
                "key": _key_json(key),
            }
        return None

    def _raise_stopped(self, details: list[dict[str, Any]] | None, report: Any) -> None:
        """After a run its watch stopped (see _stop_run): raise what every process raises.

        The details of the exchange the peer waited at (its failed run's end, or its
        goodbye): the error the peers at a collective raise too. Without them (the
        processes fell out of step meanwhile), a peer's failure read since, if any;
        else the run raises the stop's own error.
        """
        try:
            if details is not None:
                self._raise_for(details)
            if self._peer_error is not None:
                raise self._peer_error
        except Exception as alike:  # a refusal keeps its class (ValueError, TypeError, ...)
            if isinstance(alike, CollectiveError) and alike.report is None:
                alike.report = report  # this process's replicas, as for a collective's
            raise alike from None

    def _raise_for_structure(self, details: Sequence[Mapping[str, Any]]) -> None:
        """Raise regroup's ValueError where every process finished, with other structures.

        One process compares each replica's value with replica 0's and names the first
        that differs, in replica order: so do the processes, from each one's first
        replica's structure and the first of its replicas that differs from that.
        """
        if any(Status(d["status"]) is not Status.FINISHED for d in details):
            return
        if any(d.get("structure") is None for d in details):
            return
        key, text, _ = details[0]["structure"]
        for d in details:
            first = self.offsets[int(d["rank"])]
            other_key, other_text, local = d["structure"]
            if other_key != key:
                raise ValueError(structure_message(text, 0, other_text, first))
            if local is not None:
                raise ValueError(structure_message(text, 0, local[1], first + int(local[0])))

    def _issued_before(self, report: Any) -> dict[str, Any] | None:
        """The collective this process's replicas issued before the one that refused its.

        As a COLLECTIVE detail's parts (``fields``, ``describe``, ``site``, ``replicas``, ``key``):
        one process finds a difference between it and a lower rank's collective before
        the refusal (replica order), so the other processes must see it. None when no
        replica of this process issued a collective at the refused position before the
        refusing one (or it is a named collective, whose occurrence a report omits).
        """
        if report is None:
            return None
        rows = sorted(report.rows, key=lambda row: row.replica_id)
        # The ledger's report (``asyncreplica.CollectiveError.report``): states by value.
        refuser = next((row for row in rows if row.state.value == "failed"), None)
        if refuser is None:
            return None
        before: list[Any] = []  # the replicas from this process's first that issued it, in order
        for row in rows:
            if (
                row.replica_id != self.offset + len(before)
                or row.replica_id >= refuser.replica_id
                or row.state.value not in ("waiting", "cancelled")
                or row.position != refuser.position
                or row.signature is None
            ):
                break
            before.append(row)
        if not before:
            return None
        signature = before[0].signature
        assert signature is not None
        if signature.name is not None or any(row.signature != signature for row in before):
            return None  # a named one, or a difference this process's ledger finds
        fields, _, detail, _, _ = self._fields(signature)
        return {
            **detail,  # what it is, and where (describe, site)
            "fields": {**fields, "position": key_text(refuser.position)},
            "replicas": [self.offset, len(before)],
            "key": refuser.position,
        }

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


# The floating-point errors already acted on in the batch this task reduces, per dtype
# (see MPIProcessGroup.batch): None outside a batch.
BATCH_FP: contextvars.ContextVar[dict[str, int] | None] = contextvars.ContextVar(
    "asyncreplica_mpi_batch_fp", default=None
)
# A per-call timeout of the cross-replica operations made inside call_timeout().
# The number of the strategy call (see call_begins) the current task's exchanges belong
# to: a call's own, even where another call of this process started meanwhile.
# (the group's serial, the call's number).
_CALL: contextvars.ContextVar[tuple[int, int]] = contextvars.ContextVar(
    "asyncreplica_mpi_call", default=(-1, 0)
)
_CALL_TIMEOUT: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "asyncreplica_mpi_call_timeout", default=None
)


def _finalized_before_creation(MPI: Any) -> BackendError:
    """The constructor's error after ``MPI.Finalize()``: no strategy can be created.

    The process's rank is known only from a strategy created before (no MPI call may be
    made to ask): named where one was, on ``COMM_WORLD``.
    """
    ranks = [g.rank for g in _exit._groups if g._base is MPI.COMM_WORLD and g.rank >= 0]
    where = f"process {ranks[0]}" if ranks else "this process"
    return BackendError(
        "MultiWorkerMirroredStrategy cannot be created: MPI was finalized in "
        f"{where} (MPI.Finalize() ran, and no MPI call may be made after it; every "
        "strategy created before said goodbye to the other processes then).\n\n"
        "Create every MultiWorkerMirroredStrategy before finalizing MPI: call "
        "MPI.Finalize() only at the very end of the program (mpi4py calls it at exit by "
        "itself), or use MirroredStrategy for work that this process does alone "
        "afterwards."
    )


async def _to_the_end(work: Coroutine[Any, Any, _T]) -> _T:
    """Await ``work`` (asyncio) to its end; a cancellation of this task meanwhile after it.

    ``work`` runs in a task of its own, which the cancellation does not reach; the
    cancellation is raised once it finished (its outcome is then the cancelled
    process's to ignore: it was interrupted).
    """
    inner = asyncio.ensure_future(work)
    cancelled: BaseException | None = None
    # anyio's own cancellation (a run's scope, in a merge_fn) is not delivered here at
    # all; asyncio's task.cancel() is, once, and caught.
    with anyio.CancelScope(shield=True):
        while not inner.done():
            try:
                await asyncio.shield(inner)
            except asyncio.CancelledError as exc:
                if inner.done():
                    break
                cancelled = exc
    if cancelled is not None:
        if not inner.cancelled():
            inner.exception()  # retrieved: the cancellation is this task's news
        raise cancelled
    return inner.result()


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


def _structure_detail(structures: Sequence[Any]) -> list[Any]:
    """``[key, text, local]`` of a run's structures (one treedef per local replica).

    ``key`` and ``text``: the first replica's (``treedef_key``, ``treedef_str``);
    ``local``: ``[i, text]`` of the first local replica whose structure differs from it,
    or None.
    """
    first = structures[0]
    local = next(([i, treedef_str(t)] for i, t in enumerate(structures) if t != first), None)
    return [treedef_key(first), treedef_str(first), local]
