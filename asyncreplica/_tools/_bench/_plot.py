"""The chart of ``bench --plot``: what to draw (:func:`chart`), and drawing it (:func:`_plot`).

:func:`chart` is pure: it turns a run's rows and targets into the series, bars and
markers to draw, and is what the tests check. :func:`_plot` only hands that to
matplotlib. The rules the chart keeps:

* only what was measured is drawn: a figure that was not measured (NaN) is a gap in
  its line, never a value;
* one direction per panel: the ratio panel holds only figures where lower is better;
  figures where higher is better get a panel of their own;
* each bar of a ratio panel carries its target (and the reference, where the run
  measured one), so a reader sees at a glance which targets are met.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ._model import Row, Target, _size

__all__ = ["Bar", "Chart", "Series", "chart"]


@dataclass
class Series:
    """One line of the time panel: ``y[i]`` at ``x[i]``; None is a gap (not measured)."""

    label: str
    x: list[int]
    y: list[float | None]


@dataclass
class Bar:
    """One bar of a ratio panel, with its target's bound and the reference, if any."""

    label: str
    value: float | None  # None: not measured (no bar is drawn)
    limit: float | None
    met: bool
    reference: float | None = None


@dataclass
class Chart:
    """Everything the chart draws, panel by panel (an empty panel is left out)."""

    times_title: str = ""
    times: list[Series] = field(default_factory=list)
    lower: list[Bar] = field(default_factory=list)  # lower is better
    higher: list[Bar] = field(default_factory=list)  # higher is better


def _measured(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) and value > 0 else None


def chart(rows: list[Row], targets: list[Target]) -> Chart:
    """What ``bench --plot`` draws for a run's rows and targets.

    Args:
        rows: The run's measured rows.
        targets: The run's targets (those with a ``x`` ratio and a bound are drawn).

    Returns:
        The time panel's series (all_reduce time against size, at the largest replica
        count up to 8; every system on the same sizes, None where a system was not
        measured), the ratio bars where lower is better, and those where higher is
        better.
    """
    out = Chart()
    reduce_rows = [r for r in rows if r.case == "all_reduce" and r.replicas <= 8]
    if reduce_rows:
        n = max(r.replicas for r in reduce_rows)
        sizes = sorted({r.nbytes for r in reduce_rows if r.replicas == n})
        points: dict[str, dict[int, float | None]] = {}
        for r in reduce_rows:
            if r.replicas == n:
                label = f"asyncreplica ({r.loop})" if r.system == "asyncreplica" else r.system
                points.setdefault(label, {})[r.nbytes] = _measured(r.median_us)
        out.times_title = f"all_reduce, {n} replicas: median time vs size"
        for label in sorted(points):
            ys = [points[label].get(size) for size in sizes]
            if any(y is not None for y in ys):
                out.times.append(Series(label, sizes, ys))
    for t in targets:
        if t.limit is None or not t.unit.startswith("x"):
            continue  # not a ratio with a bound (MiB, microseconds, "reported")
        bar = Bar(t.figure, _measured(t.value), t.limit, t.met, _measured(t.reference))
        (out.higher if t.higher_is_better else out.lower).append(bar)
    return out


def _plot(rows: list[Row], targets: list[Target], path: str) -> None:
    """Draw :func:`chart`'s data into a PNG at ``path`` (needs matplotlib).

    The time panel, and under it the panel where higher is better, on the left; the
    ratios where lower is better on the right. A panel with nothing to draw says so.
    """
    # Without pyplot: no global plotting state in the caller's process.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    data = chart(rows, targets)
    fig = Figure(figsize=(14, max(6.0, 0.32 * len(data.lower) + 1.5)))
    FigureCanvasAgg(fig)
    axes = fig.subplot_mosaic(
        [["times", "lower"], ["higher", "lower"]],
        gridspec_kw={"height_ratios": [3, 1], "width_ratios": [1, 1.25]},
    )
    ax = axes["times"]
    for s in data.times:
        ys = [math.nan if y is None else y for y in s.y]  # NaN: a gap in the line
        ax.loglog(s.x, ys, marker="o", label=s.label)
    if data.times:
        ax.set_title(data.times_title, fontsize=10)
        ax.set_xlabel("bytes per replica (no point: not measured)", fontsize=8)
        ax.set_ylabel("µs per all_reduce")
        ax.set_xticks(data.times[0].x, [_size(x) for x in data.times[0].x], fontsize=7)
        ax.legend(fontsize=7)
        ax.grid(True, which="both", alpha=0.3)
    for panel, better in (("lower", "lower"), ("higher", "higher")):
        _bars(axes[panel], getattr(data, panel), f"ratios, {better} is better")
    for name, ax in axes.items():
        if not ax.has_data():
            ax.set_axis_off()
            ax.text(0.5, 0.5, f"{name}: nothing measured", ha="center", transform=ax.transAxes)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _bars(ax: Any, bars: list[Bar], title: str) -> None:
    """One ratio panel: a bar per measured figure, its target and its reference."""
    ys = list(range(len(bars)))
    drawn = [(y, b) for y, b in zip(ys, bars, strict=True) if b.value is not None]
    if not bars:
        return
    ax.barh(
        [y for y, _ in drawn],
        [b.value for _, b in drawn],
        color=["tab:green" if b.met else "tab:red" for _, b in drawn],
    )
    for y, b in zip(ys, bars, strict=True):
        if b.limit is not None:
            ax.plot([b.limit] * 2, [y - 0.4, y + 0.4], color="black", linewidth=2)
        if b.reference is not None:
            ax.plot(b.reference, y, marker="D", color="tab:gray", markersize=5)
        if b.value is None:
            ax.text(b.limit or 1.0, y, " not measured", va="center", fontsize=7)
    ax.set_yticks(ys, [b.label for b in bars], fontsize=7)
    ax.set_xscale("log")
    ax.set_ylim(len(bars) - 0.5, -0.5)  # the first figure on top
    ax.axvline(1.0, color="gray", linewidth=0.6)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(
        "ratio, log scale (bar: measured, green met, red missed; black line: target; "
        "gray diamond: reference)",
        fontsize=7,
    )
