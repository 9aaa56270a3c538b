"""``asyncreplica bench``: our collectives against baselines measured in the same run.

Every figure is a median over repeats, in microseconds per collective, next to its
baseline measured in the same process a moment before, so the ratio holds on whatever
machine runs it:

* ``futures``: a bare asyncio-futures rendezvous doing the same numpy sum (the last
  arrival sums in replica order and wakes one future per waiter);
* ``numpy floor``: the sum itself, in replica order, into one preallocated output
  (and, for large sizes, split over two threads);
* ``bytes floor`` for all_gather / broadcast / reduce_scatter: what must move at the
  least: a copy of each input into one output (all_gather), one copy of the source's
  input (broadcast), the sum of the inputs into one output (reduce_scatter); and the
  futures rendezvous doing that same work, which shows what any rendezvous adds;
* ``numpy, per leaf (floor)`` for the batched all_reduce: the least per-leaf work that
  gives each replica a read-only view per leaf (join, sum, views), with no rendezvous
  and no checks.

The targets table has a ``reference`` column: the same figure scored by the minimal
implementation (the futures rendezvous, or the per-leaf floor), measured in the run.
Where the reference itself misses a target, the target asks for less than the minimal
implementation costs on this machine.

Besides the timing table it measures the scale (per-replica cost of a small all_reduce
at 8 and 4096 replicas, run start-up excluded), the tracing overhead and memory (RSS
growth over 100,000 collectives, RSS of 10,000 replicas waiting at a collective), and
it prints every target of the performance issue with its measured value and whether it
is met (docs/performance.md).

Timings are noisy; the test suite runs ``--quick`` as a smoke test and asserts nothing
about the ratios.

The package's modules, one idea each: ``_model`` (the rows and targets a run records),
``_baselines`` (the minimal implementations and the timing helpers), ``_cases`` (the
measured cases), ``_memory`` (RSS), ``_targets`` (the issue's targets read from the
rows), ``_report`` (the printed tables), ``_plot`` (the chart's data and its renderer)
and ``_main`` (the command line).
"""

from __future__ import annotations

# Re-exported: the CLI runs ``main``; ``_bench_mpi``, benchmarks/ and the memory case's
# fresh interpreter import these helpers from the package.
from ._baselines import _blocked_sum as _blocked_sum
from ._baselines import _futures_rendezvous as _futures_rendezvous
from ._baselines import _timed as _timed
from ._main import main as main
from ._memory import _idle_rss as _idle_rss

__all__ = ["main"]
