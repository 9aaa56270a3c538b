"""The exceptions of asyncreplica.

::

    AsyncReplicaError(Exception)
    ├── CollectiveError(AsyncReplicaError, RuntimeError)
    │   ├── CollectiveMismatchError          .position .signatures .fields
    │   ├── ReplicaExitedError               .replica_id .position .waiting
    │   ├── CollectiveDeadlockError          .cycle
    │   ├── CollectiveTimeoutError(CollectiveError, TimeoutError)  .position .arrived .missing
    │   └── ReplicaCancelledError            .replica_id .how .where
    ├── ReplicaContextError(AsyncReplicaError, RuntimeError)
    ├── BackendError(AsyncReplicaError, RuntimeError)
    ├── BackendNotFoundError(AsyncReplicaError, LookupError)  .name .available
    └── InternalError                        .replica_id (a bug in asyncreplica)

Argument validation raises the built-in ``TypeError`` and ``ValueError``. Domain failures
use this tree; the second bases keep TensorFlow-style ``except RuntimeError`` handlers
working. Each collective error builds its message from structured data (the builders
live in :mod:`asyncreplica._core._report`) and keeps that data as attributes, so that no
one has to parse the text.

Every kind of error has a stable code (:attr:`AsyncReplicaError.code`, ``"AR103"`` for
``ReplicaExitedError``), and every message ends with the command that explains it:
``For more on this error, run `asyncreplica explain AR103`.``
"""

from __future__ import annotations

import itertools
import linecache
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, ClassVar

from ._core import _report
from ._core._codes import CODES, explain_line

if TYPE_CHECKING:
    from ._core._ledger import Report
    from ._core._signature import Signature

__all__ = [
    "AsyncReplicaError",
    "BackendError",
    "BackendNotFoundError",
    "CollectiveDeadlockError",
    "CollectiveError",
    "CollectiveMismatchError",
    "CollectiveTimeoutError",
    "InternalError",
    "ReplicaCancelledError",
    "ReplicaContextError",
    "ReplicaExitedError",
]

# Names of backends this project ships or plans, with the extra that installs them.
_INSTALL_HINTS = {
    "numpy": "pip install asyncreplica  (numpy is a required dependency; reinstall it)",
    "cupy": 'pip install "asyncreplica[gpu]"',
    "mpi": 'pip install "asyncreplica[mpi]"',
}


# Each error's mark: (this process's token, a count). The token is new in a forked
# child, so an error that came from another process (pickled) is never compared.
_MADE = itertools.count()
_PROCESS = [object()]
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=lambda: _PROCESS.__setitem__(0, object()))


def made_mark() -> int:
    """A mark: every ``AsyncReplicaError`` made after this call is :func:`made_before` it."""
    return next(_MADE)


def own_mark(error: BaseException, name: str) -> object:
    """The mark ``name`` that asyncreplica set on ``error``, or None.

    Read from the instance's own ``__dict__``, never through ``getattr``: a user's
    exception class whose ``__getattr__`` raises something other than
    ``AttributeError`` (a dict-backed one's ``KeyError``) would replace the user's error
    with that one, naming our private attribute.
    """
    try:
        found: object = object.__getattribute__(error, "__dict__").get(name)
    except Exception:  # no __dict__, or one that is not a dict
        return None
    return found


def made_before(error: BaseException, mark: int) -> bool:
    """Whether ``error`` is an ``AsyncReplicaError`` this process made before ``mark``."""
    made = own_mark(error, "_ar_made")
    return (
        isinstance(made, tuple)
        and len(made) == 2
        and made[0] is _PROCESS[0]
        and isinstance(made[1], int)
        and made[1] < mark
    )


class AsyncReplicaError(Exception):
    """The base class of every error that asyncreplica raises on purpose.

    Attributes:
        code: The stable code of this kind of error, such as ``"AR103"``;
            ``asyncreplica explain AR103`` prints what it means, with a broken and a
            fixed example. The message ends with that command.
    """

    code: ClassVar[str] = CODES["AsyncReplicaError"]

    def __init__(self, *args: object) -> None:
        # When it was made (see made_before): a run tells its own errors from ones made
        # before it began (an earlier run's, stored and raised again by a step).
        BaseException.__setattr__(self, "_ar_made", (_PROCESS[0], next(_MADE)))
        super().__init__(*args)

    def __str__(self) -> str:
        message = super().__str__()
        line = explain_line(self.code)
        if f"asyncreplica explain {self.code}" in message:
            return message
        return f"{message}\n{line}" if message else line


class CollectiveError(AsyncReplicaError, RuntimeError):
    """A collective could not complete as issued.

    Attributes:
        report: The state of every replica when the error was raised (one row per
            replica: state, position, signature, call site and its recent
            collectives), or None when no run was involved.
    """

    code: ClassVar[str] = CODES["CollectiveError"]

    def __init__(self, message: str, *, report: Report | None = None) -> None:
        if not message:
            raise ValueError("a CollectiveError needs a message")
        super().__init__(message)
        self.report = report


class CollectiveMismatchError(CollectiveError):
    """Replicas issued different collectives at the same position.

    Attributes:
        position: The 0-based position at which they disagree: the index among the
            replicas' unnamed collectives, or the occurrence of :attr:`name`.
        name: The collective's name, for a named collective, else None.
        signatures: The signature of each replica that had arrived, by replica id.
        fields: The names of the signature fields that differ.
    """

    code: ClassVar[str] = CODES["CollectiveMismatchError"]

    def __init__(
        self,
        position: int,
        signatures: Mapping[int, Signature],
        fields: Sequence[str],
        *,
        num_replicas: int,
        name: str | None = None,
        report: Report | None = None,
        message: str | None = None,
        first_replica: int = 0,
    ) -> None:
        self.position = position
        self.name = name
        self.signatures = dict(signatures)
        self.fields = tuple(fields)
        super().__init__(
            message
            or _report.mismatch_message(
                position,
                signatures,
                self.fields,
                num_replicas,
                name,
                first_replica,
                source=linecache.getline,
            ),
            report=report,
        )


class ReplicaExitedError(CollectiveError):
    """A replica finished its step function while others wait at a collective it never made.

    Attributes:
        replica_id: The replica that finished.
        position: The position at which the others wait.
        waiting: The ids of the replicas waiting there.
    """

    code: ClassVar[str] = CODES["ReplicaExitedError"]

    def __init__(
        self,
        replica_id: int,
        position: int,
        waiting: Mapping[int, Signature],
        *,
        exited_count: int,
        exited_last: Signature | None,
        name: str | None = None,
        report: Report | None = None,
        message: str | None = None,
    ) -> None:
        self.replica_id = replica_id
        self.position = position
        self.name = name
        self.waiting = frozenset(waiting)
        super().__init__(
            message
            or _report.exited_message(
                replica_id, exited_count, exited_last, position, waiting, name
            ),
            report=report,
        )


class CollectiveDeadlockError(CollectiveError):
    """Replicas wait for each other in a cycle, so none of their collectives can complete.

    This happens with named collectives awaited one after another in different orders
    (replica 0 awaits ``x`` then ``y``, replica 1 ``y`` then ``x``). It is raised once
    no task of any replica can still issue a collective that would break the cycle.

    Attributes:
        cycle: For each replica of the cycle, ``(replica_id, waits_at)``: the name of
            the collective it waits at, or its position for an unnamed one.
    """

    code: ClassVar[str] = CODES["CollectiveDeadlockError"]

    def __init__(
        self,
        edges: Sequence[tuple[int, str, Signature, Sequence[int]]],
        *,
        keys: Sequence[int | tuple[str, int]] = (),
        report: Report | None = None,
        message: str | None = None,
    ) -> None:
        self.cycle = tuple(
            (edge[0], key if isinstance(key, int) else key[0])
            for edge, key in zip(edges, keys, strict=False)
        )
        super().__init__(message or _report.deadlock_message(edges), report=report)


class CollectiveTimeoutError(CollectiveError, TimeoutError):
    """A rendezvous passed its ``timeout_seconds`` with some replicas missing.

    Attributes:
        position: The position of the rendezvous.
        arrived: The ids of the replicas that arrived.
        missing: The ids of the replicas that did not.
        timeout: The timeout, in seconds.
    """

    code: ClassVar[str] = CODES["CollectiveTimeoutError"]

    def __init__(
        self,
        position: int,
        timeout: float,
        arrived: Mapping[int, Signature],
        missing: Mapping[int, str],
        *,
        where: str | None = None,
        report: Report | None = None,
        message: str | None = None,
    ) -> None:
        self.position = position
        self.timeout = timeout
        self.arrived = frozenset(arrived)
        self.missing = frozenset(missing)
        super().__init__(
            message or _report.timeout_message(position, timeout, arrived, missing, where),
            report=report,
        )


class ReplicaCancelledError(CollectiveError):
    """A replica's task ended by a cancellation that its run did not ask for, or was closed.

    ``Strategy.run`` cancels replicas itself when the run fails, and a cancel scope around
    ``Strategy.run`` cancels the whole run; both are fine. This error is raised when a
    replica's task ends any other way that gives no result: ``task.cancel()`` on the
    replica's task (the shutdown idiom "cancel every task but the main one" does that), a
    ``CancelledError`` raised by a library inside the step function or a merge_fn, or a
    ``GeneratorExit`` raised there. Re-raising the cancellation instead would make the
    code that awaits ``Strategy.run`` believe that *it* was cancelled (a task group
    swallows it, and the run would seem to return).

    Attributes:
        replica_id: The replica whose task ended.
        how: ``"cancelled"`` (a cancellation) or ``"closed"`` (``GeneratorExit``).
        where: Where it ended, ``file:line in function()``, or None when no line of the
            replica's code was running: its task was cancelled before it started, or
            while it awaited the awaitable that its (plain) step function returned.
    """

    code: ClassVar[str] = CODES["ReplicaCancelledError"]

    def __init__(
        self,
        replica_id: int,
        how: str,
        where: str | None,
        *,
        num_replicas: int,
        strategy: str,
        report: Report | None = None,
        called: bool = False,
    ) -> None:
        self.replica_id = replica_id
        self.how = how
        self.where = where
        super().__init__(
            _report.replica_cancelled_message(
                replica_id, how, where, num_replicas, strategy, called
            ),
            report=report,
        )


class InternalError(AsyncReplicaError):
    """A broken invariant of asyncreplica itself: a bug in the library, not in your code.

    Raised by ``Strategy.run`` when an exception escaped asyncreplica's own code (its
    innermost frame is in asyncreplica or one of its built-in backends, and no ``raise``
    statement there meant it), or when the library's own bookkeeping finds an
    impossible state. The exception that revealed it is kept as ``__cause__``. Please
    report it, with the full traceback (``ASYNCREPLICA_FULL_TRACEBACK=1``).

    Attributes:
        replica_id: The replica whose task hit the bug, or None.
    """

    code: ClassVar[str] = CODES["InternalError"]

    def __init__(self, message: str, *, replica_id: int | None = None) -> None:
        self.replica_id = replica_id
        super().__init__(_report.internal_message(message))


class ReplicaContextError(AsyncReplicaError, RuntimeError):
    """An API was used in the wrong context.

    For example a collective outside ``Strategy.run``, a cross-replica API such as
    ``Strategy.reduce`` inside a replica, or a ``ReplicaContext`` used after its run
    ended. The message names the call to use instead.
    """

    code: ClassVar[str] = CODES["ReplicaContextError"]


class BackendError(AsyncReplicaError, RuntimeError):
    """A backend could not be used or an operation in it failed.

    The native error, if any, is kept as ``__cause__``.
    """

    code: ClassVar[str] = CODES["BackendError"]


class BackendNotFoundError(AsyncReplicaError, LookupError):
    """No backend of the requested name could be loaded.

    Attributes:
        name: The requested name.
        available: The names of the backends that can be loaded.
        load_error: Why the backend failed to load, if it is installed but broken.
    """

    code: ClassVar[str] = CODES["BackendNotFoundError"]

    def __init__(
        self, name: str, available: Sequence[str], load_error: BaseException | None = None
    ) -> None:
        self.name = name
        self.available = tuple(available)
        self.load_error = load_error
        known = ", ".join(repr(a) for a in self.available) or "none"
        if load_error is not None:
            message = (
                f"backend {name!r} is installed but failed to load: "
                f"{type(load_error).__name__}: {load_error}. Available backends: {known}."
            )
        else:
            message = f"no backend named {name!r}. Available backends: {known}."
        hint = _INSTALL_HINTS.get(name)
        if hint is not None:
            message += f" Install it with: {hint}"
        else:
            message += (
                " A third-party backend registers itself under the entry-point group "
                "'asyncreplica.backends'; check its name and that it is installed."
            )
        super().__init__(message)
