"""Nested structures: flatten/unflatten round trips, regroup and select_replica."""

from __future__ import annotations

from collections import OrderedDict, defaultdict, namedtuple

import pytest

from asyncreplica._core._nest import flatten, regroup, select_replica, treedef_str, unflatten

Point = namedtuple("Point", ["x", "y"])


@pytest.mark.parametrize(
    "value",
    [
        pytest.param(1.0, id="leaf"),
        pytest.param([], id="empty-list"),
        pytest.param([1, (2, 3), {"b": 4, "a": [5]}], id="mixed"),
        pytest.param(Point(1, [2, 3]), id="namedtuple"),
        pytest.param(OrderedDict([("z", 1), ("a", 2)]), id="ordereddict"),
        pytest.param(defaultdict(list, {"k": 1}), id="defaultdict"),
        pytest.param({1: "x", "a": "y"}, id="mixed-keys"),
    ],
)
def test_flatten_unflatten_round_trip(value: object) -> None:
    leaves, treedef = flatten(value)
    rebuilt = unflatten(treedef, leaves)
    assert rebuilt == value
    assert type(rebuilt) is type(value)
    if isinstance(value, defaultdict):
        assert rebuilt.default_factory is list  # type: ignore[attr-defined]


def test_mappings_flatten_in_sorted_key_order() -> None:
    leaves, _ = flatten({"b": 2, "a": 1, "c": 3})
    assert leaves == [1, 2, 3]


def test_treedefs_compare_structures() -> None:
    assert flatten([1, 2])[1] == flatten([3, 4])[1]
    assert flatten([1, 2])[1] != flatten((1, 2))[1]
    assert flatten({"a": 1})[1] != flatten({"b": 1})[1]
    assert hash(flatten({"a": [1, (2,)]})[1]) == hash(flatten({"a": [5, (6,)]})[1])


def test_treedef_str() -> None:
    _, treedef = flatten({"x": [1, 2.0], "y": (3,), "z": Point(1, 2)})
    assert treedef_str(treedef) == "{'x': [*, *], 'y': (*,), 'z': Point(*, *)}"
    assert (
        treedef_str(treedef, iter(["a", "b", "c", "d", "e"]))
        == "{'x': [a, b], 'y': (c,), 'z': Point(d, e)}"
    )


def test_regroup_unwraps_identical_leaves_and_wraps_others() -> None:
    shared = object()
    merged = regroup(
        [{"a": 0, "s": shared, "l": [shared, 10]}, {"a": 1, "s": shared, "l": [shared, 11]}],
        lambda values: ("wrapped", values),
    )
    assert merged == {"a": ("wrapped", (0, 1)), "s": shared, "l": [shared, ("wrapped", (10, 11))]}


def test_regroup_keeps_container_types() -> None:
    merged = regroup([Point(1, 2), Point(3, 2)], lambda values: values)
    assert type(merged) is Point
    assert merged == Point((1, 3), 2)


@pytest.mark.parametrize(
    "values",
    [
        pytest.param([[1], [1, 2]], id="length"),
        pytest.param([[1], (1,)], id="type"),
        pytest.param([{"a": 1}, {"b": 1}], id="keys"),
    ],
)
def test_regroup_rejects_different_structures(values: list[object]) -> None:
    with pytest.raises(ValueError, match="replicas returned values of different structure"):
        regroup(values, lambda v: v)


def test_regroup_names_replicas_by_their_global_ids() -> None:
    # Under MPI a process regroups its own replicas: process 1 of 2 runs replicas 2, 3.
    with pytest.raises(ValueError, match=r"replica 2 gave \[\*\] but replica 3 gave \[\*, \*\]"):
        regroup([[1], [1, 2]], lambda v: v, first_replica=2)
    nested = [{"a": [1]}, {"a": [1, 2]}]  # the difference is found inside a container
    with pytest.raises(ValueError, match=r"replica 4 gave .* but replica 5 gave"):
        regroup(nested, lambda v: v, first_replica=4)


class Per:
    def __init__(self, *values: int) -> None:
        self.values = values


def test_select_replica_builds_new_containers() -> None:
    per = Per(10, 20)
    args = [per, {"k": Per(1, 2), "same": 5}]
    picked = select_replica(
        1, args, lambda i, leaf: leaf.values[i] if isinstance(leaf, Per) else leaf
    )
    assert picked == [20, {"k": 2, "same": 5}]
    assert args[0] is per
    assert isinstance(args[1], dict)
    assert isinstance(args[1]["k"], Per)
