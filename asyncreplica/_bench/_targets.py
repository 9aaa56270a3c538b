"""The targets of the performance issue, read from a run's rows."""

from __future__ import annotations

from ._cases import _MOVES
from ._model import Row, Target, _find, _size


def _targets(rows: list[Row]) -> list[Target]:
    """Every target of the issue that this run measured, with its value."""
    out: list[Target] = []
    small = _find(rows, "all_reduce", 8, 8, "asyncio")
    if small is not None:
        figure = "all_reduce 8 B x 8 vs futures rendezvous"
        out.append(Target(figure, small.ratio, "x", "<= 1.5x", small.ratio <= 1.5))
        uvloop = _find(rows, "all_reduce", 8, 8, "uvloop")
        if uvloop is not None:
            ratio = uvloop.median_us / small.median_us
            figure = "all_reduce 8 B x 8, uvloop vs asyncio"
            out.append(Target(figure, ratio, "x", "< 1x (faster)", ratio < 1.0))
        trio = _find(rows, "all_reduce", 8, 8, "trio")
        if trio is not None:
            ratio = trio.median_us / small.median_us
            figure = "all_reduce 8 B x 8, trio vs asyncio"
            out.append(Target(figure, ratio, "x", "<= 2x", ratio <= 2.0))
    large = _find(rows, "all_reduce", 8, 64 << 20, "asyncio")
    if large is not None:
        figure = "all_reduce 64 MiB x 8 vs best numpy floor"
        out.append(Target(figure, large.ratio, "x", "<= 1.15x", large.ratio <= 1.15))
    batched = _find(rows, "batched 1000 x 1 KiB", 4, 1000 * 1024, "asyncio")
    if batched is not None:
        figure = "batched 1000 x 1 KiB x 4 vs one 1000 KiB"
        floor = _find(rows, "batched 1000 x 1 KiB", 4, 1000 * 1024, "-", "numpy, per leaf (floor)")
        out.append(
            Target(
                figure,
                batched.ratio,
                "x",
                "<= 5x",
                batched.ratio <= 5.0,
                None if floor is None else floor.ratio,
                "" if floor is None else "numpy per leaf",
            )
        )
    apart = _find(rows, "1000 separate 1 KiB", 4, 1000 * 1024, "asyncio")
    if apart is not None:
        figure = "1000 separate all_reduces vs batched"
        out.append(Target(figure, apart.ratio, "x slower", ">= 10x", apart.ratio >= 10.0))
    scale = sorted((r for r in rows if r.case == "scale (per replica)"), key=lambda r: r.replicas)
    if len(scale) >= 2:
        ratio = scale[-1].median_us / scale[0].median_us
        # The futures rendezvous's own growth (its per-replica cost is each row's baseline).
        futures = scale[-1].baseline_us / scale[0].baseline_us
        figure = f"per-replica cost, {scale[-1].replicas} vs {scale[0].replicas} replicas"
        out.append(Target(figure, ratio, "x", "<= 1.5x", ratio <= 1.5, futures, "futures"))
    for r in rows:
        if r.case in _MOVES and r.system == "asyncreplica":
            figure = f"{r.case} {_size(r.nbytes)} x {r.replicas} vs bytes floor"
            bare = _find(rows, r.case, r.replicas, r.nbytes, r.loop, "futures")
            reference = None if bare is None else bare.ratio
            out.append(
                Target(figure, r.ratio, "x", "<= 1.2x", r.ratio <= 1.2, reference, "futures")
            )
    for r in rows:
        if r.case == "tracing on":
            out.append(Target("tracing on vs off, 8 B x 8", r.ratio, "x", "(reported)", True))
    return out
