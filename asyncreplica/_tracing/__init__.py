"""Timelines of runs: a Chrome trace-event recorder, its summary and its picture.

:class:`ChromeTracer` implements the tracing hooks of a run
(:class:`asyncreplica._runtime._trace.Tracer`) and writes what it saw as Chrome
trace-event JSON, which ui.perfetto.dev and ``chrome://tracing`` open:

* one process (this one), with one track per replica (``replica 0``, ...), a
  ``backend`` track and a ``runs`` track;
* one complete (``X``) event per collective per replica, from the replica's arrival
  to its resumption, with the collective's kind, reduce op, position (or name and
  occurrence), value, bytes, dtype, call site and the time the replica waited for
  the others in ``args``;
* one ``X`` event per reduction on the backend track, with a flow arrow from the
  replica that arrived last (and so dispatched it) to the reduction;
* when a run fails, an instant event on every replica's track with that replica's
  flight-recorder history (its last collectives) and a global instant event with
  the error message; the collectives that never completed end at the end of the run.

Events on one track nest properly (Perfetto's rule): collectives of one replica that
overlap without nesting (named collectives in flight together, concurrent runs) are
put on extra tracks (``replica 0 (overlap 1)``).

Memory stays bounded: the tracer keeps the most recent ``max_events`` events (a ring
buffer of whole collectives, so flow arrows always pair up) and says in the trace how
many it dropped. A path that ends in ``.gz`` is written gzip-compressed.

Ways to turn tracing on: ``with strategy.trace("trace.json"): ...`` around runs, or the
environment variable ``ASYNCREPLICA_TRACE=FILE`` for an unmodified program (every
``MirroredStrategy`` created while it is set traces into ``FILE``, which is written
after runs and when the interpreter exits). Tracing off costs one ``is None`` test per
event in the run.

:func:`summarize` turns a trace into a short text report (who waited, who was late,
where, and what failed); :func:`plot` draws it as a PNG with matplotlib.

The package is split by idea: :mod:`._records` (what is kept of a run),
:mod:`._recorder` (the tracer and its ring buffer), :mod:`._chrome` (the trace-event
export), :mod:`._session` (``strategy.trace()`` and ``ASYNCREPLICA_TRACE``),
:mod:`._summary` (reading a trace back, the text report) and :mod:`._plot` (the
picture). Every name is importable from ``asyncreplica._tracing``.
"""

from __future__ import annotations

from ._chrome import _itemsize, _lanes
from ._plot import plot
from ._recorder import (
    AUTOSAVE_OVERHEAD,
    DEFAULT_MAX_EVENTS,
    MAX_FAILURES,
    ChromeTracer,
    PathLike,
    write_json,
)
from ._session import ENV_VAR, _attach, trace_from_environment, traced
from ._summary import load_trace, summarize

__all__ = [
    "AUTOSAVE_OVERHEAD",
    "DEFAULT_MAX_EVENTS",
    "ENV_VAR",
    "MAX_FAILURES",
    "ChromeTracer",
    "PathLike",
    "_attach",
    "_itemsize",
    "_lanes",
    "load_trace",
    "plot",
    "summarize",
    "trace_from_environment",
    "traced",
    "write_json",
]
