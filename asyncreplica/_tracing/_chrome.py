"""Chrome trace-event export: a tracer's records as the JSON that Perfetto opens.

:class:`_Builder` turns the ring buffer of a :class:`ChromeTracer` into one process
with a track per replica, a ``backend`` track and a ``runs`` track: one complete
(``X``) event per collective per replica, one per reduction with a flow arrow from
the replica that dispatched it, and instant events for failures. Slices of one track
must nest (Perfetto's rule), so :func:`_lanes` puts overlapping ones on extra tracks.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from time import perf_counter_ns
from typing import TYPE_CHECKING, Any, Protocol

from .._core._ledger import key_index
from .._version import __version__
from ._records import IN_FLIGHT, UNFINISHED, _Collective, _RunState, did_not_arrive

if TYPE_CHECKING:
    from collections import deque

    from .._core._signature import LeafSpec, Signature


class Recording(Protocol):
    """What :class:`_Builder` reads of the recorder (``_recorder.ChromeTracer``, which calls it)."""

    max_events: int
    _pid: int
    _origin: int
    _origin_unix_ns: int
    _records: deque[_Collective | _RunState]
    _active: list[_RunState]
    _size: int
    _dropped_events: int
    _dropped_collectives: int
    _failures: deque[dict[str, Any]]
    _runs: int
    _max_replicas: int


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


Track = tuple[str, int]
"""A track before lanes: ``("replica", r)``, ``("backend", 0)`` or ``("runs", 0)``."""


class _Builder:
    """Turns a tracer's records into the trace-event object."""

    def __init__(self, tracer: Recording) -> None:
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
        # Runs still going when the trace is written (a loop stopped with a run pending, a
        # write from a merge_fn or another task): marked, never shown as if complete.
        now = perf_counter_ns()
        for run in tracer._active:
            self.add_run(run, written_at=now)
            for record in sorted(run.open.values(), key=lambda r: r.id):
                start = self.add_collective(record, written_at=now)
                first = start if first is None else min(first, start)
            first = run.begin if first is None else min(first, run.begin)
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

    def add_run(self, run: _RunState, *, written_at: int | None = None) -> None:
        """The run's slice; ``written_at``: the run had not ended when the trace was written."""
        if written_at is not None:
            end, status = written_at, UNFINISHED
        else:
            end = run.end if run.end is not None else run.begin
            status = "cancelled" if run.cancelled else "failed" if run.failed else "ok"
        self.slice(
            ("runs", 0),
            run.begin,
            end,
            {
                "name": f"run {run.index}"
                + ("" if status == "ok" else f" ({status.partition(':')[0]})"),
                "cat": "run",
                "args": {
                    "run": run.index,
                    "num_replicas": run.num_replicas,
                    "devices": list(run.devices),
                    "status": status,
                },
            },
        )

    def add_collective(self, record: _Collective, *, written_at: int | None = None) -> int:
        """The collective's slices; ``written_at``: it was in flight when the trace was written."""
        arrived = [t for t in record.arrivals if t is not None]
        first, last_arrival = min(arrived), max(arrived)
        complete = record.closed_at is None and written_at is None
        closed_at = written_at if written_at is not None else record.closed_at
        common: dict[str, Any] = {}
        if isinstance(record.key, int):
            common["position"] = record.key
        else:
            common["name"] = record.key[0]
            common["occurrence"] = key_index(record.key)
        common.update(
            run=record.run,
            collective=record.id,
            late_us=round((last_arrival - first) / 1000, 3) if complete else None,
            status="completed"
            if complete
            else IN_FLIGHT
            if written_at is not None
            else "never completed: the run was cancelled"
            if record.cancelled
            else "never completed: the run failed",
        )
        late_slice: dict[str, Any] | None = None
        for replica, start in enumerate(record.arrivals):
            signature = record.signatures[replica]
            if start is None or signature is None:
                continue
            # Each replica's slice shows its own call: after a mismatch they differ.
            label, described = self.describe(signature)
            resumed = record.resumes[replica]
            end = resumed if resumed is not None else closed_at or start
            waited = (last_arrival if complete else end) - start
            event = self.slice(
                ("replica", replica),
                start,
                end,
                {
                    "name": label
                    if complete
                    else f"{label} (in flight)"
                    if written_at is not None
                    else f"{label} (never completed)",
                    "cat": "collective",
                    "args": {
                        **described,
                        **common,
                        "replica": replica,
                        "call_site": self.where(signature),
                        "waited_us": round(waited / 1000, 3),
                        "arrived_last": replica == record.last,
                        "mismatched": replica == record.rejected,
                    },
                },
            )
            if replica == record.last:
                late_slice = event
        if record.d0 is not None:
            d1 = record.d1 if record.d1 is not None else closed_at or record.d0
            reference = None if record.last is None else record.signatures[record.last]
            if reference is None:
                reference = next(s for s in record.signatures if s is not None)
            label, described = self.describe(reference)
            dispatch = self.slice(
                ("backend", 0),
                record.d0,
                d1,
                {
                    "name": label,
                    "cat": "dispatch",
                    "args": {**described, **common, "dispatched_by": record.last},
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
        missed = did_not_arrive(failure)
        for row in failure["replicas"]:
            replica = row["replica"]
            name = f"flight recorder: replica {replica} {row['state']}"
            if missed is not None and row["state"] != "waiting":
                # Its row's collective is its last one, not the failed one.
                name += f", {missed}"
            self.instants.append(
                (
                    ("replica", replica),
                    {
                        "name": name,
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
