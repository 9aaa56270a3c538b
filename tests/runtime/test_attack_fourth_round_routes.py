"""Routes to a collective found by the fourth attack (issue 23, attack23b): each failed before its fix.

C6: a replica's helper started in a fresh or default context by a route the run does not
see (``Context().run(asyncio.ensure_future, ...)``, ``loop.call_soon(..., context=
Context())``, ``run_coroutine_threadsafe`` from an executor, ``Context().run(tg.start_soon,
...)``, trio's ``token.run_sync_soon`` from a thread) found the default replica context,
whose ``all_reduce`` is the identity: ``(1.0, 2.0)`` instead of ``(3.0, 3.0)``.
C3 (pinned; fixed on main by h-l23): a shielded replica waiting through asyncio.gather,
shield, wait or wait_for while its peer fails.
"""

from __future__ import annotations

import asyncio
import contextvars
from typing import Any

import anyio
import pytest

import asyncreplica as ar

pytestmark = pytest.mark.anyio

DEVICES = ["CPU:0", "CPU:1"]
DEFAULT = (
    r"all_reduce was called on the default replica context .* while MirroredStrategy\.run of 2"
)


def _ctx() -> ar.ReplicaContext:
    ctx = ar.get_replica_context()
    assert ctx is not None
    return ctx


def _is_trio(anyio_backend: object) -> bool:
    return anyio_backend == "trio" or (
        isinstance(anyio_backend, tuple) and anyio_backend[0] == "trio"
    )


async def _helper(v: float) -> Any:
    return await _ctx().all_reduce("SUM", v)


def _value() -> float:
    return float(_ctx().replica_id_in_sync_group + 1)


async def _ctx_run_ensure_future() -> Any:
    return await contextvars.Context().run(asyncio.ensure_future, _helper(_value()))


async def _call_soon_fresh() -> Any:
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[Any] = loop.create_future()
    v = _value()
    loop.call_soon(
        lambda: fut.set_result(asyncio.ensure_future(_helper(v))), context=contextvars.Context()
    )
    return await (await fut)


async def _executor_threadsafe() -> Any:
    loop = asyncio.get_running_loop()
    v = _value()
    cf = await loop.run_in_executor(
        None, lambda: asyncio.run_coroutine_threadsafe(_helper(v), loop)
    )
    return await asyncio.wrap_future(cf)


ASYNCIO_ROUTES = {
    "ctx_run_ensure_future": _ctx_run_ensure_future,
    "call_soon_fresh": _call_soon_fresh,
    "executor_threadsafe": _executor_threadsafe,
}


@pytest.mark.parametrize("route", list(ASYNCIO_ROUTES))
async def test_a_helper_in_a_fresh_context_by_another_route_is_refused_once(
    route: str, anyio_backend: object
) -> None:
    if _is_trio(anyio_backend):
        pytest.skip("asyncio routes")
    s = ar.MirroredStrategy(DEVICES)
    with pytest.raises(ar.ReplicaContextError, match=DEFAULT) as info:
        await s.run(ASYNCIO_ROUTES[route])
    assert "test_attack_fourth_round_routes.py" in str(info.value)  # the helper's line


async def test_a_task_group_start_soon_in_a_fresh_context_is_refused() -> None:
    async def step() -> Any:
        out: list[Any] = []
        v = _value()

        async def h() -> None:
            out.append(await _helper(v))

        async with anyio.create_task_group() as tg:
            contextvars.Context().run(tg.start_soon, h)
        return out[0]

    with pytest.raises(BaseException) as info:  # noqa: PT011 (each replica's task group)
        await ar.MirroredStrategy(DEVICES).run(step)
    error: BaseException = info.value
    while isinstance(error, BaseExceptionGroup):
        error = error.exceptions[0]
    assert isinstance(error, ar.ReplicaContextError)
    assert "default replica context" in str(error)


async def test_a_trio_system_task_spawned_from_a_thread_fails_the_run(
    anyio_backend: object,
) -> None:
    if not _is_trio(anyio_backend):
        pytest.skip("trio only")
    import trio

    async def step() -> Any:
        token = trio.lowlevel.current_trio_token()
        done = trio.Event()
        box: list[Any] = []
        v = _value()

        def in_thread() -> None:
            def spawn() -> None:
                async def h() -> None:
                    box.append(await _helper(v))
                    done.set()

                trio.lowlevel.spawn_system_task(h)

            token.run_sync_soon(spawn)

        await trio.to_thread.run_sync(in_thread)
        await done.wait()
        return box[0]

    with pytest.raises(ar.ReplicaContextError, match=DEFAULT):  # not TrioInternalError
        await ar.MirroredStrategy(DEVICES).run(step)


async def test_the_default_context_still_works_outside_a_run() -> None:
    ctx = ar.get_replica_context()
    assert ctx is not None
    assert await ctx.all_reduce("SUM", 2.0) == 2.0


@pytest.mark.parametrize("limit", [None, 30.0])
@pytest.mark.parametrize("how", ["gather", "shield_task", "wait", "wait_for"])
async def test_a_shielded_replica_waiting_indirectly_gets_its_peers_error(
    how: str, limit: float | None, anyio_backend: object
) -> None:
    if _is_trio(anyio_backend):
        pytest.skip("asyncio's gather, shield, wait, wait_for")

    async def step() -> Any:
        c = _ctx()
        if c.replica_id_in_sync_group == 0:
            with anyio.CancelScope(shield=True):
                if how == "gather":
                    return await asyncio.gather(
                        c.all_reduce("SUM", 1.0, name="a"), c.all_reduce("SUM", 2.0, name="b")
                    )
                if how == "wait_for":
                    return await asyncio.wait_for(c.all_reduce("SUM", 1.0), timeout=100)
                t = asyncio.ensure_future(c.all_reduce("SUM", 1.0))
                if how == "shield_task":
                    return await asyncio.shield(t)
                await asyncio.wait([t])
                return t.result()
        await anyio.lowlevel.checkpoint()
        raise ValueError("peer failed")

    options = ar.CommunicationOptions(timeout_seconds=limit)  # no false "2 replicas failed"
    s = ar.MirroredStrategy(DEVICES, communication_options=options)
    with anyio.fail_after(30):  # a hang guard only
        with pytest.raises(ValueError, match="peer failed"):
            await s.run(step)


# -- C8: a collective's __await__() iterator driven by another replica's task ---------------


async def test_a_peer_driving_a_replicas_await_iterator_is_refused_by_name(
    anyio_backend: object,
) -> None:
    if not _is_trio(anyio_backend):
        pytest.skip("trio: the iterator is the collective's coroutine (asyncio: a future's)")
    box: dict[str, Any] = {}
    stored = anyio.Event()

    async def step() -> Any:
        c = _ctx()
        r = c.replica_id_in_sync_group
        coll = c.all_reduce("SUM", float(r + 1))  # one call site for every replica
        if r == 0:
            box["it"] = coll.__await__()
            stored.set()
            await anyio.sleep_forever()  # ended by the run's failure
        await stored.wait()
        next(box["it"])  # replica 1's task drives replica 0's collective
        return await coll

    with pytest.raises(
        ar.ReplicaContextError,
        match=r"Replica 1 drove the __await__\(\) iterator of a collective that replica 0 issued",
    ):
        await ar.MirroredStrategy(DEVICES).run(step)
