"""What a benchmark run records: measured rows, targets, and how sizes are named."""

from __future__ import annotations

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
    value: float
    unit: str
    target: str
    met: bool
    # The same figure for the minimal implementation measured in this run (the futures
    # rendezvous doing the same work, or the numpy per-leaf floor of a batch): what the
    # target asks of ours, a design with no checks and no per-replica views already
    # scores. None where the baseline itself is that implementation.
    reference: float | None = None
    reference_system: str = ""


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
