"""Call paths: the whole user path, keyed by instruction offsets, loop frames by module.

A swapped pair of collectives with equal shapes is caught only by the call path, so
every way a path could lose information is a silent wrong result: a depth limit, a
user package whose directory is named like an event loop, two calls on one line.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import sys
import textwrap
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest

import asyncreplica as ar
from asyncreplica._runtime import _inspect


def _here() -> int:
    """The line of the caller."""
    return inspect.currentframe().f_back.f_lineno  # type: ignore[union-attr]


def _paths_of_two_calls_on_one_line() -> tuple[tuple[Any, ...], tuple[Any, ...], int]:
    line = _here() + 1
    first, second = _inspect.call_path(), _inspect.call_path()
    return first, second, line


def test_two_calls_on_one_line_have_different_paths_with_their_columns() -> None:
    first, second, line = _paths_of_two_calls_on_one_line()
    assert first != second
    assert first[0].lineno == second[0].lineno == line
    assert first[0].function == "_paths_of_two_calls_on_one_line"
    source = inspect.getsource(_paths_of_two_calls_on_one_line).splitlines()[2]
    # Columns are 1-based, counted from the start of the line (the source is indented
    # by the function body's four spaces).
    assert first[0].column == source.index("_inspect.call_path()") + 1
    assert second[0].column == source.rindex("_inspect.call_path()") + 1


def _paths_in_a_loop() -> list[tuple[Any, ...]]:
    return [_inspect.call_path() for _ in range(3)]


def test_one_call_site_always_gives_the_same_interned_path() -> None:
    a, b, c = _paths_in_a_loop()
    assert a is b is c


def _fail(strategy: ar.MirroredStrategy, step: Callable[[], Awaitable[Any]]) -> str:
    with pytest.raises(ar.CollectiveMismatchError) as info:
        asyncio.run(strategy.run(step))
    return str(info.value)


def test_a_mismatch_names_the_lines_of_both_call_sites() -> None:
    strategy = ar.MirroredStrategy(["CPU:0", "CPU:1"])
    lines: dict[int, int] = {}

    async def step() -> None:
        ctx = ar.get_replica_context()
        assert ctx is not None
        rid = ctx.replica_id_in_sync_group
        x = np.ones(2, np.float32)
        if rid == 0:
            lines[0] = _here() + 1
            await ctx.all_reduce("sum", x)
        else:
            lines[1] = _here() + 1
            await ctx.all_reduce("sum", x)

    text = _fail(strategy, step)
    assert f"test_call_path.py:{lines[0]}" in text
    assert f"test_call_path.py:{lines[1]}" in text
    assert f"test_call_path.py:{lines[0]}:" not in text  # no column where lines differ


# -- depth: no depth at which a swapped pair of calls pairs silently ---------------------


async def _through(depth: int, x: np.ndarray) -> Any:
    """Issue an all_reduce ``depth`` helper frames below the caller."""
    if depth == 0:
        ctx = ar.get_replica_context()
        assert ctx is not None
        return await ctx.all_reduce("sum", x)
    return await _through(depth - 1, x)


@pytest.mark.parametrize("depth", [1, 6, 7, 8, 9, 40])
def test_a_swap_through_deep_helpers_is_caught(depth: int) -> None:
    strategy = ar.MirroredStrategy(["CPU:0", "CPU:1"])
    lines: list[int] = []

    async def step() -> None:
        ctx = ar.get_replica_context()
        assert ctx is not None
        a, b = np.full(3, 1.0), np.full(3, 2.0)
        if ctx.replica_id_in_sync_group == 0:
            lines.append(_here() + 1)
            await _through(depth, a)
            await _through(depth, b)
        else:
            lines.append(_here() + 1)
            await _through(depth, b)
            await _through(depth, a)

    text = _fail(strategy, step)
    assert "call site differs" in text
    # The frames that differ are shown, however deep they are.
    assert f"test_call_path.py:{lines[0]}" in text
    assert f"test_call_path.py:{lines[1]}" in text
    if depth >= 8:
        assert "frames in common" in text


def test_a_deep_path_compares_whole_but_costs_one_lookup_once_seen() -> None:
    strategy = ar.MirroredStrategy(["CPU:0", "CPU:1"])
    out: list[Any] = []

    async def step() -> None:
        for _ in range(3):
            out.append(await _through(60, np.ones(2)))

    asyncio.run(strategy.run(step))
    assert all((r == 2.0).all() for r in out)


# -- event loops' own frames are skipped by module identity, never by a path ------------

_USER_PACKAGE = '''
"""User code in a package whose directory is named like an event loop."""

import asyncreplica as ar


async def first(x):
    return await ar.get_replica_context().all_reduce("sum", x)  # marker: first


async def second(x):
    return await ar.get_replica_context().all_reduce("sum", x)  # marker: second


async def step(a, b):
    rid = ar.get_replica_context().replica_id_in_sync_group
    if rid == 0:
        return await first(a), await second(b)
    else:
        return await second(b), await first(a)
'''


@pytest.mark.parametrize("loop_name", ["asyncio", "trio", "anyio", "uvloop", "sniffio"])
def test_a_user_package_named_like_an_event_loop_keeps_its_call_site_checks(
    loop_name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = f"myapp_{loop_name}"
    folder = tmp_path / app / loop_name
    folder.mkdir(parents=True)
    (tmp_path / app / "__init__.py").write_text("")
    (folder / "__init__.py").write_text("")
    (folder / "step.py").write_text(textwrap.dedent(_USER_PACKAGE))
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module(f"{app}.{loop_name}.step")
    try:
        strategy = ar.MirroredStrategy(["CPU:0", "CPU:1"])
        a, b = np.full(2, 1.0), np.full(2, 2.0)
        with pytest.raises(ar.CollectiveMismatchError) as info:
            asyncio.run(strategy.run(module.step, args=(a, b)))
    finally:
        for name in [n for n in sys.modules if n.startswith(app)]:
            del sys.modules[name]
    text = str(info.value)
    lines = (folder / "step.py").read_text().splitlines()
    first = next(i for i, t in enumerate(lines, 1) if t.endswith("# marker: first"))
    second = next(i for i, t in enumerate(lines, 1) if t.endswith("# marker: second"))
    assert f"{loop_name}/step.py:{first}" in text
    assert f"{loop_name}/step.py:{second}" in text


def test_code_that_only_calls_itself_asyncio_is_user_code(tmp_path: Path) -> None:
    # Globals named like an asyncio module, but not the module of that name: user code.
    source = (
        "async def helper(x):\n"
        "    collective = ctx.all_reduce('sum', x)\n"
        "    seen.append(collective.signature.call_path)\n"
        "    return await collective\n"
    )
    code = compile(source, str(tmp_path / "asyncio" / "fake.py"), "exec")
    seen: list[tuple[Any, ...]] = []

    async def step() -> Any:
        ctx = ar.get_replica_context()
        assert ctx is not None
        scope: dict[str, Any] = {"__name__": "asyncio.fake", "ctx": ctx, "seen": seen}
        exec(code, scope)
        return await scope["helper"](np.ones(1))

    asyncio.run(ar.MirroredStrategy(["CPU:0"]).run(step))
    assert [site.function for site in seen[0]] == ["helper", "step"]


@pytest.mark.anyio
async def test_the_loops_own_frames_are_left_out(anyio_backend: object) -> None:
    # start_soon calls the collective method from the task group's own code.
    strategy = ar.MirroredStrategy(["CPU:0", "CPU:1"])
    seen: list[tuple[Any, ...]] = []

    async def step() -> None:
        ctx = ar.get_replica_context()
        assert ctx is not None

        async def issue() -> None:
            collective = ctx.all_reduce("sum", np.ones(1))
            seen.append(collective.signature.call_path)  # type: ignore[attr-defined]
            await collective

        async with anyio.create_task_group() as tg:
            started.append(_here() + 1)
            tg.start_soon(issue)

    started: list[int] = []
    await strategy.run(step)
    assert len(seen) == 2
    assert seen[0] == seen[1]
    # The helper task's own frames end where the loop resumes it; the path goes on at
    # the line that started the task. No loop frame, nothing of the test runner.
    assert [site.function for site in seen[0]] == ["issue", "step"]
    assert seen[0][1].lineno == started[0]


def test_a_swap_on_one_line_is_caught_and_shown_with_columns() -> None:
    strategy = ar.MirroredStrategy(["CPU:0", "CPU:1"])
    found: list[int] = []

    async def step() -> Any:
        ctx = ar.get_replica_context()
        assert ctx is not None
        x, y = np.full(2, 1.0), np.full(2, 2.0)
        f = ctx.all_reduce
        swap = ctx.replica_id_in_sync_group == 1
        found.append(_here() + 1)  # the swap below stays on one line (fmt: skip)
        return (await f("sum", x), await f("sum", y)) if not swap else (await f("sum", y), await f("sum", x))  # fmt: skip

    text = _fail(strategy, step)
    line = found[0]
    source = inspect.getsource(step).splitlines()[-1]
    # The column of each call (the innermost frame is at the call, not at its await).
    columns = [i + 1 for i in range(len(source)) if source.startswith('f("sum"', i)]
    assert len(columns) == 4
    assert "call site differs" in text
    assert f"test_call_path.py:{line}:{columns[0]}" in text
    assert f"test_call_path.py:{line}:{columns[2]}" in text


def test_two_collectives_on_one_line_in_the_same_order_agree() -> None:
    strategy = ar.MirroredStrategy(["CPU:0", "CPU:1"])

    async def step() -> Any:
        ctx = ar.get_replica_context()
        assert ctx is not None
        x, y = np.full(2, 1.0), np.full(2, 2.0)
        a, b = await ctx.all_reduce("sum", x), await ctx.all_reduce("sum", y)
        return float(a[0]), float(b[0])

    result = asyncio.run(strategy.run(step))
    assert strategy.experimental_local_results(result) == ((2.0, 4.0), (2.0, 4.0))


def test_the_path_caches_stay_bounded_by_frames(monkeypatch: pytest.MonkeyPatch) -> None:
    # Deep recursions at many depths: the caches are cleared, the paths stay right.
    monkeypatch.setattr(_inspect, "_MAX_FRAMES", 200)
    strategy = ar.MirroredStrategy(["CPU:0", "CPU:1"])
    sizes: list[int] = []

    async def step() -> None:
        for depth in range(0, 60, 3):
            assert float((await _through(depth, np.ones(1)))[0]) == 2.0
            sizes.append(sum(len(p) for p in _inspect._paths_at.values()))

    asyncio.run(strategy.run(step))
    assert max(sizes) <= 200 + 62
