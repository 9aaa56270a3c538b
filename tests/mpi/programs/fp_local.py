"""numpy's floating-point errors of one process's own combine (run under mpiexec).

Usage: ``mpiexec -n P python fp_local.py LAYOUT API SETERR``: every process runs the
same program under a ``MultiWorkerMirroredStrategy`` of its replica count in ``LAYOUT``
(``2,1``: two replicas on process 0, one on process 1) and under a one-process
``MirroredStrategy`` of every global replica (the oracle), with ``np.seterr(all=SETERR)``,
and logs what each gave: the result, or the error's class and text, and numpy's
``RuntimeWarning`` texts. Replica ``g`` holds ``float16 [g + 1, 65504]``: the sum of two
replicas overflows, so where a process holds two replicas its own combine of them
overflows first (the defect: there only, or that process's error class only).
"""

from __future__ import annotations

import sys
import warnings
from typing import Any

import anyio
import numpy as np
from _report import RANK, report

import asyncreplica as ar


def value(g: int, api: str) -> np.ndarray:
    if api == "reduce0":  # a 40000-element sum along axis 0 overflows for g >= 1
        return np.full(40000, g + 1.0, np.float16)
    return np.array([g + 1.0, 65504.0], np.float16)


def _each(result: Any, fn: Any) -> Any:
    """``fn`` of each replica's component of ``result`` (a PerReplica, or this process's
    one replica's plain value)."""
    if isinstance(result, ar.PerReplica):
        return ar.PerReplica([fn(c) for c in result.values])
    return fn(result)


async def program(strategy: ar.Strategy, api: str) -> Any:
    async def step() -> Any:
        ctx = ar.get_replica_context()
        assert ctx is not None
        v = value(ctx.replica_id_in_sync_group, api)
        if api in ("SUM", "MEAN", "PROD"):
            return await ctx.all_reduce(api, v)
        if api == "reduce_scatter":
            return await ctx.reduce_scatter("SUM", np.tile(v, 6), axis=0)
        return v

    result = await strategy.run(step)
    if api == "reduce":
        return await strategy.reduce("SUM", result, axis=None)
    if api == "reduce0":
        return await strategy.reduce("SUM", result, axis=0)
    if api == "batch":  # one value twice
        return await strategy.extended.batch_reduce_to("SUM", [(result, "CPU:0")] * 2)
    if api == "batch2":  # two values of one dtype: one process combines them in one call
        twin = _each(result, np.array)
        return await strategy.extended.batch_reduce_to("SUM", [(result, "CPU:0"), (twin, "CPU:0")])
    if api == "batch_mixed":  # float16 and float32: one process combines each dtype apart
        wide = _each(result, lambda c: c.astype(np.float32) * np.float32(5e33))
        return await strategy.extended.batch_reduce_to("SUM", [(result, "CPU:0"), (wide, "CPU:0")])
    return strategy.experimental_local_results(result)[0]


async def outcome(strategy: ar.Strategy, api: str) -> str:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            got = await program(strategy, api)
            said = f"ok {np.asarray(got).ravel()[:2].tolist()}"
        except Exception as error:
            said = f"{type(error).__name__}: {str(error).splitlines()[0]}"
    texts = [str(w.message) for w in caught if w.category is RuntimeWarning]
    return f"{said} warned {texts}"


async def main(counts: tuple[int, ...], api: str) -> None:
    mw = ar.MultiWorkerMirroredStrategy(
        [f"CPU:{i}" for i in range(counts[RANK])], stall_warning_seconds=None
    )
    oracle = ar.MirroredStrategy([f"CPU:{i}" for i in range(sum(counts))])
    report(f"mw {await outcome(mw, api)}")
    report(f"oracle {await outcome(oracle, api)}")

    async def ones() -> Any:
        ctx = ar.get_replica_context()
        assert ctx is not None
        return await ctx.all_reduce("SUM", np.ones(1))

    # the strategy is still usable, the processes in step
    report(f"next {float(mw.experimental_local_results(await mw.run(ones))[0][0])}")


if __name__ == "__main__":
    np.seterr(all=sys.argv[3])  # type: ignore[arg-type]  # raise, warn or ignore
    anyio.run(main, tuple(int(k) for k in sys.argv[1].split(",")), sys.argv[2])
