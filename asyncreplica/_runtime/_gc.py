"""The cyclic collector's generation-0 threshold, scaled to the runs in progress.

Each waiting replica holds a few container objects (its task, its coroutine frames,
its waiter), so a round of a run of N replicas allocates about N times as many as
one replica does. With CPython's default threshold (700 allocations) a run of 4096
replicas starts several generation-0 collections per round, each promoting the
waiting replicas' objects towards the oldest generation, which full collections then
scan again: a quarter of the time of a small all_reduce at 4096 replicas went to the
collector (docs/performance.md, "scale").

While runs are in progress, :class:`scaled_gc` raises the generation-0 threshold to
:data:`PER_REPLICA` times the replicas of the largest run in progress (never below
what it was), and restores it when the last run ends. Runs that overlap (concurrent
runs on one loop, or runs on loops in several threads) share one count of active
runs, so the threshold is restored once, by whichever ends last. If anyone changes
the threshold while runs are in progress, their value stands: it is neither raised
further nor restored. A threshold of 0 (automatic collection off) is left alone.
"""

from __future__ import annotations

import gc
import threading
from collections import Counter
from types import TracebackType
from typing import final

__all__ = ["PER_REPLICA", "scaled_gc"]

#: Generation-0 threshold per replica of the largest run in progress (at 8 replicas
#: this is about CPython's default of 700; at 4096 replicas it is 409,600).
PER_REPLICA = 100

_lock = threading.Lock()
_active: Counter[int] = Counter()  # replicas of each run in progress -> how many runs
_saved: int | None = None  # the threshold found when the first of the active runs began
_ours: int | None = None  # the threshold we set last, while we manage it
_managed = False  # False once someone else changed the threshold during these runs


def _update() -> None:
    """Set the threshold the active runs ask for (call with ``_lock`` held)."""
    global _ours, _managed
    if not _managed or _saved is None or _saved == 0:
        return
    current = gc.get_threshold()
    if current[0] != (_saved if _ours is None else _ours):
        _managed = False  # changed by someone else: theirs stands
        return
    want = max(_saved, PER_REPLICA * max(_active)) if _active else _saved
    if want != current[0]:
        gc.set_threshold(want, *current[1:])
        _ours = want


def _enter(replicas: int) -> None:
    global _saved, _ours, _managed
    with _lock:
        if not _active:
            _saved = gc.get_threshold()[0]
            _ours = None
            _managed = True
        _active[replicas] += 1
        _update()


def _exit(replicas: int) -> None:
    global _saved, _ours, _managed
    with _lock:
        _active[replicas] -= 1
        if _active[replicas] == 0:
            del _active[replicas]
        _update()  # back to the saved threshold when no run is left, if still ours
        if not _active:
            _saved = None
            _ours = None
            _managed = False


@final
class scaled_gc:  # lower case: used as a function, ``with scaled_gc(n):``
    """Raise the generation-0 threshold for a run of ``replicas`` while it runs.

    Args:
        replicas: The run's number of replicas (in this process).
    """

    __slots__ = ("_replicas",)

    def __init__(self, replicas: int) -> None:
        self._replicas = max(int(replicas), 1)

    def __enter__(self) -> None:
        _enter(self._replicas)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        _exit(self._replicas)
