"""The MPI backend: a local backend's results combined across processes.

Every collective is hierarchical: the local backend (numpy) combines this process's
replicas, one non-blocking MPI collective per process combines the processes' partial
results on the group's data communicator (polled from the event loop), and each local
replica gets a read-only view of the result.

Determinism: partial results of up to :data:`GATHER_BYTES` (and of dtypes MPI cannot
reduce) are gathered and combined in rank order here (those up to the group's
``INLINE_BYTES`` travel inside the agreement exchange itself), so every process computes the
same bits in the same order. Larger ones use MPI's ``Iallreduce``, in place in the local
result's buffer: integer SUM/PROD with MPI's own operations, floats and MIN/MAX with a
non-commutative operation of the local backend's rule (see :func:`_rank_order_op`), in
rank order, so that NaN payloads and signs, signed zeros and numpy's floating-point
warnings are one process's.

Every transfer is posted and driven from the event loop (see :meth:`MPIBackend._drive`):
MPICH moves data only inside MPI calls, so the thread that tests the request is the one
that moves the data, and no second thread competes with it for a core.
"""

from __future__ import annotations

import asyncio
import contextvars
import os
import sys
import time
import warnings
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import anyio.lowlevel
import numpy as np
from asyncreplica_numpy.interop import (
    Library,
    divide_mean,
    from_host_shared,
    library_of,
    place_like,
    restore_host,
    to_host,
    unserved_device_error,
)
from asyncreplica_numpy.interop import combine as _local_combine

from asyncreplica import IndexedSlices
from asyncreplica.abc import Backend, LeafSpec, ReduceOp

from . import _waiting
from ._failures import IN_STEP
from ._group import BATCH_FP, MPIProcessGroup
from ._protocol import cross_fields

__all__ = ["GATHER_BYTES", "MPIBackend"]

_T = TypeVar("_T")

# DLPack device types the CPU reads: CPU, CUDA pinned host, CUDA managed.
_HOST_DLPACK = frozenset((1, 3, 13))

#: Partial results up to this size are gathered and combined in rank order.
GATHER_BYTES = 64 * 1024

# Driving a transfer (see MPIBackend._drive): MPI is tested back to back, giving the core
# away between tests, for up to _TURN_SECONDS per turn of the event loop; the peers' notes
# (a failure after the agreement) are read every _NOTES_SECONDS; past _DRIVE_SECONDS (or at
# once when the group's waits do not spin) the group's own wait takes over, which parks.
_TURN_SECONDS = 200e-6
_NOTES_SECONDS = 1e-3
_DRIVE_SECONDS = 1.0

_sched_yield = getattr(os, "sched_yield", lambda: None)  # POSIX only


def _in_rank_order(op: ReduceOp, parts: list[np.ndarray[Any, Any]]) -> np.ndarray[Any, Any]:
    """The processes' partial results combined in rank order (MEAN: their sum), new.

    By the local backend's own combine (``asyncreplica_numpy``: its element-wise
    operation for each op and dtype), the one rule the replicas of one process follow.
    numpy's floating-point errors (overflow, invalid value, ...) are recorded and then
    raised or warned as the caller's ``np.errstate`` says (see :func:`_replay_fp`), as
    one process's combine does, by a deliberate ``raise``: the user's error, not a bug.
    """
    log = _FPLog()
    with np.errstate(all="log", call=log):
        result = np.asarray(_local_combine(ReduceOp.SUM if op is ReduceOp.MEAN else op, parts))
    _met(log.bits)
    return result


# numpy's floating-point error texts ("<kind> encountered in <ufunc>"), the np.errstate
# setting of each kind, its flag for an errcall, and the ufuncs a combine uses: a
# recorded error is one bit, kind-major, so processes can OR theirs together.
_FP_KINDS = ("divide by zero", "overflow", "underflow", "invalid value")
_FP_SETTINGS = ("divide", "over", "under", "invalid")
_FP_UFUNCS = ("add", "subtract", "multiply", "minimum", "maximum", "divide", "reduce", "cast")


def _raised_elsewhere(bits: int, processes: list[int]) -> FloatingPointError:
    """The error of a process whose floating-point settings did not raise where others did."""
    kinds = [
        f"{kind} encountered in {name}"
        for k, kind in enumerate(_FP_KINDS)
        for u, name in enumerate(_FP_UFUNCS)
        if (bits >> (k * len(_FP_UFUNCS) + u)) & 1
    ]
    which = ", ".join(map(str, processes))
    return FloatingPointError(
        f"{kinds[0]}: process{'es' if len(processes) > 1 else ''} {which} raised for it "
        "(np.seterr / np.errstate, an np.seterrcall or a warnings filter there), while "
        "this process's settings do not raise: every process stops here, in step. Set the "
        "same floating-point error handling on every process."
    )


class _FPLog:
    """numpy's floating-point errors of a combine, as bits (``np.errstate(all="log")``)."""

    __slots__ = ("bits",)

    def __init__(self) -> None:
        self.bits = 0

    def write(self, message: str) -> None:
        kind, _, name = message.strip().removeprefix("Warning: ").partition(" encountered in ")
        k = _FP_KINDS.index(kind) if kind in _FP_KINDS else 3
        u = _FP_UFUNCS.index(name) if name in _FP_UFUNCS else 0
        self.bits |= 1 << (k * len(_FP_UFUNCS) + u)


def _replay_fp(bits: int) -> None:
    """Raise or warn for recorded floating-point errors as numpy would have, here.

    Under the caller's ``np.errstate``, by numpy's texts: ``"raise"`` raises
    ``FloatingPointError`` (the first kind, as numpy does), ``"warn"`` warns
    ``RuntimeWarning``, ``"call"``/``"log"``/``"print"`` go where numpy sends them.
    """
    if not bits:
        return
    setting = np.geterr()
    for k, kind in enumerate(_FP_KINDS):
        mode = setting[_FP_SETTINGS[k]]  # type: ignore[literal-required]
        for u, name in enumerate(_FP_UFUNCS):
            if mode == "ignore" or not (bits >> (k * len(_FP_UFUNCS) + u)) & 1:
                continue
            message = f"{kind} encountered in {name}"
            if mode == "raise":
                error = FloatingPointError(message)
                # Every process computes the same bits, so raises alike once the data
                # moved: the processes stay in step (see _failures.in_step).
                setattr(error, IN_STEP, True)
                raise error
            if mode == "warn":
                warnings.warn(message, RuntimeWarning, stacklevel=3)
            elif mode == "call":
                np.geterrcall()(kind, 1 << k)  # type: ignore[misc,operator]
            elif mode == "log":
                np.geterrcall().write(f"Warning: {message}\n")  # type: ignore[union-attr]
            else:  # print
                sys.stdout.write(f"Warning: {message}\n")  # as numpy prints it


class _FPRecord:
    """What one collective's combines met: floating-point error bits, interruptions.

    Every process computes the same bits (they are OR-ed across processes), so every
    process acts on them at the same point: once all of the collective's data moved
    (see :meth:`MPIBackend._alike`), never between two of its transfers, where a
    process that raised would leave the others waiting in the next one.
    """

    __slots__ = ("bits", "pending")

    def __init__(self) -> None:
        self.bits = 0
        self.pending: list[BaseException] = []


# The record of the collective this task is moving data for (see MPIBackend._alike).
_RECORD: contextvars.ContextVar[_FPRecord | None] = contextvars.ContextVar(
    "asyncreplica_mpi_fp_record", default=None
)


def _met(bits: int) -> None:
    """Floating-point errors met by a combine: kept for the collective's end, or replayed."""
    record = _RECORD.get()
    if record is None:
        _replay_fp(bits)
    else:
        record.bits |= bits


# Rank-order MPI reductions (see _rank_order_op): one per op, for the process; each
# transfer's element type is its own, and keys the transfer's record (_TRANSFERS).
_RANK_ORDER_OPS: dict[ReduceOp, Any] = {}
_TRANSFERS: dict[int, tuple[np.dtype[Any], _FPRecord]] = {}


def _rank_order_op(MPI: Any, op: ReduceOp) -> Any:
    """An MPI reduction by the local backend's own rule (see :func:`_transfer_type`).

    MPI's own ``MIN``/``MAX`` drop NaN (``a > b ? a : b``) where numpy's
    ``np.minimum``/``np.maximum``, which one process uses, propagate it, and they order
    ``-0.0``/``0.0`` ties their own way; MPI's own ``SUM``/``PROD`` are commutative,
    so MPICH swaps the operands on part of the buffer, and x86 returns the first
    operand's NaN: another replica's sign and payload. This user-defined operation
    applies the local backend's :func:`_local_combine` (the one rule) to two partial
    results, and is declared non-commutative, so MPI combines them in rank order
    (``inout = in op inout``, ``in`` from the lower ranks), as one process combines its
    replicas: the bits one process computes.

    It never raises into MPI (an exception there is a "Fatal Python error" and an
    abort): numpy's floating-point errors are recorded as bits in the transfer's
    record, and an asynchronous exception (a signal handler's
    ``KeyboardInterrupt``/``SystemExit``) is kept there while the combine is finished;
    the caller raises it once the MPI call returned (see :meth:`MPIBackend._combine`).

    Created once per process (MPI frees them at finalize; mpi4py allows 32). The
    operation finds the transfer's dtype and record by the transfer's own element type
    (:func:`_transfer_type`), so concurrent transfers (two strategies' collectives)
    never write into each other's record.
    """
    if op is ReduceOp.MEAN:
        op = ReduceOp.SUM  # the sum; the caller divides
    found = _RANK_ORDER_OPS.get(op)
    if found is not None:
        return found

    def combine(inbuf: Any, inoutbuf: Any, datatype: Any) -> None:
        found = _TRANSFERS.get(datatype.handle)
        if found is None:  # not a transfer of ours any more: nothing to write into
            return
        dtype, record = found
        log = _FPLog()
        work: list[Any] = [None]  # the combined values, once computed
        while True:
            # Every step may be redone after an interruption: the result is computed
            # before inoutbuf is written, and writing it again, or OR-ing the bits
            # again, changes nothing.
            try:
                if work[0] is None:
                    with np.errstate(all="log", call=log):
                        work[0] = _local_combine(
                            op, [np.frombuffer(inbuf, dtype), np.frombuffer(inoutbuf, dtype)]
                        )
                np.frombuffer(inoutbuf, dtype)[...] = work[0]
                record.bits |= log.bits
                break
            except BaseException as error:  # never into MPI: kept, raised after it
                record.pending.append(error)

    found = _RANK_ORDER_OPS[op] = MPI.Op.Create(combine, commute=False)
    return found


def _transfer_type(MPI: Any, dtype: np.dtype[Any], record: _FPRecord) -> Any:
    """A new element type for one rank-order transfer: ``dtype.itemsize`` bytes in a row.

    MPI never cuts an element when it splits the buffer. Its handle keys the
    transfer's dtype and record while the transfer runs (no other live type has it);
    the caller frees it (:func:`_free_transfer_type`) once the transfer completed.
    """
    element = MPI.BYTE.Create_contiguous(dtype.itemsize)
    element.Commit()
    _TRANSFERS[element.handle] = (dtype, record)
    return element


def _free_transfer_type(element: Any) -> None:
    _TRANSFERS.pop(element.handle, None)
    element.Free()


def _native(array: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """``array`` in native byte order, C-contiguous, with its own shape (0-d stays 0-d).

    Everything that crosses a process goes through here: MPI reduces native numbers
    only, and a peer reads the bytes with its own dtype, so a big-endian array
    (``'>f8'``, which the processes' fingerprints do not tell from ``'<f8'``) would be
    summed or read as other numbers.
    """
    dtype = array.dtype
    if not dtype.isnative:
        return array.astype(dtype.newbyteorder("="), order="C")
    return np.asarray(array, order="C")  # ascontiguousarray would make a 0-d array 1-d


def _writable(array: np.ndarray[Any, Any]) -> np.ndarray[Any, Any] | None:
    """``array``'s memory as a writable array, or None where it cannot be had.

    For the local backend's new result of a collective (read-only views of one buffer
    that only this collective holds): the buffer that owns the memory, when ``array``
    covers all of it, contiguous, with its dtype. That buffer then holds the
    cross-process result, and the replicas get read-only views of it: a buffer the local
    backend pools is reused only once no view of it is left (its refcount says so), so
    a result a replica keeps is never overwritten. A batch's packed buffer, which
    cannot be made writable again, gives None (the result goes to another buffer).
    """
    base = array if array.base is None else array.base
    if (
        type(base) is not np.ndarray
        or base.base is not None
        or not base.flags.owndata
        or not base.flags.c_contiguous
        or not array.flags.c_contiguous
        or base.dtype != array.dtype
        or base.size != array.size
        or base.ctypes.data != array.ctypes.data
    ):
        return None
    try:
        base.flags.writeable = True
    except ValueError:
        return None
    return base


def _freeze(array: np.ndarray[Any, Any]) -> None:
    """Make ``array`` and the buffer it views read-only.

    A read-only view of a writable buffer can be made writable again
    (``view.flags.writeable = True``); one of a read-only buffer cannot.
    """
    base = array.base
    if type(base) is np.ndarray:
        base.flags.writeable = False
    array.flags.writeable = False


def _readonly(array: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    view = array.view()
    view.flags.writeable = False
    return view


class MPIBackend(Backend):
    """Combine the replicas of every process: a local backend plus MPI.

    Args:
        inner: The backend that holds this process's replicas' values (numpy).
        group: The process group.
    """

    name = "mpi"

    def __init__(self, inner: Backend, group: MPIProcessGroup) -> None:
        super().__init__(inner.devices)
        self.inner = inner
        self.group = group
        self._pool: dict[tuple[int, str], list[np.ndarray[Any, Any]]] = {}
        self._MPI = group._MPI
        self._ops = {
            ReduceOp.SUM: self._MPI.SUM,
            ReduceOp.MEAN: self._MPI.SUM,
            ReduceOp.PROD: self._MPI.PROD,
        }  # integers; floats, and MIN/MAX: by the local backend's rule (_rank_order_op)

    def describe(self, value: object) -> LeafSpec:
        """Describe a leaf (the local backend decides what it holds).

        A foreign leaf (JAX, ``array_api_strict``, ...) is described as its numpy view,
        with its ``array_type``: every collective here holds foreign leaves as numpy
        arrays (see :func:`_host_rows`), so the local backend never sees one.
        """
        if type(value) is not np.ndarray:
            library = library_of(value)
            if library is not None:
                _on_host(value, library)
                spec = self.inner.describe(to_host(value, library))
                return spec._replace(array_type=library.name)
        return self.inner.describe(value)

    def convert(self, value: object) -> object:
        """``value`` as a collective reads it: the local backend converts it (once)."""
        return self.inner.convert(value)

    def describe_leaves(self, values: Sequence[object]) -> tuple[LeafSpec, ...]:
        """Describe several leaves (the local backend's batch path for numpy arrays)."""
        if list(map(type, values)).count(np.ndarray) == len(values):
            return self.inner.describe_leaves(values)
        return tuple(map(self.describe, values))

    def _output(self, size: int, dtype: np.dtype[Any]) -> np.ndarray[Any, Any]:
        """A 1-D output buffer: a pooled one that no replica still views, or a new one.

        A fresh large buffer costs page faults on every collective (MPI writes it
        through shared memory); results are read-only views, so a buffer is free again
        once the only references left are the pool's.
        """
        pooled = self._pool.setdefault((size, dtype.str), [])
        for buf in pooled:
            if sys.getrefcount(buf) == 3:  # the pool's list, this loop, the argument
                buf.flags.writeable = True  # results froze it (see _freeze)
                return buf
        buf = np.empty(size, dtype)
        if len(pooled) < 4:
            pooled.append(buf)
        return buf

    # -- moving bytes between processes ------------------------------------------------

    async def _move(self, nbytes: int, name: str, *args: Any, **kwargs: Any) -> None:
        """Run the MPI collective ``name`` (``"Allreduce"``, ...) on the data communicator.

        The non-blocking variant is posted and driven from the loop (see :meth:`_drive`).
        ``nbytes`` is the size of the transfer (kept for callers that replace this
        method; the path is the same for every size).
        """
        request = getattr(self.group.data_comm, "I" + name.lower())(*args, **kwargs)
        try:
            await self._drive(request)
        except BaseException:
            self.group.abandon(request, args, kwargs)  # MPI may still use the buffers
            raise

    async def _drive(self, request: Any) -> None:
        """Wait for a posted transfer by testing it: the tests are what move the data.

        MPICH progresses a message only inside MPI calls. A blocking call in a worker
        thread, with the loop watching it (spinning, then parked in MPI in a second
        thread), left two threads of each process competing for a core while the data
        moved (1.5-1.6x the transfer's time on a loaded 2-core machine, where testing
        from one thread took 1.0-1.1x). Here the loop's own thread tests the request
        back to back, giving the core away between tests (``sched_yield``: a peer may
        share it), for up to ``_TURN_SECONDS`` per turn of the loop, then lets the
        loop run other coroutines. It reads the peers' notes every ``_NOTES_SECONDS``, so a peer
        that failed after the agreement is reported at once (a transfer never
        completes then), and after ``_DRIVE_SECONDS`` hands over to the group's wait,
        which parks. The caller shields the wait: the request must complete.
        """
        test = request.Test
        if test():
            return
        group = self.group
        clock = time.perf_counter
        on_asyncio = asyncio._get_running_loop() is not None
        now = clock()
        notes_at = now + _NOTES_SECONDS
        give_up = now + (_DRIVE_SECONDS if _waiting._SPIN_SECONDS > 0 else 0.0)
        while now < give_up:
            turn_end = now + _TURN_SECONDS
            while True:
                _sched_yield()
                if test():
                    return
                now = clock()
                if now >= turn_end:
                    break
            if now >= notes_at:
                group._read_notes()
                notes_at = now + _NOTES_SECONDS
            if on_asyncio:
                await asyncio.sleep(0)
            else:
                await anyio.lowlevel.checkpoint()
            now = clock()
        await group.wait_data(request)

    async def _alike(self, work: Callable[[], Awaitable[_T]], dtype: str | None = None) -> _T:
        """Run ``work`` (a collective's data movement), then act on what its combines met.

        ``dtype``: of a cross-replica reduction's values, which a batch (see
        :meth:`MPIProcessGroup.batch`) acts on once per kind for all its values of a dtype.

        numpy's floating-point errors (and an interruption inside the rank-order
        operation) are kept until every transfer of the collective completed (a MEAN's
        count, a second dtype's buffer), so no process stops between two of them. Then
        each process replays them under its own ``np.errstate`` (see :func:`_replay_fp`);
        where that raises on some processes only (``np.seterr`` or a warnings filter
        differ between them), every process raises, in step (see :meth:`_raise_alike`).
        """
        if _RECORD.get() is not None:  # inside another collective's (reduce_scatter)
            return await work()
        record = _FPRecord()
        token = _RECORD.set(record)
        try:
            result = await work()
        finally:
            _RECORD.reset(token)
        if record.bits or record.pending:
            with self.group.committed():  # its exchange, once posted, must complete
                await self._raise_alike(record, dtype)
        return result

    async def _raise_alike(self, record: _FPRecord, dtype: str | None = None) -> None:
        """Replay ``record`` here; if any process raised for it, raise on every process.

        The bits are the same on every process, so each process that met any makes the
        one small exchange here (whether its replay raised). An interruption (Ctrl-C) is
        this process's own: it is raised after the exchange, and a run's end tells the
        others.

        Inside a batch (``dtype`` given), a kind already acted on for a value of that
        dtype is not acted on again (one process combines them in one call, which warns
        once); the exchange is made all the same, as it depends on ``record.bits`` only
        (the same on every process), so a process whose batch differs never waits alone.
        """
        error: BaseException | None = None
        bits = record.bits
        done = BATCH_FP.get()
        if done is not None and dtype is not None:
            seen = done.get(dtype, 0)
            done[dtype] = seen | bits
            bits &= ~seen
        try:
            _replay_fp(bits)  # numpy's texts, under this process's settings
        except Exception as raised:  # FloatingPointError, an errcall's, a warning as error
            error = raised
        if record.bits and self.group.size > 1:
            flags = await self._allgather(np.array([error is not None], np.int64))
            raising = [r for r in range(self.group.size) if flags[r, 0]]
            if error is None and raising:
                error = _raised_elsewhere(record.bits, raising)
        if record.pending:
            error = record.pending[0]
        if error is not None:
            # Every process raises here, once the data moved: in step (_failures.in_step).
            setattr(error, IN_STEP, True)
            raise error

    async def _allgather(self, flat: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """Every process's equal-sized ``flat`` buffer, stacked in rank order."""
        out = np.empty((self.group.size, flat.size), flat.dtype)
        send = np.ascontiguousarray(flat).view(np.uint8)
        await self._move(out.nbytes, "Allgather", send, out.view(np.uint8))
        return out

    async def _allgatherv(
        self, payload: np.ndarray[Any, Any], lengths: Sequence[int]
    ) -> list[np.ndarray[Any, Any]]:
        """Every process's byte payload (of the given lengths), in rank order."""
        displs = [sum(lengths[:r]) for r in range(len(lengths))]
        buf = np.empty(sum(lengths), np.uint8)
        await self._move(
            buf.nbytes, "Allgatherv", payload, [buf, list(lengths), displs, self._MPI.BYTE]
        )
        return [buf[d : d + n] for d, n in zip(displs, lengths, strict=True)]

    async def _lengths(self, mine: Sequence[int]) -> np.ndarray[Any, Any]:
        """Every process's list of ``len(mine)`` integers, as rows in rank order."""
        return await self._allgather(np.asarray(mine, np.int64))

    async def _combine(
        self, op: ReduceOp, flat: np.ndarray[Any, Any], *, owned: bool = False
    ) -> np.ndarray[Any, Any]:
        """Combine one contiguous 1-D buffer per process with ``op`` (MEAN as SUM).

        ``owned``: ``flat`` is the local backend's new result, which nothing outside
        this collective sees yet: large ones are reduced in place in its buffer (see
        :func:`_writable`), which then holds the result; no other output buffer is
        written. Otherwise the result is a new array or a pooled buffer.
        """
        if self.group.size == 1:
            return flat.copy()
        dtype = flat.dtype
        native = dtype.kind in "iuf" or (dtype.kind == "c" and op in (ReduceOp.SUM, ReduceOp.MEAN))
        if native and flat.nbytes > GATHER_BYTES:
            mine = _writable(flat) if owned else None
            out = self._output(flat.size, flat.dtype) if mine is None else mine.reshape(-1)
            send = flat if mine is None else self._MPI.IN_PLACE
            if op in (ReduceOp.MIN, ReduceOp.MAX) or dtype.kind in "fc":
                # By the local backend's rule, in rank order (MPI's MIN/MAX drop NaN,
                # its SUM/PROD swap operands: another replica's NaN; see _rank_order_op).
                mpi_op = _rank_order_op(self._MPI, op)
                mine_record = _FPRecord()
                element = _transfer_type(self._MPI, dtype, mine_record)
                if mine is None:
                    send = [flat, flat.size, element]
                await self._move(
                    flat.nbytes, "Allreduce", send, [out, out.size, element], op=mpi_op
                )  # if it raises, the element type stays: MPI may still run the operation
                _free_transfer_type(element)
                # Each process combined a part of the buffer: their floating-point
                # errors together are the combine's, the same on every process.
                flags = np.array([mine_record.bits], np.int64)
                every = np.empty(1, np.int64)
                await self._move(8, "Allreduce", flags, every, op=self._MPI.BOR)
                record = _RECORD.get()
                if record is not None:
                    record.bits |= int(every[0])
                    record.pending += mine_record.pending
                else:
                    if mine_record.pending:
                        # An interruption inside the operation, raised once the data
                        # moved: the processes are in step, the run's end tells the others.
                        setattr(mine_record.pending[0], IN_STEP, True)
                        raise mine_record.pending[0]
                    _replay_fp(int(every[0]))
            else:
                await self._move(flat.nbytes, "Allreduce", send, out, op=self._ops[op])
            return out
        parts = await self._allgather(flat)
        return _in_rank_order(op, list(parts))

    async def _combine_leaves(
        self, op: ReduceOp, leaves: Sequence[np.ndarray[Any, Any]], *, owned: bool = False
    ) -> list[np.ndarray[Any, Any]]:
        """Combine each leaf across processes; one MPI collective per dtype.

        ``owned``: the leaves are the local backend's new results (see :meth:`_combine`).
        """
        by_dtype: dict[np.dtype[Any], list[int]] = {}
        for j, leaf in enumerate(leaves):
            by_dtype.setdefault(leaf.dtype, []).append(j)
        out: list[Any] = [None] * len(leaves)
        for indices in by_dtype.values():
            if len(indices) == 1:
                flat = np.ravel(leaves[indices[0]])  # a view when it is contiguous
                mine = owned
            else:
                flat = np.concatenate([np.ravel(leaves[j]) for j in indices])
                mine = True  # a new array of this collective's
            combined = await self._combine(op, flat, owned=mine)
            if op is ReduceOp.MEAN:
                combined = divide_mean(np.array(combined), self.group.num_replicas)
            _freeze(combined)  # no view of it can be made writable again
            start = 0
            for j in indices:
                size = leaves[j].size
                out[j] = combined[start : start + size].reshape(leaves[j].shape)
                start += size
        return out

    async def _gather_leaves(
        self, leaves: Sequence[np.ndarray[Any, Any]], axis: int
    ) -> list[np.ndarray[Any, Any]]:
        """Concatenate each process's leaves along ``axis``, in rank order."""
        moved = [_native(np.moveaxis(leaf, axis, 0)) for leaf in leaves]
        sizes = await self._lengths([m.shape[0] for m in moved])
        payload = np.concatenate(
            [m.reshape(-1).view(np.uint8) for m in moved] or [np.empty(0, np.uint8)]
        )
        byte_lengths = []
        for row in sizes:
            total = 0
            for j, m in enumerate(moved):
                row_bytes = m.dtype.itemsize * int(np.prod(m.shape[1:], dtype=np.int64))
                total += int(row[j]) * row_bytes
            byte_lengths.append(total)
        parts = await self._allgatherv(payload, byte_lengths)
        out = []
        for j, m in enumerate(moved):
            pieces = []
            for rank, part in enumerate(parts):
                row_bytes = m.dtype.itemsize * int(np.prod(m.shape[1:], dtype=np.int64))
                before = sum(
                    int(sizes[rank][k])
                    * moved[k].dtype.itemsize
                    * int(np.prod(moved[k].shape[1:], dtype=np.int64))
                    for k in range(j)
                )
                count = int(sizes[rank][j])
                chunk = part[before : before + count * row_bytes].view(m.dtype)
                pieces.append(chunk.reshape((count, *m.shape[1:])))
            out.append(np.moveaxis(np.concatenate(pieces, axis=0), 0, axis))
        return out

    # -- replica collectives (agreed by the group before they are called) ---------------

    async def all_reduce(
        self, op: ReduceOp, values: Sequence[Sequence[object]], *, bytes_per_pack: int = 0
    ) -> list[list[object]]:
        """Combine every replica's leaves across all processes (see the module docstring)."""
        if _sparse(values):
            await self.group.refuse_collective(_no_sparse("all_reduce"))
        host, libraries = _host_rows(values)
        if libraries is not None:
            results = await self.all_reduce(op, host, bytes_per_pack=bytes_per_pack)
            return restore_host(results, libraries, values)
        if op is ReduceOp.MEAN and values and any(_integer(leaf) for leaf in values[0]):
            return await self._exact_mean(values, bytes_per_pack)
        local_op = ReduceOp.SUM if op is ReduceOp.MEAN else op
        log = _FPLog()
        with np.errstate(all="log", call=log):  # acted on alike, with the others' (_met)
            local = await self.inner.all_reduce(local_op, values, bytes_per_pack=bytes_per_pack)
        leaves = [_native(np.asarray(leaf)) for leaf in local[0]]
        combined = await self._alike(lambda: self._all_reduce_leaves(op, leaves, log.bits))
        return [[c.view() for c in combined] for _ in values]  # read-only, as c is

    async def _all_reduce_leaves(
        self, op: ReduceOp, leaves: Sequence[np.ndarray[Any, Any]], fp_bits: int
    ) -> list[np.ndarray[Any, Any]]:
        """all_reduce's partial results across processes: inline, or agreed then moved.

        ``fp_bits``: the floating-point errors this process's own combine of its
        replicas met (recorded, not acted on). They travel with the agreement, and
        every process's together are this collective's, acted on alike on every
        process once the data moved (see :meth:`_alike`), as one process acts on its
        one combine of every replica: the same error, the same warnings, everywhere.
        """
        combined = await self._combine_inline(op, leaves, fp_bits)  # read-only already
        if combined is None:
            with self.group.committed():  # the data must move once agreed
                await self.group.settle(fp_bits)
                _met(self.group.fp_met())
                combined = await self._combine_leaves(op, leaves, owned=True)
            for c in combined:
                c.flags.writeable = False  # a new array, or a new view of a pooled buffer
        return combined

    async def _exact_mean(
        self, values: Sequence[Sequence[object]], bytes_per_pack: int
    ) -> list[list[object]]:
        """MEAN with integer leaves: exact sums across processes, divided and rounded once.

        Each integer leaf travels as its two 32-bit halves in int64 (see :func:`_halves`),
        summed exactly by the local backend and across processes; the mean is then the
        exact total over the global replica count, rounded once to float64: the bits one
        process computes for the same global replicas. Other leaves are summed and divided
        as for any MEAN.
        """
        integer = [_integer(leaf) for leaf in values[0]]
        split = [
            [part for leaf, i in zip(replica, integer, strict=True) for part in _split(leaf, i)]
            for replica in values
        ]
        log = _FPLog()
        with np.errstate(all="log", call=log):  # as in all_reduce
            local = await self.inner.all_reduce(ReduceOp.SUM, split, bytes_per_pack=bytes_per_pack)
        leaves = [_native(np.asarray(leaf)) for leaf in local[0]]
        sums = await self._alike(lambda: self._all_reduce_leaves(ReduceOp.SUM, leaves, log.bits))
        count = self.group.num_replicas
        out: list[np.ndarray[Any, Any]] = []
        k = 0
        for is_int in integer:
            if is_int:
                mean = _exact_quotient(sums[k], sums[k + 1], count)
                k += 2
            else:
                mean = divide_mean(np.array(sums[k]), count)
                k += 1
            mean.flags.writeable = False
            out.append(mean)
        return [[m.view() for m in out] for _ in values]

    async def _combine_inline(
        self, op: ReduceOp, leaves: Sequence[np.ndarray[Any, Any]], fp_bits: int
    ) -> list[np.ndarray[Any, Any]] | None:
        """Small partial results travel with the agreement: one exchange, not two.

        Every process gets every process's bytes and combines them in rank order, so
        the result is the same everywhere. None when they do not fit (nothing was
        exchanged). ``fp_bits`` travel with them (see :meth:`_all_reduce_leaves`).
        """
        parts = await self.group.settle_with(leaves, fp_bits)
        if parts is None:
            return None
        _met(self.group.fp_met())
        # parts views the group's receive buffer, which the next exchange reuses: it is
        # read here, without awaiting, into new arrays.
        processes = parts.shape[0]
        out = []
        start = 0
        for leaf in leaves:
            stop = start + leaf.nbytes
            dtype = leaf.dtype
            # In rank order: (p0 op p1) op p2 ..., into a new array.
            acc = _in_rank_order(op, [parts[r, start:stop].view(dtype) for r in range(processes)])
            start = stop
            if op is ReduceOp.MEAN:
                acc = divide_mean(np.array(acc), self.group.num_replicas)
            acc.flags.writeable = False  # frozen for good: results are views of it
            out.append(acc if acc.shape == leaf.shape else acc.reshape(leaf.shape))
        return out

    async def all_gather(self, values: Sequence[Sequence[object]], axis: int) -> list[list[object]]:
        """Concatenate every replica's leaves along ``axis`` in global replica order."""
        if _sparse(values):
            await self.group.refuse_collective(_no_sparse("all_gather"))
        host, libraries = _host_rows(values)
        if libraries is not None:
            return restore_host(await self.all_gather(host, axis), libraries, values)
        local = await self.inner.all_gather(values, axis)
        with self.group.committed():
            await self.group.settle()
            gathered = await self._gather_leaves([np.asarray(leaf) for leaf in local[0]], axis)
        return [[_readonly(g) for g in gathered] for _ in values]

    async def reduce_scatter(
        self, op: ReduceOp, values: Sequence[Sequence[object]], axis: int
    ) -> list[list[object]]:
        """All-reduce, then give global replica ``g`` the ``g``-th chunk along ``axis``."""
        host, libraries = _host_rows(values)
        if libraries is not None:
            return restore_host(await self.reduce_scatter(op, host, axis), libraries, values)
        reduced = await self.all_reduce(op, values)
        total = self.group.num_replicas
        first = self.group.offset
        out: list[list[object]] = []
        for r in range(len(values)):
            mine: list[object] = []
            for leaf in reduced[0]:
                array = np.asarray(leaf)
                chunk = array.shape[axis] // total
                index = [slice(None)] * array.ndim
                index[axis] = slice((first + r) * chunk, (first + r + 1) * chunk)
                mine.append(_readonly(array[tuple(index)]))
            out.append(mine)
        return out

    async def broadcast(self, values: Sequence[object], num_replicas: int) -> list[list[object]]:
        """Copy the source replica's leaves to every replica of every process.

        Outside an agreed collective (``extended.broadcast_to``), the copy is local.
        Foreign leaves come back in the source's array type, on its device.
        """
        host, libraries = _host_rows([values])
        if libraries is not None:
            results = await self.broadcast(host[0], num_replicas)
            return restore_host(results, libraries, [values] * num_replicas)
        signature = self.group.current
        if signature is None or signature.source is None or self.group.size == 1:
            return await self.inner.broadcast(values, num_replicas)
        with self.group.committed():
            await self.group.settle()
            root = self.group.process_of(signature.source)
            arrays = [_native(np.asarray(v)) for v in values]
            payload = np.concatenate(
                [a.reshape(-1).view(np.uint8) for a in arrays] or [np.empty(0, np.uint8)]
            )
            if self.group.rank != root:
                payload = np.empty_like(payload)
            await self._move(payload.nbytes, "Bcast", payload, root=root)
        out: list[np.ndarray[Any, Any]] = []
        start = 0
        for a in arrays:
            piece = payload[start : start + a.nbytes].view(a.dtype).reshape(a.shape)
            start += a.nbytes
            piece.flags.writeable = False
            out.append(piece)
        return [[_readonly(o) for o in out] for _ in range(num_replicas)]

    # -- cross-replica operations (agreed here) ---------------------------------------

    async def reduce(
        self, op: ReduceOp, components: Sequence[object], axis: tuple[int, ...] | None
    ) -> object:
        """Reduce the local components, then across processes (``Strategy.reduce``).

        The result is in the array type, and on the device, of the first component.
        """
        host, library = _host_components(components)
        if library is not None:
            result = await self.reduce(op, host, axis)
            return place_like(from_host_shared([result], library), components[:1])[0]
        local_op = ReduceOp.SUM if op is ReduceOp.MEAN else op
        # This process's part first, by the local backend's rules (a dtype it refuses
        # raises here): a process that cannot take part refuses in the agreement, so
        # that every process raises that error and none waits for its data.
        described: list[LeafSpec] | None = None
        try:
            specs = described = [self.describe(c) for c in components]
            # Distributed Python numbers are a collective's values, of the dtype the
            # backend describes them in (numpy: int64, float64), as one process reduces
            # them (reduce_leaf): never the float32 of a plain number, whatever the
            # other processes' components are (a 0-d array on one, 1.0 on another).
            components = [
                np.asarray(c, np.dtype(s.dtype)) if type(c) in (int, float, complex) else c
                for c, s in zip(components, specs, strict=True)
            ]
            exact = op is ReduceOp.MEAN and bool(components) and _integer(components[0])
            if any(s.sparse for s in specs):
                raise NotImplementedError(
                    "Strategy.reduce of IndexedSlices across processes is not supported; "
                    "convert them to dense arrays first"
                )
            log = _FPLog()
            if exact:
                # Exact: each process's exact sum as two int64 halves (see _halves).
                parts = list(_exact_partial(components, axis))
            else:
                # Its floating-point errors recorded: they travel with the agreement and
                # are acted on alike on every process (see _all_reduce_leaves).
                with np.errstate(all="log", call=log):
                    part = await self.inner.reduce(local_op, components, axis)
                parts = [_native(np.asarray(part))]
        except Exception as error:
            # Its components travel with the refusal: where the processes' components
            # differ (a bool here, float64 there), every process raises what one
            # process's check of every replica's component raises first (check_reduced).
            await self.group.refuse(
                error, components=None if described is None else (op, axis, described)
            )
        fields = cross_fields("reduce", op, axis, specs[:1])
        count = len(components)
        if op is ReduceOp.MEAN and axis is not None:
            count = sum(int(np.prod([s.shape[a] for a in axis], dtype=np.int64)) for s in specs)

        async def work() -> object:
            _met(self.group.fp_met())  # every process's part's, read before any await
            if exact:
                sums = await self._combine_leaves(ReduceOp.SUM, parts)
                total = int((await self._combine(ReduceOp.SUM, np.array([count], np.int64)))[0])
                with np.errstate(invalid="ignore", divide="ignore"):  # no elements: nan
                    return _exact_quotient(sums[0], sums[1], total)
            result = (await self._combine_leaves(local_op, parts))[0]
            if op is ReduceOp.MEAN:
                total = int((await self._combine(ReduceOp.SUM, np.array([count], np.int64)))[0])
                if axis is None:
                    result = divide_mean(np.array(result), total)
                else:
                    # As the local backend divides along axes: no elements give NaN
                    # silently, as TF (and one process) does.
                    with np.errstate(invalid="ignore", divide="ignore"):
                        result = divide_mean(np.array(result), total)
            return np.array(result)

        dtype = None if exact else parts[0].dtype.str
        return await self.group.cross(fields, lambda: self._alike(work, dtype), log.bits)

    async def gather(self, components: Sequence[object], axis: int) -> object:
        """Concatenate the local components, then every process's, along ``axis``.

        The result is in the array type, and on the device, of the first component.
        """
        host, library = _host_components(components)
        if library is not None:
            result = await self.gather(host, axis)
            return place_like(from_host_shared([result], library), components[:1])[0]
        try:  # this process's part first (see reduce)
            specs = [self.describe(c) for c in components]
            local = _native(np.asarray(await self.inner.gather(components, axis)))
        except Exception as error:
            await self.group.refuse(error)
        fields = cross_fields("gather", None, axis, specs[:1])

        async def work() -> object:
            return np.array((await self._gather_leaves([local], axis))[0])

        return await self.group.cross(fields, work)

    async def aclose(self) -> None:
        """Close the local backend."""
        await self.inner.aclose()


# Foreign leaves (JAX, array_api_strict, ...) -------------------------------------------


def _host_rows(
    values: Sequence[Sequence[object]],
) -> tuple[list[list[object]], list[Library | None] | None]:
    """``values`` with foreign leaves as numpy arrays, and each leaf's library.

    ``(values, None)`` when no leaf is foreign: replica 0's leaves decide, since the
    ledger checked that every local replica's leaf ``j`` has the same array type.
    """
    if not values:
        return [], None
    first = values[0]
    if list(map(type, first)).count(np.ndarray) == len(first):
        return [list(row) for row in values], None
    libraries = list(map(library_of, first))
    if libraries.count(None) == len(libraries):
        return [list(row) for row in values], None
    host = [
        [v if lib is None else to_host(v, lib) for v, lib in zip(row, libraries, strict=True)]
        for row in values
    ]
    return host, libraries


def _on_host(value: object, library: Library) -> None:
    """Raise ``BackendError`` for a foreign array the CPU cannot read (a GPU's)."""
    method = getattr(value, "__dlpack_device__", None)
    if method is None:
        return
    kind = int(method()[0])
    if kind not in _HOST_DLPACK:
        raise unserved_device_error(value, library.name, kind, "mpi")


def _host_components(components: Sequence[object]) -> tuple[list[object], Library | None]:
    """``Strategy.reduce``/``gather`` components as numpy arrays, and the first's library."""
    if not components or type(components[0]) is np.ndarray:
        return list(components), None
    library = library_of(components[0])
    if library is None:
        return list(components), None
    host = []
    for c in components:
        lib = None if type(c) is np.ndarray else library_of(c)
        host.append(c if lib is None else to_host(c, lib))
    return host, library


def _integer(leaf: object) -> bool:
    """Whether ``leaf`` holds integers (whose MEAN is exact, see :func:`_halves`)."""
    dtype = getattr(leaf, "dtype", None)
    if dtype is None:
        dtype = np.asarray(leaf).dtype
    return bool(dtype.kind in "iu")


_HALF = 32
_LOW = (1 << _HALF) - 1


def _halves(array: np.ndarray[Any, Any]) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """An integer array as two int64 arrays ``(high, low)``: ``x == high * 2**32 + low``.

    ``high`` is below 2**32 in magnitude and ``0 <= low < 2**32``, so sums of up to 2**31
    of them are exact in int64: an exact integer sum travels between processes as two
    int64 sums, whatever the input dtype (uint64 included).
    """
    if array.dtype.kind == "u" and array.dtype.itemsize == 8:
        wide = np.asarray(array, np.uint64)
        return (wide >> np.uint64(_HALF)).astype(np.int64), (wide & np.uint64(_LOW)).astype(
            np.int64
        )
    wide = np.asarray(array, np.int64)
    return wide >> _HALF, wide & _LOW


def _split(leaf: object, integer: bool) -> tuple[object, ...]:
    if not integer:
        return (leaf,)
    return _halves(np.asarray(leaf))


def _exact_partial(
    components: Sequence[object], axis: tuple[int, ...] | None
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """This process's exact sum of integer ``components`` (over ``axis`` too), as halves."""
    high: np.ndarray[Any, Any] | None = None
    low: np.ndarray[Any, Any] | None = None
    for component in components:
        h, lo = _halves(np.asarray(component))
        if axis is not None:
            h, lo = h.sum(axis=axis, dtype=np.int64), lo.sum(axis=axis, dtype=np.int64)
        high = h if high is None else high + h
        low = lo if low is None else low + lo
    assert high is not None
    assert low is not None
    return _native(np.asarray(high)), _native(np.asarray(low))


def _exact_quotient(
    high: np.ndarray[Any, Any], low: np.ndarray[Any, Any], count: int
) -> np.ndarray[Any, Any]:
    """``(high * 2**32 + low) / count`` per element, rounded once to float64 (a new array).

    Totals below 2**53 in magnitude are exact in int64 and float64, where one division
    rounds correctly; larger ones are divided as Python integers (also correctly
    rounded), as the numpy backend's MEAN of integers does: the same bits either way.
    """
    high = np.asarray(high, np.int64)
    low = np.asarray(low, np.int64)
    small = not high.size or (int(np.abs(high).max()) < (1 << 20) and int(low.max()) < (1 << 52))
    if small or not count:
        total = high * (1 << _HALF) + low  # |total| < 2**53
        return np.asarray(np.true_divide(total, count, dtype=np.float64))
    exact = high.astype(object) * (1 << _HALF) + low.astype(object)
    means = [int(t) / count for t in np.asarray(exact, dtype=object).ravel().tolist()]
    return np.array(means, dtype=np.float64).reshape(high.shape)


def _sparse(values: Sequence[Sequence[object]]) -> bool:
    return any(isinstance(leaf, IndexedSlices) for leaf in (values[0] if values else ()))


def _no_sparse(what: str) -> NotImplementedError:
    return NotImplementedError(
        f"{what} of IndexedSlices across processes is not supported by the MPI "
        "backend; convert them to dense arrays first"
    )
