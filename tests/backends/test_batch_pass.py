"""The C single pass over a batch (``_cpass``) against the pure-Python pass, in one process.

The numpy backend describes, checks, packs and views a batched all_reduce's leaves with the
compiled ``asyncreplica_numpy._cpass`` when the build made it, and with the pure-Python code
otherwise (or with ``ASYNCREPLICA_NO_EXTENSIONS=1``). Both are imported here explicitly and
must give the same specs, the same result bits and the same errors for every batch: plain
ones, and ones with an odd leaf (another type, dtype or byte order, shape, a non-contiguous
leaf, a Python number) at a random position of a random replica.
"""

from __future__ import annotations

import random
from typing import Any

import anyio
import numpy as np
import pytest
from asyncreplica_numpy import NumpyBackend, _backend

from asyncreplica.abc import LeafSpec, ReduceOp

cpass = pytest.importorskip(
    "asyncreplica_numpy._cpass", reason="the C pass was not compiled by this build"
)

OPS = [ReduceOp.SUM, ReduceOp.MEAN, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.PROD]
DTYPES = [
    "<f4",
    ">f4",
    "<f8",
    ">f8",
    "<f2",
    "<c8",
    ">c16",
    "<i1",
    "<i2",
    ">i4",
    "<u4",
    "<i8",
    "<u8",
]
SHAPE_SETS: dict[str, list[tuple[int, ...]]] = {
    "1-d": [(16,)],
    "2-d": [(3, 4)],
    "0-d": [()],
    "empty": [(0,)],
    "mixed": [(5,), (2, 3), (), (0,), (7,), (1, 1, 2)],
}


def _leaf(rng: np.random.Generator, dtype: str, shape: tuple[int, ...]) -> Any:
    dt = np.dtype(dtype)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return rng.integers(info.min, info.max, shape, dtype=dt.newbyteorder("=")).astype(dt)
    return (rng.standard_normal(shape) * 3).astype(dt)


def _odd(rng: random.Random, leaf: Any) -> tuple[str, Any]:
    """Another leaf in place of ``leaf``: what the ledger may or may not have let through."""
    kinds = ["byte order", "dtype", "shape", "not contiguous", "Python number", "numpy scalar"]
    kinds += ["list", "string", "subclass", "bool"]
    kind = rng.choice(kinds)
    if kind == "byte order":
        return kind, leaf.astype(leaf.dtype.newbyteorder())
    if kind == "dtype":
        other = {"f": np.int32, "c": np.complex64 if leaf.dtype.itemsize > 8 else np.complex128}
        return kind, leaf.astype(other.get(leaf.dtype.kind, np.float64))
    if kind == "shape":
        return kind, np.zeros((*leaf.shape, 1), leaf.dtype)
    if kind == "not contiguous":
        return kind, np.repeat(leaf.reshape(-1), 2)[::2].reshape(leaf.shape)
    if kind == "Python number":
        return kind, 1.5
    if kind == "numpy scalar":
        return kind, leaf.dtype.type(3)
    if kind == "list":
        return kind, leaf.tolist()
    if kind == "string":
        return kind, "gradient"
    if kind == "subclass":
        return kind, leaf.view(np.ma.MaskedArray)
    return kind, leaf.astype(bool)


def _case(seed: int) -> tuple[ReduceOp, list[list[Any]], int, bool, str]:
    """A generated batch: op, each replica's leaves, bytes_per_pack, describe?, a label."""
    pick = random.Random(seed)
    rng = np.random.default_rng(seed)
    op = pick.choice(OPS)
    dtype = pick.choice(DTYPES)
    shapes_name = pick.choice(list(SHAPE_SETS))
    base = SHAPE_SETS[shapes_name]
    m = pick.randint(2, 40)
    shapes = [base[j % len(base)] for j in range(m)]
    n = pick.randint(1, 5)
    values = [[_leaf(rng, dtype, s) for s in shapes] for _ in range(n)]
    label = f"{op.value} {dtype} {shapes_name} {n}x{m}"
    if pick.random() < 0.6:
        r, j = pick.randrange(n), pick.randrange(m)
        kind, values[r][j] = _odd(pick, values[r][j])
        label += f", replica {r} leaf {j}: {kind}"
    return op, values, pick.choice([0, 0, 64, 1000]), pick.random() < 0.7, label


def _outcome(
    backend: NumpyBackend, op: ReduceOp, values: list[list[Any]], bpp: int, describe: bool
) -> Any:
    """What describing and reducing gives: specs and result bits, or the error raised."""
    specs: list[tuple[LeafSpec, ...] | str] = []
    if describe:
        for row in values:
            try:
                specs.append(backend.describe_leaves(row))
            except Exception as error:  # compared with the other pass's
                specs.append(f"{type(error).__name__}: {error}")

    async def main() -> list[list[object]]:
        return await backend.all_reduce(op, values, bytes_per_pack=bpp)

    try:
        results = anyio.run(main)
    except Exception as error:
        return specs, f"{type(error).__name__}: {error}"
    bits = []
    for row in results:
        for leaf in row:
            assert isinstance(leaf, np.ndarray)
            assert not leaf.flags.writeable
            bits.append((type(leaf), leaf.dtype.str, leaf.shape, leaf.tobytes()))
    assert len({id(leaf) for row in results for leaf in row}) == sum(map(len, results))
    return specs, bits


def _backend_with(implementation: Any, n: int) -> NumpyBackend:
    backend = NumpyBackend([f"CPU:{r}" for r in range(n)])
    backend._cpass = implementation
    return backend


@pytest.mark.parametrize("block", range(8))
def test_the_c_pass_and_the_python_pass_agree_bit_for_bit_and_error_for_error(block: int) -> None:
    for seed in range(block * 40, block * 40 + 40):
        op, values, bpp, describe, label = _case(seed)
        copies = [[v.copy() if isinstance(v, np.ndarray) else v for v in row] for row in values]
        with np.errstate(all="ignore"):  # overflow in PROD of random integers: the same bits
            c = _outcome(_backend_with(cpass, len(values)), op, values, bpp, describe)
            python = _outcome(_backend_with(None, len(values)), op, copies, bpp, describe)
        assert c == python, f"seed {seed}: {label}"


def test_plain_batches_take_the_c_pass() -> None:
    """Where the Python pass packs a batch, the C pass does too (not the general path)."""
    for seed in range(200):
        op, values, bpp, _, label = _case(seed)
        with np.errstate(all="ignore"):
            python = _backend._reduce_batch(op, values, bpp, _backend.io.BytesIO(), {})
            c = _backend._reduce_batch_c(cpass, op, values, bpp, [np.empty(0, np.uint8)], {})
        assert (c is None) == (python is None) or "not contiguous" in label or "shape" in label, (
            f"seed {seed}: {label}"
        )
        if c is not None and python is not None:
            assert [[a.tobytes() for a in row] for row in c] == [  # type: ignore[union-attr]
                [a.tobytes() for a in row]  # type: ignore[union-attr]
                for row in python
            ], f"seed {seed}: {label}"


def test_pack_copies_checked_leaves_or_refuses() -> None:
    dtype = np.dtype("<f4")
    leaves = [np.arange(4, dtype=dtype) + k for k in range(3)]
    out = np.zeros(12, dtype)
    assert cpass.pack(leaves, 0, 3, dtype, (4,), out) == 48
    np.testing.assert_array_equal(out, np.concatenate(leaves))
    assert cpass.pack(leaves, 1, 3, dtype, [(4,)] * 3, out) == 32
    np.testing.assert_array_equal(out[:8], np.concatenate(leaves[1:]))
    refused = {
        "another type": [*leaves[:2], leaves[2].view(np.ma.MaskedArray)],
        "a number": [*leaves[:2], 1.0],
        "byte order": [*leaves[:2], leaves[2].astype(">f4")],
        "dtype": [*leaves[:2], leaves[2].astype(np.float64)],
        "shape": [*leaves[:2], leaves[2].reshape(2, 2)],
        "not contiguous": [*leaves[:2], np.arange(8, dtype=dtype)[::2]],
    }
    for what, row in refused.items():
        assert cpass.pack(row, 0, 3, dtype, (4,), out) == -1, what
        assert cpass.pack(row, 0, 3, dtype, [(4,)] * 3, out) == -1, what
    assert cpass.pack(leaves, 0, 3, dtype, (4,), np.zeros(11, dtype)) == -1  # does not fit
    with pytest.raises(ValueError, match="writable"):
        cpass.pack(leaves, 0, 3, dtype, (4,), np.zeros(12, dtype)[::-1])


def test_views_are_each_replicas_own_and_can_never_be_made_writable() -> None:
    flat = np.arange(10, dtype=np.float64)
    views = cpass.views(flat, 3, [(2, 2), (), (0,), (5,)], 0, 4)
    assert [[v.shape for v in row] for row in views] == [[(2, 2), (), (0,), (5,)]] * 3
    assert len({id(v) for row in views for v in row}) == 12
    owner = views[0][0].base
    assert not isinstance(owner, np.ndarray)  # no array of the chain owns the memory
    for row in views:
        np.testing.assert_array_equal(row[0].ravel(), flat[:4])
        np.testing.assert_array_equal(row[3], flat[5:])
        for view in row:
            assert view.base is owner
            assert not view.flags.writeable
            with pytest.raises(ValueError, match="WRITEABLE"):
                view.flags.writeable = True
    tail = cpass.views(flat, 2, [(2, 2), (), (0,), (5,)], 2, 4)
    assert [[v.shape for v in row] for row in tail] == [[(0,), (5,)]] * 2
    with pytest.raises(ValueError, match="do not fit"):
        cpass.views(flat, 2, (4,), 0, 3)


def test_describe_gives_the_python_pass_specs_or_none() -> None:
    backend = NumpyBackend(["CPU:0"])
    row = [np.zeros(3, np.float32), np.zeros((2, 2), np.float32)]
    expected = tuple(map(backend.describe, row))  # fills the spec cache
    found = cpass.describe(row, _backend._specs_by_dtype)
    assert found is not None
    assert found[0] == expected
    assert all(a is b for a, b in zip(found[0], expected, strict=True))
    assert (found[1], found[2]) == (np.dtype(np.float32), [(3,), (2, 2)])
    same = cpass.describe([row[0]] * 3, _backend._specs_by_dtype)
    assert same is not None
    assert same[2] == (3,)
    assert cpass.describe([], _backend._specs_by_dtype) is None
    assert cpass.describe([row[0], 1.0], _backend._specs_by_dtype) is None
    assert cpass.describe([row[0], row[0].astype(">f4")], _backend._specs_by_dtype) is None
    assert cpass.describe([np.zeros(7, np.int16)] * 2, {}) is None  # no spec seen yet
