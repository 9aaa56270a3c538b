"""A real mismatch, from the error message to the timeline.

Replica 1 swaps two reductions of the same shape on step 3. Run with a PNG path as the
argument to write the timeline there (docs/images/debugging-timeline.png is made so).
"""

import importlib.util
import subprocess
import sys
import tempfile
from pathlib import Path

import anyio
import numpy as np

import asyncreplica as ar

strategy = ar.MirroredStrategy(["CPU:0", "CPU:1", "CPU:2"])
rng = np.random.default_rng(0)
data = [(rng.normal(size=(2000, 16)), rng.integers(0, 2, 2000)) for _ in range(3)]


async def train_step(step, w, b):
    ctx = ar.get_replica_context()
    replica = ctx.replica_id_in_sync_group
    x, y = data[replica]
    p = 1.0 / (1.0 + np.exp(-(x @ w + b)))
    loss = -np.mean(y * np.log(p + 1e-9) + (1 - y) * np.log(1 - p + 1e-9))
    grad_w = await ctx.all_reduce("mean", x.T @ (p - y) / len(y))
    if step == 3 and replica == 1:  # stands for any branch on per-replica data
        loss = await ctx.all_reduce("mean", loss)
        grad_b = await ctx.all_reduce("mean", np.mean(p - y))
    else:
        grad_b = await ctx.all_reduce("mean", np.mean(p - y))
        loss = await ctx.all_reduce("mean", loss)
    return w - 0.5 * grad_w, b - 0.5 * grad_b, loss


async def train(path):
    w, b = np.zeros(16), 0.0
    with strategy.trace(path):
        for step in range(5):
            result = await strategy.run(train_step, args=(step, w, b))
            w, b, _ = (strategy.experimental_local_results(v)[0] for v in result)


def asyncreplica_cli(*args):
    command = [sys.executable, "-m", "asyncreplica", *map(str, args)]
    return subprocess.run(command, capture_output=True, text=True, check=True).stdout


with tempfile.TemporaryDirectory() as tmp:
    path = Path(tmp) / "train.json"
    try:
        anyio.run(train, path)
    except ar.CollectiveMismatchError as exc:
        error = exc
    else:
        raise SystemExit("expected a CollectiveMismatchError")
    print(error)  # 1. the error message
    assert error.position == 1
    assert error.fields == ("call site",)
    assert "replica 1 issues the same collectives as replicas 0, 2 in a different order" in str(
        error
    )

    summary = asyncreplica_cli("trace", "summarize", path)  # 2. the summary
    print(summary)
    assert "Run 3 failed: CollectiveMismatchError: Replicas disagree about their 2nd" in summary
    assert "mismatched position: 1 (differing: call site)" in summary
    assert "3 replicas, 11 collectives in 4 runs" in summary  # 3 x 3, then 1 done, 1 refused

    if importlib.util.find_spec("matplotlib") is not None:  # 3. the picture
        png = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tmp) / "timeline.png"
        asyncreplica_cli("trace", "plot", path, "-o", png)
        assert png.read_bytes()[:4] == b"\x89PNG"
