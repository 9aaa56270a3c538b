"""TensorFlow's custom-training tutorial, ported with JAX: jax.grad in each replica.

The loop of ctl_numpy.py with the gradients taken by ``jax.grad``. JAX arrays cannot
be updated in place, so each replica returns its new parameters, which ``run`` gives
back as a ``PerReplica`` per leaf (one copy per replica), passed to the next step.
Checked against the same training in one process.
"""

import asyncio

import jax
import jax.numpy as jnp
import numpy as np

import asyncreplica as ar

strategy = ar.MirroredStrategy(["CPU:0", "CPU:1"])
BATCH_SIZE_PER_REPLICA = 16
GLOBAL_BATCH_SIZE = BATCH_SIZE_PER_REPLICA * strategy.num_replicas_in_sync
EPOCHS = 3
LEARNING_RATE = 0.5
NUM_CLASSES = 3
FEATURES = 8

rng = np.random.default_rng(0)
centers = rng.normal(size=(NUM_CLASSES, FEATURES))
train_labels = rng.integers(NUM_CLASSES, size=6 * GLOBAL_BATCH_SIZE)
train_images = centers[train_labels] + rng.normal(scale=0.8, size=(len(train_labels), FEATURES))
train_images = train_images.astype(np.float32)
batches = [
    (jnp.asarray(train_images[i : i + GLOBAL_BATCH_SIZE]), train_labels[i : i + GLOBAL_BATCH_SIZE])
    for i in range(0, len(train_labels), GLOBAL_BATCH_SIZE)
]
# TF: strategy.experimental_distribute_dataset(train_dataset): JAX arrays are split too.
train_dist_dataset = strategy.experimental_distribute_dataset(batches)


def create_model(_context=None):
    return {
        "w": jnp.zeros((FEATURES, NUM_CLASSES), jnp.float32),
        "b": jnp.zeros(NUM_CLASSES, jnp.float32),
    }


def compute_loss(model, images, labels, global_batch_size):
    logits = images @ model["w"] + model["b"]
    log_probs = jax.nn.log_softmax(logits)
    per_example_loss = -jnp.take_along_axis(log_probs, labels[:, None], axis=1)[:, 0]
    # TF: tf.nn.compute_average_loss(per_example_loss): divide by the global batch size
    return jnp.sum(per_example_loss) / global_batch_size


# TF: tape.gradient(loss, model.trainable_variables)
loss_and_grad = jax.jit(jax.value_and_grad(compute_loss), static_argnums=3)


async def train_step(inputs, model):
    images, labels = inputs
    ctx = ar.get_replica_context()
    loss, gradients = loss_and_grad(model, images, labels, GLOBAL_BATCH_SIZE)
    # TF: optimizer.apply_gradients(...): sum the gradients over the replicas (JAX arrays
    # in, JAX arrays out), then every replica computes the same new parameters.
    gradients = await ctx.all_reduce(ar.ReduceOp.SUM, gradients)
    model = jax.tree.map(lambda p, g: p - LEARNING_RATE * g, model, gradients)
    return loss, model


async def main():
    model = strategy.experimental_distribute_values_from_function(create_model)
    for epoch in range(EPOCHS):
        total_loss, num_batches = 0.0, 0
        for x in train_dist_dataset:
            per_replica_losses, model = await strategy.run(train_step, args=(x, model))
            # TF: strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_losses, axis=None)
            total_loss += float(await strategy.reduce("sum", per_replica_losses, axis=None))
            num_batches += 1
        print(f"Epoch {epoch + 1}, Loss: {total_loss / num_batches:.4f}")
    return strategy.experimental_local_results(model)


replica_models = asyncio.run(main())
assert isinstance(replica_models[0]["w"], jax.Array)  # JAX in, JAX out
for name in ("w", "b"):  # every replica computed the same parameters
    assert np.array_equal(replica_models[0][name], replica_models[1][name])

reference = create_model()
for _ in range(EPOCHS):
    for images, labels in batches:
        _, gradients = loss_and_grad(reference, images, labels, GLOBAL_BATCH_SIZE)
        reference = jax.tree.map(lambda p, g: p - LEARNING_RATE * g, reference, gradients)
for name in reference:
    # float32, and two partial sums round differently from one sum over the batch
    np.testing.assert_allclose(replica_models[0][name], reference[name], rtol=1e-5, atol=1e-6)
