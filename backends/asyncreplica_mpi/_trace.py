"""Merged timelines across processes: every process's trace gathered to rank 0.

Split from :mod:`._group` (which creates a :class:`TraceMerger` per traced block).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from ._group import MPIProcessGroup

__all__ = ["TraceMerger"]


class TraceMerger:
    """Gathers every process's trace to rank 0, with clocks aligned at a barrier.

    Created (collectively) when ``strategy.trace(path)`` starts; :meth:`merge` is
    called (collectively) when it ends. It uses its own duplicate communicator, so it
    never interleaves with the collectives' agreement.
    """

    def __init__(self, group: MPIProcessGroup) -> None:
        self._group = group
        self._comm = group._ctl.Dup()

    def merge(self, trace: dict[str, Any], origin_ns: int) -> dict[str, Any] | None:
        """Every process's ``trace`` merged into one (on rank 0; None elsewhere).

        Each process's timestamps are microseconds since its own ``origin_ns``
        (``perf_counter_ns``); they are shifted so that the instant every process
        left one barrier coincides. Processes become ``pid`` = rank, replica tracks
        are renamed with global replica ids, and flow ids are made unique.
        """
        import time

        MPI = self._group._MPI
        comm = self._comm
        size, rank = comm.Get_size(), comm.Get_rank()
        comm.Barrier()
        since = np.array([(time.perf_counter_ns() - origin_ns) / 1000.0], np.float64)
        payload = np.frombuffer(json.dumps(trace).encode(), np.uint8)
        sinces = np.empty(size, np.float64) if rank == 0 else None
        lengths = np.empty(size, np.int64) if rank == 0 else None
        comm.Gather(since, sinces, root=0)
        comm.Gather(np.array([payload.size], np.int64), lengths, root=0)
        if rank != 0:
            comm.Gatherv(payload, None, root=0)
            comm.Free()
            return None
        assert lengths is not None
        assert sinces is not None
        counts = [int(n) for n in lengths]
        displs = [sum(counts[:r]) for r in range(size)]
        buf = np.empty(sum(counts), np.uint8)
        comm.Gatherv(payload, [buf, counts, displs, MPI.BYTE], root=0)
        comm.Free()
        docs = [
            json.loads(bytes(buf[d : d + n]).decode()) for d, n in zip(displs, counts, strict=True)
        ]
        events: list[dict[str, Any]] = []
        for r, doc in enumerate(docs):
            shift = float(sinces[0] - sinces[r])
            offset = self._group.offsets[r]
            for event in doc["traceEvents"]:
                event["pid"] = r
                if "ts" in event:
                    event["ts"] = round(event["ts"] + shift, 3)
                if "id" in event and isinstance(event["id"], int):
                    event["id"] = event["id"] * size + r
                args = event.get("args")
                if isinstance(args, dict):
                    for key in ("replica", "dispatched_by"):
                        if isinstance(args.get(key), int):
                            args[key] += offset
                if event.get("ph") == "M" and isinstance(args, dict):
                    if event.get("name") == "process_name":
                        args["name"] = f"MPI rank {r}"
                    elif event.get("name") == "thread_name":
                        name = str(args.get("name", ""))
                        if name.startswith("replica "):
                            index, _, rest = name[len("replica ") :].partition(" ")
                            if index.isdigit():
                                args["name"] = f"replica {int(index) + offset}" + (
                                    f" {rest}" if rest else ""
                                )
                events.append(event)
        # A process that began tracing before rank 0 (or a barrier left a little later
        # there) has events before rank 0's origin: the whole trace moves so that its
        # earliest event is at 0 (timestamps are never negative; offsets are kept).
        start = min((e["ts"] for e in events if isinstance(e.get("ts"), int | float)), default=0.0)
        moved = max(0.0, -float(start))
        if moved:
            for event in events:
                if isinstance(event.get("ts"), int | float):
                    event["ts"] = round(event["ts"] + moved, 3)
        merged = dict(docs[0])
        merged["traceEvents"] = events
        clock = "microseconds since rank 0's origin"
        if moved:
            clock = f"microseconds since {moved:g} us before rank 0's origin"
        merged["otherData"] = {
            **docs[0].get("otherData", {}),
            "clock": f"{clock}; other ranks aligned at an MPI barrier",
            "processes": [doc.get("otherData", {}) for doc in docs],
            "mpi_world_size": size,
        }
        return merged
