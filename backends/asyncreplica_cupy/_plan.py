"""The cupy backend's planning, in pure Python: no CuPy, no numpy, no GPU needed.

Everything the backend decides before it touches a device lives here, so that it is
tested on any machine:

* which replicas sit on which GPU (:class:`GpuPlan`), and the NCCL rank of each
  distinct GPU (one rank per GPU, never two ranks of one communicator on one GPU);
* how each all-reduce travels between GPUs (:func:`reduction_route`) and what ``MEAN``
  divides by (:func:`mean_divisor`: the total replica count, never NCCL's average);
* the fused kernel that folds one GPU's replicas in replica order
  (:func:`fold_kernel_source`, :func:`fold_chunks`);
* how long to wait between two polls of a CUDA event (:class:`PollSchedule`).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import re
from collections.abc import Sequence

from asyncreplica.abc import ReduceOp

__all__ = [
    "MAX_FOLD_ARITY",
    "NCCL_DTYPES",
    "NCCL_OPS",
    "FoldKernel",
    "FoldMode",
    "GpuPlan",
    "PollSchedule",
    "Route",
    "Segment",
    "fold_chunks",
    "fold_kernel_source",
    "gpu_ordinal",
    "mean_divisor",
    "reduction_route",
]

_GPU = re.compile(r"^GPU:(\d+)$")

#: numpy dtype names NCCL reduces natively, with the name of CuPy's NCCL constant.
NCCL_DTYPES: dict[str, str] = {
    "int8": "NCCL_INT8",
    "uint8": "NCCL_UINT8",
    "int32": "NCCL_INT32",
    "uint32": "NCCL_UINT32",
    "int64": "NCCL_INT64",
    "uint64": "NCCL_UINT64",
    "float16": "NCCL_FLOAT16",
    "float32": "NCCL_FLOAT32",
    "float64": "NCCL_FLOAT64",
}

#: The NCCL operation of each ``ReduceOp``. ``MEAN`` is an NCCL sum divided afterwards
#: by the total replica count: ``NCCL_AVG`` divides by the number of *ranks* (GPUs),
#: which is wrong when GPUs hold unequal numbers of replicas.
NCCL_OPS: dict[ReduceOp, str] = {
    ReduceOp.SUM: "NCCL_SUM",
    ReduceOp.MEAN: "NCCL_SUM",
    ReduceOp.PROD: "NCCL_PROD",
    ReduceOp.MIN: "NCCL_MIN",
    ReduceOp.MAX: "NCCL_MAX",
}

#: The most inputs one fused fold kernel takes; more replicas on one GPU are folded in
#: chunks (:func:`fold_chunks`), which gives the same bits.
MAX_FOLD_ARITY = 16


def gpu_ordinal(device: str) -> int:
    """The CUDA ordinal of a canonical GPU device name.

    Args:
        device: A canonical device name such as ``"GPU:1"``.

    Returns:
        The ordinal, ``1`` for ``"GPU:1"``.

    Raises:
        ValueError: ``device`` is not a GPU device.
    """
    match = _GPU.match(device)
    if match is None:
        raise ValueError(
            f"the cupy backend holds values on GPUs only, but device {device!r} was requested: "
            "use GPU devices ('GPU:0', 'GPU:1', ...), or CPU devices with the numpy backend "
            "(backend='numpy')"
        )
    return int(match[1])


@dataclasses.dataclass(frozen=True)
class Segment:
    """A run of consecutive replicas (in replica order) that sit on one GPU.

    Attributes:
        gpu: The CUDA ordinal.
        replicas: The replica ids, ascending and consecutive.
    """

    gpu: int
    replicas: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class GpuPlan:
    """Where each replica lives, and what follows from it.

    Several replicas may share one GPU. The distinct GPUs, in the order their first
    replica appears, are the NCCL ranks: rank ``k`` is ``gpus[k]``.

    Attributes:
        replica_gpus: The CUDA ordinal of each replica, in replica order.
    """

    replica_gpus: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.replica_gpus:
            raise ValueError("a GpuPlan needs at least one replica")
        if any(isinstance(g, bool) or not isinstance(g, int) or g < 0 for g in self.replica_gpus):
            raise ValueError(f"GPU ordinals must be non-negative ints, got {self.replica_gpus!r}")

    @classmethod
    def from_devices(cls, devices: Sequence[str]) -> GpuPlan:
        """The plan of replicas on canonical devices (``["GPU:0", "GPU:0", "GPU:1"]``).

        Raises:
            ValueError: A device is not a GPU, or there is none.
        """
        if not devices:
            raise ValueError("the cupy backend needs at least one device, e.g. ['GPU:0']")
        return cls(tuple(gpu_ordinal(d) for d in devices))

    @property
    def num_replicas(self) -> int:
        """How many replicas there are, on all GPUs."""
        return len(self.replica_gpus)

    @functools.cached_property
    def gpus(self) -> tuple[int, ...]:
        """The distinct GPUs, in the order of their first replica: the NCCL ranks."""
        return tuple(dict.fromkeys(self.replica_gpus))

    @property
    def multi_gpu(self) -> bool:
        """Whether replicas sit on more than one GPU."""
        return len(self.gpus) > 1

    def rank_of(self, gpu: int) -> int:
        """The NCCL rank of ``gpu`` (its index in :attr:`gpus`).

        Raises:
            ValueError: No replica sits on ``gpu``.
        """
        try:
            return self.gpus.index(gpu)
        except ValueError:
            raise ValueError(f"no replica sits on GPU {gpu} (GPUs: {list(self.gpus)})") from None

    def replicas_on(self, gpu: int) -> tuple[int, ...]:
        """The replicas on ``gpu``, in replica order (empty if none)."""
        return tuple(r for r, g in enumerate(self.replica_gpus) if g == gpu)

    def gpu_of(self, replica: int) -> int:
        """The GPU of ``replica``; ids past the last replica wrap around (for broadcast)."""
        return self.replica_gpus[replica % self.num_replicas]

    @functools.cached_property
    def segments(self) -> tuple[Segment, ...]:
        """The maximal runs of consecutive replicas on one GPU, in replica order."""
        out: list[Segment] = []
        for r, g in enumerate(self.replica_gpus):
            if out and out[-1].gpu == g:
                out[-1] = Segment(g, (*out[-1].replicas, r))
            else:
                out.append(Segment(g, (r,)))
        return tuple(out)

    def describe(self) -> str:
        """A one-line summary, e.g. ``"GPU 0 (rank 0): replicas 0, 2; GPU 1 (rank 1): replica 1"``."""
        parts = []
        for rank, g in enumerate(self.gpus):
            replicas = self.replicas_on(g)
            noun = "replica" if len(replicas) == 1 else "replicas"
            parts.append(f"GPU {g} (rank {rank}): {noun} {', '.join(map(str, replicas))}")
        return "; ".join(parts)


def mean_divisor(plan: GpuPlan) -> int:
    """What ``MEAN`` divides the sum by: every replica, on every GPU.

    Not the number of GPUs (NCCL's ``NCCL_AVG``) and not one GPU's replica count.
    """
    return plan.num_replicas


class Route(enum.Enum):
    """How one all-reduce combines replicas' values.

    Attributes:
        LOCAL: Every replica is on one GPU: one fused kernel folds them in replica order.
        NCCL: Each GPU folds its own replicas in replica order, then one NCCL all-reduce
            per rank (all ranks in one ``groupStart()``/``groupEnd()``) combines the GPUs.
        CHAIN: The running result travels along the replicas in replica order, hopping
            to the next GPU (a peer copy) where the next replica lives, then the final
            result is copied to every other GPU. Exactly the replica-order fold.
    """

    LOCAL = "local"
    NCCL = "nccl"
    CHAIN = "chain"


def _order_free(plan: GpuPlan, op: ReduceOp, dtype: str) -> bool:
    """Whether any order of combining gives the bits of the replica-order fold."""
    if op in (ReduceOp.MIN, ReduceOp.MAX) and not dtype.startswith("float"):
        return True  # an integer min or max is one of the values, whatever the order
    if dtype.startswith(("int", "uint")):
        return True  # integer sums and products wrap around: associative and commutative
    # Floats: a + b == b + a exactly, but (a + b) + c != a + (b + c). With two GPUs of
    # one replica each NCCL computes x0 op x1 (or x1 op x0), which is the fold.
    return len(plan.gpus) == 2 and plan.num_replicas == 2


def reduction_route(
    plan: GpuPlan, op: ReduceOp, dtype: str, *, exact_order: bool = True, nccl: bool = True
) -> Route:
    """Choose how an all-reduce of ``dtype`` values with ``op`` travels between GPUs.

    Args:
        plan: Where the replicas are.
        op: The reduction.
        dtype: The numpy name of the values' dtype (``"float32"``).
        exact_order: Whether results must be bitwise the replica-order fold (the
            backend contract). When False, NCCL may combine floats in its own order:
            every replica still gets the same bits, but they may differ in the last
            place from a replica-order sum.
        nccl: Whether NCCL can be used here (CuPy found ``libnccl``).

    Returns:
        :attr:`Route.LOCAL` for one GPU; :attr:`Route.NCCL` when NCCL supports the
        dtype and its result is the replica-order fold (or ``exact_order`` is False);
        :attr:`Route.CHAIN` otherwise.
    """
    if not plan.multi_gpu:
        return Route.LOCAL
    if not nccl or dtype not in NCCL_DTYPES:
        return Route.CHAIN
    if op in (ReduceOp.MIN, ReduceOp.MAX) and dtype.startswith("float"):
        # NCCL's float min/max does not promise numpy's NaN propagation.
        return Route.NCCL if not exact_order else Route.CHAIN
    if not exact_order or _order_free(plan, op, dtype):
        return Route.NCCL
    return Route.CHAIN


def fold_chunks(count: int, max_arity: int = MAX_FOLD_ARITY) -> list[range]:
    """Split a fold of ``count`` inputs into kernels of at most ``max_arity`` inputs.

    The first kernel takes up to ``max_arity`` inputs; each later one takes the previous
    result plus up to ``max_arity - 1`` new inputs, so the fold stays left to right.

    Returns:
        The ranges of input indices each kernel folds, in order.

    Raises:
        ValueError: ``count < 1`` or ``max_arity < 2``.
    """
    if count < 1:
        raise ValueError(f"a fold needs at least one input, got {count}")
    if max_arity < 2:
        raise ValueError(f"max_arity must be at least 2, got {max_arity}")
    chunks = [range(min(count, max_arity))]
    while chunks[-1].stop < count:
        start = chunks[-1].stop
        chunks.append(range(start, min(count, start + max_arity - 1)))
    return chunks


class FoldMode(enum.Enum):
    """What a fold kernel writes.

    Attributes:
        PLAIN: The fold, in the inputs' dtype.
        MEAN: The fold divided by a scalar ``d`` of the inputs' (float) dtype.
        MEAN_TO_FLOAT64: The (integer) fold converted to float64, then divided by ``d``.
    """

    PLAIN = "plain"
    MEAN = "mean"
    MEAN_TO_FLOAT64 = "mean_to_float64"


@dataclasses.dataclass(frozen=True)
class FoldKernel:
    """The pieces of a ``cupy.ElementwiseKernel`` that folds its inputs left to right.

    Attributes:
        in_params: e.g. ``"T x0, T x1, T x2"`` (and ``", T d"`` for a mean).
        out_params: ``"T y"``, or ``"float64 y"`` for the mean of integers.
        operation: The CUDA C body.
        name: The kernel's name.
    """

    in_params: str
    out_params: str
    operation: str
    name: str


# One step of the fold, ``acc = acc OP x``, exactly as numpy's ufunc computes it. MIN and
# MAX keep a NaN accumulator and take a NaN input, like numpy.minimum/maximum.
_STEP = {
    ReduceOp.SUM: "acc = acc + {x};",
    ReduceOp.MEAN: "acc = acc + {x};",
    ReduceOp.PROD: "acc = acc * {x};",
    ReduceOp.MIN: "acc = (acc < {x} || acc != acc) ? acc : {x};",
    ReduceOp.MAX: "acc = (acc > {x} || acc != acc) ? acc : {x};",
}


def fold_kernel_source(op: ReduceOp, arity: int, mode: FoldMode = FoldMode.PLAIN) -> FoldKernel:
    """The elementwise kernel ``y = ((x0 op x1) op x2) ...``, rounded to ``T`` at each step.

    Each step assigns to ``acc`` of the inputs' type ``T``, so every partial result is
    rounded as numpy rounds it; the inputs are read once and the output written once.

    Args:
        op: The reduction (``MEAN`` folds as ``SUM``; ``mode`` says whether to divide).
        arity: The number of inputs (at least 1; 1 copies or divides).
        mode: Whether and how the result is divided by the scalar argument ``d``.

    Returns:
        The kernel's parameters, body and name.

    Raises:
        ValueError: ``arity < 1``, or a mean mode with an op other than SUM or MEAN.
    """
    if arity < 1:
        raise ValueError(f"a fold kernel needs at least one input, got {arity}")
    if mode is not FoldMode.PLAIN and op not in (ReduceOp.SUM, ReduceOp.MEAN):
        raise ValueError(f"only SUM or MEAN can be divided, not {op.value}")
    inputs = [f"T x{i}" for i in range(arity)]
    lines = ["T acc = x0;"]
    lines += [_STEP[op].format(x=f"x{i}") for i in range(1, arity)]
    if mode is FoldMode.PLAIN:
        out = "T y"
        lines.append("y = acc;")
    elif mode is FoldMode.MEAN:
        inputs.append("T d")
        out = "T y"
        lines.append("y = acc / d;")
    else:
        inputs.append("float64 d")
        out = "float64 y"
        lines.append("y = (double)acc / d;")
    name = f"asyncreplica_fold_{op.value}_{arity}_{mode.value}"
    return FoldKernel(", ".join(inputs), out, "\n".join(lines), name)


@dataclasses.dataclass(frozen=True)
class PollSchedule:
    """How the backend waits for a CUDA event without blocking the event loop.

    For the first ``spin_seconds`` it only yields (``sleep(0)``): other coroutines run,
    and a short collective is seen as soon as it finishes. After that it sleeps,
    starting at ``first_sleep_seconds`` and doubling up to ``max_sleep_seconds``.

    Attributes:
        spin_seconds: How long to poll at every turn of the event loop.
        first_sleep_seconds: The first real sleep.
        max_sleep_seconds: The longest sleep between two polls.
    """

    spin_seconds: float = 0.002
    first_sleep_seconds: float = 0.00005
    max_sleep_seconds: float = 0.002

    def next_delay(self, elapsed: float, previous: float) -> float:
        """The sleep before the next poll.

        Args:
            elapsed: Seconds since the wait began.
            previous: The previous delay (0.0 at first).

        Returns:
            ``0.0`` while spinning, then a doubling delay capped at ``max_sleep_seconds``.
        """
        if elapsed < self.spin_seconds:
            return 0.0
        return min(max(previous * 2.0, self.first_sleep_seconds), self.max_sleep_seconds)
