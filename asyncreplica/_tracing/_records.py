"""What a tracer keeps of a run: its collectives, and its failures as plain data.

:class:`_RunState` is one run (and, once ended, its entry in the tracer's ring
buffer); :class:`_Collective` is one collective of a run, with every replica's arrival,
resumption and signature. :func:`_failure` turns a run's error and flight recorder into
the JSON-ready record that the trace, its summary and its picture show.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .._core._ledger import Key, Report
    from .._core._signature import Signature


#: A run's status in a trace written while it was still going, and its collectives'.
UNFINISHED = "unfinished: still running when the trace was written"
IN_FLIGHT = "in flight when the trace was written"


class _RunState:
    """One run being recorded, and, once ended, its record in the ring buffer."""

    __slots__ = (
        "begin",
        "cancelled",
        "devices",
        "end",
        "failed",
        "index",
        "num_replicas",
        "open",
        "outer",
    )

    def __init__(
        self,
        index: int,
        num_replicas: int,
        devices: tuple[str, ...],
        begin: int,
        outer: _RunState | None,
    ) -> None:
        self.index = index
        self.num_replicas = num_replicas
        self.devices = devices
        self.begin = begin
        self.end: int | None = None
        self.failed = False
        self.cancelled = False  # by a scope around Strategy.run
        self.open: dict[Key, _Collective] = {}
        self.outer = outer  # the run this one is nested in (a run from a merge_fn)


class _Collective:
    """One collective of one run: every replica's arrival and resumption, the dispatch."""

    __slots__ = (
        "arrivals",
        "cancelled",
        "closed_at",
        "d0",
        "d1",
        "id",
        "key",
        "last",
        "pending",
        "rejected",
        "resumes",
        "run",
        "signatures",
    )

    def __init__(self, ident: int, run: int, key: Key, num_replicas: int) -> None:
        self.id = ident
        self.run = run
        self.key = key
        self.arrivals: list[int | None] = [None] * num_replicas
        self.resumes: list[int | None] = [None] * num_replicas
        self.signatures: list[Signature | None] = [None] * num_replicas
        self.last: int | None = None  # the replica that dispatched it
        self.d0: int | None = None  # dispatch began
        self.d1: int | None = None  # dispatch ended
        self.pending = 0  # replicas arrived and not yet resumed
        self.closed_at: int | None = None  # run end, for a collective that never completed
        self.cancelled = False  # it never completed because the run was cancelled
        self.rejected: int | None = None  # the replica whose arrival a mismatch refused

    def cost(self) -> int:
        """How many trace events this collective becomes (its slices)."""
        return sum(t is not None for t in self.arrivals) + (self.d0 is not None)


def _where(signature: Signature | None) -> str | None:
    if signature is None or signature.call_site is None:
        return None
    return str(signature.call_site)


def _history_entry(seq: int, signature: Signature) -> dict[str, Any]:
    return {"seq": seq, "collective": signature.describe(), "call_site": _where(signature)}


def did_not_arrive(failure: Mapping[str, Any]) -> str | None:
    """What the trace, its summary and its picture say of a replica that missed a failure.

    ``"did not arrive at position 1"`` (or ``at 'grads' #0``) for the collective
    ``failure`` names; None when it names none.
    """
    position = failure.get("position")
    if not isinstance(position, int):
        return None
    name = failure.get("name")
    where = f"position {position}" if name is None else f"{name!r} #{position}"
    return f"did not arrive at {where}"


def _failure(
    error: BaseException, report: Report | None, now: int, state: _RunState | None
) -> dict[str, Any]:
    """A failure as plain data: the error and every replica's flight recorder."""
    message = str(error)
    replicas = []
    if report is not None:
        for row in report.rows:
            replicas.append(
                {
                    "replica": row.replica_id,
                    "state": row.state.value,
                    "position": row.position,
                    "collective": None if row.signature is None else row.signature.describe(),
                    "call_site": _where(row.signature),
                    "history": [_history_entry(seq, sig) for seq, sig in row.history],
                }
            )
    fields = getattr(error, "fields", None)
    position = getattr(error, "position", None)
    return {
        "time_ns": now,
        "run": None if state is None else state.index,
        "type": type(error).__name__,
        "message": message,
        "first_line": message.splitlines()[0] if message else type(error).__name__,
        "position": position if isinstance(position, int) else None,
        "name": getattr(error, "name", None) if isinstance(error, Exception) else None,
        "fields": list(fields) if isinstance(fields, tuple | list) else None,
        "replicas": replicas,
    }
