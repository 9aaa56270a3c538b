"""Replica programs written once, run on TensorFlow (to record) and on asyncreplica (to compare).

A program is a generator function ``prog(api)``. Every call that communicates is
written ``result = yield api.something(...)``: on TensorFlow ``api.something`` runs at
once and the driver sends its result back, on asyncreplica it returns an awaitable
and the driver awaits it. A replica step is a generator ``step(api, ctx, *args)``
run with ``yield api.run(step, args)``; a merge function is a generator (or a plain
function) ``merge_fn(api, strategy, *args, **kwargs)``. Values are built from numpy
(``value_fn(replica_id, num_replicas)``); the TensorFlow adapter turns arrays into
tensors.

Each framework has an adapter (``scripts/record_tf_golden.py`` for TensorFlow,
``ArApi`` here for asyncreplica) with the same methods. :func:`canon` turns any
result into JSON: values, dtypes, shapes, ``PerReplica`` vs ``Mirrored`` vs plain,
container types, and for an error its built-in class.

A program whose asyncreplica result differs from TensorFlow's on purpose carries a
``deliberate`` reason: a phrase that appears in a line of docs/migration.md (checked
by tests/test_tf_golden.py).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Generator, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

NS = (1, 2, 3, 4, 8)
MODES = ("eager", "function")


class NT(NamedTuple):
    a: Any
    b: Any


# --------------------------------------------------------------------------------------
# Drivers


def drive_sync(gen: Any) -> Any:
    """Run a program generator whose yields are already results (TensorFlow)."""
    if not inspect.isgenerator(gen):
        return gen
    try:
        x = next(gen)
        while True:
            x = gen.send(x)
    except StopIteration as stop:
        return stop.value


async def drive_async(gen: Any) -> Any:
    """Run a program generator whose yields are awaitables (asyncreplica)."""
    if not inspect.isgenerator(gen):
        return gen
    try:
        x = next(gen)
        while True:
            x = gen.send(await x)
    except StopIteration as stop:
        return stop.value


# --------------------------------------------------------------------------------------
# Canonical form


def builtin_class(exc: BaseException) -> str:
    """The first built-in class in the exception's MRO (TF's OpError gives Exception)."""
    for cls in type(exc).__mro__:
        if cls.__module__ == "builtins":
            return cls.__name__
    return "BaseException"


def canon(x: Any, kind: Callable[[Any], str | None], to_numpy: Callable[[Any], Any]) -> Any:
    """JSON form of a result.

    ``kind(x)`` names a framework type: ``"PerReplica"``, ``"Mirrored"``, ``"array"``
    (a tensor or array, converted with ``to_numpy``) or None.
    """
    k = kind(x)
    if k in ("PerReplica", "Mirrored"):
        return {k: [canon(c, kind, to_numpy) for c in x.values]}
    if k == "IndexedSlices":
        shape = x.dense_shape
        dense = shape if isinstance(shape, tuple | list) else to_numpy(shape)
        return {
            "IndexedSlices": [
                canon(x.values, kind, to_numpy),
                canon(x.indices, kind, to_numpy),
                [int(d) for d in np.asarray(dense).reshape(-1)],
            ]
        }
    if k == "array" or isinstance(x, np.ndarray | np.generic):
        a = np.asarray(to_numpy(x) if k == "array" else x)
        value: Any
        if a.dtype.kind == "c":
            value = [[float(v.real), float(v.imag)] for v in a.reshape(-1)]
        elif a.dtype.kind == "b":
            value = a.astype(int).reshape(-1).tolist()
        else:
            value = a.astype(np.float64).reshape(-1).tolist()
        return {"array": a.dtype.name, "shape": list(a.shape), "value": value}
    if isinstance(x, bool | int | float | str) or x is None:
        return {"py": type(x).__name__, "value": x}
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return {"namedtuple": type(x).__name__, "items": [canon(v, kind, to_numpy) for v in x]}
    if isinstance(x, list | tuple):
        return {type(x).__name__: [canon(v, kind, to_numpy) for v in x]}
    if isinstance(x, Mapping):
        return {
            "mapping": type(x).__name__,
            "items": {str(k): canon(x[k], kind, to_numpy) for k in sorted(x, key=str)},
        }
    return {"object": type(x).__name__}


def canon_error(exc: BaseException) -> dict[str, str]:
    text = str(exc).strip()
    # tf.function prefixes the error with the traced call stack: keep its last line.
    message = text.splitlines()[-1] if "in user code" in text else text
    return {"error": builtin_class(exc), "class": type(exc).__name__, "message": message[:300]}


def same(a: Any, b: Any) -> bool:
    """Whether two canonical results agree (error messages and class names may differ)."""
    if isinstance(a, dict) and isinstance(b, dict):
        if "error" in a or "error" in b:
            return a.get("error") == b.get("error")
        if "array" in a:
            if "array" not in b or a["array"] != b["array"] or a["shape"] != b["shape"]:
                return False
            va, vb = np.asarray(a["value"], float), np.asarray(b["value"], float)
            return va.shape == vb.shape and bool(
                np.allclose(va, vb, rtol=1e-3, atol=1e-6, equal_nan=True)
            )
        if "py" in a:
            if a.get("py") != b.get("py"):
                return False
            if isinstance(a["value"], float) and isinstance(b["value"], float):
                return math.isclose(a["value"], b["value"], rel_tol=1e-6) or (
                    math.isnan(a["value"]) and math.isnan(b["value"])
                )
            return bool(a["value"] == b["value"])
        if a.keys() != b.keys():
            return False
        return all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


# --------------------------------------------------------------------------------------
# Programs


@dataclass(frozen=True)
class Program:
    name: str
    fn: Callable[[Any], Any]
    modes: tuple[str, ...] = MODES
    ns: tuple[int, ...] = NS
    # Why asyncreplica differs on purpose: a phrase from a line of docs/migration.md,
    # for every mode, or per mode ({"function": ...} for a tf.function-only difference).
    deliberate: str | dict[str, str] | None = None

    def reason(self, mode: str, n: int) -> str | None:
        if isinstance(self.deliberate, dict):
            return self.deliberate.get(f"{mode}/N={n}") or self.deliberate.get(mode)
        return self.deliberate

    def reasons(self) -> set[str]:
        if isinstance(self.deliberate, dict):
            return set(self.deliberate.values())
        return {self.deliberate} if self.deliberate else set()


PROGRAMS: list[Program] = []


def program(
    name: str,
    *,
    modes: tuple[str, ...] = MODES,
    ns: tuple[int, ...] = NS,
    deliberate: str | dict[str, str] | None = None,
) -> Callable[[Callable[[Any], Any]], Callable[[Any], Any]]:
    def register(fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
        PROGRAMS.append(Program(name, fn, modes, ns, deliberate))
        return fn

    return register


def add(name: str, fn: Callable[[Any], Any], **kw: Any) -> None:
    program(name, **kw)(fn)


Gen = Generator[Any, Any, Any]

D_DTYPES = "dtypes TF refuses in collectives"
D_SAME_OBJECT = "a value that is the same object on every replica"
D_INT_MEAN_ONE = "MEAN of integers with one replica"
D_PY_NUMBERS = "Python numbers are values"
D_EMPTY = "all_reduce(())"
D_GATHER_NEG = "gather(axis=-1)"
D_NEST_GATHER = "gather` of a nest gathers every leaf"
D_REPLICA_ID = "replica_id_in_sync_group` is a Python `int`"
D_MORE_OPS = "More collectives and reduce ops"
D_ERRORS = "Error classes"
D_GRAPH = "There is no graph mode"
D_REDUCE_PY = "reduce` of `PerReplica` Python numbers"
D_ZERO_SUM = "SUM` of a value that is not distributed raises"
D_NEST_REDUCE_AXIS = "reduce(axis=...)` of a nest reduces every leaf"
D_LIST_AXIS = "A list `axis` works"
D_MIRRORED_REDUCE = "Strategy.reduce` of a `Mirrored` value reduces its components"
D_NO_OVERFLOW = "The mean of integers does not overflow"
D_BATCH_ONE_DEVICE = "batch_reduce_to` with a one-device destination"
D_PACK = "whether such a list reduces at all depends on `bytes_per_pack`"
# TF 2.21 inside tf.function with one replica: all_reduce raises "destinations can not
# be empty" (a traced value has no device yet).
N1F = {"function/N=1": D_GRAPH}


def arange(shape: tuple[int, ...], dtype: str, r: int) -> Any:
    size = int(np.prod(shape)) if shape else 1
    return (np.arange(size) % 5 + r + 1).astype(dtype).reshape(shape)


# -- all_reduce over dtypes ------------------------------------------------------------


def _all_reduce_prog(op: str, dtype: str, shape: tuple[int, ...]) -> Callable[[Any], Gen]:
    def prog(api: Any) -> Gen:
        pr = api.per_replica(lambda r, n: arange(shape, dtype, r))

        def step(api: Any, ctx: Any, x: Any) -> Gen:
            return (yield api.all_reduce(ctx, op, x))

        return (yield api.run(step, (pr,)))

    return prog


for _dtype in ("float16", "float32", "float64", "int32", "int64"):
    for _op in ("SUM", "MEAN"):
        for _shape in ((), (3,), (2, 2)):
            add(
                f"all_reduce/{_op}/{_dtype}/{'x'.join(map(str, _shape)) or 'scalar'}",
                _all_reduce_prog(_op, _dtype, _shape),
                deliberate=D_INT_MEAN_ONE if _op == "MEAN" and _dtype.startswith("int") else N1F,
            )
for _dtype in ("int8", "uint8", "int16", "complex64", "bool"):
    add(
        f"all_reduce/SUM/{_dtype}/3",
        _all_reduce_prog("SUM", _dtype, (3,)),
        deliberate=D_DTYPES,
    )
add("all_reduce/sum_lowercase/float32", _all_reduce_prog("sum", "float32", (2,)), deliberate=N1F)


@program("all_reduce/MAX_is_not_a_tf_op", deliberate=D_MORE_OPS)
def _all_reduce_max(api: Any) -> Gen:
    pr = api.per_replica(lambda r, n: arange((2,), "float32", r))

    def step(api: Any, ctx: Any, x: Any) -> Gen:
        return (yield api.all_reduce(ctx, "MAX", x))

    return (yield api.run(step, (pr,)))


# -- all_reduce over nests -------------------------------------------------------------


def _nest_prog(make: Callable[[int], Any], op: str = "SUM") -> Callable[[Any], Gen]:
    def prog(api: Any) -> Gen:
        pr = api.per_replica(lambda r, n: make(r))

        def step(api: Any, ctx: Any, x: Any) -> Gen:
            return (yield api.all_reduce(ctx, op, x))

        return (yield api.run(step, (pr,)))

    return prog


def f32(*v: float) -> Any:
    return np.array(v, np.float32)


add("nest/dict", _nest_prog(lambda r: {"b": f32(r), "a": f32(r, 2 * r)}), deliberate=N1F)
add("nest/tuple", _nest_prog(lambda r: (f32(r), f32(1, r))), deliberate=N1F)
add("nest/list", _nest_prog(lambda r: [f32(r), f32(1, r)]), deliberate=N1F)
add("nest/namedtuple", _nest_prog(lambda r: NT(a=f32(r), b=f32(r + 1)), "MEAN"), deliberate=N1F)
add(
    "nest/deep",
    _nest_prog(
        lambda r: {
            "x": [np.float32(r), np.float32(r * 10.0)],
            "y": (np.float32(r + 1.0),),
            "z": NT(a=np.float32(r), b=np.full([2], r, np.float32)),
        }
    ),
    deliberate=N1F,
)
add(
    "nest/mixed_int32_float32",
    _nest_prog(lambda r: (np.array([r], np.int32), f32(r))),
    deliberate=D_DTYPES,
)
add(
    "nest/int64_float64",
    _nest_prog(lambda r: (np.array([r], np.int64), np.array([r], np.float64))),
    deliberate={"function": D_PACK},
)


def _empty_prog(empty: Any) -> Callable[[Any], Gen]:
    def prog(api: Any) -> Gen:
        def step(api: Any, ctx: Any) -> Gen:
            return (yield api.all_reduce(ctx, "SUM", empty))

        return (yield api.run(step, ()))

    return prog


add("nest/empty_tuple", _empty_prog(()), deliberate=D_EMPTY)
add("nest/empty_dict", _empty_prog({}), deliberate=D_EMPTY)
add("nest/empty_list", _empty_prog([]), deliberate=D_EMPTY)


@program("all_reduce/same_object_sum", deliberate=D_SAME_OBJECT)
def _same_object(api: Any) -> Gen:
    shared = api.const(f32(1, 2))

    def step(api: Any, ctx: Any) -> Gen:
        return (yield api.all_reduce(ctx, "SUM", shared))

    return (yield api.run(step, ()))


@program("all_reduce/same_object_mean", deliberate={"function": D_GRAPH})
def _same_object_mean(api: Any) -> Gen:
    shared = api.const(f32(1, 2))

    def step(api: Any, ctx: Any) -> Gen:
        return (yield api.all_reduce(ctx, "MEAN", shared))

    return (yield api.run(step, ()))


@program("all_reduce/same_object_mixed_nest", deliberate=D_SAME_OBJECT)
def _same_object_mixed(api: Any) -> Gen:
    shared = api.const(f32(1, 2))
    pr = api.per_replica(lambda r, n: f32(r, r))

    def step(api: Any, ctx: Any, x: Any) -> Gen:
        return (yield api.all_reduce(ctx, "SUM", (shared, x)))

    return (yield api.run(step, (pr,)))


@program("all_reduce/python_float", deliberate=D_PY_NUMBERS)
def _python_float(api: Any) -> Gen:
    pr = api.per_replica(lambda r, n: float(r + 1))

    def step(api: Any, ctx: Any, x: Any) -> Gen:
        return (yield api.all_reduce(ctx, "SUM", x))

    return (yield api.run(step, (pr,)))


@program("all_reduce/two_in_a_row", deliberate=N1F)
def _two_in_a_row(api: Any) -> Gen:
    pr = api.per_replica(lambda r, n: f32(r, 1))

    def step(api: Any, ctx: Any, x: Any) -> Gen:
        a = yield api.all_reduce(ctx, "SUM", x)
        b = yield api.all_reduce(ctx, "MEAN", x)
        return a, b

    return (yield api.run(step, (pr,)))


# -- all_gather ------------------------------------------------------------------------


def _gather_prog(make: Callable[[int], Any], axis: int) -> Callable[[Any], Gen]:
    def prog(api: Any) -> Gen:
        pr = api.per_replica(lambda r, n: make(r))

        def step(api: Any, ctx: Any, x: Any) -> Gen:
            return (yield api.all_gather(ctx, x, axis))

        return (yield api.run(step, (pr,)))

    return prog


add("all_gather/axis0", _gather_prog(lambda r: np.full((2, 2), r, np.float32), 0))
add("all_gather/axis1", _gather_prog(lambda r: np.full((2, 2), r, np.float32), 1))
add("all_gather/uneven", _gather_prog(lambda r: np.full((1 + r,), r, np.float32), 0))
add("all_gather/int32_axis_minus1", _gather_prog(lambda r: np.full((2, 1), r, np.int32), -1))
add(
    "all_gather/float_axis_minus1",
    _gather_prog(lambda r: np.full((2, 1), r, np.float32), -1),
    deliberate="`all_gather` accepts negative axes",
)
add(
    "all_gather/docstring_nest",
    _gather_prog(
        lambda r: {
            "a": np.array([r], np.int64),
            "b": np.arange(2 * r, 2 * r + 2 * (1 + r % 2), dtype=np.int64).reshape(-1, 2),
        },
        0,
    ),
)
add("all_gather/scalar", _gather_prog(lambda r: np.float32(r), 0), deliberate=D_ERRORS)


# -- merge_call ------------------------------------------------------------------------

SHARED = "shared"


@program("merge_call/regroup_args")
def _merge_regroup(api: Any) -> Gen:
    pr = api.per_replica(lambda r, n: (np.int64(r * 10), np.int64(r)))

    def mf(api: Any, strategy: Any, a: Any, b: Any, c: Any, *, k: Any) -> Any:
        return {"a": a, "b": b, "c": c, "k": k}

    def step(api: Any, ctx: Any, x: Any) -> Gen:
        return (yield api.merge_call(ctx, mf, (x[0], [x[1], 5], SHARED), {"k": {"x": x[1]}}))

    return (yield api.run(step, (pr,)))


@program("merge_call/returns_reduce")
def _merge_reduce(api: Any) -> Gen:
    pr = api.per_replica(lambda r, n: f32(r, 1))

    def mf(api: Any, strategy: Any, v: Any) -> Gen:
        return (yield api.reduce("SUM", v, None))

    def step(api: Any, ctx: Any, x: Any) -> Gen:
        return (yield api.merge_call(ctx, mf, (x,)))

    return (yield api.run(step, (pr,)))


@program("merge_call/returns_per_replica_reversed")
def _merge_reversed(api: Any) -> Gen:
    pr = api.per_replica(lambda r, n: f32(r))

    def mf(api: Any, strategy: Any, v: Any) -> Any:
        return api.make_per_replica(list(reversed(api.local_results(v))))

    def step(api: Any, ctx: Any, x: Any) -> Gen:
        return (yield api.merge_call(ctx, mf, (x,)))

    return (yield api.run(step, (pr,)))


@program("merge_call/nested_merge_call_error")
def _merge_nested(api: Any) -> Gen:
    def inner(api: Any, strategy: Any) -> Any:
        return 1

    def mf(api: Any, strategy: Any, ctx: Any) -> Gen:
        return (yield api.merge_call(ctx, inner, ()))

    def step(api: Any, ctx: Any) -> Gen:
        return (yield api.merge_call(ctx, mf, (ctx,)))

    return (yield api.run(step, ()))


@program("merge_call/call_for_each_replica_inside", modes=("eager",))
def _merge_cfer(api: Any) -> Gen:
    pr = api.per_replica(lambda r, n: f32(r))

    def inner(api: Any, ctx: Any, x: Any) -> Any:
        return x

    def mf(api: Any, strategy: Any, v: Any) -> Gen:
        return (yield api.call_for_each_replica(inner, (v,)))

    def step(api: Any, ctx: Any, x: Any) -> Gen:
        return (yield api.merge_call(ctx, mf, (x,)))

    return (yield api.run(step, (pr,)))


# -- run's return values and context facts ---------------------------------------------


def _run_returns(make: Callable[[Any, Any, Any], Any]) -> Callable[[Any], Gen]:
    def prog(api: Any) -> Gen:
        pr = api.per_replica(lambda r, n: np.int32(r))

        def step(api: Any, ctx: Any, x: Any) -> Any:
            return make(api, ctx, x)

        return (yield api.run(step, (pr,)))

    return prog


add("run/literal", _run_returns(lambda api, ctx, x: 1))
add("run/none", _run_returns(lambda api, ctx, x: None), modes=("eager",))
add("run/string", _run_returns(lambda api, ctx, x: "abc"), modes=("eager",))
add("run/per_replica_arg", _run_returns(lambda api, ctx, x: x))
add("run/dict_mixed", _run_returns(lambda api, ctx, x: {"a": x, "b": 7}))
add("run/tuple_mixed", _run_returns(lambda api, ctx, x: (api.const(f32(1)) + 0, 2)))
add("run/list", _run_returns(lambda api, ctx, x: [x, x]))
add("run/namedtuple", _run_returns(lambda api, ctx, x: NT(a=x, b=3)))
add(
    "run/context_facts",
    _run_returns(
        lambda api, ctx, x: {
            "num": ctx.num_replicas_in_sync,
            "cross": api.in_cross_replica_context(),
            "has": api.has_strategy(),
        }
    ),
)
add(
    "run/replica_id",
    _run_returns(lambda api, ctx, x: ctx.replica_id_in_sync_group),
    deliberate=D_REPLICA_ID,
)


@program("run/args_not_a_tuple", modes=("eager",))
def _run_bad_args(api: Any) -> Gen:
    def step(api: Any, ctx: Any, x: Any) -> Any:
        return x

    return (yield api.run(step, f32(1)))


@program("context/cross_replica_facts", modes=("eager",))
def _cross_facts(api: Any) -> Gen:
    with api.scope():
        facts = {
            "cross": api.in_cross_replica_context(),
            "has": api.has_strategy(),
            "ctx_is_none": api.replica_context_is_none(),
        }
    return facts
    yield


@program("context/cluster_resolver", modes=("eager",))
def _cluster_resolver(api: Any) -> Gen:
    return api.cluster_resolver() is None
    yield


def _local_results_prog(make: Callable[[Any], Any]) -> Callable[[Any], Gen]:
    def prog(api: Any) -> Gen:
        return api.local_results(make(api))
        yield

    return prog


add(
    "local_results/per_replica",
    _local_results_prog(lambda api: api.per_replica(lambda r, n: f32(r))),
)
add("local_results/empty_tuple", _local_results_prog(lambda api: ()), modes=("eager",))
add("local_results/empty_dict", _local_results_prog(lambda api: {}), modes=("eager",))
add("local_results/plain_nest", _local_results_prog(lambda api: (5, api.const(f32(1)))))
add("local_results/plain_array", _local_results_prog(lambda api: api.const(f32(2))))
add(
    "local_results/nest_with_per_replica",
    _local_results_prog(lambda api: (5, api.per_replica(lambda r, n: f32(r)))),
)


# -- strategy.reduce ---------------------------------------------------------------------


def _reduce_prog(op: str, make: Callable[[int, int], Any], axis: Any) -> Callable[[Any], Gen]:
    def prog(api: Any) -> Gen:
        pr = api.per_replica(make)
        return (yield api.reduce(op, pr, axis))

    return prog


def even(dtype: str) -> Callable[[int, int], Any]:
    return lambda r, n: (np.arange(6).reshape(2, 3) + r).astype(dtype)


def uneven_rows(r: int, n: int) -> Any:
    return np.full((r % 3, 2), r + 1, np.float32)


for _op in ("SUM", "MEAN"):
    for _axis_name, _axis in (("None", None), ("0", 0), ("1", 1), ("-1", -1), ("0_1", (0, 1))):
        for _dname, _make in (
            ("float32", even("float32")),
            ("int32", even("int32")),
            ("int64", even("int64")),
        ):
            add(
                f"reduce/{_op}/axis{_axis_name}/{_dname}",
                _reduce_prog(_op, _make, _axis),
                deliberate=D_INT_MEAN_ONE
                if _op == "MEAN" and _axis is None and _dname.startswith("int")
                else None,
            )
        if _axis_name in ("0", "0_1"):
            add(f"reduce/{_op}/axis{_axis_name}/uneven", _reduce_prog(_op, uneven_rows, _axis))
    add(
        f"reduce/{_op}/axis_list",
        _reduce_prog(_op, even("float32"), [0]),
        deliberate=D_LIST_AXIS,
    )
    add(
        f"reduce/{_op}/different_ranks",
        _reduce_prog(
            _op,
            lambda r, n: np.ones((3, 2), np.float32) if r == 0 else np.ones((0,), np.float32),
            0,
        ),
        deliberate=D_ERRORS,
    )
    add(f"reduce/{_op}/axis_out_of_range", _reduce_prog(_op, even("float32"), 2))
add("reduce/axis_str", _reduce_prog("SUM", even("float32"), "0"))
add("reduce/SUM/int8_axis0", _reduce_prog("SUM", even("int8"), 0))
add(
    "reduce/MEAN/int8_axisNone_overflow",
    _reduce_prog("MEAN", lambda r, n: np.full((2,), 100, np.int8), None),
    deliberate=D_NO_OVERFLOW,
)
add(
    "reduce/MEAN/int64_axisNone_big",
    _reduce_prog("MEAN", lambda r, n: np.full((1,), 2**62, np.int64), None),
    deliberate={"eager/N=1": D_INT_MEAN_ONE, "eager": D_NO_OVERFLOW, "function": D_NO_OVERFLOW},
)
add("reduce/SUM/partial_batch", _reduce_prog("SUM", lambda r, n: f32(*range(4 - 2 * (r % 2))), 0))
add("reduce/MEAN/partial_batch", _reduce_prog("MEAN", lambda r, n: f32(*range(4 - 2 * (r % 2))), 0))
add(
    "reduce/SUM/per_replica_python_ints",
    _reduce_prog("SUM", lambda r, n: r + 1, None),
    deliberate=D_REDUCE_PY,
    modes=("eager",),
)


@program("reduce/nest_axisNone")
def _reduce_nest(api: Any) -> Gen:
    pr = api.per_replica(lambda r, n: f32(r + 3))
    pr2 = api.per_replica(lambda r, n: f32(r + 1))
    return (yield api.reduce("SUM", (pr, pr2), None))


@program("reduce/nest_axis0", deliberate=D_NEST_REDUCE_AXIS)
def _reduce_nest_axis(api: Any) -> Gen:
    pr = api.per_replica(lambda r, n: f32(r, r + 1))
    return (yield api.reduce("SUM", (pr, pr), 0))


def _reduce_plain(op: str, make: Callable[[], Any]) -> Callable[[Any], Gen]:
    def prog(api: Any) -> Gen:
        return (yield api.reduce(op, api.const(make()), None))

    return prog


add("reduce/SUM/plain", _reduce_plain("SUM", lambda: f32(3)))
add("reduce/MEAN/plain", _reduce_plain("MEAN", lambda: f32(3)))
add("reduce/SUM/plain_zeros", _reduce_plain("SUM", lambda: np.zeros(2)))


@program("reduce/SUM/plain_numpy_zeros", deliberate=D_ZERO_SUM)
def _reduce_numpy_zeros(api: Any) -> Gen:
    return (yield api.reduce("SUM", np.zeros(2), None))


@program("reduce/MEAN/mirrored", modes=("eager",))
def _reduce_mirrored(api: Any) -> Gen:
    m = yield api.broadcast_to(api.const(f32(1, 2)), api.per_replica(lambda r, n: f32(0)))
    return (yield api.reduce("MEAN", m, None))


@program("reduce/SUM/mirrored", modes=("eager",), deliberate=D_MIRRORED_REDUCE)
def _reduce_mirrored_sum(api: Any) -> Gen:
    m = yield api.broadcast_to(api.const(f32(1, 2)), api.per_replica(lambda r, n: f32(0)))
    return (yield api.reduce("SUM", m, None))


@program("reduce/in_replica_context_error", modes=("eager",))
def _reduce_in_replica(api: Any) -> Gen:
    def step(api: Any, ctx: Any) -> Gen:
        return (yield api.reduce("SUM", api.const(f32(1)), None))

    return (yield api.run(step, ()))


# -- strategy.gather ---------------------------------------------------------------------


def _sgather(make: Callable[[int, int], Any], axis: int) -> Callable[[Any], Gen]:
    def prog(api: Any) -> Gen:
        return (yield api.gather(api.per_replica(make), axis))

    return prog


_cube = lambda r, n: (np.arange(6).reshape(1, 2, 3) + r).astype(np.float32)  # noqa: E731
add("gather/axis0", _sgather(_cube, 0))
add("gather/axis1", _sgather(_cube, 1))
add("gather/axis2", _sgather(_cube, 2))
add("gather/axis_minus1", _sgather(_cube, -1), deliberate=D_GATHER_NEG)
add("gather/uneven", _sgather(lambda r, n: np.full((r % 3 + 1, 2), r, np.float32), 0))
add("gather/int32", _sgather(lambda r, n: np.array([[r]], np.int32), 0))


@program("gather/plain")
def _gather_plain(api: Any) -> Gen:
    return (yield api.gather(api.const(f32(1, 2)), 0))


@program("gather/nest", deliberate=D_NEST_GATHER)
def _gather_nest(api: Any) -> Gen:
    g = api.per_replica(lambda r, n: np.array([[r]], np.float32))
    return (yield api.gather((g, g), 0))


# -- values_from_function --------------------------------------------------------------


def _vff(make: Callable[[int, int], Any]) -> Callable[[Any], Gen]:
    def prog(api: Any) -> Gen:
        return api.per_replica(make)
        yield

    return prog


add("values_from_function/array", _vff(lambda r, n: f32(r, n)), modes=("eager",))
add("values_from_function/dict", _vff(lambda r, n: {"x": f32(r), "y": f32(n)}), modes=("eager",))
add("values_from_function/tuple", _vff(lambda r, n: (f32(r), f32(n))), modes=("eager",))
add("values_from_function/python_int", _vff(lambda r, n: r + 1), modes=("eager",))
_SAME = object()


@program("values_from_function/same_object", modes=("eager",))
def _vff_same(api: Any) -> Gen:
    x = api.const(f32(7))
    v = api.values_from_function(lambda ctx: x)
    return api.local_results(v) if api.is_per_replica(v) or api.n == 1 else "not wrapped"
    yield


# -- extended: reduce_to, batch_reduce_to, broadcast_to, update ------------------------


def _reduce_to(op: str, dest: str) -> Callable[[Any], Gen]:
    def prog(api: Any) -> Gen:
        pr = api.per_replica(lambda r, n: f32(r, 2 * r))
        if dest == "device":
            d: Any = "CPU:0"
        elif dest == "self":
            d = pr
        elif dest == "tensor":
            d = api.const(f32(0))
        else:
            d = pr
        value = (pr, pr) if dest == "nest" else pr
        return (yield api.reduce_to(op, value, d))

    return prog


for _op in ("SUM", "MEAN"):
    for _dest in ("device", "self", "tensor", "nest"):
        add(
            f"reduce_to/{_op}/{_dest}",
            _reduce_to(_op, _dest),
            deliberate={"function": D_GRAPH} if _dest == "tensor" else None,
        )


@program("reduce_to/int32_self")
def _reduce_to_int(api: Any) -> Gen:
    pr = api.per_replica(lambda r, n: np.array([r, 1], np.int32))
    return (yield api.reduce_to("SUM", pr, pr))


@program("batch_reduce_to/pairs", deliberate={"eager": D_BATCH_ONE_DEVICE})
def _batch_reduce_to(api: Any) -> Gen:
    a = api.per_replica(lambda r, n: f32(r))
    b = api.per_replica(lambda r, n: f32(1, r))
    return (yield api.batch_reduce_to("SUM", [(a, a), (b, "CPU:0")]))


@program("batch_reduce_to/mean_int64", deliberate=D_INT_MEAN_ONE)
def _batch_reduce_to_mean(api: Any) -> Gen:
    a = api.per_replica(lambda r, n: np.array([r], np.int64))
    b = api.per_replica(lambda r, n: np.array([r, 2 * r], np.int64))
    return (yield api.batch_reduce_to("MEAN", [(a, a), (b, b)]))


@program("batch_reduce_to/not_a_tuple")
def _batch_reduce_to_bad(api: Any) -> Gen:
    a = api.per_replica(lambda r, n: f32(r))
    return (yield api.batch_reduce_to("SUM", [[a, a]]))


@program("broadcast_to/device", modes=("eager",))
def _broadcast_device(api: Any) -> Gen:
    return (yield api.broadcast_to(api.const(f32(1, 2)), "CPU:0"))


@program("broadcast_to/per_replica_dest", modes=("eager",))
def _broadcast_pr(api: Any) -> Gen:
    return (yield api.broadcast_to(api.const(f32(1, 2)), api.per_replica(lambda r, n: f32(r))))


@program("broadcast_to/python_float", modes=("eager",))
def _broadcast_float(api: Any) -> Gen:
    return (yield api.broadcast_to(1.5, "CPU:0"))


def _update(group: bool, with_args: bool) -> Callable[[Any], Gen]:
    def prog(api: Any) -> Gen:
        var = api.mirrored_var(f32(1, 2))
        if with_args:
            d = api.per_replica(lambda r, n: f32(r, r))
            return (yield api.update(var, lambda v, x: v + x, (d,), group))
        return (yield api.update(var, lambda v: v * 2, (), group))

    return prog


add("update/group", _update(True, False), modes=("eager",))
add("update/no_group", _update(False, False), modes=("eager",))
add("update/per_replica_args", _update(True, True), modes=("eager",))


# -- datasets ----------------------------------------------------------------------------


def _dataset(size: int, batch: int, nest: bool = False) -> Callable[[Any], Gen]:
    def prog(api: Any) -> Gen:
        x = np.arange(size, dtype=np.float32)
        full: Any = {"x": x, "y": x.astype(np.int64) * 2} if nest else x
        ds = api.distribute_dataset(full, batch)
        return [api.iterate(ds), len(api.iterate(ds))]
        yield

    return prog


add("dataset/even", _dataset(16, 8), modes=("eager",))
add("dataset/uneven_last_batch", _dataset(10, 4), modes=("eager",))
add("dataset/six_over_n", _dataset(6, 6), modes=("eager",))
add("dataset/dict", _dataset(7, 4, nest=True), modes=("eager",))


def _datasets_fn(size: int, global_batch: int) -> Callable[[Any], Gen]:
    def prog(api: Any) -> Gen:
        facts: list[Any] = []

        def dataset_fn(ctx: Any) -> Any:
            b = ctx.get_per_replica_batch_size(global_batch)
            facts.append(
                [ctx.num_input_pipelines, ctx.input_pipeline_id, ctx.num_replicas_in_sync, b]
            )
            return api.batch_dataset(np.arange(size, dtype=np.float32), b)

        ds = api.datasets_from_function(dataset_fn)
        return [facts, api.iterate(ds), len(api.iterate(ds))]
        yield

    return prog


add("datasets_from_function/even", _datasets_fn(16, 8), modes=("eager",), ns=(1, 2, 4, 8))
add(
    "datasets_from_function/uneven",
    _datasets_fn(11, 8),
    modes=("eager",),
    ns=(1, 2, 4, 8),
    # 11 batches of 1 on 8 replicas: one length, so the epoch ends (TF: a dynamic size).
    deliberate={"eager/N=8": "batches of one length end the epoch"},
)
add("datasets_from_function/not_divisible", _datasets_fn(12, 6), modes=("eager",), ns=(4, 8))


@program("input_context/facts", modes=("eager",), ns=(1,))
def _input_context(api: Any) -> Gen:
    ctx = api.input_context(2, 1, 4)
    out = [ctx.num_input_pipelines, ctx.input_pipeline_id, ctx.num_replicas_in_sync]
    out.append(ctx.get_per_replica_batch_size(8))
    return out
    yield


# -- every dtype TF allows in all_gather, gather and reduce --------------------------------

for _dtype in ("float16", "float32", "float64", "int32", "int64"):
    add(
        f"all_gather/dtype/{_dtype}",
        _gather_prog(lambda r, _d=_dtype: np.full((1 + r % 2, 2), r, _d), 0),
    )
    add(f"gather/dtype/{_dtype}", _sgather(lambda r, n, _d=_dtype: np.full((1 + r % 2,), r, _d), 0))
    for _op in ("SUM", "MEAN"):
        for _axis_name, _axis in (("None", None), ("0", 0)):
            add(
                f"reduce/dtype/{_dtype}/{_op}/axis{_axis_name}",
                _reduce_prog(_op, even(_dtype), _axis),
                deliberate=D_INT_MEAN_ONE
                if _op == "MEAN" and _axis is None and _dtype.startswith("int")
                else None,
            )


# -- more context and error cases -------------------------------------------------------


@program("update/replica_context", modes=("eager",))
def _update_replica(api: Any) -> Gen:
    var = api.mirrored_var(f32(1, 2))
    pr = api.per_replica(lambda r, n: f32(r, r))

    def step(api: Any, ctx: Any, x: Any) -> Gen:
        return (yield api.update(var, lambda v, d: v + d, (x,), True))

    return (yield api.run(step, (pr,)))


@program("run/kwargs")
def _run_kwargs(api: Any) -> Gen:
    pr = api.per_replica(lambda r, n: f32(r))

    def step(api: Any, ctx: Any, *, x: Any, y: Any) -> Any:
        return {"x": x, "y": y}

    return (yield api.run(step, (), {"x": pr, "y": 3}))


@program("errors/gather_in_replica_context", modes=("eager",))
def _gather_in_replica(api: Any) -> Gen:
    def step(api: Any, ctx: Any) -> Gen:
        return (yield api.gather(api.const(f32(1)), 0))

    return (yield api.run(step, ()))


@program("errors/scope_in_replica_context", modes=("eager",))
def _scope_in_replica(api: Any) -> Gen:
    def step(api: Any, ctx: Any) -> Any:
        with api.scope():
            return 1

    return (yield api.run(step, ()))


@program("errors/all_reduce_prod", deliberate=D_MORE_OPS)
def _all_reduce_prod(api: Any) -> Gen:
    pr = api.per_replica(lambda r, n: f32(r + 1))

    def step(api: Any, ctx: Any, x: Any) -> Gen:
        return (yield api.all_reduce(ctx, "prod", x))

    return (yield api.run(step, (pr,)))


@program("errors/reduce_bad_op")
def _reduce_bad_op(api: Any) -> Gen:
    return (yield api.reduce("avg", api.per_replica(lambda r, n: f32(r)), None))


# -- random programs from a fixed seed ----------------------------------------------------


def _random_value(seed: int, r: int, shape: tuple[int, ...], dtype: str) -> Any:
    return np.random.default_rng([seed, r]).integers(-5, 6, size=shape).astype(dtype)


def _random_program(k: int) -> None:
    rng = np.random.default_rng([2021, k])
    kind = ("all_reduce", "reduce", "gather", "all_gather")[k % 4]
    dtype = str(rng.choice(["float32", "float64", "int32", "int64"]))
    op = str(rng.choice(["SUM", "MEAN"]))
    rank = int(rng.integers(1, 3))
    shape = tuple(int(x) for x in rng.integers(1, 4, size=rank))
    container = str(rng.choice(["leaf", "dict", "tuple", "list"]))
    name = f"random/{k:02d}/{kind}/{op if kind in ('all_reduce', 'reduce') else 'concat'}"
    name += f"/{dtype}/{container}"
    int_mean = op == "MEAN" and dtype.startswith("int")

    def box(make: Callable[[int], Any]) -> Callable[[int, int], Any]:
        def value(r: int, n: int) -> Any:
            if container == "dict":
                return {"b": make(r), "a": make(r + 100)}
            if container == "tuple":
                return (make(r), make(r + 100))
            if container == "list":
                return [make(r)]
            return make(r)

        return value

    if kind == "all_reduce":
        make = box(lambda r: _random_value(k, r, shape, dtype))

        def prog(api: Any) -> Gen:
            def step(api: Any, ctx: Any, x: Any) -> Gen:
                return (yield api.all_reduce(ctx, op, x))

            return (yield api.run(step, (api.per_replica(make),)))

        tags = {"function/N=1": D_GRAPH}
        if dtype == "int32" and container in ("tuple", "dict"):
            # TF 2.21 refuses several int32 leaves in one all_reduce ("all on the host
            # or all on the compute devices").
            tags.update(eager=D_DTYPES, function=D_DTYPES)
        if int_mean:
            tags["eager/N=1"] = D_INT_MEAN_ONE
        add(name, prog, deliberate=tags)
    elif kind == "reduce":
        axis: Any = [None, 0, -1, tuple(range(rank))][int(rng.integers(0, 4))]
        make = box(lambda r: _random_value(k, r, shape, dtype))

        def prog(api: Any) -> Gen:
            return (yield api.reduce(op, api.per_replica(make), axis))

        nest = container != "leaf" and axis is not None
        deliberate = D_NEST_REDUCE_AXIS if nest else (D_INT_MEAN_ONE if int_mean else None)
        add(f"{name}/axis{axis}", prog, deliberate=deliberate)
    else:
        axis = int(rng.integers(0, rank))

        def uneven(r: int) -> Any:
            s = list(shape)
            s[axis] = (r + k) % 3 + 1
            return _random_value(k, r, tuple(s), dtype)

        make = box(uneven)
        if kind == "gather":

            def prog(api: Any) -> Gen:
                return (yield api.gather(api.per_replica(make), axis))

            nest = container != "leaf"
            add(f"{name}/axis{axis}", prog, deliberate=D_NEST_GATHER if nest else None)
        else:

            def prog(api: Any) -> Gen:
                def step(api: Any, ctx: Any, x: Any) -> Gen:
                    return (yield api.all_gather(ctx, x, axis))

                return (yield api.run(step, (api.per_replica(make),)))

            add(f"{name}/axis{axis}", prog)


for _k in range(32):
    _random_program(_k)


# == Third round (issue 25): static batches, sparse values, dtypes, the iterator API ==

D_STATIC_BATCH = "batches of one length end the epoch"
D_GET_NEXT_END = "`get_next()` at the end raises `StopIteration`"
D_ONE_REPLICA_CHECKS = "One replica validates as several do"
D_LENIENT = "accepted here and refused by TensorFlow"
D_BROADCAST_DISTRIBUTED = "broadcast_to` of a distributed value returns it unchanged"
D_BPP = "bytes_per_pack` must be an int"
D_BOOL_GATHER = "Booleans are gathered"
D_SMALL_INT_MEAN = "The mean of 8- and 16-bit integers is float64"
D_SPARSE_GATHER_ONE = "`strategy.gather` of `IndexedSlices` is dense with one replica too"


def dtype(name: str) -> Any:
    """A numpy dtype by name; ``bfloat16`` from ml_dtypes (TensorFlow's own)."""
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


# -- distribute_datasets_from_function and experimental_distribute_dataset ---------------


def _dff(make: Callable[[Any], Any]) -> Callable[[Any], Gen]:
    def prog(api: Any) -> Gen:
        ds = api.datasets_from_function(lambda ctx: make(api))
        return [api.iterate(ds), len(api.iterate(ds))]
        yield

    return prog


_I64 = lambda size: np.arange(size, dtype=np.int64)  # noqa: E731
add(
    "dff/static/11_b2_drop",
    _dff(lambda api: api.dataset_of(_I64(11), 2, True)),
    modes=("eager",),
)
add(
    "dff/static/22_b2_drop",
    _dff(lambda api: api.dataset_of(_I64(22), 2, True)),
    modes=("eager",),
)
add(
    "dff/static/13_b3_drop_dict",
    _dff(lambda api: api.dataset_of({"x": _I64(13), "y": _I64(13) * 2.0}, 3, True)),
    modes=("eager",),
)
add("dff/unbatched/scalars_5", _dff(lambda api: api.dataset_of(_I64(5))), modes=("eager",))
add(
    "dff/unbatched/rows_5x2",
    _dff(lambda api: api.dataset_of(np.arange(10.0).reshape(5, 2))),
    modes=("eager",),
)
add("dff/dynamic/9_b2", _dff(lambda api: api.dataset_of(_I64(9), 2)), modes=("eager",))
add(
    "dff/dynamic/10_b2_divisible",
    _dff(lambda api: api.dataset_of(_I64(10), 2)),
    modes=("eager",),
    deliberate={
        "eager/N=2": D_STATIC_BATCH,
        "eager/N=3": D_STATIC_BATCH,
        "eager/N=4": D_STATIC_BATCH,
        "eager/N=8": D_STATIC_BATCH,
    },
)


def _edd(make: Callable[[Any], Any]) -> Callable[[Any], Gen]:
    def prog(api: Any) -> Gen:
        ds = api.distribute(make(api))
        return [api.iterate(ds), len(api.iterate(ds))]
        yield

    return prog


add("edd/unbatched/scalars_5", _edd(lambda api: api.dataset_of(_I64(5))), modes=("eager",))
add(
    "edd/unbatched/rows_3x2",
    _edd(lambda api: api.dataset_of(np.arange(6.0).reshape(3, 2))),
    modes=("eager",),
)
add("edd/batched_drop/10_b4", _edd(lambda api: api.dataset_of(_I64(10), 4, True)), modes=("eager",))


# -- the iterator API -------------------------------------------------------------------


def _iterator_prog(make: Callable[[Any], Any]) -> Callable[[Any], Gen]:
    def prog(api: Any) -> Gen:
        ds = make(api)
        it = api.iterator(ds)
        out: dict[str, Any] = {"spec": api.spec(it.element_spec)}
        out["first"] = it.get_next()
        opt = it.get_next_as_optional()
        out["has"] = bool(opt.has_value())
        out["second"] = opt.get_value() if out["has"] else None
        rest = []
        while True:
            opt = it.get_next_as_optional()
            if not bool(opt.has_value()):
                break
            rest.append(opt.get_value())
        out["rest"] = rest
        out["dataset_spec"] = api.spec(ds.element_spec)
        out["cardinality"] = api.cardinality(ds)
        return out
        yield

    return prog


_edd_10_4 = lambda api: api.distribute(api.dataset_of(_I64(10), 4))  # noqa: E731
_dff_11_2 = lambda api: api.datasets_from_function(  # noqa: E731
    lambda ctx: api.dataset_of(_I64(11), 2, True)
)
add("iterator/edd", _iterator_prog(_edd_10_4), modes=("eager",))
add(
    "iterator/dff_static",
    _iterator_prog(_dff_11_2),
    modes=("eager",),
    # 5 batches on 8 replicas: no complete step, so get_next ends at once.
    deliberate={"eager/N=8": D_GET_NEXT_END},
)


@program("iterator/get_next_at_end", modes=("eager",), deliberate=D_GET_NEXT_END)
def _get_next_end(api: Any) -> Gen:
    it = api.iterator(api.distribute(api.dataset_of(_I64(4), 4)))
    first = it.get_next()
    try:
        return [first, it.get_next()]
    except Exception as exc:  # TF: OutOfRangeError
        return [first, builtin_class(exc)]
    yield


@program("iterator/next_at_end", modes=("eager",))
def _next_end(api: Any) -> Gen:
    it = api.iterator(api.distribute(api.dataset_of(_I64(4), 4)))
    first = next(it)
    try:
        return [first, next(it)]
    except StopIteration as exc:
        return [first, builtin_class(exc)]
    yield


@program("iterator/for_loop_over_iterator", modes=("eager",))
def _for_iterator(api: Any) -> Gen:
    it = api.iterator(api.distribute(api.dataset_of(_I64(8), 4)))
    first = next(it)
    return [first, list(it)]
    yield


@program("iterator/spec_nest", modes=("eager",))
def _spec_nest(api: Any) -> Gen:
    full = {"x": np.arange(8, dtype=np.float32), "y": np.arange(8, dtype=np.int32)}
    ds = api.distribute(api.dataset_of(full, 4))
    return api.spec(ds.element_spec)
    yield


def _dataset_reduce(make: Callable[[Any], Any]) -> Callable[[Any], Gen]:
    def prog(api: Any) -> Gen:
        def fold(api: Any, state: Any, x: Any) -> Gen:
            return state + (yield api.reduce("SUM", x, 0))

        return (yield api.dataset_reduce(make(api), np.int64(0), fold))

    return prog


add("dataset_reduce/edd", _dataset_reduce(_edd_10_4), modes=("eager",))
add("dataset_reduce/dff_static", _dataset_reduce(_dff_11_2), modes=("eager",))


@program("dataset_cardinality/dff_dynamic", modes=("eager",))
def _dff_cardinality(api: Any) -> Gen:
    ds = api.datasets_from_function(lambda ctx: api.dataset_of(_I64(11), 2))
    return api.cardinality(ds)
    yield


# -- IndexedSlices through every cross-replica API -----------------------------------------


def _slices_of(api: Any, r: int) -> Any:
    values = np.full((1 + r % 2, 2), r + 1, np.float32)
    indices = np.arange(r, r + 1 + r % 2, dtype=np.int64) % 4
    return api.slices(values, indices, (4, 2))


def _sparse(api: Any) -> Any:
    return api.per_replica(lambda r, n: _slices_of(api, r))


for _op in ("SUM", "MEAN"):

    @program(f"sparse/reduce/{_op}", modes=("eager",))
    def _sparse_reduce(api: Any, _op: str = _op) -> Gen:
        return (yield api.reduce(_op, _sparse(api), None))

    @program(f"sparse/reduce_to/{_op}/self", modes=("eager",))
    def _sparse_reduce_to(api: Any, _op: str = _op) -> Gen:
        g = _sparse(api)
        return (yield api.reduce_to(_op, g, g))

    @program(f"sparse/reduce_to/{_op}/device", modes=("eager",))
    def _sparse_reduce_to_device(api: Any, _op: str = _op) -> Gen:
        return (yield api.reduce_to(_op, _sparse(api), "CPU:0"))

    @program(f"sparse/batch_reduce_to/{_op}", modes=("eager",))
    def _sparse_batch(api: Any, _op: str = _op) -> Gen:
        g = _sparse(api)
        return (yield api.batch_reduce_to(_op, [(g, g)]))

    @program(f"sparse/all_reduce/{_op}", modes=("eager",))
    def _sparse_all_reduce(api: Any, _op: str = _op) -> Gen:
        def step(api: Any, ctx: Any, x: Any) -> Gen:
            return (yield api.all_reduce(ctx, _op, x))

        return (yield api.run(step, (_sparse(api),)))


@program("sparse/merge_call_reduce_to", modes=("eager",))
def _sparse_merge(api: Any) -> Gen:
    def mf(api: Any, strategy: Any, g: Any) -> Gen:
        return (yield api.reduce_to("SUM", g, g))

    def step(api: Any, ctx: Any, x: Any) -> Gen:
        return (yield api.merge_call(ctx, mf, (x,)))

    return (yield api.run(step, (_sparse(api),)))


@program("sparse/gather", modes=("eager",), deliberate={"eager/N=1": D_SPARSE_GATHER_ONE})
def _sparse_gather(api: Any) -> Gen:
    return (yield api.gather(_sparse(api), 0))


@program("sparse/all_gather", modes=("eager",))
def _sparse_all_gather(api: Any) -> Gen:
    def step(api: Any, ctx: Any, x: Any) -> Gen:
        return (yield api.all_gather(ctx, x, 0))

    return (yield api.run(step, (_sparse(api),)))


# -- every dtype through reduce, gather, all_reduce and all_gather -------------------------

_DTYPES = (
    "bfloat16",
    "float16",
    "float32",
    "float64",
    "int8",
    "uint8",
    "int16",
    "int32",
    "int64",
    "complex64",
    "bool",
)


def _typed(name: str) -> Callable[[int, int], Any]:
    return lambda r, n: (np.arange(4).reshape(2, 2) % 2 + r + 1).astype(dtype(name))


# Collectives TF 2.21 refuses on several replicas (its all_reduce: bfloat16, float16/32/64,
# int32, int64; its all_gather and gather: float16/32/64, int32, int64).
_TF_NO_COLLECTIVE = ("int8", "uint8", "int16", "complex64")
_INTS = ("int8", "uint8", "int16", "int32", "int64")


def _dtype_tags(api: str, dtype: str, op: str = "", axis: Any = 0) -> dict[str, str] | None:
    """The documented differences of a dtypes/* program (the others must agree)."""
    tags: dict[str, str] = {}
    if dtype == "bool" and api in ("reduce", "all_reduce") and axis is None:
        tags = {"eager/N=1": D_ONE_REPLICA_CHECKS, "eager": D_ERRORS}
    elif dtype == "bool" and api in ("gather", "all_gather"):
        tags = {"eager": D_BOOL_GATHER}
    elif dtype in _TF_NO_COLLECTIVE and api in ("all_reduce", "gather", "all_gather"):
        tags = {"eager": D_DTYPES}
    if dtype in _INTS and op == "MEAN" and axis is None:
        tags["eager/N=1"] = D_INT_MEAN_ONE  # TF does no arithmetic with one replica
    if dtype in ("int8", "uint8", "int16") and op == "MEAN" and api == "reduce":
        # TF's truediv gives float32 for 8- and 16-bit integers; here float64
        if axis is None:
            tags.update({f"eager/N={k}": D_SMALL_INT_MEAN for k in NS if k > 1})
        else:
            tags = {"eager": D_SMALL_INT_MEAN}
    if dtype == "bfloat16" and api in ("gather", "all_gather"):
        tags = {f"eager/N={k}": D_DTYPES for k in NS if k > 1}  # TF's gathers refuse it
    return tags or None


for _dtype in _DTYPES:
    for _op in ("SUM", "MEAN"):
        for _axis_name, _axis in (("None", None), ("0", 0)):
            add(
                f"dtypes/reduce/{_dtype}/{_op}/axis{_axis_name}",
                _reduce_prog(_op, _typed(_dtype), _axis),
                modes=("eager",),
                deliberate=_dtype_tags("reduce", _dtype, _op, _axis),
            )
        add(
            f"dtypes/all_reduce/{_dtype}/{_op}",
            _all_reduce_prog(_op, _dtype, (2,))
            if _dtype != "bfloat16"
            else (
                lambda api, _op=_op: (
                    yield api.run(
                        lambda api, ctx, x: (yield api.all_reduce(ctx, _op, x)),
                        (api.per_replica(_typed("bfloat16")),),
                    )
                )
            ),
            modes=("eager",),
            deliberate=_dtype_tags("all_reduce", _dtype, _op, None),
        )
    add(
        f"dtypes/gather/{_dtype}",
        _sgather(_typed(_dtype), 0),
        modes=("eager",),
        deliberate=_dtype_tags("gather", _dtype),
    )
    add(
        f"dtypes/all_gather/{_dtype}",
        _gather_prog(lambda r, _d=_dtype: _typed(_d)(r, 0), 0),
        modes=("eager",),
        deliberate=_dtype_tags("all_gather", _dtype),
    )


@program("dtypes/reduce/mixed_float32_float64", modes=("eager",), deliberate=D_ERRORS)
def _mixed_float(api: Any) -> Gen:
    pr = api.per_replica(lambda r, n: np.ones(2, np.float32 if r % 2 == 0 else np.float64))
    return (yield api.reduce("SUM", pr, None))


@program("dtypes/reduce/mixed_int32_int64_axis0", modes=("eager",), deliberate=D_ERRORS)
def _mixed_int(api: Any) -> Gen:
    pr = api.per_replica(lambda r, n: np.ones(2, np.int32 if r % 2 == 0 else np.int64))
    return (yield api.reduce("SUM", pr, 0))


@program("dtypes/gather/mixed_float32_float64", modes=("eager",), deliberate=D_ERRORS)
def _mixed_gather(api: Any) -> Gen:
    pr = api.per_replica(lambda r, n: np.ones(2, np.float32 if r % 2 == 0 else np.float64))
    return (yield api.gather(pr, 0))


# -- plain (not distributed) values -------------------------------------------------------


@program("plain/reduce_SUM_axis0", modes=("eager",))
def _plain_sum_axis0(api: Any) -> Gen:
    return (yield api.reduce("SUM", api.const(np.array([1.5, 2.5], np.float32)), 0))


@program("plain/reduce_MEAN_axis0", modes=("eager",))
def _plain_mean_axis0(api: Any) -> Gen:
    return (yield api.reduce("MEAN", api.const(np.array([1.5, 2.5], np.float32)), 0))


@program("plain/reduce_SUM_python_float", modes=("eager",))
def _plain_sum_float(api: Any) -> Gen:
    return (yield api.reduce("SUM", 2.5, None))


@program("plain/reduce_SUM_python_int", modes=("eager",))
def _plain_sum_int(api: Any) -> Gen:
    return (yield api.reduce("SUM", 2, None))


@program("plain/reduce_to_SUM_python_float", modes=("eager",))
def _plain_reduce_to_float(api: Any) -> Gen:
    return (yield api.reduce_to("SUM", 2.5, "CPU:0"))


for _op in ("SUM", "MEAN"):
    add(
        f"plain/reduce_to_{_op}_dest_per_replica",
        lambda api, _op=_op: (
            yield api.reduce_to(_op, api.const(f32(1, 2)), api.per_replica(lambda r, n: f32(r)))
        ),
        modes=("eager",),
    )


@program("broadcast_to/per_replica_value_to_device", modes=("eager",))
def _broadcast_pr_value(api: Any) -> Gen:
    return (yield api.broadcast_to(api.per_replica(lambda r, n: f32(r)), "CPU:0"))


@program(
    "broadcast_to/per_replica_value_to_per_replica",
    modes=("eager",),
    deliberate=D_BROADCAST_DISTRIBUTED,
)
def _broadcast_pr_pr(api: Any) -> Gen:
    pr = api.per_replica(lambda r, n: f32(r))
    return (yield api.broadcast_to(pr, pr))


@program("broadcast_to/array_destination", modes=("eager",))
def _broadcast_array_dest(api: Any) -> Gen:
    return (yield api.broadcast_to(api.const(f32(1, 2)), api.const(f32(0))))


# -- what one replica accepts ----------------------------------------------------------------

_ONE = {"eager/N=1": D_ONE_REPLICA_CHECKS}

add(
    "one_replica/all_gather_scalar",
    _gather_prog(lambda r: np.float32(r), 0),
    modes=("eager",),
    deliberate={**_ONE, "eager": D_ERRORS},
)
add(
    "one_replica/all_gather_axis_out_of_range",
    _gather_prog(lambda r: f32(r), 3),
    modes=("eager",),
    deliberate={**_ONE, "eager": D_ERRORS},
)
add(
    "one_replica/all_gather_axis_float",
    _gather_prog(lambda r: f32(r), 1.0),
    modes=("eager",),  # type: ignore[arg-type]
    deliberate={**_ONE, "eager": D_ERRORS},
)
add(
    "one_replica/gather_axis_None",
    _sgather(lambda r, n: f32(r), None),  # type: ignore[arg-type]
    modes=("eager",),
    deliberate={**_ONE, "eager": D_ERRORS},
)
add(
    "one_replica/gather_scalar",
    _sgather(lambda r, n: np.float32(r), 0),
    modes=("eager",),
    deliberate={**_ONE, "eager": D_ERRORS},
)
add(
    "one_replica/gather_axis_out_of_range",
    _sgather(lambda r, n: f32(r), 3),
    modes=("eager",),
    deliberate={**_ONE, "eager": D_ERRORS},
)
_bools = lambda r, n: np.array([True, r == 0])  # noqa: E731
add(
    "one_replica/reduce_bool_SUM",
    _reduce_prog("SUM", _bools, None),
    modes=("eager",),
    deliberate={**_ONE, "eager": D_ERRORS},
)
add(
    "one_replica/reduce_bool_MEAN",
    _reduce_prog("MEAN", _bools, None),
    modes=("eager",),
    deliberate={**_ONE, "eager": D_ERRORS},
)
add(
    "one_replica/all_reduce_bool",
    lambda api: (
        yield api.run(
            lambda api, ctx, x: (yield api.all_reduce(ctx, "SUM", x)), (api.per_replica(_bools),)
        )
    ),
    modes=("eager",),
    deliberate={**_ONE, "eager": D_ERRORS},
)
add(
    "one_replica/gather_bool",
    _sgather(_bools, 0),
    modes=("eager",),
    deliberate={**_ONE, "eager": D_BOOL_GATHER},
)
add(
    "one_replica/all_gather_bool",
    _gather_prog(lambda r: _bools(r, 0), 0),
    modes=("eager",),
    deliberate={**_ONE, "eager": D_BOOL_GATHER},
)
add(
    "one_replica/reduce_axis_float", _reduce_prog("SUM", lambda r, n: f32(r), 1.0), modes=("eager",)
)
add(
    "one_replica/reduce_axis_out_of_range",
    _reduce_prog("SUM", lambda r, n: f32(r), 3),
    modes=("eager",),
)


# -- error classes and leniency -------------------------------------------------------------


@program("errors/run_kwargs_list", modes=("eager",), deliberate=D_ERRORS)
def _run_kwargs_list(api: Any) -> Gen:
    return (yield api.run(lambda api, ctx, **k: 1, (), [("a", 1)]))


@program("errors/merge_call_args_tensor", modes=("eager",), deliberate=D_ERRORS)
def _merge_args_tensor(api: Any) -> Gen:
    def step(api: Any, ctx: Any) -> Gen:
        return (yield api.merge_call(ctx, lambda api, s, *a: 1, api.const(f32(1, 2))))

    return (yield api.run(step, ()))


@program("errors/batch_reduce_to_bare_value", modes=("eager",), deliberate=D_ERRORS)
def _batch_bare(api: Any) -> Gen:
    a = api.per_replica(lambda r, n: f32(r))
    return (yield api.batch_reduce_to("SUM", [a]))


for _name, _value in (("None", None), ("str", "abc")):
    add(
        f"errors/all_reduce_{_name}",
        lambda api, _value=_value: (
            yield api.run(lambda api, ctx: (yield api.all_reduce(ctx, "SUM", _value)), ())
        ),
        modes=("eager",),
        deliberate=D_ERRORS,
    )


@program("errors/reduce_op_None", modes=("eager",), deliberate=D_ERRORS)
def _reduce_op_none(api: Any) -> Gen:
    return (yield api.reduce(None, api.per_replica(lambda r, n: f32(r)), None))


@program("errors/reduce_to_destinations_None", modes=("eager",), deliberate=D_ERRORS)
def _reduce_to_none(api: Any) -> Gen:
    return (yield api.reduce_to("SUM", api.per_replica(lambda r, n: f32(r)), None))


@program("errors/broadcast_to_destinations_None", modes=("eager",), deliberate=D_ERRORS)
def _broadcast_none(api: Any) -> Gen:
    return (yield api.broadcast_to(api.const(f32(1)), None))


@program("leniency/len_per_replica", modes=("eager",), deliberate=D_LENIENT)
def _len_pr(api: Any) -> Gen:
    return api.length(api.per_replica(lambda r, n: f32(r)))
    yield


@program("leniency/reduce_op_lowercase", modes=("eager",), deliberate=D_LENIENT)
def _reduce_op_lower(api: Any) -> Gen:
    return api.reduce_op("sum")
    yield


@program("leniency/reduce_op_upper", modes=("eager",))
def _reduce_op_upper(api: Any) -> Gen:
    return api.reduce_op("SUM")
    yield


@program("leniency/strategy_reduce_mixed_case_name", modes=("eager",))
def _reduce_mixed_case(api: Any) -> Gen:
    return (yield api.reduce("Sum", api.per_replica(lambda r, n: f32(r)), None))


@program("leniency/bytes_per_pack_float", modes=("eager",), deliberate=D_BPP)
def _bpp_float(api: Any) -> Gen:
    return api.comm_options(bytes_per_pack=1.5)
    yield


@program("leniency/bytes_per_pack_negative", modes=("eager",))
def _bpp_negative(api: Any) -> Gen:
    return api.comm_options(bytes_per_pack=-1)
    yield


# -- (issue 25, recorded after the programs above) the padded last step of static batches --


def _optional_steps(make: Callable[[Any], Any]) -> Callable[[Any], Gen]:
    def prog(api: Any) -> Gen:
        it = api.iterator(api.datasets_from_function(lambda ctx: make(api)))
        out = []
        while True:
            opt = it.get_next_as_optional()
            if not bool(opt.has_value()):
                return out
            out.append(opt.get_value())
        yield

    return prog


add(
    "iterator/optional/dff_unbatched_scalars",
    _optional_steps(lambda api: api.dataset_of(_I64(5))),
    modes=("eager",),
)
add(
    "iterator/optional/dff_unbatched_rows",
    _optional_steps(lambda api: api.dataset_of(np.arange(10.0).reshape(5, 2))),
    modes=("eager",),
)
add(
    "iterator/optional/dff_dynamic",
    _optional_steps(lambda api: api.dataset_of(_I64(9), 2)),
    modes=("eager",),
)


@program("dataset_reduce/dff_unbatched_scalars", modes=("eager",))
def _reduce_scalars(api: Any) -> Gen:
    def fold(api: Any, state: Any, x: Any) -> Gen:
        return state + (yield api.reduce("SUM", x, None))

    ds = api.datasets_from_function(lambda ctx: api.dataset_of(_I64(5)))
    return (yield api.dataset_reduce(ds, np.int64(0), fold))


def case_names() -> Iterator[tuple[Program, str]]:
    for p in PROGRAMS:
        for mode in p.modes:
            yield p, mode
