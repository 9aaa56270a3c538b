"""The cupy backend's planning, in pure Python: runs everywhere, no CuPy, no GPU."""

from __future__ import annotations

import anyio
import numpy as np
import pytest
from asyncreplica_cupy import wait_for_events
from asyncreplica_cupy._plan import (
    EXACT_SUM_DIVISION,
    FOLD_DTYPES,
    MAX_FOLD_ARITY,
    NCCL_DTYPES,
    NCCL_OPS,
    Fold,
    FoldMode,
    FoldVariant,
    GpuPlan,
    PollSchedule,
    Route,
    Segment,
    every_fold_variant,
    fold_chunks,
    fold_kernel_source,
    fold_steps,
    gpu_ordinal,
    mean_divisor,
    reduction_folds,
    reduction_route,
    reduction_variants,
)

from asyncreplica.abc import ReduceOp

# Devices ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("device", "ordinal"), [("GPU:0", 0), ("GPU:3", 3), ("GPU:12", 12)])
def test_gpu_ordinal(device: str, ordinal: int) -> None:
    assert gpu_ordinal(device) == ordinal


@pytest.mark.parametrize("device", ["CPU:0", "gpu:0", "GPU", "GPU:-1", "/gpu:0", "TPU:0"])
def test_gpu_ordinal_rejects_what_is_not_a_canonical_gpu(device: str) -> None:
    with pytest.raises(ValueError, match=r"GPUs only.*backend='numpy'"):
        gpu_ordinal(device)


def test_plan_rejects_no_devices_and_cpu_devices() -> None:
    with pytest.raises(ValueError, match="at least one device"):
        GpuPlan.from_devices([])
    with pytest.raises(ValueError, match=r"'CPU:1'"):
        GpuPlan.from_devices(["GPU:0", "CPU:1"])
    with pytest.raises(ValueError, match="non-negative"):
        GpuPlan((0, -1))


# Grouping replicas by GPU; NCCL ranks -----------------------------------------------------------


def test_replicas_grouped_by_gpu_in_replica_order() -> None:
    plan = GpuPlan.from_devices(["GPU:1", "GPU:0", "GPU:1", "GPU:1", "GPU:0"])
    assert plan.replica_gpus == (1, 0, 1, 1, 0)
    assert plan.num_replicas == 5
    assert plan.replicas_on(1) == (0, 2, 3)
    assert plan.replicas_on(0) == (1, 4)
    assert plan.replicas_on(7) == ()
    assert plan.multi_gpu


def test_one_nccl_rank_per_distinct_gpu_in_order_of_first_replica() -> None:
    plan = GpuPlan.from_devices(["GPU:2", "GPU:2", "GPU:0", "GPU:2", "GPU:5"])
    # Never two ranks of one communicator on one GPU: the ranks are the distinct GPUs.
    assert plan.gpus == (2, 0, 5)
    assert len(set(plan.gpus)) == len(plan.gpus)
    assert [plan.rank_of(g) for g in plan.gpus] == [0, 1, 2]
    with pytest.raises(ValueError, match="no replica sits on GPU 1"):
        plan.rank_of(1)


def test_several_replicas_on_one_gpu_are_one_rank() -> None:
    plan = GpuPlan.from_devices(["GPU:0"] * 4)
    assert plan.gpus == (0,)
    assert not plan.multi_gpu
    assert plan.replicas_on(0) == (0, 1, 2, 3)


def test_segments_are_runs_of_consecutive_replicas() -> None:
    plan = GpuPlan.from_devices(["GPU:0", "GPU:0", "GPU:1", "GPU:0", "GPU:1", "GPU:1"])
    assert plan.segments == (
        Segment(0, (0, 1)),
        Segment(1, (2,)),
        Segment(0, (3,)),
        Segment(1, (4, 5)),
    )
    # The segments cover every replica once, in order.
    assert [r for s in plan.segments for r in s.replicas] == list(range(6))


def test_replica_ids_past_the_last_wrap_around() -> None:
    plan = GpuPlan.from_devices(["GPU:0", "GPU:1"])
    assert [plan.gpu_of(r) for r in range(5)] == [0, 1, 0, 1, 0]


def test_describe_names_gpus_ranks_and_replicas() -> None:
    plan = GpuPlan.from_devices(["GPU:0", "GPU:1", "GPU:0"])
    assert plan.describe() == "GPU 0 (rank 0): replicas 0, 2; GPU 1 (rank 1): replica 1"


# MEAN -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("devices", "divisor"),
    [
        (["GPU:0"], 1),
        (["GPU:0", "GPU:0", "GPU:0"], 3),
        # Unequal replica counts: 3 replicas over 2 GPUs divide by 3, not by 2 GPUs
        # (NCCL_AVG) and not by one GPU's count.
        (["GPU:0", "GPU:0", "GPU:1"], 3),
        (["GPU:0", "GPU:1", "GPU:2", "GPU:2", "GPU:2"], 5),
    ],
)
def test_mean_divides_by_the_total_replica_count(devices: list[str], divisor: int) -> None:
    assert mean_divisor(GpuPlan.from_devices(devices)) == divisor


def test_mean_is_an_nccl_sum_never_nccl_avg() -> None:
    assert NCCL_OPS[ReduceOp.MEAN] == "NCCL_SUM"
    assert "NCCL_AVG" not in NCCL_OPS.values()
    assert set(NCCL_OPS) == set(ReduceOp)


def test_nccl_dtypes_name_the_numpy_dtypes_nccl_has() -> None:
    for name, constant in NCCL_DTYPES.items():
        assert np.dtype(name).name == name
        assert constant == "NCCL_" + name.upper()
    assert "int16" not in NCCL_DTYPES  # NCCL has no 16-bit integers
    assert "complex64" not in NCCL_DTYPES


# Routes -----------------------------------------------------------------------------------------

ONE_GPU = GpuPlan.from_devices(["GPU:0", "GPU:0", "GPU:0"])
TWO_SINGLE = GpuPlan.from_devices(["GPU:0", "GPU:1"])
UNEVEN = GpuPlan.from_devices(["GPU:0", "GPU:1", "GPU:0"])
THREE = GpuPlan.from_devices(["GPU:0", "GPU:1", "GPU:2"])


@pytest.mark.parametrize("op", list(ReduceOp), ids=lambda op: op.value)
@pytest.mark.parametrize("dtype", ["float32", "int64", "int16", "complex64"])
def test_one_gpu_is_always_local(op: ReduceOp, dtype: str) -> None:
    assert reduction_route(ONE_GPU, op, dtype) is Route.LOCAL
    assert reduction_route(ONE_GPU, op, dtype, exact_order=False, nccl=False) is Route.LOCAL


@pytest.mark.parametrize("plan", [TWO_SINGLE, UNEVEN, THREE], ids=["2x1", "uneven", "3x1"])
@pytest.mark.parametrize("op", list(ReduceOp), ids=lambda op: op.value)
@pytest.mark.parametrize("dtype", ["int8", "uint8", "int32", "uint32", "int64", "uint64"])
def test_integers_go_through_nccl_whatever_the_layout(
    plan: GpuPlan, op: ReduceOp, dtype: str
) -> None:
    # Integer arithmetic wraps around: any order of combining gives the fold's bits.
    assert reduction_route(plan, op, dtype) is Route.NCCL


@pytest.mark.parametrize("op", [ReduceOp.SUM, ReduceOp.MEAN, ReduceOp.PROD], ids=str)
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_float_sums_across_gpus_keep_replica_order(op: ReduceOp, dtype: str) -> None:
    # Two GPUs of one replica each: NCCL computes x0 + x1, which is the fold.
    assert reduction_route(TWO_SINGLE, op, dtype) is Route.NCCL
    # Otherwise NCCL's order is not replica order: the result travels replica by replica.
    assert reduction_route(UNEVEN, op, dtype) is Route.CHAIN
    assert reduction_route(THREE, op, dtype) is Route.CHAIN
    # ... unless the caller lets NCCL pick the order.
    assert reduction_route(UNEVEN, op, dtype, exact_order=False) is Route.NCCL
    assert reduction_route(THREE, op, dtype, exact_order=False) is Route.NCCL


@pytest.mark.parametrize("op", [ReduceOp.MIN, ReduceOp.MAX], ids=str)
def test_float_min_max_avoid_nccl_unless_order_is_free(op: ReduceOp) -> None:
    # NCCL does not promise numpy's NaN propagation.
    assert reduction_route(TWO_SINGLE, op, "float32") is Route.CHAIN
    assert reduction_route(TWO_SINGLE, op, "float32", exact_order=False) is Route.NCCL


@pytest.mark.parametrize("dtype", ["int16", "uint16", "complex64", "complex128"])
def test_dtypes_nccl_lacks_travel_by_peer_copies(dtype: str) -> None:
    assert reduction_route(TWO_SINGLE, ReduceOp.SUM, dtype) is Route.CHAIN
    assert reduction_route(THREE, ReduceOp.SUM, dtype, exact_order=False) is Route.CHAIN


def test_without_nccl_every_cross_gpu_reduction_is_a_chain() -> None:
    for op in ReduceOp:
        assert reduction_route(TWO_SINGLE, op, "int64", nccl=False) is Route.CHAIN
        assert reduction_route(THREE, op, "float32", exact_order=False, nccl=False) is Route.CHAIN


# The replica-order fold -------------------------------------------------------------------------


def _body(kernel_code: str) -> list[str]:
    """The statements inside a fold kernel's element loop."""
    lines = [line.strip() for line in kernel_code.splitlines()]
    start = next(i for i, line in enumerate(lines) if line.startswith("i < n;")) + 1
    return lines[start : lines.index("}", start)]


def test_sum_kernel_folds_left_to_right_once_per_input() -> None:
    kernel = fold_kernel_source(ReduceOp.SUM, 3, FoldMode.PLAIN, "float32")
    assert kernel.name == "asyncreplica_fold_SUM_3_plain_float32"
    assert f'extern "C" __global__ void {kernel.name}(' in kernel.code
    for k in range(3):
        assert f"const float* __restrict__ x{k}," in kernel.code
    assert "float* __restrict__ y," in kernel.code
    assert "long long n)" in kernel.code
    assert _body(kernel.code) == [
        "float acc = x0[i];",
        "acc = (float)((float)acc + (float)x1[i]);",
        "acc = (float)((float)acc + (float)x2[i]);",
        "y[i] = acc;",
    ]
    assert "#include" not in kernel.code


def test_float16_steps_compute_in_float32_and_round_like_numpy() -> None:
    kernel = fold_kernel_source(ReduceOp.SUM, 2, FoldMode.PLAIN, "float16")
    assert kernel.code.startswith("#include <cuda_fp16.h>\n")
    assert _body(kernel.code)[1] == "acc = (__half)((float)acc + (float)x1[i]);"


def test_integer_steps_wrap_in_unsigned_arithmetic() -> None:
    # A signed overflow is undefined in C++; numpy wraps around: so do the kernels.
    body = _body(fold_kernel_source(ReduceOp.PROD, 2, FoldMode.PLAIN, "int32").code)
    assert body[1] == "acc = (int)((unsigned int)acc * (unsigned int)x1[i]);"
    body = _body(fold_kernel_source(ReduceOp.SUM, 2, FoldMode.PLAIN, "int64").code)
    assert body[1] == "acc = (long long)((unsigned long long)acc + (unsigned long long)x1[i]);"
    # 16-bit operands would be promoted to (signed) int: widen to unsigned int instead.
    body = _body(fold_kernel_source(ReduceOp.PROD, 2, FoldMode.PLAIN, "uint16").code)
    assert body[1] == "acc = (unsigned short)((unsigned int)acc * (unsigned int)x1[i]);"


def test_mean_kernel_divides_the_fold_by_its_argument() -> None:
    kernel = fold_kernel_source(ReduceOp.MEAN, 2, FoldMode.MEAN, "float32")
    assert "double d," in kernel.code
    assert _body(kernel.code)[-1] == "y[i] = (float)((float)acc / (float)d);"
    # An integer MEAN divides one exact int64 sum: the only integer MEAN kernel.
    ints = fold_kernel_source(ReduceOp.MEAN, 1, FoldMode.MEAN_TO_FLOAT64, "int64")
    assert "double* __restrict__ y," in ints.code
    assert _body(ints.code)[-1] == "y[i] = (double)acc / d;"
    assert EXACT_SUM_DIVISION.out_dtype == "float64"
    assert ints.name == EXACT_SUM_DIVISION.name
    assert FoldVariant(ReduceOp.MEAN, 2, FoldMode.MEAN, "float16").out_dtype == "float16"


def test_min_max_kernels_propagate_nan_like_numpy() -> None:
    assert "(float)acc != (float)acc" in fold_kernel_source(ReduceOp.MIN, 2).code
    assert "(float)acc != (float)acc" in fold_kernel_source(ReduceOp.MAX, 2).code


def test_one_input_kernel_copies() -> None:
    assert _body(fold_kernel_source(ReduceOp.PROD, 1).code) == ["float acc = x0[i];", "y[i] = acc;"]


def test_kernel_names_are_distinct_per_variant() -> None:
    variants = every_fold_variant()
    assert len({v.name for v in variants}) == len(variants) == len(set(variants))


def test_every_variant_is_every_op_arity_mode_and_dtype() -> None:
    variants = every_fold_variant()
    floats = [d for d in FOLD_DTYPES if d.startswith("float")]
    ints = [d for d in FOLD_DTYPES if not d.startswith("float")]
    assert set(floats) == {"float16", "float32", "float64"}
    assert len(ints) == 8
    # Integers have no MEAN fold (it would wrap around), only the one exact division.
    plain = len(ReduceOp) * MAX_FOLD_ARITY * len(FOLD_DTYPES) - MAX_FOLD_ARITY * len(ints)
    assert len(variants) == plain + MAX_FOLD_ARITY * len(floats) + 1
    assert {(v.op, v.mode) for v in variants if v.mode is not FoldMode.PLAIN} == {
        (ReduceOp.MEAN, FoldMode.MEAN),
        (ReduceOp.MEAN, FoldMode.MEAN_TO_FLOAT64),
    }
    # Every kernel a fold of up to 40 inputs runs is among them.
    for count in range(1, 41):
        for dtype in floats:
            for divide in (False, True):
                assert set(fold_steps(count, ReduceOp.MEAN, dtype, divide=divide)) <= set(variants)
        for dtype in ints:
            assert set(fold_steps(count, ReduceOp.SUM, dtype, divide=False)) <= set(variants)
    assert EXACT_SUM_DIVISION in variants


def test_kernel_source_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="1 to 16 inputs"):
        fold_kernel_source(ReduceOp.SUM, 0)
    with pytest.raises(ValueError, match="1 to 16 inputs"):
        fold_kernel_source(ReduceOp.SUM, MAX_FOLD_ARITY + 1)
    with pytest.raises(ValueError, match="only MEAN divides"):
        fold_kernel_source(ReduceOp.MAX, 2, FoldMode.MEAN)
    with pytest.raises(ValueError, match="complex values use CuPy's ufuncs"):
        fold_kernel_source(ReduceOp.SUM, 2, FoldMode.PLAIN, "complex64")
    with pytest.raises(ValueError, match="written as float64"):
        fold_kernel_source(ReduceOp.MEAN, 2, FoldMode.MEAN, "int32")
    with pytest.raises(ValueError, match="summed exactly in int64 first"):
        fold_kernel_source(ReduceOp.MEAN, 2, FoldMode.MEAN_TO_FLOAT64, "int32")
    with pytest.raises(ValueError, match="keeps their dtype"):
        fold_kernel_source(ReduceOp.MEAN, 2, FoldMode.MEAN_TO_FLOAT64, "float32")


# Which kernels a collective runs (compiled before it starts) ------------------------------------


def test_fold_steps_follow_the_chunks_and_divide_last() -> None:
    assert fold_steps(3, ReduceOp.SUM, "float32", divide=False) == [
        FoldVariant(ReduceOp.SUM, 3, FoldMode.PLAIN, "float32")
    ]
    steps = fold_steps(40, ReduceOp.MEAN, "float32", divide=True)
    # 16 inputs, then the running result plus 15, then plus the last 9.
    assert [(v.arity, v.mode) for v in steps] == [
        (16, FoldMode.PLAIN),
        (16, FoldMode.PLAIN),
        (10, FoldMode.MEAN),
    ]
    # An integer MEAN: the int64 sum's folds (chunked alike), then one division.
    assert fold_steps(1, ReduceOp.MEAN, "int64", divide=True) == [EXACT_SUM_DIVISION]
    assert fold_steps(1, ReduceOp.MEAN, "float16", divide=True) == [
        FoldVariant(ReduceOp.MEAN, 1, FoldMode.MEAN, "float16")
    ]


def test_reduction_folds_per_route() -> None:
    one = GpuPlan.from_devices(["GPU:0"] * 3)
    assert reduction_folds(one, ReduceOp.MEAN, Route.LOCAL) == [Fold(0, 3, True)]
    plan = GpuPlan.from_devices(["GPU:0", "GPU:0", "GPU:1", "GPU:0", "GPU:1", "GPU:1"])
    # CHAIN: each segment folds its replicas plus the running result (after the first).
    assert reduction_folds(plan, ReduceOp.SUM, Route.CHAIN) == [
        Fold(0, 2, False),
        Fold(1, 2, False),
        Fold(0, 2, False),
        Fold(1, 3, False),
    ]
    assert reduction_folds(plan, ReduceOp.MEAN, Route.CHAIN)[-1] == Fold(1, 3, True)
    # NCCL: each GPU folds its own replicas; MEAN divides after NCCL, on every GPU.
    assert reduction_folds(plan, ReduceOp.SUM, Route.NCCL) == [Fold(0, 3, False), Fold(1, 3, False)]
    uneven = GpuPlan.from_devices(["GPU:0", "GPU:1", "GPU:1"])
    assert reduction_folds(uneven, ReduceOp.MEAN, Route.NCCL) == [
        Fold(1, 2, False),
        Fold(0, 1, True),
        Fold(1, 1, True),
    ]


def test_reduction_variants_name_each_kernel_once() -> None:
    plan = GpuPlan.from_devices(["GPU:0", "GPU:0", "GPU:1", "GPU:0", "GPU:1", "GPU:1"])
    assert reduction_variants(plan, ReduceOp.MEAN, "float32", Route.CHAIN) == {
        FoldVariant(ReduceOp.MEAN, 2, FoldMode.PLAIN, "float32"),
        FoldVariant(ReduceOp.MEAN, 3, FoldMode.MEAN, "float32"),
    }
    assert reduction_variants(plan, ReduceOp.SUM, "complex64", Route.CHAIN) == frozenset()


def _interpret(op: ReduceOp, arrays: list[np.ndarray], max_arity: int) -> np.ndarray:
    """What the chunked kernels compute, run with numpy one step at a time."""
    step = {
        ReduceOp.SUM: np.add,
        ReduceOp.MEAN: np.add,
        ReduceOp.PROD: np.multiply,
        ReduceOp.MIN: np.minimum,
        ReduceOp.MAX: np.maximum,
    }[op]
    acc: np.ndarray | None = None
    for chunk in fold_chunks(len(arrays), max_arity):
        inputs = ([] if acc is None else [acc]) + [arrays[k] for k in chunk]
        assert len(inputs) <= max_arity
        out = np.array(inputs[0], copy=True)
        for x in inputs[1:]:
            out = step(out, x)
        acc = out
    assert acc is not None
    return acc


@pytest.mark.parametrize(("count", "max_arity"), [(1, 2), (2, 2), (5, 2), (16, 16), (40, 16)])
def test_chunked_fold_is_the_replica_order_fold(count: int, max_arity: int) -> None:
    rng = np.random.default_rng(7)
    arrays = [
        np.asarray(rng.standard_normal(64) * 10.0 ** rng.integers(-3, 4, 64), np.float32)
        for _ in range(count)
    ]
    expected = np.array(arrays[0], copy=True)
    for a in arrays[1:]:
        expected = expected + a
    got = _interpret(ReduceOp.SUM, arrays, max_arity)
    assert got.tobytes() == expected.tobytes()


def test_fold_chunks_cover_every_input_once_in_order() -> None:
    assert fold_chunks(1) == [range(1)]
    assert fold_chunks(3, 2) == [range(2), range(2, 3)]
    chunks = fold_chunks(40, MAX_FOLD_ARITY)
    assert [i for c in chunks for i in c] == list(range(40))
    assert len(chunks[0]) == MAX_FOLD_ARITY
    assert all(len(c) <= MAX_FOLD_ARITY - 1 for c in chunks[1:])
    with pytest.raises(ValueError, match="at least one input"):
        fold_chunks(0)
    with pytest.raises(ValueError, match="at least 2"):
        fold_chunks(3, 1)


# Waiting for the GPU without blocking the loop --------------------------------------------------


def test_poll_schedule_spins_then_backs_off_to_a_cap() -> None:
    schedule = PollSchedule(spin_seconds=0.002, first_sleep_seconds=0.0001, max_sleep_seconds=0.001)
    assert schedule.next_delay(0.0, 0.0) == 0.0
    assert schedule.next_delay(0.0019, 0.0) == 0.0
    delays = []
    delay = 0.0
    for _ in range(6):
        delay = schedule.next_delay(0.003, delay)
        delays.append(delay)
    assert delays == [0.0001, 0.0002, 0.0004, 0.0008, 0.001, 0.001]


class _Event:
    """A CUDA event stand-in that is done after ``polls`` queries."""

    def __init__(self, polls: int) -> None:
        self.polls = polls
        self.queries = 0

    @property
    def done(self) -> bool:
        self.queries += 1
        return self.queries > self.polls


def test_wait_for_events_polls_with_the_schedule_until_all_are_done() -> None:
    events = [_Event(2), _Event(5)]
    now = [0.0]
    sleeps: list[float] = []

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        now[0] += 0.001  # each poll takes a millisecond of the fake clock

    schedule = PollSchedule(spin_seconds=0.0025, first_sleep_seconds=0.0001, max_sleep_seconds=1)
    anyio.run(lambda: wait_for_events(events, schedule=schedule, clock=lambda: now[0], sleep=sleep))
    assert all(e.queries > e.polls for e in events)
    # Spins (sleep(0)) for 2.5 ms of the clock, then sleeps 0.1 ms, 0.2 ms, ...
    assert sleeps == [0.0, 0.0, 0.0, 0.0001, 0.0002]
    assert events[0].queries == 3  # a done event is not queried again


def test_wait_for_events_returns_at_once_when_done() -> None:
    async def sleep(seconds: float) -> None:
        raise AssertionError("slept although every event was done")

    anyio.run(lambda: wait_for_events([_Event(0)], sleep=sleep))


@pytest.mark.anyio
async def test_wait_for_events_lets_other_tasks_run(anyio_backend: object) -> None:
    ran: list[int] = []
    event = _Event(3)

    async def other() -> None:
        ran.append(len(ran))

    async with anyio.create_task_group() as tg:
        tg.start_soon(wait_for_events, [event])
        tg.start_soon(other)
    assert ran == [0]
    assert event.queries == 4
