"""Trace a few training steps with strategy.trace() and read the trace back."""

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import anyio
import numpy as np

import asyncreplica as ar

strategy = ar.MirroredStrategy(["CPU:0", "CPU:1", "CPU:2"])
rng = np.random.default_rng(0)
# Replica 1 has four times as much data as the others: its turn on the loop is longer.
shards = [rng.normal(size=(n, 32)) for n in (1000, 4000, 1000)]


async def train_step(w):
    ctx = ar.get_replica_context()
    x = shards[ctx.replica_id_in_sync_group]
    grad = x.T @ (x @ w - 1.0) / len(x)
    grad = await ctx.all_reduce("mean", grad)
    return w - 0.1 * grad


async def train(path, steps=5):
    w = np.zeros(32)
    with strategy.trace(path):  # every run in the block is recorded
        for _ in range(steps):
            w = strategy.experimental_local_results(await strategy.run(train_step, args=(w,)))[0]
    return w


with tempfile.TemporaryDirectory() as tmp:
    path = Path(tmp) / "train.json"
    anyio.run(train, path)

    # The file is Chrome trace-event JSON: open it in ui.perfetto.dev.
    trace = json.loads(path.read_text())
    slices = [e for e in trace["traceEvents"] if e.get("cat") == "collective"]
    assert len(slices) == 5 * 3  # one slice per collective per replica
    print(json.dumps(slices[0]["args"], indent=2))
    assert slices[0]["args"]["bytes"] == 32 * 8

    # The same summary as `asyncreplica trace summarize FILE`.
    summary = subprocess.run(
        [sys.executable, "-m", "asyncreplica", "trace", "summarize", str(path)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    print(summary)
    assert "3 replicas, 5 collectives in 5 runs" in summary
    assert "Slowest rendezvous: all_reduce(MEAN) at position 0" in summary
