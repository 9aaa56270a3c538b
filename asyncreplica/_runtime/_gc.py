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


class _Threshold:
    """The one manager of the generation-0 threshold (all its state in one place).

    Attributes:
        active: Replicas of each run in progress -> how many such runs.
        saved: The threshold found when the first of the active runs began.
        ours: The threshold we set last, while we manage it.
        managed: False once someone else changed the threshold during these runs.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.active: Counter[int] = Counter()
        self.saved: int | None = None
        self.ours: int | None = None
        self.managed = False

    def enter(self, replicas: int) -> None:
        with self.lock:
            if not self.active:
                self.saved = gc.get_threshold()[0]
                self.ours = None
                self.managed = True
            self.active[replicas] += 1
            self._update()

    def exit(self, replicas: int) -> None:
        with self.lock:
            self.active[replicas] -= 1
            if self.active[replicas] == 0:
                del self.active[replicas]
            self._update()  # back to the saved threshold when no run is left, if still ours
            if not self.active:
                self.saved = None
                self.ours = None
                self.managed = False

    def _update(self) -> None:
        """Set the threshold the active runs ask for (call with the lock held)."""
        if not self.managed or self.saved is None or self.saved == 0:
            return
        current = gc.get_threshold()
        if current[0] != (self.saved if self.ours is None else self.ours):
            self.managed = False  # changed by someone else: theirs stands
            return
        want = max(self.saved, PER_REPLICA * max(self.active)) if self.active else self.saved
        if want != current[0]:
            gc.set_threshold(want, *current[1:])
            self.ours = want


_THRESHOLD = _Threshold()


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
        _THRESHOLD.enter(self._replicas)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        _THRESHOLD.exit(self._replicas)
