"""Every collective across processes, checked against numpy (run under mpiexec).

Process ``r`` runs ``r + 1`` replicas (uneven on purpose). Usage:
``mpiexec -n P python collectives.py [asyncio|trio]``. Prints ``rank=R ok`` per check.
"""

from __future__ import annotations

import sys

import anyio
import numpy as np
import pytest
from mpi4py import MPI

import asyncreplica as ar

RANK = MPI.COMM_WORLD.Get_rank()
SIZE = MPI.COMM_WORLD.Get_size()
LOCAL = RANK + 1
TOTAL = sum(r + 1 for r in range(SIZE))
FIRST = sum(r + 1 for r in range(RANK))


def value(g: int) -> np.ndarray:
    """Replica ``g``'s contribution (global id)."""
    return np.arange(6, dtype=np.float32).reshape(2, 3) * (g + 1) + g


ALL = [value(g) for g in range(TOTAL)]


def check(name: str, got: object, want: object) -> None:
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want), err_msg=name)
    print(f"rank={RANK} ok {name}", flush=True)


async def step() -> dict[str, object]:
    ctx = ar.get_replica_context()
    assert ctx is not None
    g = ctx.replica_id_in_sync_group
    assert ctx.num_replicas_in_sync == TOTAL
    x = value(g)
    out: dict[str, object] = {"g": g}
    out["sum"] = await ctx.all_reduce("SUM", x)
    out["mean"] = await ctx.all_reduce(ar.ReduceOp.MEAN, x)
    out["max"] = await ctx.all_reduce("MAX", x)
    out["min"] = await ctx.all_reduce("MIN", x)
    out["prod"] = await ctx.all_reduce("PROD", x[:, :1] * 0 + 2)
    out["imean"] = await ctx.all_reduce("MEAN", np.array([g], np.int64))
    out["nest"] = await ctx.all_reduce("SUM", {"a": x, "b": [np.float64(g), np.ones(3, np.int32)]})
    out["big"] = await ctx.all_reduce("SUM", np.full(50_000, g, np.float64))
    out["packed"] = await ctx.all_reduce(
        "SUM",
        [np.full(100, g, np.float32) for _ in range(5)],
        options=ar.CommunicationOptions(bytes_per_pack=800),
    )
    # uneven sizes along the gathered axis: replica g contributes g + 1 rows
    out["gather"] = await ctx.all_gather(np.full((g + 1, 2), g, np.int32), axis=0)
    out["gather1"] = await ctx.all_gather(x, axis=1)
    out["bcast"] = await ctx.broadcast(x, source=TOTAL - 1)
    out["rs"] = await ctx.reduce_scatter("SUM", np.ones((TOTAL * 2, 3)) * g, axis=0)
    await ctx.barrier()
    out["named"] = await ctx.all_reduce("SUM", np.float32(g), name="loss")

    def merge_fn(strategy: ar.Strategy, v: object) -> object:
        return v

    merged = await ctx.merge_call(merge_fn, args=(x,))
    out["merge"] = merged
    return out


async def main() -> None:
    strategy = ar.MultiWorkerMirroredStrategy([f"CPU:{i}" for i in range(LOCAL)])
    assert strategy.num_replicas_in_sync == TOTAL
    result = await strategy.run(step)
    locals_ = strategy.experimental_local_results(result)
    assert len(locals_) == LOCAL
    total = sum(ALL)
    for i, out in enumerate(locals_):
        g = FIRST + i
        assert out["g"] == g
        check("sum", out["sum"], total)
        check("mean", out["mean"], total / TOTAL)
        check("max", out["max"], np.maximum.reduce(ALL))
        check("min", out["min"], np.minimum.reduce(ALL))
        check("prod", out["prod"], np.full((2, 1), 2.0**TOTAL, np.float32))
        assert out["imean"].dtype == np.float64
        check("imean", out["imean"], [sum(range(TOTAL)) / TOTAL])
        check("nest.a", out["nest"]["a"], total)
        check("nest.b0", out["nest"]["b"][0], sum(range(TOTAL)))
        check("nest.b1", out["nest"]["b"][1], np.full(3, TOTAL, np.int32))
        check("big", out["big"], np.full(50_000, sum(range(TOTAL)), np.float64))
        for leaf in out["packed"]:
            check("packed", leaf, np.full(100, sum(range(TOTAL)), np.float32))
        want = np.concatenate([np.full((h + 1, 2), h, np.int32) for h in range(TOTAL)])
        check("gather", out["gather"], want)
        check("gather1", out["gather1"], np.concatenate(ALL, axis=1))
        check("bcast", out["bcast"], ALL[-1])
        check("rs", out["rs"], np.full((2, 3), sum(range(TOTAL)), np.float64))
        check("named", out["named"], sum(range(TOTAL)))
        check("merge", out["merge"], value(g))
        assert not np.asarray(out["sum"]).flags.writeable
    # cross-replica APIs reduce across every process
    sums = await strategy.reduce("SUM", result["sum"], axis=None)
    check("reduce-sum", sums, total * TOTAL)
    per = strategy.experimental_distribute_values_from_function(
        lambda c: np.full(c.replica_id_in_sync_group + 1, 1.0)
    )
    check("reduce-mean-axis", await strategy.reduce("MEAN", per, axis=0), 1.0)
    check("reduce-sum-axis", await strategy.reduce("SUM", per, axis=0), sum(range(1, TOTAL + 1)))
    ones = strategy.experimental_distribute_values_from_function(lambda c: np.ones(2))
    check("reduce_to", await strategy.extended.reduce_to("SUM", ones, "CPU:0"), [TOTAL] * 2)
    pairs = [(ones, "CPU:0"), (ones, ones)]
    single, mirrored = await strategy.extended.batch_reduce_to("MEAN", pairs)
    check("batch_reduce_to", single, [1.0, 1.0])
    # One local replica gives one array (TF's regroup); more give a Mirrored.
    assert isinstance(mirrored, ar.Mirrored) == (LOCAL > 1)
    for component in strategy.experimental_local_results(mirrored):
        check("batch_reduce_to-mirrored", component, [1.0, 1.0])
    gathered = await strategy.gather(per, axis=0)
    check("gather-cross", gathered, np.ones(sum(range(1, TOTAL + 1))))
    # a PerReplica of nests is the nest of PerReplica values, reduced leaf by leaf
    nested = ar.PerReplica([{"a": np.ones(2), "b": [np.float64(FIRST + i)]} for i in range(LOCAL)])
    got = await strategy.reduce("SUM", nested, axis=None)
    assert sorted(got) == ["a", "b"]
    check("reduce-nested", got["a"], [TOTAL] * 2)
    check("reduce-nested-list", got["b"][0], sum(range(TOTAL)))
    (to,) = await strategy.extended.batch_reduce_to("MEAN", [(nested, "CPU:0")])
    check("batch_reduce_to-nested", to["a"], [1.0, 1.0])
    # a dataset is split by global replica: this process keeps its replicas' slices
    dataset = strategy.experimental_distribute_dataset([np.arange(TOTAL * 2)])
    for batch in dataset:
        parts = strategy.experimental_local_results(batch)
        for i, part in enumerate(parts):
            check("dataset", part, np.arange(2) + 2 * (FIRST + i))
    # distribute_datasets_from_function: one input pipeline per process
    contexts = []

    def dataset_fn(ctx: ar.InputContext) -> list[np.ndarray]:
        contexts.append(ctx)
        return [np.full(1, 10 * RANK + k) for k in range(LOCAL)]

    steps = list(strategy.distribute_datasets_from_function(dataset_fn))
    (ctx,) = contexts
    assert (ctx.num_input_pipelines, ctx.input_pipeline_id) == (SIZE, RANK), ctx
    assert ctx.num_replicas_in_sync == TOTAL, ctx
    assert len(steps) == 1
    for k, part in enumerate(strategy.experimental_local_results(steps[0])):
        check("datasets_from_function", part, [10 * RANK + k])
    # a second run works after the first
    again = await strategy.run(lambda: ar.get_replica_context().all_reduce("SUM", 1.0))
    for v in strategy.experimental_local_results(again):
        check("second-run", v, float(TOTAL))
    # the strategy runs on a duplicate of the communicator it is given
    sub = MPI.COMM_WORLD.Split(color=0, key=SIZE - RANK)  # ranks reversed
    reversed_strategy = ar.MultiWorkerMirroredStrategy(["CPU:0"], communicator=sub)
    assert reversed_strategy.process_rank == SIZE - 1 - RANK

    async def first_id() -> object:
        ctx = ar.get_replica_context()
        assert ctx is not None
        return await ctx.broadcast(np.array([RANK]), source=0)

    got = await reversed_strategy.run(first_id)
    check("communicator", got, [SIZE - 1])  # global replica 0 is on the last world rank
    with pytest.raises(TypeError, match="mpi4py Intracomm"):
        ar.MultiWorkerMirroredStrategy(communicator="world")
    print(f"rank={RANK} done", flush=True)


if __name__ == "__main__":
    anyio.run(main, backend=sys.argv[1] if len(sys.argv) > 1 else "asyncio")
