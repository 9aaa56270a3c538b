"""Merged timelines across processes: every process's trace gathered to rank 0.

Split from :mod:`._group` (which creates a :class:`TraceMerger` per traced block).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from asyncreplica import AsyncReplicaError, CollectiveDeadlockError

from ._arrival import _logger, interrupt_pending, take_interrupt
from ._lifecycle import Event, State
from ._protocol import Status, cross_fields, describe_exception, fingerprint, from_wire, to_wire

if TYPE_CHECKING:
    from ._group import MPIProcessGroup

__all__ = ["TraceMerger", "agree_blocking"]

_T = TypeVar("_T")
_ANNOUNCE_SECONDS = 0.05  # as a wait at an exchange (see _group)
_MAX_SLEEP = 0.001

_FIELDS = cross_fields("trace merge", None, None, [])
_DETAIL = {"describe": "the end of strategy.trace(...)"}


class TraceMerger:
    """Gathers every process's trace to rank 0, with clocks aligned at an exchange.

    Created when ``strategy.trace(path)`` starts; :meth:`merge` is called
    (collectively) when it ends. The merge starts with an exchange on the group, like a
    collective's agreement: a process that leaves the block with an exception says so
    there, so a peer still inside a run fails at once naming it (instead of waiting
    for a collective that will never come), and a peer that exited is seen exited. Its
    waits are polled with the stall warning and the timeout, never blocked in MPI.
    """

    def __init__(self, group: MPIProcessGroup) -> None:
        self._group = group
        # An exception already being handled around the block is not the block's own.
        self._before = sys.exc_info()[1]

    def merge(
        self,
        trace: dict[str, Any],
        origin_ns: int,
        write_alone: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any] | None:
        """Every process's ``trace`` merged into one (on rank 0; None elsewhere).

        Each process's timestamps are microseconds since its own ``origin_ns``
        (``perf_counter_ns``); they are shifted so that the instant every process
        completed the merge's exchange coincides. Processes become ``pid`` = rank,
        replica tracks are renamed with global replica ids, and flow ids are made
        unique. When the processes cannot merge (a peer left the block with an
        exception while this one did not, or exited, or the group failed), rank 0 gets
        its own trace alone, and a warning says why. Where this raises on rank 0 (it
        left its block normally, a peer did not), its own trace is handed to
        ``write_alone`` first, as the peers' warning says.

        Raises:
            CollectiveError: This process left the block normally, but another process
                did not reach the end of its block (it is in a collective, failed or
                exited); the same error is raised in the peer's run.
        """
        import time

        group = self._group
        error = sys.exc_info()[1]
        if error is self._before:
            error = None
        try:
            group._to(Event.TRACE_MERGE)
        except AsyncReplicaError as exc:
            if error is None and group._state is State.RUNNING:
                raise  # the block ends inside a run: the program's mistake
            # The group failed, closed or finalized: nothing can be exchanged on it.
            return self._alone(trace, describe(exc))
        try:
            details = agree_blocking(group, _FIELDS, _DETAIL, error)
        except AsyncReplicaError as exc:
            if error is None:
                raise
            return self._alone(trace, describe(exc))
        if details is not None:
            if error is None:
                if write_alone is not None and group.rank == 0:
                    alone = self._alone(trace, "another process did not reach the end of its block")
                    if alone is not None:
                        write_alone(alone)
                group._raise_for(details)
            return self._alone(trace, "another process did not reach the end of its block")
        since = np.array([(time.perf_counter_ns() - origin_ns) / 1000.0], np.float64)
        payload = to_wire(json.dumps(trace))
        gathered = _drive_sync(group, _gather(group, since, payload))
        if gathered is None:
            return None
        sinces, docs = gathered
        return _merged(group, sinces, docs)

    def _alone(self, trace: dict[str, Any], why: str) -> dict[str, Any] | None:
        group = self._group
        _logger.warning(
            f"strategy.trace: the processes' timelines were not merged ({why}); "
            + (
                "this process (rank 0) writes its own alone."
                if group.rank == 0
                else "rank 0 writes its own."
            )
        )
        if group.rank != 0:
            return None
        doc = dict(trace)
        doc["otherData"] = {**trace.get("otherData", {}), "not merged": why}
        return doc


def describe(error: BaseException) -> str:
    """The first line of ``error``'s message, with its type."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__


def _gather(
    group: MPIProcessGroup, since: np.ndarray[Any, Any], payload: np.ndarray[Any, Any]
) -> Generator[Any, None, tuple[np.ndarray[Any, Any], list[dict[str, Any]]] | None]:
    """Every process's clock offset and trace, to rank 0 (requests in step, polled)."""
    MPI = group._MPI
    comm = group._ctl
    size, rank = group.size, group.rank
    row = np.array([since[0], float(payload.size)], np.float64)
    rows = np.empty((size, 2), np.float64)
    yield comm.Iallgather(row, rows)
    counts = [int(n) for n in rows[:, 1]]
    displs = [sum(counts[:r]) for r in range(size)]
    if rank != 0:
        yield comm.Igatherv(payload, None, root=0)
        return None
    buf = np.empty(sum(counts), np.uint8)
    yield comm.Igatherv(payload, [buf, counts, displs, MPI.BYTE], root=0)
    docs = [json.loads(from_wire(buf[d : d + n])) for d, n in zip(displs, counts, strict=True)]
    return rows[:, 0].copy(), docs


def _merged(
    group: MPIProcessGroup, sinces: np.ndarray[Any, Any], docs: list[dict[str, Any]]
) -> dict[str, Any]:
    """The processes' traces as one (see :meth:`TraceMerger.merge`)."""
    size = group.size
    events: list[dict[str, Any]] = []
    for r, doc in enumerate(docs):
        shift = float(sinces[0] - sinces[r])
        offset = group.offsets[r]
        for event in doc["traceEvents"]:
            event["pid"] = r
            if "ts" in event:
                event["ts"] = round(event["ts"] + shift, 3)
            if "id" in event and isinstance(event["id"], int):
                event["id"] = event["id"] * size + r
            args = event.get("args")
            if isinstance(args, dict):
                for key in ("replica", "dispatched_by"):
                    if isinstance(args.get(key), int):
                        args[key] += offset
            if event.get("ph") == "M" and isinstance(args, dict):
                if event.get("name") == "process_name":
                    args["name"] = f"MPI rank {r}"
                elif event.get("name") == "thread_name":
                    name = str(args.get("name", ""))
                    if name.startswith("replica "):
                        index, _, rest = name[len("replica ") :].partition(" ")
                        if index.isdigit():
                            args["name"] = f"replica {int(index) + offset}" + (
                                f" {rest}" if rest else ""
                            )
            events.append(event)
    # A process that began tracing before rank 0 (or a barrier left a little later
    # there) has events before rank 0's origin: the whole trace moves so that its
    # earliest event is at 0 (timestamps are never negative; offsets are kept).
    start = min((e["ts"] for e in events if isinstance(e.get("ts"), int | float)), default=0.0)
    moved = max(0.0, -float(start))
    if moved:
        for event in events:
            if isinstance(event.get("ts"), int | float):
                event["ts"] = round(event["ts"] + moved, 3)
    merged = dict(docs[0])
    merged["traceEvents"] = events
    clock = "microseconds since rank 0's origin"
    if moved:
        clock = f"microseconds since {moved:g} us before rank 0's origin"
    merged["otherData"] = {
        **docs[0].get("otherData", {}),
        "clock": f"{clock}; other ranks aligned at an MPI exchange",
        "processes": [doc.get("otherData", {}) for doc in docs],
        "mpi_world_size": size,
    }
    return merged


# -- exchanges outside the event loop --------------------------------------------------


def agree_blocking(
    group: MPIProcessGroup,
    fields: dict[str, Any],
    detail: dict[str, Any],
    error: BaseException | None,
) -> list[dict[str, Any]] | None:
    """One exchange from synchronous code (``strategy.trace``'s end); details if they differ.

    ``error``: the exception leaving the block, if any: this process then says
    FAILED with it (a peer still in a run fails there at once, naming it, instead
    of waiting for a collective this process will never issue). The wait is polled,
    reading the peers' notes, with the stall warning and the timeout.
    """
    if error is None:
        status, fp = Status.COLLECTIVE, fingerprint(fields)
    else:
        status, fp = Status.FAILED, 0
        detail = {**detail, "error": describe_exception(error)}
    request = group._start(status, detail, fp, (), None)
    if request is None:
        return None
    if status is Status.FAILED and not request.Test():
        group._tell_ending(status)  # a peer whose run waits nowhere makes it (watch_peers)
    pending = group._pending
    _poll(group, request, group._number - 1)
    if group._unanimous():
        group._last = pending
        return None
    details = _drive_sync(group, group._details(status, fields, detail))
    gone = [d["rank"] for d in details if Status(d["status"]) is Status.EXITED]
    if gone:
        group._departed = gone
        group._to(Event.PEER_EXITED)
    return details


def _poll(group: MPIProcessGroup, request: Any, exchange: int) -> None:
    """Wait for ``request`` from synchronous code: polled, with stall warning and timeout."""
    start = time.perf_counter()
    stall = group.stall_warning_seconds
    warned = False
    announced = False
    cycle = False
    delay = 1e-5
    # Under asyncio's runner, a Ctrl-C only cancels the main task, which this wait (it
    # blocks the loop's thread) cannot take: it is said at once, as in a collective's
    # wait; a second Ctrl-C raises KeyboardInterrupt here, and the peers are told.
    interrupts = True
    try:
        while not request.Test():
            group._read_notes()
            if interrupts and interrupt_pending():
                interrupts = False  # said once
                take_interrupt()
                _logger.warning(group._interrupt_message(exchange))
            waited = time.perf_counter() - start
            if not announced and waited >= _ANNOUNCE_SECONDS:
                announced = True
                group._tell_peers(
                    {"kind": "waiting", "number": exchange, "what": group._waiting_what()}
                )
                group._tell_other_groups(True, blocked=True)
            if announced:
                # This wait blocks the thread: a peer blocked on another strategy that
                # waits for this process is a certain deadlock (raised at once).
                try:
                    group._raise_if_blocked_cycle(exchange)
                except CollectiveDeadlockError:
                    cycle = True  # the peers keep this process's note (see the docstring)
                    raise
            if stall and not warned and waited >= stall:
                warned = True
                _logger.warning(group._stall_message(exchange, waited))
            if group.timeout is not None and waited >= group.timeout:
                group._timed_out(None, None)
            time.sleep(delay)
            delay = min(delay * 2, _MAX_SLEEP)
    except (AsyncReplicaError, GeneratorExit):
        # A timeout or a cycle (the peers are told, or see it alike), or a peer's
        # failure (they know it): out of step, nothing more to say.
        group._break("a cross-process exchange was abandoned")
        raise
    except BaseException as exc:
        # An interruption (Ctrl-C, a SIGTERM handler's SystemExit) or any other
        # exception while posted: the peers are told, as in a collective's exchange,
        # so that a peer still busy in its block raises ReplicaExitedError naming it;
        # the exit hook waits for their acknowledgement before it ends the job.
        group.abandoned_by(exc, "a cross-process exchange was abandoned", stage="exchange")
        raise
    finally:
        if announced and not cycle:
            group._tell_other_groups(False)
    if warned:
        _logger.warning(
            f"Collective resumed: the processes completed {group._waiting_what()} after "
            f"{time.perf_counter() - start:.1f} s; the stall warning above was not a hang."
        )


def _drive_sync(group: MPIProcessGroup, steps: Generator[Any, None, _T]) -> _T:
    """Drive ``steps`` (requests every process posts in step) from synchronous code."""
    try:
        request = next(steps)
        while True:
            _poll(group, request, group._number - 1)
            request = steps.send(None)
    except StopIteration as stop:
        result: _T = stop.value
        return result
