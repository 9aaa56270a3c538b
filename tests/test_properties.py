"""Property: random per-replica programs never hang and never give wrong results.

Hypothesis generates a shared program (collectives of every kind with small shapes and dtypes)
and perturbs it per replica: a skipped step, an extra step, a changed shape/dtype/op/source/kind,
a planted exception, checkpoints (``anyio.sleep(0)``, ``anyio.lowlevel.checkpoint()``) anywhere,
or a cancellation of the whole run. Each program runs under a hang guard on asyncio and trio:

* consistent programs give the results of a plain numpy reference, reduced in replica order;
* inconsistent ones raise a ``CollectiveError`` (or the planted exception); a cancelled run is
  cancelled; nothing ever hangs;
* no task is left behind.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Any

import anyio
import anyio.lowlevel
import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import asyncreplica as ar

settings.register_profile(
    "asyncreplica-properties",
    max_examples=400,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

HANG_GUARD = 5.0
KINDS = ("all_reduce", "all_gather", "broadcast", "reduce_scatter", "barrier", "merge_call")
OPS = ("sum", "mean", "min", "max", "prod")
DTYPES = ("float32", "float64", "int32", "int64")


@dataclass(frozen=True)
class Step:
    """One collective, as every replica should issue it."""

    kind: str
    op: str | None = None
    shape: tuple[int, ...] = ()
    dtype: str = "float64"
    axis: int | None = None
    source: int | None = None
    seed: int = 0  # varies the values


class Planted(Exception):
    """An exception a replica raises on purpose."""


@dataclass(frozen=True)
class Program:
    n: int
    steps: tuple[Step, ...]
    # Per replica: ("step", Step) | ("checkpoint",) | ("sleep0",) | ("raise",) | ("cancel",)
    actions: tuple[tuple[tuple[Any, ...], ...], ...]

    def collectives(self, rid: int) -> list[Step]:
        return [a[1] for a in self.actions[rid] if a[0] == "step"]

    @property
    def consistent(self) -> bool:
        return all(self.collectives(r) == self.collectives(0) for r in range(self.n))

    def has(self, what: str) -> bool:
        return any(a[0] == what for acts in self.actions for a in acts)


@st.composite
def steps(draw: st.DrawFn, n: int, seed: int) -> Step:
    kind = draw(st.sampled_from(KINDS))
    dtype = draw(st.sampled_from(DTYPES))
    if kind in ("barrier", "merge_call"):
        return Step(kind, seed=seed)
    dims = draw(st.lists(st.integers(1, 3), min_size=0, max_size=2))
    if kind == "all_reduce":
        return Step(kind, draw(st.sampled_from(OPS)), tuple(dims), dtype, seed=seed)
    if kind == "broadcast":
        return Step(kind, None, tuple(dims), dtype, source=draw(st.integers(0, n - 1)), seed=seed)
    if not dims:
        dims = [draw(st.integers(1, 3))]
    axis = draw(st.integers(0, len(dims) - 1))
    if kind == "all_gather":
        return Step(kind, None, tuple(dims), dtype, axis=axis, seed=seed)
    dims[axis] *= n  # reduce_scatter: the axis divides by the number of replicas
    return Step(kind, draw(st.sampled_from(OPS)), tuple(dims), dtype, axis=axis, seed=seed)


def changed(draw: st.DrawFn, step: Step, n: int) -> Step:
    """The same step with one field changed so that replicas must disagree."""
    choices = ["kind"]
    if step.kind not in ("barrier", "merge_call"):
        choices += ["shape", "dtype"]
    if step.op is not None:
        choices.append("op")
    if step.source is not None and n > 1:
        choices.append("source")
    what = draw(st.sampled_from(choices))
    if what == "shape":
        return replace(step, shape=(*step.shape, 2))  # a new trailing axis: never compatible
    if what == "dtype":
        return replace(step, dtype=draw(st.sampled_from([d for d in DTYPES if d != step.dtype])))
    if what == "op":
        return replace(step, op=draw(st.sampled_from([o for o in OPS if o != step.op])))
    if what == "source":
        assert step.source is not None
        return replace(step, source=(step.source + 1) % n)
    if step.kind == "barrier":
        return Step("merge_call", seed=step.seed)
    if step.kind == "merge_call":
        return Step("barrier", seed=step.seed)
    return Step("barrier", seed=step.seed)


@st.composite
def programs(draw: st.DrawFn) -> Program:
    n = draw(st.integers(1, 4))
    base = [draw(steps(n, seed=i)) for i in range(draw(st.integers(0, 5)))]
    per_replica = []
    for _ in range(n):
        acts: list[tuple[Any, ...]] = [("step", s) for s in base]
        for _ in range(draw(st.integers(0, 2))):
            perturbation = draw(
                st.sampled_from(["skip", "extra", "change", "raise", "cancel", "checkpoint"])
            )
            positions = [i for i, a in enumerate(acts) if a[0] == "step"]
            if perturbation == "skip" and positions:
                del acts[draw(st.sampled_from(positions))]
            elif perturbation == "extra":
                extra = draw(steps(n, seed=100 + len(acts)))
                acts.insert(draw(st.integers(0, len(acts))), ("step", extra))
            elif perturbation == "change" and positions:
                i = draw(st.sampled_from(positions))
                acts[i] = ("step", changed(draw, acts[i][1], n))
            elif perturbation in ("raise", "cancel"):
                acts.insert(draw(st.integers(0, len(acts))), (perturbation,))
        for _ in range(draw(st.integers(0, 3))):  # checkpoints never change the outcome
            what = draw(st.sampled_from(["checkpoint", "sleep0"]))
            acts.insert(draw(st.integers(0, len(acts))), (what,))
        per_replica.append(tuple(acts))
    return Program(n, tuple(base), tuple(per_replica))


# -- values and the numpy reference ----------------------------------------------------------------


def value(step: Step, rid: int) -> np.ndarray:
    size = int(np.prod(step.shape, dtype=np.int64))
    base = np.arange(size, dtype=np.int64).reshape(step.shape) % 3
    return (base + rid + step.seed % 2 + 1).astype(step.dtype)  # small positive integers


def reduce_in_order(op: str, values: list[np.ndarray]) -> np.ndarray:
    acc = values[0]
    for v in values[1:]:
        acc = {"sum": np.add, "mean": np.add, "prod": np.multiply, "min": np.minimum}.get(
            op, np.maximum
        )(acc, v)
    if op == "mean":
        acc = acc / len(values) if acc.dtype.kind == "f" else acc.astype(np.float64) / len(values)
    return np.asarray(acc)


def reference(step: Step, rid: int, n: int) -> Any:
    values = [value(step, r) for r in range(n)]
    if step.kind == "all_reduce":
        assert step.op is not None
        return reduce_in_order(step.op, values)
    if step.kind == "all_gather":
        return np.concatenate(values, axis=step.axis)
    if step.kind == "broadcast":
        assert step.source is not None
        return values[step.source]
    if step.kind == "reduce_scatter":
        assert step.op is not None
        return np.split(reduce_in_order(step.op, values), n, axis=step.axis)[rid]
    if step.kind == "merge_call":
        return tuple(values)
    return None


def assert_same(got: Any, expected: Any) -> None:
    if expected is None:
        assert got is None
    elif isinstance(expected, tuple):
        assert isinstance(got, tuple)
        assert len(got) == len(expected)
        for g, e in zip(got, expected, strict=True):
            assert_same(g, e)
    else:
        got = np.asarray(got)
        assert got.shape == expected.shape
        assert got.dtype == expected.dtype, (got.dtype, expected.dtype)
        np.testing.assert_allclose(got, expected, rtol=1e-6)


# -- the interpreter ------------------------------------------------------------------------------


def _local(strategy: ar.Strategy, v: Any) -> Any:
    return tuple(strategy.experimental_local_results(v))


async def issue(ctx: ar.ReplicaContext, step: Step, rid: int) -> Any:
    """Every collective of one kind comes from one line, so call sites always agree."""
    x = value(step, rid)
    if step.kind == "all_reduce":
        return await ctx.all_reduce(step.op, x)  # type: ignore[arg-type]
    if step.kind == "all_gather":
        return await ctx.all_gather(x, axis=step.axis)  # type: ignore[arg-type]
    if step.kind == "broadcast":
        return await ctx.broadcast(x, source=step.source)  # type: ignore[arg-type]
    if step.kind == "reduce_scatter":
        return await ctx.reduce_scatter(step.op, x, axis=step.axis)  # type: ignore[arg-type]
    if step.kind == "merge_call":
        return await ctx.merge_call(_local, args=(x,))
    return await ctx.barrier()


async def execute(program: Program) -> None:
    s = ar.MirroredStrategy([f"CPU:{i}" for i in range(program.n)])
    planted: list[Planted] = []
    results: dict[int, list[Any]] = {}
    before = len(anyio.get_running_tasks())
    outcome: Any = None

    with anyio.fail_after(HANG_GUARD), anyio.CancelScope() as scope:

        async def step() -> None:
            ctx = ar.get_replica_context()
            assert ctx is not None
            rid = ctx.replica_id_in_sync_group
            out = results.setdefault(rid, [])
            for action in program.actions[rid]:
                if action[0] == "step":
                    out.append(await issue(ctx, action[1], rid))
                elif action[0] == "checkpoint":
                    await anyio.lowlevel.checkpoint()
                elif action[0] == "sleep0":
                    await anyio.sleep(0)  # noqa: ASYNC115 -- what users write
                elif action[0] == "raise":
                    error = Planted(f"planted in replica {rid}")
                    planted.append(error)
                    raise error
                else:
                    scope.cancel()
                    await anyio.lowlevel.checkpoint()

        try:
            await s.run(step)
        except Exception as exc:
            outcome = exc

    assert len(anyio.get_running_tasks()) == before, "a task was left behind"
    event(f"n={program.n} consistent={program.consistent}")
    event(f"outcome={'cancelled' if scope.cancelled_caught else type(outcome).__name__}")
    check_outcome(program, outcome, scope.cancelled_caught, planted, results)

    # The strategy runs a correct program correctly after whatever happened.
    async def good() -> Any:
        ctx = ar.get_replica_context()
        assert ctx is not None
        return await ctx.all_reduce("sum", 1.0)

    with anyio.fail_after(HANG_GUARD):
        again = await s.run(good)
    assert s.experimental_local_results(again) == (float(program.n),) * program.n


def leaves(error: BaseException) -> list[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        return [leaf for e in error.exceptions for leaf in leaves(e)]
    return [error]


def check_outcome(
    program: Program,
    outcome: Exception | None,
    cancelled: bool,
    planted: list[Planted],
    results: dict[int, list[Any]],
) -> None:
    may_cancel = program.has("cancel")
    may_plant = program.has("raise")
    if outcome is None and cancelled:
        assert may_cancel, "the run was cancelled, but nobody cancelled it"
        return
    if outcome is None:
        assert program.consistent, f"an inconsistent program completed: {program}"
        assert not may_plant
        assert not may_cancel
        for rid in range(program.n):
            got = results[rid]
            assert len(got) == len(program.collectives(rid))
            for step, g in zip(program.collectives(rid), got, strict=True):
                assert_same(g, reference(step, rid, program.n))
        return
    assert not cancelled
    for leaf in leaves(outcome):
        if isinstance(leaf, Planted):
            assert any(leaf is p for p in planted)
        else:
            assert isinstance(leaf, ar.CollectiveError), repr(leaf)
            assert not program.consistent, f"a consistent program raised {leaf!r}"
            assert str(leaf)
            assert leaf.report is not None
    if program.consistent:
        assert all(isinstance(leaf, Planted) for leaf in leaves(outcome))
    if not planted:
        # One root cause: a single CollectiveError, never a group of them.
        assert isinstance(outcome, ar.CollectiveError), repr(outcome)
    if isinstance(outcome, BaseExceptionGroup):
        assert len(leaves(outcome)) > 1


@pytest.mark.parametrize("backend", ["asyncio", "trio"], ids=["asyncio", "trio"])
@settings(settings.get_profile("asyncreplica-properties"))
@given(program=programs())
def test_random_programs_never_hang_and_never_lie(backend: str, program: Program) -> None:
    anyio.run(functools.partial(execute, program), backend=backend)


def test_the_reference_reduces_in_replica_order() -> None:
    step = Step("all_reduce", "mean", (2,), "int32")
    np.testing.assert_array_equal(reference(step, 0, 2), np.array([1.5, 2.5]))
    gathered = reference(Step("all_gather", None, (1, 2), "float32", axis=1), 0, 2)
    assert gathered.shape == (1, 4)


# -- call paths: deep helpers, calls on one line, a user package named like a loop ------

_PATHS_SOURCE = '''
import asyncreplica as ar


async def through(depth, x):
    if depth == 0:
        return await ar.get_replica_context().all_reduce("sum", x)
    return await through(depth - 1, x)


async def outer(which, depth, x):
    if which == 0:
        return await through(depth, x)
    if which == 1:
        return await through(depth, x)
    return await through(depth, x) if which == 2 else await through(depth, x)
'''


def _paths_module(name: str) -> Any:
    """``outer``/``through`` as a module called ``name`` (its file in a folder of that name)."""
    import sys
    import types

    module = sys.modules.get(name)
    if module is None:
        module = types.ModuleType(name)
        module.__file__ = f"/srv/{name.replace('.', '/')}.py"
        exec(compile(_PATHS_SOURCE, module.__file__, "exec"), module.__dict__)
        sys.modules[name] = module
    return module


# User packages: one whose folder is named like an event loop, one plain.
_PATH_MODULES = ("myapp.asyncio.paths", "myapp.plain.paths")
# A call: (module, which outer line/column, helper depth, seed). Lines 0 and 1 differ;
# 2 and 3 are two calls on one line. The collective itself is always at one line.
PathCall = tuple[int, int, int, int]


@st.composite
def path_programs(draw: st.DrawFn) -> tuple[int, list[list[PathCall]], bool]:
    n = draw(st.integers(2, 3))
    calls = draw(
        st.lists(
            st.tuples(
                st.integers(0, 1), st.integers(0, 3), st.integers(0, 30), st.integers(0, 9)
            ),
            min_size=2,
            max_size=5,
        )
    )
    per_replica = [list(calls) for _ in range(n)]
    consistent = True
    if draw(st.booleans()):
        rid = draw(st.integers(0, n - 1))
        i = draw(st.integers(0, len(calls) - 2))
        a, b = calls[i], calls[i + 1]
        if a[:3] != b[:3]:  # a swap of one call site with itself is legal (and invisible)
            per_replica[rid][i], per_replica[rid][i + 1] = b, a
            consistent = False
    return n, per_replica, consistent


async def _run_paths(n: int, per_replica: list[list[PathCall]]) -> Any:
    s = ar.MirroredStrategy([f"CPU:{i}" for i in range(n)])

    async def step() -> list[float]:
        ctx = ar.get_replica_context()
        assert ctx is not None
        rid = ctx.replica_id_in_sync_group
        out = []
        for module, which, depth, seed in per_replica[rid]:
            paths = _paths_module(_PATH_MODULES[module])
            x = np.full(2, float(seed * 10 + rid))
            out.append(float((await paths.outer(which, depth, x))[0]))
        return out

    with anyio.fail_after(HANG_GUARD):
        return s.experimental_local_results(await s.run(step))


@pytest.mark.parametrize("backend", ["asyncio", "trio"], ids=["asyncio", "trio"])
@settings(settings.get_profile("asyncreplica-properties"), max_examples=60)
@given(program=path_programs())
def test_a_swap_at_any_depth_or_on_one_line_is_never_silent(
    backend: str, program: tuple[int, list[list[PathCall]], bool]
) -> None:
    n, per_replica, consistent = program
    event(f"consistent={consistent}")
    if consistent:
        got = anyio.run(functools.partial(_run_paths, n, per_replica), backend=backend)
        expected = [sum(seed * 10.0 + r for r in range(n)) for _, _, _, seed in per_replica[0]]
        assert list(got) == [expected] * n
    else:
        with pytest.raises(ar.CollectiveMismatchError, match="call site differs"):
            anyio.run(functools.partial(_run_paths, n, per_replica), backend=backend)
