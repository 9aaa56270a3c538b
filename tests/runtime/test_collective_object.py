"""The object a collective call returns, compiled (a mypyc native class) or interpreted.

A native class has no class-body aliases and cannot inherit ``collections.abc.Coroutine``, so
each refusal is a method of its own and the class is registered as a coroutine: these tests
pin that it behaves as the interpreted class does, in both modes (CI runs both).
"""

from __future__ import annotations

import asyncio
import collections.abc
import inspect
import operator
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import asyncreplica as ar
from asyncreplica._runtime._collective import Collective

HANG_GUARD = 10.0
FORGOT = r"cannot be used as a value \((?P<use>[^)]*)\).*Did you forget `await`\?"

# Every use of a value that the collective refuses, and the use its message names.
USES: dict[str, tuple[Callable[[Any], object], str]] = {
    "bool": (bool, "truth value"),
    "float": (float, "float()"),
    "int": (int, "int()"),
    "complex": (complex, "complex()"),
    "iter": (iter, "iteration"),
    "len": (len, "len()"),
    "getitem": (lambda c: c[0], "indexing"),
    "np.asarray": (np.asarray, "array conversion"),
    "lt": (lambda c: c < 1, "arithmetic or comparison"),
    "le": (lambda c: c <= 1, "arithmetic or comparison"),
    "gt": (lambda c: c > 1, "arithmetic or comparison"),
    "ge": (lambda c: c >= 1, "arithmetic or comparison"),
    "add": (lambda c: c + 1, "arithmetic or comparison"),
    "radd": (lambda c: 1 + c, "arithmetic or comparison"),
    "sub": (lambda c: c - 1, "arithmetic or comparison"),
    "rsub": (lambda c: 1 - c, "arithmetic or comparison"),
    "mul": (lambda c: c * 2, "arithmetic or comparison"),
    "rmul": (lambda c: 2 * c, "arithmetic or comparison"),
    "truediv": (lambda c: c / 2, "arithmetic or comparison"),
    "rtruediv": (lambda c: 2 / c, "arithmetic or comparison"),
    "floordiv": (lambda c: c // 2, "arithmetic or comparison"),
    "rfloordiv": (lambda c: 2 // c, "arithmetic or comparison"),
    "pow": (lambda c: c**2, "arithmetic or comparison"),
    "rpow": (lambda c: 2**c, "arithmetic or comparison"),
    "matmul": (lambda c: c @ np.ones(2), "arithmetic or comparison"),
    "neg": (operator.neg, "arithmetic or comparison"),
    "pos": (operator.pos, "arithmetic or comparison"),
    "abs": (abs, "arithmetic or comparison"),
}


def _run_two(step: Callable[[ar.ReplicaContext], Any]) -> list[Any]:
    strategy = ar.MirroredStrategy(["CPU:0", "CPU:1"])

    async def replica() -> Any:
        ctx = ar.get_replica_context()
        assert ctx is not None
        return await step(ctx)

    async def main() -> list[Any]:
        return list((await asyncio.wait_for(strategy.run(replica), HANG_GUARD)).values)

    return asyncio.run(main())


@pytest.mark.parametrize("use", list(USES))
def test_every_use_as_a_value_is_refused_with_the_forgotten_await_message(use: str) -> None:
    convert, named = USES[use]
    messages: list[str] = []

    async def step(ctx: ar.ReplicaContext) -> Any:
        pending = ctx.all_reduce("sum", np.ones(2))
        with pytest.raises(TypeError, match=FORGOT) as info:
            convert(pending)
        messages.append(str(info.value))
        return await pending  # refusing a use leaves the collective intact

    results = _run_two(step)
    np.testing.assert_array_equal(results, [[2.0, 2.0], [2.0, 2.0]])
    assert len(messages) == 2
    assert all(f"({named})" in m and "all_reduce(SUM) on float64[2]" in m for m in messages)


def test_it_is_a_hashable_coroutine_to_asyncio_and_inspect() -> None:
    seen: list[tuple[bool, ...]] = []

    async def step(ctx: ar.ReplicaContext) -> Any:
        pending = ctx.all_reduce("sum", np.ones(1))
        assert isinstance(pending, Collective)
        seen.append(
            (
                isinstance(pending, collections.abc.Coroutine),
                isinstance(pending, collections.abc.Awaitable),
                inspect.isawaitable(pending),
                asyncio.iscoroutine(pending),
                hash(pending) == hash(pending) and {pending: 1}[pending] == 1,
            )
        )
        # asyncio.gather hashes its awaitables and wraps coroutines in tasks.
        (result,) = await asyncio.gather(pending)
        return result

    results = _run_two(step)
    np.testing.assert_array_equal(results, [[2.0], [2.0]])
    assert seen == [(True,) * 5] * 2


def test_an_awaited_collective_cannot_run_again() -> None:
    errors: list[str] = []

    async def step(ctx: ar.ReplicaContext) -> Any:
        pending = ctx.all_reduce("sum", np.ones(1))
        result = await pending
        for again in (lambda: pending.send(None), lambda: pending.throw(ValueError("x"))):
            with pytest.raises(ar.CollectiveError, match="again, after it completed") as e:
                again()
            errors.append(str(e.value))
        with pytest.raises(ar.CollectiveError, match="again, after it completed"):
            await pending
        pending.close()  # closing a spent collective is allowed, as for a coroutine
        return result

    _run_two(step)
    assert len(errors) == 4


def test_index_is_refused() -> None:
    # operator.index (range(), slicing, hex()) refuses the collective too; a compiled class
    # refuses it with Python's own TypeError (mypyc does not fill the nb_index slot).
    async def step(ctx: ar.ReplicaContext) -> Any:
        pending = ctx.all_reduce("sum", np.ones(1))
        with pytest.raises(TypeError):
            operator.index(pending)
        return await pending

    _run_two(step)
