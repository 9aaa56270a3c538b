"""Processes name a disagreement as one process names it: the same fields, in order.

``asyncreplica._core._match`` decides what replicas of one process must agree on and
names the fields that differ ("shape differs", "reduce op differs", ...). Across
processes the signatures travel as plain fields (``asyncreplica_mpi._protocol``); the
names a process reports must be the same. Pairs of signatures are generated, so every
combination of differences is compared, not only the hand-picked ones.
"""

from __future__ import annotations

import itertools

import pytest
from asyncreplica_mpi._protocol import differing_fields as across_processes
from asyncreplica_mpi._protocol import signature_fields
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncreplica._core._match import differing_fields as in_one_process
from asyncreplica._core._nest import flatten
from asyncreplica.abc import CallSite, CollectiveKind, LeafSpec, ReduceOp, Signature

KINDS = [CollectiveKind.ALL_REDUCE, CollectiveKind.BROADCAST, CollectiveKind.ALL_GATHER]


@st.composite
def signatures(draw: st.DrawFn) -> Signature:
    kind = draw(st.sampled_from(KINDS))
    n = draw(st.integers(1, 3))
    leaves = tuple(
        LeafSpec(
            tuple(draw(st.lists(st.integers(1, 3), max_size=2))),
            draw(st.sampled_from(["float32", "float64", "int64"])),
            False,
            draw(st.sampled_from([None, None, "jax.Array"])),
        )
        for _ in range(n)
    )
    nest = draw(st.sampled_from(["list", "tuple", "dict"]))
    value: object = list(range(n))
    if nest == "tuple":
        value = tuple(range(n))
    elif nest == "dict":
        value = {f"k{i}": i for i in range(n)}
    _, structure = flatten(value)
    line = draw(st.sampled_from([10, 11]))
    return Signature(
        kind,
        op=draw(st.sampled_from([ReduceOp.SUM, ReduceOp.MAX]))
        if kind is CollectiveKind.ALL_REDUCE
        else None,
        axis=0 if kind is CollectiveKind.ALL_GATHER else None,
        source=draw(st.sampled_from([0, 1])) if kind is CollectiveKind.BROADCAST else None,
        name=draw(st.sampled_from([None, None, "grads"])),
        structure=structure,
        leaves=leaves,
        call_path=(CallSite("/p/train.py", line, "step", 5),),
    )


def _names(a: Signature, b: Signature) -> tuple[list[str], list[str]]:
    local = list(in_one_process(a, b, check_call_sites=True))
    details = [{"fields": signature_fields(s, 0, check_call_sites=True)} for s in (a, b)]
    return local, across_processes(details)


@settings(max_examples=400, deadline=None)
@given(a=signatures(), b=signatures())
def test_processes_name_the_differing_fields_as_one_process_does(
    a: Signature, b: Signature
) -> None:
    local, remote = _names(a, b)
    if a.kind is not b.kind:
        # Different collectives: the kind is named; the rest compares shapes read
        # differently per kind (all_gather's gathered axis), so only the kind counts.
        assert local[0] == remote[0] == "kind"
        return
    assert remote == local


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"leaves": (LeafSpec((4,), "float64"),)}, ["shape"]),
        ({"leaves": (LeafSpec((3,), "float32"),)}, ["dtype"]),
        ({"leaves": (LeafSpec((3,), "float64", False, "jax.Array"),)}, ["array type"]),
        ({"op": ReduceOp.MAX}, ["reduce op"]),
        ({"structure": flatten([0])[1]}, ["structure"]),
        (
            {
                "leaves": (LeafSpec((3,), "float64"), LeafSpec((3,), "float64")),
                "structure": flatten([0, 1])[1],
            },
            ["structure"],
        ),
    ],
)
def test_each_difference_has_its_one_process_name(
    change: dict[str, object], expected: list[str]
) -> None:
    base = Signature(
        CollectiveKind.ALL_REDUCE,
        op=ReduceOp.SUM,
        structure=flatten((0,))[1],
        leaves=(LeafSpec((3,), "float64"),),
    )
    local, remote = _names(base, base._replace(**change))  # type: ignore[arg-type]
    assert local == expected
    assert remote == expected


def test_the_fields_list_is_the_same_for_every_pair_of_kinds() -> None:
    # No combination of kinds leaves a field unnamed (an empty list for a real difference).
    for ka, kb in itertools.product(KINDS, repeat=2):
        a = Signature(ka, leaves=(LeafSpec((3,), "float64"),), structure=flatten((0,))[1])
        b = Signature(kb, leaves=(LeafSpec((3,), "float64"),), structure=flatten((0,))[1])
        local, remote = _names(a, b)
        assert (local == []) == (ka == kb)
        assert remote == local
