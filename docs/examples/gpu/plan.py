"""How the cupy backend plans replicas on GPUs (pure Python: runs without a GPU)."""

from asyncreplica_cupy import GpuPlan, Route, mean_divisor, reduction_route

import asyncreplica as ar

plan = GpuPlan.from_devices(["GPU:0", "GPU:1", "GPU:0"])
print(plan.describe())  # GPU 0 (rank 0): replicas 0, 2; GPU 1 (rank 1): replica 1
assert plan.gpus == (0, 1)  # one NCCL rank per distinct GPU
assert plan.replicas_on(0) == (0, 2)

# MEAN divides by every replica (3), not by the GPUs (2) as NCCL_AVG would.
assert mean_divisor(plan) == 3

# Integers are the same in any order: NCCL carries them. A float sum over this
# uneven layout travels replica by replica, so it is the replica-order sum...
assert reduction_route(plan, ar.ReduceOp.SUM, "int32") is Route.NCCL
assert reduction_route(plan, ar.ReduceOp.SUM, "float32") is Route.CHAIN
# ... unless the backend is made with exact_order=False.
assert reduction_route(plan, ar.ReduceOp.SUM, "float32", exact_order=False) is Route.NCCL
# All replicas on one GPU: one fused kernel, in replica order.
one_gpu = GpuPlan.from_devices(["GPU:0"] * 4)
assert reduction_route(one_gpu, ar.ReduceOp.MEAN, "float32") is Route.LOCAL
