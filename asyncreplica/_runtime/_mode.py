"""The current distribution mode, per task: which strategy, which context.

TensorFlow keeps a per-thread stack of modes; we keep one :class:`contextvars.ContextVar`,
which every task copies when it starts. A mode is ``(strategy, cross_replica, replica)``:

* default:        ``(default strategy, False, default replica context)``
* cross-replica:  ``(strategy, True, None)`` inside ``strategy.scope()`` and ``merge_fn``
* replica:        ``(strategy, False, that replica's ReplicaContext)`` inside ``run``

This module sits below the strategy and the context, which put themselves in modes: a mode
holds them as plain values (typed by their owners, ``_strategy`` and ``_context``), and the
default mode is made by the function ``_strategy`` registers with :func:`set_default_mode`.
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

__all__ = ["MODE", "Mode", "current_mode", "set_default_mode"]


@dataclass(frozen=True, slots=True)
class Mode:
    """One distribution mode (see the module docstring)."""

    strategy: Any  # a Strategy
    cross_replica: bool
    replica: Any  # a ReplicaContext, or None


MODE: ContextVar[Mode | None] = ContextVar("asyncreplica_mode", default=None)

_default_mode: list[Callable[[], Mode]] = []


def set_default_mode(make: Callable[[], Mode]) -> None:
    """Make the default mode with ``make()`` (the default strategy's; ``_strategy`` sets it)."""
    _default_mode[:] = [make]


def current_mode() -> Mode:
    """Return the current mode; the default mode when none was set."""
    mode = MODE.get()
    if mode is None:
        # Registered when asyncreplica is imported (its __init__ imports _strategy).
        return _default_mode[0]()
    return mode
