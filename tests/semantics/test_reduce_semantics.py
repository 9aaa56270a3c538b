"""The defects of issues 23 and 25 where one rule had several copies, one test each.

Each failed before the fix: strategy.reduce's own MEAN, uint64 MEAN, complex PROD
rounding by path, masked arrays, inputs changed in flight, components of different
dtypes, IndexedSlices through the cross-replica APIs, bfloat16, Python numbers at N = 1.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import numpy as np
import pytest

import asyncreplica as ar
from asyncreplica.testing import _reference as ref

ml_dtypes = pytest.importorskip("ml_dtypes")


def strategy(n: int) -> ar.MirroredStrategy:
    return ar.MirroredStrategy([f"CPU:{i}" for i in range(n)])


def run(fn: Callable[[], Awaitable[Any]]) -> Any:
    async def main() -> Any:
        with anyio.fail_after(30):  # hang guard
            return await fn()

    return anyio.run(main)


def replicas(s: ar.MirroredStrategy, step: Callable[..., Any], *args: Any) -> tuple[Any, ...]:
    return s.experimental_local_results(run(lambda: s.run(step, args=args)))


async def mean(x: Any) -> Any:
    ctx = ar.get_replica_context()
    assert ctx is not None
    return await ctx.all_reduce("MEAN", x)


def test_every_integer_mean_api_is_exact() -> None:
    """strategy.reduce(MEAN) of int64 went through float64 first: ...496, not ...497."""
    s = strategy(2)
    value = ar.PerReplica([np.int64(1), np.int64(2**53 + 1)])
    want = (1 + 2**53 + 1) / 2  # Python's int / int rounds once: 4503599627370497.0
    assert run(lambda: s.reduce("MEAN", value)) == want
    assert run(lambda: s.extended.reduce_to("MEAN", value, "CPU:0")) == want
    assert run(lambda: s.extended.batch_reduce_to("MEAN", [(value, "CPU:0")]))[0] == want
    assert [float(x) for x in replicas(s, mean, value)] == [want, want]
    assert run(lambda: s.reduce("MEAN", value)).dtype == np.float64


def test_uint64_mean_of_ordinary_values() -> None:
    """all_reduce("MEAN", np.uint64(3)) raised numpy's UFuncTypeError."""
    s = strategy(2)
    got = replicas(s, mean, np.uint64(3))
    assert [np.asarray(g).dtype for g in got] == [np.float64] * 2
    assert [float(g) for g in got] == [3.0, 3.0]
    assert float(run(lambda: s.reduce("MEAN", ar.PerReplica([np.uint64(3)] * 2)))) == 3.0


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("dtype", [np.complex64, np.complex128])
def test_complex_prod_has_the_same_bits_on_every_path(n: int, dtype: type) -> None:
    """A leaf alone, in a batch, packed by any bytes_per_pack: one set of bits."""
    rng = np.random.default_rng(7)
    leaves = [
        (rng.standard_normal(64) + 1j * rng.standard_normal(64)).astype(dtype) for _ in range(n)
    ]
    want = ref.combine(ar.ReduceOp.PROD, leaves)
    for bytes_per_pack in (0, 1, 100):
        s = ar.MirroredStrategy(
            [f"CPU:{i}" for i in range(n)],
            communication_options=ar.CommunicationOptions(bytes_per_pack=bytes_per_pack),
        )

        async def step(x: Any) -> Any:
            ctx = ar.get_replica_context()
            assert ctx is not None
            alone = [await ctx.all_reduce("PROD", x[k : k + 1]) for k in range(len(x))]
            batch = await ctx.all_reduce("PROD", [x[k : k + 1] for k in range(len(x))])
            return np.concatenate(alone), np.concatenate(batch), await ctx.all_reduce("PROD", x)

        for alone, batch, whole in replicas(s, step, ar.PerReplica(leaves)):
            assert alone.tobytes() == want.tobytes()
            assert batch.tobytes() == want.tobytes()
            assert whole.tobytes() == want.tobytes()
        reduced = run(lambda s=s: s.reduce("PROD", ar.PerReplica([a[:1] for a in leaves])))
        assert reduced.tobytes() == want[:1].tobytes()


MASKED = np.ma.array([1.0, 1000.0], mask=[False, True])


@pytest.mark.parametrize(
    "call",
    ["all_reduce", "batch", "all_gather", "broadcast", "reduce", "reduce_to", "gather"],
)
def test_masked_arrays_are_refused_on_every_path(call: str) -> None:
    """The mask was dropped and the masked-out 1000.0 summed."""
    s = strategy(2)
    value = ar.PerReplica([MASKED, MASKED])

    async def step(x: Any) -> Any:
        ctx = ar.get_replica_context()
        assert ctx is not None
        if call == "all_reduce":
            return await ctx.all_reduce("SUM", x)
        if call == "batch":
            return await ctx.all_reduce("SUM", [np.ones(2), x])
        if call == "all_gather":
            return await ctx.all_gather(x, 0)
        return await ctx.broadcast(x)

    calls: dict[str, Callable[[], Awaitable[Any]]] = {
        "reduce": lambda: s.reduce("SUM", value),
        "reduce_to": lambda: s.extended.reduce_to("SUM", value, "CPU:0"),
        "gather": lambda: s.gather(value, 0),
    }
    with pytest.raises(TypeError, match="masked array"):
        run(calls.get(call) or (lambda: s.run(step, args=(value,))))


def test_an_in_place_reshape_in_flight_is_refused() -> None:
    """Every signature said (2,), and every replica got a (1, 2) result."""
    s = strategy(2)

    async def step() -> Any:
        ctx = ar.get_replica_context()
        assert ctx is not None
        buf = np.ones(2)
        pending = ctx.all_reduce("SUM", buf)
        buf.shape = (1, 2)
        return await pending

    with pytest.raises(ValueError, match=r"changed while its all_reduce\(SUM\).*in flight"):
        run(lambda: s.run(step))


@pytest.mark.parametrize("cpass", [False, True], ids=["interpreted", "cpass"])
def test_a_batch_reshaped_in_flight_never_gives_a_shape_no_signature_said(cpass: bool) -> None:
    """Refused where the backend looks at the leaves; else reduced in the issued shapes."""
    from asyncreplica_numpy import _backend

    if cpass and _backend._CPASS is None:
        pytest.skip(f"the C pass is not compiled here: {_backend.batch_pass()}")
    s = strategy(2)
    if not cpass:
        s.backend._cpass = None  # type: ignore[attr-defined]

    async def step() -> Any:
        ctx = ar.get_replica_context()
        assert ctx is not None
        batch = [np.ones(2), np.full(2, 2.0)]
        pending = ctx.all_reduce("SUM", batch)
        batch[1].shape = (1, 2)
        return await pending

    try:
        got = s.experimental_local_results(run(lambda: s.run(step)))
    except ValueError as error:
        assert "changed while its all_reduce was in flight" in str(error)  # noqa: PT017
    else:
        for first, second in got:
            assert first.shape == second.shape == (2,)
            np.testing.assert_array_equal(second, [4.0, 4.0])


def test_inputs_are_read_when_the_last_replica_arrives() -> None:
    """The documented rule (docs/concepts.md): a write in flight is what is reduced."""
    s = strategy(2)

    async def step() -> Any:
        ctx = ar.get_replica_context()
        assert ctx is not None
        buf = np.full(2, 1.0)
        pending = ctx.all_reduce("SUM", buf)
        buf[:] = 100.0
        return await pending

    for got in s.experimental_local_results(run(lambda: s.run(step))):
        np.testing.assert_array_equal(got, [200.0, 200.0])


@pytest.mark.parametrize(
    ("a", "b"), [(np.float32, np.float64), (np.int32, np.int64)], ids=["float", "int"]
)
@pytest.mark.parametrize("api", ["reduce", "reduce_to", "batch_reduce_to", "gather"])
def test_components_of_different_dtypes_raise_as_all_reduce_does(
    a: type, b: type, api: str
) -> None:
    """strategy.reduce/gather silently promoted float32 + float64 to float64."""
    s = strategy(2)
    value = ar.PerReplica([np.ones(2, a), np.ones(2, b)])
    calls: dict[str, Callable[[], Awaitable[Any]]] = {
        "reduce": lambda: s.reduce("SUM", value),
        "reduce_to": lambda: s.extended.reduce_to("SUM", value, "CPU:0"),
        "batch_reduce_to": lambda: s.extended.batch_reduce_to("SUM", [(value, value)]),
        "gather": lambda: s.gather(value, 0),
    }
    with pytest.raises(ar.CollectiveMismatchError) as info:
        run(calls[api])
    assert info.value.fields == ("dtype",)
    assert f"replica 0 holds {np.dtype(a).name}; replica 1 holds {np.dtype(b).name}" in str(
        info.value
    )


def slices(r: int) -> ar.IndexedSlices:
    return ar.IndexedSlices(np.full((1, 2), r + 1.0), np.array([2 * r]), (4, 2))


SPARSE = ar.PerReplica([slices(0), slices(1)])


def assert_slices(got: Any, values: list[list[float]], indices: list[int]) -> None:
    assert isinstance(got, ar.IndexedSlices)
    np.testing.assert_array_equal(got.values, values)
    np.testing.assert_array_equal(got.indices, indices)
    assert tuple(got.dense_shape) == (4, 2)


def test_indexed_slices_through_every_cross_replica_reduction() -> None:
    """TF concatenates the slices (MEAN scales the values); here TypeError was raised."""
    s = strategy(2)
    assert_slices(run(lambda: s.reduce("SUM", SPARSE)), [[1, 1], [2, 2]], [0, 2])
    assert_slices(run(lambda: s.reduce("MEAN", SPARSE)), [[0.5, 0.5], [1, 1]], [0, 2])
    assert_slices(
        run(lambda: s.extended.reduce_to("SUM", SPARSE, "CPU:0")), [[1, 1], [2, 2]], [0, 2]
    )
    mirrored = run(lambda: s.extended.reduce_to("SUM", SPARSE, SPARSE))
    assert isinstance(mirrored, ar.Mirrored)
    for component in s.experimental_local_results(mirrored):
        assert_slices(component, [[1, 1], [2, 2]], [0, 2])
    (batch,) = run(lambda: s.extended.batch_reduce_to("MEAN", [(SPARSE, "CPU:0")]))
    assert_slices(batch, [[0.5, 0.5], [1, 1]], [0, 2])


def test_gather_of_indexed_slices_densifies_and_concatenates() -> None:
    s = strategy(2)
    got = run(lambda: s.gather(SPARSE, 0))
    want = np.zeros((8, 2))
    want[0] = 1.0
    want[4 + 2] = 2.0
    np.testing.assert_array_equal(got, want)


def test_bfloat16_reduces_and_gathers_in_bfloat16() -> None:
    """bfloat16 was refused everywhere; TF computes and returns bfloat16."""
    bf16 = np.dtype(ml_dtypes.bfloat16)
    s = strategy(2)
    value = ar.PerReplica([np.array([1.0, 2.5], bf16), np.array([3.0, 0.5], bf16)])

    async def step(x: Any) -> Any:
        ctx = ar.get_replica_context()
        assert ctx is not None
        return (
            await ctx.all_reduce("SUM", x),
            await ctx.all_reduce("MEAN", [x, x]),
            await ctx.all_gather(x, 0),
        )

    for total, (m1, m2), gathered in replicas(s, step, value):
        assert total.dtype == m1.dtype == m2.dtype == gathered.dtype == bf16
        np.testing.assert_array_equal(total.astype(np.float32), [4.0, 3.0])
        np.testing.assert_array_equal(m1.astype(np.float32), [2.0, 1.5])
        assert gathered.shape == (4,)
    for op, want in (("SUM", [4.0, 3.0]), ("MEAN", [2.0, 1.5])):
        got = run(lambda op=op: s.reduce(op, value))
        assert got.dtype == bf16
        np.testing.assert_array_equal(got.astype(np.float32), want)
    assert run(lambda: s.gather(value, 0)).dtype == bf16


def test_python_numbers_reduce_to_tensorflow_dtypes_at_one_replica() -> None:
    """reduce("SUM", 2.5) at N = 1 returned a Python float; TF a float32 tensor."""
    s = strategy(1)
    for value, dtype in ((2.5, np.float32), (2, np.int32), (2**40, np.int64)):
        for got in (
            run(lambda v=value: s.reduce("SUM", v)),
            run(lambda v=value: s.extended.reduce_to("SUM", v, "CPU:0")),
        ):
            assert type(got) is dtype
            assert got == value


def test_components_sparse_on_some_replicas_only_raise_naming_sparsity() -> None:
    s = strategy(2)
    value = ar.PerReplica([slices(0), np.ones((4, 2))])
    with pytest.raises(ar.CollectiveMismatchError) as info:
        run(lambda: s.reduce("SUM", value))
    assert info.value.fields == ("sparsity",)
    message = str(info.value)
    assert "replica 0 holds IndexedSlices of float64; replica 1 holds float64" in message
    assert "Pass IndexedSlices on every replica or dense values on every replica." in message


# -- Strategy.reduce: the order in which ``axis`` names the axes is not part of it ---------


@pytest.mark.parametrize("op", ["sum", "mean", "prod", "min", "max"])
@pytest.mark.parametrize("dtype", ["float32", "float64", "complex64", "complex128", "int64"])
def test_the_order_of_reduce_axes_never_changes_the_bits(op: str, dtype: str) -> None:
    """attack 23h, finding 3: complex PROD over ``(1, 0)`` rounded unlike ``(0, 1)``."""
    rng = np.random.default_rng(3)
    s = strategy(2)

    def component() -> np.ndarray:
        raw = rng.standard_normal((3, 4, 2)) + 1j * rng.standard_normal((3, 4, 2))
        if np.dtype(dtype).kind != "c":
            raw = raw.real * (10 if dtype == "int64" else 1)
        return np.asarray(raw).astype(dtype)

    comps = (component(), component())
    for axes in [(0, 1), (0, 2), (1, 2), (0, 1, 2)]:
        want = ref.reduce(ar.ReduceOp(op.upper()), list(comps), axes)
        for spelled in {axes, axes[::-1], tuple(a - 3 for a in axes[::-1])}:
            got = run(lambda spelled=spelled: s.reduce(op, ar.PerReplica(comps), axis=spelled))
            assert got.dtype == want.dtype, (axes, spelled)
            assert got.tobytes() == want.tobytes(), (op, dtype, axes, spelled)
