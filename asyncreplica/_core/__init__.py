"""The pure core of asyncreplica: no event loop, no array library, no clock.

Everything that decides whether replicas agree lives here, so that it can be tested
exhaustively without running a single coroutine:

* :mod:`._signature` -- the plain-data description of one collective call;
* :mod:`._match` -- the one table of fields that must agree across replicas;
* :mod:`._ledger` -- per-run bookkeeping of positions, states and history;
* :mod:`._report` -- the builders of every collective error message;
* :mod:`._nest` -- flattening and rebuilding nested structures;
* :mod:`._devices` -- parsing device names.

This package imports the standard library and :mod:`asyncreplica._exceptions` only.
``tests/test_layering.py`` enforces that.
"""
