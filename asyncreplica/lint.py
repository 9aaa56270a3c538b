"""A static check for collectives that some replicas may never reach.

``asyncreplica lint PATH...`` on the command line; from Python::

    from asyncreplica.lint import lint_paths, lint_source

    for finding in lint_source(source, "train.py"):
        print(finding)   # train.py:8:18: all_reduce at line 8 is skipped when ...

It parses the source with :mod:`ast` (nothing is imported or executed) and flags a
collective inside a branch, loop or early exit whose condition depends on the replica
id or on per-replica data. ``# asyncreplica: ignore`` on the collective's line (or the
condition's) silences a finding.
"""

from __future__ import annotations

from ._tools._lint import Finding as Finding
from ._tools._lint import lint_paths as lint_paths
from ._tools._lint import lint_source as lint_source

__all__ = ["Finding", "lint_paths", "lint_source"]
