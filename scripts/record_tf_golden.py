"""Record TensorFlow's results for the programs in tests/tf_golden/programs.py.

Runs each program on a real ``tf.distribute.MirroredStrategy`` over N logical CPUs,
for N in 1, 2, 3, 4 and 8, eagerly and inside ``tf.function``, and writes the
canonical results to ``tests/tf_golden/tf_n{N}.json`` together with the TensorFlow
version. tests/test_tf_golden.py runs the same programs on asyncreplica and compares.

TensorFlow is not a dependency of asyncreplica or of its CI: run this in its own
environment, e.g.::

    python3 -m venv /tmp/tf && /tmp/tf/bin/pip install tensorflow-cpu==2.21.0 numpy
    /tmp/tf/bin/python scripts/record_tf_golden.py            # every N
    /tmp/tf/bin/python scripts/record_tf_golden.py --n 2 3    # some
    /tmp/tf/bin/python scripts/record_tf_golden.py --missing  # only new programs

Logical devices are fixed when TensorFlow starts, so each N runs in its own process.
A collective error aborts TensorFlow's collective executor for the rest of the
process, so after one the child process stops and a fresh one continues with the
next case.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import selectors
import subprocess
import sys
import time
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "tf_golden"
sys.path.insert(0, str(GOLDEN))

import programs as P  # noqa: E402

CASE_TIMEOUT = 180.0


def _cases(n: int, skip: frozenset[str] = frozenset()) -> list[tuple[P.Program, str]]:
    return [(p, m) for p, m in P.case_names() if n in p.ns and f"{p.name}|{m}" not in skip]


def _skip_file(n: int) -> pathlib.Path:
    return GOLDEN / f".skip_n{n}.json"


def _skip(n: int) -> frozenset[str]:
    path = _skip_file(n)
    return frozenset(json.loads(path.read_text())) if path.exists() else frozenset()


# --------------------------------------------------------------------------------------
# Child: one N, cases from --start on


def child(n: int, start: int) -> None:
    """Run the cases of N replicas from ``start`` on; print one JSON line per case."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import numpy as np
    import tensorflow as tf
    from tensorflow.python.distribute import values as tf_values

    tf.get_logger().setLevel("ERROR")
    cpus = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(
        cpus[0], [tf.config.LogicalDeviceConfiguration()] * n
    )
    strategy = tf.distribute.MirroredStrategy([f"CPU:{i}" for i in range(n)])

    def to_tf(x: Any) -> Any:
        return tf.nest.map_structure(
            lambda v: tf.constant(v) if isinstance(v, np.ndarray | np.generic) else v, x
        )

    def kind(x: Any) -> str | None:
        if isinstance(x, tf.IndexedSlices):
            return "IndexedSlices"
        if isinstance(x, tf_values.PerReplica):
            return "PerReplica"
        if isinstance(x, tf_values.Mirrored):
            return "Mirrored"
        if isinstance(x, tf.Tensor | tf.Variable):
            return "array"
        return None

    class TfApi:
        name = "tf"

        def __init__(self) -> None:
            self.n = n
            self.strategy = strategy

        def _replica(self, step: Any) -> Any:
            return lambda *a, **k: P.drive_sync(
                step(self, tf.distribute.get_replica_context(), *a, **k)
            )

        def const(self, x: Any) -> Any:
            return tf.constant(x)

        def per_replica(self, fn: Any) -> Any:
            return strategy.experimental_distribute_values_from_function(
                lambda c: to_tf(fn(c.replica_id_in_sync_group, n))
            )

        def values_from_function(self, fn: Any) -> Any:
            return strategy.experimental_distribute_values_from_function(fn)

        def make_per_replica(self, values: list[Any]) -> Any:
            return tf_values.PerReplica(tuple(values))

        def is_per_replica(self, v: Any) -> bool:
            return isinstance(v, tf_values.PerReplica)

        def run(self, step: Any, args: Any = (), kwargs: Any = None) -> Any:
            return strategy.run(self._replica(step), args=args, kwargs=kwargs)

        def call_for_each_replica(self, step: Any, args: Any = ()) -> Any:
            return strategy.extended.call_for_each_replica(self._replica(step), args=args)

        def all_reduce(self, ctx: Any, op: str, v: Any) -> Any:
            return ctx.all_reduce(op, v)

        def all_gather(self, ctx: Any, v: Any, axis: int) -> Any:
            return ctx.all_gather(v, axis)

        def merge_call(self, ctx: Any, mf: Any, args: Any = (), kwargs: Any = None) -> Any:
            return ctx.merge_call(
                lambda s, *a, **k: P.drive_sync(mf(self, s, *a, **k)), args=args, kwargs=kwargs
            )

        def reduce(self, op: str, v: Any, axis: Any) -> Any:
            return strategy.reduce(op, v, axis=axis)

        def gather(self, v: Any, axis: int) -> Any:
            return strategy.gather(v, axis)

        def local_results(self, v: Any) -> Any:
            return strategy.experimental_local_results(v)

        def in_cross_replica_context(self) -> bool:
            return tf.distribute.in_cross_replica_context()

        def has_strategy(self) -> bool:
            return tf.distribute.has_strategy()

        def replica_context_is_none(self) -> bool:
            return tf.distribute.get_replica_context() is None

        def scope(self) -> Any:
            return strategy.scope()

        def cluster_resolver(self) -> Any:
            return strategy.cluster_resolver

        def reduce_to(self, op: str, v: Any, d: Any) -> Any:
            return strategy.extended.reduce_to(op, v, d)

        def batch_reduce_to(self, op: str, pairs: Any) -> Any:
            return strategy.extended.batch_reduce_to(op, pairs)

        def broadcast_to(self, v: Any, d: Any) -> Any:
            return strategy.extended.broadcast_to(v, d)

        def mirrored_var(self, x: Any) -> Any:
            with strategy.scope():
                return tf.Variable(x)

        def update(self, var: Any, fn: Any, args: Any, group: bool) -> Any:
            return strategy.extended.update(var, fn, args=args, group=group)

        def distribute_dataset(self, full: Any, batch: int) -> Any:
            ds = tf.data.Dataset.from_tensor_slices(full).batch(batch)
            return strategy.experimental_distribute_dataset(ds)

        def batch_dataset(self, full: Any, batch: int) -> Any:
            return tf.data.Dataset.from_tensor_slices(full).batch(batch)

        def datasets_from_function(self, fn: Any) -> Any:
            return strategy.distribute_datasets_from_function(fn)

        def iterate(self, ds: Any) -> list[Any]:
            return list(ds)

        def input_context(self, a: int, b: int, c: int) -> Any:
            return tf.distribute.InputContext(a, b, c)

        def dataset_of(
            self, full: Any, batch: int | None = None, drop_remainder: bool = False
        ) -> Any:
            ds = tf.data.Dataset.from_tensor_slices(full)
            return ds if batch is None else ds.batch(batch, drop_remainder=drop_remainder)

        def distribute(self, ds: Any) -> Any:
            return strategy.experimental_distribute_dataset(ds)

        def iterator(self, ds: Any) -> Any:
            return iter(ds)

        def spec(self, spec: Any) -> Any:
            if isinstance(spec, tf_values.PerReplicaSpec):
                return {"PerReplica": [self.spec(s) for s in spec._value_specs]}
            if isinstance(spec, dict):
                return {k: self.spec(v) for k, v in sorted(spec.items())}
            if isinstance(spec, list | tuple) and not hasattr(spec, "_fields"):
                return [self.spec(v) for v in spec]
            return [spec.dtype.name, spec.shape.rank]

        def cardinality(self, ds: Any) -> int:
            return int(ds.cardinality)

        def dataset_reduce(self, ds: Any, init: Any, fold: Any) -> Any:
            return ds.reduce(to_tf(init), lambda st, x: P.drive_sync(fold(self, st, x)))

        def slices(self, values: Any, indices: Any, dense_shape: Any) -> Any:
            return tf.IndexedSlices(
                tf.constant(values), tf.constant(indices), tf.constant(dense_shape, tf.int64)
            )

        def reduce_op(self, name: str) -> str:
            return str(tf.distribute.ReduceOp(name).value)

        def comm_options(self, **kw: Any) -> str:
            tf.distribute.experimental.CommunicationOptions(**kw)
            return "ok"

        def length(self, v: Any) -> int:
            return len(v)

    api = TfApi()

    def skeleton(x: Any, leaves: list[Any]) -> Any:
        k = kind(x)
        if k in ("PerReplica", "Mirrored"):
            return (k, [skeleton(c, leaves) for c in x.values])
        if k == "array":
            leaves.append(tf.identity(x) if isinstance(x, tf.Variable) else x)
            return ("leaf", len(leaves) - 1)
        if isinstance(x, tuple) and hasattr(x, "_fields"):
            return ("nt", type(x), [skeleton(v, leaves) for v in x])
        if isinstance(x, list | tuple):
            return (type(x).__name__, [skeleton(v, leaves) for v in x])
        if isinstance(x, dict):
            return ("dict", type(x), {k: skeleton(v, leaves) for k, v in x.items()})
        return ("py", x)

    def rebuild(s: Any, leaves: Any) -> Any:
        tag = s[0]
        if tag == "PerReplica":
            return tf_values.PerReplica(tuple(rebuild(c, leaves) for c in s[1]))
        if tag == "Mirrored":
            return tf_values.Mirrored(tuple(rebuild(c, leaves) for c in s[1]))
        if tag == "leaf":
            return leaves[s[1]]
        if tag == "nt":
            return s[1](*[rebuild(c, leaves) for c in s[2]])
        if tag in ("list", "tuple"):
            items = [rebuild(c, leaves) for c in s[1]]
            return items if tag == "list" else tuple(items)
        if tag == "dict":
            return s[1]({k: rebuild(v, leaves) for k, v in s[2].items()})
        return s[1]

    def run_case(prog: P.Program, mode: str) -> Any:
        if mode == "eager":
            return P.drive_sync(prog.fn(api))
        holder: list[Any] = []

        @tf.function
        def f() -> Any:
            leaves: list[Any] = []
            holder.append(skeleton(P.drive_sync(prog.fn(api)), leaves))
            return leaves

        leaves = f()
        return rebuild(holder[-1], leaves)

    cases = _cases(n, _skip(n))
    for i in range(start, len(cases)):
        prog, mode = cases[i]
        t0 = time.monotonic()
        aborting = False
        try:
            result = P.canon(run_case(prog, mode), kind, lambda t: t.numpy())
        except Exception as exc:
            result = P.canon_error(exc)
            aborting = isinstance(exc, tf.errors.OpError)
        line = {"i": i, "case": f"{prog.name}|{mode}", "result": result}
        line["seconds"] = round(time.monotonic() - t0, 3)
        sys.stdout.write(json.dumps(line) + "\n")
        sys.stdout.flush()
        if aborting:
            sys.exit(3)
    sys.exit(0)


# --------------------------------------------------------------------------------------
# Parent


def record(n: int, skip: frozenset[str]) -> dict[str, Any]:
    """Record the cases of N replicas not in ``skip``; restart the child after an abort."""
    _skip_file(n).write_text(json.dumps(sorted(skip)))
    cases = _cases(n, skip)
    results: dict[str, Any] = {}
    start = 0
    while start < len(cases):
        proc = subprocess.Popen(
            [sys.executable, __file__, "--child", str(n), "--start", str(start)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ)
        last = start - 1
        while True:
            if not sel.select(timeout=CASE_TIMEOUT):
                proc.kill()
                name = f"{cases[last + 1][0].name}|{cases[last + 1][1]}"
                results[name] = {"error": "Hang", "class": "Hang", "message": "timed out"}
                last += 1
                break
            line = proc.stdout.readline()
            if not line:
                break
            data = json.loads(line)
            results[data["case"]] = data["result"]
            last = data["i"]
        proc.wait()
        if proc.returncode not in (0, 3) and last + 1 < len(cases) and proc.returncode != -9:
            name = f"{cases[last + 1][0].name}|{cases[last + 1][1]}"
            results[name] = {"error": "Crash", "class": "Crash", "message": str(proc.returncode)}
            last += 1
        start = last + 1
        sys.stderr.write(f"N={n}: {start}/{len(cases)} cases\n")
    return results


def main() -> None:
    """Record the golden files (or, with --child, run one child process)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="*", default=list(P.NS))
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--start", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument(
        "--missing",
        action="store_true",
        help="record only the cases missing from the existing files (new programs)",
    )
    args = parser.parse_args()
    if args.child is not None:
        child(args.child, args.start)
        return
    import tensorflow as tf

    for n in args.n:
        t0 = time.monotonic()
        path = GOLDEN / f"tf_n{n}.json"
        kept: dict[str, Any] = {}
        if args.missing and path.exists():
            old = json.loads(path.read_text())
            if old["tensorflow"] != tf.__version__:
                sys.exit(f"{path} was recorded by TF {old['tensorflow']}: record it all again")
            wanted = {f"{p.name}|{m}" for p, m in _cases(n)}
            kept = {k: v for k, v in old["cases"].items() if k in wanted}
        try:
            results = {**kept, **record(n, frozenset(kept))}
        finally:
            _skip_file(n).unlink(missing_ok=True)
        out = {
            "tensorflow": tf.__version__,
            "recorded_by": "scripts/record_tf_golden.py",
            "num_replicas": n,
            "strategy": f"MirroredStrategy({[f'CPU:{i}' for i in range(n)]})",
            "cases": dict(sorted(results.items())),
        }
        path.write_text(json.dumps(out, indent=1, sort_keys=False) + "\n")
        sys.stderr.write(f"wrote {path} ({len(results)} cases, {time.monotonic() - t0:.0f} s)\n")


if __name__ == "__main__":
    main()
