"""A JAX pytree (a registered dataclass) through run, all_reduce and Strategy.reduce."""

import asyncio
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

import asyncreplica as ar


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Params:
    w: jax.Array
    b: jax.Array
    lr: float = dataclasses.field(metadata={"static": True}, default=0.1)


strategy = ar.MirroredStrategy(["CPU:0", "CPU:1"])


async def step(params: Params) -> Params:
    ctx = ar.get_replica_context()
    # Each replica's gradients, as a Params of its own (here: made up from its id).
    r = ctx.replica_id_in_sync_group
    grads = Params(jnp.full(3, float(r + 1)), jnp.full(1, float(r)))
    grads = await ctx.all_reduce("mean", grads)  # a Params of jax.Arrays
    return jax.tree_util.tree_map(lambda p, g: p - params.lr * g, params, grads)


params = Params(jnp.zeros(3), jnp.zeros(1))
new = asyncio.run(strategy.run(step, args=(params,)))
for local in strategy.experimental_local_results(new):
    assert isinstance(local, Params)
    np.testing.assert_allclose(np.asarray(local.w), [-0.15, -0.15, -0.15])
    np.testing.assert_allclose(np.asarray(local.b), [-0.05])
print(strategy.experimental_local_results(new)[0])

# Strategy.reduce takes the same pytrees: run's result (a Params whose leaves are
# PerReplica values) and a PerReplica that holds one Params per replica both come back
# as one Params, reduced leaf by leaf, its static lr kept.
per_replica = ar.PerReplica([Params(jnp.full(3, r + 1.0), jnp.full(1, float(r))) for r in (0, 1)])


async def reduce_both() -> tuple[Params, Params]:
    mean = await strategy.reduce("mean", new, axis=None)
    total = await strategy.reduce("sum", per_replica, axis=None)
    return mean, total


mean, total = asyncio.run(reduce_both())
assert isinstance(mean, Params)
assert isinstance(total, Params)
assert total.lr == 0.1
np.testing.assert_allclose(np.asarray(mean.w), [-0.15, -0.15, -0.15])
np.testing.assert_allclose(np.asarray(total.w), [3.0, 3.0, 3.0])
np.testing.assert_allclose(np.asarray(total.b), [1.0])
print(total)
