"""The cupy backend's planning, in pure Python: no CuPy, no numpy, no GPU needed.

Everything the backend decides before it touches a device lives here, so that it is
tested on any machine:

* which replicas sit on which GPU (:class:`GpuPlan`), and the NCCL rank of each
  distinct GPU (one rank per GPU, never two ranks of one communicator on one GPU);
* how each all-reduce travels between GPUs (:func:`reduction_route`) and what ``MEAN``
  divides by (:func:`mean_divisor`: the total replica count, never NCCL's average);
* the fused kernel that folds one GPU's replicas in replica order
  (:func:`fold_kernel_source`, :func:`fold_chunks`), and which of them one all-reduce
  runs (:func:`reduction_variants`), so they are compiled before it, off the event loop;
* how long to wait between two polls of a CUDA event (:class:`PollSchedule`).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import re
from collections.abc import Sequence

from asyncreplica.abc import EXACT_MEAN_COUNT, ReduceOp

__all__ = [
    "EXACT_INT64_SUMMANDS",
    "EXACT_SUM_DIVISION",
    "FOLD_DTYPES",
    "MAX_FOLD_ARITY",
    "NCCL_DTYPES",
    "NCCL_OPS",
    "Fold",
    "FoldKernel",
    "FoldMode",
    "FoldVariant",
    "GpuPlan",
    "PollSchedule",
    "Route",
    "Segment",
    "every_fold_variant",
    "fold_chunks",
    "fold_kernel_source",
    "fold_steps",
    "gpu_ordinal",
    "integer_mean_dtype",
    "mean_divisor",
    "reduction_folds",
    "reduction_route",
    "reduction_variants",
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

#: Fewer summands than this: a sum of 32-bit or smaller integers, taken in int64, stays
#: below ``2**52`` in magnitude, so it is exact and converts to float64 exactly. The one
#: bound of the exact integer MEAN rule (``asyncreplica.abc.EXACT_MEAN_COUNT``).
EXACT_INT64_SUMMANDS = EXACT_MEAN_COUNT
_NARROW_INTS = frozenset({"int8", "int16", "int32", "uint8", "uint16", "uint32"})


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


def integer_mean_dtype(dtype: str, summands: int) -> str | None:
    """Where the ``MEAN`` of ``summands`` integers of ``dtype`` is summed: exactly, always.

    The MEAN of integers is the float64 nearest to the true mean (the numpy backend's
    rule): the exact sum, divided once. A fold in the inputs' dtype would wrap around
    (int8 ``3 * 127`` is 125), so the values are never summed in it.

    Args:
        dtype: The inputs' numpy dtype name (an integer dtype).
        summands: How many values are summed into each element of the result.

    Returns:
        ``"int64"`` when the inputs are widened to int64 on the GPU and summed there (8
        to 32-bit integers, fewer than :data:`EXACT_INT64_SUMMANDS` summands: the sum is
        exact and below ``2**52``); None when the sum may need more than 64 bits and the
        MEAN is taken on the host, by the numpy backend's exact rule.
    """
    if dtype in _NARROW_INTS and summands < EXACT_INT64_SUMMANDS:
        return "int64"
    return None


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
        MEAN: The fold divided by ``d`` (passed as a double holding the divisor rounded
            to the inputs' float dtype), rounded to that dtype.
        MEAN_TO_FLOAT64: The (integer) fold converted to float64, then divided by ``d``.
    """

    PLAIN = "plain"
    MEAN = "mean"
    MEAN_TO_FLOAT64 = "mean_to_float64"


#: The dtypes a fold kernel takes: numpy name -> (CUDA type, type each step computes in,
#: unsigned type integer steps wrap in). Complex values are folded with CuPy's ufuncs.
FOLD_DTYPES: dict[str, tuple[str, str, str]] = {
    "int8": ("signed char", "signed char", "unsigned int"),
    "int16": ("short", "short", "unsigned int"),
    "int32": ("int", "int", "unsigned int"),
    "int64": ("long long", "long long", "unsigned long long"),
    "uint8": ("unsigned char", "unsigned char", "unsigned int"),
    "uint16": ("unsigned short", "unsigned short", "unsigned int"),
    "uint32": ("unsigned int", "unsigned int", "unsigned int"),
    "uint64": ("unsigned long long", "unsigned long long", "unsigned long long"),
    # numpy adds float16 values in float32 and rounds the sum to float16: so do we.
    "float16": ("__half", "float", ""),
    "float32": ("float", "float", ""),
    "float64": ("double", "double", ""),
}


@dataclasses.dataclass(frozen=True)
class FoldVariant:
    """One compiled fold kernel: what it folds, how many inputs, what it writes.

    Attributes:
        op: The reduction (``MEAN`` folds as ``SUM``; ``mode`` says whether to divide).
        arity: The number of inputs, 1 to :data:`MAX_FOLD_ARITY`.
        mode: Whether and how the fold is divided.
        dtype: The inputs' numpy dtype name, a key of :data:`FOLD_DTYPES`.
    """

    op: ReduceOp
    arity: int
    mode: FoldMode
    dtype: str

    def __post_init__(self) -> None:
        if not 1 <= self.arity <= MAX_FOLD_ARITY:
            raise ValueError(f"a fold kernel takes 1 to {MAX_FOLD_ARITY} inputs, got {self.arity}")
        if self.mode is not FoldMode.PLAIN and self.op is not ReduceOp.MEAN:
            raise ValueError(f"only MEAN divides, not {self.op.value}")
        if self.dtype not in FOLD_DTYPES:
            raise ValueError(
                f"no fold kernel for dtype {self.dtype} (kernels take "
                f"{', '.join(FOLD_DTYPES)}; complex values use CuPy's ufuncs)"
            )
        floating = self.dtype.startswith("float")
        if self.mode is FoldMode.MEAN and not floating:
            raise ValueError(f"MEAN of {self.dtype} values is written as float64")
        if self.mode is FoldMode.MEAN_TO_FLOAT64 and floating:
            raise ValueError(f"MEAN of {self.dtype} values keeps their dtype")
        exact_sum_division = (self.arity, self.mode, self.dtype) == (
            1,
            FoldMode.MEAN_TO_FLOAT64,
            "int64",
        )
        if self.op is ReduceOp.MEAN and not floating and not exact_sum_division:
            # Summing in the inputs' dtype would wrap around: integers are widened and
            # summed exactly first (integer_mean_dtype), then one int64 sum is divided.
            raise ValueError(
                f"an integer MEAN is summed exactly in int64 first: no MEAN fold of "
                f"{self.arity} {self.dtype} inputs (only of one int64 sum)"
            )

    @property
    def name(self) -> str:
        """The kernel's (``extern "C"``) name, distinct per variant."""
        return f"asyncreplica_fold_{self.op.value}_{self.arity}_{self.mode.value}_{self.dtype}"

    @property
    def out_dtype(self) -> str:
        """The numpy dtype name of the output."""
        return "float64" if self.mode is FoldMode.MEAN_TO_FLOAT64 else self.dtype


#: The one kernel an integer ``MEAN`` divides with: an exact int64 sum into float64.
EXACT_SUM_DIVISION = FoldVariant(ReduceOp.MEAN, 1, FoldMode.MEAN_TO_FLOAT64, "int64")


@dataclasses.dataclass(frozen=True)
class FoldKernel:
    """A fold kernel's CUDA source and name, compiled as one NVRTC program.

    The kernel's parameters are the inputs ``x0 .. x{arity-1}`` (C-contiguous, one
    element type), the output ``y``, then ``double d`` for a mean, then the element
    count ``long long n``. It loops over the elements with a grid stride.

    Attributes:
        name: The kernel's name.
        code: The whole CUDA C++ source.
    """

    name: str
    code: str


# One step of the fold, ``acc = acc OP x``, exactly as numpy's ufunc computes it; ``{c}``
# is the type a step computes in, ``{u}`` the unsigned type integer steps wrap in (a signed
# overflow is undefined in C++). MIN and MAX keep a NaN accumulator and take a NaN input,
# like numpy.minimum/maximum.
_FLOAT_STEP = {
    ReduceOp.SUM: "acc = ({t})(({c})acc + ({c}){x});",
    ReduceOp.MEAN: "acc = ({t})(({c})acc + ({c}){x});",
    ReduceOp.PROD: "acc = ({t})(({c})acc * ({c}){x});",
    ReduceOp.MIN: "if (!(({c})acc < ({c}){x} || ({c})acc != ({c})acc)) acc = {x};",
    ReduceOp.MAX: "if (!(({c})acc > ({c}){x} || ({c})acc != ({c})acc)) acc = {x};",
}
_INT_STEP = {
    ReduceOp.SUM: "acc = ({t})(({u})acc + ({u}){x});",
    ReduceOp.MEAN: "acc = ({t})(({u})acc + ({u}){x});",
    ReduceOp.PROD: "acc = ({t})(({u})acc * ({u}){x});",
    ReduceOp.MIN: "if (!(acc < {x})) acc = {x};",
    ReduceOp.MAX: "if (!(acc > {x})) acc = {x};",
}


def fold_kernel_source(
    op: ReduceOp, arity: int, mode: FoldMode = FoldMode.PLAIN, dtype: str = "float32"
) -> FoldKernel:
    """The kernel ``y = ((x0 op x1) op x2) ...``, rounded to the dtype at each step.

    Each step assigns to ``acc`` of the inputs' type, so every partial result is
    rounded as numpy rounds it; the inputs are read once and the output written once.

    Args:
        op: The reduction (``MEAN`` folds as ``SUM``; ``mode`` says whether to divide).
        arity: The number of inputs (1 to :data:`MAX_FOLD_ARITY`; 1 copies or divides).
        mode: Whether and how the result is divided by the argument ``d``.
        dtype: The inputs' numpy dtype name (a key of :data:`FOLD_DTYPES`).

    Returns:
        The kernel's name and CUDA source.

    Raises:
        ValueError: A variant no kernel exists for (see :class:`FoldVariant`).
    """
    variant = FoldVariant(op, arity, mode, dtype)
    t, c, u = FOLD_DTYPES[dtype]
    out = "double" if mode is FoldMode.MEAN_TO_FLOAT64 else t
    step = (_FLOAT_STEP if dtype.startswith("float") else _INT_STEP)[op]
    params = [f"const {t}* __restrict__ x{k}" for k in range(arity)]
    params.append(f"{out}* __restrict__ y")
    if mode is not FoldMode.PLAIN:
        params.append("double d")
    params.append("long long n")
    body = [f"{t} acc = x0[i];"]
    body += [step.format(t=t, c=c, u=u, x=f"x{k}[i]") for k in range(1, arity)]
    if mode is FoldMode.PLAIN:
        body.append("y[i] = acc;")
    elif mode is FoldMode.MEAN:
        body.append(f"y[i] = ({t})(({c})acc / ({c})d);")
    else:
        body.append("y[i] = (double)acc / d;")
    lines = ["#include <cuda_fp16.h>"] if dtype == "float16" else []
    lines += [
        f'extern "C" __global__ void {variant.name}(',
        "    " + ",\n    ".join(params) + ") {",
        "    const long long stride = (long long)gridDim.x * blockDim.x;",
        "    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;",
        "         i < n; i += stride) {",
        *("        " + line for line in body),
        "    }",
        "}",
        "",
    ]
    return FoldKernel(variant.name, "\n".join(lines))


def fold_steps(count: int, op: ReduceOp, dtype: str, *, divide: bool) -> list[FoldVariant]:
    """The kernels, in order, that fold ``count`` inputs of ``dtype`` (see :func:`fold_chunks`).

    Args:
        count: How many inputs the fold takes.
        op: The reduction.
        dtype: The inputs' numpy dtype name (a key of :data:`FOLD_DTYPES`).
        divide: Whether the last kernel divides (a ``MEAN``): floats keep their dtype,
            integers are divided into float64.

    Returns:
        One variant per chunk; kernel ``k`` folds chunk ``k`` (after the previous result).
    """
    if divide and not dtype.startswith("float"):
        # An integer MEAN divides one exact int64 sum (see integer_mean_dtype); raises
        # ValueError (FoldVariant) for anything else.
        return [FoldVariant(ReduceOp.MEAN, count, FoldMode.MEAN_TO_FLOAT64, dtype)]
    chunks = fold_chunks(count)
    mean = FoldMode.MEAN if dtype.startswith("float") else FoldMode.MEAN_TO_FLOAT64
    steps = []
    for k, chunk in enumerate(chunks):
        arity = len(chunk) + (1 if k else 0)
        mode = mean if divide and k == len(chunks) - 1 else FoldMode.PLAIN
        steps.append(FoldVariant(op, arity, mode, dtype))
    return steps


@dataclasses.dataclass(frozen=True)
class Fold:
    """One fold an all-reduce runs on one GPU.

    Attributes:
        gpu: Where it runs.
        count: How many arrays it folds.
        divide: Whether it divides by the ``MEAN`` divisor.
    """

    gpu: int
    count: int
    divide: bool


def reduction_folds(plan: GpuPlan, op: ReduceOp, route: Route) -> list[Fold]:
    """The folds one dense all-reduce leaf runs on ``route``, in order.

    * ``LOCAL``: one fold of every replica;
    * ``CHAIN``: one fold per :attr:`GpuPlan.segments` entry, of its replicas plus the
      running result (after the first); the last divides for ``MEAN``;
    * ``NCCL``: one fold per GPU that holds several replicas (a GPU with one replica
      sends its value as it is), then for ``MEAN`` one division per GPU after NCCL.
    """
    mean = op is ReduceOp.MEAN
    if route is Route.LOCAL:
        return [Fold(plan.gpus[0], plan.num_replicas, mean)]
    if route is Route.CHAIN:
        last = len(plan.segments) - 1
        return [
            Fold(s.gpu, len(s.replicas) + (1 if i else 0), mean and i == last)
            for i, s in enumerate(plan.segments)
        ]
    folds = [Fold(g, len(plan.replicas_on(g)), False) for g in plan.gpus]
    folds = [f for f in folds if f.count > 1]
    if mean:
        folds += [Fold(g, 1, True) for g in plan.gpus]
    return folds


def reduction_variants(
    plan: GpuPlan, op: ReduceOp, dtype: str, route: Route
) -> frozenset[FoldVariant]:
    """Every fold kernel one all-reduce of ``dtype`` values runs (none for complex).

    An integer ``MEAN`` is an all-reduce ``SUM`` of the values widened to int64, then one
    division of that exact sum per GPU; none when it is taken on the host (see
    :func:`integer_mean_dtype`).
    """
    if dtype not in FOLD_DTYPES:
        return frozenset()
    if op is ReduceOp.MEAN and not dtype.startswith("float"):
        if integer_mean_dtype(dtype, plan.num_replicas) is None:
            return frozenset()
        return reduction_variants(plan, ReduceOp.SUM, "int64", route) | {EXACT_SUM_DIVISION}
    return frozenset(
        v
        for fold in reduction_folds(plan, op, route)
        for v in fold_steps(fold.count, op, dtype, divide=fold.divide)
    )


def every_fold_variant() -> list[FoldVariant]:
    """Every fold kernel the backend can generate: all ops, arities, modes and dtypes."""
    out = []
    for dtype in FOLD_DTYPES:
        for arity in range(1, MAX_FOLD_ARITY + 1):
            floating = dtype.startswith("float")
            ops = [op for op in ReduceOp if floating or op is not ReduceOp.MEAN]
            out += [FoldVariant(op, arity, FoldMode.PLAIN, dtype) for op in ops]
            if floating:
                out.append(FoldVariant(ReduceOp.MEAN, arity, FoldMode.MEAN, dtype))
    out.append(EXACT_SUM_DIVISION)  # an integer MEAN divides one exact int64 sum
    return out


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
