"""The call-path caches stay bounded when code is generated per step (exec, compile).

Each generated function is a new code object. The caches of :mod:`._inspect` hold every
code object they classify (so that its id stays its own), so without a bound a program
that compiles its step anew per run grows by kilobytes per run, for ever.
"""

from __future__ import annotations

import asyncio
import gc
import tracemalloc
from typing import Any

import numpy as np
import pytest

import asyncreplica as ar
from asyncreplica._runtime import _inspect

_SOURCE = """
async def step_{i}():
    ctx = ar.get_replica_context()
    a = await ctx.all_reduce("SUM", np.ones(1))
    b = await ctx.all_reduce("SUM", np.ones(1) * 2)
    return float(a[0]), float(b[0])
"""


def _generated(i: int) -> Any:
    namespace: dict[str, Any] = {"ar": ar, "np": np}
    exec(compile(_SOURCE.format(i=i), f"<generated {i}>", "exec"), namespace)
    return namespace[f"step_{i}"]


def _run_generated(strategy: ar.MirroredStrategy, first: int, count: int) -> None:
    async def main() -> None:
        for i in range(first, first + count):
            result = await strategy.run(_generated(i))
            assert strategy.experimental_local_results(result) == ((2.0, 4.0), (2.0, 4.0))

    asyncio.run(main())


def test_code_generated_per_step_keeps_the_code_cache_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_inspect, "_MAX_CODES", 64)
    strategy = ar.MirroredStrategy(["CPU:0", "CPU:1"])
    sizes: list[int] = []

    async def main() -> None:
        for i in range(300):
            result = await strategy.run(_generated(i))
            assert strategy.experimental_local_results(result) == ((2.0, 4.0), (2.0, 4.0))
            sizes.append(len(_inspect._codes))

    asyncio.run(main())
    assert max(sizes) <= 64
    assert len(_inspect._kinds) <= 64
    assert len(_inspect._sites) <= 64 * 4


def test_memory_does_not_grow_with_generated_code(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_inspect, "_MAX_CODES", 128)
    strategy = ar.MirroredStrategy(["CPU:0", "CPU:1"])
    _run_generated(strategy, 0, 300)  # past the bound: the caches are at their steady size
    gc.collect()
    grown: list[int] = []
    tracemalloc.start()
    try:
        # Two windows: tracemalloc counts every allocation of the process, and something
        # left by earlier tests once added 4 MB to one window (a clean-clone run of the
        # whole suite; never reproduced alone). Unbounded caches grow in every window.
        for first in (300, 900):
            before = tracemalloc.get_traced_memory()[0]
            _run_generated(strategy, first, 600)
            gc.collect()
            grown.append(tracemalloc.get_traced_memory()[0] - before)
    finally:
        tracemalloc.stop()
    # Unbounded, each run's code object and what the caches keep of it cost about
    # 2.9 KB (1.7 MB for 600 runs); bounded, the caches hold at most 128 of them
    # (and the signatures interned for their paths) whatever the number of runs.
    assert min(grown) < 300_000, grown


def test_paths_stay_right_across_a_clear(monkeypatch: pytest.MonkeyPatch) -> None:
    # A clear in the middle of a walk must keep the ids in the new key held.
    monkeypatch.setattr(_inspect, "_MAX_CODES", 3)
    strategy = ar.MirroredStrategy(["CPU:0", "CPU:1"])
    _run_generated(strategy, 0, 20)
    for key in _inspect._paths_at:
        for code_id in key[::2]:
            assert code_id in _inspect._codes


# -- code without Python frames ----------------------------------------------------------


def test_a_collective_whose_caller_has_no_python_frame_is_warned_about(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A module compiled with mypyc has no frames: here a C callable (functools.partial)
    # issues the collective, awaited by a coroutine of the runtime's own, as the replica
    # driver would call a compiled step function. Nothing identifies the call site.
    import functools
    import warnings

    from asyncreplica._runtime import _run

    _inspect._warned_unchecked[0] = False  # a list item: compiled code reads the same list
    exec("async def _test_driver(make):\n    return await make()\n", _run.__dict__)
    monkeypatch.setitem(_run.__dict__, "_test_driver", _run.__dict__["_test_driver"])
    # A replica's driver (as _run.Run._replica_main is): the walk stops there. Any other
    # runtime coroutine is passed through to the user's frames that called it.
    driver = _run.__dict__["_test_driver"].__code__
    _inspect.register_driver(driver)
    strategy = ar.MirroredStrategy(["CPU:0", "CPU:1"])
    paths: list[Any] = []

    async def step() -> Any:
        ctx = ar.get_replica_context()
        assert ctx is not None

        def issue() -> Any:
            collective = functools.partial(ctx.all_reduce, "SUM", np.ones(1))()
            paths.append(collective.signature.call_path)
            return collective

        # The frame of `issue` is the caller here: the partial has none of its own.
        await issue()
        return await _run.__dict__["_test_driver"](
            functools.partial(ctx.all_reduce, "SUM", np.ones(1))
        )

    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            asyncio.run(strategy.run(step))
    finally:
        _inspect._warned_unchecked[0] = True
        _inspect._DRIVERS.discard(id(driver))
    assert paths
    assert all(path is not _inspect.UNCHECKED for path in paths)
    messages = [str(w.message) for w in caught if issue_is_ours(w)]
    assert len(messages) == 1, messages
    assert "cannot be checked" in messages[0]
    assert "name=" in messages[0]


def issue_is_ours(warning: Any) -> bool:
    return issubclass(warning.category, RuntimeWarning) and "asyncreplica" in str(warning.message)


def test_an_unchecked_path_is_marked_on_the_signature() -> None:
    import functools
    import warnings

    from asyncreplica._runtime import _run

    exec("async def _test_driver2(make):\n    return make()\n", _run.__dict__)
    driver = _run.__dict__["_test_driver2"].__code__
    _inspect.register_driver(driver)  # a replica's driver: the walk stops there
    try:
        strategy = ar.MirroredStrategy(["CPU:0"])
        seen: list[Any] = []

        async def step() -> Any:
            ctx = ar.get_replica_context()
            assert ctx is not None
            collective = await _run.__dict__["_test_driver2"](
                functools.partial(ctx.all_reduce, "SUM", np.ones(1))
            )
            seen.append(collective.signature.call_path)
            return await collective

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            asyncio.run(strategy.run(step))
        assert seen == [_inspect.UNCHECKED]
        assert "code without Python frames" in str(seen[0][0])
    finally:
        del _run.__dict__["_test_driver2"]
        _inspect._DRIVERS.discard(id(driver))
