"""Test a step function on 2 and 4 replicas with the asyncreplica pytest plugin."""

import subprocess
import sys

import numpy as np
import pytest

import asyncreplica as ar

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    # anyio's own fixture runs every test on each installed anyio backend (asyncio, trio)
    # and prefixes the ids with it: test_global_mean[asyncio-numpy-2]. One loop here.
    return "asyncio"


async def global_mean(values):
    """The code under test: the mean over every replica's values."""
    ctx = ar.get_replica_context()
    total = await ctx.all_reduce("sum", values.sum())
    count = await ctx.all_reduce("sum", np.float64(values.size))
    return total / count


def shards(strategy):
    """Replica i holds [3i, 3i+1, 3i+2]."""
    return strategy.experimental_distribute_values_from_function(
        lambda ctx: np.arange(3.0) + 3 * ctx.replica_id_in_sync_group
    )


async def test_global_mean(strategy):
    # Runs once per replica count and backend: test_global_mean[numpy-2], [numpy-4].
    result = await strategy.run(global_mean, args=(shards(strategy),))

    expected = np.arange(3.0 * strategy.num_replicas_in_sync).mean()
    assert all(r == expected for r in strategy.experimental_local_results(result))


@pytest.mark.asyncreplica(replicas=[1, 3])
async def test_odd_replica_counts(strategy):
    # The marker replaces the counts for this test: [numpy-1], [numpy-3].
    result = await strategy.run(global_mean, args=(shards(strategy),))

    expected = np.arange(3.0 * strategy.num_replicas_in_sync).mean()
    assert all(r == expected for r in strategy.experimental_local_results(result))


async def test_many_replicas(asyncreplica_strategy_factory):
    # The factory makes strategies with other counts or arguments.
    strategy = asyncreplica_strategy_factory(8, check_call_sites=False)

    result = await strategy.run(global_mean, args=(shards(strategy),))

    assert all(r == 11.5 for r in strategy.experimental_local_results(result))


if __name__ == "__main__":
    command = [sys.executable, "-m", "pytest", __file__, "-p", "asyncreplica"]
    # The test ids the page names.
    listed = subprocess.run([*command, "--collect-only", "-q"], capture_output=True, text=True)
    print(listed.stdout)
    for test_id in ("test_global_mean[numpy-2]", "test_global_mean[numpy-4]", "[numpy-3]"):
        assert test_id in listed.stdout, listed.stdout + listed.stderr
    # What `pytest test_global_mean.py` does, in the default and in the random schedule.
    for options in ([], ["--asyncreplica-schedule=random"]):
        done = subprocess.run([*command, "-q", *options], capture_output=True, text=True)
        print(done.stdout)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "5 passed" in done.stdout
