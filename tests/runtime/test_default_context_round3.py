"""The default replica context, round 3 (attack 23i, findings 4 and 6).

* Finding 4: the default context's per-loop state was keyed by ``id(loop)`` (trio's:
  ``id(root task)``). A new loop allocated at a closed loop's address inherited a
  collective issued there and never awaited: a correct ``await`` was refused (a name
  "in flight", an unnamed one "issued earlier"). The tests force the colliding key
  (``_default``'s ``id`` made constant), so they do not rely on address reuse luck.
* Finding 6: the default context's collectives returned the caller's original object (an
  ``__array__``-only object, a ``bytearray``, a ``memoryview``), which it had converted
  once when the collective was issued; reading the result converted it again (another
  value). A one-replica ``MirroredStrategy`` returns the converted, read-only array.
  The differential test compares the two over value kinds and every collective kind.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import asyncreplica as ar
from asyncreplica._runtime import _default

# -- finding 4: a new loop never inherits an old one's collectives --------------------


async def _issue_and_keep(kept: list[Any], name: str | None) -> None:
    kept.append(ar.get_replica_context().all_reduce("sum", np.ones(2), name=name))


async def _await_one(name: str | None) -> Any:
    return await ar.get_replica_context().all_reduce("sum", np.ones(2), name=name)


@pytest.mark.parametrize("name", ["grads", None], ids=["named", "unnamed"])
@pytest.mark.parametrize("old_loop", ["closed-and-kept", "collected"])
def test_a_new_asyncio_loop_with_the_old_loops_key_starts_afresh(
    monkeypatch: pytest.MonkeyPatch, name: str | None, old_loop: str
) -> None:
    # Every object has one id in _default: the new loop "reuses" the old loop's address.
    monkeypatch.setattr(_default, "id", lambda _: 1, raising=False)
    kept: list[Any] = []
    loop1 = asyncio.new_event_loop()
    loop1.run_until_complete(_issue_and_keep(kept, name))  # issued, never awaited
    loop1.close()
    if old_loop == "collected":
        del loop1
        gc.collect()
    loop2 = asyncio.new_event_loop()
    try:
        result = loop2.run_until_complete(_await_one(name))
    finally:
        loop2.close()
        for call in kept:
            call.close()
    np.testing.assert_array_equal(result, [1.0, 1.0])


@pytest.mark.parametrize("name", ["grads", None], ids=["named", "unnamed"])
def test_a_new_trio_run_with_the_old_runs_key_starts_afresh(
    monkeypatch: pytest.MonkeyPatch, name: str | None
) -> None:
    trio = pytest.importorskip("trio")
    monkeypatch.setattr(_default, "id", lambda _: 1, raising=False)
    kept: list[Any] = []
    trio.run(_issue_and_keep, kept, name)
    try:
        result = trio.run(_await_one, name)
    finally:
        for call in kept:
            call.close()
    np.testing.assert_array_equal(result, [1.0, 1.0])


def test_the_loop_is_known_by_the_object_held_weakly() -> None:
    async def main() -> object:
        return _default.loop_here()

    loop = asyncio.new_event_loop()
    try:
        assert loop.run_until_complete(main()) is loop
    finally:
        loop.close()
    assert _default.loop_here() is None
    # A loop held weakly while it lives; one that refuses weak references, strongly.
    held = _default._held_loop(loop)
    assert held() is loop
    del loop
    gc.collect()
    assert held() is None

    class Slotted:
        __slots__ = ()

    slotted = Slotted()
    assert _default._held_loop(slotted)() is slotted


def test_the_same_loop_keeps_its_collectives_in_flight() -> None:
    # Keying by the object does not forget the live loop's own state.
    async def main() -> None:
        ctx = ar.get_replica_context()
        first = ctx.all_reduce("sum", np.ones(2), name="grads")
        with pytest.raises(ar.CollectiveError, match="'grads'"):
            ctx.all_reduce("sum", np.ones(2), name="grads")
        await first

    asyncio.run(main())


# -- finding 6: a default collective returns what one replica's returns ---------------


class _ArrayOnly:
    """An ``__array__``-only object whose second conversion gives another value."""

    def __init__(self) -> None:
        self.reads = 0

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        self.reads += 1
        return np.full(2 if self.reads == 1 else 3, float(self.reads))


VALUES: dict[str, Callable[[], Any]] = {
    "__array__": _ArrayOnly,
    "bytearray": lambda: bytearray(b"\x01\x02"),
    "memoryview": lambda: memoryview(bytearray(b"\x01\x02")),
    "nested": lambda: {"a": _ArrayOnly(), "b": (bytearray(b"\x03\x04"),)},
    "batch": lambda: [memoryview(bytearray(b"\x05\x06")), _ArrayOnly()],
}

CALLS: dict[str, Callable[[Any, Any], Any]] = {
    "all_reduce": lambda ctx, x: ctx.all_reduce("sum", x),
    "all_gather": lambda ctx, x: ctx.all_gather(x, axis=0),
    "broadcast": lambda ctx, x: ctx.broadcast(x),
    "reduce_scatter": lambda ctx, x: ctx.reduce_scatter("sum", x, axis=0),
    "merge_call": lambda ctx, x: ctx.merge_call(lambda _, v: v, args=(x,)),
}


def _shape_of(result: Any) -> Any:
    """What a caller sees of a result: containers, and each leaf's type, value and flags."""
    if isinstance(result, dict):
        return {key: _shape_of(value) for key, value in result.items()}
    if isinstance(result, list | tuple):
        return type(result)(_shape_of(value) for value in result)
    if isinstance(result, np.ndarray):
        return ("ndarray", str(result.dtype), result.shape, result.tolist(), result.flags.writeable)
    return type(result).__name__


async def _step(kind: str, call: str) -> Any:
    return await CALLS[call](ar.get_replica_context(), VALUES[kind]())


@pytest.mark.parametrize("call", list(CALLS))
@pytest.mark.parametrize("kind", list(VALUES))
def test_a_default_collective_returns_what_one_replica_returns(kind: str, call: str) -> None:
    default = asyncio.run(_step(kind, call))
    one = ar.MirroredStrategy(["CPU:0"])
    (mirrored,) = one.experimental_local_results(asyncio.run(one.run(_step, args=(kind, call))))
    assert _shape_of(default) == _shape_of(mirrored)


@pytest.mark.parametrize("call", [c for c in CALLS if c != "merge_call"])
def test_the_result_is_not_the_callers_buffer(call: str) -> None:
    # A bytearray's "result" was the user's own writable buffer: it changed afterwards.
    async def main() -> tuple[Any, bytearray]:
        buffer = bytearray(b"\x01\x02")
        return await CALLS[call](ar.get_replica_context(), buffer), buffer

    result, buffer = asyncio.run(main())
    buffer[0] = 9
    assert result.tolist() == [1, 2]
    with pytest.raises(ValueError, match="read-only"):
        result[0] = 7


def test_values_held_as_they_are_still_come_back_themselves() -> None:
    # The identity (TensorFlow's default context) for what the backend does not convert.
    async def main() -> None:
        ctx = ar.get_replica_context()
        value = {"w": np.ones(2), "n": 3}
        assert await ctx.all_reduce("mean", value) is value
        array = np.arange(4)
        assert await ctx.all_gather(array, 0) is array
        assert await ctx.broadcast(array) is array
        assert await ctx.reduce_scatter("sum", array) is array

    asyncio.run(main())
