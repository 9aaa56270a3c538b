"""Module functions on the current strategy: ``get_strategy``, ``experimental_set_strategy``, ...

They sit above ``_strategy`` (they name its classes), unlike ``_context``'s, which only read
the current mode.
"""

from __future__ import annotations

import threading

from .._exceptions import ReplicaContextError
from ._mode import MODE, Mode, current_mode
from ._strategy import DefaultStrategy, Strategy

__all__ = ["experimental_set_strategy", "get_cross_replica_context", "get_strategy", "has_strategy"]

# The strategy set by experimental_set_strategy and the mode it replaced.
_global: list[tuple[Strategy, Mode | None]] = []
_lock = threading.Lock()


def get_strategy() -> Strategy:
    """Return the current strategy: the one in scope or running, else the default strategy."""
    strategy: Strategy = current_mode().strategy
    return strategy


def has_strategy() -> bool:
    """Return True when a strategy other than the default one is current."""
    return not isinstance(current_mode().strategy, DefaultStrategy)


def get_cross_replica_context() -> Strategy | None:
    """Return the current strategy in cross-replica context, else None.

    TensorFlow's (deprecated, not exported in TF2) ``get_cross_replica_context``: the
    strategy inside ``strategy.scope()`` or a ``merge_fn``; None inside a replica and
    in the default context.

    Example:
        >>> import asyncreplica as ar
        >>> strategy = ar.MirroredStrategy(["CPU:0", "CPU:1"])
        >>> ar.get_cross_replica_context() is None
        True
        >>> with strategy.scope():
        ...     ar.get_cross_replica_context() is strategy
        True
    """
    mode = current_mode()
    strategy: Strategy | None = mode.strategy if mode.cross_replica else None
    return strategy


def experimental_set_strategy(strategy: Strategy | None) -> None:
    """Enter ``strategy.scope()`` for the rest of this task or thread; None leaves it.

    TensorFlow's ``tf.distribute.experimental_set_strategy``: calling it again
    replaces the strategy set before. The mode is kept in a context variable, so it
    applies to the calling thread or task and to the tasks it starts afterwards.

    Args:
        strategy: The strategy to make current, or None to go back to the default.

    Raises:
        ReplicaContextError: Called inside a ``strategy.scope()`` (other than one set
            here), inside a replica or inside a ``merge_fn``. It is a
            ``RuntimeError``, as TensorFlow's is.
        TypeError: ``strategy`` is not a strategy or None.

    Example:
        >>> import asyncreplica as ar
        >>> strategy = ar.MirroredStrategy(["CPU:0", "CPU:1"])
        >>> ar.experimental_set_strategy(strategy)
        >>> ar.get_strategy() is strategy, ar.in_cross_replica_context()
        (True, True)
        >>> ar.experimental_set_strategy(None)
        >>> ar.has_strategy()
        False
    """
    if strategy is not None and not isinstance(strategy, Strategy):
        raise TypeError(f"experimental_set_strategy expects a strategy or None, got {strategy!r}")
    with _lock:
        if _global:
            previous, before = _global[-1]
            mode = MODE.get()
            if mode is not None and mode.strategy is previous and mode.cross_replica:
                MODE.set(before)
                _global.pop()
        mode = current_mode()
        if not isinstance(mode.strategy, DefaultStrategy) or mode.cross_replica:
            raise ReplicaContextError(
                "Must not be called inside a `tf.distribute.Strategy` scope: "
                "experimental_set_strategy was called inside the scope (or a merge_fn or "
                f"replica) of {mode.strategy!r}. Call it at the top level, outside any scope."
            )
        if strategy is None or isinstance(strategy, DefaultStrategy):
            return
        before = MODE.get()
        with strategy.scope():  # the checks of scope()
            pass
        MODE.set(Mode(strategy, True, None))
        _global.append((strategy, before))
