"""PyTorch tensors in a collective: read in place, given back as writable copies.

Inputs are read zero-copy (through DLPack, strides and all). Each replica gets its
results as tensors of its own, writable like any tensor: torch has no read-only
tensors, so the replicas cannot share one result buffer as numpy programs do.
Tensors that require grad are refused: collectives are not differentiable.
"""

import asyncio

import torch

import asyncreplica as ar

strategy = ar.MirroredStrategy(["CPU:0", "CPU:1"])
inputs = [torch.arange(6.0).reshape(2, 3).t(), torch.ones(3, 2)]  # the first is a strided view


async def step(x):
    ctx = ar.get_replica_context()
    total = await ctx.all_reduce("sum", {"x": x, "half": x.half()})
    total["x"].mul_(2)  # the replica's own tensor: the other replica's is unchanged
    return total


async def main():
    result = await strategy.run(step, args=(ar.PerReplica(inputs),))
    first, second = strategy.experimental_local_results(result)
    expected = inputs[0] + inputs[1]
    assert isinstance(first["x"], torch.Tensor)  # tensors in, tensors out
    assert first["half"].dtype == torch.float16  # float16 travels as float16
    torch.testing.assert_close(first["x"], 2 * expected)
    torch.testing.assert_close(second["x"], 2 * expected)  # doubled once, by its replica
    assert first["x"].data_ptr() != second["x"].data_ptr()  # one copy per replica
    assert all(
        r["x"].data_ptr() != x.data_ptr() for r, x in zip((first, second), inputs, strict=True)
    )
    assert torch.equal(inputs[1], torch.ones(3, 2))  # inputs are never modified
    print(first["x"].tolist())


asyncio.run(main())


# A tensor that requires grad is refused, with what to do: collectives are not
# differentiable, and dropping its autograd history silently would hide that.
weights = torch.nn.Linear(3, 1).weight  # a parameter: requires_grad=True


async def broadcast_weights():
    ctx = ar.get_replica_context()
    try:
        await ctx.broadcast(weights)
    except TypeError as exc:
        message = str(exc)  # ... requires grad, and collectives are not differentiable ...
        assert "requires grad" in message
        assert "x.detach()" in message
    else:
        raise AssertionError("a tensor that requires grad must be refused")
    return await ctx.broadcast(weights.detach())  # detached: broadcast as a tensor


result = asyncio.run(strategy.run(broadcast_weights))
assert all(torch.equal(w, weights.detach()) for w in strategy.experimental_local_results(result))


# bfloat16 has no numpy dtype, so the numpy backend cannot hold it: cast it first.
async def bfloat16_sum():
    value = torch.ones(3, dtype=torch.bfloat16)
    try:
        await ar.get_replica_context().all_reduce("sum", value)
    except TypeError as exc:
        message = str(exc)
        assert "torch.bfloat16 has no numpy equivalent" in message
    else:
        raise AssertionError("bfloat16 must be refused")
    total = await ar.get_replica_context().all_reduce("sum", value.float())
    return total.bfloat16()


result = asyncio.run(strategy.run(bfloat16_sum))
assert all(t.dtype == torch.bfloat16 for t in strategy.experimental_local_results(result))
