"""Property: random per-replica programs never hang and never give wrong results.

Hypothesis draws a program (see ``random_programs.py``): collectives of every kind with
small shapes, dtypes from int8 to float64 and bool where legal, leaves or nests (lists,
dicts), issued from two different lines, through 0 to 12 helper frames, or two on one
line; named pairs issued from a task group, ``asyncio.gather``, a helper task or in
sequence. Each program builds its leaves with one array library (numpy, array_api_strict,
or more rarely JAX and PyTorch: those installed), whose type every result must keep. Each replica passes
its values in its own byte order and dict key order (which must never matter) and may take faults: a skipped, extra, changed or swapped step (swapped
at depth, or on one line), a planted exception, named collectives awaited in a cycle, a
helper task left behind by a failing replica, a cancellation of the whole run, and
checkpoints anywhere. Each program runs under a hang guard on asyncio and trio:

* consistent programs give exactly what numpy gives, reduced in replica order;
* inconsistent ones raise a ``CollectiveError`` (a cycle: ``CollectiveDeadlockError``), or
  the planted exception; a cancelled run is cancelled; nothing ever hangs;
* no task is left behind, and the strategy runs a correct program afterwards.

``ASYNCREPLICA_PROPERTY_EXAMPLES`` sets the number of programs per event loop (CI: 300).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
from collections.abc import Sequence
from typing import Any, TypeVar

import anyio
import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument
from random_programs import (
    FAULTS,
    KNOWN_BROKEN,
    LIBRARIES,
    Planted,
    Program,
    RandomChooser,
    act,
    check_results,
    draw_program,
    to_library,
)

import asyncreplica as ar

T = TypeVar("T")

EXAMPLES = int(os.environ.get("ASYNCREPLICA_PROPERTY_EXAMPLES", "300"))
settings.register_profile(
    "asyncreplica-properties",
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

HANG_GUARD = 5.0

# The array library of each program's leaves, by weight: JAX calls are slow, so JAX is
# drawn for about one program in ten (eleven with torch, which CI does not install).
# Libraries that are not installed are left out.
_WEIGHTS = {"numpy": 5, "array_api_strict": 4, "jax": 1, "torch": 1}
ARRAY_LIBRARIES = tuple(
    name
    for name, weight in _WEIGHTS.items()
    if name == "numpy" or importlib.util.find_spec(name) is not None
    for _ in range(weight)
)


class HypothesisChooser:
    """The generator's choices, drawn by hypothesis (so failures shrink)."""

    def __init__(self, data: st.DataObject) -> None:
        self._data = data

    def choice(self, options: Sequence[T]) -> T:
        return self._data.draw(st.sampled_from(options))

    def integer(self, lo: int, hi: int) -> int:
        return self._data.draw(st.integers(lo, hi))


def record(text: str) -> None:
    """A hypothesis event (``--hypothesis-show-statistics``); nothing outside hypothesis."""
    with contextlib.suppress(InvalidArgument):
        event(text)


async def execute(program: Program, guard: float = HANG_GUARD) -> None:
    s = ar.MirroredStrategy([f"CPU:{i}" for i in range(program.n)])
    planted: list[BaseException] = []
    results: dict[int, list[Any]] = {}
    before = len(anyio.get_running_tasks())
    outcome: Any = None
    # The library is imported (JAX: seconds on a loaded machine) before the hang guard.
    to_library(np.zeros(1), program.library)

    with anyio.fail_after(guard), anyio.CancelScope() as scope:

        async def step() -> None:
            ctx = ar.get_replica_context()
            assert ctx is not None
            rid = ctx.replica_id_in_sync_group
            out = results.setdefault(rid, [])
            for action in program.actions[rid]:
                gave, result = await act(ctx, action, rid, planted, scope.cancel, program.library)
                if gave:
                    out.append(result)

        try:
            await s.run(step)
        except Exception as exc:
            outcome = exc

    assert len(anyio.get_running_tasks()) == before, "a task was left behind"
    record(f"n={program.n} consistent={program.consistent} faults={sorted(set(program.faults))}")
    record(f"outcome={'cancelled' if scope.cancelled_caught else type(outcome).__name__}")
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
    planted: list[BaseException],
    results: dict[int, list[Any]],
) -> None:
    may_cancel = program.has("cancel")
    may_plant = program.has("raise") or program.has("spawn_then_raise")
    if outcome is None and cancelled:
        assert may_cancel, "the run was cancelled, but nobody cancelled it"
        return
    if outcome is None:
        assert program.consistent, f"an inconsistent program completed: {program}"
        assert not may_plant
        assert not may_cancel
        for rid in range(program.n):
            check_results(program, rid, results[rid], range(program.n))
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
        same_steps = all(program.collectives(r) == program.collectives(0) for r in range(program.n))
        if program.cycle and same_steps:
            assert isinstance(outcome, ar.CollectiveDeadlockError), repr(outcome)
    if isinstance(outcome, BaseExceptionGroup):
        assert len(leaves(outcome)) > 1


@pytest.mark.parametrize("backend", ["asyncio", "trio"], ids=["asyncio", "trio"])
@settings(settings.get_profile("asyncreplica-properties"))
@given(data=st.data())
def test_random_programs_never_hang_and_never_lie(backend: str, data: st.DataObject) -> None:
    program = draw_program(
        HypothesisChooser(data), asyncio_only=backend == "asyncio", libraries=ARRAY_LIBRARIES
    )
    record(f"array library: {program.library}")
    anyio.run(functools.partial(execute, program), backend=backend)


@pytest.mark.parametrize("fault", sorted(KNOWN_BROKEN))
def test_known_broken_fault_kinds_still_fail(fault: str) -> None:
    """Each fault kind kept out of the draw still shows its bug (empty the set once fixed).

    Seeded programs with only that fault are run until one fails the oracle: when none
    of 300 does, the bug is gone and ``KNOWN_BROKEN`` must lose the entry.
    """
    broken = dict.fromkeys(KNOWN_BROKEN)
    found = None
    for seed in range(300):
        KNOWN_BROKEN.clear()
        try:
            program = draw_program(RandomChooser(seed), n_range=(2, 3), faults=[fault])
        finally:
            KNOWN_BROKEN.update(broken)
        if fault not in program.faults:
            continue
        try:
            anyio.run(functools.partial(execute, program, 1.0), backend="asyncio")
        except (AssertionError, TimeoutError) as exc:
            found = exc
            break
    assert found is not None, f"{fault!r} no longer fails: remove it from KNOWN_BROKEN"


def test_every_array_library_has_a_weight() -> None:
    assert set(_WEIGHTS) == set(LIBRARIES)


@pytest.mark.parametrize("library", [lib for lib in LIBRARIES if lib != "numpy"])
def test_seeded_programs_of_each_array_library(library: str) -> None:
    """Programs of one foreign library (skipped where it is missing) hold the properties.

    The hypothesis test draws rare libraries (JAX, PyTorch) for a few programs only; these
    seeded ones run each library whatever the draw.
    """
    pytest.importorskip(library, reason=f"{library} is not installed")
    for seed in range(25):
        program = draw_program(RandomChooser(seed), libraries=(library,))
        assert program.library == library
        anyio.run(functools.partial(execute, program), backend="asyncio")


def test_every_fault_kind_can_be_drawn() -> None:
    seen: set[str] = set()
    saved = set(KNOWN_BROKEN)
    KNOWN_BROKEN.clear()
    try:
        for seed in range(400):
            seen.update(draw_program(RandomChooser(seed), n_range=(2, 4)).faults)
    finally:
        KNOWN_BROKEN.update(saved)
    assert seen == set(FAULTS)


# -- call paths: deep helpers, calls on one line, a user package named like a loop ------

_PATHS_SOURCE = """
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
"""


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
            st.tuples(st.integers(0, 1), st.integers(0, 3), st.integers(0, 30), st.integers(0, 9)),
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
