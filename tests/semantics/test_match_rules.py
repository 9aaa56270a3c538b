"""Every row of ``_core._match.RULES`` is tested, and each test fails without its row.

The cases are generated from RULES: for each row, a pair of signatures that differ in
that field only, and (where the public API can make one) a pair of two-replica
programs that differ in it; the mismatch error must name the field. A row without a
case fails :func:`test_every_row_has_a_case`. The meta-tests take each row out of the
table (monkeypatch) and check that its tests then fail: deleting a row can no longer
leave the suite green.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import numpy as np
import pytest

import asyncreplica as ar
from asyncreplica._core import _match
from asyncreplica._core._nest import flatten
from asyncreplica._core._signature import CollectiveKind, LeafSpec, ReduceOp, Signature

SUM = ReduceOp.SUM
LEAF = LeafSpec((2,), "float32")
BASE = Signature(CollectiveKind.ALL_REDUCE, op=SUM, structure=flatten([0])[1], leaves=(LEAF,))


def _code_a() -> None: ...


def _code_b() -> None: ...


# For each row: two signatures that differ in that field only.
SIGNATURES: dict[str, tuple[Signature, Signature]] = {
    "kind": (
        Signature(CollectiveKind.ALL_REDUCE, op=SUM),
        Signature(CollectiveKind.REDUCE_SCATTER, op=SUM),
    ),
    "reduce op": (BASE, BASE._replace(op=ReduceOp.MAX)),
    "axis": (
        Signature(CollectiveKind.ALL_GATHER, axis=0, leaves=(LeafSpec((2, 2), "float32"),)),
        Signature(CollectiveKind.ALL_GATHER, axis=1, leaves=(LeafSpec((2, 2), "float32"),)),
    ),
    "source": (
        Signature(CollectiveKind.BROADCAST, source=0, leaves=(LEAF,)),
        Signature(CollectiveKind.BROADCAST, source=1, leaves=(LEAF,)),
    ),
    "merge_fn": (
        Signature(CollectiveKind.MERGE_CALL, merge_fn=_code_a.__code__),
        Signature(CollectiveKind.MERGE_CALL, merge_fn=_code_b.__code__),
    ),
    "name": (BASE._replace(name="a"), BASE._replace(name="b")),
    "structure": (BASE, BASE._replace(structure=flatten((0,))[1])),
    "array type": (BASE, BASE._replace(leaves=(LEAF._replace(array_type="jax.Array"),))),
    "sparsity": (BASE, BASE._replace(leaves=(LEAF._replace(sparse=True),))),
    "dtype": (BASE, BASE._replace(leaves=(LEAF._replace(dtype="float64"),))),
    "shape": (BASE, BASE._replace(leaves=(LEAF._replace(shape=(3,)),))),
}


def _x(r: int) -> np.ndarray:
    return np.ones(2, np.float32)


async def _merge_a(strategy: Any) -> None: ...


async def _merge_b(strategy: Any) -> None: ...


def _foreign(r: int) -> Any:
    import array_api_strict as xp

    return np.ones(2, np.float32) if r == 0 else xp.ones(2, dtype=xp.float32)


# For each row the API can reach alone: what replica r does (a pair differing in it).
# "name" cannot be reached: a name is part of the collective's key, so differently
# named collectives never meet at one position (that is a deadlock, not a mismatch).
Step = Callable[[Any, int], Awaitable[Any]]
PROGRAMS: dict[str, Step] = {
    "kind": lambda ctx, r: (
        ctx.all_gather(np.ones(2), 0) if r == 0 else ctx.reduce_scatter("SUM", np.ones(2), 0)
    ),
    "reduce op": lambda ctx, r: ctx.all_reduce("SUM" if r == 0 else "MAX", _x(r)),
    # Square values: gathered along either axis they have the same shapes.
    "axis": lambda ctx, r: ctx.all_gather(np.ones((2, 2)), axis=r),
    "source": lambda ctx, r: ctx.broadcast(_x(r), source=r),
    "merge_fn": lambda ctx, r: ctx.merge_call(_merge_a if r == 0 else _merge_b),
    "structure": lambda ctx, r: ctx.all_reduce("SUM", [_x(r)] if r == 0 else (_x(r),)),
    "array type": lambda ctx, r: ctx.all_reduce("SUM", _foreign(r)),
    "sparsity": lambda ctx, r: ctx.all_reduce(
        "SUM",
        ar.IndexedSlices(np.ones((1, 2)), np.array([0]), (2, 2)) if r == 0 else np.ones((2, 2)),
    ),
    "dtype": lambda ctx, r: ctx.all_reduce("SUM", np.ones(2, np.float32 if r == 0 else np.float64)),
    "shape": lambda ctx, r: ctx.all_reduce("SUM", np.ones(2 + r)),
}
ROWS = [name for name, _ in _match.RULES]


def check_signatures(row: str) -> None:
    """The row's pair of signatures differs in that field, and only there is it caught."""
    a, b = SIGNATURES[row]
    fields = _match.differing_fields(a, b, check_call_sites=False)
    assert row in fields, f"{row!r} not among the differing fields {fields}"


def check_program(row: str) -> None:
    """Two replicas that differ in the row's field fail with an error naming it."""
    strategy = ar.MirroredStrategy(["CPU:0", "CPU:1"])

    async def step() -> Any:
        ctx = ar.get_replica_context()
        assert ctx is not None
        return await PROGRAMS[row](ctx, ctx.replica_id_in_sync_group)

    async def main() -> None:
        with anyio.fail_after(30):  # hang guard
            await strategy.run(step)

    caught: ar.CollectiveMismatchError | None = None
    try:
        anyio.run(main)
    except ar.CollectiveMismatchError as error:
        caught = error
    except Exception as error:
        raise AssertionError(f"{row!r}: {type(error).__name__}: {error}") from error
    assert caught is not None, f"{row!r}: the replicas' collectives completed"
    assert row in caught.fields, f"{row!r} not in {caught.fields}"
    assert row in str(caught)


def test_every_row_has_a_case() -> None:
    assert set(SIGNATURES) == set(ROWS)
    assert set(PROGRAMS) | {"name"} == set(ROWS)


@pytest.mark.parametrize("row", ROWS)
def test_a_pair_of_signatures_that_differ_in_one_field_is_caught(row: str) -> None:
    check_signatures(row)


@pytest.mark.parametrize("row", [r for r in ROWS if r in PROGRAMS])
def test_a_pair_of_programs_that_differ_in_one_field_is_caught(row: str) -> None:
    check_program(row)


def _without(row: str) -> tuple[tuple[str, Any], ...]:
    return tuple(rule for rule in _match.RULES if rule[0] != row)


@pytest.mark.parametrize("row", ROWS)
def test_without_its_row_the_signature_test_fails(
    row: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_match, "RULES", _without(row))
    with pytest.raises(AssertionError):
        check_signatures(row)


@pytest.mark.parametrize("row", [r for r in ROWS if r in PROGRAMS])
def test_without_its_row_the_program_test_fails(row: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_match, "RULES", _without(row))
    if row in _match.differing_fields(*SIGNATURES[row], check_call_sites=False):
        pytest.skip("the compiled _match does not see a monkeypatched RULES")
    with pytest.raises(AssertionError):
        check_program(row)


@pytest.mark.parametrize("batch", [False, True], ids=["one leaf", "batch"])
@pytest.mark.parametrize("sparse_first", [True, False], ids=["sparse first", "dense first"])
def test_the_backend_refuses_sparse_mixed_with_dense_as_an_internal_error(
    batch: bool, sparse_first: bool
) -> None:
    """The second line of defence: never filter a replica's contribution out."""
    from asyncreplica_numpy import NumpyBackend

    backend = NumpyBackend(["CPU:0", "CPU:1"])
    sparse = ar.IndexedSlices(np.ones((1, 2)), np.array([0]), (2, 2))
    dense = np.ones((2, 2))
    pair = [sparse, dense] if sparse_first else [dense, sparse]
    values = [[v, np.ones(3)] if batch else [v] for v in pair]

    async def main() -> None:
        await backend.all_reduce(SUM, values)

    with pytest.raises(ar.BackendError, match="internal error"):
        anyio.run(main)
