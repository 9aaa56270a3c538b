"""The cupy backend: replicas' values are CuPy arrays on CUDA GPUs.

Registered as ``cupy`` under the ``asyncreplica.backends`` entry point; strategies
whose devices are GPUs (``"GPU:0"``) use it. Several replicas may share one GPU
(``MirroredStrategy(["GPU:0", "GPU:0"])``). Importing this package needs neither CuPy
nor a GPU: :meth:`CupyBackend.check_available` says what is missing and how to get it
(``pip install "asyncreplica[gpu]"``).

The planning (which replicas on which GPU, NCCL ranks, the replica-order fold, the
``MEAN`` divisor) is pure Python in :mod:`asyncreplica_cupy._plan`.
"""

from __future__ import annotations

from ._backend import (
    INSTALL_HINT,
    CupyBackend,
    compile_offline,
    kernel_problem,
    visible_gpu_count,
    wait_for_events,
)
from ._plan import GpuPlan, Route, every_fold_variant, mean_divisor, reduction_route

__all__ = [
    "INSTALL_HINT",
    "CupyBackend",
    "GpuPlan",
    "Route",
    "compile_offline",
    "every_fold_variant",
    "kernel_problem",
    "mean_divisor",
    "reduction_route",
    "visible_gpu_count",
    "wait_for_events",
]


def _set_public_module() -> None:
    """Name this package, where they are imported from, as its classes' module.

    Tracebacks, ``repr`` and ``help()`` then print the public name; pickle finds the
    classes here too.
    """
    namespace = globals()
    for name in __all__:
        obj = namespace[name]
        if isinstance(obj, type) and obj.__module__.startswith(__name__ + "."):
            obj.__module__ = __name__


_set_public_module()
