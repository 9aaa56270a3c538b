"""The current distribution mode, per task: which strategy, which context.

TensorFlow keeps a per-thread stack of modes; we keep one :class:`contextvars.ContextVar`,
which every task copies when it starts. A mode is ``(strategy, cross_replica, replica)``:

* default:        ``(default strategy, False, default replica context)``
* cross-replica:  ``(strategy, True, None)`` inside ``strategy.scope()`` and ``merge_fn``
* replica:        ``(strategy, False, that replica's ReplicaContext)`` inside ``run``
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._context import ReplicaContext
    from ._strategy import Strategy

__all__ = ["MODE", "Mode", "current_mode"]


@dataclass(frozen=True, slots=True)
class Mode:
    """One distribution mode (see the module docstring)."""

    strategy: Strategy
    cross_replica: bool
    replica: ReplicaContext | None


MODE: ContextVar[Mode | None] = ContextVar("asyncreplica_mode", default=None)


def current_mode() -> Mode:
    """Return the current mode; the default mode when none was set."""
    mode = MODE.get()
    if mode is None:
        from ._strategy import default_strategy

        strategy = default_strategy()
        return Mode(strategy, False, strategy.default_replica_context)
    return mode
