"""A distributed value whose components are nests (and a nest), through every cross-replica call.

``strategy.reduce(op, PerReplica([{"a": x0}, {"a": x1}]))`` raised a TypeError that listed
dicts as allowed while refusing one. Such a value now stands for the nest of distributed
values ``{"a": PerReplica([x0, x1])}``: flattened by the rule that flattens
``all_reduce``'s values, reduced leaf by leaf, returned with the same structure.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple

import anyio
import numpy as np
import pytest

import asyncreplica as ar


class Pair(NamedTuple):
    w: Any
    b: Any


def strategy(n: int = 2) -> ar.MirroredStrategy:
    return ar.MirroredStrategy([f"CPU:{i}" for i in range(n)])


def run(fn: Callable[[], Awaitable[Any]]) -> Any:
    async def main() -> Any:
        with anyio.fail_after(30):  # hang guard
            return await fn()

    return anyio.run(main)


def component(r: int) -> dict[str, Any]:
    return {
        "a": np.array([1.0, 2.0]) * (r + 1),
        "b": (np.float32(r), [np.arange(3) + r]),
        "p": Pair(w=np.full((2, 2), r + 0.5), b=np.int64(r)),
    }


def plain(value: Any) -> Any:
    """``value`` with every Mirrored replaced by its first component."""
    if isinstance(value, ar.Mirrored):
        return value.values[0]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, Pair):
        return Pair(*(plain(v) for v in value))
    if isinstance(value, list | tuple):
        return type(value)(plain(v) for v in value)
    return value


def assert_same(got: Any, want: Any) -> None:
    """Same containers (types, keys, lengths); leaves of the same dtype, shape and values."""
    if isinstance(want, dict | list | tuple):
        assert type(got) is type(want)
    if isinstance(want, dict):
        assert list(got) == list(want)
        for k in want:
            assert_same(got[k], want[k])
    elif isinstance(want, list | tuple):
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            assert_same(g, w)
    else:
        assert isinstance(got, np.ndarray | np.generic)
        assert np.asarray(got).dtype == np.asarray(want).dtype
        np.testing.assert_array_equal(got, want, strict=True)


async def all_reduce_in_replicas(s: ar.MirroredStrategy, op: str) -> Any:
    """The reference: each replica all_reduces its own nest."""

    async def step() -> Any:
        ctx = ar.get_replica_context()
        assert ctx is not None
        return await ctx.all_reduce(op, component(ctx.replica_id_in_sync_group))

    return plain(s.experimental_local_results(await s.run(step))[0])


CALLS: dict[str, Callable[[ar.MirroredStrategy, str, Any], Awaitable[Any]]] = {
    "reduce": lambda s, op, v: s.reduce(op, v, axis=None),
    "reduce_to one device": lambda s, op, v: s.extended.reduce_to(op, v, "CPU:0"),
    "reduce_to mirrored": lambda s, op, v: s.extended.reduce_to(
        op, v, list(s.extended.worker_devices)
    ),
    "batch_reduce_to": lambda s, op, v: s.extended.batch_reduce_to(op, [(v, "CPU:0")]),
}


@pytest.mark.parametrize("op", ["SUM", "MEAN", "MAX"])
@pytest.mark.parametrize("call", sorted(CALLS))
def test_a_per_replica_of_nests_reduces_leafwise_like_all_reduce(call: str, op: str) -> None:
    s = strategy(2)
    value = ar.PerReplica([component(0), component(1)])
    got = run(lambda: CALLS[call](s, op, value))
    if call == "batch_reduce_to":
        (got,) = got
    want = run(lambda: all_reduce_in_replicas(s, op))
    assert_same(plain(got), want)
    # The same as reducing the nest of PerReplica values that run would have returned.
    split = {
        "a": ar.PerReplica([component(r)["a"] for r in range(2)]),
        "b": (
            ar.PerReplica([component(r)["b"][0] for r in range(2)]),
            [ar.PerReplica([component(r)["b"][1][0] for r in range(2)])],
        ),
        "p": Pair(
            w=ar.PerReplica([component(r)["p"].w for r in range(2)]),
            b=ar.PerReplica([component(r)["p"].b for r in range(2)]),
        ),
    }
    again = run(lambda: CALLS[call](s, op, split))
    if call == "batch_reduce_to":
        (again,) = again
    assert_same(plain(got), plain(again))
    if call == "reduce_to mirrored":
        assert isinstance(got["a"], ar.Mirrored)


def test_reduce_along_an_axis_and_gather_of_a_per_replica_of_nests() -> None:
    s = strategy(2)
    value = ar.PerReplica(
        [{"x": np.arange(4.0) + 4 * r, "y": [np.ones((r + 1, 2))]} for r in range(2)]
    )
    got = run(lambda: s.reduce("MEAN", value, axis=0))
    assert_same(got, {"x": np.float64(3.5), "y": [np.ones(2)]})
    gathered = run(lambda: s.gather(value, axis=0))
    assert_same(gathered, {"x": np.arange(8.0), "y": [np.ones((3, 2))]})


def test_nested_per_replica_inside_a_nest_and_mirrored_of_nests() -> None:
    s = strategy(3)
    value = {
        "outer": ar.PerReplica([[np.float64(r), np.float64(10 * r)] for r in range(3)]),
        "m": ar.Mirrored([{"k": np.ones(2)}] * 3),
        "flat": ar.PerReplica([np.float64(r) for r in range(3)]),
    }
    got = run(lambda: s.reduce("SUM", value))
    assert_same(
        got,
        {
            "outer": [np.float64(3), np.float64(30)],
            "m": {"k": np.full(2, 3.0)},
            "flat": np.float64(3),
        },
    )
    # A list of numbers is a nest here, as all_reduce([1.0, 2.0]) is: reduced leaf by leaf.
    numbers = ar.PerReplica([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    assert_same(run(lambda: s.reduce("SUM", numbers)), [np.float64(9), np.float64(12)])
    mirrored = run(
        lambda: s.extended.reduce_to("MEAN", ar.Mirrored([{"k": np.ones(2)}] * 3), "CPU:0")
    )
    assert_same(mirrored, {"k": np.ones(2)})


@pytest.mark.parametrize("call", sorted(CALLS))
def test_components_of_different_structure_say_which_and_what_to_do(call: str) -> None:
    s = strategy(3)
    value = ar.PerReplica([{"a": np.ones(2)}, {"a": np.ones(2)}, {"b": np.ones(2)}])
    with pytest.raises(ValueError, match="PerReplica of nests") as info:
        run(lambda: CALLS[call](s, "SUM", value))
    message = str(info.value)
    api = "Strategy.reduce" if call == "reduce" else "extended.reduce_to"
    assert message == (
        f"{api} combines a PerReplica of nests leaf by leaf, as all_reduce combines a nest, "
        "so its components need one structure, but replica 0's is {'a': *} and replica 2's "
        "is {'b': *}. Give every replica's component the same containers, lengths and keys, "
        "or pass a nest of PerReplica values (what strategy.run returns)."
    )


def test_a_batch_sliced_from_a_python_list_says_how_to_reduce_it_as_arrays() -> None:
    """A list batch's components are lists (nests); uneven ones cannot be reduced leafwise."""
    s = strategy(2)
    [batch] = list(s.experimental_distribute_dataset([[1.0, 2.0, 3.0]]))
    with pytest.raises(
        ValueError, match="replica 0's is \\[\\*, \\*\\] and replica 1's is \\[\\*\\]"
    ) as info:
        run(lambda: s.reduce("SUM", batch, axis=0))
    assert str(info.value).endswith(
        "; to reduce each component as one array (a batch sliced from a Python list), "
        "convert it first: PerReplica([np.asarray(c) for c in value.values])."
    )
    fixed = ar.PerReplica([np.asarray(c) for c in batch.values])
    assert run(lambda: s.reduce("SUM", fixed, axis=0)) == 6.0


def test_a_component_that_is_not_a_nest_among_nests_is_a_structure_mismatch() -> None:
    s = strategy(2)
    value = ar.PerReplica([[np.ones(2)], np.ones(2)])
    with pytest.raises(ValueError, match=r"replica 0's is \[\*\] and replica 1's is \*"):
        run(lambda: s.reduce("SUM", value))


def test_broadcast_to_of_a_nest_copies_each_leaf() -> None:
    """broadcast_to({"a": x}) raised the TypeError that lists dicts as allowed."""
    s = strategy(2)
    value = {"a": np.arange(2.0), "b": [np.float32(3)], "n": 1.5}
    one = run(lambda: s.extended.broadcast_to(value, "CPU:0"))
    assert one["n"] == 1.5
    assert type(one["n"]) is float  # a Python number comes back unchanged, as in TF
    assert one["a"] is not value["a"]
    assert_same({"a": one["a"], "b": one["b"]}, {"a": np.arange(2.0), "b": [np.float32(3)]})
    both = run(lambda: s.extended.broadcast_to(value, ["CPU:0", "CPU:1"]))
    assert isinstance(both["a"], ar.Mirrored)
    assert both["n"] == 1.5
    assert_same(
        plain({"a": both["a"], "b": both["b"]}), {"a": np.arange(2.0), "b": [np.float32(3)]}
    )
