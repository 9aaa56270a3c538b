"""Each behaviour that deliberately differs from tf.distribute, checked."""

import asyncio

import numpy as np

import asyncreplica as ar

strategy = ar.MirroredStrategy(["CPU:0", "CPU:1"])


def check(label, condition):
    print(f"{label:62} {'ok' if condition else 'FAILED'}")
    assert condition, label


async def main():
    # Replica ids are Python ints; devices is a flat tuple of canonical names.
    async def ids():
        ctx = ar.get_replica_context()
        return ctx.replica_id_in_sync_group, ctx.devices

    replica0, replica1 = strategy.experimental_local_results(await strategy.run(ids))
    check("replica_id_in_sync_group is a Python int", type(replica1[0]) is int)
    check('ReplicaContext.devices is ("CPU:1",) on replica 1', replica1[1] == ("CPU:1",))

    # all_reduce([]) returns [] (TF: AttributeError).
    async def empty():
        return await ar.get_replica_context().all_reduce("sum", [])

    check("all_reduce([]) returns []", await strategy.run(empty) == [])

    # all_gather accepts a negative axis whatever the dtype (TF: int32 only).
    async def gather_last(dtype):
        return await ar.get_replica_context().all_gather(np.ones((2, 3), dtype), axis=-1)

    for dtype in (np.int32, np.int64, np.float32):
        out = await strategy.run(gather_last, args=(dtype,))
        check(
            f"all_gather(axis=-1) works for {np.dtype(dtype).name}", out.values[0].shape == (2, 6)
        )

    # SUM of a value that is not distributed raises, even when it is all zeros.
    for value in (np.float64(3.0), np.zeros(2)):
        try:
            await strategy.reduce("sum", value, axis=None)
            raised = False
        except ValueError:
            raised = True
        check(f"reduce(SUM, plain {value!r}) raises ValueError", raised)
    check("reduce(MEAN, plain 3.0) returns it", await strategy.reduce("mean", 3.0) == 3.0)

    # A Mirrored value is reduced component by component (TF asserts on SUM).
    mirrored = ar.Mirrored([np.float64(1.0), np.float64(1.0)])
    check("reduce(SUM, Mirrored(1, 1)) == 2", await strategy.reduce("sum", mirrored) == 2.0)
    check("reduce(MEAN, Mirrored(1, 1)) == 1", await strategy.reduce("mean", mirrored) == 1.0)

    # Nests: gather and reduce(axis=...) work on every leaf (TF: replica 0 / stacking).
    pr = ar.PerReplica([np.array([1.0, 2.0]), np.array([3.0])])
    gathered = await strategy.gather({"a": pr, "b": [pr]}, axis=0)
    check("gather of a nest gathers every leaf", gathered["b"][0].tolist() == [1.0, 2.0, 3.0])
    reduced = await strategy.reduce("sum", (pr, pr), axis=[0])
    check(
        "reduce(axis=[0]) of a nest reduces every leaf", [float(r) for r in reduced] == [6.0, 6.0]
    )

    # A PerReplica argument needs exactly one component per replica.
    for components in ([1], [1, 2, 3]):
        try:
            await strategy.run(lambda x: x, args=(ar.PerReplica(components),))
            raised = False
        except ValueError:
            raised = True
        check(f"PerReplica with {len(components)} component(s) on 2 replicas: ValueError", raised)

    # bytes_per_pack is validated; it never changes a result (and here changes nothing).
    async def mixed(options):
        ctx = ar.get_replica_context()
        return await ctx.all_reduce("sum", [np.float32(1.0), np.int64(2)], options)

    results = []
    for bpp in (0, 1, 1 << 20):
        out = await strategy.run(mixed, args=(ar.CommunicationOptions(bytes_per_pack=bpp),))
        replica0 = strategy.experimental_local_results(out)[0]
        results.append([v.item() for v in replica0])
    check("mixed dtypes reduce with any bytes_per_pack", results == [[2.0, 4]] * 3)
    try:
        ar.CommunicationOptions(bytes_per_pack=-1)
        raised = False
    except ValueError:
        raised = True
    check("bytes_per_pack=-1 raises ValueError", raised)

    # Duplicate devices are refused, whatever the spelling.
    try:
        ar.MirroredStrategy(["CPU:0", "/job:localhost/replica:0/task:0/device:CPU:0"])
        raised = False
    except ValueError:
        raised = True
    check("duplicate devices raise ValueError", raised)


asyncio.run(main())
