"""Call paths across processes (run under mpiexec): the whole path must agree.

Usage: ``mpiexec -n 2 python callpath.py NAME``. Process 0 runs two replicas, the
others one. Each rank logs ``raised <Type>`` and the message (see ``_report.py``), or
``result <values>`` when its run returned, and exits with status 1 after an error.
"""

from __future__ import annotations

import sys
from typing import Any

import anyio
import numpy as np
from _report import RANK, report

import asyncreplica as ar

SCENARIO = sys.argv[1]
LOCAL = 2 if RANK == 0 else 1
DEPTH = 10  # helper frames between the differing frame and the collective


async def reduce(x: np.ndarray) -> Any:
    return await ar.get_replica_context().all_reduce("SUM", x)  # marker: reduce


async def through(depth: int, x: np.ndarray) -> Any:
    if depth == 0:
        return await ar.get_replica_context().all_reduce("SUM", x)  # marker: deep
    return await through(depth - 1, x)


async def helper_swap() -> Any:
    # One helper, called twice in swapped order: the call sites (in reduce) agree,
    # the callers' lines do not.
    a, b = np.full(3, 1.0), np.full(3, 2.0)
    if RANK == 0:
        return await reduce(a), await reduce(b)  # marker: swap-0
    return await reduce(b), await reduce(a)  # marker: swap-1


async def deep_swap() -> Any:
    a, b = np.full(3, 1.0), np.full(3, 2.0)
    if RANK == 0:
        first = await through(DEPTH, a)  # marker: deep-0
        return first, await through(DEPTH, b)
    first = await through(DEPTH, b)  # marker: deep-1
    return first, await through(DEPTH, a)


async def same_line() -> Any:
    a, b, f = np.full(3, 1.0), np.full(3, 2.0), ar.get_replica_context().all_reduce
    return (await f("SUM", a), await f("SUM", b)) if RANK == 0 else (await f("SUM", b), await f("SUM", a))  # fmt: skip  # marker: line


async def in_task(x: np.ndarray) -> None:
    # A helper task of its own; the caller's line is not on the task's stack.
    async with anyio.create_task_group() as tg:
        tg.start_soon(reduce, x)  # marker: task


async def task_swap() -> None:
    # The same helper task started from two places, in swapped order per process: the
    # tasks' own frames agree; where they were started does not.
    a, b = np.full(3, 1.0), np.full(3, 2.0)
    if RANK == 0:
        await in_task(a)  # marker: task-0
        await in_task(b)
    else:
        await in_task(b)  # marker: task-1
        await in_task(a)


async def deep_agree() -> Any:
    # The same deep paths on every process: no false alarm, the right sums.
    a, b = np.full(3, 1.0), np.full(3, 2.0)
    return await through(DEPTH, a), await through(DEPTH + 30, b), await reduce(a + b)


STEPS = {
    "helper_swap": helper_swap,
    "deep_swap": deep_swap,
    "same_line": same_line,
    "deep_agree": deep_agree,
    "task_swap": task_swap,
}


async def main() -> None:
    strategy = ar.MultiWorkerMirroredStrategy([f"CPU:{i}" for i in range(LOCAL)])
    result = await strategy.run(STEPS[SCENARIO])
    values = [[float(v[0]) for v in r] for r in strategy.experimental_local_results(result)]
    report(f"result {values}")


if __name__ == "__main__":
    try:
        anyio.run(main)
    except Exception as exc:
        report(f"raised {type(exc).__name__}")
        report(str(exc))
        sys.exit(1)
