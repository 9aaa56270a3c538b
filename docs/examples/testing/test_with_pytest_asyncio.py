"""The same fixtures under pytest-asyncio, in strict mode (asyncio_mode = strict)."""

import importlib.util
import subprocess
import sys

import numpy as np
import pytest

import asyncreplica as ar

# Strict mode runs only the tests marked asyncio; in auto mode the mark is not needed.
pytestmark = pytest.mark.asyncio


async def global_sum(value):
    ctx = ar.get_replica_context()
    return await ctx.all_reduce("sum", value)


async def test_global_sum(strategy):
    # test_global_sum[numpy-2] and [numpy-4], on pytest-asyncio's event loop.
    result = await strategy.run(global_sum, args=(np.float64(1.0),))

    n = strategy.num_replicas_in_sync
    assert strategy.experimental_local_results(result) == (n,) * n


async def test_factory(asyncreplica_strategy_factory):
    strategy = asyncreplica_strategy_factory(3)

    result = await strategy.run(global_sum, args=(np.float64(2.0),))

    assert strategy.experimental_local_results(result) == (6.0, 6.0, 6.0)


if __name__ == "__main__":
    if importlib.util.find_spec("pytest_asyncio") is None:
        print("skipped: this example needs pytest-asyncio (pip install pytest-asyncio)")
        raise SystemExit(0)
    command = [sys.executable, "-m", "pytest", __file__, "-v", "-p", "asyncreplica"]
    for mode in ("strict", "auto"):
        done = subprocess.run(
            [*command, "-o", f"asyncio_mode={mode}"], capture_output=True, text=True
        )
        print(done.stdout)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "test_global_sum[numpy-2] PASSED" in done.stdout
        assert "3 passed" in done.stdout
        assert "warning" not in done.stdout
