"""A collective created but never awaited: CollectiveError when the replica finishes."""

import asyncio
import warnings

import asyncreplica as ar

strategy = ar.MirroredStrategy(["CPU:0", "CPU:1"])


async def step(x):
    ctx = ar.get_replica_context()
    ctx.barrier()  # BUG: no `await`, so the barrier never happens
    return x * 2


with warnings.catch_warnings():
    # Python's own "coroutine ... was never awaited" warning says the same thing, later.
    warnings.simplefilter("ignore", RuntimeWarning)
    try:
        asyncio.run(strategy.run(step, args=(1.0,)))
    except ar.CollectiveError as exc:
        error = exc
    else:
        raise SystemExit("expected CollectiveError")

print(error)
assert type(error) is ar.CollectiveError
assert "never awaited" in str(error)
assert "collectiveerror_never_awaited_broken.py:13" in str(error)  # where it was created
