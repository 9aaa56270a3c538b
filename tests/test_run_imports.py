"""No module is imported inside a run: the first ``strategy.run`` must not block the loop.

anyio imports its backend for the running loop on first use; inside the first run of a
process that took 70-100 ms of the event loop. The strategy imports it when it is built.
Each case runs in a fresh interpreter, where nothing has been imported yet.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

PROGRAM = """
import sys

loop = sys.argv[1]
if loop == "trio":
    import trio
import asyncreplica as ar

strategy = ar.MirroredStrategy(["CPU:0", "CPU:1"])
imported = []


class Recorder:
    # A meta-path finder that only records: every import that is not already in
    # sys.modules asks it first.
    def find_spec(self, name, path=None, target=None):
        imported.append(name)
        return None


async def step(x):
    ctx = ar.get_replica_context()
    total = await ctx.all_reduce("sum", x)
    await ctx.barrier()
    return await ctx.all_gather(total.reshape(1), axis=0)


async def main():
    sys.meta_path.insert(0, Recorder())
    try:
        await strategy.run(step, args=(ar.PerReplica([1.0, 2.0]),))
    finally:
        del sys.meta_path[0]


if loop == "trio":
    trio.run(main)
elif loop == "uvloop":
    import uvloop

    uvloop.run(main())
else:
    import asyncio

    asyncio.run(main())
print("IMPORTED", imported)
"""

LOOPS = [
    "asyncio",
    pytest.param(
        "uvloop",
        marks=pytest.mark.skipif(importlib.util.find_spec("uvloop") is None, reason="no uvloop"),
    ),
    pytest.param(
        "trio",
        marks=pytest.mark.skipif(importlib.util.find_spec("trio") is None, reason="no trio"),
    ),
]


@pytest.mark.parametrize("loop", LOOPS)
def test_the_first_run_imports_nothing(loop: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", PROGRAM, loop],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "IMPORTED []" in proc.stdout, proc.stdout
