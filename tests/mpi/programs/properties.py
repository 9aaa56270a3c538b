"""Random programs across processes: a batch of seeds per launch (run under mpiexec).

Usage: ``mpiexec -n P python properties.py FIRST COUNT`` (``ASYNCREPLICA_MPI_PROPERTY_ONLY=S``
runs only seed ``S`` of the batch, with the batch's layout). For each seed in
``FIRST .. FIRST+COUNT-1`` every rank draws the same program (``tests/random_programs.py``
with ``random.Random(seed)``): how many replicas each process holds, their steps, each
replica's faults. Each rank runs its replicas under ``MultiWorkerMirroredStrategy`` with a
hang guard, checks the numpy oracle, and logs one JSON line per seed::

    {"seed": 7, "outcome": "ReplicaExitedError", "violation": null}

then ``done``. The last seed of a batch may also draw a process-level fault that ends the
batch: a rank whose process exits in the middle of its step (``exit``), or one that stalls
past the others' ``timeout_seconds`` (``stall``).
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
from _report import RANK, report
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/, for random_programs

import random_programs as rp

import asyncreplica as ar

SIZE = MPI.COMM_WORLD.Get_size()
GUARD_S = 20.0
# Fault kinds drawn across processes (the single-process ones that make sense here, and
# "byteorder": replicas pass big- and little-endian values).
MPI_FAULTS = (
    "skip",
    "extra",
    "change",
    "swap",
    "swap_deep",
    "swap_same_line",
    "swap_task",
    "raise",
    "cycle",
)
TERMINAL = ("exit", "stall")
# Kept out of the draw (see rp.KNOWN_BROKEN_MPI); ASYNCREPLICA_MPI_KNOWN_BROKEN (a JSON
# list) replaces the set, to try a fix.
_override = os.environ.get("ASYNCREPLICA_MPI_KNOWN_BROKEN")
KNOWN_BROKEN_MPI: set[str] = set(json.loads(_override)) if _override else rp.KNOWN_BROKEN_MPI


def layout(seed: int) -> list[int]:
    """How many replicas each process holds (1 or 2), the same on every rank."""
    chooser = rp.RandomChooser(seed * 7919 + 1)
    return [chooser.integer(1, 2) for _ in range(SIZE)]


def terminal(seed: int, last: bool) -> tuple[str, int] | None:
    """A process-level fault for the last seed of a batch: (kind, rank), or None."""
    allowed = [t for t in TERMINAL if t not in KNOWN_BROKEN_MPI]
    chooser = rp.RandomChooser(seed * 104729 + 2)
    if not last or not allowed or chooser.integer(0, 2) == 0:
        return None
    return chooser.choice(allowed), chooser.integer(0, SIZE - 1)


def draw(seed: int, counts: list[int]) -> rp.Program:
    n = sum(counts)
    broken = set(rp.KNOWN_BROKEN) | KNOWN_BROKEN_MPI
    program = rp.draw_program(
        rp.RandomChooser(seed),
        n_range=(n, n),
        faults=MPI_FAULTS,
        asyncio_only=False,
        byteorders=("=",) if "byteorder" in broken else ("=", "<", ">"),
        known_broken=broken,
        named_pairs="named" not in broken,
        off=frozenset(
            ({rp.SCALAR_BROADCAST} if "broadcast_0d" in broken else set())
            | ({rp.BIG_INTS} if "int_mean" in broken else set())
        ),
    )
    return program


_strategies: dict[tuple[int, ...], ar.MultiWorkerMirroredStrategy] = {}


def strategy_for(counts: list[int], stall: bool) -> ar.MultiWorkerMirroredStrategy:
    """A strategy with ``counts[RANK]`` local replicas (one per launch if need be)."""
    options = ar.CommunicationOptions(timeout_seconds=2.0) if stall else None
    if "many_strategies" not in KNOWN_BROKEN_MPI or stall:
        return ar.MultiWorkerMirroredStrategy(
            [f"CPU:{i}" for i in range(counts[RANK])], communication_options=options
        )
    key = tuple(counts)
    if key not in _strategies:
        _strategies[key] = ar.MultiWorkerMirroredStrategy([f"CPU:{i}" for i in range(counts[RANK])])
    return _strategies[key]


async def one(seed: int, counts: list[int], last: bool) -> dict[str, Any]:
    program = draw(seed, counts)
    first = sum(counts[:RANK])
    local = list(range(first, first + counts[RANK]))
    fault = terminal(seed, last)
    stall = fault is not None and fault[0] == "stall"
    strategy = strategy_for(counts, stall)
    planted: list[BaseException] = []
    results: dict[int, list[Any]] = {}
    outcome: BaseException | None = None

    def never_cancel() -> None:
        raise AssertionError("no cancel fault across processes")

    async def step() -> None:
        ctx = ar.get_replica_context()
        assert ctx is not None
        rid = ctx.replica_id_in_sync_group
        out = results.setdefault(rid, [])
        for k, action in enumerate(program.actions[rid]):
            if fault is not None and fault[1] == RANK and k == len(program.actions[rid]) // 2:
                if fault[0] == "exit":
                    report(
                        json.dumps(
                            {"seed": seed, "outcome": "exit", "violation": None, "fault": fault}
                        )
                    )
                    sys.exit(3)  # the process exits in the middle of its step
                await anyio.sleep(6.0)  # stalls past the others' timeout (2 s)
            gave, result = await rp.act(ctx, action, rid, planted, never_cancel)
            if gave:
                out.append(result)

    with anyio.move_on_after(GUARD_S) as guard:
        try:
            await strategy.run(step)
        except Exception as exc:
            outcome = exc
    if guard.cancelled_caught:
        return {
            "seed": seed,
            "outcome": "hang",
            "violation": f"no answer in {GUARD_S} s",
            "fault": fault,
        }
    name = "ok" if outcome is None else type(outcome).__name__
    try:
        check(program, outcome, planted, results, local, fault)
    except AssertionError as exc:
        text = "".join(traceback.format_exception(exc))[-1500:]
        error = str(outcome)[:1500]
        return {"seed": seed, "outcome": name, "violation": text, "error": error, "fault": fault}
    return {"seed": seed, "outcome": name, "violation": None, "fault": fault}


def leaves(error: BaseException) -> list[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        return [leaf for e in error.exceptions for leaf in leaves(e)]
    return [error]


def named_order(error: BaseException) -> bool:
    """Whether ``error`` is the documented limit of named collectives across processes.

    docs/scale-out.md (Limits): named collectives that complete concurrently must
    complete in the same order on every process; two processes whose replicas complete a
    named pair in different orders raise a mismatch on the name alone.
    """
    first = str(error).partition("\n")[0]
    if isinstance(error, ar.CollectiveDeadlockError):
        # The processes' exchanges met at different names before a concurrent one was
        # queued behind them: told as the cycle it would be if awaited in turn.
        return all(isinstance(key, str) for _, key in error.cycle)
    return (
        isinstance(error, ar.CollectiveMismatchError)
        and first.startswith("Processes disagree about their collective named")
        and first.endswith(": name differs.")  # the fields one process names
    )


def sibling_cancelled(error: BaseException) -> bool:
    """A named collective cancelled by its replica's own task group (AR101).

    When one task of a replica's task group raises the named-order mismatch, the task
    group cancels its sibling, which waits at the pair's other name: a replica
    abandoning a collective is reported, beside the mismatch.
    """
    return isinstance(error, ar.CollectiveError) and (
        " was cancelled while waiting at its collective named " in str(error)
    )


def check(
    program: rp.Program,
    outcome: BaseException | None,
    planted: list[BaseException],
    results: dict[int, list[Any]],
    local: list[int],
    fault: tuple[str, int] | None,
) -> None:
    """The oracle, on this process's replicas."""
    may_plant = program.has("raise")
    if outcome is None:
        assert program.consistent, "an inconsistent program completed"
        assert not may_plant, "a run completed although a replica raised"
        for rid in local:
            rp.check_results(program, rid, results[rid], local)
        return
    if (
        program.consistent
        and not may_plant
        and fault is None
        and any(a[0] == "named" for acts in program.actions for a in acts)
        and any(named_order(leaf) for leaf in leaves(outcome))
        and all(named_order(leaf) or sibling_cancelled(leaf) for leaf in leaves(outcome))
    ):
        return  # the documented limit of named collectives across processes
    for leaf in leaves(outcome):
        if isinstance(leaf, rp.Planted):
            assert any(leaf is p for p in planted)
            continue
        assert isinstance(leaf, ar.CollectiveError), repr(leaf)
        if fault is not None and fault[0] == "stall":
            continue  # the others time out, or fail once a process timed out
        assert not program.consistent or may_plant or fault is not None, (
            f"a consistent program raised {leaf!r}"
        )
        assert str(leaf)


async def main() -> None:
    first, count = int(sys.argv[1]), int(sys.argv[2])
    fixed = layout(first)  # one layout per launch when strategies are reused
    only = os.environ.get("ASYNCREPLICA_MPI_PROPERTY_ONLY")  # one seed of the batch
    for seed in range(first, first + count):
        if only is not None and seed != int(only):
            continue
        counts = fixed if "many_strategies" in KNOWN_BROKEN_MPI else layout(seed)
        report(json.dumps(await one(seed, counts, last=seed == first + count - 1)))
    report("done")


if __name__ == "__main__":
    anyio.run(main)
