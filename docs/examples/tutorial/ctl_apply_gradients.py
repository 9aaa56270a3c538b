"""optimizer.apply_gradients's own structure: merge_call, then extended.update.

In TensorFlow, ``apply_gradients`` called in a replica calls ``merge_call``: its
function runs once, in cross-replica context, sums the gradients and updates each
replica's copy of every variable with ``extended.update``. The same here. The function
receives the replicas' gradients as ``PerReplica`` values (one component per replica),
not as arrays: arithmetic on them raises ``TypeError``; reduce them first.
"""

import asyncio

import numpy as np

import asyncreplica as ar

strategy = ar.MirroredStrategy(["CPU:0", "CPU:1"])
LEARNING_RATE = 0.1

# One copy of the weights per replica (TF: a MirroredVariable made in strategy.scope()).
weights = strategy.experimental_distribute_values_from_function(lambda _: np.zeros(2))
failures = []


async def apply_gradients(strategy, gradients, weights):
    # merge_fn: runs once, with every replica paused at its merge_call. Values that
    # differ per replica arrive as PerReplica: gradients, and weights (each replica
    # passed its own copy).
    assert isinstance(gradients, ar.PerReplica)
    assert isinstance(weights, ar.PerReplica)
    try:
        LEARNING_RATE * gradients  # what a port of TF's update code tries first
    except TypeError as error:
        failures.append(str(error))
    # Sum the replicas' gradients: one array (TF: extended.batch_reduce_to(SUM, ...)).
    total = await strategy.reduce(ar.ReduceOp.SUM, gradients, axis=None)

    def update(copy, gradient):  # called once per replica's copy
        copy -= LEARNING_RATE * gradient  # in place, as TF's var.assign_sub
        return copy

    # TF: strategy.extended.update(var, update, args=(gradient,))
    await strategy.extended.update(weights, update, args=(total,))


async def train_step(x, weights):
    ctx = ar.get_replica_context()
    gradients = 2.0 * x  # this replica's gradients of sum(x * w) ... any gradients
    # TF: optimizer.apply_gradients(zip(gradients, variables))
    await ctx.merge_call(apply_gradients, args=(gradients, weights))


x = ar.PerReplica([np.array([1.0, 2.0]), np.array([3.0, 4.0])])
asyncio.run(strategy.run(train_step, args=(x, weights)))

print(failures[0])  # unsupported operand type(s) for *: 'float' and 'PerReplica'
assert failures == ["unsupported operand type(s) for *: 'float' and 'PerReplica'"]
for copy in strategy.experimental_local_results(weights):
    # the summed gradient 2 * ([1, 2] + [3, 4]) = [8, 12], applied once to each copy
    np.testing.assert_allclose(copy, [-0.8, -1.2])
