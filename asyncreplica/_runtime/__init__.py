"""The thin async layer: runs replica tasks, feeds the ledger, awaits the backend.

No rule about whether replicas agree lives here (that is :mod:`asyncreplica._core`),
and no array library is imported (arrays are the backend's business). Everything
runs on anyio, so asyncio, uvloop and trio all work.
"""

from . import _pytrees as _pytrees  # registers JAX's pytree nodes as containers
