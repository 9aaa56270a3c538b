"""The fold kernels' arithmetic, run on the CPU: compiled as C++ with g++, checked against numpy.

The kernels are plain CUDA C++ (``_plan.fold_kernel_source``); with ``__global__`` defined
away and one thread in one block, their loop is ordinary C++. This checks, bit for bit
and without a GPU, that each step rounds and wraps as numpy's ufuncs do: integer
overflow wraps around, MIN and MAX propagate NaN, MEAN divides as numpy divides.
float16 needs CUDA's ``cuda_fp16.h``, which compiles only under NVRTC or nvcc: its
kernels are compiled by ``scripts/gpu_precheck.sh`` and run by the GPU tests.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from asyncreplica_cupy._plan import (
    EXACT_SUM_DIVISION,
    FOLD_DTYPES,
    FoldMode,
    FoldVariant,
    fold_kernel_source,
    fold_steps,
    integer_mean_dtype,
)

from asyncreplica.abc import ReduceOp

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")

_PRELUDE = """
#define __global__
struct asyncreplica_dim { unsigned int x; };
static const asyncreplica_dim blockIdx = {0}, threadIdx = {0}, blockDim = {1}, gridDim = {1};
"""

DTYPES = [d for d in FOLD_DTYPES if d != "float16"]
ARITY = 3


def _variants() -> list[FoldVariant]:
    out = []
    for dtype in DTYPES:
        if dtype.startswith("float"):
            out += [FoldVariant(op, ARITY, FoldMode.PLAIN, dtype) for op in ReduceOp]
            out += [FoldVariant(ReduceOp.MEAN, k, FoldMode.MEAN, dtype) for k in (1, ARITY)]
        else:  # an integer MEAN is never folded in its dtype: see test_integer_mean_*
            ops = [op for op in ReduceOp if op is not ReduceOp.MEAN]
            out += [FoldVariant(op, ARITY, FoldMode.PLAIN, dtype) for op in ops]
    out.append(EXACT_SUM_DIVISION)
    return out


@pytest.fixture(scope="module")
def library(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    folder = tmp_path_factory.mktemp("fold_kernels")
    source = folder / "kernels.cpp"
    codes = [fold_kernel_source(v.op, v.arity, v.mode, v.dtype).code for v in _variants()]
    source.write_text(_PRELUDE + "\n".join(codes))
    built = folder / "kernels.so"
    subprocess.run(
        ["g++", "-std=c++17", "-O1", "-shared", "-fPIC", str(source), "-o", str(built)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return ctypes.CDLL(str(Path(built)))


def _inputs(dtype: str, op: ReduceOp, count: int) -> list[np.ndarray[Any, Any]]:
    rng = np.random.default_rng(zlib.crc32(f"{dtype} {op.value}".encode()))
    dt = np.dtype(dtype)
    n = 257
    if dt.kind == "f":
        arrays = [
            (rng.standard_normal(n) * 10.0 ** rng.integers(-3, 4, n)).astype(dt)
            for _ in range(count)
        ]
        if op in (ReduceOp.MIN, ReduceOp.MAX):  # NaN in either place, and signed zeros
            arrays[0][:4] = [np.nan, 1.0, 0.0, -0.0]
            arrays[-1][:4] = [2.0, np.nan, -0.0, 0.0]
        return arrays
    info = np.iinfo(dt)
    # Values near the limits: sums and products overflow and must wrap like numpy's.
    return [rng.integers(info.min, info.max, n, dtype=dt, endpoint=True) for _ in range(count)]


def _numpy_fold(variant: FoldVariant, arrays: list[np.ndarray[Any, Any]]) -> np.ndarray[Any, Any]:
    step = {
        ReduceOp.SUM: np.add,
        ReduceOp.MEAN: np.add,
        ReduceOp.PROD: np.multiply,
        ReduceOp.MIN: np.minimum,
        ReduceOp.MAX: np.maximum,
    }[variant.op]
    acc = arrays[0].copy()
    with np.errstate(over="ignore", invalid="ignore"):
        for x in arrays[1:]:
            acc = step(acc, x)
        if variant.mode is FoldMode.MEAN:
            return acc / acc.dtype.type(len(arrays))
        if variant.mode is FoldMode.MEAN_TO_FLOAT64:
            return acc.astype(np.float64) / np.float64(len(arrays))
    return acc


@pytest.mark.parametrize("variant", _variants(), ids=lambda v: v.name)
def test_kernel_computes_what_numpy_computes(library: ctypes.CDLL, variant: FoldVariant) -> None:
    arrays = _inputs(variant.dtype, variant.op, variant.arity)
    out = np.empty(arrays[0].shape, variant.out_dtype)
    args: list[Any] = [a.ctypes.data_as(ctypes.c_void_p) for a in [*arrays, out]]
    if variant.mode is not FoldMode.PLAIN:
        # As the backend passes it: the divisor rounded to the dtype, as a double.
        dtype = np.dtype(variant.dtype)
        divisor = dtype.type(variant.arity) if dtype.kind == "f" else variant.arity
        args.append(ctypes.c_double(float(divisor)))
    args.append(ctypes.c_longlong(out.size))
    getattr(library, variant.name)(*args)
    expected = _numpy_fold(variant, arrays)
    assert out.dtype == expected.dtype
    assert np.array_equal(out, expected, equal_nan=True)
    assert (np.signbit(out) == np.signbit(expected)).all()  # -0.0 and 0.0 as numpy picks them


# An integer MEAN: never summed in its own dtype ------------------------------------------------


@pytest.mark.parametrize("dtype", [d for d in DTYPES if not d.startswith("float")])
@pytest.mark.parametrize("arity", [1, 2, ARITY])
def test_integer_mean_is_never_folded_in_its_dtype(dtype: str, arity: int) -> None:
    """A fold of integers in their dtype wraps (int8 3 * 127 is 125): it cannot be made."""
    for mode in (FoldMode.PLAIN, FoldMode.MEAN_TO_FLOAT64):
        if (arity, dtype, mode) == (1, "int64", FoldMode.MEAN_TO_FLOAT64):
            continue  # EXACT_SUM_DIVISION: one exact int64 sum divided
        with pytest.raises(ValueError, match="summed exactly in int64 first"):
            FoldVariant(ReduceOp.MEAN, arity, mode, dtype)
    if arity > 1 or dtype != "int64":
        with pytest.raises(ValueError, match="summed exactly in int64 first"):
            fold_steps(arity, ReduceOp.MEAN, dtype, divide=True)


def test_integer_mean_is_summed_in_int64_only_where_that_is_exact() -> None:
    assert integer_mean_dtype("int8", 3) == "int64"
    assert integer_mean_dtype("uint32", (1 << 20) - 1) == "int64"
    assert integer_mean_dtype("uint32", 1 << 20) is None  # the sum may reach 2**52
    assert integer_mean_dtype("int64", 2) is None  # 64-bit sums may need more bits
    assert integer_mean_dtype("uint64", 1) is None


def test_the_division_of_an_exact_sum_is_the_hosts_mean(library: ctypes.CDLL) -> None:
    """Widened sums of the limits, divided: the bits of the numpy backend's exact MEAN."""
    from asyncreplica_numpy._backend import _mean_of_ints

    for dtype in [d for d in DTYPES if not d.startswith("float")]:
        if integer_mean_dtype(dtype, 3) is None:
            continue
        arrays = _inputs(dtype, ReduceOp.MEAN, 3)
        total = sum(a.astype(np.int64) for a in arrays)
        out = np.empty(total.shape, np.float64)
        args = [total.ctypes.data_as(ctypes.c_void_p), out.ctypes.data_as(ctypes.c_void_p)]
        getattr(library, EXACT_SUM_DIVISION.name)(
            *args, ctypes.c_double(3.0), ctypes.c_longlong(out.size)
        )
        expected = _mean_of_ints(arrays)
        assert np.array_equal(out, expected), dtype
