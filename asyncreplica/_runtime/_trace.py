"""The tracing hooks of a run (the interface; the Chrome-trace recorder implements it).

A :class:`Run` calls these methods, when a tracer is set, at the moments that matter
for a timeline. Implementations read the clock themselves; the calls are cheap and
never raise into the run. When tracing is off the run holds ``None`` and pays one
``is None`` test per event.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from .._core._ledger import Key, Report
    from .._core._signature import Signature

__all__ = ["Tracer"]


class Tracer(Protocol):
    """What a run reports to a tracer."""

    def run_begin(self, num_replicas: int, devices: tuple[str, ...]) -> None:
        """A ``Strategy.run`` started with ``num_replicas`` replicas."""

    def arrive(self, replica: int, key: Key, signature: Signature) -> None:
        """``replica`` issued the collective ``key``."""

    def dispatch_begin(self, key: Key, replica: int, signature: Signature) -> None:
        """``replica``, the last to arrive, starts the backend work of ``key``."""

    def dispatch_end(self, key: Key) -> None:
        """The backend work of ``key`` finished."""

    def resume(self, replica: int, key: Key) -> None:
        """``replica`` has its result of ``key`` and goes on."""

    def failed(self, error: BaseException, report: Report | None) -> None:
        """The run failed with ``error`` (a root cause); ``report`` is the flight recorder."""

    def run_end(self, *, cancelled: bool = False) -> None:
        """The run ended (normally or not); ``cancelled``: by a scope around it."""
