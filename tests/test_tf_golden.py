"""asyncreplica against TensorFlow's own results, recorded by scripts/record_tf_golden.py.

The programs in tests/tf_golden/programs.py ran on TensorFlow 2.21's MirroredStrategy
over N logical CPUs (N in 1, 2, 3, 4, 8), eagerly and inside ``tf.function``; the
results are in tests/tf_golden/tf_n{N}.json. Here the same programs run on
asyncreplica and every case must agree, or the program carries a ``deliberate``
reason that docs/migration.md lists. An untagged difference fails.
"""

from __future__ import annotations

import asyncio
import json
import pathlib
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from tf_golden import programs as P

import asyncreplica as ar

ROOT = pathlib.Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "tf_golden"
MIGRATION = (ROOT / "docs" / "migration.md").read_text()


def _golden(n: int) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((GOLDEN / f"tf_n{n}.json").read_text())
    return data


def _slices(full: Any, start: int, stop: int) -> Any:
    if isinstance(full, dict):
        return {k: v[start:stop] for k, v in full.items()}
    return full[start:stop]


def _length(full: Any) -> int:
    return len(next(iter(full.values()))) if isinstance(full, dict) else len(full)


class ArApi:
    """The asyncreplica adapter: the same methods as the recorder's TensorFlow one."""

    name = "ar"

    def __init__(self, n: int) -> None:
        self.n = n
        self.strategy = ar.MirroredStrategy([f"CPU:{i}" for i in range(n)])

    def _replica(self, step: Callable[..., Any]) -> Callable[..., Any]:
        async def fn(*a: Any, **k: Any) -> Any:
            return await P.drive_async(step(self, ar.get_replica_context(), *a, **k))

        return fn

    def const(self, x: Any) -> Any:
        return np.asarray(x)

    def per_replica(self, fn: Callable[[int, int], Any]) -> Any:
        return self.strategy.experimental_distribute_values_from_function(
            lambda c: fn(c.replica_id_in_sync_group, self.n)
        )

    def values_from_function(self, fn: Callable[[Any], Any]) -> Any:
        return self.strategy.experimental_distribute_values_from_function(fn)

    def make_per_replica(self, values: list[Any]) -> Any:
        return ar.PerReplica(values)

    def is_per_replica(self, v: Any) -> bool:
        return isinstance(v, ar.PerReplica)

    def run(self, step: Any, args: Any = (), kwargs: Any = None) -> Any:
        return self.strategy.run(self._replica(step), args=args, kwargs=kwargs)

    def call_for_each_replica(self, step: Any, args: Any = ()) -> Any:
        return self.strategy.extended.call_for_each_replica(self._replica(step), args=args)

    def all_reduce(self, ctx: Any, op: str, v: Any) -> Any:
        return ctx.all_reduce(op, v)

    def all_gather(self, ctx: Any, v: Any, axis: int) -> Any:
        return ctx.all_gather(v, axis)

    def merge_call(self, ctx: Any, mf: Any, args: Any = (), kwargs: Any = None) -> Any:
        async def merge_fn(s: Any, *a: Any, **k: Any) -> Any:
            return await P.drive_async(mf(self, s, *a, **k))

        return ctx.merge_call(merge_fn, args=args, kwargs=kwargs)

    def reduce(self, op: str, v: Any, axis: Any) -> Any:
        return self.strategy.reduce(op, v, axis=axis)

    def gather(self, v: Any, axis: int) -> Any:
        return self.strategy.gather(v, axis)

    def local_results(self, v: Any) -> Any:
        return self.strategy.experimental_local_results(v)

    def in_cross_replica_context(self) -> bool:
        return ar.in_cross_replica_context()

    def has_strategy(self) -> bool:
        return ar.has_strategy()

    def replica_context_is_none(self) -> bool:
        return ar.get_replica_context() is None

    def scope(self) -> Any:
        return self.strategy.scope()

    def cluster_resolver(self) -> Any:
        return self.strategy.cluster_resolver

    def reduce_to(self, op: str, v: Any, d: Any) -> Any:
        return self.strategy.extended.reduce_to(op, v, d)

    def batch_reduce_to(self, op: str, pairs: Any) -> Any:
        return self.strategy.extended.batch_reduce_to(op, pairs)

    def broadcast_to(self, v: Any, d: Any) -> Any:
        return self.strategy.extended.broadcast_to(v, d)

    def mirrored_var(self, x: Any) -> Any:
        return ar.Mirrored([np.array(x) for _ in range(self.n)])

    def update(self, var: Any, fn: Any, args: Any, group: bool) -> Any:
        return self.strategy.extended.update(var, fn, args=args, group=group)

    def batch_dataset(self, full: Any, batch: int) -> list[Any]:
        size = _length(full)
        return [_slices(full, i, min(i + batch, size)) for i in range(0, size, batch)]

    def distribute_dataset(self, full: Any, batch: int) -> Any:
        return self.strategy.experimental_distribute_dataset(self.batch_dataset(full, batch))

    def datasets_from_function(self, fn: Any) -> Any:
        return self.strategy.distribute_datasets_from_function(fn)

    def iterate(self, ds: Any) -> list[Any]:
        return list(ds)

    def input_context(self, a: int, b: int, c: int) -> Any:
        return ar.InputContext(a, b, c)

    def dataset_of(self, full: Any, batch: int | None = None, drop_remainder: bool = False) -> Any:
        """TF's ``from_tensor_slices(full)[.batch(batch, drop_remainder)]`` as a list."""
        if batch is None:
            size = _length(full)
            if isinstance(full, dict):
                return [{k: v[i] for k, v in full.items()} for i in range(size)]
            return [full[i] for i in range(size)]
        batches = self.batch_dataset(full, batch)
        return [b for b in batches if _length(b) == batch] if drop_remainder else batches

    def distribute(self, ds: Any) -> Any:
        return self.strategy.experimental_distribute_dataset(ds)

    def iterator(self, ds: Any) -> Any:
        return iter(ds)

    def spec(self, spec: Any) -> Any:
        """An element_spec as [dtype, rank] per leaf (TF's batch dims may be None)."""
        if isinstance(spec, ar.PerReplica):
            return {"PerReplica": [self.spec(s) for s in spec.values]}
        if isinstance(spec, dict):
            return {k: self.spec(v) for k, v in sorted(spec.items())}
        if isinstance(spec, list | tuple) and not hasattr(spec, "_fields"):
            return [self.spec(v) for v in spec]
        return [spec.dtype, len(spec.shape)]

    def cardinality(self, ds: Any) -> int:
        return int(ds.cardinality)

    def dataset_reduce(self, ds: Any, init: Any, fold: Any) -> Any:
        async def reduce_func(state: Any, x: Any) -> Any:
            return await P.drive_async(fold(self, state, x))

        return ds.reduce(init, reduce_func)

    def slices(self, values: Any, indices: Any, dense_shape: Any) -> Any:
        return ar.IndexedSlices(values, indices, dense_shape)

    def reduce_op(self, name: str) -> str:
        return ar.ReduceOp(name).value

    def comm_options(self, **kw: Any) -> str:
        ar.CommunicationOptions(**kw)
        return "ok"

    def length(self, v: Any) -> int:
        return len(v)


def _kind(x: Any) -> str | None:
    if isinstance(x, ar.IndexedSlices):
        return "IndexedSlices"
    if isinstance(x, ar.PerReplica):
        return "PerReplica"
    if isinstance(x, ar.Mirrored):
        return "Mirrored"
    if isinstance(x, np.ndarray | np.generic):
        return "array"
    return None


def run_program(prog: P.Program, n: int) -> Any:
    api = ArApi(n)
    try:
        return P.canon(asyncio.run(P.drive_async(prog.fn(api))), _kind, lambda a: a)
    except Exception as exc:
        return P.canon_error(exc)


def _reason_is_listed(reason: str) -> bool:
    """Whether a line of docs/migration.md's "Deliberate differences" names the reason."""
    start = MIGRATION.index("## Deliberate differences")
    end = MIGRATION.find("\n## ", start + 1)
    section = MIGRATION[start : end if end >= 0 else None]
    return any(reason in line for line in section.splitlines())


def compare(n: int) -> tuple[int, list[str], list[str]]:
    """(cases, untagged differences, tagged differences) for N replicas."""
    golden = _golden(n)["cases"]
    cases = 0
    untagged: list[str] = []
    tagged: list[str] = []
    for prog in P.PROGRAMS:
        if n not in prog.ns:
            continue
        ours = run_program(prog, n)
        for mode in prog.modes:
            cases += 1
            name = f"{prog.name}|{mode}"
            theirs = golden[name]
            if P.same(ours, theirs):
                continue
            line = f"N={n} {name}: tf {json.dumps(theirs)[:300]} vs ours {json.dumps(ours)[:300]}"
            (tagged if prog.reason(mode, n) else untagged).append(line)
    return cases, untagged, tagged


@pytest.mark.parametrize("n", P.NS)
def test_every_case_agrees_with_tensorflow_or_is_a_listed_difference(n: int) -> None:
    cases, untagged, _ = compare(n)
    assert cases > 100
    assert not untagged, "\n".join(untagged)


def test_golden_files_were_recorded_by_tensorflow_2_21_for_every_case() -> None:
    for n in P.NS:
        data = _golden(n)
        assert data["tensorflow"].startswith("2.21."), data["tensorflow"]
        assert data["num_replicas"] == n
        expected = {f"{p.name}|{m}" for p in P.PROGRAMS if n in p.ns for m in p.modes}
        assert set(data["cases"]) == expected, "re-run scripts/record_tf_golden.py"


def test_every_deliberate_reason_is_a_line_of_the_migration_guide() -> None:
    reasons = {r for p in P.PROGRAMS for r in p.reasons()}
    assert reasons
    missing = sorted(r for r in reasons if not _reason_is_listed(r))
    assert not missing, f"not in docs/migration.md's deliberate differences: {missing}"


def test_every_deliberate_tag_marks_a_real_difference() -> None:
    """A tag whose program agrees with TensorFlow everywhere is stale: remove it."""
    differing: set[str] = set()
    for n in P.NS:
        _, _, tagged = compare(n)
        differing |= {line.split(" ", 2)[1].split("|")[0] for line in tagged}
    stale = sorted(p.name for p in P.PROGRAMS if p.reasons() and p.name not in differing)
    assert not stale, f"these programs agree with TensorFlow: drop their tags: {stale}"
