"""A user's exception whose ``__getattr__`` raises stays the user's error (attack 24f, 6).

asyncreplica marks errors it copies or makes with private attributes and read them back
with ``getattr(error, name, None)``, which only absorbs ``AttributeError``: a dict-backed
``__getattr__`` (``KeyError``) or one that raises ``RuntimeError`` replaced the user's
error with ``KeyError: '_ar_twin_of'``, in one process and, told to peers, across them.
"""

from __future__ import annotations

from typing import Any

import pytest

import asyncreplica as ar

pytestmark = pytest.mark.anyio


class DictBacked(ValueError):
    """Fields in a dict; a missing one is a KeyError, as the dict says."""

    def __init__(self, message: str, **info: object) -> None:
        super().__init__(message)
        self.__dict__["info"] = info

    def __getattr__(self, name: str) -> object:
        return self.__dict__["info"][name]


class Refusing(ValueError):
    def __getattr__(self, name: str) -> object:
        raise RuntimeError(f"get {name} refused")


@pytest.mark.parametrize("kind", [DictBacked, Refusing])
@pytest.mark.parametrize("where", ["step", "merge_fn", "after a collective"])
async def test_the_users_error_is_raised_as_itself(kind: type[ValueError], where: str) -> None:
    s = ar.MirroredStrategy(["CPU:0", "CPU:1", "CPU:2"])

    def merge_fn(strategy: ar.Strategy) -> None:
        raise kind("boom")

    async def step() -> Any:
        ctx = ar.get_replica_context()
        assert ctx is not None
        if where == "merge_fn":
            return await ctx.merge_call(merge_fn)
        if where == "after a collective":
            await ctx.all_reduce("sum", 1.0)
        if ctx.replica_id_in_sync_group == 2:
            raise kind("boom")
        return await ctx.all_reduce("sum", 1.0)

    with pytest.raises(BaseException) as caught:  # noqa: PT011 -- the class is the test
        await s.run(step)
    error = caught.value
    leaves = list(error.exceptions) if isinstance(error, BaseExceptionGroup) else [error]
    assert all(type(e) is kind for e in leaves), leaves
    # The strategy runs again, in step.
    again = await s.run(lambda: ar.get_replica_context().all_reduce("sum", 1.0))  # type: ignore[union-attr]
    assert [float(v) for v in s.experimental_local_results(again)] == [3.0, 3.0, 3.0]
