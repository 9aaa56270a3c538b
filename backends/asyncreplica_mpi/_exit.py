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

Every wait here is polled (never ``Wait()``): it has a stall warning and honours the
groups' ``timeout_seconds`` (past it, the job is aborted with a message rather than
left hanging).
"""

from __future__ import annotations

import atexit
import contextlib
import sys
import time
from collections.abc import Generator
from typing import TYPE_CHECKING, Any

from ._arrival import _logger, _note_exit

if TYPE_CHECKING:
    from ._group import MPIProcessGroup

__all__ = ["goodbye_all", "install_hooks", "process_ends", "register", "uncaught_error"]

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
_EXIT_STALL_SECONDS = 30.0  # without any group's own stall_warning_seconds


def uncaught_error() -> str | None:
    """``ValueError: ...``: the uncaught exception this process dies of, if any."""
    return _uncaught[-1] if _uncaught else None


def register(group: MPIProcessGroup) -> None:
    """Hold ``group`` until exit (its goodbye), and install the hooks (once)."""
    _groups.append(group)
    install_hooks(finalize=True)


def release(group: MPIProcessGroup) -> None:
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
    if error is not None:
        # A peer still creating a strategy (or creating one later) learns that this
        # process will create none: its arrival notes end with an exit note. Only on an
        # uncaught exception: MPICH's MPI_Finalize fails on a message nobody received,
        # and a peer that exits normally receives none.
        _note_exit(error, finalized)
    groups = [g for g in _groups if not g.is_closed()]
    for group in groups:
        group.acknowledge()
    steps = [(g, g.farewell(error, finalized)) for g in groups]
    _drive_all(MPI, steps)
    for group in groups:
        group.free(finalized=finalized)


def _drive_all(MPI: Any, steps: list[tuple[MPIProcessGroup, Generator[Any, None, None]]]) -> None:
    """Drive every group's goodbye steps together, polling their requests."""
    active: list[tuple[MPIProcessGroup, Generator[Any, None, None], Any]] = []
    for group, gen in steps:
        with contextlib.suppress(StopIteration):
            active.append((group, gen, next(gen)))
    if not active:
        return
    stalls = [g.stall_warning_seconds for g, _, _ in active if g.stall_warning_seconds]
    stall = min(stalls) if stalls else _EXIT_STALL_SECONDS
    timeouts = [g.timeout for g, _, _ in active if g.timeout]
    timeout = min(timeouts) if timeouts else None
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
        waited = time.monotonic() - start
        if not warned and waited >= stall:
            warned = True
            _logger.warning(_exit_stall_message([g for g, _, _ in active], waited))
        if timeout is not None and waited >= timeout:
            print(  # noqa: T201
                f"asyncreplica: {_exit_stall_message([g for g, _, _ in active], waited)}\n"
                f"Timed out after {timeout:g} s (timeout_seconds): aborting the MPI job.",
                file=sys.stderr,
                flush=True,
            )
            MPI.COMM_WORLD.Abort(1)
            return
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
        "would have sent delays this one. This is a warning, not an error: set "
        "CommunicationOptions(timeout_seconds=...) to abort the job instead."
    )
