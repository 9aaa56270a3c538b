"""Memory: RSS growth over many collectives, and the RSS of many waiting replicas."""

from __future__ import annotations

import asyncio
import gc
import os
import subprocess
import sys
from collections.abc import Callable

import asyncreplica as ar

from ._baselines import _devices, _inputs
from ._cases import Plan
from ._model import Array, Target


def _rss() -> int:
    """The process's resident set size now, in bytes (Linux); its peak elsewhere."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(peak if sys.platform == "darwin" else peak * 1024)


def _idle_rss(idle: int) -> int:
    """RSS added by ``idle`` replicas all waiting at one collective (run it in a fresh process)."""
    gc.collect()
    before = _rss()
    during: list[int] = []

    def measure(strategy: ar.Strategy) -> None:
        during.append(_rss())  # every replica has arrived and waits

    async def wait() -> None:
        ctx = ar.get_replica_context()
        assert ctx is not None
        await ctx.merge_call(measure)

    asyncio.run(ar.MirroredStrategy(_devices(idle)).run(wait))
    return during[0] - before


def _measure_memory(plan: Plan, progress: Callable[[str], None]) -> list[Target]:
    """RSS growth over many collectives, and the RSS of many idle replicas."""
    targets: list[Target] = []
    total = plan.memory_collectives
    progress(f"memory: RSS over {total:,} all_reduces (8 B x 2 replicas)")
    marks: list[int] = []

    async def many(x: Array) -> None:
        ctx = ar.get_replica_context()
        assert ctx is not None
        first = ctx.replica_id_in_sync_group == 0
        for i in range(total):
            if i == total // 10 and first:
                gc.collect()
                marks.append(_rss())
            await ctx.all_reduce(ar.ReduceOp.SUM, x)
        if first:
            gc.collect()
            marks.append(_rss())

    strategy = ar.MirroredStrategy(_devices(2))
    asyncio.run(strategy.run(many, args=(ar.PerReplica(_inputs(2, 8)),)))
    growth = (marks[1] - marks[0]) / (1 << 20)
    figure = f"RSS growth, collective {total // 10:,} to {total:,}"
    targets.append(Target(figure, growth, "MiB", "flat (< 1 MiB)", growth < 1.0))

    idle = plan.idle_replicas
    progress(f"memory: RSS of {idle:,} replicas waiting at a collective (fresh process)")
    # A fresh interpreter: this one's heap already holds the memory of earlier cases.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    code = f"from asyncreplica._tools._bench._memory import _idle_rss; print(_idle_rss({idle}))"
    found = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    mib = float(found.stdout.split()[-1]) / (1 << 20)
    limit = 200 * idle / 10_000  # MB
    goal = "< 200 MB" if idle == 10_000 else f"< {limit:g} MB (scaled)"
    figure = f"RSS added by {idle:,} replicas waiting"
    targets.append(Target(figure, mib, "MiB", goal, mib * (1 << 20) < limit * 1e6))
    return targets
