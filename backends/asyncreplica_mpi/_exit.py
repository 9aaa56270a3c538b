"""The end of a process's life: telling the other processes, so that none waits for ever.

Split from :mod:`._group`. A process ends in one of three ways, and each tells its
peers what it can:

* **The interpreter exits** (normally, or of an uncaught exception): an ``atexit``
  hook says goodbye on every group at once (one last exchange each, all posted before
  any is waited for, so that a peer blocked in a collective on any of them is released
  whatever the order it uses them in), and sends an *exit note* to every process on
  every communicator a strategy was created on when it dies of an uncaught exception,
  so that a peer still creating one (or creating one later) raises at once instead of
  waiting in ``MPI_Comm_dup``.
* **MPI is finalized** (``MPI.Finalize()``, explicitly): the same goodbye runs from a
  delete callback on ``MPI_COMM_SELF``, which MPI calls at the start of its finalize,
  while MPI still works.
* **The process is killed, or calls** ``os._exit``: no Python code runs, so nothing
  can be told. MPICH's launcher then ends the other processes (within about 50 ms)
  without a message, and ``mpiexec`` exits with the dead process's status (0 after
  ``os._exit(0)``): see docs/scale-out.md.

The hooks are installed when the first group is created and, when asyncreplica is
imported in a process an MPI launcher started, by :func:`watch` (before any strategy
exists), so an uncaught exception before or inside a constructor reaches the peers.

Every wait here is polled (never ``Wait()``), with a stall warning. Without
``timeout_seconds`` the goodbye waits for ever: a peer that ends later (a last
checkpoint) is not an error. With it, a goodbye that waits longer than its strategy's
``timeout_seconds`` aborts the MPI job, with a message naming what it waited for.
"""

from __future__ import annotations

import atexit
import contextlib
import signal
import sys
import threading
import time
from collections.abc import Callable, Generator, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from asyncreplica import BackendError, ReplicaExitedError

from ._arrival import (
    _channels,
    _logger,
    _note_exit,
    comm_key,
    complete_pending_notes,
    created_any,
    drain_exit_notes,
    drain_given_up,
)
from ._failures import _exchange_text
from ._lifecycle import Event, State
from ._protocol import Status, outcome_message

if TYPE_CHECKING:
    from ._group import MPIProcessGroup

__all__ = [
    "goodbye_all",
    "install_hooks",
    "process_ends",
    "register",
    "release_dropped",
    "uncaught_error",
]

# The last uncaught exception (from sys.excepthook), told to peers at exit.
_uncaught: list[str] = []
# Every group this process created, held until exit (not weakly): the goodbye at exit is
# an exchange on each group, so every process must say it on every group, whether or
# not its own strategy object is still referenced (one process may have collected a
# strategy that another still holds, say in an exception's traceback).
_groups: list[MPIProcessGroup] = []
_hooked: list[str] = []  # "excepthook", "atexit", "finalize": the hooks installed
_said: list[bool] = []  # the goodbye was said (it is said once)
_finalize_keyval: list[Any] = []

_POLL_SECONDS = 1e-3
_ACK_SECONDS = 10.0  # how long a failed process waits for its peers' acknowledgements
# How long a goodbye waits before telling the peers it waits (see farewell).
_ENDING_SECONDS = 0.05
_EXIT_STALL_SECONDS = 30.0  # without any group's own stall_warning_seconds


def uncaught_error() -> str | None:
    """``ValueError: ...``: the uncaught exception this process dies of, if any."""
    return _uncaught[-1] if _uncaught else None


def register(group: MPIProcessGroup) -> None:
    """Hold ``group`` until exit (its goodbye), and install the hooks (once)."""
    _groups.append(group)
    install_hooks(finalize=True)


def _forget(group: MPIProcessGroup) -> None:
    """Stop holding ``group`` (every process released it: no goodbye is owed)."""
    with contextlib.suppress(ValueError):
        _groups.remove(group)


def install_hooks(*, finalize: bool = False) -> None:
    """Install the exception hook and the exit hook (once); with ``finalize``, MPI's too.

    ``finalize`` imports mpi4py (initialising MPI): only once a group is created.
    """
    if "excepthook" not in _hooked:
        _hooked.append("excepthook")
        previous = sys.excepthook

        def hook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
            from ._protocol import describe_exception

            _uncaught.append(describe_exception(value))
            previous(kind, value, tb)

        sys.excepthook = hook
    if "atexit" not in _hooked:
        _hooked.append("atexit")
        atexit.register(goodbye_all)
    if finalize and "finalize" not in _hooked:
        _hooked.append("finalize")
        from mpi4py import MPI

        def at_finalize(comm: Any, keyval: Any, value: Any) -> None:
            goodbye_all(finalized=True)

        keyval = MPI.Comm.Create_keyval(delete_fn=at_finalize)
        MPI.COMM_SELF.Set_attr(keyval, 1)
        _finalize_keyval.append(keyval)


def process_ends(error: BaseException | None, *, exiting: bool) -> None:
    """What :func:`asyncreplica._launch.watch` calls before any strategy exists.

    ``error``: an uncaught exception (from its exception hook), recorded; ``exiting``:
    the interpreter exits, so the goodbye (here: the exit notes) is said now. A process
    that dies before (or inside) its first strategy's constructor so tells the others,
    which wait for it to create its strategy.
    """
    if error is not None:
        from ._protocol import describe_exception

        _uncaught.append(describe_exception(error))
    if exiting:
        goodbye_all()
    elif error is None:
        # Called at import, MPI in use: a process that finalizes MPI before creating
        # its strategy tells the peers that wait for it in their constructors.
        MPI = sys.modules.get("mpi4py.MPI")
        if MPI is not None and MPI.Is_initialized() and not MPI.Is_finalized():
            install_hooks(finalize=True)


def goodbye_all(*, finalized: bool = False) -> None:
    """Say goodbye on every group at once, and send the exit notes (once).

    Every group's goodbye exchange is posted before any is waited for, so a peer that
    waits in a collective on any group (whichever order it uses them in) sees this
    process exit there. The waits are polled, with a stall warning, bounded by the
    groups' timeout.
    """
    if _said:
        return
    MPI = sys.modules.get("mpi4py.MPI")
    if MPI is None or not MPI.Is_initialized() or MPI.Is_finalized():
        _said.append(True)
        for group in _groups:
            group.closed(finalized=True)
        return
    _said.append(True)
    error = uncaught_error()
    # Every process posts its release exchanges for the communicators it freed (none
    # is left pending on one side).
    release_freed(at_exit=True)
    groups = [g for g in _groups if not g.is_closed()]
    # A peer still creating a strategy (or creating one later) learns that this process
    # will create none: its arrival notes end with an exit note. MPICH's MPI_Finalize
    # fails on a message nobody received, so a process that ends normally sends them
    # only where a goodbye exchange with every peer follows (the communicators of its
    # groups that no peer has left): the exchange tells the peers to receive them (see
    # farewell, and _complete where a peer in a collective meets it). An uncaught
    # exception (or a finalize before any strategy) tells every communicator.
    if error is not None or (finalized and not created_any()):
        _note_exit(error, finalized)
        noted = {g._base_key for g in groups}
    else:
        noted = {
            g._base_key
            for g in groups
            if g.size > 1 and not g._departed and g._broken is None and not g._failed_here
        }
        if noted:
            _note_exit(None, finalized, only=noted)
    for group in groups:
        acknowledge(group)
    steps = [(g, farewell(g, error, finalized, g._base_key in noted)) for g in groups]
    with _interrupts_counted() as interrupts:
        _drive_all(steps, interrupts)
    # The exit notes the peers sent (their goodbye said so), received: MPICH's finalize
    # stalls on a message nobody received.
    # Per communicator, from every peer that any of its groups saw send them.
    noting: dict[int, tuple[Any, set[int]]] = {}
    for group in groups:
        if group._noted_peers:
            _, ranks = noting.setdefault(
                group._base_key, (_channels.get(group._base_key, group._base), set())
            )
            ranks |= group._noted_peers
    for base, ranks in noting.values():
        with contextlib.suppress(Exception):
            drain_exit_notes(base, sorted(ranks))
    drain_given_up()
    complete_pending_notes()
    for group in groups:
        free(group, finalized=finalized)


@contextlib.contextmanager
def _interrupts_counted() -> Iterator[list[int]]:
    """Count SIGINT (Ctrl-C) during the goodbye instead of raising KeyboardInterrupt.

    A KeyboardInterrupt raised inside the goodbye would abandon its exchange half done
    (a peer that meets it then waits for ever for the rest): the poll loop reads the
    count instead (see :func:`_interrupted`). Only in the main thread (where Python
    runs signal handlers); the program's own handler is restored after.
    """
    count: list[int] = []
    try:
        previous = signal.signal(signal.SIGINT, lambda signum, frame: count.append(signum))
    except (ValueError, OSError, TypeError):  # not the main thread: nothing to count
        yield count
        return
    try:
        yield count
    finally:
        with contextlib.suppress(ValueError, OSError, TypeError):
            signal.signal(
                signal.SIGINT, previous if previous is not None else signal.default_int_handler
            )


def _interrupted(groups: list[MPIProcessGroup], interrupts: list[int], told: list[int]) -> None:
    """Ctrl-C during the goodbye: say the first, abort the MPI job at the second.

    After the first the goodbye goes on, so that the peers are still told.
    """
    if len(interrupts) == len(told):
        return
    told.extend(interrupts[len(told) :])
    group = groups[0]
    which = ", ".join(g.label() for g in groups)
    if len(told) == 1:
        _say(
            f"asyncreplica: process {group.rank} was interrupted (SIGINT, Ctrl-C) while "
            f"exiting: it still waits for the other processes to reach the end of {which}, "
            "so that each is told that this process exited instead of waiting for it for "
            "ever. Interrupt again to abort the MPI job (every process ends at once)."
        )
        return
    _say(
        f"asyncreplica: process {group.rank} was interrupted again (SIGINT, Ctrl-C) while "
        f"exiting, waiting for the other processes to reach the end of {which}; aborting "
        "the MPI job."
    )
    _abort_job(group)


def _drive_all(
    steps: list[tuple[MPIProcessGroup, Generator[Any, None, None]]],
    interrupts: list[int] | None = None,
) -> None:
    """Drive every group's goodbye steps together, polling their requests.

    The wait has the stall warning, and each group's goodbye exchange its strategy's
    ``timeout_seconds`` (none: a peer that ends later, a last checkpoint, is not an
    error), past which the MPI job is aborted (see :func:`_exit_timed_out`). A
    failure's acknowledgements are bounded by _ACK_SECONDS. ``interrupts``: the
    SIGINTs counted meanwhile (see :func:`_interrupted`).
    """
    interrupts = [] if interrupts is None else interrupts
    told: list[int] = []
    active: list[tuple[MPIProcessGroup, Generator[Any, None, None], Any]] = []
    for group, gen in steps:
        with contextlib.suppress(StopIteration):
            active.append((group, gen, next(gen)))
    if not active:
        return
    stalls = [g.stall_warning_seconds for g, _, _ in active if g.stall_warning_seconds]
    stall = min(stalls) if stalls else _EXIT_STALL_SECONDS
    start = time.monotonic()
    warned = False
    while active:
        still = []
        for group, gen, request in active:
            while request.Test():
                try:
                    request = gen.send(None)
                except StopIteration:
                    request = None
                    break
            if request is not None:
                still.append((group, gen, request))
        active = still
        if not active:
            break
        for group, _, _ in active:  # a peer's failure, acknowledged at once
            acknowledge(group)
        waited = time.monotonic() - start
        late = [
            g
            for g, _, r in active
            if g.timeout is not None and waited >= g.timeout and not isinstance(r, _Until)
        ]
        if late:
            _exit_timed_out(late, [g for g, _, _ in active], waited)
        if not warned and waited >= stall:
            warned = True
            _logger.warning(_exit_stall_message([g for g, _, _ in active], waited))
        _interrupted([g for g, _, _ in active], interrupts, told)
        time.sleep(_POLL_SECONDS)
    if warned:
        _logger.warning(
            f"Exit resumed: every process said goodbye after {time.monotonic() - start:.1f} s; "
            "the stall warning above was not a hang."
        )


def _exit_stall_message(groups: list[MPIProcessGroup], waited: float) -> str:
    rank = groups[0].rank
    which = ", ".join(g.label() for g in groups)
    return (
        f"Exit stalled: process {rank} is exiting and has waited {waited:.1f} s for the "
        f"other processes to reach the end of {which} (their exit, a collective on it, or "
        "MPI.Finalize()).\n\nEvery process must exit (or finalize MPI) for the others to "
        "finish: a process that is busy, blocked, or waits for something this process "
        "would have sent delays this one. This is a warning, not an error."
    )


def _exit_timed_out(
    late: list[MPIProcessGroup], waiting: list[MPIProcessGroup], waited: float
) -> None:
    """The goodbye of ``late`` passed its strategy's ``timeout_seconds``: abort the job."""
    group = late[0]
    which = ", ".join(g.label() for g in waiting)
    _say(
        f"asyncreplica: process {group.rank} is exiting and has waited {waited:.1f} s, "
        f"past the timeout_seconds ({group.timeout:g} s) of {group.label()}, for the other "
        f"processes to reach the end of {which} (their exit, a collective on it, or "
        "MPI.Finalize()); aborting the MPI job.\n\nEvery process must exit (or finalize "
        "MPI) for the others to finish: one is busy, blocked, or waits for something this "
        "process would have sent (its own output says where it is). To let a process end "
        "later than the others (a last checkpoint), raise timeout_seconds or leave it unset."
    )
    _abort_job(group)


# -- one group's end ---------------------------------------------------------------------


def acknowledge(group: MPIProcessGroup) -> None:
    """At exit, before any goodbye: read the notes; acknowledge a peer's failure.

    Done for every group first, so that a failed process on one group never waits
    for the acknowledgement of a peer that waits on another group's.
    """
    with contextlib.suppress(Exception):
        group._read_notes()
    if group._peer_failure is not None and not group._failed_here and not group._acked:
        group._acked = True
        with contextlib.suppress(Exception):
            group._tell_peers({"kind": "ack"})


class _Until:
    """A request-like condition for :func:`_drive_all`: ``Test()`` is the predicate."""

    def __init__(self, predicate: Callable[[], bool]) -> None:
        self.Test = predicate


def settle_failure(group: MPIProcessGroup) -> Generator[Any, None, None]:
    """At exit after a failure following an agreement: let every process report it.

    The process that failed waits (up to _ACK_SECONDS) until every peer has
    acknowledged, from its own exit hook (so after the peer reported the error),
    before the job is ended; a peer acknowledges, then waits to be ended. The waits are
    steps of the goodbye (conditions polled with every other group's), so that a
    process acknowledges on one group while it waits on another.
    """
    until = time.monotonic() + _ACK_SECONDS
    if group._failed_here:

        def acknowledged() -> bool:
            with contextlib.suppress(ReplicaExitedError):
                group._read_notes()
            done = len(group._acks | group._failed_peers) >= group.size - 1
            return done or time.monotonic() >= until

        yield _Until(acknowledged)
        silent = sorted(set(range(group.size)) - {group.rank} - group._acks - group._failed_peers)
        if silent and group._broken is not None:
            # The job is aborted next (out of step), which stops those peers before they
            # report anything: say why here, on this process's output.
            _say(_silent_message(group, silent))
        return
    acknowledge(group)

    def ended() -> bool:  # the failed process ends the job meanwhile
        group._sends = [r for r in group._sends if not r.Test()]
        return time.monotonic() >= until

    yield _Until(ended)


def _silent_message(group: MPIProcessGroup, silent: list[int]) -> str:
    """Why ``silent`` peers did not acknowledge this process's failure (then aborted).

    A peer that read the failure (its ``"told"`` note: its run raised it, or its next
    use of the strategy will) runs, and goes on after the error without exiting. One
    that did not read it either does not yield (a computation, a blocking call) inside
    a run, or has no run of this strategy in progress (nothing reads the notes then):
    a peer whose loop is known to run is never called busy.
    """
    told = [r for r in silent if r in group._told_peers]
    unread = [r for r in silent if r not in group._told_peers]
    parts = []
    if told:
        one = len(told) == 1
        parts.append(
            ", ".join(group._process(r) for r in told)
            + f" did not acknowledge this process's failure within {_ACK_SECONDS:g} s: "
            + ("it" if one else "each")
            + " read it (its run raised it, or its next use of the strategy will), and "
            + ("goes" if one else "go")
            + f" on without exiting: {'it is' if one else 'they are'} stopped with the MPI "
            "job now"
        )
    if unread:
        one = len(unread) == 1
        parts.append(
            ", ".join(group._process(r) for r in unread)
            + f" did not acknowledge this process's failure within {_ACK_SECONDS:g} s: "
            + ("it" if one else "each")
            + " did not read it (busy inside a run in a call that does not yield, such "
            "as a computation or a blocking call, or with no run of "
            f"{group.label()} in progress, whose next use raises it): "
            f"{'it is' if one else 'they are'} stopped with the MPI job now, before "
            "reporting the failure"
        )
    return f"asyncreplica: process {group.rank}: " + "; ".join(parts) + "."


def farewell(
    group: MPIProcessGroup, error: str | None, finalized: bool, noted: bool = False
) -> Generator[Any, None, None]:
    """This group's goodbye (at exit or MPI.Finalize): the steps of one last exchange.

    A generator of requests, driven by :func:`._exit.goodbye_all` together with every
    other group's, so that no goodbye waits for one that a peer makes later. ``noted``:
    this process sent exit notes on the group's communicator (the exchange says so).
    """
    state = group._state
    group._to(Event.FINALIZE if finalized else Event.EXIT)
    if state is State.FAILED and group._departed:
        return  # a peer has gone: nobody is left to say goodbye to
    thread = group._run_thread if group._running else None
    if (
        group._broken is None
        and thread is not None
        and thread is not threading.current_thread()
        and thread.is_alive()
    ):  # a run goes on in another thread: no goodbye exchange may be posted beside it
        _cut_in_thread(group, thread)
    elif (group._in_flight or group._agreed) and group._broken is None:
        # An exchange posted and never waited for, or a data transfer agreed on and
        # never made: an exception (Ctrl-C outside asyncio's runner) stopped the loop
        # in between. The peers are told before the job is aborted below (see
        # settle_failure).
        group.abandoned_by(
            error or "it exited while a collective of a run was in progress",
            "an exchange was interrupted" if group._in_flight else "a data transfer was abandoned",
            stage="exchange" if group._in_flight else "data",
        )
    if group._failed_here or group._peer_failure is not None:
        yield from settle_failure(group)
    if group._broken is not None:
        _say(
            f"asyncreplica: process {group.rank}: the processes are out of step "
            f"({group._broken}); aborting the MPI job.",
        )
        _abort_job(group)
        return
    if group.size == 1:
        return
    detail: dict[str, Any] = {"error": error, "noted": noted}
    if finalized and error is None:
        detail["finalized"] = True
    # The fingerprint says whether this process sent exit notes (see _note_exit): the
    # peers then receive them, so that none is left unreceived at MPI_Finalize.
    request = group._post(Status.EXITED, int(noted))
    # A peer whose run is in progress with no replica at a collective makes this
    # exchange once told (see Waiting.watch_peers); peers that exit too meet it sooner.
    told_after = time.monotonic() + _ENDING_SECONDS
    yield _Until(lambda: bool(request.Test()) or time.monotonic() >= told_after)
    if not request.Test():
        group._tell_ending(Status.EXITED)
        yield request
    group._in_flight = False
    if group._unanimous():
        if noted:
            group._noted_peers = set(range(group.size)) - {group.rank}
        return
    try:
        details = yield from group._details(Status.EXITED, None, detail)
    except BackendError as exc:  # out of step: nothing can be matched
        _say(f"asyncreplica: process {group.rank}: {exc}")
        _abort_job(group)
        return
    group._noted_peers = {
        int(d["rank"])
        for d in details
        if d["rank"] != group.rank and Status(d["status"]) is Status.EXITED and d.get("noted")
    }
    waiting = [d for d in details if Status(d["status"]) is Status.COLLECTIVE]
    if waiting:
        _, message = outcome_message(details)
        _say(
            f"asyncreplica: process {group.rank} exited while other processes still "
            f"wait for it:\n{message}",
        )


def _cut_in_thread(group: MPIProcessGroup, thread: threading.Thread) -> None:
    """The interpreter exits while a run of ``group`` goes on in another (daemon) thread.

    Its exchange cannot be finished from here: the processes are out of step, and the
    job is aborted once the peers were told (as a failure after an agreement, so that
    their run raises naming this exit, and each acknowledges from its own exit hook).
    """
    cut = (
        f"a run of {group.label()} was in progress in another thread ({thread.name!r}) "
        "when the interpreter exited"
    )
    group._broken = cut
    group._failed_here = True
    with contextlib.suppress(Exception):  # best effort: that thread still uses the group
        group._tell_peers(
            {
                "kind": "failed",
                "error": f"exited while {cut}",
                "what": _exchange_text(group._pending),
                "position": 0,
                "name": None,
                "exited": True,
            }
        )


def free(group: MPIProcessGroup, *, finalized: bool = False) -> None:
    """Free this group's MPI objects (after its goodbye, or once every process released it).

    The bell's receive is cancelled first: a receive left posted makes UCX warn, at
    finalize, that its buffers were not returned.
    """
    if group._freed:
        return
    group._freed = True
    if group._abandoned:
        return  # MPI still owns their buffers: nothing is freed (the job is aborted)
    with contextlib.suppress(Exception):  # freeing is best effort
        group._bell.Cancel()
        group._bell.Wait()
    with contextlib.suppress(Exception):
        group._MPI.Request.Waitall(group._sends)  # eager notes: complete at once
    group._sends = []
    with contextlib.suppress(Exception):
        if group._gather is not None:
            group._gather.Free()
    for comm in (group._ctl, group._data, group._side):
        with contextlib.suppress(Exception):
            comm.Free()


def released(group: MPIProcessGroup) -> bool:
    """Whether this process dropped its strategy (nothing here can use the group)."""
    holder = group._holder
    return holder is not None and holder() is None and group._state is State.JOINED


def release(group: MPIProcessGroup) -> None:
    """Every process dropped its strategy: free the group (no goodbye is owed)."""
    group._to(Event.RELEASE)
    _forget(group)
    free(group)


# At most this many dropped groups are released per creation (one fixed-size exchange).
_RELEASE_SLOTS = 15


def release_dropped(base: Any) -> None:
    """Free the groups on ``base`` whose strategies every process has dropped.

    Called by every process while creating a group (after every process arrived, so
    the exchange completes at once): each process lists the groups it dropped (their
    creation numbers), and the groups every process dropped are freed by all, so that
    a job that creates a strategy per step does not run out of communicators.
    """
    if base.Get_size() == 1:
        return
    handle = comm_key(base)
    mine = [
        g for g in _groups if g._base_key == handle and g.size == base.Get_size() and released(g)
    ][:_RELEASE_SLOTS]
    row = np.full(_RELEASE_SLOTS + 1, -1, np.int64)
    row[0] = len(mine)
    row[1 : 1 + len(mine)] = [g._base_serial for g in mine]
    rows = np.empty((base.Get_size(), _RELEASE_SLOTS + 1), np.int64)
    request = base.Iallgather(row, rows)
    while not request.Test():  # every process arrived: this completes at once
        time.sleep(_POLL_SECONDS / 10)
    common = {int(v) for v in rows[0, 1 : 1 + int(rows[0, 0])]}
    for r in range(1, base.Get_size()):
        common &= {int(v) for v in rows[r, 1 : 1 + int(rows[r, 0])]}
    for group in mine:
        if group._base_serial in common:
            release(group)


# Per communicator the program freed (its comm_key): the release exchange posted on
# the library's duplicate of it (see release_freed): (request, rows, this process's
# dropped groups listed there).
_freed_releases: dict[int, tuple[Any, Any, list[MPIProcessGroup]]] = {}
_freed_seen = [0]  # how many of _arrival.freed_keys were looked at
_freed_waiting: list[int] = []  # freed, not posted: a strategy on it is still held here


def release_freed(*, at_exit: bool = False) -> None:
    """Release the groups on communicators the program freed, once every process dropped them.

    A strategy per step on the program's own communicator (Dup, use, Free) never meets a
    later creation on that communicator, where :func:`release_dropped` frees them, so its
    groups and the library's duplicate of the communicator were kept for ever (MPICH's
    "Too many communicators" at the 682nd). For each communicator the program freed,
    every process posts one exchange on the library's duplicate of it (the only
    collective ever made there) listing the groups it dropped: at a creation once it
    dropped every strategy on it, or at exit. Once complete, the groups every process
    dropped are freed, and the duplicate too once no group on that communicator is
    left. Never blocks (at exit, for up to a second).
    """
    from ._arrival import _channels, _created, freed_keys

    _freed_waiting.extend(freed_keys[_freed_seen[0] :])
    _freed_seen[0] = len(freed_keys)
    for key in list(_freed_waiting):
        channel = _channels.get(key)
        if channel is None or key in _freed_releases:
            _freed_waiting.remove(key)
            continue
        if not at_exit and any(g._base_key == key and not released(g) for g in _groups):
            continue  # posted once this process dropped them all (or at exit)
        _freed_waiting.remove(key)
        with contextlib.suppress(Exception):  # best effort: it only frees
            size = channel.Get_size()
            mine = [g for g in _groups if g._base_key == key and released(g)][:_RELEASE_SLOTS]
            row = np.full(_RELEASE_SLOTS + 1, -1, np.int64)
            row[0] = len(mine)
            row[1 : 1 + len(mine)] = [g._base_serial for g in mine]
            rows = np.empty((size, _RELEASE_SLOTS + 1), np.int64)
            _freed_releases[key] = (channel.Iallgather(row, rows), (row, rows), mine)
    until = time.monotonic() + (1.0 if at_exit else 0.0)
    while _freed_releases:
        for key, (request, (_, rows), mine) in list(_freed_releases.items()):
            if not request.Test():
                continue
            del _freed_releases[key]
            common = {int(v) for v in rows[0, 1 : 1 + int(rows[0, 0])]}
            for r in range(1, rows.shape[0]):
                common &= {int(v) for v in rows[r, 1 : 1 + int(rows[r, 0])]}
            for group in mine:
                if group._base_serial in common and released(group):
                    release(group)
            if not any(g._base_key == key for g in _groups):
                _created.pop(key, None)
                with contextlib.suppress(Exception):
                    _channels.pop(key).Free()
        if not _freed_releases or time.monotonic() >= until:
            break
        time.sleep(_POLL_SECONDS / 10)


#: How long the exit hook lets the launcher forward what it just wrote before aborting:
#: MPI_Abort kills every process, and mpiexec stops forwarding output with them (the
#: abort's reason, written just before, was lost about one time in three).
_ABORT_GRACE_SECONDS = 0.2


def _abort_job(group: MPIProcessGroup) -> None:
    """Abort the MPI job, once what this process wrote had time to reach the launcher."""
    sys.stdout.flush()
    sys.stderr.flush()
    time.sleep(_ABORT_GRACE_SECONDS)
    group._MPI.COMM_WORLD.Abort(1)


def _say(text: str) -> None:
    """Write ``text`` to stderr at once (the exit hook's reports)."""
    sys.stderr.write(text + "\n")
    sys.stderr.flush()
