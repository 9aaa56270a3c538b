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

from asyncreplica._public import set_public_module

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


set_public_module(__name__, globals(), __all__)
del set_public_module
