"""The stable code of each error kind, and the line that ends every message.

Each exception class of :mod:`asyncreplica` has a code (``AR103`` for
``ReplicaExitedError``). ``asyncreplica explain AR103`` prints the explanation of that
kind, shipped with the package (``asyncreplica/_explain/AR103.md``, generated from the
matching section of ``docs/errors.md``, whose anchor is ``#ar103``). Codes never change
meaning; a new kind of error gets a new code.
"""

from __future__ import annotations

__all__ = ["CODES", "code_of", "explain_line", "see_also"]

#: Exception class name -> code. The order is the order of docs/errors.md.
CODES: dict[str, str] = {
    "AsyncReplicaError": "AR100",
    "CollectiveError": "AR101",
    "CollectiveMismatchError": "AR102",
    "ReplicaExitedError": "AR103",
    "CollectiveTimeoutError": "AR104",
    "CollectiveDeadlockError": "AR105",
    "ReplicaContextError": "AR106",
    "BackendError": "AR107",
    "BackendNotFoundError": "AR108",
    "ReplicaCancelledError": "AR109",
    "InternalError": "AR110",
}
_BY_LOWER = {name.lower(): code for name, code in CODES.items()}


def code_of(kind: str) -> str:
    """The code of the exception class named ``kind`` (any case), e.g. ``"AR103"``.

    Raises:
        KeyError: ``kind`` names no exception of asyncreplica.
    """
    return _BY_LOWER[kind.lower()]


def explain_line(code: str) -> str:
    """The last line of every message of the error kind with ``code``."""
    return f"For more on this error, run `asyncreplica explain {code}`."


def see_also(kind: str) -> str:
    """The last line of a message of the exception class named ``kind`` (any case)."""
    return explain_line(code_of(kind))
