"""Timelines of runs: a Chrome trace-event recorder, its summary and its picture.

:class:`ChromeTracer` implements the tracing hooks of a run
(:class:`asyncreplica._runtime._trace.Tracer`) and writes what it saw as Chrome
trace-event JSON, which ui.perfetto.dev and ``chrome://tracing`` open:

* one process (this one), with one track per replica (``replica 0``, ...), a
  ``backend`` track and a ``runs`` track;
* one complete (``X``) event per collective per replica, from the replica's arrival
  to its resumption, with the collective's kind, reduce op, position (or name and
  occurrence), value, bytes, dtype, call site and the time the replica waited for
  the others in ``args``;
* one ``X`` event per reduction on the backend track, with a flow arrow from the
  replica that arrived last (and so dispatched it) to the reduction;
* when a run fails, an instant event on every replica's track with that replica's
  flight-recorder history (its last collectives) and a global instant event with
  the error message; the collectives that never completed end at the end of the run.

Events on one track nest properly (Perfetto's rule): collectives of one replica that
overlap without nesting (named collectives in flight together, concurrent runs) are
put on extra tracks (``replica 0 (overlap 1)``).

Memory stays bounded: the tracer keeps the most recent ``max_events`` events (a ring
buffer of whole collectives, so flow arrows always pair up) and says in the trace how
many it dropped. A path that ends in ``.gz`` is written gzip-compressed.

Ways to turn tracing on: ``with strategy.trace("trace.json"): ...`` around runs, or the
environment variable ``ASYNCREPLICA_TRACE=FILE`` for an unmodified program (every
``MirroredStrategy`` created while it is set traces into ``FILE``, which is written
after runs and when the interpreter exits). Tracing off costs one ``is None`` test per
event in the run.

:func:`summarize` turns a trace into a short text report (who waited, who was late,
where, and what failed); :func:`plot` draws it as a PNG with matplotlib.
"""

from __future__ import annotations

import atexit
import contextlib
import gzip
import importlib
import json
import logging
import math
import os
import re
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from contextvars import ContextVar
from pathlib import Path
from time import perf_counter_ns, time_ns
from typing import TYPE_CHECKING, Any

from ._core._ledger import key_index
from ._version import __version__

if TYPE_CHECKING:
    from ._core._ledger import Key, Report
    from ._core._signature import LeafSpec, Signature
    from ._runtime._strategy import Strategy
    from ._runtime._trace import Tracer

__all__ = [
    "DEFAULT_MAX_EVENTS",
    "ENV_VAR",
    "ChromeTracer",
    "load_trace",
    "plot",
    "summarize",
    "trace_from_environment",
    "traced",
]

DEFAULT_MAX_EVENTS = 1_000_000
"""How many events a tracer keeps by default (older ones are dropped)."""

ENV_VAR = "ASYNCREPLICA_TRACE"
"""The environment variable that turns tracing on for every ``MirroredStrategy``."""

MAX_FAILURES = 64
"""How many failures (each with every replica's flight recorder) a tracer keeps."""

AUTOSAVE_OVERHEAD = 0.1
"""With ``autosave``, the fraction of wall time that rewriting the file may take."""

logger = logging.getLogger("asyncreplica")

PathLike = str | os.PathLike[str]

# The run each tracer is recording, for the task that reads it: replica tasks inherit
# it from the task that started the run, so concurrent runs on one tracer stay apart.
_RUNS: ContextVar[Mapping[int, _RunState] | None] = ContextVar("asyncreplica_trace", default=None)


# -- recording ------------------------------------------------------------------------


class _RunState:
    """One run being recorded, and, once ended, its record in the ring buffer."""

    __slots__ = ("begin", "devices", "end", "failed", "index", "num_replicas", "open", "outer")

    def __init__(
        self,
        index: int,
        num_replicas: int,
        devices: tuple[str, ...],
        begin: int,
        outer: _RunState | None,
    ) -> None:
        self.index = index
        self.num_replicas = num_replicas
        self.devices = devices
        self.begin = begin
        self.end: int | None = None
        self.failed = False
        self.open: dict[Key, _Collective] = {}
        self.outer = outer  # the run this one is nested in (a run from a merge_fn)


class _Collective:
    """One collective of one run: every replica's arrival and resumption, the dispatch."""

    __slots__ = (
        "arrivals",
        "closed_at",
        "d0",
        "d1",
        "id",
        "key",
        "last",
        "pending",
        "rejected",
        "resumes",
        "run",
        "signatures",
    )

    def __init__(self, ident: int, run: int, key: Key, num_replicas: int) -> None:
        self.id = ident
        self.run = run
        self.key = key
        self.arrivals: list[int | None] = [None] * num_replicas
        self.resumes: list[int | None] = [None] * num_replicas
        self.signatures: list[Signature | None] = [None] * num_replicas
        self.last: int | None = None  # the replica that dispatched it
        self.d0: int | None = None  # dispatch began
        self.d1: int | None = None  # dispatch ended
        self.pending = 0  # replicas arrived and not yet resumed
        self.closed_at: int | None = None  # run end, for a collective that never completed
        self.rejected: int | None = None  # the replica whose arrival a mismatch refused

    def cost(self) -> int:
        """How many trace events this collective becomes (its slices)."""
        return sum(t is not None for t in self.arrivals) + (self.d0 is not None)


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
        record = state.open.get(key)
        if record is None:
            record = state.open[key] = _Collective(self._ids, state.index, key, state.num_replicas)
            self._ids += 1
        record.arrivals[replica] = now
        record.signatures[replica] = signature
        record.pending += 1

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
                self._rejected(state, error, now)
            self._failures.append(_failure(error, report, now, state))
        except Exception:  # never raise into the run  # pragma: no cover
            logger.exception("asyncreplica tracing could not record a failure")
        self._dirty = True

    def _rejected(self, state: _RunState, error: BaseException, now: int) -> None:
        """Show the arrival that a mismatch refused (the run never reported it)."""
        signatures = getattr(error, "signatures", None)
        position = getattr(error, "position", None)
        if not isinstance(signatures, dict) or not isinstance(position, int):
            return
        name = getattr(error, "name", None)
        key: Key = position if name is None else (name, position)
        record = state.open.get(key)
        if record is None:
            return
        for replica, signature in signatures.items():
            if 0 <= replica < len(record.arrivals) and record.arrivals[replica] is None:
                record.arrivals[replica] = now
                record.signatures[replica] = signature
                record.rejected = replica

    def run_end(self) -> None:
        """Finish recording the run: close what never completed; autosave."""
        now = perf_counter_ns()
        state = self._state()
        if state is None:
            return
        state.end = now
        for record in sorted(state.open.values(), key=lambda r: r.id):
            record.closed_at = now
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


class _Tee:
    """Forwards a run's hooks to several tracers (nested ``trace()`` blocks)."""

    def __init__(self, tracers: Sequence[Tracer]) -> None:
        self.tracers = tuple(tracers)

    def run_begin(self, num_replicas: int, devices: tuple[str, ...]) -> None:
        for t in self.tracers:
            t.run_begin(num_replicas, devices)

    def arrive(self, replica: int, key: Key, signature: Signature) -> None:
        for t in self.tracers:
            t.arrive(replica, key, signature)

    def dispatch_begin(self, key: Key, replica: int, signature: Signature) -> None:
        for t in self.tracers:
            t.dispatch_begin(key, replica, signature)

    def dispatch_end(self, key: Key) -> None:
        for t in self.tracers:
            t.dispatch_end(key)

    def resume(self, replica: int, key: Key) -> None:
        for t in self.tracers:
            t.resume(replica, key)

    def failed(self, error: BaseException, report: Report | None) -> None:
        for t in self.tracers:
            t.failed(error, report)

    def run_end(self) -> None:
        for t in self.tracers:
            t.run_end()


def _attach(strategy: Strategy, tracer: ChromeTracer) -> Tracer | None:
    """Make ``strategy``'s runs report to ``tracer`` too; return the previous tracer."""
    previous = strategy._tracer
    strategy._tracer = tracer if previous is None else _Tee((previous, tracer))
    return previous


def _check_path(path: object) -> str:
    if not isinstance(path, str | os.PathLike):
        raise TypeError(f"the trace path must be a str or os.PathLike, got {path!r}")
    path = os.path.abspath(os.fspath(path))
    folder = os.path.dirname(path)
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"cannot write a trace to {path}: {folder} is not a directory")
    return path


@contextlib.contextmanager
def traced(
    strategy: Strategy, path: PathLike, *, max_events: int = DEFAULT_MAX_EVENTS
) -> Iterator[ChromeTracer]:
    """Trace ``strategy``'s runs in the block; write ``path`` when it exits (also on error).

    This is :meth:`Strategy.trace <asyncreplica.Strategy.trace>`.

    Args:
        strategy: The strategy whose runs to record.
        path: The trace file (``.json``, or ``.json.gz`` for gzip).
        max_events: How many events to keep (the most recent).

    Yields:
        The tracer.

    Raises:
        TypeError: ``path`` is not a path.
        FileNotFoundError: ``path``'s folder does not exist (checked before the block).
        ValueError: ``max_events`` is not a positive integer.
    """
    target = _check_path(path)
    tracer = ChromeTracer(max_events=max_events)
    # Under MPI, every process records its own runs and rank 0 writes one merged file.
    session = getattr(strategy._group, "trace_session", None)
    merger = session() if session is not None else None
    previous = _attach(strategy, tracer)
    try:
        yield tracer
    finally:
        strategy._tracer = previous
        if merger is None:
            tracer.write(target)
        else:
            merged = merger.merge(tracer.to_json(), tracer._origin)
            if merged is not None:
                write_json(target, merged)


_ENV_TRACERS: dict[str, ChromeTracer] = {}


def trace_from_environment(strategy: Strategy) -> None:
    """Trace ``strategy``'s runs into ``$ASYNCREPLICA_TRACE`` if that variable is set.

    Every strategy traced to one file shares one tracer. The file is written after
    runs (throttled; always after a failed run) and when the interpreter exits.

    Args:
        strategy: A newly created strategy.
    """
    target = os.environ.get(ENV_VAR)
    if not target:
        return
    path = os.path.abspath(target)
    tracer = _ENV_TRACERS.get(path)
    if tracer is None:
        tracer = _ENV_TRACERS[path] = ChromeTracer(autosave=path)
        atexit.register(tracer.save)
    _attach(strategy, tracer)


# -- turning records into events ------------------------------------------------------

_ITEMSIZES = {"bool": 1, "bool_": 1, "half": 2, "single": 4, "double": 8, "longdouble": 16}
_BITS = re.compile(r"^[a-z_]*?(\d+)")


def _itemsize(dtype: str) -> int | None:
    """Bytes per element of the dtype named ``dtype`` (``"float32"`` -> 4), if known."""
    found = _ITEMSIZES.get(dtype)
    if found is not None:
        return found
    match = _BITS.match(dtype)
    if match is None:
        return None
    bits = int(match.group(1))
    return bits // 8 if bits % 8 == 0 and bits > 0 else None


def _nbytes(leaves: Sequence[LeafSpec]) -> int | None:
    """The bytes of a value's leaves, or None if a dtype is unknown or a leaf is sparse."""
    total = 0
    for leaf in leaves:
        size = _itemsize(leaf.dtype)
        if size is None or leaf.sparse:
            return None
        total += math.prod(leaf.shape) * size
    return total


def _label(signature: Signature) -> str:
    """A slice name: ``all_reduce(SUM)``, ``barrier 'sync'``."""
    args = [
        text
        for text in (
            None if signature.op is None else signature.op.value,
            None if signature.axis is None else f"axis={signature.axis}",
            None if signature.source is None else f"source={signature.source}",
            signature.merge_fn_name,
        )
        if text is not None
    ]
    label = f"{signature.kind.value}({', '.join(args)})"
    return label if signature.name is None else f"{label} {signature.name!r}"


def _where(signature: Signature | None) -> str | None:
    if signature is None or signature.call_site is None:
        return None
    return str(signature.call_site)


def _history_entry(seq: int, signature: Signature) -> dict[str, Any]:
    return {"seq": seq, "collective": signature.describe(), "call_site": _where(signature)}


def _failure(
    error: BaseException, report: Report | None, now: int, state: _RunState | None
) -> dict[str, Any]:
    """A failure as plain data: the error and every replica's flight recorder."""
    message = str(error)
    replicas = []
    if report is not None:
        for row in report.rows:
            replicas.append(
                {
                    "replica": row.replica_id,
                    "state": row.state.value,
                    "position": row.position,
                    "collective": None if row.signature is None else row.signature.describe(),
                    "call_site": _where(row.signature),
                    "history": [_history_entry(seq, sig) for seq, sig in row.history],
                }
            )
    fields = getattr(error, "fields", None)
    position = getattr(error, "position", None)
    return {
        "time_ns": now,
        "run": None if state is None else state.index,
        "type": type(error).__name__,
        "message": message,
        "first_line": message.splitlines()[0] if message else type(error).__name__,
        "position": position if isinstance(position, int) else None,
        "name": getattr(error, "name", None) if isinstance(error, Exception) else None,
        "fields": list(fields) if isinstance(fields, tuple | list) else None,
        "replicas": replicas,
    }


Track = tuple[str, int]
"""A track before lanes: ``("replica", r)``, ``("backend", 0)`` or ``("runs", 0)``."""


class _Builder:
    """Turns a tracer's records into the trace-event object."""

    def __init__(self, tracer: ChromeTracer) -> None:
        self.tracer = tracer
        self.pid = tracer._pid
        self.origin = tracer._origin
        self.slices: dict[Track, list[tuple[int, int, dict[str, Any]]]] = {}
        self.flows: list[tuple[dict[str, Any], dict[str, Any]]] = []  # flow event, its slice
        self.instants: list[tuple[Track, dict[str, Any]]] = []
        self.tids: dict[tuple[Track, int], int] = {}
        self.overflow = 0  # extra lanes so far
        self.described: dict[Any, tuple[str, dict[str, Any]]] = {}
        self.sites: dict[Any, str] = {}

    def us(self, ns: int) -> float:
        """A timestamp in microseconds since the tracer started."""
        return round((ns - self.origin) / 1000, 3)

    def slice(self, track: Track, start: int, end: int, event: dict[str, Any]) -> dict[str, Any]:
        event.update(ph="X", ts=self.us(start), dur=round((end - start) / 1000, 3), pid=self.pid)
        self.slices.setdefault(track, []).append((start, end, event))
        return event

    def build(self) -> dict[str, Any]:
        """The object: ``traceEvents``, ``displayTimeUnit`` and ``otherData``."""
        tracer = self.tracer
        first: int | None = None
        for record in tracer._records:
            if isinstance(record, _RunState):
                self.add_run(record)
                start = record.begin
            else:
                start = self.add_collective(record)
            first = start if first is None else min(first, start)
        for failure in tracer._failures:
            self.add_failure(failure)
        if tracer._dropped_events:
            self.instants.append(
                (
                    ("runs", 0),
                    {
                        "name": f"{tracer._dropped_events} earlier events dropped",
                        "cat": "asyncreplica",
                        "ph": "i",
                        "s": "g",
                        "ts": self.us(first if first is not None else tracer._origin),
                        "pid": self.pid,
                        "args": {"max_events": tracer.max_events},
                    },
                )
            )
        events = self.metadata_and_lanes()
        for flow, bound in self.flows:
            flow["tid"] = bound["tid"]
        body = [event for track in self.slices.values() for _, _, event in track]
        for track, event in self.instants:
            event["tid"] = self.tid(track, 0)
        body.extend(event for _, event in self.instants)
        body.extend(flow for flow, _ in self.flows)
        body.sort(key=lambda e: (e["ts"], -e.get("dur", 0)))
        events.extend(body)
        return {
            "traceEvents": events,
            "displayTimeUnit": "ns",
            "otherData": {
                "producer": f"asyncreplica {__version__}",
                "clock": "time.perf_counter_ns, microseconds since origin",
                "origin_unix_ns": tracer._origin_unix_ns,
                "pid": self.pid,
                "runs": tracer._runs,
                "max_events": tracer.max_events,
                "events_kept": tracer._size,
                "dropped_events": tracer._dropped_events,
                "dropped_collectives": tracer._dropped_collectives,
                "failures": [
                    {k: v for k, v in f.items() if k != "time_ns"} for f in tracer._failures
                ],
            },
        }

    def add_run(self, run: _RunState) -> None:
        end = run.end if run.end is not None else run.begin
        self.slice(
            ("runs", 0),
            run.begin,
            end,
            {
                "name": f"run {run.index}" + (" (failed)" if run.failed else ""),
                "cat": "run",
                "args": {
                    "run": run.index,
                    "num_replicas": run.num_replicas,
                    "devices": list(run.devices),
                    "status": "failed" if run.failed else "ok",
                },
            },
        )

    def add_collective(self, record: _Collective) -> int:
        arrived = [t for t in record.arrivals if t is not None]
        first, last_arrival = min(arrived), max(arrived)
        complete = record.closed_at is None
        reference = next(s for s in record.signatures if s is not None)
        label, described = self.describe(reference)
        common: dict[str, Any] = dict(described)
        if isinstance(record.key, int):
            common["position"] = record.key
        else:
            common["name"] = record.key[0]
            common["occurrence"] = key_index(record.key)
        common.update(
            run=record.run,
            collective=record.id,
            late_us=round((last_arrival - first) / 1000, 3) if complete else None,
            status="completed" if complete else "never completed: the run failed",
        )
        name = label if complete else f"{label} (never completed)"
        late_slice: dict[str, Any] | None = None
        for replica, start in enumerate(record.arrivals):
            if start is None:
                continue
            resumed = record.resumes[replica]
            end = resumed if resumed is not None else record.closed_at or start
            waited = (last_arrival if complete else end) - start
            event = self.slice(
                ("replica", replica),
                start,
                end,
                {
                    "name": name,
                    "cat": "collective",
                    "args": {
                        **common,
                        "replica": replica,
                        "call_site": self.where(record.signatures[replica]),
                        "waited_us": round(waited / 1000, 3),
                        "arrived_last": replica == record.last,
                        "mismatched": replica == record.rejected,
                    },
                },
            )
            if replica == record.last:
                late_slice = event
        if record.d0 is not None:
            d1 = record.d1 if record.d1 is not None else record.closed_at or record.d0
            dispatch = self.slice(
                ("backend", 0),
                record.d0,
                d1,
                {
                    "name": label,
                    "cat": "dispatch",
                    "args": {**common, "dispatched_by": record.last},
                },
            )
            if late_slice is not None:
                mid = self.us((record.d0 + d1) // 2)
                flow = {"name": "dispatch", "cat": "dispatch", "id": record.id, "pid": self.pid}
                self.flows.append(({**flow, "ph": "s", "ts": mid}, late_slice))
                self.flows.append(({**flow, "ph": "f", "bp": "e", "ts": mid}, dispatch))
        return first

    def describe(self, signature: Signature) -> tuple[str, dict[str, Any]]:
        """The slice name and the args that describe a collective (cached)."""
        key: Signature | None = signature._replace(call_path=())
        try:
            return self.described[key]
        except KeyError:
            pass
        except TypeError:  # an unhashable part: describe it every time
            key = None
        dtypes = sorted({leaf.dtype for leaf in signature.leaves})
        args: dict[str, Any] = {"kind": signature.kind.value}
        if signature.op is not None:
            args["op"] = signature.op.value
        args.update(
            value=signature.value_str() if signature.leaves else None,
            bytes=_nbytes(signature.leaves),
            dtype=",".join(dtypes) if dtypes else None,
        )
        found = (_label(signature), args)
        if key is not None:
            self.described[key] = found
        return found

    def where(self, signature: Signature | None) -> str | None:
        """The call site of ``signature`` as text (cached)."""
        if signature is None or signature.call_site is None:
            return None
        site = signature.call_site
        text = self.sites.get(site)
        if text is None:
            text = self.sites[site] = str(site)
        return text

    def add_failure(self, failure: dict[str, Any]) -> None:
        ts = self.us(failure["time_ns"])
        args = {k: failure[k] for k in ("type", "message", "run", "position", "name", "fields")}
        self.instants.append(
            (
                ("runs", 0),
                {
                    "name": f"{failure['type']}: {failure['first_line']}",
                    "cat": "failure",
                    "ph": "i",
                    "s": "g",
                    "ts": ts,
                    "pid": self.pid,
                    "args": args,
                },
            )
        )
        for row in failure["replicas"]:
            replica = row["replica"]
            self.instants.append(
                (
                    ("replica", replica),
                    {
                        "name": f"flight recorder: replica {replica} {row['state']}",
                        "cat": "failure",
                        "ph": "i",
                        "s": "t",
                        "ts": ts,
                        "pid": self.pid,
                        "args": {**row, "error": failure["first_line"]},
                    },
                )
            )

    def tid(self, track: Track, lane: int) -> int:
        """The thread id of a track's lane (lane 0 is the track itself)."""
        found = self.tids.get((track, lane))
        if found is None:
            if lane == 0:
                found = self.base_tid(track)
            else:
                self.overflow += 1
                found = self.base_tid(("runs", 0)) + self.overflow
            self.tids[(track, lane)] = found
        return found

    def base_tid(self, track: Track) -> int:
        kind, index = track
        replicas = max(self.tracer._max_replicas, 1)
        if kind == "replica":
            return index + 1
        return replicas + (1 if kind == "backend" else 2)

    def metadata_and_lanes(self) -> list[dict[str, Any]]:
        """Assign slices to lanes (so each track nests) and name every track."""
        for track, items in self.slices.items():
            for lane, (_, _, event) in zip(_lanes(items), items, strict=True):
                event["tid"] = self.tid(track, lane)
        for kind, count in (("replica", self.tracer._max_replicas), ("backend", 1), ("runs", 1)):
            for index in range(count):
                self.tid((kind, index), 0)
        pid = self.pid
        events: list[dict[str, Any]] = [
            {
                "name": "process_name",
                "ph": "M",
                "pid": pid,
                "tid": 0,
                "args": {"name": "asyncreplica"},
            },
            {
                "name": "process_labels",
                "ph": "M",
                "pid": pid,
                "tid": 0,
                "args": {"labels": f"pid {pid}"},
            },
        ]
        order = {"runs": 0, "replica": 1, "backend": 2}
        for ((kind, index), lane), tid in sorted(
            self.tids.items(), key=lambda item: (order[item[0][0][0]], item[0][0][1], item[0][1])
        ):
            name = (
                "backend" if kind == "backend" else "runs" if kind == "runs" else f"replica {index}"
            )
            if lane:
                name += f" (overlap {lane})"
            sort_index = order[kind] * 1_000_000 + index * 1000 + lane
            events.append(
                {"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}}
            )
            events.append(
                {
                    "name": "thread_sort_index",
                    "ph": "M",
                    "pid": pid,
                    "tid": tid,
                    "args": {"sort_index": sort_index},
                }
            )
        return events


def _lanes(items: list[tuple[int, int, dict[str, Any]]]) -> list[int]:
    """The lane of each slice ``(start, end, _)`` so that the slices of a lane nest.

    Greedy: slices in order of start (longest first on ties) go to the first lane whose
    open slices all contain them.
    """
    order = sorted(range(len(items)), key=lambda i: (items[i][0], -items[i][1]))
    stacks: list[list[int]] = []
    lanes = [0] * len(items)
    for i in order:
        start, end, _ = items[i]
        for lane, stack in enumerate(stacks):
            while stack and stack[-1] <= start:
                stack.pop()
            if not stack or end <= stack[-1]:
                stack.append(end)
                lanes[i] = lane
                break
        else:
            stacks.append([end])
            lanes[i] = len(stacks) - 1
    return lanes


# -- reading ----------------------------------------------------------------------------


def load_trace(path: PathLike) -> dict[str, Any]:
    """Read a trace written by a tracer (plain or gzip-compressed JSON).

    Args:
        path: The trace file.

    Returns:
        The trace object; a bare list of events is wrapped as ``{"traceEvents": [...]}``.

    Raises:
        OSError: The file cannot be read.
        ValueError: The file is not a JSON trace.
    """
    raw = Path(path).read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise ValueError(f"{os.fspath(path)} is not a JSON trace: {exc}") from None
    if isinstance(data, list):
        data = {"traceEvents": data}
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise ValueError(f"{os.fspath(path)} is not a Chrome trace (no traceEvents list)")
    return data


class _Slice:
    """A replica's collective, read back from a trace."""

    __slots__ = ("args", "end", "name", "start")

    def __init__(self, event: Mapping[str, Any]) -> None:
        self.start = float(event["ts"])
        self.end = self.start + float(event.get("dur", 0.0))
        self.name = str(event.get("name", ""))
        self.args: Mapping[str, Any] = event.get("args") or {}


def _collectives(trace: Mapping[str, Any], cat: str) -> list[_Slice]:
    return [
        _Slice(e)
        for e in trace["traceEvents"]
        if e.get("ph") == "X" and e.get("cat") == cat and isinstance(e.get("args"), dict)
    ]


def _failures(trace: Mapping[str, Any]) -> list[dict[str, Any]]:
    other = trace.get("otherData")
    found = other.get("failures") if isinstance(other, dict) else None
    if isinstance(found, list):
        return [f for f in found if isinstance(f, dict)]
    return [
        dict(e.get("args") or {})
        for e in trace["traceEvents"]
        if e.get("cat") == "failure" and e.get("s") == "g"
    ]


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _ms(us: float) -> str:
    return f"{us / 1000:.3f}"


def summarize(path: PathLike) -> str:
    """Summarize a trace: who waited, who was late and where, and what failed.

    Per replica: the number of collectives, the total time it waited for the others
    and how often it arrived last; then the slowest rendezvous with the replica that
    arrived late and its call site; then, if a run failed, the error's first line and
    the mismatched position.

    Args:
        path: A trace written by ``strategy.trace()`` or ``ASYNCREPLICA_TRACE``.

    Returns:
        The summary, several lines of text.

    Raises:
        OSError: The file cannot be read.
        ValueError: The file is not a trace.
    """
    trace = load_trace(path)
    slices = _collectives(trace, "collective")
    other = trace.get("otherData") if isinstance(trace.get("otherData"), dict) else {}
    assert isinstance(other, dict)
    stats: dict[int, list[float]] = {}  # replica -> [collectives, waited_us, last]
    groups: dict[Any, list[_Slice]] = {}
    for s in slices:
        replica = s.args.get("replica")
        if not isinstance(replica, int):
            continue
        row = stats.setdefault(replica, [0, 0.0, 0])
        row[0] += 1
        row[1] += float(s.args.get("waited_us") or 0.0)
        row[2] += bool(s.args.get("arrived_last"))
        groups.setdefault(s.args.get("collective"), []).append(s)
    runs = {s.args.get("run") for s in slices}
    counts = f"{_count(len(groups), 'collective')} in {_count(len(runs), 'run')}"
    lines = [f"Trace {os.fspath(path)}: {_count(len(stats), 'replica')}, {counts}"]
    dropped = other.get("dropped_events")
    if dropped:
        lines.append(
            f"(the oldest {dropped} events were dropped: max_events={other.get('max_events')})"
        )
    if stats:
        lines += ["", "replica  collectives  waiting (ms)  arrived last"]
        for replica in sorted(stats):
            count, waited, last = stats[replica]
            lines.append(f"{replica:>7}  {int(count):>11}  {_ms(waited):>12}  {int(last):>12}")
    slowest = _slowest(groups)
    if slowest is not None:
        late, spread = slowest
        where = late.args.get("call_site") or "an unknown call site"
        position = (
            f"position {late.args['position']}"
            if "position" in late.args
            else f"{late.args.get('name')!r} #{late.args.get('occurrence')}"
        )
        lines.append("")
        lines.append(
            f"Slowest rendezvous: {late.name} at {position} of run {late.args.get('run')}: "
            f"replica {late.args.get('replica')} arrived last, {_ms(spread)} ms after the "
            f"first, at {where}."
        )
    for failure in _failures(trace):
        lines += ["", f"Run {failure.get('run')} failed: {failure.get('type')}: "]
        lines[-1] += str(failure.get("first_line") or "")
        if failure.get("position") is not None:
            fields = failure.get("fields")
            differ = f" (differing: {', '.join(map(str, fields))})" if fields else ""
            lines.append(f"  mismatched position: {failure['position']}{differ}")
        for row in failure.get("replicas") or ():
            at = f" at {row['call_site']}" if row.get("call_site") else ""
            what = f" {row['collective']}{at}" if row.get("collective") else ""
            lines.append(f"  replica {row.get('replica')}: {row.get('state')}{what}")
    if not slices and not _failures(trace):
        lines.append("No collectives were recorded.")
    return "\n".join(lines)


def _slowest(groups: Mapping[Any, list[_Slice]]) -> tuple[_Slice, float] | None:
    """The completed rendezvous whose last arrival came latest after its first."""
    best: tuple[_Slice, float] | None = None
    for members in groups.values():
        if len(members) < 2:
            continue
        late = next((s for s in members if s.args.get("arrived_last")), None)
        if late is None:
            continue
        spread = late.start - min(s.start for s in members)
        if best is None or spread > best[1]:
            best = (late, spread)
    return best


# -- the picture ------------------------------------------------------------------------


def _matplotlib() -> tuple[Any, Any]:
    try:
        figure = importlib.import_module("matplotlib.figure")
        agg = importlib.import_module("matplotlib.backends.backend_agg")
    except ImportError as exc:
        raise ImportError(
            "plotting a trace needs matplotlib: pip install matplotlib "
            "(or pip install 'asyncreplica[plot]')"
        ) from exc
    return figure.Figure, agg.FigureCanvasAgg


def plot(path: PathLike, output: PathLike, *, max_collectives: int = 2000) -> None:
    """Draw a trace as a PNG timeline: replicas as rows, collectives as bars.

    Each bar runs from a replica's arrival at a collective to its resumption; the
    part spent waiting for the others is light, the replica that arrived last is
    highlighted, the backend's reductions are on their own row, and a failure is
    marked with the error. Uses matplotlib (without pyplot, so no global state).

    Args:
        path: A trace written by ``strategy.trace()`` or ``ASYNCREPLICA_TRACE``.
        output: The PNG file to write.
        max_collectives: Draw at most this many collectives (the most recent).

    Raises:
        ImportError: matplotlib is not installed.
        OSError: A file cannot be read or written.
        ValueError: The file is not a trace.
    """
    figure_class, canvas_class = _matplotlib()
    trace = load_trace(path)
    slices = _collectives(trace, "collective")
    dispatches = _collectives(trace, "dispatch")
    failures = [
        e
        for e in trace["traceEvents"]
        if e.get("cat") == "failure" and e.get("s") == "g" and "ts" in e
    ]
    ids = sorted({s.args.get("collective", -1) for s in slices}, key=lambda i: (i is None, i))
    keep = set(ids[-max_collectives:])
    slices = [s for s in slices if s.args.get("collective", -1) in keep]
    dispatches = [d for d in dispatches if d.args.get("collective", -1) in keep]
    replicas = sorted({int(s.args["replica"]) for s in slices if "replica" in s.args})
    origin = min([s.start for s in slices] + [d.start for d in dispatches], default=0.0)

    def ms(us: float) -> float:
        return (us - origin) / 1000

    rows = len(replicas) + 1
    fig = figure_class(figsize=(12, 1.2 + 0.55 * rows), dpi=120)
    canvas_class(fig)
    ax = fig.add_subplot(1, 1, 1)
    y_of = {r: i for i, r in enumerate(replicas)}
    backend_y = len(replicas)
    height = 0.6
    colors = {"wait": "#c6dbef", "busy": "#3182bd", "late": "#e6550d", "failed": "#de2d26"}
    for s in slices:
        y = y_of[int(s.args["replica"])] - height / 2
        waited = float(s.args.get("waited_us") or 0.0)
        if s.args.get("status", "completed") != "completed":
            ax.broken_barh(
                [(ms(s.start), ms(s.end) - ms(s.start))],
                (y, height),
                facecolors=colors["failed"],
                hatch="//",
                edgecolor="white",
            )
            continue
        if s.args.get("arrived_last") and len(replicas) > 1:
            ax.broken_barh(
                [(ms(s.start), ms(s.end) - ms(s.start))], (y, height), facecolors=colors["late"]
            )
            continue
        split = min(s.start + waited, s.end)
        ax.broken_barh(
            [(ms(s.start), ms(split) - ms(s.start)), (ms(split), ms(s.end) - ms(split))],
            (y, height),
            facecolors=(colors["wait"], colors["busy"]),
        )
    for d in dispatches:
        ax.broken_barh(
            [(ms(d.start), ms(d.end) - ms(d.start))],
            (backend_y - height / 2, height),
            facecolors="#31a354",
        )
    groups: dict[Any, list[_Slice]] = {}
    for s in slices:
        groups.setdefault(s.args.get("collective"), []).append(s)
    slowest = _slowest(groups)
    if slowest is not None and slowest[1] > 0:
        late, spread = slowest
        x = ms(late.start)
        right = x > ms(max((s.end for s in slices), default=origin)) / 2
        ax.annotate(
            f"slowest rendezvous: replica {late.args.get('replica')} arrived "
            f"{spread / 1000:.2f} ms late, at {late.args.get('call_site')}",
            xy=(x, y_of[int(late.args["replica"])] - height / 2),
            xytext=(x, -0.85),
            ha="right" if right else "left",
            va="center",
            fontsize=8,
            arrowprops={"arrowstyle": "->", "color": "black", "lw": 0.8},
        )
    title = f"asyncreplica timeline: {Path(path).name}"
    for event in failures:
        x = ms(float(event["ts"]))
        ax.axvline(x, color=colors["failed"], linewidth=1.5)
        args = event.get("args") or {}
        ax.text(
            x,
            rows - 0.5,
            f" {args.get('type', 'failure')} ",
            color=colors["failed"],
            fontsize=8,
            va="bottom",
            ha="right",
        )
        name = str(event.get("name", "failure"))
        title += "\n" + (name if len(name) <= 110 else name[:107] + "...")
    ax.set_yticks(range(rows), [f"replica {r}" for r in replicas] + ["backend"])
    ax.set_ylim(rows - 0.5, -1.2)
    ax.set_xlabel("time (ms)")
    ax.grid(axis="x", alpha=0.3)
    ax.set_title(title, fontsize=9, loc="left")
    patch = importlib.import_module("matplotlib.patches").Patch
    ax.legend(
        handles=[
            patch(facecolor=colors["wait"], label="waiting for the others"),
            patch(facecolor=colors["busy"], label="in the collective"),
            patch(facecolor=colors["late"], label="arrived last"),
            patch(facecolor="#31a354", label="reduction (backend)"),
            patch(facecolor=colors["failed"], hatch="//", label="never completed"),
        ],
        loc="upper center",
        bbox_to_anchor=(0.5, -0.12 - 0.35 / rows),
        ncol=5,
        fontsize=8,
        frameon=False,
    )
    fig.savefig(os.fspath(output), format="png", bbox_inches="tight")
