"""``ReplicaContext`` and the module functions that find the current context."""

from __future__ import annotations

import asyncio
import functools
import inspect
import sys
import threading
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import anyio

from .._core._dtypes import reduce_refusal, reduced_dtype, refusal
from .._core._nest import TreeDef, flatten, regroup, select_replica, unflatten
from .._core._report import key_text, see_also, value_text
from .._core._signature import CollectiveKind, LeafSpec, ReduceOp, Signature
from .._exceptions import BackendError, CollectiveError, ReplicaContextError
from .._options import CommunicationOptions
from .._values import PerReplica
from . import _default, _tasks
from ._ending import stop_iteration_error
from ._held import held_leaves
from ._inspect import call_path
from ._issuing import all_reduce as _issue_all_reduce
from ._issuing import flatten_value as _flatten
from ._issuing import reducible_leaves as _reducible_leaves
from ._merge_key import merge_fn_key, merge_fn_name
from ._mode import MODE, Mode, current_mode
from ._run import LIVE_RUNS, Collective
from ._values import component

if TYPE_CHECKING:
    from ..abc import Backend
    from ._run import Run

    # A ReplicaContext holds its Strategy, and its public ``strategy`` is annotated
    # ``-> Strategy``: the one type-only import upward (tests/test_layering.py lists it);
    # at run time _strategy is above this module.
    from ._strategy import Strategy

__all__ = [
    "ReplicaContext",
    "get_replica_context",
    "in_cross_replica_context",
]


def _leaf_paths(treedef: TreeDef, prefix: str) -> Iterator[str]:
    """Each leaf's path in a nest, in flattening order: ``value['a'][1]``."""
    if treedef is None:
        yield prefix
        return
    _, keys, children = treedef
    labels: Sequence[object] = range(len(children))
    if isinstance(keys, tuple):
        labels = keys[0]
    for label, child in zip(labels, children, strict=False):
        yield from _leaf_paths(child, f"{prefix}[{label!r}]")


# Dispatch functions: called once per collective, by the last replica to arrive, with
# every replica's payload in replica order. Module-level (no closure per call): what
# they need is in the run, the collective's signature and its ``bytes_per_pack`` field.


# Dtype objects (numpy's, a foreign library's) by the name a backend described them
# with: what lets _check_unchanged compare a leaf's dtype now with its signature's
# without describing it again (``dtype.name`` alone costs a microsecond). Bounded.
# Keyed by (type, dtype): a dict lookup compares keys of colliding hashes, and a
# foreign dtype compared with numpy's warns (array_api_strict); the types differ first.
_DTYPE_NAMES: dict[tuple[type, object], str] = {}
_DTYPE_NAMES_LIMIT = 256


def _dtype_key(leaf: object) -> tuple[type, object]:
    """The key of ``leaf``'s dtype object in _DTYPE_NAMES."""
    dtype = getattr(leaf, "dtype", None)
    return (type(dtype), dtype)


def _remember_dtype(leaf: object, spec: LeafSpec | None) -> None:
    """Note that ``leaf``'s dtype object is described as ``spec.dtype`` (when hashable)."""
    dtype = getattr(leaf, "dtype", None)
    if dtype is None or spec is None or spec.sparse:
        return
    try:
        key = (type(dtype), dtype)
        if _DTYPE_NAMES.get(key) == spec.dtype:
            return
        if len(_DTYPE_NAMES) >= _DTYPE_NAMES_LIMIT:
            _DTYPE_NAMES.clear()
        _DTYPE_NAMES[key] = spec.dtype
    except TypeError:  # an unhashable dtype object: always described again
        return


def _check_unchanged(run: Run, call: Collective, payloads: Sequence[Any]) -> None:
    """Refuse inputs whose shape or dtype changed while their collective was in flight.

    A collective reads its inputs when the last replica arrives, not when it is issued
    (docs/concepts.md, "When inputs are read"); a value the backend converts was
    converted when it was issued (``_held``), and the converted array is what is read.
    Each replica's leaves must still be what its own signature described: an in-place
    reshape (``x.shape = ...``, ``x.resize``) in flight would otherwise give every
    replica a result of a shape no signature said. An all_gather's replicas differ
    along the axis, each with its own signature (the slot keeps them): a leaf resized
    along the axis is refused too. For collectives of one leaf it costs one shape and
    one dtype comparison per replica; a leaf that fails them (or has no ``shape``: a
    number, ``IndexedSlices``) is described again, and refused unless that finds its
    signature's shape and dtype: the batch path's rule (the numpy backend's
    ``_check_described``), with the same ``ValueError``. A batch of all_gather,
    broadcast or reduce_scatter is checked here leaf by leaf; the numpy backend checks
    an all_reduce's batch (see its general path).
    """
    signature = call._signature
    specs = signature.leaves
    kind = signature.kind
    if len(specs) != 1 and kind is CollectiveKind.ALL_REDUCE:
        # A batch: describing every leaf again would cost a third of a small batch's
        # all_reduce. The numpy backend checks a batch against what it described at
        # issue where it looks at the leaves anyway (see its general path).
        return
    names = _DTYPE_NAMES
    slot = call._slot
    own: Sequence[Any] | None = None
    if kind is CollectiveKind.ALL_GATHER and slot is not None:
        own = slot.signatures  # each replica's, as it issued the collective
    elif len(specs) == 1:
        spec0 = specs[0]
        shape, name = spec0.shape, spec0.dtype
        try:
            same = all(
                getattr(leaves[0], "shape", None) == shape
                and names.get(_dtype_key(leaves[0])) == name
                for leaves in payloads
            )
        except TypeError:  # an unhashable dtype object: described below
            same = False
        if same:
            # The common case: the shape and dtype an array has now are the ones it was
            # issued with. The dtype counts as much as the shape: numpy still lets
            # ``x.dtype = np.int64`` reinterpret a float64 array in place (deprecated),
            # and the backend would read its bits under the float64 signature. A dtype
            # object not yet in _DTYPE_NAMES is described below, once, and added.
            return
    describe = run.describe
    for r, leaves in enumerate(payloads):
        issued = signature if own is None or own[r] is None else own[r]
        dues = issued.leaves
        if len(leaves) != len(dues):
            continue  # the ledger compared structures; nothing to compare leaf by leaf here
        for j, leaf in enumerate(leaves):
            spec = dues[j]
            try:
                if (
                    getattr(leaf, "shape", None) == spec.shape
                    and names.get(_dtype_key(leaf)) == spec.dtype
                ):
                    continue
            except TypeError:  # an unhashable dtype object: described
                pass
            try:
                now = describe(leaf)
            except TypeError:
                now = None
            if now is spec or (now is not None and now == spec):
                _remember_dtype(leaf, now)
                continue
            replica = r + run.strategy._replica_offset
            raise ValueError(
                f"replica {replica}'s value changed while its {issued.describe()} was in "
                f"flight: leaf {j} was {spec} when the collective was issued and is "
                f"{now if now is not None else type(leaf).__name__} now. A collective reads its "
                "inputs when the last replica arrives: do not reshape, resize or write to a "
                "value until the await of its collective returns (pass a copy, x.copy(), to "
                "keep using the original)."
            )


def _check_results(
    run: Run,
    call: Collective,
    count: int,
    results: object,
    specs: Sequence[LeafSpec],
    op: ReduceOp | None = None,
    shapes: Sequence[tuple[int, ...]] | None = None,
    free_axis: int | None = None,
) -> None:
    """Refuse a backend's results that are not what the collective's signature says.

    ``results`` must hold ``count`` lists (one per replica of this process) of one leaf
    per spec, each of the spec's shape (or ``shapes[j]``, where given: all_gather's
    concatenation, reduce_scatter's chunk; any size along ``free_axis``, where given:
    all_gather across processes, whose other processes' sizes this one does not hold)
    and dtype (reduced by ``op``, if given). The one rule every collective's results
    are held to (all_reduce, all_gather, reduce_scatter, broadcast). A
    backend that answers otherwise (a third-party one, or a bug) would pass a silently
    wrong value to every replica; the error blames the backend, not a replica. For
    arrays it costs one shape and one dtype comparison per leaf (another array
    library's dtype is its own to narrow); a leaf that fails them (another array
    library's dtype names, a number, ``IndexedSlices``) is described by the backend and compared again.
    """
    backend = run.backend
    method = call._signature.kind.value

    def wrong(what: str) -> BackendError:
        error = broke(backend, _backend_text(run, method, call), what, "replica's value")
        run._noted.add(id(error))  # the message names the backend: no replica note
        return error

    dues = specs
    if shapes is not None or (
        op is not None and any(reduced_dtype(op, spec.dtype) != spec.dtype for spec in specs)
    ):
        dues = []
        for j, spec in enumerate(specs):
            if shapes is not None:
                spec = spec._replace(shape=shapes[j])
            if op is not None:
                spec = spec._replace(dtype=reduced_dtype(op, spec.dtype))
            dues.append(spec)
    hold_results(run.describe, wrong, results, count, dues, free_axis)


def broke(backend: Backend, where: str, what: str, inputs: str = "component") -> BackendError:
    """The ``BackendError`` of a backend result that ``result_fits`` refused.

    ``where`` names the backend's method and the call (``the 'numpy' backend's
    all_reduce (NumpyBackend.all_reduce), combining ...``); ``what`` what came back.
    """
    return BackendError(
        f"The backend broke its contract in {where}: it returned {what} "
        f"({type(backend).__module__}.{type(backend).__qualname__}). Every {inputs} "
        "matched the others, so this is a bug in the backend, not in asyncreplica or in "
        "your program: report it to the backend's authors (asyncreplica holds each "
        "backend's results to the signature rather than return a wrong value)."
    )


def hold_results(
    describe: Callable[[object], LeafSpec],
    wrong: Callable[[str], BaseException],
    results: object,
    count: int,
    dues: Sequence[LeafSpec],
    free_axis: int | None = None,
    single: bool = False,
) -> None:
    """Refuse a backend's results that are not ``dues`` (``result_fits``), one place.

    Every path that takes a backend's result holds it here: the collectives
    (``_check_results``), ``Strategy.reduce``, ``extended.reduce_to``/``batch_reduce_to``
    (in a merge_fn too), ``broadcast_to`` and ``Strategy.gather``. ``results`` must hold
    ``count`` lists (one per replica of this process) of one leaf per due spec;
    ``wrong(what)`` builds the error (``single``: one result, not one per replica). For arrays it costs one shape and one dtype
    comparison per leaf (another array library's dtype is its own to narrow); a leaf
    that fails them (another array library's dtype names, a number,
    ``IndexedSlices``) is described by the backend and compared again.
    """
    if not isinstance(results, Sequence):
        raise wrong(f"{type(results).__qualname__}, not a list of {count} results")
    if len(results) != count:
        raise wrong(f"{len(results)} results, not one per replica ({count})")
    held = _HELD_TYPES
    seen: set[int] = set()
    for r, leaves in enumerate(results):
        if not isinstance(leaves, Sequence) or len(leaves) != len(dues):
            got = len(leaves) if isinstance(leaves, Sequence) else type(leaves).__qualname__
            raise wrong(f"{got} leaves as replica {r}'s result, not {len(dues)}")
        for j, leaf in enumerate(leaves):
            due = dues[j]
            base = getattr(leaf, "base", None)  # an array's memory (a view's owner)
            key = id(leaf if base is None else base)
            if key in seen and _writable(leaf):
                of = "" if single else f" as leaf {j} of replica {r}'s result"
                # One writable object (or memory) handed to two replicas (or twice to one):
                # a write by one changes the other's result.
                raise wrong(
                    f"one writable {type(leaf).__qualname__}{of} whose memory it also "
                    "returned for another replica or leaf (each replica's result must be "
                    "its own array, or a read-only view)"
                )
            seen.add(key)
            kind = type(leaf)
            if (
                kind in held
                and getattr(leaf, "shape", None) == due.shape
                and str(getattr(leaf, "dtype", "")) == due.dtype
            ):
                continue
            now: LeafSpec | None = None
            if not isinstance(leaf, list | tuple | dict):  # a container is not a leaf
                try:
                    now = describe(leaf)
                except TypeError:  # not an array the backend holds (a masked one, ...)
                    now = None
            if result_fits(now, due, free_axis):
                if now is not None and len(held) < 64:
                    held.add(kind)  # the backend describes this type: checked fast next
                continue
            got = str(now) if now is not None else f"a {type(leaf).__qualname__}"
            of = "" if single else f" as leaf {j} of replica {r}'s result"
            text = str(due)
            if free_axis is not None:
                text = f"{text} (any size along axis {free_axis})"
            raise wrong(f"{got}{of}, where {text} was due")


#: The result types a backend described (its arrays): their shape and dtype are read
#: directly. An object of another type (one that only has ``shape`` and ``dtype``
#: attributes, a masked array, a list) is described by the backend first.
_HELD_TYPES: set[type] = set()


def _writable(leaf: object) -> bool:
    """Whether ``leaf`` says it is writable (an array's ``flags.writeable``); else True."""
    flags = getattr(leaf, "flags", None)
    if flags is None:
        return not isinstance(leaf, int | float | complex | str | bytes)
    return bool(getattr(flags, "writeable", True))


def hold_result(backend: Backend, where: str, result: object, due: LeafSpec) -> object:
    """``result``, one leaf a cross-replica API got from ``backend``, held to ``due``."""
    hold_results(
        backend.describe,
        lambda what: broke(backend, where, what),
        [[result]],
        1,
        [due],
        single=True,
    )
    return result


def result_fits(now: LeafSpec | None, due: LeafSpec, free_axis: int | None = None) -> bool:
    """Whether a backend's result leaf, described as ``now``, is the ``due`` one.

    The one rule every backend result is held to (the collectives' and
    ``Strategy.gather``'s): ``due``'s shape (any size along ``free_axis``, if given),
    dtype and sparsity. Another array library's result is converted back by that
    library, whose own rules may narrow the dtype (JAX without x64: float32 for float64).
    """
    return (
        now is not None
        and _shape_due(tuple(now.shape), due.shape, free_axis)
        and (now.dtype == due.dtype or due.array_type is not None)
        and now.sparse == due.sparse
    )


def _shape_due(got: tuple[int, ...], due: tuple[int, ...], free_axis: int | None) -> bool:
    """``got`` is ``due``, but for any size along ``free_axis`` (if not None)."""
    if got == due:
        return True
    if free_axis is None or len(got) != len(due):
        return False
    return got[:free_axis] + got[free_axis + 1 :] == due[:free_axis] + due[free_axis + 1 :]


def _leaf_size(run: Run, leaf: object, axis: int) -> int:
    """``leaf``'s size along ``axis``, as the backend describes it.

    The size of what the backend combines, which the signature's specs describe too: an
    ndarray subclass is combined as a plain view of its memory, whatever its ``shape``
    attribute says. Only a type the backend already described (``_HELD_TYPES``: its own
    arrays) has its ``shape`` read directly.
    """
    if type(leaf) in _HELD_TYPES:
        shape = getattr(leaf, "shape", None)
        if isinstance(shape, tuple):
            return int(shape[axis])
    return int(run.describe(leaf).shape[axis])


async def _dispatch_all_reduce(run: Run, call: Collective, payloads: list[Any]) -> Sequence[Any]:
    if not payloads[0]:
        return [[] for _ in payloads]
    _check_unchanged(run, call, payloads)
    signature = call._signature
    op = signature.op
    bytes_per_pack = call.bytes_per_pack
    assert op is not None
    assert bytes_per_pack is not None
    try:
        results: Sequence[Any] = await run.all_reduce(op, payloads, bytes_per_pack)
    except Exception as exc:
        _blame(run, call, "all_reduce", exc)
        raise
    except BaseException as exc:
        error = _odd_ending(run, call, "all_reduce", exc)
        if error is None:
            raise
        raise error from exc
    results = _checked(run, call, "all_reduce", results, payloads)
    _check_results(run, call, len(payloads), results, signature.leaves, op)
    return results


async def _dispatch_all_gather(run: Run, call: Collective, payloads: list[Any]) -> Sequence[Any]:
    if not payloads[0]:
        return [[] for _ in payloads]
    _check_unchanged(run, call, payloads)
    axis = call._signature.axis
    assert axis is not None
    try:
        results: Sequence[Any] = await run.backend.all_gather(payloads, axis)
    except Exception as exc:
        _blame(run, call, "all_gather", exc)
        raise
    except BaseException as exc:
        error = _odd_ending(run, call, "all_gather", exc)
        if error is None:
            raise
        raise error from exc
    results = _checked(run, call, "all_gather", results, payloads)
    specs = call._signature.leaves
    # Every replica receives the concatenation: the replicas' sizes along ``axis`` summed
    # (in one process; across processes this one holds only its own replicas' sizes).
    free = None if run.strategy._group is None else axis
    shapes = [
        (
            *spec.shape[:axis],
            sum(_leaf_size(run, leaves[j], axis) for leaves in payloads),
            *spec.shape[axis + 1 :],
        )
        for j, spec in enumerate(specs)
    ]
    _check_results(run, call, len(payloads), results, specs, None, shapes, free)
    return results


async def _dispatch_broadcast(run: Run, call: Collective, payloads: list[Any]) -> Sequence[Any]:
    source = call._signature.source
    assert source is not None
    # ``source`` is a global id; under MPI another process may hold it, and this one
    # passes its own replica's leaves (of the agreed shapes) to receive into.
    local = source - run.strategy._replica_offset
    _check_unchanged(run, call, payloads)
    sent = payloads[local if 0 <= local < len(payloads) else 0]
    try:
        results: Sequence[Any] = await run.backend.broadcast(sent, len(payloads))
    except Exception as exc:
        _blame(run, call, "broadcast", exc)
        raise
    except BaseException as exc:
        error = _odd_ending(run, call, "broadcast", exc)
        if error is None:
            raise
        raise error from exc
    results = _checked(run, call, "broadcast", results, [sent] * len(payloads))
    _check_results(run, call, len(payloads), results, call._signature.leaves)
    return results


async def _dispatch_reduce_scatter(
    run: Run, call: Collective, payloads: list[Any]
) -> Sequence[Any]:
    if not payloads[0]:
        return [[] for _ in payloads]
    _check_unchanged(run, call, payloads)
    op, axis = call._signature.op, call._signature.axis
    assert op is not None
    assert axis is not None
    try:
        results: Sequence[Any] = await run.backend.reduce_scatter(op, payloads, axis)
    except Exception as exc:
        _blame(run, call, "reduce_scatter", exc)
        raise
    except BaseException as exc:
        error = _odd_ending(run, call, "reduce_scatter", exc)
        if error is None:
            raise
        raise error from exc
    results = _checked(run, call, "reduce_scatter", results, payloads)
    specs = call._signature.leaves
    # Each replica receives its chunk of the reduced value: 1/n of ``axis``.
    n = run.strategy.num_replicas_in_sync
    shapes = [
        (*spec.shape[:axis], spec.shape[axis] // n, *spec.shape[axis + 1 :]) for spec in specs
    ]
    _check_results(run, call, len(payloads), results, specs, op, shapes)
    return results


def _backend_text(run: Run, method: str, call: Collective) -> str:
    """``the numpy backend's all_reduce (NumpyBackend), combining the 1st collective ...``."""
    backend = run.backend
    name = getattr(backend, "name", "") or type(backend).__name__
    slot = call._slot
    where = "" if slot is None else f" the {key_text(slot.key)},"
    return (
        f"the {name!r} backend's {method} ({type(backend).__name__}.{method}), "
        f"combining{where} {call._signature.describe()}, for all "
        f"{run.strategy.num_replicas_in_sync} replicas of "
        f"{type(run.strategy).__name__}.run"
    )


def _blame(run: Run, call: Collective, method: str, exc: Exception) -> None:
    """``exc``, raised by the backend's combine: noted as the backend's, never a replica's.

    Every replica's values had been checked to agree when the backend was called: what
    it raises is the backend's (a leaf it cannot hold, a native failure), and it is
    told as raised there, not "in replica k", whichever replica's task ran the combine.
    A :class:`CollectiveError` is not the backend's failure but the collective's (a
    process group's backend raises it for its peers: a mismatch, an exit, a timeout,
    each telling its own story), and keeps the note every such error gets.
    """
    if isinstance(exc, CollectiveError):
        return
    run.note(exc, f"(raised in {_backend_text(run, method, call)})")


def _odd_ending(
    run: Run, call: Collective, method: str, exc: BaseException
) -> BaseException | None:
    """A :class:`BackendError` for a combine that ended as only a cancellation should.

    ``GeneratorExit``, or an ``asyncio.CancelledError`` that nothing asked for (a library
    inside the backend raised it; on trio it is never the loop's), is the backend's
    failure: told as a replica's cancellation, it would blame a replica nothing
    cancelled. None for a true cancellation (and an interrupt): raised as it is.
    """
    if isinstance(exc, GeneratorExit):
        pass
    elif not isinstance(exc, asyncio.CancelledError) or _cancel_requested():
        return None
    error = BackendError(
        f"The backend's combine ended with {type(exc).__name__}({str(exc)!r}) though "
        f"nothing cancelled it, in {_backend_text(run, method, call)}. A backend's "
        "combine returns its results or raises an Exception; this ending is a bug in the "
        "backend (or in a library it calls), not in asyncreplica or in your program: "
        "report it to the backend's authors."
    )
    run._noted.add(id(error))  # the message names the backend: no replica note
    return error


def _cancel_requested() -> bool:
    """Whether the running asyncio task has a cancellation requested (never on trio)."""
    task = _tasks.current_task()
    return isinstance(task, asyncio.Task) and task.cancelling() > 0


def _checked(
    run: Run, call: Collective, method: str, results: Sequence[Any], payloads: list[Any]
) -> Sequence[Any]:
    """The backend's ``results``, refused unless one list of leaves per replica.

    A backend that returns too few results (or ``None``) would otherwise fail deep in
    the runtime as if asyncreplica were broken: it is the backend that broke its contract.
    """
    if isinstance(results, (list, tuple)) and len(results) == len(payloads):
        for r, leaves in enumerate(results):
            if not isinstance(leaves, (list, tuple)) or len(leaves) != len(payloads[r]):
                break
        else:
            return results
        got = (
            f"replica {r}'s results are {type(leaves).__name__} "
            f"{'of ' + str(len(leaves)) + ' leaves ' if isinstance(leaves, (list, tuple)) else ''}"
            f"where it gave {len(payloads[r])} leaves"
        )
    elif isinstance(results, (list, tuple)):
        got = f"it returned {len(results)} results for {len(payloads)} replicas"
    else:
        got = f"it returned {type(results).__name__}, not one list of leaves per replica"
    error = BackendError(
        f"The backend broke its contract in {_backend_text(run, method, call)}: {got}. "
        "A backend returns values[r][j] for leaf j of replica r, in the layout it was "
        "given (see asyncreplica.abc.Backend). This is a bug in the backend, not in "
        "asyncreplica or in your program: report it to the backend's authors."
    )
    run._noted.add(id(error))  # the message names the backend: no replica note
    raise error


async def _dispatch_merge_call(run: Run, call: Collective, payloads: list[Any]) -> Sequence[Any]:
    strategy = run.strategy
    num = len(payloads)
    first = strategy._replica_offset
    merge_args = regroup([p[1] for p in payloads], PerReplica, first)
    merge_kwargs = regroup([p[2] for p in payloads], PerReplica, first)
    assert isinstance(merge_args, tuple | list)
    assert isinstance(merge_kwargs, Mapping)
    token = MODE.set(Mode(strategy, True, None))
    rv = run._rv
    rv.merging += 1  # an await in cross-replica context is refused meanwhile
    try:
        result = payloads[0][0](strategy, *merge_args, **merge_kwargs)
        if inspect.isawaitable(result):
            result = await result
    except BaseException as exc:
        # Any error of the merge_fn's own (an Exception, KeyboardInterrupt, SystemExit,
        # the user's BaseException) is told as the merge_fn's; a cancellation of the run
        # is no error of it.
        if isinstance(exc, anyio.get_cancelled_exc_class()):
            raise
        error = exc
        if isinstance(exc, StopIteration):
            # Python would turn it into a RuntimeError at this coroutine's frame, past the
            # note (PEP 479), then told as the error of whichever replica ran merge_fn.
            error = stop_iteration_error(exc, f"merge_fn {call._signature.merge_fn_name}")
        run.note(
            error,
            f"(raised in merge_fn {call._signature.merge_fn_name}, called once for all "
            f"{num} replicas of {type(strategy).__name__}.run)",
        )
        if error is exc:
            raise
        raise error from exc
    finally:
        rv.merging -= 1
        MODE.reset(token)
    return [select_replica(i, result, _component(num)) for i in range(num)]


async def _dispatch_barrier(run: Run, call: Collective, payloads: list[Any]) -> Sequence[Any]:
    return [None] * len(payloads)


def get_replica_context() -> ReplicaContext | None:
    """Return the current replica context, or None in cross-replica context.

    Inside ``Strategy.run`` this is the replica's own context; inside
    ``strategy.scope()`` or a ``merge_fn`` it is None; elsewhere it is the default
    replica context (one replica, whose collectives are the identity, after the checks a
    replica's collectives make: a call a replica refuses is refused there too).
    """
    context: ReplicaContext | None = current_mode().replica
    if LIVE_RUNS and isinstance(context, DefaultReplicaContext):
        _refuse_default_in_replica()
    return context


def _refuse_default_in_replica(api: str | None = None) -> None:
    """Raise when a live run's replica task finds no replica context in its context.

    A task a replica started with a fresh ``contextvars.Context()`` (or code it runs in
    one) belongs to that replica, but its context holds no replica: the default context
    there would make every collective the identity, a silently wrong number. The same
    for a default context obtained elsewhere (outside the run) and used in a replica's
    task (``api``: the collective called on it; None for ``get_replica_context()``).
    """
    task = _tasks.current_task()
    if task is None:
        if api is not None:
            _refuse_default_beside_run(api)
        return
    for run in LIVE_RUNS:
        replica = run.watch.replica_of(task)
        if replica >= 0 and not run.closed:
            rid = replica + run.strategy._replica_offset
            if api is None:
                raise ReplicaContextError(
                    f"get_replica_context() was called in a task of replica {rid} that "
                    "runs in a context with no replica context: the task was started with "
                    "a fresh contextvars.Context() (context=...), or the call runs in one "
                    "(contextvars.Context().run(...)). There it would be the default "
                    "replica context, whose collectives reduce nothing across replicas. "
                    "Start the task without context= (it then copies the replica's "
                    "context), or pass contextvars.copy_context()."
                )
            raise ReplicaContextError(
                f"{api} was called on the default replica context (one replica, whose "
                f"collectives return the value itself) in a task of replica {rid} of "
                f"{type(run.strategy).__name__}.run: it would reduce nothing across the "
                f"{run.strategy.num_replicas_in_sync} replicas. That context was obtained "
                "outside the run (or in a task started with a fresh contextvars.Context()). "
                "Call asyncreplica.get_replica_context() in the replica's own code, in the "
                "coroutine that issues the collective."
            )
    if api is not None:
        _refuse_default_beside_run(api)


def _live_here() -> Run | None:
    """A live run of several replicas on this thread (so on this event loop), if any."""
    thread = threading.get_ident()
    for run in LIVE_RUNS:
        if not run.closed and run._rv.thread == thread and run.strategy.num_replicas_in_sync > 1:
            return run
    return None


def _refuse_default_collective(api: str) -> bool:
    """Refuse a default context's collective in a replica's task or beside a live run.

    In a trio system task (``token.run_sync_soon`` from a thread spawning one, say) an
    exception is a ``TrioInternalError`` that ends trio itself: there the refusal fails
    the run instead (which raises it), and True says that the collective must wait until
    trio cancels its task.
    """
    try:
        _refuse_default_in_replica(api)
    except ReplicaContextError as error:
        run = _live_here()
        if run is None or run._loop is not None or not _in_trio_system_task(run):
            raise
        if not run._errors:  # else the run fails already (this task's spawn, say)
            run._noted.add(id(error))  # it names no replica: no replica note
            run._fail(-1, error)
        return True
    return False


def _in_trio_system_task(run: Run) -> bool:
    """Whether the current trio task is a system task (a child of trio's root, not main)."""
    import trio

    task = trio.lowlevel.current_task()
    root = trio.lowlevel.current_root_task()
    nursery = task.parent_nursery
    if root is None or nursery is None or nursery.parent_task is not root:
        return False
    main = next((t for t in run._rv.mains if t is not None), None)
    while isinstance(main, trio.lowlevel.Task):
        parent = main.parent_nursery
        if parent is None or parent.parent_task is root:
            break
        main = parent.parent_task
    return main is not task


def _refuse_default_beside_run(api: str) -> None:
    """Refuse a default context's collective on the thread of a live run of several replicas.

    A task no replica is known to have started (created in a fresh ``contextvars.Context()``
    by ``Context().run(asyncio.ensure_future, ...)``, ``Context().run(tg.start_soon, ...)``,
    a ``loop.call_soon(..., context=Context())`` callback, ``run_coroutine_threadsafe``
    from an executor thread, trio's ``token.run_sync_soon`` from a thread) finds the
    default context there, whose collectives return the value itself: while a run of
    several replicas is live on this thread, that is a replica's helper reducing nothing,
    a silently wrong number. Refused alike by every replica (told once).
    """
    run = _live_here()
    if run is not None:
        strategy = run.strategy
        where = _tasks.where_called()
        raise refusal(
            ReplicaContextError(
                f"{api} was called on the default replica context (one replica, whose "
                "collectives return the value itself)"
                + (f" at {where}" if where else "")
                + f", while {type(strategy).__name__}.run of "
                f"{strategy.num_replicas_in_sync} replicas is live on this event loop: it "
                "would reduce nothing across them. The calling task runs in a context with "
                "no replica context: it was started in a fresh contextvars.Context() "
                "(Context().run(asyncio.ensure_future, ...), Context().run(tg.start_soon, "
                "...), loop.call_soon(..., context=Context())), from another thread "
                "(asyncio.run_coroutine_threadsafe, trio's token.run_sync_soon), or outside "
                "the replicas. Start a replica's helpers from its own code with "
                "asyncio.create_task or a task group (they copy its context), or call the "
                "collective outside the run.\n" + see_also("ReplicaContextError")
            )
        )


def in_cross_replica_context() -> bool:
    """Return True inside ``strategy.scope()`` or a ``merge_fn``, False elsewhere."""
    return current_mode().cross_replica


def _check_args(args: object, kwargs: object, what: str) -> tuple[Sequence[Any], Mapping[str, Any]]:
    if not isinstance(args, list | tuple):
        raise ValueError(
            f"positional args must be a list or tuple, got {type(args)}: pass args=(x,) "
            f"(note the comma) to {what}"
        )
    if kwargs is None:
        kwargs = {}
    if not isinstance(kwargs, Mapping):
        raise ValueError(f"kwargs must be a mapping (a dict) or None, got {type(kwargs)}")
    return args, kwargs


def _cross_replica_error(api: str) -> ReplicaContextError:
    """The error of a replica context's ``api`` called in cross-replica context."""
    return ReplicaContextError(
        f"{api} needs a replica context, but it was called in cross-replica context "
        "(inside strategy.scope() or a merge_fn). There, use the cross-replica APIs: "
        "await strategy.reduce(...), await strategy.gather(...), or "
        "await strategy.extended.reduce_to(...)."
    )


def _merge_call_checks(
    merge_fn: object, args: object, kwargs: object
) -> tuple[Sequence[Any], Mapping[str, Any]]:
    """``merge_call``'s checks of its arguments (a replica's and the default context's).

    Returns ``(args, kwargs)``, ``kwargs`` a mapping. Their structure is checked next,
    by :func:`_merge_structure` (a nest too deep is refused there).
    """
    if not callable(merge_fn):
        raise TypeError(
            f"merge_fn must be callable as merge_fn(strategy, *args, **kwargs), got {value_text(merge_fn)}"
        )
    return _check_args(args, kwargs, "merge_call")


def _merge_structure(args: tuple[Any, ...], kwargs: dict[str, Any]) -> TreeDef:
    """The structure of ``merge_call``'s arguments that replicas must agree on."""
    return _key_set(flatten((args, kwargs))[1])


def _merge_signature(
    key: object, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Signature:
    """A ``merge_call``'s signature: what identifies its merge function, its arguments."""
    return Signature(
        CollectiveKind.MERGE_CALL,
        merge_fn=key,
        merge_fn_name=name,
        # The replicas' arguments are regrouped leaf by leaf: their structures must
        # agree, and a replica that disagrees is named when it arrives.
        structure=_merge_structure(args, kwargs),
        call_path=call_path(),
    )


def _key_set(treedef: TreeDef) -> TreeDef:
    """``treedef`` as regrouping compares it: a mapping is its set of keys, nothing more.

    Insertion order, mapping type and a defaultdict's factory may differ per replica.
    """
    if treedef is None:
        return None
    cls, keys, children = treedef
    if isinstance(keys, tuple):
        cls, keys = dict, (keys[0], None, None)
    return (cls, keys, tuple(_key_set(child) for child in children))


class ReplicaContext:
    """The context of one replica inside ``Strategy.run``: its id and its collectives.

    Get it with :func:`asyncreplica.get_replica_context` inside the step function;
    strategies create it, users do not. Every collective is awaitable and must be
    issued by every replica, in the same order, with the same arguments: a replica
    that skips one, adds one or passes different shapes gets a ``CollectiveError``
    naming every replica and its call site, never a hang.
    """

    def __init__(
        self, strategy: Strategy, replica_id_in_sync_group: int, *, run: Run | None = None
    ) -> None:
        self._strategy = strategy
        self._replica_id = replica_id_in_sync_group
        self._run = run

    @property
    def replica_id_in_sync_group(self) -> int:
        """This replica's id, ``0 .. num_replicas_in_sync - 1`` (a Python int).

        Under ``MultiWorkerMirroredStrategy`` it is the global id: processes' replicas
        are numbered in rank order.
        """
        return self._replica_id + self._strategy._replica_offset

    @property
    def num_replicas_in_sync(self) -> int:
        """How many replicas run in sync."""
        return self._strategy.num_replicas_in_sync

    @property
    def strategy(self) -> Strategy:
        """The strategy this replica belongs to."""
        return self._strategy

    @property
    def devices(self) -> tuple[str, ...]:
        """The device of this replica, as a one-element tuple (``("CPU:1",)``)."""
        self._require_current("devices")
        return (self._strategy.extended.worker_devices[self._replica_id],)

    def __repr__(self) -> str:
        return (
            f"<ReplicaContext replica {self.replica_id_in_sync_group} of {self.num_replicas_in_sync} "
            f"in {type(self._strategy).__name__}>"
        )

    # -- checks ---------------------------------------------------------------------

    def _require_current(self, api: str) -> Run:
        mode = MODE.get()
        run = self._run
        if mode is not None and mode.replica is self and run is not None and not run.closed:
            return run
        if run is not None and run.closed:
            raise ReplicaContextError(
                f"{api} was called on the ReplicaContext of replica {self.replica_id_in_sync_group}, whose "
                "Strategy.run has finished. A ReplicaContext is valid only inside the run that "
                "created it: call asyncreplica.get_replica_context() inside the step function."
            )
        if mode is not None and mode.cross_replica:
            raise _cross_replica_error(api)
        fresh = (
            ""
            if mode is not None
            else " Here it runs in a context that holds no replica at all: a task started "
            "with a fresh contextvars.Context() (context=...; start it without context=, "
            "it copies the replica's context, or pass contextvars.copy_context()), "
            "contextvars.Context().run(...), or the event loop's own task (trio closing an "
            "async generator left unfinished: use `async with aclosing(...)`)."
        )
        error = ReplicaContextError(
            f"{api} was called on the ReplicaContext of replica {self.replica_id_in_sync_group} from "
            "outside that replica (another replica, or a task it started). Call "
            "asyncreplica.get_replica_context() in the coroutine that issues the collective."
            + fresh
        )
        if (
            mode is None
            and run is not None
            and run._loop is None
            and not run._errors
            and _in_trio_system_task(run)
        ):
            # trio closes an async generator left unfinished in its own system task and
            # only logs what escapes it: the run, still live, fails with the refusal.
            run._fail(self._replica_id, error)
        raise error

    def _options(self, options: CommunicationOptions | None) -> float | None:
        defaults = self._strategy.communication_options
        if options is None:
            return defaults.timeout_seconds
        return self._merged(options).timeout_seconds

    def _merged(self, options: CommunicationOptions) -> CommunicationOptions:
        if not isinstance(options, CommunicationOptions):
            raise TypeError(
                f"options must be CommunicationOptions or None, got {value_text(options)}"
            )
        return self._strategy.communication_options.merge(options)

    def _describe(self, leaves: Sequence[object], treedef: TreeDef = None) -> tuple[LeafSpec, ...]:
        backend = self._strategy.backend
        try:
            if len(leaves) == 1:
                return (backend.describe(leaves[0]),)
            # A backend may describe a batch in one pass (the numpy backend does).
            return backend.describe_leaves(leaves)
        except TypeError as exc:
            raise self._leaf_error(exc, leaves, treedef) from exc

    def _held(self, leaves: list[object], treedef: TreeDef = None) -> list[object]:
        """``leaves`` as the collective reads them: each converted once, now.

        The one rule (``_held.held_leaves``): a leaf the backend converts (an object with
        only ``__array__``) is converted here, when the replica issues the collective,
        and the collective describes and combines that array, never the value again. A
        refusal names the replica and the leaf (:meth:`_leaf_error`); any other error of
        the conversion is raised as it is, the user's own.
        """
        strategy = self._strategy
        return held_leaves(
            strategy.backend,
            strategy._as_is,
            leaves,
            lambda exc, j: (
                self._leaf_error(exc, leaves, treedef, j) if isinstance(exc, TypeError) else exc
            ),
        )

    def _leaf_error(
        self, exc: TypeError, leaves: Sequence[object], treedef: TreeDef, index: int | None = None
    ) -> TypeError:
        """``exc`` (the backend refused a leaf), saying which replica and which leaf.

        A refusal of the collective this replica issues (see ``REFUSAL_MARK``), naming
        the backend that holds the replicas' values (under MPI the local one, as in one
        process) and the global replica id. ``index`` is the refused leaf where known
        (its conversion raised: it is not converted again to find it); otherwise the
        first leaf the backend refuses to describe.
        """
        backend = self._strategy.backend
        holder = self._strategy._local_backend
        paths = list(_leaf_paths(treedef, "value"))
        for j, leaf in enumerate(leaves):
            if index is None:
                try:
                    backend.describe(leaf)
                except TypeError:
                    pass
                else:
                    continue
            elif j != index:
                continue
            kind = type(leaf)
            where = paths[j] if j < len(paths) else f"leaf {j} of the value"
            return refusal(
                TypeError(
                    f"replica {self.replica_id_in_sync_group} passed {where} of type "
                    f"{kind.__module__}.{kind.__qualname__}, which the "
                    f"{holder.name or type(holder).__name__} backend cannot hold: {exc}"
                )
            )
        return exc

    @staticmethod
    def _check_name(name: object) -> str | None:
        """``name`` as a plain ``str`` (or None); anything else is refused.

        A ``str`` subclass is read as its characters: replicas pair by them, whatever the
        subclass's ``__hash__`` or ``__eq__`` say (one that hashes by identity would
        make every replica's name a different one: a false deadlock).
        """
        if name is None or type(name) is str:
            return name
        if not isinstance(name, str):
            raise TypeError(f"name must be a string or None, got {value_text(name)}")
        return str.__str__(name)

    # -- each collective's checks ------------------------------------------------------
    #
    # What a collective checks of its arguments, in its order, before it is issued, and
    # the signature it is issued with: one place for the replicas' contexts and the
    # default one, whose collectives run the same checks and return a DefaultCollective
    # of that signature (its messages describe it as a replica's do), awaited to the
    # value itself. A call a replica refuses is refused there too, with the same error
    # (tests/runtime/test_attack_eighth_round_structure.py compares them call by call,
    # tests/runtime/test_default_context_awaits.py their awaits).

    def _all_reduce_checks(
        self,
        reduce_op: ReduceOp | str,
        value: Any,
        options: CommunicationOptions | None,
        name: object,
    ) -> tuple[list[object], TreeDef, Signature, list[object]]:
        """``all_reduce``'s checks, in its order; ``(leaves, treedef, signature, originals)``.

        The name (:meth:`all_reduce`), then the op, the options and the value
        (``_issuing.all_reduce``, whose compiled body makes them inline: one leaf's on a
        fast path, a value of several leaves through ``_issuing.reducible``, as here), and
        the signature it builds. ``leaves`` are the held ones (``_held``), ``originals``
        the value's own.
        """
        checked = self._check_name(name)
        op = ReduceOp.parse(reduce_op)
        self._options(options)
        originals, treedef = _flatten(value)
        leaves, _, specs = _reducible_leaves(self, op, originals, treedef)
        signature = Signature(
            CollectiveKind.ALL_REDUCE,
            op,
            name=checked,
            structure=treedef,
            leaves=specs,
            call_path=call_path(),
        )
        return leaves, treedef, signature, originals

    def _read(self, value: Any) -> tuple[list[object], TreeDef, list[object], tuple[LeafSpec, ...]]:
        """``(originals, treedef, leaves, specs)`` of a collective's value.

        The value's own leaves, its nest, the leaves as the collective reads them
        (``_held``: converted once, now) and their specs.
        """
        originals, treedef = _flatten(value)
        leaves = self._held(originals, treedef)
        return originals, treedef, leaves, self._describe(leaves, treedef)

    def _all_gather_checks(
        self, value: Any, axis: object, options: CommunicationOptions | None, name: object
    ) -> tuple[float | None, list[object], TreeDef, Signature, list[object]]:
        """``(timeout, leaves, treedef, signature, originals)`` of a valid ``all_gather``.

        ``leaves`` are the held ones (``_held``), ``originals`` the value's own.
        """
        timeout = self._options(options)
        originals, treedef, leaves, specs = self._read(value)
        checked = _check_axis(axis, specs, "all_gather", sparse_ok=False)
        signature = Signature(
            CollectiveKind.ALL_GATHER,
            axis=checked,
            name=self._check_name(name),
            structure=treedef,
            leaves=specs,
            call_path=call_path(),
        )
        return timeout, leaves, treedef, signature, originals

    def _broadcast_checks(
        self, value: Any, source: object, name: object
    ) -> tuple[float | None, list[object], TreeDef, Signature, list[object]]:
        """``(timeout, leaves, treedef, signature, originals)`` of a valid ``broadcast``."""
        n = self.num_replicas_in_sync
        if isinstance(source, bool) or not isinstance(source, int) or not 0 <= source < n:
            raise ValueError(f"source must be a replica id in 0..{n - 1}, got {value_text(source)}")
        timeout = self._options(None)
        originals, treedef, leaves, specs = self._read(value)
        _refuse_broadcast_slices(specs)
        signature = Signature(
            CollectiveKind.BROADCAST,
            source=source,
            name=self._check_name(name),
            structure=treedef,
            leaves=specs,
            call_path=call_path(),
        )
        return timeout, leaves, treedef, signature, originals

    def _reduce_scatter_checks(
        self, reduce_op: ReduceOp | str, value: Any, axis: object, name: object
    ) -> tuple[float | None, list[object], TreeDef, Signature, list[object]]:
        """``(timeout, leaves, treedef, signature, originals)`` of a valid ``reduce_scatter``.

        Its leaves are held to ``all_reduce``'s rule (:func:`reduce_refusal`) after the
        axis: a boolean is refused when each replica issues the call, before any waits
        (as ``all_reduce`` refuses it), not by the backend once all have arrived.
        """
        op = ReduceOp.parse(reduce_op)
        timeout = self._options(None)
        originals, treedef, leaves, specs = self._read(value)
        checked = _check_axis(axis, specs, "reduce_scatter", sparse_ok=False)
        error = reduce_refusal(op, specs)
        if error is not None:
            raise error
        n = self.num_replicas_in_sync
        for spec in specs:
            size = spec.shape[checked]
            if size % n:
                raise ValueError(
                    f"reduce_scatter splits axis {checked} into {n} equal chunks, but a value of "
                    f"shape {spec.shape} has {size} elements there: pad it to a multiple of {n}"
                )
        signature = Signature(
            CollectiveKind.REDUCE_SCATTER,
            op=op,
            axis=checked,
            name=self._check_name(name),
            structure=treedef,
            leaves=specs,
            call_path=call_path(),
        )
        return timeout, leaves, treedef, signature, originals

    def _barrier_checks(self, name: object) -> tuple[float | None, Signature]:
        """``(timeout, signature)`` of a valid ``barrier``."""
        timeout = self._options(None)
        signature = Signature(
            CollectiveKind.BARRIER, name=self._check_name(name), call_path=call_path()
        )
        return timeout, signature

    # -- collectives ------------------------------------------------------------------

    def all_reduce(
        self,
        reduce_op: ReduceOp | str,
        value: Any,
        options: CommunicationOptions | None = None,
        *,
        name: str | None = None,
    ) -> Awaitable[Any]:
        """Combine ``value`` across replicas with ``reduce_op``; every replica gets the result.

        Args:
            reduce_op: A :class:`ReduceOp` or its name (``"sum"``, ``"MEAN"``, ...).
            value: A number, an array, an ``IndexedSlices`` or a nest (list, tuple,
                dict, namedtuple) of them. A nest is one collective: one rendezvous.
            options: Per-call ``CommunicationOptions``, merged over the strategy's.
            name: Names the collective; named calls may differ in call site.

        Returns:
            The result, with the structure of ``value``: read-only arrays, each
            replica's own view of one shared buffer. ``all_reduce([])`` returns ``[]``.

        Raises:
            ValueError: ``reduce_op`` is not a reduce op, or reduces ``IndexedSlices``
                with an op other than SUM or MEAN (raised by this call, before any
                replica waits).
            TypeError: A leaf is not numeric, or is boolean (raised by this call).
            CollectiveMismatchError: Another replica issued a different collective at
                this position. The run fails; every replica is cancelled.
            ReplicaExitedError: A replica finished without reaching this collective.
            CollectiveTimeoutError: ``timeout_seconds`` passed with replicas missing.
            ReplicaContextError: Called outside this replica.
        """
        # The body is compiled (see _issuing): this method keeps the docstring.
        return _issue_all_reduce(
            self,
            self._run,
            self._strategy,
            self._replica_id,
            reduce_op,
            value,
            options,
            # Checked here: the compiled body's typed parameter would refuse a non-str
            # with mypyc's own message.
            name if name is None or type(name) is str else self._check_name(name),
            _dispatch_all_reduce,
        )

    def all_gather(
        self,
        value: Any,
        axis: int,
        options: CommunicationOptions | None = None,
        *,
        name: str | None = None,
    ) -> Awaitable[Any]:
        """Concatenate ``value`` from every replica along ``axis``, in replica order.

        Shapes may differ along ``axis`` only. Every replica gets the whole result.

        Args:
            value: An array or a nest of arrays, each of rank >= 1.
            axis: The axis to concatenate along; negative counts from the end.
            options: Per-call ``CommunicationOptions``.
            name: Names the collective; named calls may differ in call site.

        Returns:
            The gathered value, with the structure of ``value`` (read-only arrays).

        Raises:
            ValueError: A leaf is a scalar, or ``axis`` is out of range.
            NotImplementedError: A leaf is an ``IndexedSlices``.
            CollectiveMismatchError: See :meth:`all_reduce`.
            ReplicaExitedError: See :meth:`all_reduce`.
            CollectiveTimeoutError: See :meth:`all_reduce`.
            ReplicaContextError: Called outside this replica.
        """
        run = self._require_current("all_gather")
        timeout, leaves, treedef, signature, _ = self._all_gather_checks(value, axis, options, name)
        return Collective(
            run, self._replica_id, signature, leaves, _dispatch_all_gather, None, timeout, treedef
        )

    def broadcast(self, value: Any, source: int = 0, *, name: str | None = None) -> Awaitable[Any]:
        """Give every replica a copy of replica ``source``'s ``value``.

        Every replica passes a value of the same structure, shape and dtype (its own
        is ignored unless it is the source), as in other collective libraries.

        Args:
            value: An array or a nest of arrays.
            source: The replica whose value is sent.
            name: Names the collective; named calls may differ in call site.

        Returns:
            The source's value (read-only views of one copy).

        Raises:
            ValueError: ``source`` is not a replica id.
            NotImplementedError: A leaf is ``IndexedSlices`` (the replicas' slices hold
                different numbers of rows; ``extended.broadcast_to`` copies them).
            CollectiveMismatchError: See :meth:`all_reduce`.
            ReplicaExitedError: See :meth:`all_reduce`.
            ReplicaContextError: Called outside this replica.
        """
        run = self._require_current("broadcast")
        timeout, leaves, treedef, signature, _ = self._broadcast_checks(value, source, name)
        return Collective(
            run, self._replica_id, signature, leaves, _dispatch_broadcast, None, timeout, treedef
        )

    def reduce_scatter(
        self, reduce_op: ReduceOp | str, value: Any, axis: int = 0, *, name: str | None = None
    ) -> Awaitable[Any]:
        """Combine ``value`` across replicas, then give replica ``i`` the ``i``-th chunk.

        The result is split along ``axis`` into ``num_replicas_in_sync`` equal chunks.

        Args:
            reduce_op: A :class:`ReduceOp` or its name.
            value: An array or a nest of arrays whose ``axis`` dimension divides by the
                number of replicas.
            axis: The axis to split along; negative counts from the end.
            name: Names the collective; named calls may differ in call site.

        Returns:
            This replica's chunk of the result (read-only views).

        Raises:
            ValueError: Bad ``reduce_op`` or ``axis``, a scalar leaf, or a dimension that
                does not divide by the number of replicas.
            TypeError: A leaf is not numeric, or is boolean (raised by this call).
            NotImplementedError: A leaf is an ``IndexedSlices``.
            CollectiveMismatchError: See :meth:`all_reduce`.
            ReplicaExitedError: See :meth:`all_reduce`.
            ReplicaContextError: Called outside this replica.
        """
        run = self._require_current("reduce_scatter")
        timeout, leaves, treedef, signature, _ = self._reduce_scatter_checks(
            reduce_op, value, axis, name
        )
        return Collective(
            run,
            self._replica_id,
            signature,
            leaves,
            _dispatch_reduce_scatter,
            None,
            timeout,
            treedef,
        )

    def barrier(self, *, name: str | None = None) -> Awaitable[None]:
        """Wait until every replica reaches this barrier.

        Raises:
            CollectiveMismatchError: See :meth:`all_reduce`.
            ReplicaExitedError: See :meth:`all_reduce`.
            ReplicaContextError: Called outside this replica.
        """
        run = self._require_current("barrier")
        timeout, signature = self._barrier_checks(name)
        return Collective(run, self._replica_id, signature, None, _dispatch_barrier, None, timeout)

    def merge_call(
        self,
        merge_fn: Callable[..., Any],
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> Awaitable[Any]:
        """Pause every replica, run ``merge_fn`` once in cross-replica context, resume.

        The replicas' ``args`` and ``kwargs`` are regrouped as in TensorFlow: a leaf
        that is the same object on every replica stays as it is, other leaves become
        ``PerReplica``. ``merge_fn(strategy, *args, **kwargs)`` runs once (it may be a
        plain or an ``async`` function, and may await cross-replica APIs such as
        ``strategy.reduce``). Each replica then receives its part of the result:
        component ``i`` of a ``PerReplica`` or ``Mirrored`` leaf, the leaf itself
        otherwise.

        Args:
            merge_fn: ``merge_fn(strategy, *args, **kwargs)``; every replica must pass
                the same function (the same code).
            args: This replica's positional arguments (a list or tuple).
            kwargs: This replica's keyword arguments.

        Returns:
            This replica's part of ``merge_fn``'s result.

        Raises:
            TypeError: ``merge_fn`` is not callable.
            ValueError: ``args`` is not a list or tuple.
            CollectiveMismatchError: Replicas passed different merge functions, or
                issued another collective at this position.
            ReplicaExitedError: See :meth:`all_reduce`.
            ReplicaContextError: Called outside this replica (``merge_call`` inside a
                ``merge_fn`` included).
        """
        run = self._require_current("merge_call")
        args, kwargs = _merge_call_checks(merge_fn, args, kwargs)
        return self._merge_call(
            run, merge_fn, args, kwargs, merge_fn_key(merge_fn), merge_fn_name(merge_fn)
        )

    def _merge_call(
        self,
        run: Run,
        merge_fn: Callable[..., Any],
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
        key: object,
        name: str,
    ) -> Awaitable[Any]:
        """``merge_call`` whose replicas must agree on ``key`` (what identifies the call).

        ``merge_call`` passes its merge function's key; a library API built on it (such as
        ``extended.update``, whose merge function is its own closure) passes the key of
        what the user gave it, so that replicas passing different functions are a
        mismatch, never replica 0's run for all.
        """
        timeout = self._options(None)
        payload = (merge_fn, tuple(args), dict(kwargs))
        signature = _merge_signature(key, name, payload[1], payload[2])
        return Collective(
            run, self._replica_id, signature, payload, _dispatch_merge_call, None, timeout
        )


def _component(num_replicas: int) -> Callable[[int, object], object]:
    return functools.partial(component, num_replicas=num_replicas)


def _refuse_broadcast_slices(specs: Sequence[LeafSpec]) -> None:
    """Refuse ``IndexedSlices`` in ``broadcast``, at issue, in the replica that passed them.

    The replicas' slices hold different numbers of rows, so no replica could receive the
    source's into a value of its own shape (the backends receive in place).
    """
    for i, spec in enumerate(specs):
        if spec.sparse:
            raise NotImplementedError(
                f"broadcast does not support IndexedSlices (leaf {i}, {spec}): the "
                "replicas' slices hold different numbers of rows. Broadcast a dense value "
                "instead (densify the slices), or, in cross-replica context (a merge_fn), "
                "copy them with strategy.extended.broadcast_to"
            )


def _check_axis(axis: object, specs: Sequence[LeafSpec], api: str, *, sparse_ok: bool) -> int:
    if isinstance(axis, bool) or not isinstance(axis, int):
        raise TypeError(f"{api}: axis must be an int, got {value_text(axis)}")
    for spec in specs:
        if spec.sparse and not sparse_ok:
            raise NotImplementedError(f"{api} does not support IndexedSlices")
        rank = len(spec.shape)
        if rank == 0:
            raise ValueError(
                f"{api} needs values of rank >= 1, got a scalar ({spec}): scalars cannot be "
                "concatenated or split; reshape it to shape (1,) first"
            )
        if not -rank <= axis < rank:
            raise ValueError(
                f"{api}: axis {axis} is out of range for a value of shape {spec.shape}"
            )
    if axis < 0 and specs:
        ranks = {len(spec.shape) for spec in specs}
        if len(ranks) > 1:
            raise ValueError(
                f"{api}: a negative axis needs every leaf to have the same rank, got ranks "
                f"{sorted(ranks)}; pass a non-negative axis"
            )
        axis += ranks.pop()
    return axis


class DefaultReplicaContext(ReplicaContext):
    """The replica context outside any strategy: one replica, collectives are the identity.

    As in TensorFlow, ``all_reduce`` and ``all_gather`` return the value itself (no
    arithmetic, no dtype change) and ``merge_call`` calls ``merge_fn`` directly in
    cross-replica context. Each collective first makes the checks a replica's makes
    (the ``_*_checks`` methods it inherits, one place), and returns a
    :class:`~._default.DefaultCollective`, which keeps a replica's collective's await
    lifecycle (``_default``): a call that a one-replica ``MirroredStrategy`` refuses is
    refused here with the same error, so a program written against the default strategy
    meets no new refusal on its first real run.
    """

    def _require_current(self, api: str) -> Run:
        raise AssertionError("the default replica context has no run")

    def _enter(self, api: str) -> object:
        """Refuse ``api`` where a replica's context would refuse it; the loop running here.

        In cross-replica context (a ``merge_fn``, ``strategy.scope()``), and beside a live
        run of several replicas. Returns :func:`~._default.loop_here` (None: no event loop
        runs in this thread, which the collective refuses once it can say what it is), or
        :data:`_WAIT` when the collective must wait for trio to cancel it (see
        :func:`_refuse_default_collective`).
        """
        if current_mode().cross_replica:
            raise _cross_replica_error(api)
        loop = _default.loop_here()
        if loop is not None and LIVE_RUNS and _refuse_default_collective(api):
            return _WAIT
        return loop

    @property
    def devices(self) -> tuple[str, ...]:
        """The default device, ``("CPU:0",)``."""
        return (self._strategy.extended.worker_devices[0],)

    def all_reduce(
        self,
        reduce_op: ReduceOp | str,
        value: Any,
        options: CommunicationOptions | None = None,
        *,
        name: str | None = None,
    ) -> Awaitable[Any]:
        """Return ``value`` (one replica: nothing to combine), once awaited; see :func:`_result`."""
        loop = self._enter("all_reduce")
        if loop is _WAIT:
            return anyio.sleep_forever()
        leaves, treedef, signature, originals = self._all_reduce_checks(
            reduce_op, value, options, name
        )
        return _default.issue(signature, loop, _returns, _result(value, originals, leaves, treedef))

    def all_gather(
        self,
        value: Any,
        axis: int,
        options: CommunicationOptions | None = None,
        *,
        name: str | None = None,
    ) -> Awaitable[Any]:
        """Return ``value`` (one replica: nothing to gather), once awaited; see :func:`_result`."""
        loop = self._enter("all_gather")
        if loop is _WAIT:
            return anyio.sleep_forever()
        _, leaves, treedef, signature, originals = self._all_gather_checks(
            value, axis, options, name
        )
        return _default.issue(signature, loop, _returns, _result(value, originals, leaves, treedef))

    def broadcast(self, value: Any, source: int = 0, *, name: str | None = None) -> Awaitable[Any]:
        """Return ``value`` (one replica), once awaited; see :func:`_result`."""
        loop = self._enter("broadcast")
        if loop is _WAIT:
            return anyio.sleep_forever()
        _, leaves, treedef, signature, originals = self._broadcast_checks(value, source, name)
        return _default.issue(signature, loop, _returns, _result(value, originals, leaves, treedef))

    def reduce_scatter(
        self, reduce_op: ReduceOp | str, value: Any, axis: int = 0, *, name: str | None = None
    ) -> Awaitable[Any]:
        """Return ``value`` (one replica: the only chunk is the whole), once awaited.

        See :func:`_result`.
        """
        loop = self._enter("reduce_scatter")
        if loop is _WAIT:
            return anyio.sleep_forever()
        _, leaves, treedef, signature, originals = self._reduce_scatter_checks(
            reduce_op, value, axis, name
        )
        return _default.issue(signature, loop, _returns, _result(value, originals, leaves, treedef))

    def barrier(self, *, name: str | None = None) -> Awaitable[None]:
        """Return at once (one replica), once awaited."""
        loop = self._enter("barrier")
        if loop is _WAIT:
            return anyio.sleep_forever()
        signature = self._barrier_checks(name)[1]
        return _default.issue(signature, loop, _returns, None)

    def merge_call(
        self,
        merge_fn: Callable[..., Any],
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> Awaitable[Any]:
        """Call ``merge_fn(strategy, *args, **kwargs)`` in cross-replica context, once awaited."""
        loop = _default.loop_here()
        if loop is not None and LIVE_RUNS:
            _refuse_default_in_replica("merge_call")
        if current_mode().replica is not self:
            raise _cross_replica_error("merge_call")
        args, kwargs = _merge_call_checks(merge_fn, args, kwargs)
        args, kwargs = tuple(args), dict(kwargs)
        signature = _merge_signature(None, merge_fn_name(merge_fn), args, kwargs)
        return _default.issue(signature, loop, _merge, self._strategy, merge_fn, args, kwargs)


# What DefaultReplicaContext._enter returns when the collective waits for trio to cancel it.
_WAIT: Any = object()


def _result(
    value: object, originals: list[object], leaves: list[object], treedef: TreeDef
) -> object:
    """What a default collective of ``value`` returns: what one replica's would return.

    ``originals`` are ``value``'s leaves, ``leaves`` the collective's (``_held``: a leaf
    the backend converts was converted once, when it was issued). When none converts,
    ``value`` itself: the collective is the identity (as in TensorFlow). Otherwise the
    structure rebuilt around the converted leaves, each as one replica's collective
    returns it, never the caller's object read again: a numpy array is a read-only copy
    (it does not share the caller's buffer: a ``bytearray``, a ``memoryview``, an
    ``__array__`` object's own array), as a ``MirroredStrategy`` of one replica returns.
    """
    if leaves is originals:
        return value
    out = [
        leaf if leaf is original else _settled(leaf)
        for leaf, original in zip(leaves, originals, strict=True)
    ]
    return unflatten(treedef, out)


def _settled(leaf: object) -> object:
    """A converted leaf as a collective's result: a numpy array read-only, its own copy."""
    np: Any = sys.modules.get("numpy")
    if np is not None and isinstance(leaf, np.ndarray):
        copy = leaf.copy()
        copy.flags.writeable = False
        return copy
    return leaf


async def _returns(value: Any) -> Any:
    """A default collective's body: its result, made when it was issued (:func:`_result`)."""
    return value


async def _merge(
    strategy: Strategy, merge_fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """A default ``merge_call``'s body: ``merge_fn`` called in cross-replica context."""
    token = MODE.set(Mode(strategy, True, None))
    try:
        result = merge_fn(strategy, *args, **kwargs)
        if inspect.isawaitable(result):
            result = await result
    finally:
        MODE.reset(token)
    return result
