"""One ``Strategy.run``: replica tasks, rendezvous, failure handling.

Rendezvous: the last replica to arrive at a position dispatches the backend
operation in its own task, then wakes the others. Nobody polls; no thread per
replica. The ledger decides everything about agreement; this module only acts on its
answers: dispatch, wait, or fail the run.

Failure: the first error (a replica's exception, a ledger error, a timeout) is
recorded as a *root cause* and the run's cancel scope is cancelled, so every other
replica is cancelled, not reported. ``Strategy.run`` raises the root cause itself
(with a note naming the replica) or, if several replicas failed independently before
the cancellation reached them, an ``ExceptionGroup`` of them in replica order.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel

from .._core._ledger import Ledger
from .._core._signature import Signature
from .._exceptions import CollectiveError
from ._mode import MODE, Mode

if TYPE_CHECKING:
    from ..abc import Backend
    from ._strategy import Strategy

__all__ = ["Run"]

Dispatch = Callable[[list[Any]], Awaitable[Sequence[Any]]]


class _Slot:
    """The payloads of one position and, once dispatched, the results."""

    __slots__ = ("event", "payloads", "results")

    def __init__(self, num_replicas: int) -> None:
        self.payloads: list[Any] = [None] * num_replicas
        self.event = anyio.Event()
        self.results: Sequence[Any] = ()


class Run:
    """The state of one ``Strategy.run`` call.

    Args:
        strategy: The strategy that runs.
        backend: Its backend.
        check_call_sites: Whether call paths must agree.
    """

    def __init__(self, strategy: Strategy, backend: Backend, *, check_call_sites: bool) -> None:
        self.strategy = strategy
        self.backend = backend
        self.num_replicas = strategy.num_replicas_in_sync
        self.ledger = Ledger(self.num_replicas, check_call_sites=check_call_sites)
        self.closed = False
        self._slots: dict[int, _Slot] = {}
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

    def _fail(self, replica: int, error: BaseException) -> None:
        if not any(e is error for _, e in self._errors):
            self._errors.append((replica, error))
        if self._cancel_scope is not None:
            self._cancel_scope.cancel()

    async def collective(
        self,
        replica: int,
        signature: Signature,
        payload: object,
        dispatch: Dispatch,
        wait_limit: float | None,
    ) -> Any:
        """Meet the other replicas at this replica's next position.

        Args:
            replica: The arriving replica.
            signature: Its collective's signature.
            payload: What it contributes (its leaves, or merge_call's arguments).
            dispatch: Called once, by the last arrival, with every replica's
                payload in replica order; returns one result per replica.
            wait_limit: Seconds to wait before ``CollectiveTimeoutError``; None or 0
                waits for ever.

        Returns:
            This replica's result.
        """
        if self.failed:
            # The run is being torn down; this raises the cancellation.
            await anyio.lowlevel.checkpoint()
        try:
            position, complete = self.ledger.arrive(replica, signature)
        except CollectiveError as exc:
            self._fail(replica, exc)
            raise
        slot = self._slots.get(position)
        if slot is None:
            slot = self._slots[position] = _Slot(self.num_replicas)
        slot.payloads[replica] = payload
        if complete:
            del self._slots[position]
            slot.results = await dispatch(slot.payloads)
            slot.event.set()
            return slot.results[replica]
        if wait_limit:
            with anyio.move_on_after(wait_limit):
                await slot.event.wait()
            if not slot.event.is_set():
                if self.failed:
                    await anyio.lowlevel.checkpoint()
                error = self.ledger.timeout_error(position, wait_limit, {})
                self._fail(replica, error)
                raise error
        else:
            await slot.event.wait()
        return slot.results[replica]

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
        try:
            result = fn(*args, **kwargs)
            if inspect.isawaitable(result):
                result = await result
        except Exception as exc:
            self.ledger.fail(replica)
            self._fail(replica, exc)
            return
        except BaseException:
            self.ledger.cancel(replica)
            raise
        self._results[replica] = result
        try:
            self.ledger.finish(replica)
        except CollectiveError as exc:
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
            async with anyio.create_task_group() as tg:
                self._cancel_scope = tg.cancel_scope
                for i in range(self.num_replicas):
                    tg.start_soon(
                        self._replica_main,
                        i,
                        modes[i],
                        fn,
                        args[i],
                        kwargs[i],
                        name=f"asyncreplica replica {i}",
                    )
        finally:
            self.closed = True
        if self._errors:
            raise self._root_cause()
        return self._results

    def _root_cause(self) -> BaseException:
        errors = sorted(self._errors, key=lambda item: item[0])
        for replica, error in errors:
            if not isinstance(error, CollectiveError) and id(error) not in self._noted:
                error.add_note(
                    f"(raised in replica {replica} of {self.num_replicas} in "
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
