"""Errors that every process must raise alike (run under mpiexec).

Usage: ``mpiexec -n P python errors.py SCENARIO``. Logs, per process, the class of
what ``run`` raised and its attributes (global replica ids) as JSON, then its message.

Scenarios:

* ``queued``: one replica per process; each starts a named ``all_reduce`` in a task,
  then makes an unnamed one whose op differs on the last process: the named one,
  queued behind the mismatching exchange, must not add a second failure.
* ``raise``: 2 replicas per process; every replica of the last process raises
  ``ValueError``: the others name the exception type.
* ``exited``: 2 replicas per process; the last replica returns early while every
  other waits at a collective: the same ``ReplicaExitedError`` attributes everywhere.
* ``cycle``: 2 replicas per process; process 0 awaits named collectives ``a`` then
  ``b``, the others ``b`` then ``a``: ``CollectiveDeadlockError``, as in one process.
* ``sparsity``: one replica per process; the last one all-reduces ``IndexedSlices``,
  the others dense arrays: ``CollectiveMismatchError`` (sparsity) everywhere.
* ``gather_ranks``: 2 replicas per process; ``strategy.gather`` of components of rank 2
  on replica 0 and rank 3 elsewhere: ``CollectiveMismatchError`` (shape) everywhere.
* ``too_big``: 1 replica per process; every replica all-reduces ``2**70`` (no dtype holds
  it): every process raises replica 0's ``TypeError``, as one process does.
* ``too_big_last``: 2 replicas per process; only the last replica all-reduces ``2**70``:
  its ``TypeError`` everywhere (not ``ReplicaExitedError`` on the others).
* ``shape_then_too_big`` (2 replicas per process) and ``shape_then_too_big_1`` (1):
  replica 0 all-reduces ``ones(3)``, the last replica ``2**70``, the others ``ones(2)``:
  one process finds the shape mismatch (replica 1) before the refusal (the last
  replica): ``CollectiveMismatchError`` (shape) everywhere, never a TypeError on one.
* ``too_big_then_shape``: 2 replicas per process; replica 0 all-reduces ``2**70``, the
  last replica ``ones(3)``, the others ``ones(2)``: replica 0's ``TypeError`` everywhere,
  the last process's own mismatch included.
* ``reduce_dtype``: 2 replicas per process; ``strategy.reduce`` of components of float32
  on the last replica, float64 elsewhere (found inside the last process alone):
  ``CollectiveMismatchError`` (dtype) everywhere.
* ``merge_bound``: 2 replicas per process; every replica passes one merge function,
  a ``functools.partial`` binding ``lr=0.5`` everywhere but on the last process
  (``lr=0.25``): ``CollectiveMismatchError`` (merge_fn) everywhere, never replica 0's
  ``lr`` silently.
* ``merge_lambda``: 1 replica per process; the last process passes the other of two
  lambdas written on one line (one name, one place, another body):
  ``CollectiveMismatchError`` (merge_fn) everywhere.
* ``reduce_keys`` (2 replicas per process) and ``reduce_keys_1`` (1): ``strategy.reduce``
  of a plain dict whose key is ``x`` on process 0 and ``y`` elsewhere:
  ``CollectiveMismatchError`` (structure) everywhere, never leaves paired by position.
* ``reduce_shape``: 2 replicas per process; ``strategy.reduce`` (``axis=None``) of a
  component of another shape on replica 1 (found inside process 0 alone): ``ValueError``
  everywhere.
"""

from __future__ import annotations

import asyncio
import functools
import json
import sys

import anyio
import numpy as np
from _report import report
from mpi4py import MPI

import asyncreplica as ar

SIZE = MPI.COMM_WORLD.Get_size()
RANK = MPI.COMM_WORLD.Get_rank()


async def queued() -> object:
    ctx = ar.get_replica_context()
    assert ctx is not None

    async def named() -> object:
        await asyncio.sleep(0)  # once the unnamed one below is at the group
        return await ctx.all_reduce("SUM", np.ones(2), name="loss")

    # (a task of the replica's own, as asyncio programs make them)
    task = asyncio.ensure_future(named())
    await ctx.all_reduce("MAX" if RANK == SIZE - 1 else "SUM", np.ones(3))
    return await task


async def raise_() -> object:
    ctx = ar.get_replica_context()
    assert ctx is not None
    if RANK == SIZE - 1:
        raise ValueError(f"bad value on replica {ctx.replica_id_in_sync_group}")
    return await ctx.all_reduce("SUM", np.ones(2))


async def exited() -> object:
    ctx = ar.get_replica_context()
    assert ctx is not None
    if ctx.replica_id_in_sync_group == ctx.num_replicas_in_sync - 1:
        return None
    return await ctx.all_reduce("SUM", np.ones(2))


async def cycle() -> object:
    ctx = ar.get_replica_context()
    assert ctx is not None
    order = ("a", "b") if RANK == 0 else ("b", "a")
    return [await ctx.all_reduce("SUM", np.ones(1), name=name) for name in order]


async def sparsity() -> object:
    ctx = ar.get_replica_context()
    assert ctx is not None
    if RANK == SIZE - 1:
        value: object = ar.IndexedSlices(np.ones((1, 2)), np.array([0]), np.array([4, 2]))
    else:
        value = np.ones((4, 2))
    return await ctx.all_reduce("SUM", value)


async def too_big() -> object:
    ctx = ar.get_replica_context()
    assert ctx is not None
    return await ctx.all_reduce("SUM", 2**70)


async def too_big_last() -> object:
    ctx = ar.get_replica_context()
    assert ctx is not None
    last = ctx.replica_id_in_sync_group == ctx.num_replicas_in_sync - 1
    return await ctx.all_reduce("SUM", 2**70 if last else 1)


async def shape_then_too_big() -> object:
    ctx = ar.get_replica_context()
    assert ctx is not None
    replica, last = ctx.replica_id_in_sync_group, ctx.num_replicas_in_sync - 1
    value = np.ones(3) if replica == 0 else 2**70 if replica == last else np.ones(2)
    return await ctx.all_reduce("SUM", value)


async def too_big_then_shape() -> object:
    ctx = ar.get_replica_context()
    assert ctx is not None
    replica, last = ctx.replica_id_in_sync_group, ctx.num_replicas_in_sync - 1
    value = 2**70 if replica == 0 else np.ones(3) if replica == last else np.ones(2)
    return await ctx.all_reduce("SUM", value)


def last_float32(context: ar.ValueContext) -> object:
    """Components of ``strategy.reduce``: float32 on the last replica, float64 elsewhere."""
    last = context.replica_id_in_sync_group == context.num_replicas_in_sync - 1
    return np.ones((2, 3), np.float32 if last else np.float64)


def second_shape(context: ar.ValueContext) -> object:
    """Components of ``strategy.reduce``: shape (2, 3) on replica 1, (2, 4) elsewhere."""
    return np.ones((2, 3)) if context.replica_id_in_sync_group == 1 else np.ones((2, 4))


def mixed_ranks(context: ar.ValueContext) -> object:
    """Components of ``strategy.gather`` of rank 2 on replica 0, of rank 3 elsewhere."""
    return np.ones((2, 3)) if context.replica_id_in_sync_group == 0 else np.ones((2, 3, 1))


def _lr(strategy: ar.Strategy, value: object, lr: float) -> float:
    return lr


async def merge_bound() -> object:
    ctx = ar.get_replica_context()
    assert ctx is not None
    lr = 0.25 if RANK == SIZE - 1 else 0.5
    return await ctx.merge_call(functools.partial(_lr, lr=lr), args=(1.0,))


async def merge_lambda() -> object:
    ctx = ar.get_replica_context()
    assert ctx is not None
    fn = (lambda s: 1.0) if RANK != SIZE - 1 else (lambda s: 2.0)
    return await ctx.merge_call(fn)


SCENARIOS = {
    "queued": (queued, 1),
    "raise": (raise_, 2),
    "exited": (exited, 2),
    "cycle": (cycle, 2),
    "sparsity": (sparsity, 1),
    "gather_ranks": (None, 2),
    "too_big": (too_big, 1),
    "too_big_last": (too_big_last, 2),
    "shape_then_too_big": (shape_then_too_big, 2),
    "shape_then_too_big_1": (shape_then_too_big, 1),
    "too_big_then_shape": (too_big_then_shape, 2),
    "reduce_dtype": (None, 2),
    "reduce_shape": (None, 2),
    "merge_bound": (merge_bound, 2),
    "merge_lambda": (merge_lambda, 1),
    "reduce_keys": (None, 2),
    "reduce_keys_1": (None, 1),
}


async def main(name: str) -> None:
    step, local = SCENARIOS[name]
    strategy = ar.MultiWorkerMirroredStrategy([f"CPU:{i}" for i in range(local)])
    try:
        if name == "gather_ranks":  # a cross-replica gather, outside run
            await strategy.gather(
                strategy.experimental_distribute_values_from_function(mixed_ranks), axis=0
            )
        elif name.startswith("reduce_keys"):  # a plain nest, outside run
            key = "x" if RANK == 0 else "y"
            await strategy.reduce("MEAN", {key: np.ones(3)}, axis=None)
        elif step is None:  # a cross-replica reduce, outside run
            make = last_float32 if name == "reduce_dtype" else second_shape
            await strategy.reduce(
                "SUM", strategy.experimental_distribute_values_from_function(make), axis=None
            )
        else:
            await strategy.run(step)
    except Exception as error:  # logged for the test
        fields: dict[str, object] = {"class": type(error).__name__}
        for attribute in ("replica_id", "position", "name", "fields", "cycle"):
            if hasattr(error, attribute):
                fields[attribute] = getattr(error, attribute)
        for attribute in ("waiting", "signatures"):
            if hasattr(error, attribute):
                fields[attribute] = sorted(getattr(error, attribute))
        report(json.dumps(fields))
        report(str(error))
    else:
        report("no error")
    # the strategy is still usable: the processes are in step
    again = await strategy.run(lambda: ar.get_replica_context().all_reduce("SUM", 1.0))
    report(f"again {float(np.asarray(strategy.experimental_local_results(again)[0]))}")


if __name__ == "__main__":
    anyio.run(main, sys.argv[1])
