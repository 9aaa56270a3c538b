"""Creating a process group: every process announces itself before any collective call.

Split from :mod:`._group`: creating a group is collective (``MPI_Comm_dup``), so a
process that never creates its group would leave the others inside it for ever; the
arrival notes below bound that wait and name the missing processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import signal
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from asyncreplica import BackendError, CollectiveTimeoutError, ReplicaExitedError

from ._protocol import MAGIC, describe_exception, from_wire, to_wire

__all__ = [
    "_arrive",
    "_note_exit",
    "agree_options",
    "comm_key",
    "created_any",
    "complete_pending_notes",
    "drain_exit_notes",
    "freed_keys",
    "interrupt_count",
    "interrupt_pending",
    "notes_comm",
    "take_interrupt",
]

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
_EXIT_TEXT_TAG = 0x6174  # after an exit note: why the process exits (UTF-8)
_REFUSAL_TEXT_TAG = 0x6175  # after a refusal note: the refused arguments' error (UTF-8)
_ARRIVED = 1
_GAVE_UP = 2
_EXITED = 3  # on _ARRIVAL_TAG: the process exits and creates no more groups
# On _ARRIVAL_TAG: the process arrived, but its constructor refused its own arguments;
# its value says the exception's class (_REFUSAL_CLASSES), its text follows.
_REFUSED = 5
_REFUSAL_CLASSES: dict[int, type[Exception]] = {1: ValueError, 2: TypeError}
_ANNOUNCE_SECONDS = 0.05  # a creation that waits this long is named to the peers
_COMMIT = 4  # on _GAVE_UP_TAG: every process arrived; this one will create the group
_INTERRUPTED = 1  # the value of a _GAVE_UP note: the process was interrupted (Ctrl-C)
_logger = logging.getLogger("asyncreplica")
# Per user communicator (by comm_key): the communicator, and how many groups this
# process created on it.
_created: dict[int, tuple[Any, int]] = {}
# Per user communicator (by comm_key): the library's own duplicate of it, made when the
# first group on it is created (every process arrived). The notes of every later
# creation, and the exit notes, travel there, never on the user's communicator: a note
# left there would be received by the program's own ``comm.recv()`` (ANY_SOURCE,
# ANY_TAG).
_channels: dict[int, Any] = {}
_keyval: list[int] = []  # the MPI attribute that holds a communicator's comm_key
_next_key = itertools.count(1)
# The keys of the communicators the program freed (MPI deleted their attribute), in
# order: their groups are released once every process dropped them (see _exit).
freed_keys: list[int] = []


def _deleted(comm: Any, keyval: int, key: Any) -> None:
    """MPI deletes a communicator's comm_key (the program freed it): note the key."""
    freed_keys.append(int(key))


def comm_key(comm: Any) -> int:
    """This process's key for the communicator ``comm``, which no later one gets.

    Not its handle (``py2f()``): MPICH gives a communicator the program freed and a new
    one the same handle, and state kept by handle outlived the first (the second's
    creation hung, waiting for itself). The key is an MPI attribute of the communicator
    itself, set the first time it is seen: every Python object for it finds it, and a
    new communicator starts without one.
    """
    from mpi4py import MPI

    if not _keyval:
        _keyval.append(MPI.Comm.Create_keyval(delete_fn=_deleted))
    key = comm.Get_attr(_keyval[0])
    if key is None:
        key = next(_next_key)
        comm.Set_attr(_keyval[0], key)
    return int(key)


def notes_comm(base: Any) -> Any:
    """Where this process's notes about ``base`` travel.

    The library's duplicate of it once a group was created on it, else ``base``
    itself (its first creation).
    """
    return _channels.get(comm_key(base), base)


def _note_to_all(
    comm: Any, kind: int, serial: int, value: int, tag: int = _ARRIVAL_TAG
) -> list[Any]:
    note = np.array([MAGIC, kind, serial, value], np.int64)
    rank = comm.Get_rank()
    return [comm.Isend(note, dest=r, tag=tag) for r in range(comm.Get_size()) if r != rank]


_interrupts_seen: list[int] = [0]  # the largest count seen (see interrupt_count)
_interrupts_taken: list[int] = [0]  # the count when one was last acted on


def _runner_sigint() -> tuple[int, Any]:
    """The SIGINT count of asyncio's runner, and its main task (None without a runner).

    Read, never changed: asyncreplica installs no signal handler.
    """
    handler = signal.getsignal(signal.SIGINT)
    runner = getattr(getattr(handler, "func", None), "__self__", None)
    count = int(getattr(runner, "_interrupt_count", 0) or 0)
    if count:
        _interrupts_seen[:] = [max(count, *_interrupts_seen)]
    keywords = getattr(handler, "keywords", None)
    return count, keywords.get("main_task") if count and isinstance(keywords, dict) else None


def interrupt_count() -> int:
    """How many SIGINTs asyncio's runner got (it counts them; 0 without a runner).

    Once seen, a count outlives its runner: a second Ctrl-C makes the runner restore
    the default handler before it cancels the remaining tasks (whose errors name it).
    """
    return max(_runner_sigint()[0], *_interrupts_seen)


def interrupt_pending() -> bool:
    """Whether asyncio's runner got a Ctrl-C not taken yet, its main task still cancelled.

    ``asyncio.run`` (and ``anyio.run``) turn the first Ctrl-C into a cancellation of the
    main task, which a wait that does not yield to the loop (the constructor's), or a
    shielded one (a collective's), does not take: such a wait looks here, and takes it
    (see :func:`take_interrupt`). A Ctrl-C once taken is not pending again.
    """
    count, task = _runner_sigint()
    if count <= _interrupts_taken[0] or task is None or task.done():
        return False
    cancelling = getattr(task, "cancelling", None)  # Python 3.11+
    return cancelling is None or cancelling() > 0


_interrupts_raised: list[int] = [0]  # the runner's count when one was last raised late


def interrupt_swallowed() -> bool:
    """Whether asyncio's runner's latest Ctrl-C cancelled this task and never reached it.

    The runner cancels its main task; a run's replicas finish their collectives first
    (shielded), and anyio's task group then raises their error (a peer's exit) instead
    of the cancellation: this process's own Ctrl-C would be lost. True once per Ctrl-C,
    in the main task, while it is still being cancelled.
    """
    count, task = _runner_sigint()
    if count <= _interrupts_raised[0] or task is None or task is not asyncio.current_task():
        return False
    cancelling = getattr(task, "cancelling", None)  # Python 3.11+
    if cancelling is None or not cancelling():
        return False
    _interrupts_raised[0] = count
    return True


def take_interrupt() -> None:
    """The pending Ctrl-C was acted on (raised, or said): it is not pending any more."""
    _interrupts_taken[0] = _runner_sigint()[0]


def _ranks_text(ranks: Sequence[int]) -> str:
    return ("process " if len(ranks) == 1 else "processes ") + ", ".join(map(str, ranks))


def _arrive(
    base: Any,
    local_replicas: int,
    timeout: float | None,
    stall: float | None,
    announce: Callable[[bool], None] | None = None,
    elsewhere: Callable[[list[int]], dict[int, str]] | None = None,
    refusal: BaseException | None = None,
) -> list[int]:
    """Announce this process to every other and wait for theirs; every replica count.

    ``refusal``: this process's constructor refused its own arguments (a ``ValueError``
    or ``TypeError``): it still arrives, with a refusal note naming the error, so that
    every process leaves the creation alike, in step, with no strategy (the peers raise
    the same class, naming it; here the caller raises its own error).

    Notes arrive in the order they were sent (MPI does not overtake messages between
    two processes on one communicator and tag), so each process's ``k``-th note is
    the one of its ``k``-th group on this communicator.

    An interruption (Ctrl-C) while it waits gives up like a timeout, telling the
    others, and raises ``KeyboardInterrupt`` at once; under ``asyncio.run``, whose
    handler only cancels the main task (blocked here), at the next poll.

    ``announce(True)`` is called once the wait lasts (so that a peer waiting in a
    collective of another strategy names this one in its stall warning), and
    ``announce(False)`` when it ends.

    Raises:
        CollectiveTimeoutError: Some processes did not create their group within
            ``timeout`` seconds (the message names them).
        BackendError: A process gave up waiting (its timeout passed) before this one
            arrived, or a malformed note arrived.
        KeyboardInterrupt: This process was interrupted while it waited.
        ValueError, TypeError: A process refused its own arguments (see ``refusal``).
    """
    from mpi4py import MPI

    rank, size = base.Get_rank(), base.Get_size()
    handle = comm_key(base)
    serial = _created.get(handle, (base, 0))[1]
    _created[handle] = (base, serial + 1)
    counts = [0] * size
    counts[rank] = local_replicas
    if size == 1:
        return counts
    comm = notes_comm(base)
    if refusal is None:
        sends = _note_to_all(comm, _ARRIVED, serial, local_replicas)
    else:
        code = 2 if isinstance(refusal, TypeError) else 1
        text = to_wire(describe_exception(refusal))
        sends = _note_to_all(comm, _REFUSED, serial, code)
        sends += [comm.Isend(text, dest=r, tag=_REFUSAL_TEXT_TAG) for r in range(size) if r != rank]
    notes = {r: np.zeros(4, np.int64) for r in range(size) if r != rank}
    recvs = {r: comm.Irecv(notes[r], source=r, tag=_ARRIVAL_TAG) for r in notes}
    announced: list[bool] = []
    refused: dict[int, tuple[int, str]] = {}

    def lasts() -> None:
        if announce is not None and not announced:
            announced.append(True)
            with contextlib.suppress(Exception):  # best effort: it only names a place
                announce(True)

    try:
        _await_arrivals(
            comm, serial, timeout, stall, sends, notes, recvs, counts, lasts, elsewhere, refused
        )
    except KeyboardInterrupt:
        if recvs:  # the others must not wait for this process's commit
            _give_up(comm, serial, sends, recvs, interrupted=True)
        else:
            _pending_notes.extend(sends)
        raise
    except BaseException:
        # A receive left posted keeps its communicator referenced (MPICH reports it at
        # finalize, "pending 1 references"); the notes sent are completed at exit.
        _cancel(recvs.values())
        _pending_notes.extend(sends)
        raise
    finally:
        if announced and announce is not None:
            with contextlib.suppress(Exception):
                announce(False)
    MPI.Request.Waitall(sends)
    _commit(comm, serial, timeout, stall)
    if refused and refusal is None:
        raise _refused_error(rank, refused)
    if refusal is not None:
        return counts  # the caller raises its own error
    if handle not in _channels:  # every process committed: every one duplicates
        _channels[handle] = base.Dup()
    return counts


def _refused_error(rank: int, refused: Mapping[int, tuple[int, str]]) -> Exception:
    """The error a process raises where other processes refused their own arguments.

    Of their class (``ValueError`` unless every one raised ``TypeError``), as one
    process that refused those arguments raises.
    """
    codes = {code for code, _ in refused.values()}
    cls = _REFUSAL_CLASSES[codes.pop()] if len(codes) == 1 else ValueError
    lines = "\n".join(f"  * process {r}: {text}" for r, (_, text) in sorted(refused.items()))
    return cls(
        f"MultiWorkerMirroredStrategy was not created: {_ranks_text(sorted(refused))} "
        f"refused {'its' if len(refused) == 1 else 'their'} own arguments (this is process "
        f"{rank}):\n\n{lines}\n\nCreating the strategy is collective, so no strategy was "
        "created, on any process; the processes are still in step. Fix the arguments that "
        "process passes (its own error says which), or create the strategy again on every "
        "process."
    )


def _await_arrivals(
    base: Any,
    serial: int,
    timeout: float | None,
    stall: float | None,
    sends: list[Any],
    notes: dict[int, Any],
    recvs: dict[int, Any],
    counts: list[int],
    lasts: Callable[[], None],
    elsewhere: Callable[[list[int]], dict[int, str]] | None = None,
    refused: dict[int, tuple[int, str]] | None = None,
) -> None:
    """Poll the arrival notes of :func:`_arrive` (``recvs``, completed ones removed).

    ``refused``: filled with the peers that refused their own arguments (their class
    code and error text).

    ``elsewhere``: where the missing processes wait instead (at a collective of an
    older strategy), for the stall warning.
    """
    from mpi4py import MPI

    rank, size = base.Get_rank(), base.Get_size()
    started = time.monotonic()
    warned = False
    delay = 1e-5
    while True:
        for r in list(recvs):
            if recvs[r].Test():
                del recvs[r]
                magic, kind, their_serial, value = (int(v) for v in notes[r])
                if magic == MAGIC and kind == _EXITED:
                    _raise_exited(base, r, rank, serial)
                if magic == MAGIC and kind == _REFUSED and value in _REFUSAL_CLASSES:
                    status = MPI.Status()
                    base.Probe(source=r, tag=_REFUSAL_TEXT_TAG, status=status)
                    text = np.empty(status.Get_count(MPI.BYTE), np.uint8)
                    base.Recv(text, source=r, tag=_REFUSAL_TEXT_TAG)
                    if refused is not None:
                        refused[r] = (value, from_wire(text))
                    value = 0
                elif magic != MAGIC or kind != _ARRIVED:
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
        if waited >= _ANNOUNCE_SECONDS:
            lasts()
        if stall and not warned and waited >= stall:
            warned = True
            places = elsewhere(missing) if elsewhere is not None else {}
            where = "".join(
                f"\n  * process {r} waits {place} (for this process), while this process "
                "creates a new strategy: each waits for the other (a deadlock, unless "
                "another task of that process creates this strategy)"
                for r, place in sorted(places.items())
            )
            unknown = [r for r in missing if r not in places]
            if unknown:
                where += f"\n  * {_not_here(base, unknown)}"
            _logger.warning(
                f"MultiWorkerMirroredStrategy creation stalled: process {rank} has waited "
                f"{waited:.1f} s for {_ranks_text(missing)} to create theirs (every process "
                f"must create it, in the same order).{where}\n\nThis is a warning, not an "
                "error: set CommunicationOptions(timeout_seconds=...) to fail instead."
            )
        if timeout is not None and waited >= timeout:
            _give_up(base, serial, sends, recvs)
            sends.clear()  # kept by _give_up
            raise CollectiveTimeoutError(
                0,
                float(timeout),
                {},
                {},
                message=(
                    f"Timed out after {timeout:g} s creating MultiWorkerMirroredStrategy: "
                    f"{_ranks_text(missing)} did not create theirs (this is process {rank} "
                    f"of {size}; arrived: {_ranks_text(sorted(set(range(size)) - set(missing)))})."
                    f"\n\n{_not_here(base, missing)}"
                    "\n\nCreating the strategy is collective: every process must create it, "
                    "in the same order. A process that is busy, blocked or took another "
                    "branch never arrives."
                ),
            )
        time.sleep(delay)
        delay = min(delay * 2, 1e-3)
        if interrupt_pending():
            # asyncio's runner got Ctrl-C and cancelled the main task, which waits here
            # without yielding: take the interruption now, not at the peers' arrival.
            take_interrupt()
            raise KeyboardInterrupt


def _comm_text(base: Any) -> str:
    """The communicator ``base`` in words: its MPI name, or what it is."""
    from mpi4py import MPI

    name = ""
    with contextlib.suppress(Exception):
        name = str(base.Get_name())
    if base == MPI.COMM_WORLD:
        return "COMM_WORLD"
    if name:
        return f"the communicator {name!r}"
    return f"a communicator of {base.Get_size()} processes (not COMM_WORLD)"


def _not_here(base: Any, ranks: list[int]) -> str:
    """What a creation's stall warning and timeout say of peers it has no note from.

    A peer that has not announced itself on ``base`` may be creating a strategy on
    another communicator (a duplicate or a split of this one): its notes travel on
    that communicator, which this process does not listen on, so it cannot be told
    from a busy one, and two creations in opposite orders cannot be detected.
    """
    them = _ranks_text(ranks)
    one = len(ranks) == 1
    return (
        f"{them} {'has' if one else 'have'} not announced {'itself' if one else 'themselves'} "
        f"on {_comm_text(base)}, where this process creates it: "
        f"{'it is' if one else 'they are'} busy or blocked, took another branch, or "
        f"{'is' if one else 'are'} creating a strategy on another communicator (the "
        "creations on two communicators, a duplicate or split of this one, made in "
        "opposite orders wait for each other for ever: create the strategies in the same "
        "order on every process)."
    )


def _commit(base: Any, serial: int, timeout: float | None, stall: float | None) -> None:
    """Every process arrived here: say so, and hear each peer's decision (second phase).

    A peer that gave up waiting (its timeout passed) before this process arrived sent a
    give-up note instead of its commit: one note per peer, either one, so a late process
    never misses it (a single probe could look before it arrived) and never enters
    ``MPI_Comm_dup`` alone.

    Raises:
        BackendError: A peer gave up waiting before this process arrived.
    """
    from mpi4py import MPI

    rank, size = base.Get_rank(), base.Get_size()
    sends = _note_to_all(base, _COMMIT, serial, 0, _GAVE_UP_TAG)
    notes = {r: np.zeros(4, np.int64) for r in range(size) if r != rank}
    recvs = {r: base.Irecv(notes[r], source=r, tag=_GAVE_UP_TAG) for r in notes}
    started = time.monotonic()
    delay = 1e-5
    warned = False
    gave_up: list[int] = []
    interrupted: list[int] = []
    while recvs:
        for r in list(recvs):
            if recvs[r].Test():
                del recvs[r]
                if int(notes[r][1]) != _COMMIT:
                    gave_up.append(r)
                    if int(notes[r][3]) == _INTERRUPTED:
                        interrupted.append(r)
        if not recvs:
            break
        waited = time.monotonic() - started
        if stall and not warned and waited >= stall:
            warned = True
            _logger.warning(
                f"MultiWorkerMirroredStrategy creation stalled: process {rank} has waited "
                f"{waited:.1f} s for {_ranks_text(sorted(recvs))} to confirm the creation "
                "(every process arrived)."
            )
        if timeout is not None and waited >= timeout:
            _cancel(recvs.values())
            _pending_notes.extend(sends)
            raise BackendError(
                f"Timed out after {timeout:g} s confirming the creation of "
                f"MultiWorkerMirroredStrategy with {_ranks_text(sorted(recvs))} (every "
                "process had arrived); the processes are out of step."
            )
        time.sleep(delay)
        delay = min(delay * 2, 1e-3)
    MPI.Request.Waitall(sends)
    if gave_up:
        # Their exit notes follow (sent from their exit hook, see _note_exit), and
        # nothing here waits for them any more: received at this process's exit, since
        # MPICH's MPI_Finalize stalls on the sender's side (the job then ends with
        # status 0, although that process died of its exception).
        _, peers = _gave_up_peers.setdefault(comm_key(base), (base, set()))
        peers.update(gave_up)
    if interrupted:
        r = interrupted[0]
        raise ReplicaExitedError(
            0,
            0,
            {},
            exited_count=0,
            exited_last=None,
            message=(
                f"Process {r} was interrupted (KeyboardInterrupt: SIGINT, Ctrl-C) while it "
                "waited for the other processes to create MultiWorkerMirroredStrategy, "
                f"before this process (process {rank}) created it: it gave up creating "
                "it.\n\nLook at that process's own output; the job cannot go on with it."
            ),
        )
    if gave_up:
        r = gave_up[0]
        raise BackendError(
            f"Process {r} gave up waiting for the other processes to create "
            "MultiWorkerMirroredStrategy (its timeout_seconds passed) before this "
            f"process (process {rank}) created it; the processes are out of step."
        )


#: What each option decides (the message of a difference).
_WHY = {
    "check_call_sites": "what the processes compare at every collective",
    "backend": "the rules that combine each process's replicas",
}


def agree_options(comm: Any, options: Mapping[str, object]) -> None:
    """Compare the strategy options every process must give alike; refuse a difference.

    Collective on ``comm`` (a new duplicate: every process has arrived). Each process's
    options travel as JSON bytes (never pickled), so every process sees every process's
    values and raises the same error, from here, before the strategy exists.

    Raises:
        ValueError: An option differs between processes; the message names each
            differing option and its value on each process.
    """
    from mpi4py import MPI

    size = comm.Get_size()
    if size == 1:
        return
    mine = to_wire(json.dumps(dict(options), sort_keys=True))
    lengths = np.zeros(size, np.int64)
    comm.Allgather(np.array([mine.size], np.int64), lengths)
    displs = [int(sum(lengths[:r])) for r in range(size)]
    received = np.empty(int(lengths.sum()), np.uint8)
    comm.Allgatherv(mine, [received, lengths.tolist(), displs, MPI.BYTE])
    everyone = [
        dict(json.loads(from_wire(received[d : d + int(n)])))
        for d, n in zip(displs, lengths, strict=True)
    ]
    lines = []
    for name in sorted({name for values in everyone for name in values}):
        by_value: dict[str, list[int]] = {}
        for rank, values in enumerate(everyone):
            by_value.setdefault(repr(values.get(name)), []).append(rank)
        if len(by_value) > 1:
            held = "; ".join(
                f"{value} on {_ranks_text(ranks)}" for value, ranks in by_value.items()
            )
            why = f" ({_WHY[name]})" if name in _WHY else ""
            lines.append(f"  * {name}{why}: {held}")
    if not lines:
        return
    raise ValueError(
        "MultiWorkerMirroredStrategy was created with options that differ between "
        f"processes (this is process {comm.Get_rank()}):\n\n"
        + "\n".join(lines)
        + "\n\nEvery process must create its strategy with the same values of these "
        "options: pass the same ones on every process. No strategy was created, on any "
        "process; the processes are still in step."
    )


def _raise_exited(base: Any, source: int, rank: int, serial: int) -> None:
    """A peer's exit note arrived where its arrival note was expected: raise at once."""
    from mpi4py import MPI

    _consumed.add((comm_key(base), source))
    status = MPI.Status()
    base.Probe(source=source, tag=_EXIT_TEXT_TAG, status=status)
    buf = np.empty(status.Get_count(MPI.BYTE), np.uint8)
    base.Recv(buf, source=source, tag=_EXIT_TEXT_TAG)
    why = from_wire(buf)
    raise ReplicaExitedError(
        0,
        0,
        {},
        exited_count=0,
        exited_last=None,
        message=(
            f"Process {source} {why}, without creating its MultiWorkerMirroredStrategy "
            f"number {serial + 1} on this communicator, which this process (process "
            f"{rank}) is creating: it never will.\n\nEvery process must create the same "
            "strategies, in the same order; look at process "
            f"{source}'s own output for why it ended."
        ),
    )


def drain_exit_notes(base: Any, sources: Sequence[int], seconds: float = 2.0) -> None:
    """Receive the exit notes that ``sources`` sent on ``base`` and nobody received.

    At exit, after the goodbye exchange told which peers sent one: MPICH's
    ``MPI_Finalize`` stalls on a message that was sent and never received.
    """
    from mpi4py import MPI

    base = notes_comm(base)
    handle = comm_key(base)
    status = MPI.Status()
    for source in sources:
        if (handle, source) in _consumed:
            continue
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            if not base.Iprobe(source=source, tag=_ARRIVAL_TAG, status=status):
                time.sleep(1e-3)
                continue
            note = np.zeros(4, np.int64)
            base.Recv(note, source=source, tag=_ARRIVAL_TAG)
            if int(note[1]) == _EXITED:
                base.Probe(source=source, tag=_EXIT_TEXT_TAG, status=status)
                text = np.empty(status.Get_count(MPI.BYTE), np.uint8)
                base.Recv(text, source=source, tag=_EXIT_TEXT_TAG)
                _consumed.add((handle, source))
                break


def created_any() -> bool:
    """Whether this process started creating a strategy (on any communicator)."""
    return bool(_created)


def _note_exit(error: str | None, finalized: bool, only: Iterable[int] | None = None) -> None:
    """At exit (or MPI.Finalize): end this process's arrival notes with an exit note.

    Sent for every communicator a strategy was created on (``COMM_WORLD`` before any
    exists), or for those of ``only`` (their handles): a peer still creating a strategy
    there (or creating one later) raises at once. Once a group was created on a
    communicator they travel on the library's duplicate of it (:func:`notes_comm`).
    """
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    bases = dict(_created) or {comm_key(world): (world, 0)}
    if only is not None:
        keep = set(only)
        bases = {handle: entry for handle, entry in bases.items() if handle in keep}
    why = (
        f"exited after an uncaught {error.rstrip(':')}"  # its first line may end in ":"
        if error
        else "finalized MPI (MPI.Finalize()) before creating its strategy"
        if finalized and not _created
        else "finalized MPI (MPI.Finalize())"
        if finalized
        else "exited"
    )
    text = to_wire(why)
    for key, (user_base, serial) in bases.items():
        with contextlib.suppress(Exception):  # a freed communicator: nobody to tell
            base = _channels.get(key, user_base)
            if base.Get_size() == 1:
                continue
            _pending_notes.extend(_note_to_all(base, _EXITED, serial, text.size))
            rank = base.Get_rank()
            _pending_notes.extend(
                base.Isend(text, dest=r, tag=_EXIT_TEXT_TAG)
                for r in range(base.Get_size())
                if r != rank
            )


def _give_up(
    base: Any, serial: int, sends: list[Any], recvs: dict[int, Any], *, interrupted: bool = False
) -> None:
    """Stop waiting for arrivals: tell the others, so that a late one does not wait.

    ``interrupted``: because of an interruption (Ctrl-C), not a timeout (the note says so).
    """
    _cancel(recvs.values())
    _pending_notes.extend(sends)
    value = _INTERRUPTED if interrupted else 0
    _pending_notes.extend(_note_to_all(base, _GAVE_UP, serial, value, _GAVE_UP_TAG))


def _cancel(requests: Iterable[Any]) -> None:
    """Cancel posted receives and complete them.

    A cancelled request never completed keeps its communicator referenced, and MPICH's
    finalize reports it on stderr ("Builtin communicator ... has pending 1 references").
    """
    for request in requests:
        with contextlib.suppress(Exception):
            request.Cancel()
            request.Wait()


_pending_notes: list[Any] = []
# Per communicator (notes_comm's comm_key): the peers whose give-up note this process
# received while it created a strategy, whose exit notes it receives at exit.
_gave_up_peers: dict[int, tuple[Any, set[int]]] = {}


def drain_given_up(seconds: float = 2.0) -> None:
    """At exit: receive the exit notes of the peers that gave up creating a strategy.

    Such a peer told this process with its give-up note, and its exit hook sends its
    exit notes as well (for a later creation, which it will never join): nobody else
    receives them.
    """
    for base, peers in _gave_up_peers.values():
        with contextlib.suppress(Exception):
            drain_exit_notes(base, sorted(peers), seconds)


def complete_pending_notes(seconds: float = 2.0) -> None:
    """At exit: complete the notes sent and never waited for.

    A request left holding a communicator makes MPICH report "pending references" at
    finalize.
    """
    until = time.monotonic() + seconds
    while _pending_notes and time.monotonic() < until:
        with contextlib.suppress(Exception):
            _pending_notes[:] = [r for r in _pending_notes if not r.Test()]
        if _pending_notes:
            time.sleep(1e-3)


# (communicator's comm_key, rank): the exit notes this process received.
_consumed: set[tuple[int, int]] = set()
