"""One ``Strategy.run``: replica tasks, rendezvous, failure handling.

Rendezvous: the last replica to arrive at a collective dispatches the backend
operation in its own task, then wakes the others. Nobody polls; no thread per
replica. The ledger decides everything about agreement; this module only acts on its
answers: dispatch, wait, or fail the run.

Failure: the first error (a replica's exception, a ledger error, a timeout) is
recorded as a *root cause* and the run's cancel scope is cancelled, so every other
replica is cancelled, not reported. ``Strategy.run`` raises the root cause itself
(with a note naming the replica) or, if several replicas failed independently before
the cancellation reached them, an ``ExceptionGroup`` of them in replica order.

Time enters only here: a waiter that has waited ``stall_warning_seconds`` logs a
warning (and logs again if the collective completes after all); one that has waited
``timeout_seconds`` fails the run. Deadlocks and exits are decided without time.
"""

from __future__ import annotations

import asyncio
import collections.abc
import contextlib
import functools
import inspect
import logging
import random
import time
import types
from collections.abc import Awaitable, Callable, Generator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel

from .._core._ledger import Key, Ledger
from .._core._nest import unflatten
from .._core._report import DOCS, key_text, resumed_message
from .._core._signature import ReduceOp, Signature
from .._exceptions import CollectiveError
from . import _tasks
from ._mode import MODE, Mode

if TYPE_CHECKING:
    from ..abc import Backend, ProcessGroup
    from ._strategy import Strategy
    from ._trace import Tracer

__all__ = ["NO_TREE", "Collective", "Dispatch", "Run", "logger"]

logger = logging.getLogger("asyncreplica")

Dispatch = Callable[["Run", "Collective", list[Any]], Awaitable[Sequence[Any]]]


class _Slot:
    """The payloads of one collective and, once dispatched, the results.

    Waiters park on one native waiter each (an asyncio future, or a trio event per
    collective), chosen once per run: no polling, no anyio.Event per collective.
    """

    __slots__ = ("done", "fast", "payloads", "results", "since", "waiters", "warned")

    def __init__(self, num_replicas: int, since: float) -> None:
        self.payloads: list[Any] = [None] * num_replicas
        self.results: Sequence[Any] = ()
        self.done = False  # results are set
        self.waiters: list[Any] = []  # asyncio futures, or one trio event
        self.fast: list[_Waiter] = []  # fast-path waiters: each gets its result
        self.since = since  # when the first replica arrived
        self.warned = False  # whether a stall warning was logged for it

    def release(self) -> None:
        """Wake every waiter (the results are set)."""
        self.done = True
        results = self.results
        fast = self.fast
        for waiter in fast:
            if not waiter.done():  # a cancelled one is left alone
                call = waiter._ar_call
                result = results[call.replica]
                tree = call.treedef
                waiter.set_result(result[0] if tree is None else _rebuild(tree, result))
        fast.clear()  # no slot <-> waiter cycle outlives the collective
        waiters = self.waiters
        if waiters and isinstance(waiters[0], asyncio.Future):
            for waiter in waiters:  # futures (asyncio), all of them
                if not waiter.done():
                    waiter.set_result(None)
            return
        for waiter in waiters:
            waiter.set()


def _result(call: Collective, result: Any) -> Any:
    """A replica's result, rebuilt into the structure of its value."""
    treedef = call.treedef
    if treedef is None:
        return result[0]
    return _rebuild(treedef, result)


def _rebuild(treedef: Any, result: Any) -> Any:
    """``result`` (a replica's result leaves) rebuilt into ``treedef`` (not None)."""
    if treedef is NO_TREE:
        return result
    if treedef[0] is list and treedef[1] is None and _all_leaves(treedef[2]):
        return list(result)  # a flat list of leaves
    return unflatten(treedef, result)


class _Waiter(asyncio.Future):  # type: ignore[type-arg]
    """A replica parked at a collective on asyncio (or uvloop): the fast path.

    The replica's task awaits this future directly (its C iterator: no Python frame
    runs when it resumes); the last arrival sets each waiter's result to its replica's
    result, already rebuilt. A task is parked at one of a run's collectives exactly
    when its ``_fut_waiter`` is one of the run's pending waiters, so parking costs no
    bookkeeping. Cancelling the waiter (the replica's task was cancelled) tells the
    run, before the task resumes, that the replica abandoned the collective.
    """

    __slots__ = ("_ar_call", "_ar_key", "_ar_slot")

    _ar_call: Collective  # its run, replica and result structure
    _ar_key: Key
    _ar_slot: _Slot

    def cancel(self, msg: Any = None) -> bool:
        """Cancel the wait; the run hears of it before the replica's task resumes."""
        if not self.done():
            # Scheduled before the task's own wake-up (which super().cancel schedules).
            self.get_loop().call_soon(
                self._ar_call._run._abandoned, self._ar_call.replica, self._ar_key, self._ar_slot
            )
        return super().cancel(msg)


class _Spent:
    """What a collective awaited on the fast path leaves behind: it cannot run again."""

    __slots__ = ()

    def _reused(self, *_: object) -> Any:
        raise RuntimeError("cannot reuse already awaited coroutine")

    __await__ = send = throw = _reused

    def close(self) -> None:
        """Nothing to close: the arrival is made."""


_SPENT = _Spent()


# Whether a backend class's all_reduce takes ``bytes_per_pack``: decided once per class.
_ACCEPTS_PACK: dict[type, bool] = {}


def accepts_bytes_per_pack(backend: Backend) -> bool:
    """Whether ``backend.all_reduce`` accepts the ``bytes_per_pack`` keyword argument.

    Backends written before the keyword existed are still called correctly, without
    it. The answer is computed once per backend class.
    """
    cls = type(backend)
    found = _ACCEPTS_PACK.get(cls)
    if found is None:
        try:
            params = inspect.signature(backend.all_reduce).parameters
        except (TypeError, ValueError):
            found = False
        else:
            found = "bytes_per_pack" in params or any(
                p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()
            )
        _ACCEPTS_PACK[cls] = found
    return found


def _all_leaves(children: tuple[Any, ...]) -> bool:
    """Whether every child of a treedef node is a leaf (None)."""
    return not any(children)


def _on_task_created(task: asyncio.Task[Any]) -> None:
    """Task factory hook: record tasks created inside a replica (asyncio)."""
    mode = MODE.get()
    if mode is None or mode.replica is None:
        return
    run = mode.replica._run
    if run is not None and not run.closed:
        run.watch.adopt(mode.replica.replica_id_in_sync_group, task)
        # A replica's helper task that ends may leave its replica blocked for good.
        task.add_done_callback(run.task_done)


class _NoTree:
    """Marks a collective whose result is not rebuilt into a structure."""


NO_TREE: Any = _NoTree()


class Collective(collections.abc.Coroutine[Any, Any, Any]):
    """An issued collective: await it to take part in the rendezvous.

    It is a coroutine (so ``asyncio.create_task``, ``asyncio.gather`` and task groups
    accept it) that refuses to be used as a value, so that a forgotten ``await`` fails
    where it happens rather than as a silently skipped collective.

    It carries everything the rendezvous needs as plain fields (no closure, no
    coroutine per call): the run creates the one coroutine, :meth:`Run.collective`,
    when the collective is first awaited or sent into.

    Args:
        run: The run the replica belongs to.
        replica: The issuing replica.
        signature: The collective's signature.
        payload: What the replica contributes (its leaves, or merge_call's arguments).
        dispatch: Called once, by the last arrival, as ``dispatch(run, collective,
            payloads)`` with every replica's payload in replica order; returns one
            result per replica.
        extra: Data for ``dispatch`` (e.g. ``bytes_per_pack``).
        timeout: Seconds to wait before ``CollectiveTimeoutError``; None or 0 waits
            for ever.
        treedef: The structure to rebuild the result into, or :data:`NO_TREE`.
    """

    __slots__ = (
        "_coro",
        "_pending",
        "_run",
        "_signature",
        "awaited",
        "dispatch",
        "extra",
        "payload",
        "replica",
        "timeout",
        "treedef",
    )

    def __init__(
        self,
        run: Run,
        replica: int,
        signature: Signature,
        payload: object,
        dispatch: Dispatch,
        extra: object = None,
        timeout: float | None = None,
        treedef: Any = NO_TREE,
    ) -> None:
        self._run = run
        self.replica = replica
        self._signature = signature
        self.payload = payload
        self.dispatch = dispatch
        self.extra = extra
        self.timeout = timeout
        self.treedef = treedef
        self._coro: Any = None
        self.awaited = False
        # Registered until awaited, so that the replica's end can report it.
        pending = self._pending = run.unawaited[replica]
        pending[id(self)] = self

    @property
    def signature(self) -> Signature:
        """The collective's signature."""
        return self._signature

    def _started(self) -> Any:
        coro = self._coro
        if coro is None:
            self.awaited = True
            self._pending.pop(id(self), None)
            coro = self._coro = self._run.collective(self)
        return coro

    def __await__(self) -> Generator[Any, None, Any]:
        if self._coro is None:
            run = self._run
            if run._fast and not self.timeout:
                # The common case: arrive now; a waiter awaits its future directly.
                self.awaited = True
                self._pending.pop(id(self), None)
                self._coro = _SPENT
                return run._arrive_fast(self)
        return self._started().__await__()  # type: ignore[no-any-return]

    def send(self, value: Any) -> Any:
        """Run the collective to its next suspension (coroutine protocol)."""
        return self._started().send(value)

    def throw(self, *args: Any) -> Any:
        """Raise an exception inside the collective (coroutine protocol)."""
        return self._started().throw(*args)

    def close(self) -> None:
        """Discard the collective without running it."""
        if self._coro is not None:
            self._coro.close()

    def describe(self) -> str:
        """``all_reduce(SUM) on float32[4] at train.py:12``."""
        site = self._signature.call_site
        return self._signature.describe() + ("" if site is None else f" at {site}")

    def _refuse(self, use: str) -> TypeError:
        return TypeError(
            f"A collective that has not run cannot be used as a value ({use}): "
            f"{self.describe()}. Did you forget `await`? "
            "Write `result = await ctx.all_reduce(...)`; an un-awaited collective is skipped "
            "by this replica and its peers would wait for it."
        )

    def __bool__(self) -> bool:
        raise self._refuse("truth value")

    def __float__(self) -> float:
        raise self._refuse("float()")

    def __int__(self) -> int:
        raise self._refuse("int()")

    def __index__(self) -> int:
        raise self._refuse("index")

    def __complex__(self) -> complex:
        raise self._refuse("complex()")

    def __iter__(self) -> Any:
        raise self._refuse("iteration")

    def __len__(self) -> int:
        raise self._refuse("len()")

    def __array__(self, *args: object, **kwargs: object) -> Any:
        raise self._refuse("array conversion")

    def __getitem__(self, item: object) -> Any:
        raise self._refuse("indexing")

    def _operator(self, *_: object) -> Any:
        raise self._refuse("arithmetic or comparison")

    __lt__ = __le__ = __gt__ = __ge__ = _operator
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _operator
    __truediv__ = __rtruediv__ = __floordiv__ = __rfloordiv__ = __pow__ = __rpow__ = _operator
    __matmul__ = __rmatmul__ = __neg__ = __pos__ = __abs__ = _operator

    def __repr__(self) -> str:
        state = "awaited" if self.awaited else "not awaited"
        return f"<collective {self.describe()} ({state})>"


class Run:
    """The state of one ``Strategy.run`` call.

    Args:
        strategy: The strategy that runs.
        backend: Its backend.
        check_call_sites: Whether call paths must agree.
        stall_warning_seconds: Log a stall warning after this wait; None disables it.
        tracer: Receives the run's events for a timeline; None when tracing is off.
        shuffle: For ``schedule="random"``: varies the order in which replicas start
            and resume after collectives, reproducibly from its seed.
    """

    def __init__(
        self,
        strategy: Strategy,
        backend: Backend,
        *,
        check_call_sites: bool,
        stall_warning_seconds: float | None,
        tracer: Tracer | None = None,
        shuffle: random.Random | None = None,
    ) -> None:
        self.strategy = strategy
        # The processes this run spans (MultiWorkerMirroredStrategy); None within one.
        self.group: ProcessGroup | None = strategy._group
        self.tracer = tracer
        self.shuffle = shuffle
        self.backend = backend
        self._packs = accepts_bytes_per_pack(backend)
        self.describe = backend.describe
        self.num_replicas = strategy._num_local
        self.ledger = Ledger(
            self.num_replicas, check_call_sites=check_call_sites, offset=strategy._replica_offset
        )
        self.closed = False
        self.stall_warning_seconds = stall_warning_seconds
        self.watch = _tasks.TaskWatch()
        self.unawaited: list[dict[int, Collective]] = [{} for _ in range(self.num_replicas)]
        self._slots: dict[Key, _Slot] = {}
        self._loop: asyncio.AbstractEventLoop | None = None  # set when the run starts
        # Whether ``await collective`` may take the fast path (asyncio, no tracer, no
        # shuffle): set when the run starts.
        self._fast = False
        self._current_task: Callable[[], object] = _tasks.current_task
        self._parked: dict[int, Key] = {}  # id(task) -> the collective it waits at
        self._errors: list[tuple[int, BaseException]] = []
        self._results: list[object] = [None] * self.num_replicas
        self._cancel_scope: anyio.CancelScope | None = None
        # Errors that already carry a note saying where they came from.
        self._noted: set[int] = set()

    @property
    def failed(self) -> bool:
        """Whether a root cause has been recorded."""
        return bool(self._errors)

    def note(self, error: BaseException, note: str) -> None:
        """Attach ``note`` to ``error`` instead of the usual "raised in replica k" note."""
        error.add_note(note)
        self._noted.add(id(error))

    def _recorded(self, error: BaseException) -> bool:
        """Whether ``error`` is a recorded root cause, or only wraps recorded ones.

        A replica's own task group wraps the collective error it re-raises in an
        ``ExceptionGroup``; that group is not a second failure.
        """
        if any(e is error for _, e in self._errors):
            return True
        if isinstance(error, BaseExceptionGroup):
            return all(
                self._recorded(e) or isinstance(e, anyio.get_cancelled_exc_class())
                for e in error.exceptions
            )
        return False

    def _fail(self, replica: int, error: BaseException) -> None:
        # replica is -1 when no replica raised it (found by a callback).
        if not self._recorded(error):
            self._errors.append((replica, error))
            if self.tracer is not None:
                self.tracer.failed(error, getattr(error, "report", None))
        if self._cancel_scope is not None:
            self._cancel_scope.cancel()

    # -- collectives ----------------------------------------------------------------

    def all_reduce(
        self, op: ReduceOp, payloads: list[Any], bytes_per_pack: int
    ) -> Awaitable[list[list[object]]]:
        """Call the backend's ``all_reduce``, with ``bytes_per_pack`` if it accepts it."""
        if self._packs:
            return self.backend.all_reduce(op, payloads, bytes_per_pack=bytes_per_pack)
        return self.backend.all_reduce(op, payloads)

    def collective(self, call: Collective) -> Any:
        """Meet the other replicas at this replica's next collective (a coroutine).

        ``await collective`` takes :meth:`_arrive_fast` where it can; this coroutine
        serves every other case (trio, a timeout, a tracer, ``schedule="random"``, a
        collective run as a task), with the same steps and checks.

        Args:
            call: The issued collective: its replica, signature, payload, dispatch
                function, timeout and result structure.

        Returns:
            A coroutine whose result is this replica's result, rebuilt into
            ``call.treedef``'s structure.
        """
        return self._collective(call)

    def _arrive_fast(self, call: Collective) -> Generator[Any, None, Any]:
        """``await call`` on asyncio without a timeout, tracer or shuffle.

        The arrival is made now. A waiter gets a :class:`_Waiter` future to await
        (the last arrival sets it to this replica's rebuilt result); the last arrival
        gets the dispatch coroutine. Returns the iterator the ``await`` drives.
        """
        if self._errors:
            # The run failed meanwhile: the coroutine raises the cancellation.
            return self._collective(call).__await__()
        replica = call.replica
        ledger = self.ledger
        try:
            key, complete = ledger.arrive(replica, call._signature)
        except CollectiveError as exc:
            self._fail(replica, exc)
            raise
        slot = self._arrive_at(key, replica, call.payload, complete)
        if complete:
            return self._dispatch(call, key, slot).__await__()
        if ledger.all_waiting():
            self._check_deadlock(replica, current=self._current_task())
        waiter = _Waiter(loop=self._loop)
        waiter._ar_call = call
        waiter._ar_key = key
        waiter._ar_slot = slot
        slot.fast.append(waiter)
        return waiter.__await__()

    def _abandoned(self, replica: int, key: Key, slot: _Slot) -> None:
        """A fast-path waiter was cancelled: its replica left the collective at ``key``."""
        if not self._errors and not slot.done:
            error = self.ledger.abandon(replica, key)
            if error is not None:
                self._fail(replica, error)

    def _arrive_at(self, key: Key, replica: int, payload: object, complete: bool) -> _Slot:
        """Put ``payload`` in the slot of ``key``; a complete slot leaves the pending ones."""
        slots = self._slots
        slot = slots.get(key)
        if slot is None:
            slot = slots[key] = _Slot(self.num_replicas, time.monotonic())
        slot.payloads[replica] = payload
        if complete:
            del slots[key]
        return slot

    async def _collective(self, call: Collective) -> Any:
        """:meth:`collective` as a coroutine: every loop, timeouts, tracing, shuffling."""
        if self._errors:
            # The run is being torn down; this raises the cancellation.
            await anyio.lowlevel.checkpoint()
        replica = call.replica
        signature = call._signature
        try:
            key, complete = self.ledger.arrive(replica, signature)
        except CollectiveError as exc:
            self._fail(replica, exc)
            raise
        tracer = self.tracer
        if tracer is not None:
            tracer.arrive(replica, key, signature)
        slot = self._arrive_at(key, replica, call.payload, complete)
        if complete:
            result = await self._dispatch(call, key, slot)
            if self.shuffle is not None:
                await self._jitter()
            return result
        else:
            task = self._current_task()
            parked = self._parked
            parked[id(task)] = key
            try:
                if self.ledger.all_waiting():
                    self._check_deadlock(replica, current=task)
                loop = self._loop
                if call.timeout:
                    await self._wait(slot, key, replica, call.timeout)
                elif loop is not None:
                    future = loop.create_future()
                    slot.waiters.append(future)
                    await future
                else:
                    await self._park(slot)
            except anyio.get_cancelled_exc_class():
                if not self._errors and not slot.done:
                    error = self.ledger.abandon(replica, key)
                    if error is not None:
                        self._fail(replica, error)
                raise
            finally:
                del parked[id(task)]
            if tracer is not None:
                tracer.resume(replica, key)
        if self.shuffle is not None:
            await self._jitter()
        return _result(call, slot.results[replica])

    async def _dispatch(self, call: Collective, key: Key, slot: _Slot) -> Any:
        """The last arrival at ``key``: run the collective, wake the others.

        Returns:
            This replica's result (rebuilt).
        """
        replica = call.replica
        signature = call._signature
        tracer = self.tracer
        if tracer is not None:
            tracer.dispatch_begin(key, replica, signature)
        group = self.group
        if group is None:
            slot.results = await call.dispatch(self, call, slot.payloads)
        else:
            # Scale-out: the processes agree on this position first (MPI).
            payloads = slot.payloads
            slot.results = await group.collective(
                signature, key, lambda: call.dispatch(self, call, payloads)
            )
        if tracer is not None:
            tracer.dispatch_end(key)
            tracer.resume(replica, key)
        slot.release()
        if slot.warned:
            waited = time.monotonic() - slot.since
            logger.warning(resumed_message(key_text(key), waited))
        return _result(call, slot.results[replica])

    async def _jitter(self) -> None:
        """Yield to the loop a seeded random number of times (``schedule="random"``)."""
        assert self.shuffle is not None
        for _ in range(self.shuffle.randrange(4)):
            await anyio.lowlevel.checkpoint()

    async def _park(self, slot: _Slot) -> None:
        loop = self._loop
        if loop is not None:
            future = loop.create_future()
            slot.waiters.append(future)
            await future
            return
        if not slot.waiters:
            import trio

            slot.waiters.append(trio.Event())
        await slot.waiters[0].wait()

    async def _wait(self, slot: _Slot, key: Key, replica: int, wait_limit: float | None) -> None:
        if not wait_limit:
            await self._park(slot)
            return
        with anyio.move_on_after(wait_limit):
            await self._park(slot)
        if slot.done:
            return
        if self._slots.get(key) is not slot and not self.failed:
            # Every replica arrived and the dispatch is under way (under MPI it waits
            # for the other processes, and bounds that wait itself): not a timeout here.
            await self._park(slot)
            return
        if self.failed:
            await anyio.lowlevel.checkpoint()
        error = self.ledger.timeout_error(key, wait_limit, self._whereabouts(key))
        self._fail(replica, error)
        raise error

    async def _watch_stalls(self, stall: float) -> None:
        """Log a warning for each collective that has waited ``stall`` seconds.

        One task per run; it sleeps until the oldest unwarned collective would stall,
        so it costs nothing per collective.
        """
        while True:
            now = time.monotonic()
            due = [s.since + stall for s in self._slots.values() if not s.warned]
            await anyio.sleep(max(min(due, default=now + stall) - now, 0.0))
            now = time.monotonic()
            for key, slot in list(self._slots.items()):
                if not slot.warned and now - slot.since >= stall and not slot.done:
                    slot.warned = True
                    message = self.ledger.stall_message(
                        key, now - slot.since, self._whereabouts(key)
                    )
                    logger.warning(message)

    def _whereabouts(self, key: Key) -> dict[int, str]:
        found = {}
        for rid in self.ledger.missing(key):
            main = self.watch.main.get(rid)
            if main is not None:
                found[rid] = _tasks.whereabouts(main)
        return found

    def _check_deadlock(self, replica: int, *, current: object = None) -> None:
        """Fail the run if no replica can ever complete a collective again."""
        if not self.ledger.all_waiting():
            return
        parked = self._parked

        def is_parked(task: object) -> bool:
            if task is current or id(task) in parked:
                return True
            waiter = getattr(task, "_fut_waiter", None)  # asyncio: the fast path
            return type(waiter) is _Waiter and waiter._ar_call._run is self and not waiter.done()

        for rid in range(self.num_replicas):
            if not all(_tasks.blocked(t, is_parked) for t in self.watch.tasks(rid)):
                return
        error = self.ledger.deadlock_error()
        self._fail(replica, error)
        raise error

    def task_done(self, task: object) -> None:
        """A task of some replica ended: replicas may now be deadlocked (asyncio)."""
        if self.closed or self.failed or not self.ledger.all_waiting():
            return
        # A deadlock is recorded as the run's root cause and the run is cancelled.
        with contextlib.suppress(CollectiveError):
            self._check_deadlock(-1)

    # -- replicas ---------------------------------------------------------------------

    def _check_awaited(self, replica: int) -> None:
        pending = list(self.unawaited[replica].values())
        for c in pending:
            c.close()
        self.unawaited[replica].clear()
        if pending:
            sites = "\n".join(f"  * {c.describe()}" for c in pending)
            raise CollectiveError(
                f"Replica {replica + self.strategy._replica_offset} created {len(pending)} "
                f"collective"
                f"{'' if len(pending) == 1 else 's'} that it never awaited:\n\n{sites}\n\n"
                "A collective runs only when awaited; without `await` this replica skips it "
                "while its peers wait for it. Write `await ctx.all_reduce(...)`.\n"
                f"See {DOCS}#collectiveerror in the asyncreplica documentation.",
                report=self.ledger.report(),
            )

    async def _replica_main(
        self,
        replica: int,
        mode: Mode,
        fn: Callable[..., Any],
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
    ) -> None:
        if self.failed:
            # Another replica failed before this one started: like TensorFlow, replicas
            # do not start a segment after a failure; this one is cancelled, not run.
            self.ledger.cancel(replica)
            return
        MODE.set(mode)
        self.watch.main[replica] = self._current_task()
        try:
            if self.shuffle is not None:
                await self._jitter()
            result = fn(*args, **kwargs)
            if inspect.isawaitable(result):
                result = await result
            self._check_awaited(replica)
        except Exception as exc:
            self.ledger.fail(replica)
            self._fail(replica, exc)
            return
        except BaseExceptionGroup as group:
            # A replica's own task group mixes a failure with its children's
            # cancellations (trio): the failure is what counts.
            failures, _ = group.split(Exception)
            if failures is None:
                self.ledger.cancel(replica)
                raise
            self.ledger.fail(replica)
            self._fail(replica, failures)
            return
        except BaseException:
            self.ledger.cancel(replica)
            raise
        finally:
            for c in self.unawaited[replica].values():
                c.close()
        self._results[replica] = result
        try:
            self.ledger.finish(replica)
            self._check_deadlock(replica)
        except CollectiveError as exc:
            # Once the run has failed, later replicas that finish see the same stuck
            # collective: the root cause is already recorded.
            if not self.failed:
                self._fail(replica, exc)

    async def execute(
        self,
        modes: Sequence[Mode],
        fn: Callable[..., Any],
        args: Sequence[Sequence[Any]],
        kwargs: Sequence[Mapping[str, Any]],
    ) -> list[object]:
        """Run every replica to completion; return their results in replica order.

        Raises:
            Exception: The root cause of a failed run (see the module docstring).
        """
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        self._loop = loop
        self._fast = loop is not None and self.tracer is None and self.shuffle is None
        self._current_task = _tasks.current_task
        if loop is not None:
            self._current_task = asyncio.current_task
            current_tasks = getattr(asyncio.tasks, "_current_tasks", None)
            if isinstance(asyncio.current_task, types.FunctionType) and isinstance(
                current_tasks, dict
            ):
                # Python 3.11's current_task is Python code reading this dict: read it
                # directly (one C call per waiting replica instead of two Python calls).
                self._current_task = functools.partial(current_tasks.get, loop)
        if loop is not None:
            _tasks.install_factory(loop, _on_task_created)
        else:
            _tasks.install_trio_watch(self.task_done)
        stall = self.stall_warning_seconds
        if self.tracer is not None:
            self.tracer.run_begin(self.num_replicas, self.strategy.extended.worker_devices)
        try:
            async with anyio.create_task_group() as outer:
                if stall and self.num_replicas > 1:
                    outer.start_soon(self._watch_stalls, stall, name="asyncreplica stall watch")
                async with anyio.create_task_group() as tg:
                    self._cancel_scope = tg.cancel_scope
                    order = list(range(self.num_replicas))
                    if self.shuffle is not None:
                        self.shuffle.shuffle(order)
                    for i in order:
                        tg.start_soon(
                            self._replica_main,
                            i,
                            modes[i],
                            fn,
                            args[i],
                            kwargs[i],
                            name=f"asyncreplica replica {i}",
                        )
                outer.cancel_scope.cancel()
        finally:
            self.closed = True
            if self.tracer is not None:
                self.tracer.run_end()
            if loop is not None:
                _tasks.uninstall_factory(loop)
            else:
                _tasks.uninstall_trio_watch(self.task_done)
        if self._errors:
            raise self._root_cause()
        return self._results

    def _root_cause(self) -> BaseException:
        errors = sorted(self._errors, key=lambda item: item[0])
        for replica, error in errors:
            if not isinstance(error, CollectiveError) and id(error) not in self._noted:
                error.add_note(
                    f"(raised in replica {replica + self.strategy._replica_offset} of "
                    f"{self.strategy.num_replicas_in_sync} in "
                    f"{type(self.strategy).__name__}.run)"
                )
        if len(errors) == 1:
            return errors[0][1]
        exceptions = [e for _, e in errors]
        if all(isinstance(e, Exception) for e in exceptions):
            return ExceptionGroup(
                f"{len(exceptions)} replicas failed in {type(self.strategy).__name__}.run",
                [e for e in exceptions if isinstance(e, Exception)],
            )
        return BaseExceptionGroup(
            f"{len(exceptions)} replicas failed in {type(self.strategy).__name__}.run", exceptions
        )
