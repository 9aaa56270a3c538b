"""JAX and array_api_strict inputs across processes: own type out, one-process values.

Usage: ``mpiexec -n P python foreign.py``. Process ``r`` runs ``r + 1`` replicas. Every
collective (all_reduce on the inline, gathered and MPI Allreduce paths, MEAN of integers,
all_gather, reduce_scatter, broadcast, ``Strategy.reduce`` and ``Strategy.gather``) is
called with JAX and ``array_api_strict`` arrays under ``MultiWorkerMirroredStrategy``
and, as the oracle, under a one-process ``MirroredStrategy`` with every global replica:
each result must have the input's array type and device and the oracle's dtype and bits.
Prints ``rank=R ok ...`` and ``rank=R done``.
"""

from __future__ import annotations

from typing import Any

import anyio
import array_api_strict as strict
import jax
import jax.numpy as jnp
import numpy as np
from mpi4py import MPI

import asyncreplica as ar

RANK = MPI.COMM_WORLD.Get_rank()
SIZE = MPI.COMM_WORLD.Get_size()
TOTAL = sum(r + 1 for r in range(SIZE))
LIBRARIES = {"jax": (jnp, jax.Array), "strict": (strict, type(strict.asarray(0)))}
# Sizes: inline (travels with the agreement), gathered in rank order, MPI Allreduce.
SIZES = {"small": 3, "medium": 1000, "large": 20000}
# array_api_strict's devices: replica g's inputs live on one of them (never only the default).
STRICT_DEVICES = ["device1", "CPU_DEVICE", "device2"]


def make(xp: Any, array: np.ndarray[Any, Any], g: int) -> Any:
    if xp is strict:
        return strict.asarray(array, device=strict.Device(STRICT_DEVICES[g % 3]))
    return xp.asarray(array)


def step_of(xp: Any) -> Any:
    async def step() -> dict[str, Any]:
        ctx = ar.get_replica_context()
        assert ctx is not None
        g = ctx.replica_id_in_sync_group
        out: dict[str, Any] = {}
        for label, n in SIZES.items():
            x = make(xp, (np.arange(n, dtype=np.float32) % 7) * (g + 1) + g / 3, g)
            out[f"{label}.sum"] = await ctx.all_reduce("SUM", x)
            out[f"{label}.mean"] = await ctx.all_reduce("MEAN", x)
            ints = make(xp, (np.arange(n, dtype=np.int32) % 5) + 2**30 + g, g)
            out[f"{label}.imean"] = await ctx.all_reduce("MEAN", ints)
            out[f"{label}.nest"] = await ctx.all_reduce(
                "MAX", {"a": x, "b": [ints, np.full(2, g, np.float32)]}
            )
        rows = make(xp, np.full((g + 1, 2), g, np.int32), g)
        out["gather"] = await ctx.all_gather(rows, axis=0)
        out["rs"] = await ctx.reduce_scatter(
            "SUM", make(xp, np.ones((2 * TOTAL, 3), np.float32) * g, g), axis=0
        )
        out["bcast"] = await ctx.broadcast(make(xp, np.arange(4, dtype=np.float32) + g, g), 1)
        return out

    return step


def check(name: str, got: Any, want: Any, kind: type, device: Any) -> None:
    assert isinstance(got, kind), (name, type(got), kind)
    assert isinstance(want, kind), (name, type(want), kind)
    got_a, want_a = np.from_dlpack(got), np.from_dlpack(want)
    assert got_a.dtype == want_a.dtype, (name, got_a.dtype, want_a.dtype)
    assert got_a.shape == want_a.shape, (name, got_a.shape, want_a.shape)
    assert got_a.tobytes() == want_a.tobytes(), (name, got_a, want_a)
    if device is not None:
        assert got.device == device, (name, got.device, device)


def flat(tree: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(tree, dict):
        return {k: v for key in tree for k, v in flat(tree[key], f"{prefix}{key}.").items()}
    if isinstance(tree, list | tuple):
        return {k: v for i, x in enumerate(tree) for k, v in flat(x, f"{prefix}{i}.").items()}
    return {prefix: tree}


async def main() -> None:
    oracle = ar.MirroredStrategy([f"CPU:{i}" for i in range(TOTAL)])
    strategy = ar.MultiWorkerMirroredStrategy([f"CPU:{i}" for i in range(RANK + 1)])
    first = strategy._replica_offset
    for name, (xp, kind) in LIBRARIES.items():
        step = step_of(xp)
        wanted = oracle.experimental_local_results(await oracle.run(step))
        got = strategy.experimental_local_results(await strategy.run(step))
        checked = 0
        for local, out in enumerate(got):
            g = first + local
            want, mine = flat(wanted[g]), flat(out)
            assert sorted(mine) == sorted(want), (sorted(mine), sorted(want))
            for key in sorted(mine):
                if isinstance(want[key], np.ndarray):  # a numpy leaf beside foreign ones
                    assert isinstance(mine[key], np.ndarray), (key, type(mine[key]))
                    assert mine[key].tobytes() == want[key].tobytes(), key
                    continue
                device = None
                if xp is strict and key != "bcast.":  # bcast: the source's device
                    device = strict.Device(STRICT_DEVICES[g % 3])
                check(f"{name} {key}", mine[key], want[key], kind, device)
                checked += 1
        print(f"rank={RANK} ok {name}: {checked} replica collectives", flush=True)

        def per_replica(c: Any, xp: Any = xp) -> Any:
            g = c.replica_id_in_sync_group
            return make(xp, np.arange(3 * (g + 1), dtype=np.float32) + g, g)

        want_v = oracle.experimental_distribute_values_from_function(per_replica)
        got_v = strategy.experimental_distribute_values_from_function(per_replica)
        for op in ("SUM", "MEAN", "MAX"):
            want_r = await oracle.reduce(op, want_v, axis=0)
            got_r = await strategy.reduce(op, got_v, axis=0)
            device = strict.Device(STRICT_DEVICES[first % 3]) if xp is strict else None
            check(f"{name} reduce {op}", got_r, want_r, kind, device)
        want_g = await oracle.gather(want_v, axis=0)
        got_g = await strategy.gather(got_v, axis=0)
        check(f"{name} gather", got_g, want_g, kind, None)
        print(f"rank={RANK} ok {name}: strategy.reduce and gather", flush=True)
    print(f"rank={RANK} done", flush=True)


if __name__ == "__main__":
    anyio.run(main)
