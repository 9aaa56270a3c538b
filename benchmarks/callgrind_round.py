"""Instructions per round of the small all_reduce (8 B x 8 replicas, all checks), for callgrind.

Runs ROUNDS rounds of ``all_reduce(SUM)`` on 2 x float32 across 8 replicas on asyncio (or the
bare futures rendezvous of ``bench_checks.py`` with ``--bare``). Run it twice under callgrind
with different round counts; the difference of the totals over the difference of the rounds
is the cost of one round, start-up excluded::

    for r in 200 600; do valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.$r \\
        python benchmarks/callgrind_round.py $r; done
    # instructions per round = (Ir(600) - Ir(200)) / 400   (Ir: callgrind_annotate's total)

``ASYNCREPLICA_NO_EXTENSIONS=1`` measures the interpreted hot path.
"""

from __future__ import annotations

import asyncio
import sys

import numpy as np
from bench_checks import bare, ours  # type: ignore[import-not-found]

import asyncreplica as ar


def main() -> None:
    rounds = int(sys.argv[1])
    value = np.ones(2, dtype=np.float32)
    if "--bare" in sys.argv:
        asyncio.run(bare(8, rounds, value))
    else:
        strategy = ar.MirroredStrategy([f"CPU:{i}" for i in range(8)])
        asyncio.run(ours(strategy, rounds, value))


if __name__ == "__main__":
    main()
