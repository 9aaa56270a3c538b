"""Every way a replica can end: a run never returns ``None`` for a replica that did not return.

Issue 23, cause 2. A replica cancelled from outside its run (``task.cancel()``, the
shutdown idiom "cancel every task but main", a ``CancelledError`` raised by a library in
the step or a merge_fn) or closed by ``GeneratorExit`` fails the run with
``ReplicaCancelledError`` naming that replica and where it ended; the library's own bugs
raise ``InternalError`` instead of being blamed on a replica.
"""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import anyio
import pytest

import asyncreplica as ar
from asyncreplica._core._lifecycle import Event
from asyncreplica._runtime import _context, _ending

pytestmark = pytest.mark.anyio

HERE = "runtime/test_replica_lifecycle.py"


def strategy(n: int = 2) -> ar.MirroredStrategy:
    return ar.MirroredStrategy([f"CPU:{i}" for i in range(n)])


def _ctx() -> ar.ReplicaContext:
    ctx = ar.get_replica_context()
    assert ctx is not None
    return ctx


@pytest.fixture
def asyncio_only(anyio_backend: object) -> None:
    if anyio_backend == "trio" or (isinstance(anyio_backend, tuple) and anyio_backend[0] == "trio"):
        pytest.skip("trio has no task.cancel(): a trio task is only cancelled by its scopes")


async def _cancelled_run(s: ar.MirroredStrategy, step: Any) -> ar.ReplicaCancelledError:
    with pytest.raises(ar.ReplicaCancelledError) as info:
        await s.run(step)
    return info.value


# -- cancelled from outside the run -------------------------------------------------------


@pytest.mark.usefixtures("asyncio_only")
async def test_task_cancel_of_one_replica_names_that_replica() -> None:
    # Before: "Replica 0 was cancelled while waiting..." (replica 0, which waited for it).
    async def step() -> object:
        ctx = _ctx()
        if ctx.replica_id_in_sync_group == 1:
            task = asyncio.current_task()
            assert task is not None
            task.cancel()
            await asyncio.sleep(0)
        return await ctx.all_reduce("SUM", 1.0)

    error = await _cancelled_run(strategy(), step)
    assert error.replica_id == 1
    assert error.how == "cancelled"
    assert error.where is not None
    assert error.where.startswith(f"{HERE}:")
    assert error.where.endswith("in step()")
    assert isinstance(error.__cause__, asyncio.CancelledError)
    message = str(error)
    assert message.startswith(
        f"Replica 1 of 2 was cancelled from outside its MirroredStrategy.run at {HERE}:"
    )
    assert message.endswith("For more on this error, run `asyncreplica explain AR109`.")
    # The report is taken when the run fails: replica 0 waits for replica 1.
    assert error.report is not None
    assert [row.state.value for row in error.report.rows] == ["waiting", "cancelled"]


async def test_cancelled_error_raised_in_the_step_fails_the_run() -> None:
    # A library inside the step raises CancelledError (on trio it is no trio cancellation
    # either). Before: the run returned None for replica 1.
    async def step() -> object:
        ctx = _ctx()
        if ctx.replica_id_in_sync_group == 1:
            raise asyncio.CancelledError
        return 1.0

    error = await _cancelled_run(strategy(), step)
    assert error.replica_id == 1
    assert error.where is not None
    assert error.where.endswith("in step()")


async def test_cancelled_error_raised_in_the_step_while_another_waits() -> None:
    async def step() -> object:
        ctx = _ctx()
        if ctx.replica_id_in_sync_group == 0:
            raise asyncio.CancelledError
        return await ctx.all_reduce("SUM", 1.0)

    error = await _cancelled_run(strategy(3), step)
    assert error.replica_id == 0
    assert "Replica 0 of 3" in str(error)


@pytest.mark.parametrize("awaited", [False, True], ids=["sync", "async"])
async def test_cancelled_error_raised_in_a_merge_fn_fails_the_run(awaited: bool) -> None:
    # Before: Strategy.run returned None for the whole run.
    def merge_fn(strategy: ar.Strategy, value: float) -> float:
        raise asyncio.CancelledError

    async def async_merge_fn(strategy: ar.Strategy, value: float) -> float:
        raise asyncio.CancelledError

    async def step() -> object:
        return await _ctx().merge_call(async_merge_fn if awaited else merge_fn, args=(1.0,))

    error = await _cancelled_run(strategy(), step)
    assert error.how == "cancelled"
    assert error.where is not None
    assert error.where.endswith("merge_fn()")


# A replica task cancelled before its first step leaves its coroutine never awaited:
# Python says so when it collects it (collected here, so that no later test hears of it).
_NEVER_AWAITED = [
    pytest.mark.filterwarnings("ignore:coroutine 'Run._replica_main' was never awaited"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]


@pytest.mark.usefixtures("asyncio_only")
@_NEVER_AWAITED[0]
@_NEVER_AWAITED[1]
async def test_the_shutdown_idiom_cancel_every_task_but_main_fails_the_run() -> None:
    # The stall watcher (on by default) is one of the tasks cancelled: that must not end
    # the run as if it had completed. (Here "every task but main" is every task of the
    # run: the test runner's own tasks are not the program's.)
    async def step() -> object:
        ctx = _ctx()
        if ctx.replica_id_in_sync_group == 1:
            for task in asyncio.all_tasks():
                if task.get_name().startswith("asyncreplica "):
                    task.cancel()
        await asyncio.sleep(0)
        return await ctx.all_reduce("SUM", 1.0)

    # Every replica was cancelled from outside: each is told (a replica cancelled in
    # the turn the run failed used to be taken for one the run cancelled).
    with pytest.raises(ExceptionGroup) as info:
        await strategy(3).run(step)
    errors = info.value.exceptions
    assert all(isinstance(e, ar.ReplicaCancelledError) for e in errors)
    assert [e.replica_id for e in errors] == [0, 1, 2]  # type: ignore[attr-defined]
    assert all(e.how == "cancelled" for e in errors)  # type: ignore[attr-defined]
    gc.collect()


@pytest.mark.usefixtures("asyncio_only")
async def test_cancelling_the_stall_watcher_alone_does_not_end_the_run() -> None:
    # Re-raised, its cancellation would cancel the run's scope: every replica "cancelled
    # by the run", and no result. It stops watching instead; the replicas go on.
    async def step() -> object:
        ctx = _ctx()
        if ctx.replica_id_in_sync_group == 0:
            for task in asyncio.all_tasks():
                if task.get_name() == "asyncreplica stall watch":
                    task.cancel()
        for _ in range(4):  # the loop turns a cancellation takes to reach every task
            await asyncio.sleep(0)
        return await ctx.all_reduce("SUM", 1.0)

    s = strategy()
    assert s.experimental_local_results(await s.run(step)) == (2.0, 2.0)


@pytest.mark.usefixtures("asyncio_only")
@_NEVER_AWAITED[0]
@_NEVER_AWAITED[1]
async def test_a_replica_cancelled_before_its_first_step_fails_the_run() -> None:
    # Its task never runs the replica's code. Before: replica 0, which waited, was blamed.
    async def step() -> object:
        ctx = _ctx()
        if ctx.replica_id_in_sync_group == 0:
            for task in asyncio.all_tasks():
                if task.get_name() == "asyncreplica replica 2":
                    task.cancel()
        return await ctx.all_reduce("SUM", 1.0)

    error = await _cancelled_run(strategy(3), step)
    assert error.replica_id == 2
    assert error.where is None
    assert "Replica 2 of 3 was cancelled from outside its MirroredStrategy.run before it ran" in (
        str(error)
    )
    gc.collect()


@pytest.mark.usefixtures("asyncio_only")
async def test_task_cancel_of_a_parked_replica_names_it() -> None:
    tasks: dict[int, asyncio.Task[Any]] = {}

    async def step() -> object:
        ctx = _ctx()
        rid = ctx.replica_id_in_sync_group
        task = asyncio.current_task()
        assert task is not None
        tasks[rid] = task
        if rid == 0:
            await asyncio.sleep(0)  # replica 1 parks at the collective
            tasks[1].cancel()
            await asyncio.sleep(0)
        return await ctx.all_reduce("SUM", 1.0)

    with pytest.raises(ar.CollectiveError, match=r"^Replica 1 was cancelled while waiting"):
        await strategy().run(step)


# -- GeneratorExit ------------------------------------------------------------------------


async def test_generator_exit_in_a_step_fails_the_run_with_a_named_error() -> None:
    # Before: a doubly nested BaseExceptionGroup with no replica note.
    async def step() -> object:
        ctx = _ctx()
        if ctx.replica_id_in_sync_group == 1:
            raise GeneratorExit
        return await ctx.all_reduce("SUM", 1.0)

    error = await _cancelled_run(strategy(), step)
    assert error.replica_id == 1
    assert error.how == "closed"
    assert isinstance(error.__cause__, GeneratorExit)
    assert str(error).startswith(f"Replica 1 of 2 ended with GeneratorExit at {HERE}:")


async def test_generator_exit_in_a_merge_fn_fails_the_run_with_a_named_error() -> None:
    def merge_fn(strategy: ar.Strategy, value: float) -> float:
        raise GeneratorExit

    async def step() -> object:
        return await _ctx().merge_call(merge_fn, args=(1.0,))

    error = await _cancelled_run(strategy(), step)
    assert error.how == "closed"
    assert error.where is not None
    assert error.where.endswith("in merge_fn()")


# -- what stays as it was -------------------------------------------------------------------


async def test_a_scope_around_the_run_still_cancels_the_run_quietly() -> None:
    with anyio.CancelScope() as scope:

        async def step() -> object:
            ctx = _ctx()
            if ctx.replica_id_in_sync_group == 1:
                await anyio.wait_all_tasks_blocked()
                scope.cancel()
            return await ctx.all_reduce("SUM", 1.0)

        await strategy(3).run(step)
    assert scope.cancelled_caught


async def test_the_same_strategy_runs_again_after_a_cancelled_replica() -> None:
    s = strategy()

    async def bad() -> object:
        if _ctx().replica_id_in_sync_group == 0:
            raise asyncio.CancelledError
        return 1.0

    async def good() -> object:
        return await _ctx().all_reduce("SUM", 1.0)

    await _cancelled_run(s, bad)
    assert s.experimental_local_results(await s.run(good)) == (2.0, 2.0)


# -- the library's own bugs -----------------------------------------------------------------


async def test_a_bug_in_library_code_is_an_internal_error(monkeypatch: pytest.MonkeyPatch) -> None:
    # The library's own line fails (its helper is gone): not the replica's error.
    monkeypatch.setattr(_context, "regroup", None)

    async def step() -> object:
        return await _ctx().merge_call(lambda strategy, value: value, args=(1.0,))

    with pytest.raises(ar.InternalError) as info:
        await strategy().run(step)
    error = info.value
    assert isinstance(error.__cause__, TypeError)  # the original, chained
    assert error.replica_id in (0, 1)
    message = str(error)
    assert message.startswith(
        f"An exception escaped asyncreplica's own code in the task of replica {error.replica_id}:"
        " TypeError: 'NoneType' object is not callable"
    )
    assert "This is a bug in asyncreplica" in message
    assert not any("raised in replica" in note for note in getattr(error, "__notes__", ()))
    assert not isinstance(error, RuntimeError)


async def test_an_error_the_library_raises_on_purpose_is_the_replicas() -> None:
    async def step() -> object:
        return await _ctx().all_reduce("BOGUS", 1.0)

    with pytest.raises(ValueError, match="is not a valid ReduceOp") as info:
        await strategy().run(step)
    assert not isinstance(info.value, ar.InternalError)
    assert info.value.__notes__[0].startswith("(raised in replica ")


async def test_a_users_error_in_code_the_library_calls_is_the_users() -> None:
    def merge_fn(strategy: ar.Strategy, value: float) -> float:
        return value.missing  # type: ignore[attr-defined,no-any-return]

    async def step() -> object:
        return await _ctx().merge_call(merge_fn, args=(1.0,))

    with pytest.raises(AttributeError) as info:
        await strategy().run(step)
    assert "raised in merge_fn" in info.value.__notes__[0]


# -- the rule that tells them apart, on its own ---------------------------------------------


def _raise_from(module: str, source: str, file: str = "x.py") -> BaseException:
    """The exception raised by ``source`` run as code of module ``module`` (in ``file``)."""
    namespace: dict[str, Any] = {"__name__": module, "__file__": file}
    exec(compile(f"def f():\n    {source}\n", f"<{module}>", "exec"), namespace)
    try:
        namespace["f"]()
    except BaseException as exc:
        return exc
    raise AssertionError("no exception")


@pytest.mark.parametrize(
    ("module", "source", "bug"),
    [
        ("asyncreplica._runtime._x", "x = None; x()", True),  # the interpreter fails in our line
        ("asyncreplica._runtime._x", "{}['k']", True),
        ("asyncreplica_numpy._x", "[][1]", True),  # a built-in backend is ours too
        ("asyncreplica._runtime._x", "assert False", True),  # a broken assert
        ("asyncreplica._runtime._x", "raise TypeError('bad value')", False),  # on purpose
        ("asyncreplica._runtime._x", "raise KeyError('k')", False),
        ("user_code", "x = None; x()", False),  # the user's own line
        ("user_code", "assert False", False),
        ("asyncreplicaish._x", "x = None; x()", False),  # not ours by a name's prefix alone
        # The machine ran out of something for the user's values: not a bug of ours
        # (an all_reduce of a 32 TiB broadcast view raised numpy's MemoryError).
        ("asyncreplica_numpy._x", "bytearray(1 << 62)", False),
        ("asyncreplica_numpy._x", "open('/nonexistent/dir/file')", False),
        # numpy raises FloatingPointError only where the user's np.seterr asked for it:
        # the combine of an overflowing all_reduce is the user's error (it was
        # InternalError in one process, on the MPI inline path too).
        (
            "asyncreplica_numpy._x",
            (
                "import numpy as np\n    with np.errstate(all='raise'): "
                "np.add(np.float16(6e4), np.float16(6e4))"
            ),
            False,
        ),
    ],
)
def test_raised_by_library(module: str, source: str, bug: bool) -> None:
    assert _ending.raised_by_library(_raise_from(module, source)) is bug


def test_an_asyncreplica_error_is_never_a_bug() -> None:
    error = _raise_from("asyncreplica._x", "raise __import__('asyncreplica').BackendError('x')")
    assert not _ending.raised_by_library(error)


@pytest.mark.parametrize(
    ("source", "bug"),
    [
        ("[][1]", True),
        ("x = None; x.attribute", True),
        ("assert False", True),
        ("raise ValueError('bad value')", False),
        ("raise __import__('asyncreplica').CollectiveError('x')", False),
        # What the type alone cannot tell, compiled: an implicit TypeError is taken as
        # deliberate (argument checks raise it), a deliberate KeyError as a bug.
        ("x = None; x()", False),
        ("raise KeyError('k')", True),
    ],
)
def test_raised_by_library_in_a_compiled_module_judges_by_the_type(source: str, bug: bool) -> None:
    # A module compiled with mypyc (its __file__ is the extension) leaves traceback
    # entries whose code object is a stand-in, with no instruction to read.
    error = _raise_from("asyncreplica._core._x", source, file="_x.cpython-311-x86_64-linux-gnu.so")
    assert _ending.raised_by_library(error) is bug


# -- the runtime's own invariants -------------------------------------------------------------


async def test_an_illegal_lifecycle_transition_in_a_run_is_an_internal_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Stands for a bug in how the runtime reads an ending: a replica that "starts" again.
    monkeypatch.setattr(_ending, "event_of", lambda error: Event.START)

    async def step() -> object:
        if _ctx().replica_id_in_sync_group == 1:
            raise ValueError("boom")
        return 1.0

    with pytest.raises(ar.InternalError) as info:
        await strategy().run(step)
    assert "replica 1 got the lifecycle event START in state RUNNING" in str(info.value)
    assert not any("raised in replica" in note for note in getattr(info.value, "__notes__", ()))


@pytest.mark.usefixtures("asyncio_only")  # on trio, a CancelledError is no cancellation
async def test_a_replica_without_a_result_in_a_run_that_did_not_fail_is_an_internal_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Stands for a bug that takes a cancellation from outside for the run's own: without
    # the check at the run's end, replica 1 would come back as None.
    monkeypatch.setattr(_ending, "event_of", lambda error: Event.CANCEL)

    async def step() -> object:
        if _ctx().replica_id_in_sync_group == 1:
            raise asyncio.CancelledError
        return 1.0

    with pytest.raises(ar.InternalError) as info:
        await strategy().run(step)
    assert str(info.value).startswith(
        "Replica 1 ended in state CANCELLED while the run recorded no failure"
    )
    assert info.value.replica_id == 1
