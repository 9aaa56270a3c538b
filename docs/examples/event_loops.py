"""One step function, three event loops: asyncio, Trio (through anyio) and uvloop."""

import asyncio

import anyio

import asyncreplica as ar

strategy = ar.MirroredStrategy(["CPU:0", "CPU:1"])


async def step():
    ctx = ar.get_replica_context()
    return await ctx.all_reduce("mean", float(ctx.replica_id_in_sync_group))


def check(result, loop):
    local = [float(v) for v in strategy.experimental_local_results(result)]
    print(f"{loop:8} {local}")
    assert local == [0.5, 0.5]


# asyncio
check(asyncio.run(strategy.run(step)), "asyncio")

# Trio, through anyio (or call trio.run(main) yourself)
check(anyio.run(strategy.run, step, backend="trio"), "trio")

# uvloop, through anyio's asyncio backend (needs `pip install uvloop`, not on Windows)
try:
    import uvloop  # noqa: F401
except ImportError:
    print("uvloop   not installed; skipped")
else:
    result = anyio.run(strategy.run, step, backend="asyncio", backend_options={"use_uvloop": True})
    check(result, "uvloop")
