"""A checker of Chrome trace-event JSON, as ui.perfetto.dev and chrome://tracing read it.

The Trace Event Format (the "JSON Object Format"): ``{"traceEvents": [...]}`` whose
events have ``ph`` (phase), ``ts`` (microseconds), ``pid`` and ``tid``; complete events
(``X``) have ``dur``; metadata events (``M``) name processes and threads; instant
events (``i``) have a scope ``s``; flow events (``s``/``f``) pair up by ``id`` and bind
to the slice that encloses them. Perfetto also requires that the complete events of
one track nest: a slice that starts inside another ends inside it.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import pytest

METADATA_ARGS = {
    "process_name": ("name", str),
    "process_labels": ("labels", str),
    "process_sort_index": ("sort_index", int),
    "thread_name": ("name", str),
    "thread_sort_index": ("sort_index", int),
}


def _ns(us: float) -> int:
    return round(us * 1000)


def check_chrome_trace(data: Any) -> None:
    """Fail if ``data`` is not a trace that Perfetto accepts as it is meant."""
    assert isinstance(data, dict), "a trace in the JSON object format is a dict"
    json.dumps(data, allow_nan=False)  # plain JSON: no NaN, no objects
    events = data["traceEvents"]
    assert isinstance(events, list)
    assert data.get("displayTimeUnit", "ms") in ("ms", "ns")
    thread_names: dict[tuple[int, int], str] = {}
    process_names: dict[int, str] = {}
    used: set[tuple[int, int]] = set()
    slices: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)
    flows: dict[object, list[dict[str, Any]]] = defaultdict(list)
    for event in events:
        ph = event["ph"]
        assert ph in {"M", "X", "i", "s", "f"}, event
        assert isinstance(event["pid"], int), event
        assert isinstance(event["tid"], int), event
        assert isinstance(event["name"], str), event
        if ph == "M":
            key, kind = METADATA_ARGS[event["name"]]
            assert isinstance(event["args"][key], kind), event
            if event["name"] == "thread_name":
                assert (event["pid"], event["tid"]) not in thread_names, "a thread named twice"
                thread_names[(event["pid"], event["tid"])] = event["args"]["name"]
            if event["name"] == "process_name":
                process_names[event["pid"]] = event["args"]["name"]
            continue
        ts = event["ts"]
        assert isinstance(ts, int | float), event
        assert ts >= 0, event
        track = (event["pid"], event["tid"])
        used.add(track)
        if "args" in event:
            assert isinstance(event["args"], dict), event
        if ph == "X":
            dur = event["dur"]
            assert isinstance(dur, int | float), event
            assert dur >= 0, event
            slices[track].append((_ns(ts), _ns(ts) + _ns(dur)))
        elif ph == "i":
            assert event["s"] in {"g", "p", "t"}, event
        else:
            assert "id" in event, event
            assert isinstance(event.get("cat"), str), event
            if ph == "f":
                assert event["bp"] == "e", "a flow end binds to its enclosing slice"
            flows[event["id"]].append(event)
    for track in used:
        assert track in thread_names, f"track {track} has no thread_name"
        assert track[0] in process_names, f"process {track[0]} has no process_name"
    for track, items in slices.items():
        stack: list[int] = []
        for start, end in sorted(items, key=lambda se: (se[0], -se[1])):
            while stack and stack[-1] <= start:
                stack.pop()
            assert not stack or end <= stack[-1], (
                f"slices overlap without nesting on {thread_names[track]!r}: "
                f"[{start}, {end}] starts inside a slice that ends at {stack[-1]}"
            )
            stack.append(end)
    for ident, pair in flows.items():
        assert sorted(e["ph"] for e in pair) == ["f", "s"], f"flow {ident} does not pair up"
        for e in pair:
            at = _ns(e["ts"])
            assert any(s <= at <= end for s, end in slices[(e["pid"], e["tid"])]), (
                f"flow {ident} ({e['ph']}) is not inside a slice of its track"
            )


@pytest.fixture
def check_trace() -> Callable[[Any], None]:
    """The checker of Chrome trace-event JSON."""
    return check_chrome_trace
