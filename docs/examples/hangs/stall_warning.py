"""The stall warning: a WARNING on the "asyncreplica" logger, never a failure."""

import asyncio
import logging

import asyncreplica as ar

records = []


class Keep(logging.Handler):
    def emit(self, record):
        records.append(record)


logging.getLogger("asyncreplica").addHandler(Keep())

# The default is 30 s; a short one here so that the example runs quickly.
strategy = ar.MirroredStrategy(["CPU:0", "CPU:1"], stall_warning_seconds=0.1)


async def step():
    ctx = ar.get_replica_context()
    if ctx.replica_id_in_sync_group == 1:
        await asyncio.sleep(0.3)  # slow, but it does arrive
    return await ctx.all_reduce("sum", 1.0)


result = asyncio.run(strategy.run(step))
for record in records:
    print(record.levelname, record.getMessage(), sep=": ")
assert [float(v) for v in strategy.experimental_local_results(result)] == [2.0, 2.0]
stalled = [r for r in records if r.getMessage().startswith("Collective stalled")]
resumed = [r for r in records if r.getMessage().startswith("Collective resumed")]
assert len(stalled) == 1
assert len(resumed) == 1
assert stalled[0].levelno == logging.WARNING
assert "stall_warning.py:25" in stalled[0].getMessage()  # where replica 1 is: the sleep
