"""The baselines ours is measured against, and the timing helpers shared by every case.

Each baseline is the least work a collective must do (a sum, a copy) or a minimal
rendezvous doing it (bare asyncio futures), measured in the same process as ours.
"""

from __future__ import annotations

import asyncio
import io
import math
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ._model import Array


def _devices(n: int) -> list[str]:
    return [f"CPU:{i}" for i in range(n)]


def _inputs(n: int, nbytes: int) -> list[Array]:
    count = max(nbytes // 4, 1)
    return [np.full(count, float(i + 1), dtype=np.float32) for i in range(n)]


async def _futures_rendezvous(
    inputs: list[Array], rounds: int, work: Callable[[], Array] | None = None
) -> float:
    """A bare asyncio-futures rendezvous doing the same numpy sum (or ``work()``).

    The last arrival computes the result and wakes one future per waiter; every
    replica gets the same array.
    """
    n = len(inputs)
    loop = asyncio.get_running_loop()
    arrived = [0]
    waiters: list[asyncio.Future[Array]] = []

    async def all_reduce() -> Array:
        arrived[0] += 1
        if arrived[0] == n:
            if work is None:  # the sum inline: the baseline pays no extra call
                out = np.add(inputs[0], inputs[1]) if n > 1 else inputs[0].copy()
                for a in inputs[2:]:
                    np.add(out, a, out=out)
            else:
                out = work()
            for w in waiters:
                w.set_result(out)
            arrived[0] = 0
            waiters.clear()
            return out
        fut: asyncio.Future[Array] = loop.create_future()
        waiters.append(fut)
        return await fut

    async def replica() -> None:
        for _ in range(rounds):
            await all_reduce()

    start = time.perf_counter()
    await asyncio.gather(*(replica() for _ in range(n)))
    return time.perf_counter() - start


async def _trio_rendezvous(inputs: list[Array], rounds: int) -> float:
    """:func:`_futures_rendezvous` on trio's own primitives (run it in ``trio.run``).

    A waiter parks its task with ``wait_task_rescheduled`` (what ``trio.Event`` and
    every trio primitive park on, without the parking lot); the last arrival computes
    the sum and reschedules each waiter with it.
    """
    import outcome
    import trio

    n = len(inputs)
    arrived = [0]
    waiters: list[trio.lowlevel.Task] = []
    current_task = trio.lowlevel.current_task
    reschedule = trio.lowlevel.reschedule
    park = trio.lowlevel.wait_task_rescheduled
    value = outcome.Value

    def abort(_: object) -> trio.lowlevel.Abort:
        # Cancelled (the run is being torn down): no round completes any more, and
        # every waiter leaves by its own cancellation.
        waiters.clear()
        arrived[0] = -(1 << 62)
        return trio.lowlevel.Abort.SUCCEEDED

    async def all_reduce() -> Array:
        arrived[0] += 1
        if arrived[0] == n:
            out = np.add(inputs[0], inputs[1]) if n > 1 else inputs[0].copy()
            for a in inputs[2:]:
                np.add(out, a, out=out)
            for task in waiters:
                reschedule(task, value(out))
            arrived[0] = 0
            waiters.clear()
            return out
        waiters.append(current_task())
        result: Array = await park(abort)
        return result

    async def replica() -> None:
        for _ in range(rounds):
            await all_reduce()

    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(n):
            nursery.start_soon(replica)
    return time.perf_counter() - start


def _rendezvous(loop: str, inputs: list[Array], rounds: int) -> float:
    """Seconds of ``rounds`` rounds of the bare rendezvous on ``loop``'s own primitives.

    asyncio and uvloop run :func:`_futures_rendezvous`; trio runs
    :func:`_trio_rendezvous`. Every replica gets the sum of ``inputs``.
    """
    if loop == "asyncio":
        return asyncio.run(_futures_rendezvous(inputs, rounds))
    if loop == "uvloop":
        import uvloop

        return uvloop.run(_futures_rendezvous(inputs, rounds))
    if loop == "trio":
        import trio

        return trio.run(_trio_rendezvous, inputs, rounds)
    raise ValueError(f"unknown loop {loop!r}")


def _blocked_sum(
    inputs: list[Array], out: Array | None = None, lo: int = 0, hi: int | None = None
) -> Callable[[], Array]:
    """The sum in replica order into one preallocated output, in 256 KiB blocks.

    Walks elements ``lo:hi`` of the (flat) output block by block, so that the running
    sum stays in cache (the best floor measured here, reference/baselines.md).
    """
    if out is None:
        out = np.empty(inputs[0].size, inputs[0].dtype)
    flat = [a.reshape(-1) for a in inputs]
    step = max((256 << 10) // out.itemsize, 1)
    end = out.size if hi is None else hi

    def part() -> Array:
        for b in range(lo, end, step):
            e = min(b + step, end)
            block = out[b:e]
            if len(flat) > 1:
                np.add(flat[0][b:e], flat[1][b:e], out=block)
            else:
                block[...] = flat[0][b:e]
            for a in flat[2:]:
                np.add(block, a[b:e], out=block)
        return out

    part()  # untimed: the output's pages are touched once, as a reused buffer's are
    return part


def _numpy_floor(inputs: list[Array], rounds: int, threads: int = 1) -> float:
    """The sum in replica order into one preallocated output, cache-blocked.

    With several threads each walks its share of the output (see :func:`_blocked_sum`);
    the threads are started once, outside the timed rounds.
    """
    if threads == 1:
        return _timed(_blocked_sum(inputs), rounds)
    size = inputs[0].size
    bounds = [size * t // threads for t in range(threads + 1)]
    out = np.empty(size, inputs[0].dtype)
    parts = [_blocked_sum(inputs, out, bounds[t], bounds[t + 1]) for t in range(threads)]
    with ThreadPoolExecutor(max(threads - 1, 1)) as pool:
        start = time.perf_counter()
        for _ in range(rounds):
            others = [pool.submit(part) for part in parts[1:]]
            parts[0]()
            for f in others:
                f.result()
        return time.perf_counter() - start


def _copy_all(inputs: list[Array]) -> Callable[[], Array]:
    """One copy of each input into one preallocated output (what all_gather must move)."""
    out = np.empty(sum(a.size for a in inputs), dtype=inputs[0].dtype)
    out.fill(0)  # untimed: the output's pages are touched once, as a reused buffer's are

    def copy() -> Array:
        offset = 0
        for a in inputs:
            out[offset : offset + a.size] = a
            offset += a.size
        return out

    return copy


def _copy_one(inputs: list[Array]) -> Callable[[], Array]:
    """One copy of the first input into one preallocated output (what broadcast must move)."""
    out = np.empty_like(inputs[0])
    out.fill(0)

    def copy() -> Array:
        np.copyto(out, inputs[0])
        return out

    return copy


def _timed(work: Callable[[], object], rounds: int) -> float:
    """Seconds that ``rounds`` calls of ``work`` take."""
    start = time.perf_counter()
    for _ in range(rounds):
        work()
    return time.perf_counter() - start


def _batch_floor(batch: list[list[Array]], rounds: int) -> float:
    """The least per-leaf work of a batched all_reduce that gives each replica its views.

    Replica 0's leaves (1-D, one dtype and size) are joined into the output and each
    other replica's are written into one reused scratch buffer (one C call each), the
    scratch is added to the output in replica order, and every replica gets one
    read-only view per leaf (one C-level reshape and iteration), as the design's
    results are: no rendezvous, no description or check of the leaves.
    """
    n, m = len(batch), len(batch[0])
    dtype = batch[0][0].dtype
    size = batch[0][0].size
    scratch = io.BytesIO()

    def once() -> list[list[Array]]:
        out = np.frombuffer(bytearray().join(batch[0]), dtype)  # type: ignore[arg-type]
        for leaves in batch[1:]:
            scratch.seek(0)
            scratch.writelines(leaves)  # type: ignore[arg-type]
            with scratch.getbuffer() as buffer:
                other = np.frombuffer(buffer, dtype, m * size)
                np.add(out, other, out=out)
                del other  # releases the buffer, so the scratch can be written again
        out.flags.writeable = False
        rows = out.reshape(m, size)
        return [list(rows) for _ in range(n)]

    once()
    return _timed(once, rounds)


def _futures(
    inputs: list[Array], work: Callable[[], Array] | None = None
) -> Callable[[int], float]:
    """``rounds -> seconds`` of the bare futures rendezvous (for :func:`_steady`)."""
    return lambda rounds: asyncio.run(_futures_rendezvous(inputs, rounds, work))


def _steady(sample: Callable[[int], float], rounds: int) -> float:
    """Seconds that ``rounds`` rounds take once running: ``sample(2R) - sample(R)``.

    ``sample(r)`` times a whole run of ``r`` rounds, which includes one-off costs
    (the event loop, the run's tasks, distributing its values); their difference
    leaves them out, so every per-round figure is the cost of a round, for ours and
    for the baselines alike.
    """
    short = sample(rounds)
    return _difference(sample(2 * rounds), short)


def _difference(long: float, short: float) -> float:
    """``long - short`` seconds, or NaN (not measured) when noise left nothing positive.

    A difference of two runs that is zero or negative measured the noise of the runs'
    start-up, not the rounds: it is reported as missing, never as a (tiny) time.
    """
    return long - short if long > short else math.nan


def _median_us(samples: list[float], rounds: int) -> float:
    """Microseconds per round: the median of the measured samples, NaN if too few.

    A figure is reported only when more than half of its samples were measured (see
    :func:`_difference`); otherwise it is NaN, shown as missing in the tables and
    the chart.
    """
    measured = [s for s in samples if math.isfinite(s)]
    if not measured or 2 * len(measured) <= len(samples):
        return math.nan
    return statistics.median(measured) / rounds * 1e6
