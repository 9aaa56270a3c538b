"""The printed tables and the machine description of a report."""

from __future__ import annotations

import math
import os
import platform

import numpy as np

from ._cases import _loops
from ._model import Row, Target, _size


def _shown(value: float, spec: str) -> str:
    """``value`` formatted, or ``-`` where it was not measured (NaN)."""
    return format(value, spec) if math.isfinite(value) else "-"


def _table(rows: list[Row]) -> str:
    header = (
        f"{'case':<22}{'N':>6}{'size':>10}  {'loop':<8}{'system':<24}{'median':>12}  "
        f"{'baseline':<29}{'ratio':>7}"
    )
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(
            f"{r.case:<22}{r.replicas:>6}{_size(r.nbytes):>10}  {r.loop:<8}{r.system:<24}"
            f"{_shown(r.median_us, '.1f'):>10}us  {r.baseline:<29}{_shown(r.ratio, '.2f'):>6}x"
        )
    lines.append("-: not measured (the difference of two runs was within their noise)")
    return "\n".join(lines)


def _targets_table(targets: list[Target]) -> str:
    header = (
        f"{'target':<60}{'measured':>16}  {'target':<16}{'goal':<10}{'met':<5}{'reference':>24}"
    )
    lines = [header, "-" * len(header)]
    for t in targets:
        value = "not measured" if not math.isfinite(t.value) else f"{t.value:.2f} {t.unit}"
        if t.reference is None:
            reference = ""
        else:
            reference = f"{_shown(t.reference, '.2f')} x {t.reference_system}"
        met = "yes" if t.met else "NO"
        line = f"{t.figure:<60}{value:>16}  {t.target:<16}{t.goal:<10}{met:<5}{reference:>24}"
        lines.append(line.rstrip())
    lines.append(
        "target: what this issue asks (checked by --check); goal: where the figure should go "
        "eventually\n"
        "reference: the same figure for a minimal implementation measured in this run: "
        "the bare futures\nrendezvous doing the same work (every replica gets the same "
        "array), or the numpy per-leaf floor of the batch\n(join, sum, one read-only view "
        "per leaf and replica; no rendezvous, no checks)"
    )
    return "\n".join(lines)


def _machine() -> dict[str, object]:
    return {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "loops": _loops(),
    }
