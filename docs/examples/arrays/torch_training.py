"""TensorFlow's custom-training tutorial with PyTorch: autograd per replica, all_reduce, SGD.

Each replica holds its own copy of the model (TF's mirrored variables) and its own
optimizer. It computes the gradients of its share of the global batch with
``loss.backward()``; ``all_reduce`` sums them (tensors in, tensors out); every replica
writes the sums into its parameters' ``.grad`` and takes the same optimizer step. The
result matches a single-process PyTorch run on the whole batch.
"""

import asyncio
import copy

import numpy as np
import torch

import asyncreplica as ar

NUM_REPLICAS = 4
GLOBAL_BATCH = 64
LEARNING_RATE = 0.1
STEPS = 20

strategy = ar.MirroredStrategy([f"CPU:{i}" for i in range(NUM_REPLICAS)])

rng = np.random.default_rng(0)
features = torch.from_numpy(rng.normal(size=(STEPS * GLOBAL_BATCH, 3)).astype(np.float32))
labels = features @ torch.tensor([2.0, -1.0, 0.5]) + 0.3


def new_model():
    model = torch.nn.Linear(3, 1)
    torch.nn.init.zeros_(model.weight)
    torch.nn.init.zeros_(model.bias)
    return model


def loss_fn(model, x, y):
    per_example = (model(x).squeeze(-1) - y) ** 2
    # TF: tf.nn.compute_average_loss(per_example, global_batch_size=GLOBAL_BATCH), so
    # that the replicas' summed gradients are the gradient of the global batch's mean.
    return per_example.sum() / GLOBAL_BATCH


async def train_step(model, optimizer, x, y):
    ctx = ar.get_replica_context()
    optimizer.zero_grad()
    loss_fn(model, x, y).backward()  # this replica's gradients, in each parameter's .grad
    grads = [p.grad for p in model.parameters()]  # tensors; no grad of their own
    grads = await ctx.all_reduce(ar.ReduceOp.SUM, grads)  # still tensors: the sums
    for p, g in zip(model.parameters(), grads, strict=True):
        p.grad = g
    optimizer.step()


def shards(step):
    """This step's global batch, split into one slice per replica."""
    batch = slice(step * GLOBAL_BATCH, (step + 1) * GLOBAL_BATCH)
    xs = features[batch].chunk(NUM_REPLICAS)
    ys = labels[batch].chunk(NUM_REPLICAS)
    return ar.PerReplica(list(xs)), ar.PerReplica(list(ys))


async def train():
    model = new_model()
    models = [copy.deepcopy(model) for _ in range(NUM_REPLICAS)]  # one copy per replica
    optimizers = [torch.optim.SGD(m.parameters(), lr=LEARNING_RATE) for m in models]
    for step in range(STEPS):
        x, y = shards(step)
        await strategy.run(
            train_step, args=(ar.PerReplica(models), ar.PerReplica(optimizers), x, y)
        )
    for other in models[1:]:  # every replica holds the same parameters
        for p, q in zip(other.parameters(), models[0].parameters(), strict=True):
            assert torch.equal(p, q)
    return models[0]


trained = asyncio.run(train())

# The same training in one process, on the whole global batch.
reference = new_model()
optimizer = torch.optim.SGD(reference.parameters(), lr=LEARNING_RATE)
for step in range(STEPS):
    batch = slice(step * GLOBAL_BATCH, (step + 1) * GLOBAL_BATCH)
    optimizer.zero_grad()
    loss_fn(reference, features[batch], labels[batch]).backward()
    optimizer.step()

print({name: p.detach().round(decimals=3).tolist() for name, p in trained.named_parameters()})
for p, q in zip(trained.parameters(), reference.parameters(), strict=True):
    # Summing four partial gradients rounds differently from one sum over the batch.
    torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
