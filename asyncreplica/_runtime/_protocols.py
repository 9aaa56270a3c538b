"""What the modules below are handed by the classes above them, as small protocols.

The runtime's compiled core (``_collective``, ``_issuing``) and the ownership checks it
calls (``_ownership``) sit below :class:`~._run.Run`, :class:`~._context.ReplicaContext`
and :class:`~._strategy.Strategy`, which create and drive them; ``Run`` itself sits below
``Strategy``. None of them names a class above it, not even for types: each reads the few
fields it is handed, listed here, and the classes above satisfy these protocols by their
shape. ``tests/test_layering.py`` holds the rule (no import circle among the runtime's
modules; the compiled modules import nothing above them).

This module imports nothing of the runtime.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from .._core._nest import TreeDef
    from .._core._signature import LeafSpec, Signature
    from .._options import CommunicationOptions
    from ..abc import ProcessGroup

__all__ = [
    "Describer",
    "IssuingContext",
    "IssuingRun",
    "IssuingStrategy",
    "OwnedCollective",
    "OwnedRendezvous",
    "RunStrategy",
]


class IssuingRun(Protocol):
    """What issuing a collective reads of its run (:class:`~._run.Run`)."""

    # The run's rendezvous: a ``_collective.Rendezvous``, not named here (``_collective``
    # imports this module; the name would close a circle).
    _rv: Any

    @property
    def closed(self) -> bool:
        """Whether the run has ended."""

    @property
    def describe(self) -> Callable[[Any], LeafSpec]:
        """The backend's ``describe``: one leaf's spec; TypeError for a foreign value."""


class IssuingStrategy(Protocol):
    """What issuing a collective reads of the strategy (:class:`~._strategy.Strategy`)."""

    @property
    def _communication_options(self) -> CommunicationOptions:
        """The strategy's default options."""

    @property
    def _as_is(self) -> set[type]:
        """The leaf types its backend reads as they are (``_held``: not converted)."""


class Describer(Protocol):
    """Describes a replica's leaves, or says which leaf the backend refused."""

    def _describe(self, leaves: Sequence[object], treedef: TreeDef = None) -> tuple[LeafSpec, ...]:
        """The spec of each leaf (TypeError naming the replica and the leaf if one is refused)."""

    def _held(self, leaves: list[object], treedef: TreeDef = None) -> list[object]:
        """The leaves as the collective reads them: converted once, now (``_held``)."""

    def _leaf_error(
        self, exc: TypeError, leaves: Sequence[object], treedef: TreeDef, index: int | None = None
    ) -> TypeError:
        """``exc`` (the backend refused a leaf, ``index`` if known), naming replica and leaf."""


class IssuingContext(Describer, Protocol):
    """What issuing an all_reduce reads of the replica's :class:`~._context.ReplicaContext`."""

    def _require_current(self, api: str) -> IssuingRun:
        """The run, when called inside this replica; else ``ReplicaContextError``."""

    def _merged(self, options: CommunicationOptions) -> CommunicationOptions:
        """The strategy's options overridden by ``options`` (TypeError if not options)."""

    @staticmethod
    def _check_name(name: object) -> str | None:
        """``name`` if it is a string or None; else TypeError."""


class _WorkerDevices(Protocol):
    @property
    def worker_devices(self) -> tuple[str, ...]:
        """The devices of this process's replicas."""


class RunStrategy(Protocol):
    """What a :class:`~._run.Run` reads of the strategy that runs it."""

    @property
    def _group(self) -> ProcessGroup | None:
        """The processes the strategy spans; None within one."""

    @property
    def _num_local(self) -> int:
        """This process's replicas."""

    @property
    def _replica_offset(self) -> int:
        """The global id of this process's first replica."""

    @property
    def num_replicas_in_sync(self) -> int:
        """Replicas in sync, over every process."""

    @property
    def extended(self) -> _WorkerDevices:
        """``strategy.extended`` (its devices)."""


class OwnedCollective(Protocol):
    """What the ownership checks read of a collective (``_collective.Collective``)."""

    replica: int
    _signature: Signature
    _coro: Any
    _driver: object

    def describe(self) -> str:
        """``all_reduce(SUM) on float64[2] at train.py:12``."""


class OwnedRendezvous(Protocol):
    """What the ownership checks read of a run's rendezvous (``_collective.Rendezvous``)."""

    run: Any
    loop: Any
    thread: int
    mains: list[object]
    helpers: dict[int, int]
    names: list[dict[str, Any]]
    unawaited: list[dict[int, Any]]

    def task(self) -> object:
        """The running task, or None off the run's thread."""
