"""The chart of ``bench --plot``."""

from __future__ import annotations

from ._model import Row, _size


def _plot(rows: list[Row], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5.5))
    reduce_rows = [r for r in rows if r.case == "all_reduce"]
    if reduce_rows:
        n = max(r.replicas for r in reduce_rows if r.replicas <= 8)
        series: dict[str, list[tuple[int, float]]] = {}
        for r in reduce_rows:
            if r.replicas == n:
                label = f"asyncreplica ({r.loop})" if r.system == "asyncreplica" else r.system
                series.setdefault(label, []).append((r.nbytes, r.median_us))
        for label, points in sorted(series.items()):
            points.sort()
            left.loglog([p[0] for p in points], [p[1] for p in points], marker="o", label=label)
        left.set_title(f"all_reduce, {n} replicas: median time vs size")
        left.set_xlabel("bytes per replica")
        left.set_ylabel("µs per all_reduce")
        left.legend(fontsize=8)
        left.grid(True, which="both", alpha=0.3)
    ours = [r for r in rows if r.system.startswith("asyncreplica") and r.baseline_us > 0]
    ours = [r for r in ours if r.case != "all_reduce" or r.loop == "asyncio"]
    ours = [r for r in ours if r.case != "run start-up"]  # a one-off cost, not a ratio
    if ours:
        names = [f"{r.case} {_size(r.nbytes)} x{r.replicas}" for r in ours]
        right.barh(names, [r.ratio for r in ours], color="tab:blue")
        right.axvline(1.0, color="black", linewidth=0.8)
        right.set_xscale("log")
        right.set_title("ratio to the baseline measured in the same run")
        right.set_xlabel("ratio (lower is better; see the table for each baseline)")
        right.tick_params(axis="y", labelsize=7)
        right.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
