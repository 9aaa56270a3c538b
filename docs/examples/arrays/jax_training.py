"""TensorFlow's custom-training tutorial with JAX: jax.grad per replica, all_reduce, SGD.

Each replica computes the gradients of its share of the global batch with ``jax.grad``;
``all_reduce`` sums them (JAX arrays in, JAX arrays out); every replica applies the
same update. The result matches a single-process JAX run on the whole batch.
"""

import asyncio

import jax
import jax.numpy as jnp
import numpy as np

import asyncreplica as ar

NUM_REPLICAS = 4
GLOBAL_BATCH = 64
LEARNING_RATE = 0.1
STEPS = 20

strategy = ar.MirroredStrategy([f"CPU:{i}" for i in range(NUM_REPLICAS)])

rng = np.random.default_rng(0)
features = rng.normal(size=(STEPS * GLOBAL_BATCH, 3)).astype(np.float32)
labels = (features @ np.array([2.0, -1.0, 0.5], np.float32) + 0.3).astype(np.float32)


def loss_fn(params, x, y):
    per_example = (x @ params["w"] + params["b"] - y) ** 2
    # TF: tf.nn.compute_average_loss(per_example, global_batch_size=GLOBAL_BATCH), so
    # that the replicas' summed gradients are the gradient of the global batch's mean.
    return jnp.sum(per_example) / GLOBAL_BATCH


grad_fn = jax.jit(jax.grad(loss_fn))


async def train_step(params, x, y):
    ctx = ar.get_replica_context()
    grads = grad_fn(params, x, y)  # this replica's gradients: a dict of JAX arrays
    grads = await ctx.all_reduce(ar.ReduceOp.SUM, grads)  # still JAX arrays
    return jax.tree.map(lambda p, g: p - LEARNING_RATE * g, params, grads)


def shards(step):
    """This step's global batch, split into one slice per replica."""
    batch = slice(step * GLOBAL_BATCH, (step + 1) * GLOBAL_BATCH)
    xs = np.split(features[batch], NUM_REPLICAS)
    ys = np.split(labels[batch], NUM_REPLICAS)
    return ar.PerReplica([jnp.asarray(x) for x in xs]), ar.PerReplica([jnp.asarray(y) for y in ys])


async def train():
    params = {"w": jnp.zeros(3, jnp.float32), "b": jnp.zeros((), jnp.float32)}
    for step in range(STEPS):
        x, y = shards(step)
        result = await strategy.run(train_step, args=(params, x, y))
        replicas = strategy.experimental_local_results(result)
        for other in replicas[1:]:  # every replica holds the same parameters
            assert all(np.array_equal(other[k], replicas[0][k]) for k in params)
        params = replicas[0]
    return params


params = asyncio.run(train())
assert isinstance(params["w"], jax.Array)  # JAX in, JAX out

# The same training in one process, on the whole global batch.
reference = {"w": jnp.zeros(3, jnp.float32), "b": jnp.zeros((), jnp.float32)}
for step in range(STEPS):
    batch = slice(step * GLOBAL_BATCH, (step + 1) * GLOBAL_BATCH)
    grads = jax.grad(loss_fn)(reference, features[batch], labels[batch])
    reference = jax.tree.map(lambda p, g: p - LEARNING_RATE * g, reference, grads)

print({k: np.asarray(v).round(3).tolist() for k, v in params.items()})
for key in params:
    # Summing four partial gradients rounds differently from one sum over the batch.
    np.testing.assert_allclose(params[key], reference[key], rtol=1e-5, atol=1e-6)
