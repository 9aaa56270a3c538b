"""asyncreplica: tf.distribute's replica model as coroutines on one event loop.

Run N replicas of an ``async def`` step function, let them meet at collectives
(``all_reduce``, ``all_gather``, ``broadcast``, ``reduce_scatter``, ``barrier``,
``merge_call``), and get a precise error -- never a hang -- when they disagree:

>>> import asyncio
>>> import asyncreplica as ar
>>> strategy = ar.MirroredStrategy(["CPU:0", "CPU:1"])
>>> async def step(x):
...     ctx = ar.get_replica_context()
...     return await ctx.all_reduce(ar.ReduceOp.SUM, x)
>>> result = asyncio.run(strategy.run(step, args=(1.0,)))
>>> strategy.experimental_local_results(result)
(array(2.), array(2.))

Every public class reports ``asyncreplica`` as its module (``asyncreplica.ReplicaExitedError``
in a traceback, not the private module that defines it), as trio's classes do.
"""

from __future__ import annotations

# First: decides whether the hot path runs compiled or from the .py sources, before any
# of those modules is imported (ASYNCREPLICA_NO_EXTENSIONS=1 picks the sources).
from . import _compiled  # noqa: F401
from ._core._signature import ReduceOp as ReduceOp
from ._exceptions import AsyncReplicaError as AsyncReplicaError
from ._exceptions import BackendError as BackendError
from ._exceptions import BackendNotFoundError as BackendNotFoundError
from ._exceptions import CollectiveDeadlockError as CollectiveDeadlockError
from ._exceptions import CollectiveError as CollectiveError
from ._exceptions import CollectiveMismatchError as CollectiveMismatchError
from ._exceptions import CollectiveTimeoutError as CollectiveTimeoutError
from ._exceptions import InternalError as InternalError
from ._exceptions import ReplicaCancelledError as ReplicaCancelledError
from ._exceptions import ReplicaContextError as ReplicaContextError
from ._exceptions import ReplicaExitedError as ReplicaExitedError
from ._options import CommunicationImplementation as CommunicationImplementation
from ._options import CommunicationOptions as CommunicationOptions
from ._public import set_public_module
from ._runtime._context import ReplicaContext as ReplicaContext
from ._runtime._context import get_replica_context as get_replica_context
from ._runtime._context import in_cross_replica_context as in_cross_replica_context
from ._runtime._extended import StrategyExtended as StrategyExtended
from ._runtime._global_strategy import experimental_set_strategy as experimental_set_strategy
from ._runtime._global_strategy import get_cross_replica_context as get_cross_replica_context
from ._runtime._global_strategy import get_strategy as get_strategy
from ._runtime._global_strategy import has_strategy as has_strategy
from ._runtime._input import DistributedDataset as DistributedDataset
from ._runtime._input import DistributedDatasetsFromFunction as DistributedDatasetsFromFunction
from ._runtime._input import DistributedIterator as DistributedIterator
from ._runtime._input import DistributedOptional as DistributedOptional
from ._runtime._input import InputContext as InputContext
from ._runtime._strategy import MirroredStrategy as MirroredStrategy
from ._runtime._strategy import MultiWorkerMirroredStrategy as MultiWorkerMirroredStrategy
from ._runtime._strategy import Strategy as Strategy
from ._values import DistributedValues as DistributedValues
from ._values import IndexedSlices as IndexedSlices
from ._values import Mirrored as Mirrored
from ._values import PerReplica as PerReplica
from ._values import ValueContext as ValueContext
from ._version import __version__ as __version__

__all__ = [
    "AsyncReplicaError",
    "BackendError",
    "BackendNotFoundError",
    "CollectiveDeadlockError",
    "CollectiveError",
    "CollectiveMismatchError",
    "CollectiveTimeoutError",
    "CommunicationImplementation",
    "CommunicationOptions",
    "DistributedDataset",
    "DistributedDatasetsFromFunction",
    "DistributedIterator",
    "DistributedOptional",
    "DistributedValues",
    "IndexedSlices",
    "InputContext",
    "InternalError",
    "Mirrored",
    "MirroredStrategy",
    "MultiWorkerMirroredStrategy",
    "PerReplica",
    "ReduceOp",
    "ReplicaCancelledError",
    "ReplicaContext",
    "ReplicaContextError",
    "ReplicaExitedError",
    "Strategy",
    "StrategyExtended",
    "ValueContext",
    "__version__",
    "experimental_set_strategy",
    "get_cross_replica_context",
    "get_replica_context",
    "get_strategy",
    "has_strategy",
    "in_cross_replica_context",
]


set_public_module(__name__, globals(), __all__)
del set_public_module

# Under mpiexec: a process that ends before creating the strategy its peers create tells
# them (asyncreplica._launch.watch); elsewhere this does nothing.
from ._launch import watch as _watch  # noqa: E402

_watch()
del _watch
