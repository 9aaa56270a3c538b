"""The picture of a trace: :func:`plot` draws a PNG timeline with matplotlib."""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Any

from ._recorder import PathLike
from ._summary import _collectives, _Slice, _slowest, load_trace

__all__ = ["plot"]


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
