"""Random replica programs, their faults, and a numpy oracle (shared by the property tests).

A :class:`Program` is one sequence of :class:`Step` s that every replica should issue, and
per replica the actions it really takes: the steps (each with the replica's own byte order
and dict key order, which must never matter), faults, checkpoints. The same generator
serves hypothesis (``tests/test_properties.py``) and plain ``random.Random`` seeds (the MPI
property program, which every rank must draw identically): it only asks a
:class:`Chooser` for choices.

The oracle: a program whose replicas all issue the same steps gives exactly what numpy
gives, reduced in replica order (the MEAN of integers being the float64 nearest the exact
mean); any other program raises the right error, never hangs, never returns a number.

Fault kinds (``FAULTS``) and what they test:

* ``skip``, ``extra``, ``change``: a replica skips a step, issues one more, or changes
  one field (kind, shape, dtype, op, source).
* ``swap``: a replica swaps two steps that agree on everything but the line they are
  issued from (found only by comparing call paths); ``swap_deep`` does so through more
  helper frames than the call path used to keep (9 to 12); ``swap_same_line`` swaps two
  collectives that one source line issues; ``swap_task`` swaps two that helper tasks
  issue, each task started from its own line (the task's own frames agree).
* ``raise``: a replica raises; ``cancel``: the run is cancelled from outside.
* ``cycle``: two replicas await the same two named collectives in opposite orders (a
  wait cycle, ``CollectiveDeadlockError``); ``cycle_task`` and ``cycle_gather`` do so
  while awaiting a helper task (``asyncio.ensure_future``) or ``asyncio.gather``.
* ``spawn_then_raise``: a replica starts a helper task that issues a named collective,
  then raises: the helper must not be left pending.

``KNOWN_BROKEN`` lists the fault kinds that fail today because of a bug another change
fixes; they are kept out of the draw (see its comment).
"""

from __future__ import annotations

import asyncio
import functools
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol, TypeVar

import anyio
import anyio.lowlevel
import numpy as np

import asyncreplica as ar

T = TypeVar("T")

KINDS = ("all_reduce", "all_gather", "broadcast", "reduce_scatter", "barrier", "merge_call")
OPS = ("sum", "mean", "min", "max", "prod")
# bool only where it is legal: all_gather, broadcast, merge_call.
DTYPES = ("float32", "float64", "int8", "int32", "int64", "uint8", "bool")
NESTS = ("leaf", "leaf", "list", "dict")
FAULTS = (
    "skip",
    "extra",
    "change",
    "swap",
    "swap_deep",
    "swap_same_line",
    "swap_task",
    "raise",
    "cancel",
    "cycle",
    "cycle_task",
    "cycle_gather",
    "spawn_then_raise",
)
# Fault kinds that fail today because of a bug that another change of issue 14 fixes:
# kept out of the draw until it is merged (then empty this set). Each names its item.
KNOWN_BROKEN: set[str] = set()

# The same, for what fails only across processes (tests/mpi/test_mpi_properties.py),
# with the issue 14 item each one waits for:
KNOWN_BROKEN_MPI: set[str] = set()

# Array libraries a program may build its leaves with (``draw_program(libraries=...)``).
# Only the local property test draws foreign ones: across processes they come back as
# numpy arrays (a documented limit), so the MPI program stays numpy-only.
LIBRARIES = ("numpy", "array_api_strict", "jax", "torch")
# JAX holds 32-bit values only (its default, x64 off): its programs draw no 64-bit dtypes.
_NO_X64 = ("float64", "int64")


def library_dtypes(library: str) -> tuple[str, ...]:
    """The dtypes a program of ``library`` draws from."""
    return tuple(d for d in DTYPES if library != "jax" or d not in _NO_X64)


@functools.cache
def namespace(library: str) -> Any:
    """The array namespace of ``library`` (imported on first use)."""
    if library == "jax":
        import jax.numpy as jnp

        return jnp
    if library == "array_api_strict":
        import array_api_strict

        return array_api_strict
    if library == "torch":
        import torch

        return torch  # torch.asarray: a tensor on the numpy array's memory
    return np


def to_library(a: np.ndarray, library: str) -> Any:
    """``a`` as an array of ``library`` (numpy arrays are returned as they are)."""
    if library == "numpy":
        return a
    return namespace(library).asarray(a.astype(a.dtype.newbyteorder("=")))


def to_numpy(value: Any) -> np.ndarray:
    """An array of any library as a numpy array (through DLPack where it can)."""
    if isinstance(value, np.ndarray | np.generic):
        return np.asarray(value)
    try:
        return np.from_dlpack(value)
    except (AttributeError, BufferError, TypeError, RuntimeError):
        return np.asarray(value)


class Chooser(Protocol):
    """Where the generator's choices come from (hypothesis, or a seeded ``random``)."""

    def choice(self, options: Sequence[T]) -> T: ...

    def integer(self, lo: int, hi: int) -> int: ...


class RandomChooser:
    """Choices from ``random.Random(seed)``: every MPI rank draws the same program."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)

    def choice(self, options: Sequence[T]) -> T:
        return options[self._rng.randrange(len(options))]

    def integer(self, lo: int, hi: int) -> int:
        return self._rng.randint(lo, hi)


@dataclass(frozen=True)
class Step:
    """One collective (or one named pair), as every replica should issue it."""

    kind: str
    op: str | None = None
    shape: tuple[int, ...] = ()
    dtype: str = "float64"
    axis: int | None = None
    source: int | None = None
    seed: int = 0  # varies the values
    nest: str = "leaf"
    site: int = 0  # which of two source lines issues it
    depth: int = 0  # helper frames between the step function and the call
    pair: bool = False  # a twin pair (seed, seed + 1) issued from one line
    swapped: bool = False  # the pair issued in the other order, from the same line
    task: bool = False  # issued in a helper task started from the site's line
    big: bool = False  # int8/uint8 values near 100, whose sum overflows the dtype


@dataclass(frozen=True)
class Variant:
    """How one replica builds a step's value: none of this may change a result."""

    byteorder: str = "="  # "<" or ">" or "="
    keys_reversed: bool = False  # dict keys inserted in reverse order


class Planted(Exception):
    """An exception a replica raises on purpose."""


@dataclass(frozen=True)
class Program:
    n: int
    steps: tuple[Step, ...]
    # Per replica: ("step", Step, Variant) | ("named", index, mode) | ("checkpoint",)
    # | ("sleep0",) | ("raise",) | ("cancel",) | ("spawn_then_raise", index)
    actions: tuple[tuple[tuple[Any, ...], ...], ...]
    faults: tuple[str, ...] = ()
    library: str = "numpy"  # the array library of every step's leaves (not named pairs')

    def collectives(self, rid: int) -> list[Any]:
        out: list[Any] = []
        for a in self.actions[rid]:
            if a[0] == "step":
                out.append(a[1])
            elif a[0] == "named":
                out.append(("named", a[1]))
        return out

    @property
    def consistent(self) -> bool:
        return (
            all(self.collectives(r) == self.collectives(0) for r in range(self.n))
            and not self.has("spawn_then_raise")
            and not self.cycle
        )

    @property
    def cycle(self) -> bool:
        """Some named pair is awaited a-then-b by one replica and b-then-a by another."""
        orders: dict[int, set[str]] = {}
        for acts in self.actions:
            for a in acts:
                if a[0] == "named" and a[2] in SEQUENTIAL:
                    orders.setdefault(a[1], set()).add(SEQUENTIAL[a[2]])
        return any(len(o) > 1 for o in orders.values())

    def has(self, what: str) -> bool:
        return any(a[0] == what for acts in self.actions for a in acts)


# Named pair modes: how a replica issues the collectives "<i>a" and "<i>b". Concurrent
# modes issue both at once (any order is legal); sequential ones await one, then the other.
CONCURRENT = ("taskgroup", "gather", "ensure_future")
# A step issued through this many helper frames (or more) is "deep": the frame that tells
# two sites apart is then the 9th of its call path or further out.
DEEP = 6
SEQUENTIAL = {
    "seq_ab": "ab",
    "seq_ba": "ba",
    "task_ab": "ab",
    "task_ba": "ba",
    "gather_ab": "ab",
    "gather_ba": "ba",
}
ASYNCIO_ONLY = {"gather", "ensure_future", "task_ab", "task_ba", "gather_ab", "gather_ba"}


# Features a caller may turn off (a set of these names): 0-d broadcasts, and int8 or
# uint8 values whose sum overflows the dtype (MEAN must not; MIN and MAX must not care).
SCALAR_BROADCAST = "scalar_broadcast"
BIG_INTS = "big_ints"


def _step(
    c: Chooser,
    n: int,
    seed: int,
    *,
    deep: bool,
    off: frozenset[str] = frozenset(),
    dtypes: Sequence[str] = DTYPES,
) -> Step:
    kind = c.choice(KINDS)
    dtype = c.choice(dtypes)
    nest = c.choice(NESTS)
    site = c.integer(0, 1)
    depth = c.choice((DEEP, 9, 12) if deep else (0, 1, 2, DEEP - 1))
    if kind in ("barrier", "merge_call"):
        return Step(kind, seed=seed, site=site, depth=depth)
    dims = [c.integer(1, 3) for _ in range(c.integer(0, 2))]
    if kind in ("all_reduce", "reduce_scatter") and dtype == "bool":
        dtype = "int8"
    big = dtype in ("int8", "uint8") and BIG_INTS not in off
    common = {"seed": seed, "nest": nest, "site": site, "depth": depth, "dtype": dtype, "big": big}
    if kind == "all_reduce":
        return Step(kind, c.choice(OPS), tuple(dims), **common)  # type: ignore[arg-type]
    if kind == "broadcast":
        if SCALAR_BROADCAST in off and not dims:
            dims = [1]
        return Step(kind, None, tuple(dims), source=c.integer(0, n - 1), **common)  # type: ignore[arg-type]
    if not dims:
        dims = [c.integer(1, 3)]
    axis = c.integer(0, len(dims) - 1)
    if kind == "all_gather":
        return Step(kind, None, tuple(dims), axis=axis, **common)  # type: ignore[arg-type]
    dims[axis] *= n  # reduce_scatter: the axis divides by the number of replicas
    return Step(kind, c.choice(OPS), tuple(dims), axis=axis, **common)  # type: ignore[arg-type]


def _changed(c: Chooser, step: Step, n: int, dtypes: Sequence[str] = DTYPES) -> Step:
    """The same step with one field changed so that replicas must disagree."""
    choices = ["kind"]
    if step.kind not in ("barrier", "merge_call"):
        choices += ["shape", "dtype"]
    if step.op is not None:
        choices.append("op")
    if step.source is not None and n > 1:
        choices.append("source")
    what = c.choice(choices)
    if what == "shape":
        return replace(step, shape=(*step.shape, 2))  # a new trailing axis: never compatible
    if what == "dtype":
        legal = [d for d in dtypes if d != step.dtype]
        if step.op is not None:
            legal.remove("bool")
        return replace(step, dtype=c.choice(legal))
    if what == "op":
        return replace(step, op=c.choice([o for o in OPS if o != step.op]))
    if what == "source":
        assert step.source is not None
        return replace(step, source=(step.source + 1) % n)
    return Step("merge_call" if step.kind == "barrier" else "barrier", seed=step.seed)


def draw_program(
    c: Chooser,
    *,
    n_range: tuple[int, int] = (1, 4),
    faults: Sequence[str] = FAULTS,
    asyncio_only: bool = True,
    byteorders: Sequence[str] = ("=", "<", ">"),
    known_broken: set[str] | None = None,
    named_pairs: bool = True,
    off: frozenset[str] = frozenset(),
    libraries: Sequence[str] = ("numpy",),
) -> Program:
    """Draw one program: its replicas, its steps, and each replica's actions and faults.

    Args:
        c: Where the choices come from.
        n_range: The number of replicas, inclusive.
        faults: The fault kinds to draw from (``KNOWN_BROKEN`` ones are left out).
        asyncio_only: Whether modes that need asyncio (``asyncio.gather``, tasks) may
            be drawn.
        byteorders: The byte orders replicas may pass their values in.
        known_broken: The fault kinds kept out of the draw; ``KNOWN_BROKEN`` by default.
        named_pairs: Whether steps may be pairs of named collectives.
        off: Features not to draw (``SCALAR_BROADCAST``).
        libraries: The array libraries (``LIBRARIES``) the program may build its leaves
            with, one drawn per program; repeat one to draw it more often. Nothing is
            drawn when there is one (the default: numpy), so seeds keep their programs.
    """
    broken = KNOWN_BROKEN if known_broken is None else known_broken
    n = c.integer(*n_range)
    library = c.choice(libraries) if len(set(libraries)) > 1 else libraries[0]
    dtypes = library_dtypes(library)
    allowed = [f for f in faults if f not in broken]
    base: list[Step] = []
    named: list[int] = []
    for i in range(c.integer(0, 5)):
        what = c.choice(("step", "step", "step", "twins", "named", "same_line"))
        if what == "named" and not named_pairs:
            what = "step"
        if what == "twins":
            # Two steps that differ only in the line issuing them (and their values).
            deep = "swap_deep" in allowed and c.integer(0, 1) == 1
            task = "swap_task" in allowed and c.integer(0, 2) == 0
            first = replace(
                _step(c, n, 10 * i, deep=deep, off=off, dtypes=dtypes), site=0, task=task
            )
            base += [first, replace(first, site=1, seed=first.seed + 1)]
        elif what == "same_line":
            first = replace(_step(c, n, 10 * i, deep=False, off=off, dtypes=dtypes), depth=0)
            base.append(replace(first, pair=True))
        elif what == "named":
            named.append(len(base))
            base.append(Step("named", seed=10 * i, shape=(2,), dtype="float64"))
        else:
            base.append(_step(c, n, 10 * i, deep=False, off=off, dtypes=dtypes))
    modes = [m for m in (*CONCURRENT, "seq_ab") if asyncio_only or m not in ASYNCIO_ONLY]
    per_replica: list[tuple[tuple[Any, ...], ...]] = []
    drawn: list[str] = []
    for _ in range(n):
        acts: list[tuple[Any, ...]] = []
        for s in base:
            variant = Variant(c.choice(byteorders), c.integer(0, 1) == 1)
            if s.kind == "named":
                acts.append(("named", s.seed, c.choice(modes)))
            else:
                acts.append(("step", s, variant))
        for _ in range(c.integer(0, 2) if allowed else 0):
            fault = c.choice(allowed)
            if _fault(c, fault, acts, n, asyncio_only, off, dtypes):
                drawn.append(fault)
        for _ in range(c.integer(0, 3)):  # checkpoints never change the outcome
            acts.insert(c.integer(0, len(acts)), (c.choice(("checkpoint", "sleep0")),))
        per_replica.append(tuple(acts))
    # Bugs of KNOWN_BROKEN that any faulty program can hit when a replica awaits its
    # named pair through asyncio.gather or a helper task: a wait cycle (even one that a
    # skipped or extra collective makes) is missed and the program hangs ("cycle_gather",
    # "cycle_task"); a helper task is left pending after the run fails ("spawn_then_raise").
    # While they are broken, faulty programs use a task group instead.
    hidden = {
        "gather": {"cycle_gather"},
        "ensure_future": {"cycle_task", "spawn_then_raise"},
    }
    program = Program(n, tuple(base), tuple(per_replica), tuple(drawn), library)
    if drawn or program.cycle:
        per_replica = [
            tuple(
                ("named", a[1], "taskgroup")
                if a[:1] == ("named",) and hidden.get(a[2], set()) & broken
                else a
                for a in acts
            )
            for acts in per_replica
        ]
        program = Program(n, tuple(base), tuple(per_replica), tuple(drawn), library)
    return program


def _fault(
    c: Chooser,
    fault: str,
    acts: list[tuple[Any, ...]],
    n: int,
    aio: bool,
    off: frozenset[str],
    dtypes: Sequence[str] = DTYPES,
) -> bool:
    """Apply ``fault`` to one replica's actions; False when it does not apply."""
    steps = [i for i, a in enumerate(acts) if a[0] == "step"]
    if fault == "skip" and steps:
        del acts[c.choice(steps)]
    elif fault == "extra":
        extra = _step(c, n, 1000 + len(acts), deep=False, off=off, dtypes=dtypes)
        acts.insert(c.integer(0, len(acts)), ("step", extra, Variant()))
    elif fault == "change" and steps:
        i = c.choice(steps)
        acts[i] = ("step", _changed(c, acts[i][1], n, dtypes), acts[i][2])
    elif fault in ("swap", "swap_deep", "swap_task"):
        twins = [
            i
            for i in steps[:-1]
            if acts[i + 1][0] == "step"
            and acts[i][1].site == 0
            and acts[i + 1][1] == replace(acts[i][1], site=1, seed=acts[i][1].seed + 1)
            and (acts[i][1].depth >= DEEP) == (fault == "swap_deep")
            and acts[i][1].task == (fault == "swap_task")
        ]
        if not twins:
            return False
        i = c.choice(twins)
        acts[i], acts[i + 1] = acts[i + 1], acts[i]
    elif fault == "swap_same_line":
        pairs = [i for i in steps if acts[i][1].pair]
        if not pairs:
            return False
        i = c.choice(pairs)
        acts[i] = ("step", replace(acts[i][1], swapped=True), acts[i][2])
    elif fault in ("raise", "cancel"):
        acts.insert(c.integer(0, len(acts)), (fault,))
    elif fault in ("cycle", "cycle_task", "cycle_gather"):
        pairs = [i for i, a in enumerate(acts) if a[0] == "named"]
        if not pairs or n < 2 or (fault != "cycle" and not aio):
            return False
        i = c.choice(pairs)
        prefix = {"cycle": "seq", "cycle_task": "task", "cycle_gather": "gather"}[fault]
        order = c.choice(("ab", "ba"))
        acts[i] = ("named", acts[i][1], f"{prefix}_{order}")
        # The opposite order somewhere else is what makes the cycle: the generator
        # gives it to this replica's pair only; another replica must draw it too.
    elif fault == "spawn_then_raise":
        if not aio:
            return False
        acts.insert(c.integer(0, len(acts)), ("spawn_then_raise", 5000 + len(acts)))
    else:
        return False
    return True


# -- values and the numpy oracle -------------------------------------------------------------


def leaf_value(step: Step, rid: int, j: int) -> np.ndarray:
    """Leaf ``j`` of replica ``rid``'s value: small integers, or near int8's limit."""
    size = int(np.prod(step.shape, dtype=np.int64))
    base = (np.arange(size, dtype=np.int64).reshape(step.shape) + j) % 3
    if step.dtype == "bool":
        return ((base + rid + step.seed) % 2).astype(bool)
    if step.big and step.op in ("mean", "max", "min"):
        return (base + 100 + rid).astype(step.dtype)  # sums overflow int8: MEAN must not
    return (base + rid + step.seed % 2 + 1).astype(step.dtype)


def leaf_count(step: Step) -> int:
    return 1 if step.nest == "leaf" else 2


def build(step: Step, rid: int, variant: Variant, library: str = "numpy") -> Any:
    """The value replica ``rid`` passes, in its own byte order and dict key order.

    Leaves are ``library``'s arrays; byte orders other than the native one are numpy's.
    """

    def leaf(j: int) -> Any:
        a = leaf_value(step, rid, j)
        if library != "numpy":
            return to_library(a, library)
        if variant.byteorder != "=" and a.dtype.itemsize > 1:
            a = a.astype(a.dtype.newbyteorder(variant.byteorder))
        return a

    if step.nest == "leaf":
        return leaf(0)
    if step.nest == "list":
        return [leaf(0), leaf(1)]
    keys = ["b", "w"] if variant.keys_reversed else ["w", "b"]
    leaves = {"w": leaf(0), "b": leaf(1)}
    return {k: leaves[k] for k in keys}


def exact_mean(values: Sequence[np.ndarray]) -> np.ndarray:
    """The float64 nearest the exact mean of integer arrays (Python ints; one rounding)."""
    objects = [np.asarray(v).astype(object) for v in values]
    total = np.asarray(sum(objects[1:], objects[0]), dtype=object)
    n = len(values)
    return np.array([t / n for t in total.ravel().tolist()], np.float64).reshape(total.shape)


_FOLD: dict[str, Callable[..., Any]] = {
    "sum": np.add,
    "mean": np.add,
    "prod": np.multiply,
    "min": np.minimum,
    "max": np.maximum,
}


def reduce_in_order(op: str, values: list[np.ndarray]) -> np.ndarray:
    if op == "mean" and values[0].dtype.kind in "iu":
        return exact_mean(values)
    acc = values[0]
    for v in values[1:]:
        acc = _FOLD[op](acc, v)
    if op == "mean":
        acc = acc / np.asarray(len(values), dtype=acc.dtype)
    return np.asarray(acc)


def expected_leaf(step: Step, rid: int, n: int, j: int) -> Any:
    values = [leaf_value(step, r, j) for r in range(n)]
    if step.kind == "all_reduce":
        assert step.op is not None
        return reduce_in_order(step.op, values)
    if step.kind == "all_gather":
        return np.concatenate(values, axis=step.axis)
    if step.kind == "broadcast":
        assert step.source is not None
        return values[step.source]
    if step.kind == "reduce_scatter":
        assert step.op is not None
        return np.split(reduce_in_order(step.op, values), n, axis=step.axis)[rid]
    raise AssertionError(step.kind)  # pragma: no cover


def check_step(
    step: Step,
    rid: int,
    n: int,
    variant: Variant,
    got: Any,
    local: Sequence[int],
    library: str = "numpy",
) -> None:
    """Assert replica ``rid``'s result of ``step`` is exactly numpy's.

    ``local`` holds the replicas of this process (whose values a merge_fn sees).
    """
    if step.pair:
        assert isinstance(got, tuple), got
        assert len(got) == 2
        first = replace(step, pair=False, swapped=False)
        check_step(first, rid, n, variant, got[0], local, library)
        check_step(replace(first, seed=first.seed + 1), rid, n, variant, got[1], local, library)
        return
    if step.kind == "barrier":
        assert got is None
        return
    if step.kind == "merge_call":
        # merge_fn returns every local replica's own value (experimental_local_results).
        assert isinstance(got, tuple), got
        assert len(got) == len(local)
        for g, r in zip(got, local, strict=True):
            same(g, leaf_value(step, r, 0), library)
        return
    if step.nest == "leaf":
        same(got, expected_leaf(step, rid, n, 0), library)
    elif step.nest == "list":
        assert isinstance(got, list), type(got)
        assert len(got) == 2
        for j in range(2):
            same(got[j], expected_leaf(step, rid, n, j), library)
    else:
        assert isinstance(got, dict), type(got)
        keys = ["b", "w"] if variant.keys_reversed else ["w", "b"]
        assert list(got) == keys, "a result must keep the replica's own key order"
        same(got["w"], expected_leaf(step, rid, n, 0), library)
        same(got["b"], expected_leaf(step, rid, n, 1), library)


def same(got: Any, expected: np.ndarray, library: str = "numpy") -> None:
    """``got`` is ``library``'s array type and holds numpy's ``expected`` exactly.

    For a foreign library the oracle's value is taken as that library holds it (JAX,
    32-bit by default, holds the float64 MEAN of integers as float32).
    """
    if library == "numpy":
        # numpy inputs may be numpy scalars (0-d arithmetic gives them); numpy either way.
        assert isinstance(got, np.ndarray | np.generic), f"a {type(got)} for a numpy input"
    else:
        kind = type(to_library(np.zeros(1, expected.dtype), library))
        assert type(got) is kind, f"a {type(got)} came back for a {kind} input"
        expected = to_numpy(to_library(expected, library))
    got = to_numpy(got)
    assert got.shape == expected.shape, (got.shape, expected.shape)
    # Byte order is the transport's business: a big-endian float64 is still a float64.
    assert got.dtype.name == expected.dtype.name, (got.dtype, expected.dtype)
    np.testing.assert_array_equal(got, expected, strict=False)
    assert np.array_equal(got, expected), (got, expected)


def expected_named(seed: int, n: int, half: str) -> np.ndarray:
    values = [np.arange(2.0) + r + (seed if half == "a" else seed + 1) for r in range(n)]
    return reduce_in_order("sum", values)


def check_results(program: Program, rid: int, got: list[Any], local: Sequence[int]) -> None:
    """Replica ``rid`` of a consistent program got exactly numpy's results.

    ``local`` holds the replicas of ``rid``'s process (whose values a merge_fn sees).
    """
    actions = [a for a in program.actions[rid] if a[0] in ("step", "named")]
    assert len(got) == len(actions)
    for action, g in zip(actions, got, strict=True):
        if action[0] == "named":
            ra, rb = g
            np.testing.assert_array_equal(ra, expected_named(action[1], program.n, "a"))
            np.testing.assert_array_equal(rb, expected_named(action[1], program.n, "b"))
        else:
            check_step(action[1], rid, program.n, action[2], g, local, program.library)


# -- the interpreter -------------------------------------------------------------------------


def _local(strategy: ar.Strategy, v: Any) -> Any:
    return tuple(strategy.experimental_local_results(v))


async def issue(ctx: ar.ReplicaContext, step: Step, x: Any) -> Any:
    """Every collective of one kind comes from one line, so call sites agree by default."""
    if step.kind == "all_reduce":
        return await ctx.all_reduce(step.op, x)  # type: ignore[arg-type]
    if step.kind == "all_gather":
        return await ctx.all_gather(x, axis=step.axis)  # type: ignore[arg-type]
    if step.kind == "broadcast":
        return await ctx.broadcast(x, source=step.source)  # type: ignore[arg-type]
    if step.kind == "reduce_scatter":
        return await ctx.reduce_scatter(step.op, x, axis=step.axis)  # type: ignore[arg-type]
    if step.kind == "merge_call":
        return await ctx.merge_call(_local, args=(x,))
    return await ctx.barrier()


async def chain(depth: int, ctx: ar.ReplicaContext, step: Step, x: Any) -> Any:
    """``depth`` helper frames of one function between the caller and the collective."""
    if depth <= 0:
        return await issue(ctx, step, x)
    return await chain(depth - 1, ctx, step, x)


async def at_site(ctx: ar.ReplicaContext, step: Step, x: Any) -> Any:
    """Issue ``step`` from one of two lines (its ``site``), through its helper frames.

    A ``task`` step is issued in a helper task, started from one of two lines.
    """
    if step.task:
        out: list[Any] = []

        async def run() -> None:
            out.append(await chain(step.depth, ctx, step, x))

        async with anyio.create_task_group() as tg:
            if step.site == 0:
                tg.start_soon(run)
            else:
                tg.start_soon(run)
        return out[0]
    if step.site == 0:
        return await chain(step.depth, ctx, step, x)
    return await chain(step.depth, ctx, step, x)


async def same_line(
    ctx: ar.ReplicaContext, step: Step, rid: int, v: Variant, library: str = "numpy"
) -> Any:
    """A twin pair from one line: ``a`` then ``b``, or (``swapped``) ``b`` then ``a``."""
    a = replace(step, pair=False, swapped=False)
    b = replace(a, seed=a.seed + 1)
    xa, xb = build(a, rid, v, library), build(b, rid, v, library)
    f, swap = functools.partial(issue, ctx), step.swapped
    ra, rb = (await f(a, xa), await f(b, xb)) if not swap else (await f(b, xb), await f(a, xa))[::-1]  # fmt: skip
    return ra, rb


async def named_pair(ctx: ar.ReplicaContext, index: int, mode: str, rid: int) -> Any:
    """The named collectives ``<index>a`` and ``<index>b``, issued as ``mode`` says."""
    xa = np.arange(2.0) + rid + index
    xb = np.arange(2.0) + rid + index + 1

    def a() -> Any:
        return ctx.all_reduce("sum", xa, name=f"p{index}a")

    def b() -> Any:
        return ctx.all_reduce("sum", xb, name=f"p{index}b")

    if mode == "taskgroup":
        out: dict[str, Any] = {}

        async def keep(key: str, coro: Callable[[], Any]) -> None:
            out[key] = await coro()

        async with anyio.create_task_group() as tg:
            tg.start_soon(keep, "b", b)
            tg.start_soon(keep, "a", a)
        return out["a"], out["b"]
    if mode == "gather":
        ra, rb = await asyncio.gather(a(), b())
        return ra, rb
    if mode == "ensure_future":
        task = asyncio.ensure_future(a())
        rb = await b()
        return await task, rb
    first, second = (a, b) if SEQUENTIAL[mode] == "ab" else (b, a)
    if mode.startswith("seq"):
        r1 = await first()
        r2 = await second()
    elif mode.startswith("task"):
        r1 = await asyncio.ensure_future(first())
        r2 = await asyncio.ensure_future(second())
    else:
        (r1,) = await asyncio.gather(first())
        (r2,) = await asyncio.gather(second())
    return (r1, r2) if SEQUENTIAL[mode] == "ab" else (r2, r1)


async def act(
    ctx: ar.ReplicaContext,
    action: tuple[Any, ...],
    rid: int,
    planted: list[BaseException],
    cancel: Callable[[], None],
    library: str = "numpy",
) -> tuple[bool, Any]:
    """Perform one action (steps with ``library``'s arrays); return (gave a result, it)."""
    what = action[0]
    if what == "step":
        step, variant = action[1], action[2]
        if step.pair:
            return True, await same_line(ctx, step, rid, variant, library)
        return True, await at_site(ctx, step, build(step, rid, variant, library))
    if what == "named":
        return True, await named_pair(ctx, action[1], action[2], rid)
    if what == "checkpoint":
        await anyio.lowlevel.checkpoint()
    elif what == "sleep0":
        await anyio.sleep(0)  # noqa: ASYNC115 -- what users write
    elif what == "raise":
        error = Planted(f"planted in replica {rid}")
        planted.append(error)
        raise error
    elif what == "spawn_then_raise":
        asyncio.ensure_future(ctx.all_reduce("sum", 1.0, name=f"spawned{action[1]}"))  # noqa: RUF006
        await asyncio.sleep(0)
        error = Planted(f"planted in replica {rid} after spawning a helper")
        planted.append(error)
        raise error
    else:
        cancel()
        await anyio.lowlevel.checkpoint()
    return False, None
