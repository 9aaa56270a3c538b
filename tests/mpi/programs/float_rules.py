"""Floats past the inline size against one process, and an interrupted combine (mpiexec).

Usage: ``mpiexec -n P python float_rules.py [MODE]``, one replica per process.

MODE ``compare`` (default): each process runs the same steps on
``MultiWorkerMirroredStrategy`` and on a one-process ``MirroredStrategy`` of P replicas
(this process playing every replica), and logs a line per case, ``same <case>`` or
``differs <case>: <one process> / <processes>``: the bits of SUM/MEAN/PROD of NaNs of
different signs and payloads (small and past 64 KiB), the numpy warnings of an overflow
and an invalid value, the error under ``np.seterr(all="raise")``, and the dtype a
``broadcast`` of a big-endian array returns.

MODE ``interrupt``: process 0's rank-order MPI operation is interrupted once
(a ``KeyboardInterrupt``, as from a signal handler, raised inside the callback MPI
runs): the run raises it after the MPI call, never a "Fatal Python error".
"""

from __future__ import annotations

import sys
import warnings

import anyio
import numpy as np
from _report import RANK, report
from mpi4py import MPI

import asyncreplica as ar

SIZE = MPI.COMM_WORLD.Get_size()


def _nans(g: int, n: int) -> np.ndarray:
    """Replica ``g``'s values: a NaN of payload g + 1, negative for odd g, every 7th."""
    x = np.arange(n, dtype=np.float64) + g
    bits = np.uint64(0x7FF8000000000000 | (g + 1)) | np.uint64((g % 2) << 63)
    x[::7] = np.array([bits], np.uint64).view(np.float64)[0]
    return x


def _overflowing(g: int, n: int, dtype: str) -> np.ndarray:
    x = np.full(n, 60000.0, dtype)  # float16 holds up to 65504: the sum overflows
    x[::2] = np.inf if g == 0 else -np.inf  # inf + -inf: an invalid value
    return x


async def outcome(strategy: ar.Strategy, step: object, raise_: bool) -> str:
    """The run's result bits and warnings, or the class and text of its error."""
    old = np.seterr(all="raise") if raise_ else None
    try:
        with warnings.catch_warnings(record=True) as got:
            warnings.simplefilter("always")
            result = await strategy.run(step)  # type: ignore[arg-type]
    except BaseException as error:  # logged for the test
        leaves = error.exceptions if isinstance(error, BaseExceptionGroup) else [error]
        return "raised " + " ".join(sorted({f"{type(e).__name__}({e})" for e in leaves}))
    finally:
        if old is not None:
            np.seterr(**old)
    value = result.values[0] if isinstance(result, ar.PerReplica) else result
    array = np.asarray(value)
    said = sorted({f"{w.category.__name__}({w.message})" for w in got})
    digest = hash(array.tobytes()) if array.dtype.kind == "f" else 0
    return f"{array.dtype.str} {digest} {said}"


async def compare() -> None:
    one = ar.MirroredStrategy([f"CPU:{i}" for i in range(SIZE)])
    multi = ar.MultiWorkerMirroredStrategy()
    cases = []
    for n in (8, 20_000):  # 160 KB: past the inline and gathered sizes
        for op in ("SUM", "MEAN", "PROD"):
            cases.append((f"nan {op} {n}", op, lambda g, n=n: _nans(g, n), False))
        for dtype in ("float16", "float32"):
            for op in ("SUM", "PROD"):
                make = lambda g, n=n, d=dtype: _overflowing(g, n, d)  # noqa: E731
                cases.append((f"warn {op} {dtype} {n}", op, make, False))
                cases.append((f"seterr {op} {dtype} {n}", op, make, True))
    for name, op, make, raise_ in cases:

        async def step(op: str = op, make: object = make) -> object:
            ctx = ar.get_replica_context()
            return await ctx.all_reduce(op, make(ctx.replica_id_in_sync_group))  # type: ignore[operator]

        a, b = await outcome(one, step, raise_), await outcome(multi, step, raise_)
        report(f"same {name}" if a == b else f"differs {name}: {a} / {b}")
    for dtype in (">f8", ">i4", "<f8"):
        for n in (3, 40_000):

            async def bcast(dtype: str = dtype, n: int = n) -> object:
                ctx = ar.get_replica_context()
                x = np.arange(n, dtype=dtype) + ctx.replica_id_in_sync_group
                return await ctx.broadcast(x, source=SIZE - 1)

            a, b = await outcome(one, bcast, False), await outcome(multi, bcast, False)
            name = f"broadcast {dtype} {n}"
            report(f"same {name}" if a == b else f"differs {name}: {a} / {b}")
    report("done")


async def interrupt() -> None:
    from asyncreplica_mpi import _backend

    combine = _backend._local_combine
    armed = [RANK == 0]

    def interrupted(op: object, parts: list[np.ndarray]) -> object:
        if armed[0] and parts[0].size > 1000:  # inside MPI's call of the operation
            armed[0] = False
            raise KeyboardInterrupt
        return combine(op, parts)  # type: ignore[arg-type]

    _backend._local_combine = interrupted  # type: ignore[assignment]
    strategy = ar.MultiWorkerMirroredStrategy()

    async def step() -> object:
        return await ar.get_replica_context().all_reduce("SUM", np.full(20_000, 1.0 + RANK))

    try:
        result = await strategy.run(step)
    except KeyboardInterrupt:
        report("raised KeyboardInterrupt")
    except Exception as error:  # logged for the test
        report(f"raised {type(error).__name__}")
    else:
        report(f"sum {float(np.asarray(result)[0])}")
    report("done")


anyio.run(interrupt if sys.argv[1:] == ["interrupt"] else compare)
