"""Silent results found by the third attack (issue 23): each test failed before its fix.

B11 (listed as B12 in the brief): a step written as a generator function ran nothing.
B9: IndexedSlices indices that do not fit the common index dtype, or outside dense_shape.
B1: a backend's results that do not match the collective's signature.
B0c: a replica's helper task started in a fresh contextvars.Context().
B7: a collective driven by hand and abandoned after it was issued.
"""

from __future__ import annotations

import asyncio
import contextvars
import re
from typing import Any

import anyio
import anyio.lowlevel
import numpy as np
import pytest
from asyncreplica_numpy import NumpyBackend

import asyncreplica as ar

pytestmark = pytest.mark.anyio

DEVICES = ["CPU:0", "CPU:1", "CPU:2"]


def strategy(n: int = 2, **kwargs: Any) -> ar.MirroredStrategy:
    return ar.MirroredStrategy(DEVICES[:n], **kwargs)


def _ctx() -> ar.ReplicaContext:
    ctx = ar.get_replica_context()
    assert ctx is not None
    return ctx


# -- B11: a generator function as the step -------------------------------------------------


async def test_an_async_generator_step_is_refused() -> None:
    async def step() -> Any:
        yield await _ctx().all_reduce("SUM", 1.0)

    with pytest.raises(TypeError, match=r"(?s)step is an async generator function.*`return`"):
        await strategy().run(step)


async def test_a_generator_step_is_refused() -> None:
    def step() -> Any:
        yield 1.0

    with pytest.raises(TypeError, match=r"(?s)step is a generator function.*`return`"):
        await strategy().run(step)


# -- B9: IndexedSlices indices are row numbers of the dense value -------------------------


def _slices(indices: Any) -> ar.IndexedSlices:
    return ar.IndexedSlices(np.ones((1, 2)), indices, (3, 2))


@pytest.mark.parametrize(
    ("first", "second", "bad"),
    [
        (np.array([2**63 + 1], np.uint64), np.array([0], np.int32), "9223372036854775809"),
        (np.array([7]), np.array([0]), "7"),
        (np.array([-1]), np.array([0]), "-1"),
    ],
    ids=["uint64-above-int64", "out-of-range", "negative"],
)
async def test_indexed_slices_indices_outside_the_dense_rows_are_refused(
    first: Any, second: Any, bad: str
) -> None:
    async def step() -> Any:
        ctx = _ctx()
        mine = first if ctx.replica_id_in_sync_group == 0 else second
        return await ctx.all_reduce("SUM", _slices(mine))

    with pytest.raises(ValueError, match=rf"0 <= i < 3 \(dense_shape \(3, 2\)\), got {bad}:"):
        await strategy().run(step)


async def test_indexed_slices_with_the_last_row_and_no_rows_still_reduce() -> None:
    async def step() -> Any:
        ctx = _ctx()
        if ctx.replica_id_in_sync_group == 0:
            mine = _slices(np.array([2], np.uint64))
        else:
            mine = ar.IndexedSlices(np.ones((0, 2)), np.zeros(0, np.int32), (3, 2))
        return await ctx.all_reduce("SUM", mine)

    result = (await strategy().run(step)).values[0]
    assert result.indices.tolist() == [2]
    assert result.indices.dtype == np.int64


# -- B1: a backend's results are held to the collective's signature ------------------------


class _WrongBackend(NumpyBackend):
    """A third-party backend whose all_reduce and broadcast answer wrongly."""

    def __init__(self, kind: str) -> None:
        super().__init__(DEVICES[:2])
        self.kind = kind

    def _wrong(self, results: Any) -> Any:
        if self.kind == "shape":
            return [[np.zeros(3) for _ in leaves] for leaves in results]
        if self.kind == "dtype":
            return [[np.asarray(x, dtype=np.float32) for x in leaves] for leaves in results]
        if self.kind == "count":
            return results[:-1]
        if self.kind == "leaves":
            return [[*leaves, np.zeros(2)] for leaves in results]
        return None

    async def all_reduce(self, op: Any, values: Any, *, bytes_per_pack: int = 0) -> Any:
        return self._wrong(await super().all_reduce(op, values, bytes_per_pack=bytes_per_pack))

    async def broadcast(self, values: Any, count: int) -> Any:
        return self._wrong(await super().broadcast(values, count))


WRONG = {
    "shape": r"returned float64\[3\] as leaf 0 of replica 0's result, where float64\[2\] was due",
    "dtype": r"returned float32\[2\] as leaf 0 of replica 0's result, where float64\[2\] was due",
    "count": r"1 results for 2 replicas",
    "leaves": r"of 2 leaves where it gave 1 leaves",
    "none": r"returned NoneType, not one list of leaves per replica",
}


@pytest.mark.parametrize("kind", list(WRONG))
@pytest.mark.parametrize("collective", ["all_reduce", "broadcast"])
async def test_a_backend_result_that_breaks_the_signature_is_a_backend_error(
    kind: str, collective: str
) -> None:
    async def step() -> Any:
        ctx = _ctx()
        if collective == "all_reduce":
            return await ctx.all_reduce("SUM", np.ones(2))
        return await ctx.broadcast(np.ones(2))

    s = ar.MirroredStrategy(DEVICES[:2], backend=_WrongBackend(kind))
    with pytest.raises(ar.BackendError) as info:
        await s.run(step)
    message = str(info.value)
    assert re.search(WRONG[kind], message), message
    assert "broke its contract in the 'numpy' backend's" in message
    assert "bug in the backend" in message
    assert not getattr(info.value, "__notes__", None) or not any(
        "in replica" in note for note in info.value.__notes__
    )


async def test_an_integer_mean_and_python_numbers_pass_the_result_check() -> None:
    async def step() -> Any:
        ctx = _ctx()
        return (
            await ctx.all_reduce("MEAN", np.arange(3, dtype=np.int32)),
            await ctx.all_reduce("SUM", [1.0, 2, 3j]),
            await ctx.broadcast({"a": 1.5, "b": np.int8(2)}),
        )

    s = strategy()
    mean, numbers, sent = s.experimental_local_results(await s.run(step))[0]
    assert mean.dtype == np.float64
    assert [complex(x) for x in numbers] == [2.0, 4.0, 6j]
    assert (sent["a"], sent["b"]) == (1.5, 2)


class _WrongGatherBackend(NumpyBackend):
    """A third-party backend whose all_gather and reduce_scatter answer wrongly."""

    def __init__(self, kind: str) -> None:
        super().__init__(DEVICES[:2])
        self.kind = kind

    def _wrong(self, results: Any) -> Any:
        if self.kind == "shape":  # one replica's value, not the concatenation / a chunk
            return [[np.zeros(2) for _ in leaves] for leaves in results]
        if self.kind == "dtype":
            return [[np.asarray(x, dtype=np.float32) for x in leaves] for leaves in results]
        if self.kind == "rank":
            return [[np.asarray(x)[None] for x in leaves] for leaves in results]
        if self.kind == "count":
            return results[:-1]
        return None

    async def all_gather(self, values: Any, axis: int) -> Any:
        return self._wrong(await super().all_gather(values, axis))

    async def reduce_scatter(self, op: Any, values: Any, axis: int) -> Any:
        return self._wrong(await super().reduce_scatter(op, values, axis))


WRONG_GATHER = {
    ("all_gather", "shape"): r"returned float64\[2\] as leaf 0 of replica 0's result, "
    r"where float64\[5\] was due",
    ("all_gather", "dtype"): r"returned float32\[5\] as leaf 0 .* where float64\[5\] was due",
    ("all_gather", "rank"): r"returned float64\[1,5\] as leaf 0 .* where float64\[5\] was due",
    ("reduce_scatter", "shape"): r"returned float64\[2\] as leaf 0 of replica 0's result, "
    r"where float64\[3\] was due",
    ("reduce_scatter", "dtype"): r"returned float32\[3\] as leaf 0 .* where float64\[3\] was due",
    ("reduce_scatter", "rank"): r"returned float64\[1,3\] as leaf 0 .* where float64\[3\] was due",
    ("all_gather", "count"): r"1 results for 2 replicas",
    ("reduce_scatter", "count"): r"1 results for 2 replicas",
}


@pytest.mark.parametrize(("collective", "kind"), list(WRONG_GATHER))
async def test_a_gather_or_scatter_result_that_breaks_the_signature_is_a_backend_error(
    collective: str, kind: str
) -> None:
    """B1's rule for every collective: all_gather and reduce_scatter were not held to it."""

    async def step() -> Any:
        ctx = _ctx()
        rid = ctx.replica_id_in_sync_group
        if collective == "all_gather":  # sizes 2 and 3 along the axis: 5 gathered
            return await ctx.all_gather(np.ones(2 + rid), axis=0)
        return await ctx.reduce_scatter("SUM", np.ones(6), axis=0)

    s = ar.MirroredStrategy(DEVICES[:2], backend=_WrongGatherBackend(kind))
    with pytest.raises(ar.BackendError) as info:
        await s.run(step)
    message = str(info.value)
    assert re.search(WRONG_GATHER[collective, kind], message), message
    assert f"broke its contract in the 'numpy' backend's {collective}" in message
    assert not getattr(info.value, "__notes__", None) or not any(
        "in replica" in note for note in info.value.__notes__
    )


async def test_gather_and_scatter_results_of_every_kind_pass_the_result_check() -> None:
    async def step() -> Any:
        ctx = _ctx()
        rid = ctx.replica_id_in_sync_group
        return (
            await ctx.all_gather({"a": np.ones((2, 1 + rid)), "b": np.int8([[rid]])}, axis=-1),
            await ctx.reduce_scatter("MEAN", np.arange(4, dtype=np.int32), axis=0),
            await ctx.reduce_scatter("MAX", np.zeros((2, 4), np.float16), axis=1),
        )

    s = strategy()
    gathered, mean, chunk = s.experimental_local_results(await s.run(step))[1]
    assert gathered["a"].shape == (2, 3)
    assert gathered["b"].tolist() == [[0, 1]]
    assert gathered["b"].dtype == np.int8
    assert mean.dtype == np.float64
    assert mean.tolist() == [2.0, 3.0]
    assert chunk.shape == (2, 2)
    assert chunk.dtype == np.float16


# -- B0c: a replica's task in a fresh context is told, never given the default context ----


FRESH = r"replica context: the task was started with a fresh contextvars.Context\(\)"


def _asyncio_only(anyio_backend: object) -> None:
    if anyio_backend == "trio" or (isinstance(anyio_backend, tuple) and anyio_backend[0] == "trio"):
        pytest.skip("asyncio.create_task(context=...): asyncio only (trio: the tests below)")


async def test_a_helper_task_in_a_fresh_context_is_refused_not_the_identity(
    anyio_backend: object,
) -> None:
    _asyncio_only(anyio_backend)

    async def grads(v: float) -> Any:
        ctx = ar.get_replica_context()
        assert ctx is not None
        return await ctx.all_reduce("SUM", v)

    async def step() -> Any:
        rid = _ctx().replica_id_in_sync_group
        task = asyncio.create_task(grads(float(rid + 1)), context=contextvars.Context())
        return await task

    with pytest.raises(BaseException) as info:  # noqa: PT011 (checked below)
        await strategy().run(step)
    errors = info.value.exceptions if isinstance(info.value, BaseExceptionGroup) else [info.value]
    assert errors
    for error in errors:
        assert isinstance(error, ar.ReplicaContextError)
        assert re.search(FRESH, str(error)), error


async def test_get_replica_context_run_in_a_fresh_context_is_refused() -> None:
    async def step() -> Any:
        return contextvars.Context().run(ar.get_replica_context)

    with pytest.raises(ar.ReplicaContextError, match=r"the call runs in one"):
        await strategy(1).run(step)


async def test_a_trio_system_task_in_a_fresh_context_fails_the_run(anyio_backend: object) -> None:
    if anyio_backend != "trio":
        pytest.skip("trio only")
    import trio

    async def system_task() -> None:
        await trio.lowlevel.checkpoint()

    async def step() -> Any:
        trio.lowlevel.spawn_system_task(system_task, context=contextvars.Context())
        await trio.lowlevel.checkpoint()
        return 1.0

    with pytest.raises(ar.ReplicaContextError, match=r"fresh contextvars.Context\(\)"):
        await strategy(1).run(step)


async def test_outside_a_run_get_replica_context_is_the_default_in_a_fresh_context() -> None:
    ctx = contextvars.Context().run(ar.get_replica_context)
    assert ctx is not None
    assert ctx.num_replicas_in_sync == 1


# -- B7: a collective driven by hand, then closed or thrown into ---------------------------


@pytest.mark.parametrize("how", ["close", "throw"])
async def test_a_collective_left_by_hand_after_it_was_issued_fails_the_run(how: str) -> None:
    left = anyio.Event()

    async def step() -> Any:
        ctx = _ctx()
        rid = ctx.replica_id_in_sync_group
        collective = ctx.all_reduce("SUM", float(rid + 1))
        if rid == 0:
            it = collective.__await__()
            it.send(None)  # issued: replica 0 is the first (and only) arrival
            if how == "close":
                it.close()
            else:
                with pytest.raises(ValueError, match="thrown"):
                    it.throw(ValueError("thrown"))
            left.set()
            return 0.0
        await left.wait()
        return await collective

    with pytest.raises(ar.CollectiveError, match=r"Replica 0 .* 1st collective") as info:
        await strategy().run(step)
    assert any("replica 0 left it by hand" in note for note in info.value.__notes__)


@pytest.mark.parametrize("how", ["close", "throw", "read", "never_sent"])
async def test_a_collective_left_by_hand_after_its_result_arrived_fails_the_run(
    how: str, anyio_backend: object
) -> None:
    """B7's remainder: replica 0's result had arrived (a peer completed the collective)
    before it closed or threw into the iterator it drove by hand. asyncio's C future has
    no hook for "result read": the result arriving with no task awaiting it is the sign.
    Reading it later by hand (``it.send(None)``) is driving it by hand all the same. On
    trio the task registered in the collective's event is taken out of it (rescheduling
    it crashed trio), and the run fails the same way."""
    if how == "never_sent" and anyio_backend == "trio":
        pytest.skip("trio: an iterator never sent into never arrives (ReplicaExitedError)")
    issued = anyio.Event()
    completed = anyio.Event()

    async def step() -> Any:
        ctx = _ctx()
        rid = ctx.replica_id_in_sync_group
        collective = ctx.all_reduce("SUM", float(rid + 1))
        if rid == 0:
            it = collective.__await__()
            if how != "never_sent":
                it.send(None)  # issued: replica 0 is the first arrival
            issued.set()
            await completed.wait()  # replica 1 completes the collective meanwhile
            if how == "close":
                it.close()
            elif how == "throw":
                with pytest.raises(ValueError, match="thrown"):
                    it.throw(ValueError("thrown"))
            elif how == "read":
                with pytest.raises(StopIteration):
                    it.send(None)
            return 0.0
        await issued.wait()
        result = await collective
        completed.set()
        return result

    with pytest.raises(ar.CollectiveError, match=r"Replica 0 .* 1st collective") as info:
        await strategy().run(step)
    assert any("replica 0 left it by hand" in note for note in info.value.__notes__), (
        info.value.__notes__
    )


# -- B0c remainder: a context object captured before a fresh-context task starts -----------


@pytest.mark.parametrize("captured", ["replica", "default"])
async def test_a_context_captured_before_a_fresh_context_task_is_refused_there(
    captured: str, anyio_backend: object
) -> None:
    """get_replica_context() refused in a fresh context; a ReplicaContext object taken
    before (the replica's own, or the default one taken outside the run) was not: the
    default one reduced nothing (each replica got its own value back)."""
    _asyncio_only(anyio_backend)
    outside = ar.get_replica_context()
    assert outside is not None

    async def grads(ctx: ar.ReplicaContext, v: float) -> Any:
        return await ctx.all_reduce("SUM", v)

    async def step() -> Any:
        ctx = _ctx()
        use = ctx if captured == "replica" else outside
        v = float(ctx.replica_id_in_sync_group + 1)
        return await asyncio.create_task(grads(use, v), context=contextvars.Context())

    with pytest.raises(BaseException) as info:  # noqa: PT011 (checked below)
        await strategy().run(step)
    errors = info.value.exceptions if isinstance(info.value, BaseExceptionGroup) else [info.value]
    assert errors
    for error in errors:
        assert isinstance(error, ar.ReplicaContextError), error
        expected = "fresh contextvars.Context()" if captured == "replica" else "default replica"
        assert expected in str(error), error


@pytest.mark.parametrize("api", ["all_reduce", "all_gather", "broadcast", "barrier", "merge"])
async def test_the_default_context_taken_outside_the_run_is_refused_in_a_replica(api: str) -> None:
    outside = ar.get_replica_context()
    assert outside is not None

    async def step() -> Any:
        if api == "all_reduce":
            return await outside.all_reduce("SUM", 1.0)
        if api == "all_gather":
            return await outside.all_gather(np.ones(1), axis=0)
        if api == "broadcast":
            return await outside.broadcast(1.0)
        if api == "barrier":
            return await outside.barrier()
        return await outside.merge_call(lambda s: 1.0)

    with pytest.raises(ar.ReplicaContextError, match="default replica context"):
        await strategy(1).run(step)
    # Outside any run it is what it was: the identity.
    assert await outside.all_reduce("SUM", 2.0) == 2.0


# -- trio: a collective in an async generator's finally, finalized by trio -------------


@pytest.mark.filterwarnings("ignore::ResourceWarning")  # trio's, for the generator left
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
async def test_trio_a_refusal_in_an_async_generator_finalizer_after_the_run_is_only_logged(
    anyio_backend: object, caplog: pytest.LogCaptureFixture
) -> None:
    """The limit, pinned (docs/hangs.md): trio closes an async generator left unfinished
    in its own system task, outside the replica, and only logs what its ``finally``
    raises. While the run is live that refusal fails the run
    (``test_async_generator_cleanup.py``); a generator that outlives the run is closed
    after it returned: its collective is refused (the run has finished), so its value is
    never produced, nothing waits for it, and trio logs the refusal."""
    if anyio_backend != "trio":
        pytest.skip("trio only (asyncio: the run raises the refusal)")
    import gc

    events: list[object] = []
    kept: list[object] = []

    async def agen(ctx: ar.ReplicaContext) -> Any:
        try:
            yield 1
        finally:
            events.append("finally")
            events.append(await ctx.all_reduce("SUM", 1.0))

    async def step() -> Any:
        values = agen(_ctx())
        kept.append(values)  # outlives the run
        async for _ in values:
            break
        return 7.0

    s = strategy()
    with caplog.at_level("ERROR", logger="trio.async_generator_errors"):
        results = s.experimental_local_results(await s.run(step))
        kept.clear()
        gc.collect()
        for _ in range(100):
            if len(caplog.records) >= 2:
                break
            await anyio.lowlevel.checkpoint()
    assert results == (7.0,)  # every replica returned 7.0 (one Mirrored value)
    assert events == ["finally", "finally"]  # no collective result was ever produced
    refused = [r.exc_info[1] for r in caplog.records if r.exc_info]
    assert len(refused) == 2
    assert all(isinstance(e, ar.ReplicaContextError) for e in refused), refused
    assert all("whose Strategy.run has finished" in str(e) for e in refused), refused


class _WrongStrategyGather(NumpyBackend):
    def __init__(self, kind: str) -> None:
        super().__init__(DEVICES[:2])
        self.kind = kind

    async def gather(self, components: Any, axis: int) -> Any:
        result = await super().gather(components, axis)
        if self.kind == "shape":
            return components[0]
        return np.asarray(result, dtype=np.float32)


@pytest.mark.parametrize(
    ("kind", "wrong"),
    [
        ("shape", r"returned float64\[2\], where float64\[5\] was due"),
        ("dtype", r"returned float32\[5\], where float64\[5\] was due"),
    ],
)
async def test_a_strategy_gather_result_that_breaks_the_rule_is_a_backend_error(
    kind: str, wrong: str
) -> None:
    """Strategy.gather's backend result is held to the rule the collectives' are."""
    s = ar.MirroredStrategy(DEVICES[:2], backend=_WrongStrategyGather(kind))
    value = ar.PerReplica([np.ones(2), np.ones(3)])
    with pytest.raises(ar.BackendError, match=wrong):
        await s.gather(value, axis=0)


async def test_a_strategy_gather_result_of_every_kind_passes_the_rule() -> None:
    s = strategy()
    value = ar.PerReplica([np.ones((1, 2), np.int8), np.zeros((3, 2), np.int8)])
    gathered = await s.gather(value, axis=0)
    assert gathered.shape == (4, 2)
    assert gathered.dtype == np.int8
