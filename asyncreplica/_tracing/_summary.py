"""Reading a trace back: :func:`load_trace` and the text report of :func:`summarize`."""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ._recorder import PathLike
from ._records import UNFINISHED, did_not_arrive

__all__ = ["load_trace", "summarize"]


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
    run_records = _collectives(trace, "run")
    failures = _failures(trace)
    # The runs of every kind of event kept: when max_events dropped a run's slices, its
    # failure may still be shown below, and the header counts the runs the body shows.
    runs = {s.args.get("run") for s in slices} | {r.args.get("run") for r in run_records}
    runs |= {f.get("run") for f in failures}
    runs.discard(None)
    # Every replica of every run, also one that made no collective (it never arrived).
    for replica in range(_num_replicas(run_records)):
        stats.setdefault(replica, [0, 0.0, 0])
    counts = f"{_count(len(groups), 'collective')} in {_count(len(runs), 'run')}"
    lines = [f"Trace {os.fspath(path)}: {_count(len(stats), 'replica')}, {counts}"]
    dropped = other.get("dropped_events")
    if dropped:
        collectives = other.get("dropped_collectives")
        among = (
            f", {_count(collectives, 'collective')} among them"
            if isinstance(collectives, int)
            else ""
        )
        traced = other.get("runs")
        of_runs = f" of the {_count(traced, 'run')} traced" if isinstance(traced, int) else ""
        lines.append(
            f"(the oldest {dropped} events{of_runs} were dropped{among}: "
            f"max_events={other.get('max_events')}; the counts above are of the events kept)"
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
    for failure in failures:
        lines += ["", f"Run {failure.get('run')} failed: {failure.get('type')}: "]
        lines[-1] += str(failure.get("first_line") or "")
        if failure.get("position") is not None:
            fields = failure.get("fields")
            differ = f" (differing: {', '.join(map(str, fields))})" if fields else ""
            label = _POSITION_LABELS.get(str(failure.get("type")), "at position")
            lines.append(f"  {label}: {failure['position']}{differ}")
        for row in failure.get("replicas") or ():
            lines.append(f"  replica {row.get('replica')}: {_row_text(row, failure)}")
    lines += _cancelled(trace, slices)
    if not slices and not failures:
        lines.append("No collectives were recorded.")
    return "\n".join(lines)


#: What a failure's ``position`` is, by the error's type (a timeout's position is where
#: it timed out, not a mismatch).
_POSITION_LABELS = {
    "CollectiveMismatchError": "mismatched position",
    "CollectiveTimeoutError": "timed out at position",
    "ReplicaExitedError": "waited at position",
    "CollectiveDeadlockError": "deadlocked at position",
}


def _row_text(row: Mapping[str, Any], failure: Mapping[str, Any]) -> str:
    """One replica's line under a failure: where it waits, or that it did not arrive.

    A waiting replica's recorded collective is the one it waits at; any other replica's
    is the last one it made, which is not the failed one: saying "finished
    all_reduce(SUM) at line 8" would name a collective that completed.
    """
    state = str(row.get("state"))
    at = f" at {row['call_site']}" if row.get("call_site") else ""
    collective = f"{row['collective']}{at}" if row.get("collective") else None
    if state == "waiting":
        return f"{state} {collective}" if collective else state
    missed = did_not_arrive(failure)
    text = state if missed is None else f"{state}, {missed}"
    last = f"its last collective was {collective}" if collective else "it made no collective"
    return f"{text} ({last})"


def _num_replicas(run_records: list[_Slice]) -> int:
    """The most replicas any recorded run had (0 for a trace without run records)."""
    counts = [r.args.get("num_replicas") for r in run_records]
    return max((c for c in counts if isinstance(c, int)), default=0)


def _cancelled(trace: Mapping[str, Any], slices: list[_Slice]) -> list[str]:
    """Lines for each run cancelled from outside or still going, with what was pending."""
    lines: list[str] = []
    for run in _collectives(trace, "run"):
        status = run.args.get("status")
        if status not in ("cancelled", UNFINISHED):
            continue
        index = run.args.get("run")
        pending = sorted(
            (
                s
                for s in slices
                if s.args.get("run") == index and s.args.get("status", "completed") != "completed"
            ),
            key=lambda s: (s.args.get("replica", -1), s.start),
        )
        lines += [
            "",
            f"Run {index} was cancelled by a scope around Strategy.run (not a failure)"
            if status == "cancelled"
            else f"Run {index} was still running when the trace was written",
        ]
        if not pending:
            lines[-1] += "; no collective was in flight."
            continue
        lines[-1] += "; collectives in flight:"
        for s in pending:
            at = f" at {s.args['call_site']}" if s.args.get("call_site") else ""
            label = s.name.removesuffix(" (never completed)").removesuffix(" (in flight)")
            value = f" on {s.args['value']}" if s.args.get("value") else ""
            lines.append(f"  replica {s.args.get('replica')}: waiting {label}{value}{at}")
    return lines


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
