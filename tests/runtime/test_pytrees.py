"""JAX's registered pytree nodes in and out of collectives, runs and reductions."""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

import numpy as np
import pytest

import asyncreplica as ar
from asyncreplica._core import _nest

jax = pytest.importorskip("jax", reason="jax is not installed (pip install 'jax[cpu]')")
jnp = jax.numpy

pytestmark = pytest.mark.anyio


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Params:
    w: Any
    b: Any
    lr: float = dataclasses.field(metadata={"static": True}, default=0.1)


class Pair:
    """A pytree node registered by hand (not a dataclass)."""

    def __init__(self, left: Any, right: Any) -> None:
        self.left, self.right = left, right


jax.tree_util.register_pytree_node(
    Pair, lambda p: ((p.left, p.right), None), lambda _, children: Pair(*children)
)


def strategy(n: int = 2) -> ar.MirroredStrategy:
    return ar.MirroredStrategy([f"CPU:{i}" for i in range(n)])


def context() -> ar.ReplicaContext:
    ctx = ar.get_replica_context()
    assert ctx is not None
    return ctx


async def test_a_registered_dataclass_is_reduced_leaf_by_leaf_and_comes_back_as_itself() -> None:
    s = strategy(3)

    async def step() -> object:
        ctx = context()
        r = ctx.replica_id_in_sync_group
        return await ctx.all_reduce("sum", Params(jnp.ones(3) * (r + 1), jnp.full(2, float(r))))

    result = await s.run(step)
    assert isinstance(result, Params)  # regrouped: one Params of PerReplica leaves
    for local in s.experimental_local_results(result):
        assert isinstance(local, Params)
        assert local.lr == 0.1
        assert isinstance(local.w, jax.Array)
        np.testing.assert_array_equal(np.asarray(local.w), [6.0, 6.0, 6.0])
        np.testing.assert_array_equal(np.asarray(local.b), [3.0, 3.0])
    total = await s.reduce("sum", result, axis=None)
    assert isinstance(total, Params)
    np.testing.assert_array_equal(np.asarray(total.w), [18.0, 18.0, 18.0])


async def test_a_per_replica_of_registered_nodes_reduces_to_that_node() -> None:
    """PerReplica([Params, Params]) (one node per replica) is a Params of PerReplica leaves."""
    s = strategy(2)
    value = ar.PerReplica([Params(jnp.ones(3) * (r + 1), jnp.full(2, float(r))) for r in range(2)])
    total = await s.reduce("sum", value, axis=None)
    assert isinstance(total, Params)
    assert total.lr == 0.1
    np.testing.assert_array_equal(np.asarray(total.w), [3.0, 3.0, 3.0])
    np.testing.assert_array_equal(np.asarray(total.b), [1.0, 1.0])
    (mean,) = await s.extended.batch_reduce_to("mean", [(value, "CPU:0")])
    assert isinstance(mean, Params)
    np.testing.assert_array_equal(np.asarray(mean.w), [1.5, 1.5, 1.5])


async def test_nested_nodes_and_a_node_inside_a_dict() -> None:
    s = strategy(2)

    async def step() -> object:
        ctx = context()
        value = {"p": Pair(jnp.ones(2), Pair(np.float32(2.0), jnp.zeros(1))), "n": 1.0}
        return await ctx.all_reduce("sum", value)

    (first, _) = s.experimental_local_results(await s.run(step))
    assert isinstance(first["p"], Pair)
    assert isinstance(first["p"].right, Pair)
    np.testing.assert_array_equal(np.asarray(first["p"].left), [2.0, 2.0])
    assert float(first["p"].right.left) == 4.0
    assert float(first["n"]) == 2.0


async def test_different_static_metadata_is_a_different_structure() -> None:
    s = strategy(2)

    async def step() -> object:
        ctx = context()
        lr = 0.1 if ctx.replica_id_in_sync_group == 0 else 0.2
        return await ctx.all_reduce("sum", Params(jnp.ones(2), jnp.ones(1), lr=lr))

    with pytest.raises(ar.CollectiveMismatchError) as info:
        await s.run(step)
    assert info.value.fields == ("structure",)
    text = str(info.value)
    assert "replica 0 called all_reduce(SUM) on Params[(0.1,)](" in text, text
    assert "replica 1 called all_reduce(SUM) on Params[(0.2,)](" in text, text


async def test_replicas_returning_nodes_of_different_types_is_a_structure_error() -> None:
    s = strategy(2)

    async def step() -> object:
        r = context().replica_id_in_sync_group
        return Params(1.0, 2.0) if r == 0 else Pair(1.0, 2.0)

    with pytest.raises(ValueError, match="replicas returned values of different structure"):
        await s.run(step)


def test_none_and_plain_dataclasses_stay_leaves() -> None:
    @dataclasses.dataclass
    class Plain:
        x: int

    for value in (None, Plain(1), np.ones(2), jnp.ones(2)):
        leaves, treedef = _nest.flatten(value)
        assert treedef is None
        assert leaves == [value] or leaves[0] is value


def test_without_jax_imported_the_finder_finds_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    from asyncreplica._runtime._pytrees import jax_node

    assert jax_node(Pair(1, 2)) is not None
    monkeypatch.delitem(sys.modules, "jax.tree_util")
    assert jax_node(Pair(1, 2)) is None


def test_a_type_declined_once_is_asked_again_after_a_registration() -> None:
    class Late:
        pass

    assert _nest.flatten(Late())[1] is None  # a leaf, remembered
    assert Late in _nest._NOT_NODES
    jax.tree_util.register_pytree_node(Late, lambda v: ((), None), lambda _, c: Late())
    _nest.register_node_finder(_nest._FINDERS[0])  # registering clears the cache
    assert Late not in _nest._NOT_NODES
    _, treedef = _nest.flatten(Late())
    assert treedef is not None
    assert _nest.treedef_str(treedef) == "Late()"
