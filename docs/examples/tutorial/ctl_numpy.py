"""TensorFlow's tutorial "Custom training with tf.distribute.Strategy", ported with numpy.

Each step of the tutorial, in order, with its TensorFlow line in a comment. The model is
a softmax classifier whose gradients are written out in numpy; the data is synthetic
(the tutorial's Fashion-MNIST needs a download). The run is checked against the same
training on one device, on the whole global batch, and both dataset APIs give the same
result.
"""

import asyncio

import numpy as np

import asyncreplica as ar

# TF: strategy = tf.distribute.MirroredStrategy()
strategy = ar.MirroredStrategy(["CPU:0", "CPU:1"])
print("Number of devices:", strategy.num_replicas_in_sync)

BATCH_SIZE_PER_REPLICA = 16
GLOBAL_BATCH_SIZE = BATCH_SIZE_PER_REPLICA * strategy.num_replicas_in_sync
EPOCHS = 5
LEARNING_RATE = 0.5
NUM_CLASSES = 3
FEATURES = 8

rng = np.random.default_rng(0)
centers = rng.normal(size=(NUM_CLASSES, FEATURES))
train_labels = rng.integers(NUM_CLASSES, size=6 * GLOBAL_BATCH_SIZE)
train_images = centers[train_labels] + rng.normal(scale=0.8, size=(len(train_labels), FEATURES))
test_labels = rng.integers(NUM_CLASSES, size=2 * GLOBAL_BATCH_SIZE)
test_images = centers[test_labels] + rng.normal(scale=0.8, size=(len(test_labels), FEATURES))


def batched(images, labels, size):
    # TF: tf.data.Dataset.from_tensor_slices((images, labels)).batch(size)
    # (no shuffle here, so that the check below can replay the same batches)
    return [(images[i : i + size], labels[i : i + size]) for i in range(0, len(labels), size)]


# TF: train_dist_dataset = strategy.experimental_distribute_dataset(train_dataset)
# Each global batch of 32 is split in two slices of 16, one per replica.
train_dist_dataset = strategy.experimental_distribute_dataset(
    batched(train_images, train_labels, GLOBAL_BATCH_SIZE)
)
test_dist_dataset = strategy.experimental_distribute_dataset(
    batched(test_images, test_labels, GLOBAL_BATCH_SIZE)
)


def create_model(_context=None):
    return {"w": np.zeros((FEATURES, NUM_CLASSES)), "b": np.zeros(NUM_CLASSES)}


def forward(model, images):
    return images @ model["w"] + model["b"]


def per_example_loss_and_softmax(logits, labels):
    # TF: tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=NONE)
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    return -log_probs[np.arange(len(labels)), labels], np.exp(log_probs)


def compute_loss_and_gradients(model, images, labels, num_replicas):
    # TF: loss = tf.nn.compute_average_loss(per_example_loss): this replica's sum divided
    # by the *global* batch size (per-replica size x replicas), so that the replicas'
    # summed gradients are the gradient of the global batch's mean loss.
    global_batch_size = len(labels) * num_replicas
    logits = forward(model, images)
    per_example_loss, probs = per_example_loss_and_softmax(logits, labels)
    loss = per_example_loss.sum() / global_batch_size
    # TF: tape.gradient(loss, model.trainable_variables)
    dlogits = probs
    dlogits[np.arange(len(labels)), labels] -= 1.0
    dlogits /= global_batch_size
    gradients = {"w": images.T @ dlogits, "b": dlogits.sum(axis=0)}
    return loss, gradients, logits


# TF: with strategy.scope(): model = create_model()
# The model's variables are MirroredVariables: one copy per replica. Here: one copy of
# the parameters per replica, made by a function, a dict of PerReplica values.
model = strategy.experimental_distribute_values_from_function(create_model)


async def train_step(inputs, model):
    images, labels = inputs
    ctx = ar.get_replica_context()
    loss, gradients, logits = compute_loss_and_gradients(
        model, images, labels, ctx.num_replicas_in_sync
    )
    # TF: optimizer.apply_gradients(zip(gradients, model.trainable_variables)) sums the
    # gradients over the replicas and updates every replica's copy of the variables.
    # Here: sum them yourself (one collective for the whole dict), then update this
    # replica's own copy. all_reduce's results are read-only views of one shared buffer:
    # update your own arrays with them, do not write into them.
    gradients = await ctx.all_reduce(ar.ReduceOp.SUM, gradients)
    for name in model:
        model[name] -= LEARNING_RATE * gradients[name]
    # TF: train_accuracy.update_state(labels, predictions)
    correct = np.sum(logits.argmax(axis=1) == labels)
    return loss, correct


async def distributed_train_step(dataset_inputs):
    # TF: per_replica_losses = strategy.run(train_step, args=(dataset_inputs,))
    per_replica_losses, per_replica_correct = await strategy.run(
        train_step, args=(dataset_inputs, model)
    )
    # TF: return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_losses, axis=None)
    loss = await strategy.reduce(ar.ReduceOp.SUM, per_replica_losses, axis=None)
    correct = await strategy.reduce(ar.ReduceOp.SUM, per_replica_correct, axis=None)
    return loss, correct


async def test_step(inputs, model):
    images, labels = inputs
    logits = forward(model, images)
    per_example_loss, _ = per_example_loss_and_softmax(logits, labels)
    # TF: test_loss.update_state(t_loss); test_accuracy.update_state(labels, predictions)
    return per_example_loss.sum(), np.sum(logits.argmax(axis=1) == labels)


async def distributed_test_step(dataset_inputs):
    sums, correct = await strategy.run(test_step, args=(dataset_inputs, model))
    return (
        await strategy.reduce(ar.ReduceOp.SUM, sums, axis=None),
        await strategy.reduce(ar.ReduceOp.SUM, correct, axis=None),
    )


async def main(dataset):
    history = []
    for epoch in range(EPOCHS):
        total_loss, num_batches, train_correct = 0.0, 0, 0
        for x in dataset:  # TF: for x in train_dist_dataset:
            loss, correct = await distributed_train_step(x)
            total_loss += float(loss)
            train_correct += int(correct)
            num_batches += 1
        train_loss = total_loss / num_batches
        test_sum, test_correct = 0.0, 0
        for x in test_dist_dataset:
            loss_sum, correct = await distributed_test_step(x)
            test_sum += float(loss_sum)
            test_correct += int(correct)
        test_loss = test_sum / len(test_labels)
        print(
            f"Epoch {epoch + 1}, Loss: {train_loss:.4f}, "
            f"Accuracy: {100 * train_correct / len(train_labels):.1f}, "
            f"Test Loss: {test_loss:.4f}, "
            f"Test Accuracy: {100 * test_correct / len(test_labels):.1f}"
        )
        history.append((train_loss, test_loss))
    return history


history = asyncio.run(main(train_dist_dataset))
replica_models = strategy.experimental_local_results(model)
for name in ("w", "b"):  # every replica's copy is the same
    assert np.array_equal(replica_models[0][name], replica_models[1][name])
assert history[-1][1] < history[0][1]  # the test loss went down

# The same training on one device, on each whole global batch.
reference = create_model()
for _ in range(EPOCHS):
    for images, labels in batched(train_images, train_labels, GLOBAL_BATCH_SIZE):
        _, gradients, _ = compute_loss_and_gradients(reference, images, labels, 1)
        for name in reference:
            reference[name] -= LEARNING_RATE * gradients[name]
for name in reference:
    # Two partial gradients summed round differently from one sum over the batch.
    np.testing.assert_allclose(replica_models[0][name], reference[name], rtol=1e-12, atol=1e-12)


# The tutorial's other input API. TF: strategy.distribute_datasets_from_function(dataset_fn)
# dataset_fn builds this process's pipeline of *per-replica* batches; each step, each
# replica takes the next one, so replica 0 gets rows 0-15 and replica 1 rows 16-31, as
# experimental_distribute_dataset gave them.
def dataset_fn(input_context):
    batch_size = input_context.get_per_replica_batch_size(GLOBAL_BATCH_SIZE)
    # TF: dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    assert input_context.num_input_pipelines == 1  # one process
    return batched(train_images, train_labels, batch_size)


first_run = replica_models[0]
model = strategy.experimental_distribute_values_from_function(create_model)
asyncio.run(main(strategy.distribute_datasets_from_function(dataset_fn)))
for name in ("w", "b"):
    assert np.array_equal(strategy.experimental_local_results(model)[0][name], first_run[name])
