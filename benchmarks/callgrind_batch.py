"""Instructions per round of the batched all_reduce (1000 x 1 KiB float32, 4 replicas), for callgrind.

Runs ROUNDS rounds of ``all_reduce(SUM)`` of a list of 1000 float32 arrays of 1 KiB per
replica (every replica its own arrays, as ``bench_packing.py``) on asyncio; with ``--floor``,
the numpy per-leaf floor of ``asyncreplica bench`` instead (join, sum, one read-only view per
leaf and replica; no rendezvous, no checks). Run it twice under callgrind with different round
counts; the difference of the totals over the difference of the rounds is one round::

    for r in 10 30; do valgrind --tool=callgrind --callgrind-out-file=/tmp/cgb.$r \\
        python benchmarks/callgrind_batch.py $r; done
    # instructions per round = (Ir(30) - Ir(10)) / 20   (Ir: callgrind_annotate's total)

``--python-pass`` runs the pure-Python pass over the batch with the rest as built;
``ASYNCREPLICA_NO_EXTENSIONS=1`` the pure-Python pass and the interpreted hot path; ``--one``
one all_reduce of a single 1000 KiB array instead (the figure the target is stated against).
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import numpy as np

import asyncreplica as ar
from asyncreplica._tools._bench._baselines import _batch_floor

LEAVES = 1000
LEAF = 256  # float32 elements: 1 KiB
REPLICAS = 4


def main() -> None:
    rounds = int(sys.argv[1])
    leaves = [[np.full(LEAF, r, np.float32) for _ in range(LEAVES)] for r in range(REPLICAS)]
    if "--floor" in sys.argv:
        _batch_floor(leaves, rounds)
        return
    strategy = ar.MirroredStrategy([f"CPU:{i}" for i in range(REPLICAS)])
    if "--python-pass" in sys.argv:
        strategy.backend._cpass = None  # type: ignore[attr-defined]
    values: Any = ar.PerReplica(leaves)
    if "--one" in sys.argv:
        values = ar.PerReplica([np.full(LEAF * LEAVES, r, np.float32) for r in range(REPLICAS)])

    async def step(xs: Any) -> None:
        ctx = ar.get_replica_context()
        assert ctx is not None
        for _ in range(rounds):
            await ctx.all_reduce("sum", xs)

    asyncio.run(strategy.run(step, args=(values,)))


if __name__ == "__main__":
    main()
