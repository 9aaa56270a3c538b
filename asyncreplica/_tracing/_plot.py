"""The picture of a trace: :func:`plot` draws a PNG timeline with matplotlib.

What the picture shows is decided by :func:`_layout` (plain data, tested without
matplotlib); :func:`plot` only draws it.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ._recorder import PathLike
from ._records import did_not_arrive
from ._summary import _collectives, _num_replicas, _Slice, _slowest, load_trace

__all__ = ["plot"]

#: The widest line of the title, in characters; longer error lines are wrapped, not cut.
_TITLE_WIDTH = 120
#: At most this many lines of each error's first line in the title.
_TITLE_LINES = 4


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


@dataclasses.dataclass
class _Layout:
    """What the timeline of one trace shows.

    Attributes:
        replicas: The rows, one per replica of the runs shown (also a replica that
            made no collective: it has a row, with ``absent`` saying why it is empty).
        absent: For each replica row without a bar, what it was doing.
        missing: ``(replica, time in µs, text)`` for each replica of a failed run that
            has bars but did not arrive at the failed collective: the text (its state,
            "did not arrive at position N") is drawn on its row, after its last bar
            and not before the failure.
        slices: The replicas' collectives drawn.
        dispatches: The backend's reductions drawn.
        failures: The failure events drawn (vertical lines).
        title: The title's lines.
        slowest: The slowest rendezvous to point at (late slice, spread in µs), or None
            (none, or the run shown failed: the failure is the point then).
    """

    replicas: list[int]
    absent: dict[int, str]
    missing: list[tuple[int, float, str]]
    slices: list[_Slice]
    dispatches: list[_Slice]
    failures: list[dict[str, Any]]
    title: list[str]
    slowest: tuple[_Slice, float] | None


def _layout(trace: Mapping[str, Any], name: str, run: int | str, max_collectives: int) -> _Layout:
    """Decide what the timeline of ``trace`` shows (see :func:`plot` for ``run``).

    Raises:
        ValueError: ``run`` is not ``"failed"``, ``"all"`` or the index of a recorded run.
    """
    slices = _collectives(trace, "collective")
    dispatches = _collectives(trace, "dispatch")
    run_records = _collectives(trace, "run")
    failures = [
        e
        for e in trace["traceEvents"]
        if e.get("cat") == "failure" and e.get("s") == "g" and "ts" in e
    ]
    indices = sorted(
        {
            i
            for i in [
                *(s.args.get("run") for s in slices),
                *(r.args.get("run") for r in run_records),
            ]
            if isinstance(i, int)
        }
    )
    failed_runs = [i for e in failures if isinstance(i := (e.get("args") or {}).get("run"), int)]
    if run == "failed":
        shown: int | None = failed_runs[-1] if failed_runs else None
    elif run == "all":
        shown = None
    elif isinstance(run, int) and not isinstance(run, bool) and run in indices:
        shown = run
    else:
        have = f"runs {indices[0]} to {indices[-1]}" if indices else "no runs"
        raise ValueError(
            f"run={run!r}: pass 'failed' (the last failed run, else every run), 'all', or "
            f"the index of a recorded run (this trace has {have})"
        )
    if shown is not None:
        slices = [s for s in slices if s.args.get("run") == shown]
        dispatches = [d for d in dispatches if d.args.get("run") == shown]
        run_records = [r for r in run_records if r.args.get("run") == shown]
        failures = [e for e in failures if (e.get("args") or {}).get("run") == shown]
    ids = sorted({s.args.get("collective", -1) for s in slices}, key=lambda i: (i is None, i))
    keep = set(ids[-max_collectives:])
    slices = [s for s in slices if s.args.get("collective", -1) in keep]
    dispatches = [d for d in dispatches if d.args.get("collective", -1) in keep]
    drawn = {int(s.args["replica"]) for s in slices if "replica" in s.args}
    replicas = sorted(drawn | set(range(_num_replicas(run_records))))
    states: dict[int, str] = {}
    for event in failures:
        for row in (event.get("args") or {}).get("replicas") or ():
            if isinstance(row.get("replica"), int) and row.get("state"):
                states[row["replica"]] = str(row["state"])
    for event in trace["traceEvents"]:  # the flight recorder's per-replica rows
        args = event.get("args") or {}
        if (
            event.get("cat") == "failure"
            and event.get("s") == "t"
            and isinstance(args.get("replica"), int)
            and (shown is None or any(e.get("ts") == event.get("ts") for e in failures))
            and args.get("state")
        ):
            states[args["replica"]] = str(args["state"])
    absent = {
        r: (f"{states[r]}: " if r in states else "") + "no collective in this run"
        for r in replicas
        if r not in drawn
    }
    missing = []
    for event in failures:
        args = event.get("args") or {}
        missed = did_not_arrive(args)
        if missed is None:
            continue
        arrived = {
            s.args.get("replica")
            for s in slices
            if s.args.get("run") == args.get("run")
            and s.args.get("status", "completed") != "completed"
            and _at(s, args)
        }
        rows = {row.get("replica"): row for row in _failure_rows(trace, args)}
        for r in replicas:
            if r in arrived or r in absent:
                continue
            state = rows.get(r, {}).get("state") or states.get(r)
            # After its last bar of that run, and not before the failure's line.
            ends = [
                e.end
                for e in slices
                if e.args.get("replica") == r and e.args.get("run") == args.get("run")
            ]
            at = max([float(event["ts"]), *ends])
            missing.append((r, at, f"{state}: {missed}" if state else missed))
    title = [f"asyncreplica timeline: {name}"]
    if shown is not None:
        what = "the failed run" if shown in failed_runs else "one run"
        title[0] += f", run {shown} ({what}; {len(indices)} in the trace, run='all' for every one)"
    for event in failures:
        text = str(event.get("name", "failure"))
        wrapped = textwrap.wrap(text, _TITLE_WIDTH) or [text]
        if len(wrapped) > _TITLE_LINES:
            wrapped = [*wrapped[: _TITLE_LINES - 1], wrapped[_TITLE_LINES - 1] + " ..."]
        title += wrapped
    groups: dict[Any, list[_Slice]] = {}
    for s in slices:
        groups.setdefault(s.args.get("collective"), []).append(s)
    slowest = None if failures else _slowest(groups)
    if slowest is not None and slowest[1] <= 0:
        slowest = None
    return _Layout(replicas, absent, missing, slices, dispatches, failures, title, slowest)


def _at(s: _Slice, failure: Mapping[str, Any]) -> bool:
    """Whether ``s`` is a replica's arrival at the collective ``failure`` names."""
    if failure.get("name") is None:
        return bool(s.args.get("position") == failure.get("position"))
    return bool(
        s.args.get("name") == failure.get("name")
        and s.args.get("occurrence") == failure.get("position")
    )


def _failure_rows(trace: Mapping[str, Any], args: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The per-replica rows recorded with the failure whose event args are ``args``."""
    other = trace.get("otherData")
    found = other.get("failures") if isinstance(other, dict) else None
    for failure in found if isinstance(found, list) else ():
        if (
            isinstance(failure, dict)
            and failure.get("run") == args.get("run")
            and failure.get("message") == args.get("message")
        ):
            return [row for row in failure.get("replicas") or () if isinstance(row, dict)]
    return []


def plot(
    path: PathLike, output: PathLike, *, max_collectives: int = 2000, run: int | str = "failed"
) -> None:
    """Draw a trace as a PNG timeline: replicas as rows, collectives as bars.

    Each bar runs from a replica's arrival at a collective to its resumption; the
    part spent waiting for the others is light, the replica that arrived last is
    highlighted, the backend's reductions are on their own row, and a failure is
    marked with the error. Every replica of the runs shown has a row, also one that
    never arrived (its row is empty and says what it was doing). Uses matplotlib
    (without pyplot, so no global state).

    Args:
        path: A trace written by ``strategy.trace()`` or ``ASYNCREPLICA_TRACE``.
        output: The PNG file to write.
        max_collectives: Draw at most this many collectives (the most recent).
        run: Which run to draw: ``"failed"`` (the default) zooms into the last run that
            failed, or draws every run when none did; ``"all"`` draws every run; an
            ``int`` draws that run (its index, as the summary and the trace name it).

    Raises:
        ImportError: matplotlib is not installed.
        OSError: A file cannot be read or written.
        ValueError: The file is not a trace, or ``run`` names no recorded run.
    """
    trace = load_trace(path)
    layout = _layout(trace, Path(path).name, run, max_collectives)
    figure_class, canvas_class = _matplotlib()
    slices, replicas = layout.slices, layout.replicas
    origin = min([s.start for s in slices] + [d.start for d in layout.dispatches], default=0.0)

    def ms(us: float) -> float:
        return (us - origin) / 1000

    rows = len(replicas) + 1
    fig = figure_class(figsize=(12, 1.2 + 0.55 * rows + 0.15 * len(layout.title)), dpi=120)
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
    for d in layout.dispatches:
        ax.broken_barh(
            [(ms(d.start), ms(d.end) - ms(d.start))],
            (backend_y - height / 2, height),
            facecolors="#31a354",
        )
    for replica, state in layout.absent.items():
        ax.text(0, y_of[replica], f" {state}", color="#636363", fontsize=8, va="center")
    for replica, at, text in layout.missing:
        ax.text(ms(at), y_of[replica], f" {text}", color="#636363", fontsize=8, va="center")
    if layout.slowest is not None:
        late, spread = layout.slowest
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
    for event in layout.failures:
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
    ax.set_yticks(range(rows), [f"replica {r}" for r in replicas] + ["backend"])
    ax.set_ylim(rows - 0.5, -1.2)
    ax.set_xlabel("time (ms)")
    ax.grid(axis="x", alpha=0.3)
    ax.set_title("\n".join(layout.title), fontsize=9, loc="left")
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
