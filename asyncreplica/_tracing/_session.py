"""Turning tracing on: ``strategy.trace(path)`` and ``ASYNCREPLICA_TRACE=FILE``.

A strategy reports its runs to one tracer (``strategy._tracer``); nested ``trace()``
blocks, or a block inside a program traced from the environment, share the hooks
through :class:`_Tee`.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import threading
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Protocol

from ._recorder import DEFAULT_MAX_EVENTS, ChromeTracer, PathLike, write_json

if TYPE_CHECKING:
    from .._core._ledger import Key, Report
    from .._core._signature import Signature
    from .._runtime._trace import Tracer

__all__ = ["ENV_VAR", "rank_path", "trace_from_environment", "traced"]

ENV_VAR = "ASYNCREPLICA_TRACE"
"""The environment variable that turns tracing on for every ``MirroredStrategy``."""


class Strategy(Protocol):
    """What tracing reads and sets of a strategy (``_runtime._strategy``, which calls here)."""

    _tracer: Tracer | None

    @property
    def _group(self) -> object:
        """The processes the strategy spans (one may have a ``trace_session``); or None."""


class _Tee:
    """Forwards a run's hooks to several tracers (nested ``trace()`` blocks)."""

    def __init__(self, tracers: Sequence[Tracer]) -> None:
        self.tracers = tuple(tracers)

    def run_begin(self, num_replicas: int, devices: tuple[str, ...]) -> None:
        for t in self.tracers:
            t.run_begin(num_replicas, devices)

    def arrive(self, replica: int, key: Key, signature: Signature) -> None:
        for t in self.tracers:
            t.arrive(replica, key, signature)

    def dispatch_begin(self, key: Key, replica: int, signature: Signature) -> None:
        for t in self.tracers:
            t.dispatch_begin(key, replica, signature)

    def dispatch_end(self, key: Key) -> None:
        for t in self.tracers:
            t.dispatch_end(key)

    def resume(self, replica: int, key: Key) -> None:
        for t in self.tracers:
            t.resume(replica, key)

    def failed(self, error: BaseException, report: Report | None) -> None:
        for t in self.tracers:
            t.failed(error, report)

    def run_end(self, *, cancelled: bool = False) -> None:
        for t in self.tracers:
            t.run_end(cancelled=cancelled)


def _attach(strategy: Strategy, tracer: ChromeTracer) -> Tracer | None:
    """Make ``strategy``'s runs report to ``tracer`` too; return the previous tracer."""
    previous = strategy._tracer
    strategy._tracer = tracer if previous is None else _Tee((previous, tracer))
    return previous


def _check_path(path: object) -> str:
    if not isinstance(path, str | os.PathLike):
        raise TypeError(f"the trace path must be a str or os.PathLike, got {path!r}")
    path = os.path.abspath(os.fspath(path))
    folder = os.path.dirname(path)
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"cannot write a trace to {path}: {folder} is not a directory")
    return path


#: The paths of the ``trace()`` blocks open in this process (each writes its file when it
#: exits, so a second block on one path would overwrite the first's trace).
_OPEN_PATHS: set[str] = set()
_OPEN_PATHS_LOCK = threading.Lock()


def _claim(path: str) -> None:
    """Reserve ``path`` for one ``trace()`` block, or refuse a path already traced to."""
    with _OPEN_PATHS_LOCK:
        if path in _OPEN_PATHS or path in _ENV_TRACERS:
            by = (
                "another strategy.trace() block that is still open"
                if path in _OPEN_PATHS
                else f"{ENV_VAR}, which traces every strategy of this program into it"
            )
            raise ValueError(
                f"cannot trace to {path}: it is already being traced to by {by}; the trace "
                "written last would overwrite the other without a word. Give each "
                "strategy.trace() its own path."
            )
        _OPEN_PATHS.add(path)


@contextlib.contextmanager
def traced(
    strategy: Strategy, path: PathLike, *, max_events: int = DEFAULT_MAX_EVENTS
) -> Iterator[ChromeTracer]:
    """Trace ``strategy``'s runs in the block; write ``path`` when it exits (also on error).

    This is :meth:`Strategy.trace <asyncreplica.Strategy.trace>`.

    Args:
        strategy: The strategy whose runs to record.
        path: The trace file (``.json``, or ``.json.gz`` for gzip).
        max_events: How many events to keep (the most recent).

    Yields:
        The tracer.

    Raises:
        TypeError: ``path`` is not a path.
        FileNotFoundError: ``path``'s folder does not exist (checked before the block).
        ValueError: ``max_events`` is not a positive integer, or ``path`` is already
            being traced to in this process (by an open block or ``ASYNCREPLICA_TRACE``).
    """
    target = _check_path(path)
    tracer = ChromeTracer(max_events=max_events)
    _claim(target)
    try:
        # Under MPI, every process records its own runs and rank 0 writes one merged file.
        session = getattr(strategy._group, "trace_session", None)
        merger = session() if session is not None else None
        previous = _attach(strategy, tracer)
        try:
            yield tracer
        finally:
            strategy._tracer = previous
            if merger is None:
                tracer.write(target)
            else:
                merged = merger.merge(
                    tracer.to_json(),
                    tracer._origin,
                    lambda doc: write_json(target, doc),  # rank 0's own, when the merge raises
                )
                if merged is not None:
                    write_json(target, merged)
    finally:
        with _OPEN_PATHS_LOCK:
            _OPEN_PATHS.discard(target)


_ENV_TRACERS: dict[str, ChromeTracer] = {}


def trace_from_environment(strategy: Strategy, *, rank: int | None = None) -> None:
    """Trace ``strategy``'s runs into ``$ASYNCREPLICA_TRACE`` if that variable is set.

    Every strategy traced to one file shares one tracer. The file is written after
    runs (throttled; always after a failed run) and when the interpreter exits.

    Args:
        strategy: A newly created strategy.
        rank: Under MPI, this process's rank: each process writes its own file, the
            variable's name with ``.rank<R>`` before its extension
            (``trace.json`` gives ``trace.rank1.json``).
    """
    target = os.environ.get(ENV_VAR)
    if not target:
        return
    if rank is not None:
        target = rank_path(target, rank)
    path = os.path.abspath(target)
    tracer = _ENV_TRACERS.get(path)
    if tracer is None:
        tracer = _ENV_TRACERS[path] = ChromeTracer(autosave=path)
        atexit.register(tracer.save)
    _attach(strategy, tracer)


def rank_path(path: str, rank: int) -> str:
    """``path`` with ``.rank<R>`` before its extension (``.json.gz`` kept whole)."""
    head, name = os.path.split(path)
    stem, dot, extension = name.partition(".")
    named = f"{stem}.rank{rank}{dot}{extension}" if dot else f"{name}.rank{rank}"
    return os.path.join(head, named)
