"""The targets of the performance issue, read from a run's rows.

Issue 17's table (figure: target, goal) comes first; the figures of the earlier
performance issues follow. ``asyncreplica bench --check`` exits non-zero when a
target is missed, or was not measured.
"""

from __future__ import annotations

import math
from typing import Any

from .._bench_mpi_faults import KINDS as FAULT_KINDS
from .._bench_mpi_faults import LIMIT_SECONDS as FAULT_LIMIT_SECONDS
from ._cases import _ARRAY_TYPES, _MOVES, ARRAY_TYPES_CASE, NUMPY_INPUTS
from ._model import Row, Target, _bounded, _find, _size


def _targets(rows: list[Row]) -> list[Target]:
    """Every target of the issue that this run measured, with its value."""
    out: list[Target] = []
    small = _find(rows, "all_reduce", 8, 8, "asyncio")
    if small is not None:
        figure = "all_reduce 8 B x 8 vs futures rendezvous"
        out.append(_bounded(figure, small.ratio, 2.5, goal=1.5))
    batched = _find(rows, "batched 1000 x 1 KiB", 4, 1000 * 1024, "asyncio")
    if batched is not None:
        floor = _find(rows, "batched 1000 x 1 KiB", 4, 1000 * 1024, "-", "numpy, per leaf (floor)")
        out.append(
            _bounded(
                "batched 1000 x 1 KiB x 4 vs one 1000 KiB",
                batched.ratio,
                5.0,
                goal=3.0,
                reference=None if floor is None else floor.ratio,
                reference_system="" if floor is None else "numpy per leaf",
            )
        )
    for loop in ("asyncio", "uvloop", "trio"):  # the target holds on each loop
        scale = sorted(
            (r for r in rows if r.case == "scale (per replica)" and r.loop == loop),
            key=lambda r: r.replicas,
        )
        if len(scale) >= 2:
            ratio = scale[-1].median_us / scale[0].median_us
            # The bare rendezvous's own growth on the same loop (its per-replica cost is
            # each row's baseline: futures on asyncio and uvloop, trio's parking on trio).
            growth = scale[-1].baseline_us / scale[0].baseline_us
            figure = f"per-replica cost, {scale[-1].replicas} vs {scale[0].replicas} replicas"
            if loop != "asyncio":
                figure += f", {loop}"
            system = scale[-1].baseline.removesuffix(", per replica")
            out.append(
                _bounded(figure, ratio, 1.2, goal=1.0, reference=growth, reference_system=system)
            )
    large = _find(rows, "all_reduce", 8, 64 << 20, "asyncio")
    if large is not None:
        figure = "all_reduce 64 MiB x 8 vs best numpy floor"
        out.append(_bounded(figure, large.ratio, 1.15, goal=1.05))
    # The earlier issues' figures.
    if small is not None:
        uvloop = _find(rows, "all_reduce", 8, 8, "uvloop")
        if uvloop is not None:
            ratio = uvloop.median_us / small.median_us
            figure = "all_reduce 8 B x 8, uvloop vs asyncio"
            met = ratio < 1.0  # strictly faster: not a "<=" bound
            out.append(Target(figure, ratio, "x", "< 1x (faster)", met, limit=1.0))
        trio = _find(rows, "all_reduce", 8, 8, "trio")
        if trio is not None:
            ratio = trio.median_us / small.median_us
            out.append(_bounded("all_reduce 8 B x 8, trio vs asyncio", ratio, 2.0))
    apart = _find(rows, "1000 separate 1 KiB", 4, 1000 * 1024, "asyncio")
    if apart is not None:
        figure = "1000 separate all_reduces vs batched"
        out.append(_bounded(figure, apart.ratio, 10.0, unit="x slower", higher_is_better=True))
    for r in rows:
        if r.case in _MOVES and r.system == "asyncreplica":
            figure = f"{r.case} {_size(r.nbytes)} x {r.replicas} vs bytes floor"
            bare = _find(rows, r.case, r.replicas, r.nbytes, r.loop, "futures")
            reference = None if bare is None else bare.ratio
            out.append(
                _bounded(figure, r.ratio, 1.2, reference=reference, reference_system="futures")
            )
    for name in _ARRAY_TYPES:  # issue 18: routing and converting are nearly free
        typed = _find(rows, ARRAY_TYPES_CASE, 8, 1 << 20, "asyncio", name)
        if typed is not None and typed.baseline == NUMPY_INPUTS:  # else: not installed
            out.append(_bounded(f"all_reduce 1 MiB x 8, {name} / numpy inputs", typed.ratio, 1.1))
    for r in rows:
        if r.case == "tracing on":
            out.append(Target("tracing on vs off, 8 B x 8", r.ratio, "x", "(reported)", True))
    return out


def _mpi_targets(report: dict[str, Any], rendezvous_us: float) -> list[Target]:
    """Issue 17's MPI targets, from ``bench --mpi``'s report (``_bench_mpi.measure``).

    Args:
        report: The MPI run's JSON report: ``processes``, ``replicas`` and one row per
            size with ``ours_s``, ``raw_s`` and ``local_s`` (seconds per collective).
        rendezvous_us: A bare futures rendezvous of the MPI run's local replicas (8 B),
            measured in this process: the local part of the 8 B floor.

    The report's ``faults`` rows (see :mod:`asyncreplica._tools._bench_mpi_faults`) give one
    target per kind of fault: its latency across processes, at most 0.2 s.
    """
    out: list[Target] = []
    n = report["replicas"]
    for row in report["rows"]:
        size, ours, raw, local = row["size"], row["ours_s"], row["raw_s"], row["local_s"]
        if size >= 1 << 20:
            figure = f"MPI all_reduce {_size(size)} x {n} vs local sum + raw Allreduce"
            out.append(_bounded(figure, ours / (local + raw), 1.3, goal=1.1))
        elif size == 8:
            extra = ours * 1e6 - (raw * 1e6 + rendezvous_us)
            figure = f"MPI all_reduce 8 B x {n} vs raw Allreduce + local rendezvous"
            out.append(_bounded(figure, extra, 15.0, unit="us", goal=5.0))
    # Every kind of fault reaches every process within 0.2 s (a kind that was not
    # measured, or never reached some process, is missed).
    faults = {row["kind"]: row for row in report.get("faults", [])}
    for kind in FAULT_KINDS:
        row = faults.get(kind)
        latency = row["latency_s"] if row is not None else None
        processes = row["processes"] if row is not None else report["processes"]
        figure = f"MPI fault latency, {kind} ({processes} processes)"
        value = math.nan if latency is None else float(latency)
        out.append(_bounded(figure, value, FAULT_LIMIT_SECONDS, unit="s"))
    return out


def _missed(targets: list[Target]) -> list[Target]:
    """The targets a run did not meet (a figure not measured counts as missed)."""
    return [t for t in targets if not t.met]
