"""Recording runs: the tracer that implements a run's tracing hooks, and its ring buffer.

:class:`ChromeTracer` implements :class:`asyncreplica._runtime._trace.Tracer`: it reads
the clock at each hook, keeps the most recent ``max_events`` events (whole
collectives, so flow arrows always pair up) and every failure with each replica's
flight recorder, and writes them as Chrome trace-event JSON (built by
:mod:`._chrome`), optionally rewriting a file after runs (``autosave``).
"""

from __future__ import annotations

import contextlib
import gzip
import json
import logging
import os
from collections import deque
from collections.abc import Mapping
from contextvars import ContextVar
from time import perf_counter_ns, time_ns
from typing import TYPE_CHECKING, Any

from .._core._ledger import ReplicaState
from ._chrome import _Builder
from ._records import _Collective, _failure, _RunState

if TYPE_CHECKING:
    from .._core._ledger import Key, Report
    from .._core._signature import Signature

__all__ = [
    "AUTOSAVE_OVERHEAD",
    "DEFAULT_MAX_EVENTS",
    "MAX_FAILURES",
    "ChromeTracer",
    "PathLike",
    "write_json",
]

DEFAULT_MAX_EVENTS = 1_000_000
"""How many events a tracer keeps by default (older ones are dropped)."""

MAX_FAILURES = 64
"""How many failures (each with every replica's flight recorder) a tracer keeps."""

AUTOSAVE_OVERHEAD = 0.1
"""With ``autosave``, the fraction of wall time that rewriting the file may take."""

logger = logging.getLogger("asyncreplica")

PathLike = str | os.PathLike[str]


def _key(position: int, signature: Signature) -> Key:
    """The key of a replica's collective at ``position`` (by name when it has one)."""
    return position if signature.name is None else (signature.name, position)


# The run each tracer is recording, for the task that reads it: replica tasks inherit
# it from the task that started the run, so concurrent runs on one tracer stay apart.
_RUNS: ContextVar[Mapping[int, _RunState] | None] = ContextVar("asyncreplica_trace", default=None)


class ChromeTracer:
    """Records runs as Chrome trace events (see the module docstring).

    It implements the run's tracing hooks; the hooks read the clock
    (``time.perf_counter_ns``) and never raise into the run. Use it through
    :meth:`Strategy.trace <asyncreplica.Strategy.trace>` or ``ASYNCREPLICA_TRACE``.

    Args:
        max_events: How many events to keep; older collectives are dropped whole, and
            the trace says how many events were dropped.
        autosave: A path to rewrite after each run (throttled so that writing takes at
            most a tenth of the wall time; always after a failed run), or None.

    Raises:
        ValueError: ``max_events`` is not a positive integer.
    """

    def __init__(self, *, max_events: int = DEFAULT_MAX_EVENTS, autosave: PathLike | None = None):
        if isinstance(max_events, bool) or not isinstance(max_events, int) or max_events < 1:
            raise ValueError(f"max_events must be a positive integer, got {max_events!r}")
        self.max_events = max_events
        self.autosave = None if autosave is None else os.path.abspath(os.fspath(autosave))
        self._pid = os.getpid()
        self._origin = perf_counter_ns()
        self._origin_unix_ns = time_ns()
        self._records: deque[_Collective | _RunState] = deque()
        self._size = 0
        self._dropped_events = 0
        self._dropped_collectives = 0
        self._failures: deque[dict[str, Any]] = deque(maxlen=MAX_FAILURES)
        self._active: list[_RunState] = []
        self._runs = 0
        self._ids = 0
        self._max_replicas = 0
        self._dirty = False
        self._saved_at: int | None = None
        self._save_cost = 0

    # -- the hooks ----------------------------------------------------------------------

    def _state(self) -> _RunState | None:
        runs = _RUNS.get()
        state = None if runs is None else runs.get(id(self))
        if state is not None and state.end is None:
            return state
        # A callback outside the run's tasks: the most recent run still going.
        return self._active[-1] if self._active else None

    def run_begin(self, num_replicas: int, devices: tuple[str, ...]) -> None:
        """Start recording a run."""
        runs = _RUNS.get() or {}
        state = _RunState(self._runs, num_replicas, tuple(devices), perf_counter_ns(), None)
        state.outer = runs.get(id(self))
        self._runs += 1
        self._max_replicas = max(self._max_replicas, num_replicas)
        self._active.append(state)
        _RUNS.set({**runs, id(self): state})

    def arrive(self, replica: int, key: Key, signature: Signature) -> None:
        """Record ``replica``'s arrival at collective ``key``."""
        now = perf_counter_ns()
        state = self._state()
        if state is None:
            return
        record = self._open(state, key)
        record.arrivals[replica] = now
        record.signatures[replica] = signature
        record.pending += 1

    def _open(self, state: _RunState, key: Key) -> _Collective:
        """The record of collective ``key`` of the run ``state`` (created if new)."""
        record = state.open.get(key)
        if record is None:
            record = state.open[key] = _Collective(self._ids, state.index, key, state.num_replicas)
            self._ids += 1
        return record

    def dispatch_begin(self, key: Key, replica: int, signature: Signature) -> None:
        """Record that ``replica``, the last to arrive, dispatches ``key``."""
        now = perf_counter_ns()
        state = self._state()
        record = None if state is None else state.open.get(key)
        if record is not None:
            record.last = replica
            record.d0 = now

    def dispatch_end(self, key: Key) -> None:
        """Record the end of ``key``'s backend work."""
        now = perf_counter_ns()
        state = self._state()
        record = None if state is None else state.open.get(key)
        if record is not None:
            record.d1 = now

    def resume(self, replica: int, key: Key) -> None:
        """Record that ``replica`` has its result of ``key``."""
        now = perf_counter_ns()
        state = self._state()
        record = None if state is None else state.open.get(key)
        if record is None:
            return
        record.resumes[replica] = now
        record.pending -= 1
        if record.pending <= 0 and record.d1 is not None:
            del state.open[key]  # type: ignore[union-attr]
            self._push(record)

    def failed(self, error: BaseException, report: Report | None) -> None:
        """Record a failure of the run with every replica's flight recorder."""
        now = perf_counter_ns()
        state = self._state()
        if state is not None:
            state.failed = True
        try:
            if state is not None:
                self._refused(state, error, report, now)
            self._failures.append(_failure(error, report, now, state))
        except Exception:  # never raise into the run  # pragma: no cover
            logger.exception("asyncreplica tracing could not record a failure")
        self._dirty = True

    def _refused(
        self, state: _RunState, error: BaseException, report: Report | None, now: int
    ) -> None:
        """Give every replica left waiting its pending slice, from ``now`` on.

        An arrival that the ledger refused (a mismatch, a collective after a replica
        finished) raised before the run could report it; the error and its report
        still say where each replica waits. A mismatch marks the refused arrival.
        """
        position = getattr(error, "position", None)
        name = getattr(error, "name", None)
        key: Key | None = None
        if isinstance(position, int) and (name is None or isinstance(name, str)):
            key = position if name is None else (name, position)
        rows = {} if report is None else {row.replica_id: row for row in report.rows}

        def waits(replica: int) -> bool:
            # This run's ledger has it waiting (ids of other processes are not ours).
            row = rows.get(replica)
            return row is not None and row.state is ReplicaState.WAITING

        found: list[tuple[int, Key, Signature, bool]] = []
        signatures = getattr(error, "signatures", None)
        if key is not None and isinstance(signatures, dict):  # a mismatch
            found += [
                (r, key, sig, True) for r, sig in signatures.items() if report is None or waits(r)
            ]
        # Every other replica the report has waiting (a ReplicaExitedError raised at an
        # arrival, after another replica finished, refused that arrival).
        for row in rows.values():
            sig = row.signature
            if row.state is ReplicaState.WAITING and sig is not None:
                found.append((row.replica_id, _key(row.position, sig), sig, False))
        for replica, at, signature, mismatch in found:
            if not 0 <= replica < state.num_replicas:
                continue
            record = self._open(state, at)
            if record.arrivals[replica] is None:
                record.arrivals[replica] = now
                record.signatures[replica] = signature
                if mismatch:
                    record.rejected = replica

    def run_end(self, *, cancelled: bool = False) -> None:
        """Finish recording the run: close what never completed; autosave.

        Args:
            cancelled: The run was cancelled by a scope around it (not a failure).
        """
        now = perf_counter_ns()
        state = self._state()
        if state is None:
            return
        state.end = now
        state.cancelled = cancelled
        for record in sorted(state.open.values(), key=lambda r: r.id):
            record.closed_at = now
            record.cancelled = cancelled
            self._push(record)
        state.open.clear()
        self._active.remove(state)
        runs = dict(_RUNS.get() or {})
        if state.outer is None:
            runs.pop(id(self), None)
        else:
            runs[id(self)] = state.outer
        _RUNS.set(runs)
        self._push(state)
        if self.autosave is not None and self._autosave_due(now, state.failed):
            self.save()

    # -- the ring buffer -------------------------------------------------------------

    def _push(self, record: _Collective | _RunState) -> None:
        self._records.append(record)
        self._size += record.cost() if isinstance(record, _Collective) else 1
        self._dirty = True
        while self._size > self.max_events and len(self._records) > 1:
            old = self._records.popleft()
            cost = old.cost() if isinstance(old, _Collective) else 1
            self._size -= cost
            self._dropped_events += cost
            self._dropped_collectives += isinstance(old, _Collective)

    # -- writing ----------------------------------------------------------------------

    def _autosave_due(self, now: int, failed: bool) -> bool:
        if failed or self._saved_at is None:
            return True
        return now - self._saved_at >= self._save_cost / AUTOSAVE_OVERHEAD

    def save(self) -> None:
        """Write to the ``autosave`` path if anything changed; log (not raise) errors."""
        if self.autosave is None or not self._dirty:
            return
        started = perf_counter_ns()
        try:
            self.write(self.autosave)
        except OSError as exc:
            logger.warning("asyncreplica could not write the trace %s: %s", self.autosave, exc)
        finished = perf_counter_ns()
        self._saved_at = finished
        self._save_cost = finished - started

    def write(self, path: PathLike) -> None:
        """Write the trace to ``path`` (gzip-compressed if it ends in ``.gz``).

        The file is replaced atomically, so a reader never sees half a trace.

        Args:
            path: Where to write.

        Raises:
            OSError: The file cannot be written.
        """
        write_json(path, self.to_json())
        self._dirty = False

    def to_json(self) -> dict[str, Any]:
        """The trace as a JSON-ready object in Chrome's trace-event object format."""
        return _Builder(self).build()


def write_json(path: PathLike, trace: dict[str, Any]) -> None:
    """Write a trace object to ``path`` atomically (gzip-compressed if it ends in ``.gz``)."""
    path = os.fspath(path)
    data = json.dumps(trace, separators=(",", ":")).encode("utf-8")
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            if path.endswith(".gz"):
                with gzip.GzipFile(fileobj=f, mode="wb", mtime=0) as gz:
                    gz.write(data)
            else:
                f.write(data)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
