"""Creating a process group: every process announces itself before any collective call.

Split from :mod:`._group`: creating a group is collective (``MPI_Comm_dup``), so a
process that never creates its group would leave the others inside it for ever; the
arrival notes below bound that wait and name the missing processes.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from asyncreplica import BackendError, CollectiveTimeoutError

from ._protocol import MAGIC

__all__ = ["_arrive"]

# -- creating a group: every process announces itself ----------------------------------
#
# Creating a group is collective (MPI_Comm_dup). Before any collective call, each
# process sends every other one an arrival note on the user's communicator (tag
# _ARRIVAL_TAG, 4 int64: magic, kind, the group's serial on that communicator, the
# process's replica count) and waits for theirs. So a process that never creates its
# strategy (exited, or created it on other ranks only) is named in a stall warning and
# after timeout_seconds, instead of leaving the others inside MPI_Comm_dup for ever.

_ARRIVAL_TAG = 0x6172  # "ar"
_GAVE_UP_TAG = 0x6173  # a process gave up waiting (its timeout passed)
_ARRIVED = 1
_GAVE_UP = 2
_logger = logging.getLogger("asyncreplica")
# Per user communicator (by handle): the communicator, and how many groups this
# process created on it.
_created: dict[int, tuple[Any, int]] = {}


def _note_to_all(
    comm: Any, kind: int, serial: int, value: int, tag: int = _ARRIVAL_TAG
) -> list[Any]:
    note = np.array([MAGIC, kind, serial, value], np.int64)
    rank = comm.Get_rank()
    return [comm.Isend(note, dest=r, tag=tag) for r in range(comm.Get_size()) if r != rank]


def _ranks_text(ranks: Sequence[int]) -> str:
    return ("process " if len(ranks) == 1 else "processes ") + ", ".join(map(str, ranks))


def _arrive(
    base: Any, local_replicas: int, timeout: float | None, stall: float | None
) -> list[int]:
    """Announce this process to every other and wait for theirs; every replica count.

    Notes arrive in the order they were sent (MPI does not overtake messages between
    two processes on one communicator and tag), so each process's ``k``-th note is
    the one of its ``k``-th group on this communicator.

    Raises:
        CollectiveTimeoutError: Some processes did not create their group within
            ``timeout`` seconds (the message names them).
        BackendError: A process gave up waiting (its timeout passed) before this one
            arrived, or a malformed note arrived.
    """
    from mpi4py import MPI

    rank, size = base.Get_rank(), base.Get_size()
    handle = base.py2f()
    serial = _created.get(handle, (base, 0))[1]
    _created[handle] = (base, serial + 1)
    counts = [0] * size
    counts[rank] = local_replicas
    if size == 1:
        return counts
    sends = _note_to_all(base, _ARRIVED, serial, local_replicas)
    notes = {r: np.zeros(4, np.int64) for r in range(size) if r != rank}
    recvs = {r: base.Irecv(notes[r], source=r, tag=_ARRIVAL_TAG) for r in notes}
    started = time.monotonic()
    warned = False
    delay = 1e-5
    while True:
        for r in list(recvs):
            if recvs[r].Test():
                del recvs[r]
                magic, kind, their_serial, value = (int(v) for v in notes[r])
                if magic != MAGIC or kind != _ARRIVED:
                    raise BackendError(
                        f"process {r} sent a malformed message while the strategy was being "
                        "created: is the communicator used by other code with tag "
                        f"{_ARRIVAL_TAG}? The processes are out of step."
                    )
                if their_serial != serial:
                    raise BackendError(
                        f"Process {r} is creating its MultiWorkerMirroredStrategy number "
                        f"{their_serial + 1} on this communicator, this process (process "
                        f"{rank}) its number {serial + 1}: the processes created different "
                        "numbers of strategies (one created it alone, or gave up waiting). "
                        "The processes are out of step."
                    )
                counts[r] = value
        if not recvs:
            break
        waited = time.monotonic() - started
        missing = sorted(recvs)
        if stall and not warned and waited >= stall:
            warned = True
            _logger.warning(
                f"MultiWorkerMirroredStrategy creation stalled: process {rank} has waited "
                f"{waited:.1f} s for {_ranks_text(missing)} to create theirs (every process "
                "must create it, in the same order).\n\nThis is a warning, not an error: set "
                "CommunicationOptions(timeout_seconds=...) to fail instead."
            )
        if timeout is not None and waited >= timeout:
            _give_up(base, serial, sends, recvs)
            raise CollectiveTimeoutError(
                0,
                float(timeout),
                {},
                {},
                message=(
                    f"Timed out after {timeout:g} s creating MultiWorkerMirroredStrategy: "
                    f"{_ranks_text(missing)} did not create theirs (this is process {rank} "
                    f"of {size}; arrived: {_ranks_text(sorted(set(range(size)) - set(missing)))})."
                    "\n\nCreating the strategy is collective: every process must create it, "
                    "in the same order. A process that is busy, blocked or took another "
                    "branch never arrives."
                ),
            )
        time.sleep(delay)
        delay = min(delay * 2, 1e-3)
    MPI.Request.Waitall(sends)
    for r in range(size):  # one that arrived, then gave up waiting for a late one
        if r != rank and base.Iprobe(source=r, tag=_GAVE_UP_TAG):
            note = np.zeros(4, np.int64)
            base.Recv(note, source=r, tag=_GAVE_UP_TAG)
            if int(note[1]) == _GAVE_UP:
                raise BackendError(
                    f"Process {r} gave up waiting for the other processes to create "
                    "MultiWorkerMirroredStrategy (its timeout_seconds passed) before this "
                    f"process (process {rank}) created it; the processes are out of step."
                )
    return counts


def _give_up(base: Any, serial: int, sends: list[Any], recvs: dict[int, Any]) -> None:
    """Stop waiting for arrivals: tell the others, so that a late one does not wait."""
    for request in recvs.values():
        with contextlib.suppress(Exception):
            request.Cancel()
    _pending_notes.extend(sends)
    _pending_notes.extend(_note_to_all(base, _GAVE_UP, serial, 0, _GAVE_UP_TAG))


_pending_notes: list[Any] = []
