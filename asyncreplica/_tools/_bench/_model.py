"""What a benchmark run records: measured rows, targets, and how sizes are named."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy.typing as npt

Array = npt.NDArray[Any]


@dataclass
class Row:
    """One measured case: a system's median against its baseline."""

    case: str
    replicas: int
    nbytes: int
    loop: str
    system: str
    median_us: float
    baseline: str
    baseline_us: float
    samples: list[float] = field(default_factory=list)

    @property
    def ratio(self) -> float:
        """``median_us / baseline_us``."""
        return self.median_us / self.baseline_us if self.baseline_us else float("nan")


@dataclass
class Target:
    """One target of the performance issue: its measured value and whether it is met."""

    figure: str
    value: float  # NaN: not measured in this run (then the target is not met)
    unit: str
    target: str
    met: bool
    # The same figure for the minimal implementation measured in this run (the futures
    # rendezvous doing the same work, or the numpy per-leaf floor of a batch): what the
    # target asks of ours, a design with no checks and no per-replica views already
    # scores. None where the baseline itself is that implementation.
    reference: float | None = None
    reference_system: str = ""
    goal: str = ""  # where the issue wants the figure eventually (not checked)
    limit: float | None = None  # the target's bound, in ``unit``; None: no bound
    higher_is_better: bool = False


def _bounded(
    figure: str,
    value: float,
    limit: float,
    *,
    unit: str = "x",
    goal: float | None = None,
    higher_is_better: bool = False,
    reference: float | None = None,
    reference_system: str = "",
) -> Target:
    """A target with a numeric bound: ``value <= limit`` (or ``>=``); NaN is not met."""
    sign = ">=" if higher_is_better else "<="
    plus = "+" if unit == "us" else ""
    suffix = f" {unit}" if unit in ("us", "s") else "x"

    def shown(bound: float) -> str:
        return f"{sign} {plus}{bound:g}{suffix}"

    met = (
        (value >= limit if higher_is_better else value <= limit) if math.isfinite(value) else False
    )
    return Target(
        figure,
        value,
        unit,
        shown(limit),
        met,
        reference,
        reference_system,
        "" if goal is None else shown(goal).split(" ", 1)[1],
        limit,
        higher_is_better,
    )


def _size(nbytes: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def _find(
    rows: list[Row], case: str, n: int, nbytes: int, loop: str, system: str = "asyncreplica"
) -> Row | None:
    for r in rows:
        if (r.case, r.replicas, r.nbytes, r.loop, r.system) == (case, n, nbytes, loop, system):
            return r
    return None
