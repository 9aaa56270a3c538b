"""Misleading endings found by the fourth round's attack (attack23b: C13, C10).

Each test told the wrong story (a replica blamed, a previous run's story, no note) before
its fix.
"""

from __future__ import annotations

import asyncio
from typing import Any

import anyio
import pytest
from asyncreplica_numpy import NumpyBackend

import asyncreplica as ar

pytestmark = pytest.mark.anyio

DEVICES = ["CPU:0", "CPU:1", "CPU:2"]
SLOW = ar.CommunicationOptions(timeout_seconds=60)  # a timeout: the slow path
OPTIONS = [pytest.param(None, id="fast"), pytest.param(SLOW, id="slow")]


def strategy(n: int = 3, **kwargs: Any) -> ar.MirroredStrategy:
    return ar.MirroredStrategy(DEVICES[:n], **kwargs)


def _ctx() -> ar.ReplicaContext:
    ctx = ar.get_replica_context()
    assert ctx is not None
    return ctx


# -- C13: the backend's combine ends with GeneratorExit or a CancelledError ------------------


@pytest.mark.parametrize("options", OPTIONS)
@pytest.mark.parametrize("kind", [GeneratorExit, asyncio.CancelledError])
@pytest.mark.parametrize("caught", [True, False], ids=["caught", "raised"])
async def test_a_backend_ending_like_a_cancellation_is_told_as_the_backends(
    options: ar.CommunicationOptions | None, kind: type[BaseException], caught: bool
) -> None:
    # Before: "Replica 2 was cancelled while the backend combined its 1st collective":
    # nothing cancelled any replica, the backend (or a library it calls) raised.
    class Ending(NumpyBackend):
        async def all_reduce(self, op: Any, values: Any, *, bytes_per_pack: int = 0) -> Any:
            raise kind("from the backend")

    async def step() -> object:
        try:
            return await _ctx().all_reduce("SUM", 1.0, options=options)
        except ar.BackendError as exc:
            if not caught:
                raise
            return type(exc.__cause__).__name__

    s = strategy(backend=Ending(DEVICES))
    with anyio.fail_after(10):
        if caught:
            assert set(s.experimental_local_results(await s.run(step))) == {kind.__name__}
            return
        with pytest.raises(ar.BackendError) as info:
            await s.run(step)
    message = str(info.value)
    assert message.startswith(
        f"The backend's combine ended with {kind.__name__}('from the backend') though nothing "
        "cancelled it, in the 'numpy' backend's all_reduce (Ending.all_reduce)"
    ), message
    assert "was cancelled" not in message
    assert isinstance(info.value.__cause__, kind)
    assert not any("raised in replica" in n for n in getattr(info.value, "__notes__", []))
