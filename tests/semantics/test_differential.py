"""Every path held to the reference semantics, bit for bit (asyncreplica.testing._reference).

Seeded random programs: a replica count, a reduce op, a dtype, a batch of leaves (0-d,
empty and special values included: NaN, +-inf, -0.0, the integer extremes), a
``bytes_per_pack``. Each program runs through every path that reduces or gathers:

* ``ctx.all_reduce`` of each leaf alone and of the whole batch (packed by
  ``bytes_per_pack``), with the numpy backend's C pass when it is compiled and without,
  and with the large-value thresholds lowered so that small leaves take the pooled,
  blocked and worker-thread paths;
* ``Strategy.reduce`` (``axis=None`` and along an axis), ``extended.reduce_to`` to one
  device and to every replica, ``extended.batch_reduce_to`` of the whole batch, and the
  last two inside a ``merge_call``'s merge_fn;
* ``ctx.all_gather``, ``ctx.reduce_scatter``, ``ctx.broadcast``, ``Strategy.gather``;

on asyncio, uvloop and trio. Results must have the reference's dtype, shape and bytes
(so NaN payloads and the sign of zero count), and errors the same class and fields.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import numpy as np
import pytest

import asyncreplica as ar
from asyncreplica.testing import _reference as ref

backend_module = pytest.importorskip("asyncreplica_numpy._backend")

try:
    import ml_dtypes

    BFLOAT16: list[Any] = [np.dtype(ml_dtypes.bfloat16)]
except ImportError:  # pragma: no cover
    BFLOAT16 = []

DTYPES = [
    np.dtype(d)
    for d in (
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "float16",
        "float32",
        "float64",
        "complex64",
        "complex128",
    )
] + BFLOAT16
OPS = list(ar.ReduceOp)
SHAPES = [(), (0,), (1,), (3,), (2, 3), (4,), (2, 0)]
PACKS = [0, 1, 8, 24, 1 << 20]
LOOPS = [
    pytest.param(("asyncio", {}), id="asyncio"),
    pytest.param(("asyncio", {"use_uvloop": True}), id="uvloop"),
    pytest.param(("trio", {}), id="trio"),
]
CASES = 60
# NaN and infinities make numpy warn ("invalid value encountered"); the values are the test.
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


# A quiet NaN with a payload in its high mantissa bits (kept by float32 and float16 too).
_PAYLOAD_NAN = float(np.array(0x7FFC_0000_0000_0000, np.uint64).view(np.float64))


def special(dtype: np.dtype[Any]) -> list[Any]:
    """Values that paths have got wrong: extremes, NaN, infinities, signed zeros."""
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return [info.min, info.max, 0, 1, info.max - 1, info.min + 1]
    specials = [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.5, 3.25, 1e30, -1e-30]
    # NaNs of both signs and with payloads (attack 23c, D2: paths chose different ones).
    specials += [-np.nan, _PAYLOAD_NAN, -_PAYLOAD_NAN]
    if dtype.kind == "c":
        return [complex(a, b) for a in specials[:6] + specials[-3:] for b in specials[:6]]
    return specials


def draw_leaf(
    rng: random.Random, dtype: np.dtype[Any], shape: tuple[int, ...], nans: bool = False
) -> np.ndarray:
    size = int(np.prod(shape))
    pool = special(dtype)
    if nans and dtype.kind in "fcV":
        # Mostly NaNs of both signs and payloads, so that replicas' NaNs meet.
        pool = [v for v in pool if v != v] + [1.0]
    values: list[Any] = []
    for _ in range(size):
        if rng.random() < (0.9 if nans else 0.4):
            values.append(rng.choice(pool))
        elif dtype.kind in "iu":
            info = np.iinfo(dtype)
            values.append(rng.randint(int(info.min), int(info.max)))
        elif dtype.kind == "c":
            values.append(complex(rng.uniform(-9, 9), rng.uniform(-9, 9)))
        else:
            values.append(rng.uniform(-9, 9))
    with np.errstate(all="ignore"):
        return np.array(values, dtype=dtype).reshape(shape)


def _swapped(array: np.ndarray) -> np.ndarray:
    """``array``'s values in the other byte order (``'>f8'`` on a little-endian machine)."""
    return array.astype(array.dtype.newbyteorder("S"))


def _native(got: Any) -> np.ndarray:
    """A non-reduction's result in native byte order (its order is not a rule's)."""
    array = np.asarray(got)
    return array.astype(array.dtype.newbyteorder("="))


class Program:
    """One generated program: n replicas' batches of leaves of one dtype."""

    def __init__(self, seed: int) -> None:
        rng = random.Random(seed)
        self.seed = seed
        self.n = rng.choice([1, 2, 3, 3, 4])
        self.op = rng.choice(OPS)
        self.dtype = rng.choice(DTYPES)
        m = rng.choice([1, 2, 3, 5])
        self.shapes = [rng.choice(SHAPES) for _ in range(m)]
        if rng.random() < 0.5:  # one shape for every leaf: the batch path's rows
            self.shapes = [self.shapes[0]] * m
        self.bytes_per_pack = rng.choice(PACKS)
        self.nans = rng.random() < 0.15
        self.values = [
            [draw_leaf(rng, self.dtype, shape, self.nans) for shape in self.shapes]
            for _ in range(self.n)
        ]
        # The reference's inputs; the library's are byte-swapped in some programs (every
        # leaf, or every other one): a result's dtype is the rule's, native, on every path.
        self.native = self.values
        self.swapped = ""
        if self.dtype.itemsize > 1 and self.dtype.isbuiltin == 1 and rng.random() < 0.3:
            self.swapped = rng.choice(["all", "some"])
            self.values = [
                [
                    _swapped(v) if self.swapped == "all" or j % 2 == 0 else v
                    for j, v in enumerate(row)
                ]
                for row in self.native
            ]
        ranked = [j for j, s in enumerate(self.shapes) if s]
        self.gather_leaf = rng.choice(ranked) if ranked else None
        self.axis = (
            None if self.gather_leaf is None else rng.randrange(len(self.shapes[self.gather_leaf]))
        )

    def __repr__(self) -> str:
        return (
            f"Program(seed={self.seed}: n={self.n} {self.op.value} {self.dtype} "
            f"shapes={self.shapes} bytes_per_pack={self.bytes_per_pack}"
            f"{' NaNs' if self.nans else ''}"
            f"{' byte-swapped: ' + self.swapped if self.swapped else ''})"
        )


def _nan_mask(array: np.ndarray) -> np.ndarray:
    if array.dtype.kind in "iu":
        return np.zeros(array.shape, bool)
    with np.errstate(all="ignore"):
        return np.isnan(array.astype(np.complex128) if array.dtype.kind == "c" else array)


def assert_same(got: Any, want: np.ndarray, where: str, *, strict: bool = False) -> None:
    """Same dtype, shape and bits (signed zeros and infinities included).

    A NaN must be a NaN, of either sign and any payload: the documented rule
    (docs/concepts.md), against the reference and between the library's own paths
    alike. IEEE 754 leaves open which operand's NaN an operation returns, and numpy's
    loops pick differently by array length (``[nan] + [-nan]`` alone and the same
    element in a pack of four: attack 23c, D2), so no path can promise more without a
    pass over every result. ``strict`` (every path of the library against the
    library's own single-leaf result) only names the comparison in messages.
    """
    got = np.asarray(got)
    assert got.dtype == want.dtype, f"{where}: dtype {got.dtype}, reference {want.dtype}"
    assert got.shape == want.shape, f"{where}: shape {got.shape}, reference {want.shape}"
    nans = _nan_mask(want)
    assert (_nan_mask(got) == nans).all(), (
        f"{where}: {got!r} != {'path' if strict else 'reference'} {want!r}"
    )
    if nans.any():
        got, want = got[~nans], want[~nans]
    assert got.tobytes() == want.tobytes(), (
        f"{where}: {got!r} != {'path' if strict else 'reference'} {want!r}"
    )


def run_program(program: Program, loop: tuple[str, dict[str, Any]], cpass: bool) -> None:
    n, op = program.n, program.op
    options = ar.CommunicationOptions(bytes_per_pack=program.bytes_per_pack)
    strategy = ar.MirroredStrategy([f"CPU:{i}" for i in range(n)], communication_options=options)
    if not cpass:
        strategy.backend._cpass = None  # type: ignore[attr-defined]
    values = program.values
    native = program.native
    m = len(program.shapes)
    want = ref.all_reduce(op, native)

    async def step(leaves: list[np.ndarray]) -> Any:
        ctx = ar.get_replica_context()
        assert ctx is not None
        alone = [await ctx.all_reduce(op, leaf) for leaf in leaves]
        batch = await ctx.all_reduce(op, leaves)
        out: dict[str, Any] = {"alone": alone, "batch": batch}
        if program.gather_leaf is not None:
            leaf = leaves[program.gather_leaf]
            out["gather"] = await ctx.all_gather(leaf, program.axis)
            if leaf.shape[0] % n == 0 and leaf.shape[0]:
                out["scatter"] = await ctx.reduce_scatter(op, leaf, 0)
        out["broadcast"] = await ctx.broadcast(leaves, source=n - 1)

        async def merge_fn(strategy: ar.Strategy, per: Any) -> Any:
            # The cross-replica APIs inside a merge_fn, on the replicas' leaves.
            every = await strategy.extended.batch_reduce_to(
                op, [(leaf, leaf) for leaf in per], options
            )
            one = await strategy.extended.reduce_to(op, per, "CPU:0")
            return every, one

        out["merge"] = await ctx.merge_call(merge_fn, args=(leaves,))
        return out

    async def main() -> None:
        with anyio.fail_after(60):  # hang guard
            per = ar.PerReplica([list(v) for v in values])
            result = await strategy.run(step, args=(per,))
            rows = strategy.experimental_local_results(result)
            mine = [np.asarray(x) for x in rows[0]["alone"]]  # every path: these bits exactly
            for r, row in enumerate(rows):
                for j in range(m):
                    assert_same(row["alone"][j], want[j], f"replica {r} leaf {j} alone")
                    assert_same(row["alone"][j], mine[j], f"replica {r} leaf {j}", strict=True)
                    assert_same(
                        row["batch"][j], mine[j], f"replica {r} leaf {j} in the batch", strict=True
                    )
                    assert_same(
                        _native(row["broadcast"][j]), native[-1][j], f"replica {r} broadcast"
                    )
                every, one = row["merge"]
                for j in range(m):
                    where = f"replica {r} leaf {j} in a merge_fn"
                    if n == 1:  # a merge_fn's arguments at one replica are plain values
                        plain = ref.reduce_plain(native[0][j])
                        assert_same(every[j], plain, f"{where} (batch_reduce_to)", strict=True)
                        assert_same(one[j], plain, f"{where} (reduce_to)", strict=True)
                        continue
                    # merge_call hands each replica its own component of a Mirrored.
                    assert_same(every[j], mine[j], f"{where} (batch_reduce_to)", strict=True)
                    assert_same(one[j], mine[j], f"{where} (reduce_to)", strict=True)
                if "gather" in row:
                    g = ref.all_gather([[v[program.gather_leaf]] for v in native], program.axis)[0]
                    assert_same(_native(row["gather"]), g, f"replica {r} all_gather")
                if "scatter" in row:
                    chunks = ref.reduce_scatter(op, [[v[program.gather_leaf]] for v in native], 0)
                    assert_same(row["scatter"], chunks[r][0], f"replica {r} reduce_scatter")
            leaves = [ar.PerReplica([values[r][j] for r in range(n)]) for j in range(m)]
            for j, leaf in enumerate(leaves):
                reduced = await strategy.reduce(op, leaf, axis=None)
                assert_same(reduced, want[j], f"reduce {j}")
                assert_same(reduced, mine[j], f"reduce {j}", strict=True)
                one = await strategy.extended.reduce_to(op, leaf, "CPU:0")
                assert_same(one, mine[j], f"reduce_to {j}", strict=True)
                if n > 1:
                    every = await strategy.extended.reduce_to(op, leaf, leaf)
                    for r, component in enumerate(strategy.experimental_local_results(every)):
                        where = f"reduce_to mirrored {j} replica {r}"
                        assert_same(component, mine[j], where, strict=True)
                rank = len(program.shapes[j])
                comps = [native[r][j] for r in range(n)]
                if op in (ar.ReduceOp.MIN, ar.ReduceOp.MAX) and not comps[0].size:
                    continue  # numpy and TensorFlow refuse the MIN of nothing
                # The last axis, and every axis (a 0-d result: complex PROD, attack 23c D3).
                for axis in dict.fromkeys([(rank - 1,), tuple(range(rank))]) if rank else ():
                    assert_same(
                        await strategy.reduce(op, leaf, axis=axis),
                        ref.reduce(op, comps, axis),
                        f"reduce {j} axis={axis}",
                    )
            batch = await strategy.extended.batch_reduce_to(
                op, [(leaf, "CPU:0") for leaf in leaves], options
            )
            for j in range(m):
                assert_same(batch[j], mine[j], f"batch_reduce_to {j}", strict=True)
            if program.gather_leaf is not None:
                leaf = leaves[program.gather_leaf]
                gathered = await strategy.gather(leaf, program.axis)
                comps = [native[r][program.gather_leaf] for r in range(n)]
                assert_same(_native(gathered), ref.gather(comps, program.axis), "Strategy.gather")

    anyio.run(main, backend=loop[0], backend_options=loop[1])


def cpass_modes() -> Iterator[Any]:
    yield pytest.param(False, id="interpreted")
    if backend_module._CPASS is not None:
        yield pytest.param(True, id="cpass")


@pytest.fixture(params=[False, True], ids=["sizes", "tiny-thresholds"])
def thresholds(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Lowered thresholds send small leaves down the pooled, blocked and threaded paths."""
    if request.param:
        monkeypatch.setattr(backend_module, "POOL_BYTES", 16)
        monkeypatch.setattr(backend_module, "OFFLOAD_BYTES", 48)
        monkeypatch.setattr(backend_module, "BLOCK_BYTES", 16)


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize("cpass", list(cpass_modes()))
@pytest.mark.usefixtures("thresholds")
def test_every_path_matches_the_reference(loop: tuple[str, dict[str, Any]], cpass: bool) -> None:
    offset = {"asyncio": 0, "trio": 1}[loop[0]] + 2 * bool(loop[1])
    for seed in range(offset * 1000, offset * 1000 + CASES):
        program = Program(seed)
        try:
            run_program(program, loop, cpass)
        except AssertionError as error:
            raise AssertionError(f"{program}: {error}") from None


def mismatched(seed: int) -> tuple[Program, int, np.dtype[Any]]:
    program = next(p for p in map(Program, range(seed, seed + 1000, 7)) if p.n > 1)
    rng = random.Random(seed)
    other = rng.choice([d for d in DTYPES if d != program.dtype])
    return program, rng.randrange(program.n), other


@pytest.mark.parametrize("seed", [0, 100, 200, 300, 400, 500])
@pytest.mark.parametrize(
    "api",
    ["all_reduce", "all_gather", "reduce", "reduce_to", "batch_reduce_to", "gather"],
)
def test_a_dtype_mismatch_raises_the_same_error_on_every_path(seed: int, api: str) -> None:
    """One replica's leaf of another dtype: CollectiveMismatchError naming the field."""
    program, odd, other = mismatched(seed)
    values = [list(v) for v in program.values]
    values[odd] = [leaf.astype(other) for leaf in values[odd]]
    specs = [(values[r][0].shape, values[r][0].dtype.name) for r in range(program.n)]
    fields = ref.mismatch_fields(specs)
    strategy = ar.MirroredStrategy([f"CPU:{i}" for i in range(program.n)])
    leaf = ar.PerReplica([values[r][0] for r in range(program.n)])
    op = program.op

    async def step(x: Any) -> Any:
        ctx = ar.get_replica_context()
        assert ctx is not None
        if api == "all_gather":
            return await ctx.all_gather(x, 0)
        return await ctx.all_reduce(op, x)

    calls: dict[str, Callable[[], Any]] = {
        "all_reduce": lambda: strategy.run(step, args=(leaf,)),
        "all_gather": lambda: strategy.run(step, args=(leaf,)),
        "reduce": lambda: strategy.reduce(op, leaf, axis=None),
        "reduce_to": lambda: strategy.extended.reduce_to(op, leaf, "CPU:0"),
        "batch_reduce_to": lambda: strategy.extended.batch_reduce_to(op, [(leaf, leaf)]),
        "gather": lambda: strategy.gather(leaf, 0),
    }
    if api in ("all_gather", "gather") and not program.shapes[0]:
        pytest.skip("a scalar cannot be gathered")

    async def main() -> None:
        with anyio.fail_after(30):
            await calls[api]()

    with pytest.raises(ar.CollectiveMismatchError) as info:
        anyio.run(main)
    assert info.value.fields == fields


INDEX_DTYPES = [np.dtype(d) for d in ("int64", "int32", "uint64", "uint8")]
# Row numbers of a dense value of 2**64 - 1 rows: near and above int64, where indices of
# different dtypes are combined (an index of 2**63 or more is refused on every path).
HUGE_INDICES = [0, 7, 2**62, 2**63 - 1, 2**63, 2**63 + 1, 2**64 - 1]


def draw_indices(rng: random.Random, rows: int, huge: bool) -> np.ndarray:
    """One replica's row numbers, of an index dtype drawn per replica."""
    if huge:
        picks = [rng.choice(HUGE_INDICES) for _ in range(rows)]
        wide = "uint64" if any(p >= 2**63 for p in picks) else rng.choice(["int64", "uint64"])
        return np.array(picks, wide)
    return np.array([rng.randrange(5) for _ in range(rows)], rng.choice(INDEX_DTYPES))


def draw_slices(
    rng: random.Random, dtype: np.dtype[Any], n: int, huge: bool = False
) -> list[ar.IndexedSlices]:
    """Each replica's IndexedSlices of ``dtype``: 0 to 3 rows of width 2, of (2**k)-ish values.

    ``huge``: of a dense value of 2**64 - 1 rows, indices near and above int64.
    """
    out = []
    for _ in range(n):
        rows = rng.randrange(4)
        values = draw_leaf(rng, dtype, (rows, 2))
        if dtype.kind in "iu" and values.size:
            # Near the ends of 64-bit ranges and around 2**53 (where float64 rounds).
            info = np.iinfo(dtype)
            edges = [int(info.max), int(info.min), 2**53 + 1, -(2**53) - 1, 2**62 + 1]
            edges = [e for e in edges if info.min <= e <= info.max]
            flat = values.reshape(-1)
            for k in range(flat.size):
                if rng.random() < 0.5:
                    flat[k] = rng.choice(edges)
        indices = draw_indices(rng, rows, huge)
        out.append(ar.IndexedSlices(values, indices, (2**64 - 1 if huge else 5, 2)))
    return out


def check_slices(seed: int, loop: tuple[str, dict[str, Any]]) -> None:
    """One generated IndexedSlices program on every reduce path."""
    rng = random.Random(seed)
    n = rng.choice([1, 2, 3, 4])
    op = rng.choice([ar.ReduceOp.SUM, ar.ReduceOp.MEAN])
    dtype = rng.choice([np.dtype(d) for d in ("int64", "uint64", "int32", "int8", "float64")])
    huge = rng.random() < 0.3
    slices = draw_slices(rng, dtype, n, huge)
    want = ref.slices_values(op, [s.values for s in slices])
    try:
        want_indices = ref.slices_indices([s.indices for s in slices], slices[0].dense_shape[0])
    except ValueError:
        want_indices = None  # refused, on every path
    where = f"seed {seed}: n={n} {op.value} {dtype} indices {[s.indices for s in slices]}"
    strategy = ar.MirroredStrategy([f"CPU:{i}" for i in range(n)])

    async def step(x: ar.IndexedSlices) -> Any:
        ctx = ar.get_replica_context()
        assert ctx is not None
        return await ctx.all_reduce(op, x)

    per = ar.PerReplica(slices)

    async def run_step() -> Any:
        return strategy.experimental_local_results(await strategy.run(step, args=(per,)))

    async def batch() -> Any:
        return (await strategy.extended.batch_reduce_to(op, [(per, "CPU:0")]))[0]

    paths: dict[str, Callable[[], Any]] = {
        "all_reduce": run_step,
        "reduce": lambda: strategy.reduce(op, per, axis=None),
        "reduce_to": lambda: strategy.extended.reduce_to(op, per, "CPU:0"),
        "batch_reduce_to": batch,
    }

    async def main() -> list[tuple[str, Any]]:
        got: list[tuple[str, Any]] = []
        with anyio.fail_after(60):  # hang guard
            for name, call in paths.items():
                try:
                    result = await call()
                except ValueError as error:
                    got.append((name, error))
                    continue
                if name == "all_reduce":
                    got += [(f"all_reduce replica {r}", x) for r, x in enumerate(result)]
                else:
                    got.append((name, result))
        return got

    for path, result in anyio.run(main, backend=loop[0], backend_options=loop[1]):
        if want_indices is None:
            assert isinstance(result, ValueError), f"{where} {path}: not refused: {result!r}"
            assert "0 <= i < 2**63" in str(result), f"{where} {path}: {result}"
            continue
        assert not isinstance(result, ValueError), f"{where} {path}: {result}"
        if n == 1 and not isinstance(result, ar.IndexedSlices):
            continue  # a single replica's all_reduce may hand the value back as is
        assert isinstance(result, ar.IndexedSlices), f"{where} {path}: {result!r}"
        assert_same(result.values, want, f"{where} {path}", strict=True)
        assert_same(result.indices, want_indices, f"{where} {path} indices", strict=True)


@pytest.mark.parametrize("loop", LOOPS)
def test_indexed_slices_on_every_path_match_the_reference(loop: tuple[str, dict[str, Any]]) -> None:
    """all_reduce, Strategy.reduce, reduce_to and batch_reduce_to of IndexedSlices."""
    for seed in range(60):
        check_slices(seed, loop)


def draw_numbers(rng: random.Random, n: int) -> list[Any]:
    """Each replica's Python number, of one kind: near int32's and float32's limits too."""
    kind = rng.choice(["int", "float", "complex"])
    if kind == "int":
        pool = [0, 1, -1, 2**31 - 1, -(2**31), 2**40, 2**53 + 1, 2**62]
        return [rng.choice(pool) if rng.random() < 0.6 else rng.randint(-99, 99) for _ in range(n)]
    if kind == "float":
        pool = [0.1, 0.2, 16777217.0, -0.0, 1e300, 2.5]
        return [rng.choice(pool) if rng.random() < 0.6 else rng.uniform(-9, 9) for _ in range(n)]
    return [complex(rng.uniform(-9, 9), rng.choice([0.1, 16777217.0])) for _ in range(n)]


def check_numbers(seed: int, loop: tuple[str, dict[str, Any]]) -> None:
    """A PerReplica of Python numbers through every reduce API: one rule, one result kind.

    Distributed Python numbers are a collective's values, as numpy describes them
    (int64, float64, complex128); the result is a 0-d array on every path.
    """
    rng = random.Random(seed)
    n = rng.choice([1, 2, 3, 4])
    op = rng.choice(OPS)
    numbers = draw_numbers(rng, n)
    want = ref.combine(op, [np.asarray(x) for x in numbers])
    where = f"seed {seed}: n={n} {op.value} {numbers}"
    strategy = ar.MirroredStrategy([f"CPU:{i}" for i in range(n)])

    async def step(x: Any) -> Any:
        ctx = ar.get_replica_context()
        assert ctx is not None
        return await ctx.all_reduce(op, x)

    async def main() -> list[tuple[str, Any]]:
        with anyio.fail_after(60):  # hang guard
            per = ar.PerReplica(list(numbers))
            got: list[tuple[str, Any]] = [
                ("reduce", await strategy.reduce(op, per, axis=None)),
                ("reduce_to", await strategy.extended.reduce_to(op, per, "CPU:0")),
                (
                    "batch_reduce_to",
                    (await strategy.extended.batch_reduce_to(op, [(per, "CPU:0")]))[0],
                ),
            ]
            if n > 1:
                results = await strategy.run(step, args=(per,))
                got += [
                    (f"all_reduce replica {r}", x)
                    for r, x in enumerate(strategy.experimental_local_results(results))
                ]
            return got

    for path, result in anyio.run(main, backend=loop[0], backend_options=loop[1]):
        assert type(result) is np.ndarray, f"{where} {path}: {result!r} is not a 0-d array"
        assert_same(result, want, f"{where} {path}", strict=True)


@pytest.mark.parametrize("loop", LOOPS)
def test_per_replica_python_numbers_on_every_path_match_the_reference(
    loop: tuple[str, dict[str, Any]],
) -> None:
    for seed in range(60):
        check_numbers(seed, loop)
