"""PyTorch CPU tensors through the numpy backend, end to end.

Tensors in, tensors out (type, dtype, device), in nests; what is zero-copy (the inputs)
and what is not (each replica's results: a writable copy of its own, since torch has no
read-only tensors); tensors the backend refuses (``requires_grad``, bfloat16, conjugate
views) with a ``TypeError`` that names the replica and the leaf.

torch is not in ``[test]`` (its default wheel brings the CUDA libraries): the module is
skipped where it is not installed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import numpy as np
import pytest
from asyncreplica_numpy import NumpyBackend
from asyncreplica_numpy._foreign import library_of, to_host

import asyncreplica as ar
from asyncreplica.abc import LeafSpec, ReduceOp

torch = pytest.importorskip(
    "torch", reason="torch is not installed (too heavy for CI; pip install torch to run these)"
)

DEVICES = ["CPU:0", "CPU:1", "CPU:2"]
N = len(DEVICES)


def _run(step: Callable[..., Any], *args: Any) -> tuple[Any, ...]:
    """Each replica's result of ``step``."""
    strategy = ar.MirroredStrategy(DEVICES)

    async def main() -> Any:
        return await strategy.run(step, args=args)

    return strategy.experimental_local_results(anyio.run(main))


def _all_reduce(values: list[Any], op: str = "sum") -> tuple[Any, ...]:
    async def step(x: Any) -> Any:
        return await ar.get_replica_context().all_reduce(op, x)

    return _run(step, ar.PerReplica(values))


def _inputs(dtype: Any = None, shape: tuple[int, ...] = (6,)) -> list[Any]:
    dtype = dtype or torch.float32
    size = int(np.prod(shape))
    return [(torch.arange(size) + r).reshape(shape).to(dtype) for r in range(N)]


def _is_tensor_like(result: Any, dtype: Any, shape: tuple[int, ...]) -> None:
    assert type(result) is torch.Tensor, type(result)
    assert result.dtype == dtype
    assert result.device == torch.device("cpu")
    assert tuple(result.shape) == shape
    assert not result.requires_grad


# tensors in, tensors out ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "dtype",
    ["float16", "float32", "float64", "int8", "uint8", "int32", "int64", "complex64"],
)
def test_all_reduce_keeps_type_dtype_and_device(dtype: str) -> None:
    kind = getattr(torch, dtype)
    inputs = _inputs(kind)
    out = _all_reduce(inputs)
    # The oracle: the numpy backend on the same values as numpy arrays.
    parts = [[t.numpy()] for t in inputs]
    expected = anyio.run(NumpyBackend(DEVICES).all_reduce, ReduceOp.SUM, parts)[0][0]
    for result in out:
        _is_tensor_like(result, kind, (6,))
        np.testing.assert_array_equal(result.numpy(), expected, strict=True)


def test_nests_of_tensors_keep_their_structure() -> None:
    async def step(x: Any) -> Any:
        ctx = ar.get_replica_context()
        value = {"w": x, "rest": [x.double(), (x.int(), 2.0)]}
        return await ctx.all_reduce("sum", value)

    out = _run(step, ar.PerReplica(_inputs()))
    total = sum(np.arange(6) + r for r in range(N))
    for result in out:
        assert list(result) == ["w", "rest"]
        _is_tensor_like(result["w"], torch.float32, (6,))
        _is_tensor_like(result["rest"][0], torch.float64, (6,))
        _is_tensor_like(result["rest"][1][0], torch.int32, (6,))
        assert result["rest"][1][1] == 2.0 * N
        for leaf in (result["w"], result["rest"][0], result["rest"][1][0]):
            np.testing.assert_array_equal(leaf.numpy(), total)


def test_mean_of_integer_tensors_is_a_float64_tensor() -> None:
    out = _all_reduce(_inputs(torch.int32), "mean")
    for result in out:
        _is_tensor_like(result, torch.float64, (6,))
        np.testing.assert_array_equal(result.numpy(), np.arange(6) + 1.0)


def test_the_signature_names_the_tensor_type() -> None:
    spec = NumpyBackend(["CPU:0"]).describe(torch.zeros(2, 3, dtype=torch.float16))
    assert spec == LeafSpec((2, 3), "float16", array_type="torch.Tensor")
    assert str(spec) == "torch.Tensor(float16[2,3])"


# non-contiguous tensors -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "view",
    [
        pytest.param(lambda t: t.reshape(3, 4).t(), id="transposed"),
        pytest.param(lambda t: t[::2], id="strided"),
        pytest.param(lambda t: t.reshape(3, 4)[:, 1:3], id="sliced"),
    ],
)
def test_non_contiguous_tensors_are_read_in_place(view: Callable[[Any], Any]) -> None:
    bases = [torch.arange(12, dtype=torch.float32) * (r + 1) for r in range(N)]
    inputs = [view(b) for b in bases]
    assert not inputs[0].is_contiguous()
    # In: the backend's numpy view reads the tensor's own memory, strides and all.
    library = library_of(inputs[0])
    assert library is not None
    held = to_host(inputs[0], library)
    assert held.ctypes.data == inputs[0].data_ptr()
    assert held.strides == tuple(s * 4 for s in inputs[0].stride())
    out = _all_reduce(inputs)
    expected = sum(t.numpy() for t in inputs)
    for result in out:
        _is_tensor_like(result, torch.float32, tuple(inputs[0].shape))
        np.testing.assert_array_equal(result.numpy(), expected)


# zero-copy in, writable copies out ------------------------------------------------------------


def test_inputs_are_zero_copy() -> None:
    x = torch.arange(256, dtype=torch.float32)
    library = library_of(x)
    assert library is not None
    assert library.name == "torch.Tensor"
    assert to_host(x, library).ctypes.data == x.data_ptr()


def test_each_replica_gets_its_own_writable_result() -> None:
    # torch has no read-only tensors, and its from_dlpack imports the backend's shared,
    # read-only result as a writable tensor: the replicas would write into each other's
    # results. Each replica gets a copy of its own instead.
    inputs = _inputs()
    out = _all_reduce(inputs)
    pointers = {t.data_ptr() for t in out}
    assert len(pointers) == N
    assert not pointers & {t.data_ptr() for t in inputs}
    out[0].mul_(0)  # in place, as torch.nn.utils.clip_grad_norm_ does to gradients
    expected = sum(np.arange(6, dtype=np.float32) + r for r in range(N))
    for result in out[1:]:
        np.testing.assert_array_equal(result.numpy(), expected)
    for r, x in enumerate(inputs):
        np.testing.assert_array_equal(x.numpy(), np.arange(6, dtype=np.float32) + r)


def test_broadcast_results_do_not_alias_the_source() -> None:
    source = torch.arange(4, dtype=torch.float32)

    async def step(x: Any) -> Any:
        return await ar.get_replica_context().broadcast(x, source=0)

    out = _run(step, ar.PerReplica([source, torch.zeros(4), torch.zeros(4)]))
    assert source.data_ptr() not in {t.data_ptr() for t in out}
    for result in out:
        result.add_(100)
    np.testing.assert_array_equal(source.numpy(), np.arange(4, dtype=np.float32))
    np.testing.assert_array_equal(out[1].numpy(), np.arange(4, dtype=np.float32) + 100)


def test_gathered_results_are_writable_copies_too() -> None:
    async def step(x: Any) -> Any:
        return await ar.get_replica_context().all_gather(x, axis=0)

    out = _run(step, ar.PerReplica(_inputs(shape=(1, 2))))
    assert len({t.data_ptr() for t in out}) == N
    out[2][0, 0] = -1
    assert out[0][0, 0].item() == 0.0


# tensors the backend refuses ------------------------------------------------------------------


def test_a_tensor_that_requires_grad_is_refused() -> None:
    # Collectives are not differentiable: quietly detaching would cut the autograd graph
    # without a word, so the tensor is refused with what to do.
    async def step() -> Any:
        ctx = ar.get_replica_context()
        w = torch.ones(3, requires_grad=ctx.replica_id_in_sync_group == 1)
        return await ctx.all_reduce("sum", {"grads": [torch.ones(2), w]})

    with pytest.raises(TypeError) as info:
        _run(step)
    message = str(info.value)
    assert "replica 1 passed value['grads'][1] of type torch.Tensor" in message
    assert "requires grad" in message
    assert "not differentiable" in message
    assert "x.detach()" in message


def test_a_detached_tensor_is_reduced() -> None:
    async def step() -> Any:
        w = torch.ones(3, requires_grad=True)
        return await ar.get_replica_context().all_reduce("sum", w.detach())

    for result in _run(step):
        _is_tensor_like(result, torch.float32, (3,))
        np.testing.assert_array_equal(result.numpy(), np.full(3, N, np.float32))


@pytest.mark.parametrize("dtype", ["bfloat16", "float8_e4m3fn"])
def test_a_dtype_numpy_has_not_is_a_clear_type_error(dtype: str) -> None:
    async def step() -> Any:
        return await ar.get_replica_context().all_reduce(
            "sum", torch.ones(3, dtype=getattr(torch, dtype))
        )

    with pytest.raises(TypeError) as info:
        _run(step)
    message = str(info.value)
    assert "passed value of type torch.Tensor" in message
    assert f"its dtype torch.{dtype} has no numpy equivalent" in message
    assert "cast it first, e.g. x.float()" in message


def test_a_conjugate_view_is_a_type_error_with_torchs_advice() -> None:
    async def step() -> Any:
        x = torch.ones(3, dtype=torch.complex64).conj()
        return await ar.get_replica_context().all_reduce("sum", x)

    with pytest.raises(
        TypeError, match=r"replica \d passed value of type torch\.Tensor.*resolve_conj"
    ):
        _run(step)


# mismatched array types -----------------------------------------------------------------------


@pytest.mark.parametrize("other", ["numpy", "jax"])
def test_tensors_and_other_arrays_are_a_mismatch(other: str) -> None:
    if other == "jax":
        jnp = pytest.importorskip("jax.numpy", reason="jax missing (pip install 'jax[cpu]')")
        make: Callable[[], Any] = lambda: jnp.ones(3, jnp.float32)  # noqa: E731
        name = "jax.Array"
    else:
        make = lambda: np.ones(3, np.float32)  # noqa: E731
        name = "numpy.ndarray"

    async def step() -> Any:
        ctx = ar.get_replica_context()
        value = make() if ctx.replica_id_in_sync_group == 2 else torch.ones(3)
        return await ctx.all_reduce("sum", value)

    with pytest.raises(ar.CollectiveMismatchError) as info:
        _run(step)
    message = str(info.value)
    assert "array type differs" in message
    assert "torch.Tensor" in message
    assert name in message
    assert "replicas 0, 1 passed torch.Tensor; replica 2 passed" in message
