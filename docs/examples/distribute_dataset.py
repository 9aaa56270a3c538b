"""experimental_distribute_dataset: split global batches across replicas and train on them.

Linear regression y = 3x with data-parallel gradient descent on 4 replicas. The last
global batch is short (6 samples over 4 replicas: 2, 2, 2 and 0 samples), so each
replica sums its gradient and the step divides by the global batch size.
"""

import asyncio

import numpy as np

import asyncreplica as ar

strategy = ar.MirroredStrategy([f"CPU:{i}" for i in range(4)])

x = np.linspace(-1.0, 1.0, 14)
y = 3.0 * x
# Two global batches, of 8 and 6 samples; each is a dict of arrays (a nest).
global_batches = [{"x": x[i : i + 8], "y": y[i : i + 8]} for i in range(0, len(x), 8)]

dataset = strategy.experimental_distribute_dataset(global_batches)
sizes = [[len(part) for part in batch["x"].values] for batch in dataset]
print("samples per replica:", sizes)
assert sizes == [[2, 2, 2, 2], [2, 2, 2, 0]]


async def train_step(w, batch, global_size):
    ctx = ar.get_replica_context()
    error = w * batch["x"] - batch["y"]
    local_grad = np.sum(2.0 * error * batch["x"])  # 0.0 for an empty slice
    grad = await ctx.all_reduce(ar.ReduceOp.SUM, local_grad)
    return w - 0.5 * grad / global_size


async def main():
    w = 0.0
    for _epoch in range(30):
        for global_batch, batch in zip(global_batches, dataset, strict=True):
            new_w = await strategy.run(train_step, args=(w, batch, len(global_batch["x"])))
            # Every replica computed the same update from the same reduced gradient.
            components = strategy.experimental_local_results(new_w)
            assert all(float(c) == float(components[0]) for c in components)
            w = float(components[0])
    return w


w = asyncio.run(main())
print(f"w = {w:.6f}")
assert abs(w - 3.0) < 1e-6
