"""P processes x k replicas against one process with P*k replicas (run under mpiexec).

Usage: ``mpiexec -n P python differential.py SEED CASES LAYOUT [LAYOUT ...]``, where a
layout gives each process's replica count (``2,2`` or ``1,3``: one count per process).

For each layout every process creates a ``MultiWorkerMirroredStrategy`` with its count,
and a ``MirroredStrategy`` with the global count as the oracle. From ``SEED`` it
generates ``CASES`` programs (the same on every process): a step function made of
collectives (``all_reduce``, ``all_gather``, ``broadcast``, ``reduce_scatter``,
``barrier``, named collectives, ``merge_call`` with cross-replica calls in its
``merge_fn``, ``MIN``/``MAX`` of leaves past the 64 KiB that MPI reduces, dense with NaN,
infinities and signed zeros), then cross-replica calls on the run's results and on plain values
(``strategy.reduce``, ``gather``, ``extended.reduce_to`` / ``batch_reduce_to`` /
``broadcast_to``, ``experimental_local_results``,
``experimental_distribute_values_from_function``, ``experimental_distribute_dataset``), some with a fault (a replica that
calls another collective or skips one, or all-reduces ``2**70``, which no dtype holds; a
``SUM`` of a plain value, a ``bool`` reduction, a ``strategy.reduce`` component whose
shape, rank or dtype differs on one replica). Each program runs under both strategies, and this process's part of each
result must equal the oracle's: integers and every float of a layout with one replica
per process bit for bit, other floats within the documented tolerance (NaN equal to
NaN); an error must be of the oracle's class with its position, name and fields, and
every process must raise the same class with the same global replica ids. numpy's
``RuntimeWarning`` texts must be the same on every process, and one process's where only
process 0 holds several replicas (the same partial results).

Prints ``rank=R layout=... cases=N checks=M`` per layout, ``rank=R MISMATCH ...`` lines
(then exits 1) for each difference, and ``rank=R done`` at the end.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import numpy as np
from mpi4py import MPI

import asyncreplica as ar

RANK = MPI.COMM_WORLD.Get_rank()
SIZE = MPI.COMM_WORLD.Get_size()
TRACE = bool(__import__("os").environ.get("DIFF_TRACE"))

INTS = ("int32", "int64", "uint8", "int8", "uint64", "bool")
FLOATS = ("float32", "float64", "float16", "complex128")
OPS = ("SUM", "MEAN", "MIN", "MAX", "PROD")
ELEMENTWISE = ("reduce", "reduce_to", "batch", "large")
# A large leaf: past the 64 KiB up to which processes gather their partial results (MPI
# reduces larger ones), for every dtype (int8 included).
LARGE = 70_000
EXACT = "exact"  # a result that must be bit for bit one process's, whatever the layout
# The one-process oracle's own defects, left out until they are fixed there: the numpy
# backend's MEAN of uint64 raises UFuncTypeError in one process (fixed on the branch
# that gives every reduce path one dtype rule; drop this entry once it is merged).
ORACLE_DEFECTS = {("uint64", "MEAN")}


def make(dtype: str, shape: tuple[int, ...], *key: int) -> np.ndarray:
    """A deterministic value for ``key`` (a case's numbers, then a replica or process id)."""
    rng = np.random.default_rng([abs(k) for k in key])
    if dtype == "bool":
        return rng.integers(0, 2, shape).astype(bool)
    if dtype in FLOATS:
        value = rng.standard_normal(shape)
        if dtype.startswith("complex"):
            value = value + 1j * rng.standard_normal(shape)
        special = rng.random(shape)
        # special values now and then: NaN, infinities, signed zeros
        value = np.where(special < 0.03, np.nan, value)
        value = np.where((special >= 0.03) & (special < 0.05), np.inf, value)
        value = np.where((special >= 0.05) & (special < 0.07), -0.0, value)
        return value.astype(dtype)
    low, high = (0, 6) if dtype.startswith("u") else (-5, 6)
    return rng.integers(low, high, shape).astype(dtype)


def make_large(dtype: str, *key: int) -> np.ndarray:
    """A large leaf for MIN and MAX, dense with special values.

    NaN (which one process's ``np.maximum`` propagates), infinities of both signs, and
    ``-0.0``/``0.0`` at the same positions on different replicas (their order decides
    which zero a MIN or MAX keeps).
    """
    value = make(dtype, (LARGE,), *key)
    if dtype not in FLOATS:
        return value
    rng = np.random.default_rng([*(abs(k) for k in key), 1])
    roll = rng.random(LARGE)
    value = np.where(roll < 0.2, np.where(roll < 0.1, -0.0, 0.0), value)
    value = np.where((roll >= 0.2) & (roll < 0.21), -np.inf, value)
    return value.astype(dtype)


@dataclass
class Case:
    """One generated program: replica collectives, then cross-replica calls."""

    number: int
    steps: list[tuple[Any, ...]] = field(default_factory=list)
    posts: list[tuple[Any, ...]] = field(default_factory=list)
    fault: tuple[Any, ...] | None = None


def generate(seed: int, number: int, total: int, counts: tuple[int, ...] = ()) -> Case:
    """The ``number``-th program for ``total`` global replicas (the same everywhere)."""
    rng = np.random.default_rng([seed, number, total])
    case = Case(number)

    def pick(options: tuple[str, ...]) -> str:
        return str(options[int(rng.integers(len(options)))])

    for j in range(int(rng.integers(1, 5))):
        kind = pick(
            (
                "reduce",
                "reduce",
                "nest",
                "gather",
                "broadcast",
                "scatter",
                "barrier",
                "named",
                "merge",
                "large",
            )
        )
        dtype = pick(INTS + FLOATS)
        cols = int(rng.integers(1, 4))
        op = pick(OPS)
        if kind == "gather":
            case.steps.append((kind, j, dtype, cols, int(rng.integers(0, 2))))
        elif kind == "broadcast":
            case.steps.append((kind, j, dtype, cols, int(rng.integers(total))))
        elif kind == "large":
            case.steps.append((kind, j, dtype, cols, pick(("MIN", "MAX"))))
        elif kind == "merge":
            case.steps.append(
                (
                    kind,
                    j,
                    dtype,
                    cols,
                    op,
                    pick(("reduce", "reduce0", "gather", "reduce_to", "batch")),
                )
            )
        else:
            case.steps.append((kind, j, dtype, cols, op))
    for j in range(int(rng.integers(1, 4))):
        kind = pick(
            (
                "reduce",
                "reduce0",
                "gather",
                "reduce_to",
                "batch",
                "broadcast_to",
                "plain",
                "plain_gather",
                "local",
                "values_fn",
                "dataset",
                "large",
                "mismatch",
                "number",
            )
        )
        if kind == "plain":
            op = pick(("MEAN", "MIN", "MAX", "SUM"))
        elif kind == "large":
            op = pick(("MIN", "MAX"))
        else:
            op = pick(OPS)
        dtype = pick(INTS + FLOATS)
        if kind == "mismatch" and dtype == "bool":
            dtype = "int32"  # (a refused dtype: which of two refusals wins is another test)
        case.posts.append((kind, 100 + j, dtype, int(rng.integers(1, 4)), op))
    # (where the oracle has a defect, another dtype of the same kind)
    case.steps = [
        (s[0], s[1], "int64" if (s[2], *s[4:5]) in ORACLE_DEFECTS else s[2], *s[3:])
        for s in case.steps
    ]
    case.posts = [
        (p[0], p[1], "int64" if (p[2], p[4]) in ORACLE_DEFECTS else p[2], *p[3:])
        for p in case.posts
    ]
    roll = rng.random()
    if roll < 0.42:
        # A program with a fault has no dtype that a reduction refuses: which of two
        # errors is found first depends on when each replica arrives.
        case.steps = [(s[0], s[1], "int32" if s[2] == "bool" else s[2], *s[3:]) for s in case.steps]
        case.posts = [(p[0], p[1], "int32" if p[2] == "bool" else p[2], *p[3:]) for p in case.posts]
    unnamed = [k for k, s in enumerate(case.steps) if s[0] != "named"]
    if roll < 0.15 and total > 1 and unnamed:
        # the last replica calls another collective at one step (not a named one: one
        # process finds replicas waiting at different names in a cycle, a deadlock,
        # where processes find that the names differ, docs/scale-out.md)
        case.fault = ("other", unnamed[int(rng.integers(len(unnamed)))], total - 1)
    elif roll < 0.3 and total > 1:
        # the last replica returns before one of its collectives
        case.fault = ("skip", int(rng.integers(len(case.steps))), total - 1)
    elif roll < 0.36 and "reduce" in [s[0] for s in case.steps]:
        # a replica all-reduces a value no dtype holds (2**70): refused as it is issued
        reduces = [k for k, s in enumerate(case.steps) if s[0] == "reduce"]
        case.fault = ("refuse", reduces[int(rng.integers(len(reduces)))], int(rng.integers(total)))
    elif roll < 0.42 and total > 1 and case.steps[0][0] == "reduce":
        # two errors at the run's first all_reduce, on different processes: the last
        # replica refuses 2**70, replica 0 passes another shape (a mismatch) or bools
        # (another refusal): every process raises what one process finds first, in
        # replica order (at the first collective one process's replicas issue in that
        # order; later, the replica that dispatched the previous collective goes first).
        # Where replica 0 is alone on process 0 and the refusing process holds replicas
        # 1.. ("1,3"), that process sends with its refusal the collective its replicas
        # issued before it, so the mismatch with replica 0 is found first, as in one.
        case.fault = ("refuse2", 0, total - 1, pick(("shape", "bool")))
    elif roll < 0.45 and total > 1:
        # the last replica returns another structure (a tuple where the others return
        # a list): one process's run raises regroup's ValueError, so must every process
        case.fault = ("structure", -1, total - 1)
    return case


async def cross(strategy: ar.Strategy, what: str, op: str, value: Any) -> Any:
    """A cross-replica call of ``what`` on ``value`` (a merge_fn's or the run's caller's)."""
    if what == "reduce":
        return await strategy.reduce(op, value, axis=None)
    if what == "reduce0":
        return await strategy.reduce(op, value, axis=0)
    if what == "gather":
        return await strategy.gather(value, axis=0)
    if what == "reduce_to":
        return await strategy.extended.reduce_to(op, value, destinations="CPU:0")
    if what == "batch":
        single, mirrored = await strategy.extended.batch_reduce_to(
            op, [(value, "CPU:0"), (value, value)]
        )
        return [single, *strategy.experimental_local_results(mirrored)[:1]]
    raise AssertionError(what)


def step_fn(case: Case) -> Callable[[], Any]:
    async def step() -> Any:
        ctx = ar.get_replica_context()
        assert ctx is not None
        g = ctx.replica_id_in_sync_group
        n = ctx.num_replicas_in_sync
        out: list[Any] = []
        for s in case.steps:
            kind, j, dtype, cols = s[:4]
            fault = case.fault if case.fault is not None and case.fault[1] == j else None
            if fault is not None and g == fault[2] and fault[0] == "skip":
                return out
            other = fault is not None and g == fault[2] and fault[0] == "other"
            x = make(dtype, (2, cols), case.number, j, g)
            if fault is not None and g == fault[2] and fault[0] in ("refuse", "refuse2"):
                x = 2**70  # type: ignore[assignment]
            elif fault is not None and g == 0 and fault[0] == "refuse2":
                shape = (2, cols) if fault[3] == "bool" else (2, cols + 1)
                x = make("bool" if fault[3] == "bool" else dtype, shape, case.number, j, g)
            if kind == "reduce":
                result = await ctx.all_reduce(
                    "MAX" if other and s[4] != "MAX" else "MIN" if other else s[4], x
                )
                # The MEAN of integers is exact across processes, as in one: the same bits.
                exact = s[4] == "MEAN" and dtype in INTS and dtype != "bool"
                out.append({EXACT: result} if exact else result)
            elif kind == "large":
                # MIN and MAX pick a value: the same bits whatever the layout
                big = make_large(dtype, case.number, j, g)
                op = ("MIN" if s[4] == "MAX" else "MAX") if other else s[4]
                out.append({EXACT: await ctx.all_reduce(op, big)})
            elif kind == "nest":
                y = make("float64" if dtype in INTS else "int32", (cols,), case.number, j, g, 1)
                out.append(
                    await ctx.all_reduce(
                        s[4], {"a": x, "b": [y, x[:1]]} if not other else {"a": x, "b": [y]}
                    )
                )
            elif kind == "gather":
                axis = s[4]
                shape = (1 + g % 3, cols) if axis == 0 else (2, 1 + g % 3)
                if other:
                    shape = (2, 7, 1)
                out.append(await ctx.all_gather(make(dtype, shape, case.number, j, g), axis=axis))
            elif kind == "broadcast":
                out.append(await ctx.broadcast(x if not other else x[:1], source=s[4]))
            elif kind == "scatter":
                v = make(dtype, (n * 2, cols), case.number, j, g)
                op = ("MIN" if s[4] == "MAX" else "MAX") if other else s[4]
                out.append(await ctx.reduce_scatter(op, v, axis=0))
            elif kind == "barrier":
                if other:
                    out.append(await ctx.all_reduce("SUM", x))
                else:
                    await ctx.barrier()
            elif kind == "named":
                out.append(await ctx.all_reduce(s[4], x, name="loss" if not other else "other"))
            elif kind == "merge":
                op, what = s[4], s[5]

                async def merge_fn(
                    strategy: ar.Strategy, v: Any, what: str = what, op: str = op
                ) -> Any:
                    return await cross(strategy, what, op, v)

                if other:
                    out.append(await ctx.all_reduce("SUM", x))
                else:
                    out.append(await ctx.merge_call(merge_fn, args=(x,)))
        # a value for the cross-replica calls after the run
        # (of one shape on every replica where the call reduces element-wise)
        out.append(
            [
                make_large(dt, case.number, j, g)
                if kind == "large"
                else deviant(dt, c, kind, g, case, j, n)
                if kind == "mismatch"
                else number(dt, g, case, j)
                if kind == "number"
                else make(dt, (2, c) if kind in ELEMENTWISE else (2 + g % 2, c), case.number, j, g)
                for kind, j, dt, c, _ in case.posts
            ]
        )
        if case.fault is not None and case.fault[0] == "structure" and g == case.fault[2]:
            return tuple(out)
        return out

    return step


def number(dtype: str, g: int, case: Case, j: int) -> Any:
    """Replica ``g``'s value of a ``number`` post: a Python number, or (odd replicas) a
    0-d array of the dtype the backend describes it in (int64, float64)."""
    value = make("int64" if dtype in INTS else "float64", (), case.number, j, g)
    return value if g % 2 else value.item()


def deviation(case: Case, j: int, total: int) -> tuple[int, str, int | None]:
    """A ``mismatch`` post: the replica whose component differs, how, and the axis."""
    rng = np.random.default_rng([case.number, j, 7])
    return (
        int(rng.integers(total)),
        ("shape", "rank", "dtype")[int(rng.integers(3))],
        (None, 0)[int(rng.integers(2))],
    )


def deviant(dtype: str, cols: int, how: str, g: int, case: Case, j: int, total: int) -> Any:
    """Replica ``g``'s component of a ``mismatch`` post."""
    replica, what, _ = deviation(case, j, total)
    if g != replica:
        return make(dtype, (2, cols), case.number, j, g)
    if what == "shape":
        return make(dtype, (2, cols + 1), case.number, j, g)
    if what == "rank":
        return make(dtype, (2, cols, 1), case.number, j, g)
    return make("float32" if dtype != "float32" else "float64", (2, cols), case.number, j, g)


def layout_plain(
    counts: tuple[int, ...], dtype: str, cols: int, op: str, *key: int
) -> tuple[Any, Any]:
    """A plain value of this process, and what the oracle reduces for it."""
    mine = make(dtype, (2, cols), *key, RANK)
    if min(counts) > 1 or (max(counts) > 1 and op in ("SUM", "PROD")):
        # one value, as in one process (SUM or PROD of it: the oracle's ValueError)
        return mine, mine
    # wherever a process has one replica, a plain value stands for its value on each of
    # its replicas (TensorFlow's multi-worker rule: a worker's host value counts once)
    per = [make(dtype, (2, cols), *key, r) for r, k in enumerate(counts) for _ in range(k)]
    return mine, ar.PerReplica(per)


async def posts(
    strategy: ar.Strategy, case: Case, result: Any, counts: tuple[int, ...]
) -> list[Any]:
    """The cross-replica calls after the run, on its last output (the per-replica values)."""
    values = result[-1]
    out: list[Any] = []
    for k, (kind, j, dtype, cols, op) in enumerate(case.posts):
        value = values[k]
        if kind in ("reduce", "reduce0", "gather", "reduce_to", "batch"):
            out.append(await cross(strategy, kind, op, value))
        elif kind == "large":
            out.append({EXACT: await cross(strategy, "reduce", op, value)})
        elif kind == "number":
            # Python numbers (and 0-d arrays on other replicas): float64 / int64
            out.append(await cross(strategy, "reduce", op, value))
        elif kind == "mismatch":
            # one replica's component differs (shape, rank or dtype): one process raises
            _, _, axis = deviation(case, j, strategy.num_replicas_in_sync)
            out.append(await strategy.reduce(op, value, axis=axis))
        elif kind == "broadcast_to":
            plain = make(dtype, (cols,), case.number, j)
            out.append(await strategy.extended.broadcast_to(plain, destinations="CPU:0"))
        elif kind == "local":
            out.append(list(strategy.experimental_local_results(value)))
        elif kind == "dataset":
            # every process iterates the same global batch and keeps its replicas' slices
            total = strategy.num_replicas_in_sync
            batch = make(dtype, (2 * total + 1, cols), case.number, j)  # an uneven split
            for part in strategy.experimental_distribute_dataset([batch]):
                out.append(list(strategy.experimental_local_results(part)))
        elif kind == "values_fn":
            # experimental_distribute_values_from_function regroups by global replica id
            per = strategy.experimental_distribute_values_from_function(
                lambda c, d=dtype, c2=cols, j=j: make(
                    d, (2, c2), case.number, j, c.replica_id_in_sync_group
                )
            )
            out.append([await strategy.reduce(op, per, axis=None), await strategy.gather(per, 0)])
        else:
            mine, oracle = layout_plain(
                counts, dtype, cols, op if kind == "plain" else "", case.number, j
            )
            use = oracle if isinstance(strategy, ar.MirroredStrategy) else mine
            if kind == "plain":
                out.append(await strategy.reduce(op, use, axis=None))
            else:
                out.append(await strategy.gather(use, axis=0))
    return out


def describe_error(error: BaseException | None, *, ids: bool = False) -> tuple[Any, ...] | None:
    """What must agree between the oracle's error and each process's.

    With ``ids``, also the replica ids that depend on when the error was found (the
    replicas that had arrived): every process must agree on those too, but one process
    finds an error at another moment than the oracle does.
    """
    if error is None:
        return None
    name = type(error).__name__
    if isinstance(error, ar.CollectiveMismatchError):
        found = (name, error.position, error.name, tuple(error.fields))
        return (*found, tuple(sorted(error.signatures))) if ids else found
    if isinstance(error, ar.ReplicaExitedError):
        found = (name, error.replica_id, error.position, error.name)
        return (*found, tuple(sorted(error.waiting))) if ids else found
    first = str(error).partition("\n")[0]
    if isinstance(error, TypeError) and first.startswith("replica "):
        return (name, first)  # a refused value: which replica, and why
    if isinstance(error, ValueError) and first.startswith("replicas returned values"):
        return (name, first)  # regroup's: the first replica whose structure differs
    return (name,)


def _differ(got: np.ndarray, want: np.ndarray) -> str:
    """Where two arrays of one shape differ (a few positions; large ones are long)."""
    if got.size <= 16:
        return f"{got.tolist()} != {want.tolist()}"
    same = (
        (got == want) | (np.isnan(got) & np.isnan(want)) if got.dtype.kind in "fc" else got == want
    )
    if got.dtype.kind in "fc":
        same &= np.signbit(got.real) == np.signbit(want.real)
    where = np.argwhere(~same)[:4]
    pairs = ", ".join(f"{tuple(w)}: {got[tuple(w)]!r} vs {want[tuple(w)]!r}" for w in where)
    return f"{int((~same).sum())} of {got.size} differ ({pairs})"


class Checker:
    def __init__(self, counts: tuple[int, ...]) -> None:
        self.counts = counts
        self.total = sum(counts)
        self.first = sum(counts[:RANK])
        self.checks = 0
        self.warned = 0  # cases where the oracle warned
        self.failures: list[str] = []

    def leaf(self, where: str, got: Any, want: Any, *, exact: bool = False) -> None:
        self.checks += 1
        got_a, want_a = np.asarray(got), np.asarray(want)
        if got_a.dtype != want_a.dtype or got_a.shape != want_a.shape:
            self.failures.append(
                f"{where}: {got_a.dtype}{list(got_a.shape)} where the oracle "
                f"gives {want_a.dtype}{list(want_a.shape)}"
            )
            return
        if exact or got_a.dtype.kind not in "fc" or max(self.counts) == 1:
            if not np.array_equal(got_a, want_a, equal_nan=True):
                self.failures.append(f"{where}: {_differ(got_a, want_a)}")
            elif got_a.dtype.kind in "fc" and not np.array_equal(
                np.signbit(got_a.real), np.signbit(want_a.real)
            ):
                # array_equal takes -0.0 for 0.0; one process's bits keep the sign
                self.failures.append(f"{where}: signed zeros differ {_differ(got_a, want_a)}")
            return
        # Floats of k > 1 replicas per process: each process's partial result changes
        # the order of the sum (docs/scale-out.md: the tolerance).
        eps = float(np.finfo(got_a.dtype).eps)
        # (a complex value part by part: an infinite part makes its difference NaN)
        pairs = [(got_a.real, want_a.real), (got_a.imag, want_a.imag)]
        for got_part, want_part in pairs if got_a.dtype.kind == "c" else [(got_a, want_a)]:
            scale = max(
                1.0, float(np.max(np.abs(want_part), initial=0.0, where=np.isfinite(want_part)))
            )
            atol = self.total**2 * eps * scale
            if not np.allclose(
                got_part, want_part, rtol=4 * self.total * eps, atol=atol, equal_nan=True
            ):
                self.failures.append(f"{where}: {got_a.tolist()} !~ {want_a.tolist()}")
                return

    def nest(self, where: str, got: Any, want: Any) -> None:
        if isinstance(want, dict) and list(want) == [EXACT]:
            assert isinstance(got, dict), (where, got, want)
            self.leaf(where, got[EXACT], want[EXACT], exact=True)
        elif isinstance(want, dict):
            assert isinstance(got, dict), (where, got, want)
            assert sorted(got) == sorted(want), (where, got, want)
            for key in want:
                self.nest(f"{where}.{key}", got[key], want[key])
        elif isinstance(want, list | tuple):
            if not isinstance(got, list | tuple) or len(got) != len(want):
                self.failures.append(f"{where}: {got!r:.200} where the oracle gives {want!r:.200}")
                return
            for i, (a, b) in enumerate(zip(got, want, strict=True)):
                self.nest(f"{where}[{i}]", a, b)
        elif want is None:
            if got is not None:
                self.failures.append(f"{where}: {got!r} where the oracle gives None")
        else:
            self.leaf(where, got, want)

    def warnings(self, where: str, got: set[str], want: set[str]) -> None:
        self.checks += 2
        # Where only process 0 holds several replicas, the processes combine in one
        # process's order ((r0 + r1) + r2 ...): the same partial results, the same
        # warnings. Elsewhere a process's own partial sum regroups the combine (the
        # values' documented tolerance), and it may meet an overflow one process does not.
        if all(k == 1 for k in self.counts[1:]) and got != want:
            self.failures.append(
                f"{where}: warnings {sorted(got)} where the oracle gives {sorted(want)}"
            )
        self.warned += bool(want)
        everyone = MPI.COMM_WORLD.allgather(sorted(got))
        if any(e != everyone[0] for e in everyone):
            self.failures.append(f"{where}: the processes warn {everyone}")

    def error(self, where: str, got: BaseException | None, want: BaseException | None) -> None:
        self.checks += 2
        g, w = describe_error(got), describe_error(want)
        if g != w:
            first = "" if got is None else str(got).partition("\n")[0][:300]
            self.failures.append(f"{where}: error {g} where the oracle gives {w} ({first})")
        # every process raises the same error, with the same global ids
        everyone = MPI.COMM_WORLD.allgather(describe_error(got, ids=True))
        if any(e != everyone[0] for e in everyone):
            self.failures.append(f"{where}: the processes raise {everyone}")


async def run_case(mw: ar.Strategy, oracle: ar.Strategy, case: Case, check: Checker) -> None:
    step = step_fn(case)
    outcomes: list[tuple[Any, BaseException | None]] = []
    warned: list[set[str]] = []
    for strategy in (mw, oracle):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                result = await strategy.run(step)
                results = [strategy.experimental_local_results(result)]
                extra = await posts(strategy, case, result, check.counts)
                outcomes.append(((results, extra), None))
            except Exception as error:  # compared with the oracle's
                outcomes.append((None, error))
        # numpy's floating-point warnings (an overflow of float16): the same kinds as one
        # process, on every process. Not their count: one process warns per numpy call
        # that met one, the processes once per collective (docs/scale-out.md).
        warned.append({str(w.message) for w in caught if w.category is RuntimeWarning})
    (got, got_error), (want, want_error) = outcomes
    where = f"case {case.number} {case.steps} {case.posts} fault={case.fault}"
    check.error(where, got_error, want_error)
    check.warnings(where, warned[0], warned[1])
    if TRACE:
        print(
            f"rank={RANK} case {case.number} {describe_error(got_error) if got_error else None}",
            flush=True,
        )
    if got is None or want is None:
        return
    (mine,), extra = got
    (everyone,), oracle_extra = want
    for i, nest in enumerate(mine):
        check.nest(f"{where} replica {check.first + i}", nest, everyone[check.first + i])
    for k, (a, b) in enumerate(zip(extra, oracle_extra, strict=True)):
        if case.posts[k][0] in ("local", "dataset"):
            b = b[check.first : check.first + check.counts[RANK]]
        check.nest(f"{where} post {k}", a, b)


async def main(seed: int, cases: int, layouts: list[tuple[int, ...]]) -> int:
    failed = 0
    for counts in layouts:
        assert len(counts) == SIZE, counts
        total = sum(counts)
        mw = ar.MultiWorkerMirroredStrategy(
            [f"CPU:{i}" for i in range(counts[RANK])], stall_warning_seconds=None
        )
        oracle = ar.MirroredStrategy([f"CPU:{i}" for i in range(total)], stall_warning_seconds=None)
        check = Checker(counts)
        for number in range(cases):
            await run_case(mw, oracle, generate(seed, number, total, counts), check)
        layout = ",".join(map(str, counts))
        print(
            f"rank={RANK} layout={layout} cases={cases} checks={check.checks} warned={check.warned}",
            flush=True,
        )
        for failure in check.failures:
            print(f"rank={RANK} MISMATCH layout={layout} {failure}", flush=True)
        failed += len(check.failures)
    print(f"rank={RANK} done", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    layouts = [tuple(int(k) for k in arg.split(",")) for arg in sys.argv[3:]]
    code = anyio.run(main, int(sys.argv[1]), int(sys.argv[2]), layouts)
    sys.exit(code)
