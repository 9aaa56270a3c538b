"""The MPI backend: a local backend's results combined across processes.

Every collective is hierarchical: the local backend (numpy) combines this process's
replicas, one non-blocking MPI collective per process combines the processes' partial
results on the group's data communicator (polled from the event loop), and each local
replica gets a read-only view of the result.

Determinism: partial results of up to :data:`GATHER_BYTES` (and of dtypes MPI cannot
reduce) are gathered and combined in rank order here (those up to the group's
``INLINE_BYTES`` travel inside the agreement exchange itself), so every process computes the
same bits in the same order. Larger ones use MPI's ``Allreduce`` (in a worker thread),
whose result MPICH makes identical on every process.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from asyncreplica import IndexedSlices
from asyncreplica.abc import Backend, LeafSpec, ReduceOp

from ._group import (
    THREAD_WAIT_BYTES,
    MPIProcessGroup,
    thread_multiple,
)
from ._protocol import cross_fields

__all__ = ["GATHER_BYTES", "MPIBackend"]

#: Partial results up to this size are gathered and combined in rank order.
GATHER_BYTES = 64 * 1024

_UFUNCS = {
    ReduceOp.SUM: np.add,
    ReduceOp.MEAN: np.add,
    ReduceOp.PROD: np.multiply,
    ReduceOp.MIN: np.minimum,
    ReduceOp.MAX: np.maximum,
}


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
            ReduceOp.MIN: self._MPI.MIN,
            ReduceOp.MAX: self._MPI.MAX,
        }

    def describe(self, value: object) -> LeafSpec:
        """Describe a leaf (the local backend decides what it holds)."""
        return self.inner.describe(value)

    def describe_leaves(self, values: Sequence[object]) -> tuple[LeafSpec, ...]:
        """Describe several leaves (the local backend's batch path)."""
        return self.inner.describe_leaves(values)

    def _output(self, size: int, dtype: np.dtype[Any]) -> np.ndarray[Any, Any]:
        """A 1-D output buffer: a pooled one that no replica still views, or a new one.

        A fresh large buffer costs page faults on every collective (MPI writes it
        through shared memory); results are read-only views, so a buffer is free again
        once the only references left are the pool's.
        """
        pooled = self._pool.setdefault((size, dtype.str), [])
        for buf in pooled:
            if sys.getrefcount(buf) == 3:  # the pool's list, this loop, the argument
                return buf
        buf = np.empty(size, dtype)
        if len(pooled) < 4:
            pooled.append(buf)
        return buf

    # -- moving bytes between processes ------------------------------------------------

    async def _move(self, nbytes: int, name: str, *args: Any, **kwargs: Any) -> None:
        """Run the MPI collective ``name`` (``"Allreduce"``, ...) on the data communicator.

        Transfers below :data:`THREAD_WAIT_BYTES` post the non-blocking variant and
        poll it from the loop. Larger ones call the blocking variant in a worker thread
        (mpi4py releases the GIL; MPI runs with MPI_THREAD_MULTIPLE): posting a large
        non-blocking collective does much of its copying on the calling thread, which
        would be the event loop's.
        """
        comm = self.group.data_comm
        if nbytes >= THREAD_WAIT_BYTES and thread_multiple():
            await self.group.blocking(functools.partial(getattr(comm, name), *args, **kwargs))
            return
        request = getattr(comm, "I" + name.lower())(*args, **kwargs)
        await self.group.wait_data(request)

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

    async def _combine(self, op: ReduceOp, flat: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """Combine one contiguous 1-D buffer per process with ``op`` (MEAN as SUM)."""
        if self.group.size == 1:
            return flat.copy()
        dtype = flat.dtype
        native = dtype.kind in "iuf" or (dtype.kind == "c" and op in (ReduceOp.SUM, ReduceOp.MEAN))
        if native and flat.nbytes > GATHER_BYTES:
            out = self._output(flat.size, flat.dtype)
            await self._move(flat.nbytes, "Allreduce", flat, out, op=self._ops[op])
            return out
        parts = await self._allgather(flat)
        ufunc = _UFUNCS[op]
        acc: np.ndarray[Any, Any] = parts[0].copy()
        for part in parts[1:]:
            ufunc(acc, part, out=acc)
        return acc

    async def _combine_leaves(
        self, op: ReduceOp, leaves: Sequence[np.ndarray[Any, Any]]
    ) -> list[np.ndarray[Any, Any]]:
        """Combine each leaf across processes; one MPI collective per dtype."""
        by_dtype: dict[np.dtype[Any], list[int]] = {}
        for j, leaf in enumerate(leaves):
            by_dtype.setdefault(leaf.dtype, []).append(j)
        out: list[Any] = [None] * len(leaves)
        for indices in by_dtype.values():
            if len(indices) == 1:
                flat = np.ravel(leaves[indices[0]])  # a view when it is contiguous
            else:
                flat = np.concatenate([np.ravel(leaves[j]) for j in indices])
            combined = await self._combine(op, flat)
            if op is ReduceOp.MEAN:
                combined = np.true_divide(combined, self.group.num_replicas)
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
        _no_sparse(values, "all_reduce")
        local_op = ReduceOp.SUM if op is ReduceOp.MEAN else op
        local = await self.inner.all_reduce(local_op, values, bytes_per_pack=bytes_per_pack)
        leaves = [_native(np.asarray(leaf)) for leaf in local[0]]
        combined = await self._combine_inline(op, leaves)  # read-only already
        if combined is None:
            with self.group.committed():  # the data must move once agreed
                await self.group.settle()
                combined = await self._combine_leaves(op, leaves)
            for c in combined:
                c.flags.writeable = False  # a new array, or a new view of a pooled buffer
        return [[c.view() for c in combined] for _ in values]  # read-only, as c is

    async def _combine_inline(
        self, op: ReduceOp, leaves: Sequence[np.ndarray[Any, Any]]
    ) -> list[np.ndarray[Any, Any]] | None:
        """Small partial results travel with the agreement: one exchange, not two.

        Every process gets every process's bytes and combines them in rank order, so
        the result is the same everywhere. None when they do not fit.
        """
        parts = await self.group.settle_with(leaves)
        if parts is None:
            return None
        # parts views the group's receive buffer, which the next exchange reuses: it is
        # read here, without awaiting, into new arrays.
        ufunc = _UFUNCS[op]
        processes = parts.shape[0]
        out = []
        start = 0
        for leaf in leaves:
            stop = start + leaf.nbytes
            dtype = leaf.dtype
            first = parts[0, start:stop].view(dtype)
            if processes == 1:
                acc = first.copy()
            else:
                # In rank order: (p0 op p1) op p2 ..., into a new array.
                acc = ufunc(first, parts[1, start:stop].view(dtype))
                for r in range(2, processes):
                    ufunc(acc, parts[r, start:stop].view(dtype), out=acc)
            start = stop
            if op is ReduceOp.MEAN:
                acc = np.true_divide(acc, self.group.num_replicas)
            acc.flags.writeable = False  # frozen for good: results are views of it
            out.append(acc if acc.shape == leaf.shape else acc.reshape(leaf.shape))
        return out

    async def all_gather(self, values: Sequence[Sequence[object]], axis: int) -> list[list[object]]:
        """Concatenate every replica's leaves along ``axis`` in global replica order."""
        _no_sparse(values, "all_gather")
        local = await self.inner.all_gather(values, axis)
        with self.group.committed():
            await self.group.settle()
            gathered = await self._gather_leaves([np.asarray(leaf) for leaf in local[0]], axis)
        return [[_readonly(g) for g in gathered] for _ in values]

    async def reduce_scatter(
        self, op: ReduceOp, values: Sequence[Sequence[object]], axis: int
    ) -> list[list[object]]:
        """All-reduce, then give global replica ``g`` the ``g``-th chunk along ``axis``."""
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
        """
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
        """Reduce the local components, then across processes (``Strategy.reduce``)."""
        specs = [self.describe(c) for c in components]
        if any(s.sparse for s in specs):
            raise NotImplementedError(
                "Strategy.reduce of IndexedSlices across processes is not supported; "
                "convert them to dense arrays first"
            )
        fields = cross_fields("reduce", op, axis, specs[:1])

        async def work() -> object:
            local_op = ReduceOp.SUM if op is ReduceOp.MEAN else op
            partial = _native(np.asarray(await self.inner.reduce(local_op, components, axis)))
            result = (await self._combine_leaves(local_op, [partial]))[0]
            if op is ReduceOp.MEAN:
                if axis is None:
                    count = len(components)
                else:
                    count = sum(
                        int(np.prod([s.shape[a] for a in axis], dtype=np.int64)) for s in specs
                    )
                total = await self._combine(ReduceOp.SUM, np.array([count], np.int64))
                result = np.true_divide(result, int(total[0]))
            return np.array(result)

        return await self.group.cross(fields, work)

    async def gather(self, components: Sequence[object], axis: int) -> object:
        """Concatenate the local components, then every process's, along ``axis``."""
        specs = [self.describe(c) for c in components]
        fields = cross_fields("gather", None, axis, specs[:1])

        async def work() -> object:
            local = _native(np.asarray(await self.inner.gather(components, axis)))
            return np.array((await self._gather_leaves([local], axis))[0])

        return await self.group.cross(fields, work)

    async def aclose(self) -> None:
        """Close the local backend."""
        await self.inner.aclose()


def _no_sparse(values: Sequence[Sequence[object]], what: str) -> None:
    for leaf in values[0] if values else ():
        if isinstance(leaf, IndexedSlices):
            raise NotImplementedError(
                f"{what} of IndexedSlices across processes is not supported by the MPI "
                "backend; convert them to dense arrays first"
            )
