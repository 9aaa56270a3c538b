"""Cross-replica reductions: ``Strategy.reduce``'s leaves and ``strategy.extended``."""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, cast, final

from .._core._components import (
    by_shape,
    check_components,
    check_reduced,
    empty_extremum_error,
    normalize_axes,
)
from .._core._devices import parse_device
from .._core._dtypes import number_dtype, reduced_dtype
from .._core._nest import flatten, is_nest, map_structure, regroup, select_replica, unflatten
from .._core._signature import CollectiveKind, LeafSpec, ReduceOp
from .._exceptions import CollectiveMismatchError, ReplicaContextError
from .._options import CommunicationOptions
from .._values import DistributedValues, IndexedSlices, Mirrored
from ._context import (
    DefaultReplicaContext,
    _check_args,
    broke,
    hold_result,
    hold_results,
)
from ._held import held_leaves
from ._merge_key import merge_fn_key, merge_fn_name
from ._mode import current_mode
from ._values import flatten_distributed

if TYPE_CHECKING:
    from ..abc import Backend, ProcessGroup

__all__ = ["StrategyExtended", "axis_tuple", "check_components", "normalize_axes", "reduce_leaf"]


class ContainerStrategy(Protocol):
    """What ``StrategyExtended`` and the reductions read of their strategy.

    TensorFlow's "container strategy": a ``_strategy.Strategy``, which is above this module
    (it creates the ``StrategyExtended``), so this module names its class nowhere, not even
    for types.
    """

    @property
    def _devices(self) -> tuple[str, ...]:
        """The devices of this process's replicas."""

    @property
    def _num_local(self) -> int:
        """This process's replicas."""

    @property
    def _replica_offset(self) -> int:
        """The global id of this process's first replica."""

    @property
    def _group(self) -> ProcessGroup | None:
        """The processes the strategy spans; None within one."""

    @property
    def _local_backend(self) -> Backend:
        """The backend of this process's replicas alone."""

    @property
    def backend(self) -> Backend:
        """The strategy's backend."""

    @property
    def _as_is(self) -> set[type]:
        """The leaf types its backend reads as they are (``_held``: not converted)."""

    @property
    def communication_options(self) -> CommunicationOptions:
        """The strategy's default options."""

    @property
    def num_replicas_in_sync(self) -> int:
        """Replicas in sync, over every process."""

    @property
    def extended(self) -> StrategyExtended:
        """``strategy.extended``."""

    def _require_cross_replica(self, api: str, instead: str) -> None:
        """Raise ``ReplicaContextError`` unless in cross-replica context."""

    def _crossing(self, name: str) -> contextlib.AbstractContextManager[None]:
        """Count a call that may cross processes (``ProcessGroup.call_begins``)."""

    def _component(self, replica_id: int, leaf: object) -> object:
        """Replica ``replica_id``'s component of ``leaf``."""

    def _is_process_value(self, leaf: object) -> bool:
        """Whether plain ``leaf`` is a value this process's one replica handed out."""

    async def _run(
        self, fn: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any] | Any
    ) -> Any:
        """Run ``fn`` once per replica (``Strategy.run``'s engine)."""


def axis_tuple(axis: object) -> tuple[int, ...] | None:
    """``Strategy.reduce``'s ``axis`` as a tuple (None for None).

    Raises:
        TypeError: ``axis`` is not an int, a tuple or list of ints, or None.
    """
    if axis is None:
        return None
    if isinstance(axis, int) and not isinstance(axis, bool):
        return (axis,)
    if isinstance(axis, tuple | list) and all(
        isinstance(a, int) and not isinstance(a, bool) for a in axis
    ):
        return tuple(axis)
    raise TypeError(f"Expected `axis` to be an integer, tuple or list not: {type(axis)}")


def _is_number(value: object) -> bool:
    return isinstance(value, int | float | complex) and not isinstance(value, bool)


_NUMBERS = (int, float, complex)


def held_components(
    strategy: ContainerStrategy, components: Sequence[object]
) -> tuple[list[object], list[LeafSpec]]:
    """Each replica's component as the backend reads it, and its spec; a refusal names it.

    The cross-replica APIs (``Strategy.reduce``, ``gather``, ``extended.reduce_to``,
    ``batch_reduce_to``) read one component per replica as a collective reads each
    replica's value in that replica: converted once, now, where the backend converts it
    (``_held``'s rule: the components returned are what is combined, never the values
    again), then described. An error says whose component it was.
    """
    backend = strategy.backend
    offset = strategy._replica_offset

    def noted(error: Exception, i: int) -> Exception:
        error.add_note(f"(in replica {i + offset}'s component of the distributed value)")
        return error

    held = held_leaves(backend, strategy._as_is, list(components), noted)
    describe = backend.describe
    specs = []
    for i, component in enumerate(held):
        try:
            specs.append(describe(component))
        except Exception as error:
            raise noted(error, i)  # noqa: B904 (the error itself, noted)
    return held, specs


def held_value(strategy: ContainerStrategy, value: object) -> object:
    """One plain value as the backend reads it: converted once, now (``_held``'s rule)."""
    return held_leaves(strategy.backend, strategy._as_is, [value], lambda error, _: error)[0]


async def reduce_leaf(
    strategy: ContainerStrategy, op: ReduceOp, leaf: object, axes: tuple[int, ...] | None
) -> object:
    """Reduce one leaf across replicas (``Strategy.reduce`` and ``extended.reduce_to``).

    Returns:
        A new value; for a plain (non-distributed) array a new writable copy.

    Raises:
        ValueError: Replicas hold values of different shapes or ranks, an axis is out
            of range, or SUM/PROD of a value that is not distributed on several replicas.
    """
    backend = strategy.backend
    describe = backend.describe
    n = strategy._num_local
    group = strategy._group
    where = f"the {backend.name!r} backend's reduce ({type(backend).__name__}.reduce), for "
    where += f"{op.value} along axis {axes}" if axes is not None else f"{op.value}"
    # With one replica per process, run (or merge_call) handed this process's replica's
    # value out unwrapped, where one process holds a PerReplica: it is that replica's
    # component, checked and reduced across processes as one (docs/scale-out.md).
    replicas = isinstance(leaf, DistributedValues)
    if replicas or (group is not None and strategy._is_process_value(leaf)):
        components = [strategy._component(i, leaf) for i in range(n)] if replicas else [leaf]
        specs: list[LeafSpec] | None = None
        try:
            components, specs = held_components(strategy, components)
            norm = check_reduced(op, specs, axes, 0 if group is None else group.offset)
        except (CollectiveMismatchError, TypeError, ValueError) as error:
            if group is None:
                raise
            # Found by this process's replicas alone (a value it cannot describe, too):
            # every process raises it (in the agreement the others make for this
            # reduce), none waits for this one.
            await group.refuse(error, components=None if specs is None else (op, axes, specs))
        assert specs is not None  # refuse raises
        if norm is None:
            if strategy._group is None and all(type(c) in _NUMBERS for c in components):
                # Distributed Python numbers are a collective's values, described as
                # the backend describes them (numpy: int64, float64): reduced by the
                # path reduce_to and all_reduce take, to the same bits and a 0-d array.
                # (TensorFlow's int32/float32 is for a plain number: see below.)
                due = reduced_spec(op, specs[0], None)
                reduced = await backend.all_reduce(op, [[c] for c in components])
                hold_results(
                    describe,
                    lambda what: broke(backend, _all_reduce_text(backend, op), what),
                    reduced,
                    n,
                    [due],
                )
                one = await backend.reduce(ReduceOp.SUM, [reduced[0][0]], None)
                return hold_result(backend, where, one, due)
            result = await backend.reduce(op, components, None)
            return hold_result(backend, where, result, reduced_spec(op, specs[0], None))
        result = await backend.reduce(op, components, norm)
        return hold_result(backend, where, result, reduced_spec(op, specs[0], norm))
    # Any other plain value is one value, as in one process. Where some process has one
    # replica (its plain values stand for its replica), a plain value here stands for
    # this process's value on each of its replicas, and the reduction crosses processes:
    # this process refuses in the agreement what it cannot reduce, so that every process
    # raises it and none waits.
    crossing = group is not None and min(group.replica_counts) == 1
    norm = None
    given = leaf
    try:
        leaf = held_value(strategy, leaf)  # converted once, now (_held's rule)
        spec = describe(leaf)
        if type(leaf) in _NUMBERS:
            # A plain Python number reduces in TensorFlow's dtype for it (int32, float32).
            spec = spec._replace(dtype=number_dtype(leaf))  # type: ignore[arg-type]
        # SUM along an axis is N times the value's sum, as in TF; SUM without an axis
        # and PROD of one value on several replicas are ambiguous (N: every process's).
        total = strategy.num_replicas_in_sync
        if total > 1 and (op is ReduceOp.PROD or (op is ReduceOp.SUM and axes is None)):
            raise _ambiguous(leaf, op, total)
        if axes is not None:
            norm = normalize_axes(axes, spec.shape)
            empty = empty_extremum_error(op, [tuple(spec.shape)], norm, plain=True)
            if empty is not None:
                raise empty
    except (TypeError, ValueError) as error:
        if group is not None:
            # Every process takes part (see group.agree below): it raises this error too,
            # none waits for this one.
            await group.refuse(error)
        raise
    if crossing:
        result = await backend.reduce(op, [leaf] * n, norm)
        return hold_result(backend, where, result, reduced_spec(op, spec, norm))
    if group is not None:
        # Reduced on this process alone, but the processes' calls are compared (op,
        # axis, shape, dtype), as one process's replicas' are: a call that differs
        # raises CollectiveMismatchError on every process, whatever the layout.
        await group.agree(op, norm, spec)
    # The one value's result: the local backend copies or reduces it.
    local = strategy._local_backend
    if norm is None:
        if isinstance(given, IndexedSlices):
            return given  # not an array
        # The value itself, as a new writable array (never the caller's own object): no
        # arithmetic, as TensorFlow (the MEAN of a plain int32 is that int32 value).
        return await _copy_of(local, where, leaf, spec)
    if op is ReduceOp.SUM:
        # Every replica holds the value: SUM along ``axis`` is N times its sum, as in TF
        # (N of every process: the same number as in one process).
        result = await local.reduce(op, [leaf] * strategy.num_replicas_in_sync, norm)
    else:
        result = await local.reduce(op, [leaf], norm)
    return hold_result(local, where, result, reduced_spec(op, spec, norm))


async def _copy_of(local: Backend, where: str, leaf: object, spec: LeafSpec) -> object:
    """A new, writable copy of plain ``leaf``: what a cross-replica API hands back for it.

    The one way ``Strategy.reduce`` (no axis) and ``Strategy.gather`` return a plain
    value, as TensorFlow returns it unchanged, but never the caller's own array
    (docs/concepts.md, "Read-only shared results": their results belong to you).
    """
    return hold_result(local, where, await local.reduce(ReduceOp.SUM, [leaf], None), spec)


async def plain_gathered(strategy: ContainerStrategy, leaf: object) -> object:
    """What ``Strategy.gather`` returns for a plain leaf in one process: a copy of it.

    TensorFlow returns a plain value unchanged; here an array comes back as a new one
    (:func:`_copy_of`), as ``Strategy.reduce`` returns it. Python numbers (immutable),
    ``IndexedSlices`` and values the backend does not hold come back as they are.
    """
    if type(leaf) in _NUMBERS or isinstance(leaf, IndexedSlices):
        return leaf
    local = strategy._local_backend
    try:
        held = held_value(strategy, leaf)  # converted once, now (_held's rule)
        spec = local.describe(held)
    except TypeError:
        return leaf
    where = f"the {local.name!r} backend's reduce ({type(local).__name__}.reduce), "
    where += "copying a plain value for Strategy.gather"
    return await _copy_of(local, where, held, spec)


def reduced_spec(op: ReduceOp, spec: LeafSpec, axes: tuple[int, ...] | None) -> LeafSpec:
    """What ``Strategy.reduce`` of values described as ``spec`` returns (the reference's rule).

    Along ``axes`` (non-negative) those axes are gone; the dtype is ``reduced_dtype``'s
    (integer MEAN is float64), the one rule of every reduction. ``IndexedSlices`` stay
    sparse without an axis.
    """
    if axes is None:
        return spec._replace(dtype=reduced_dtype(op, spec.dtype))
    shape = tuple(size for k, size in enumerate(spec.shape) if k not in axes)
    return spec._replace(shape=shape, dtype=reduced_dtype(op, spec.dtype), sparse=False)


def _all_reduce_text(backend: Backend, op: ReduceOp) -> str:
    return (
        f"the {backend.name!r} backend's all_reduce ({type(backend).__name__}.all_reduce), "
        f"for {op.value} across replicas"
    )


def _ambiguous(leaf: object, op: ReduceOp, n: int) -> ValueError:
    return ValueError(
        f"A non-DistributedValues value {leaf!r:.60} cannot be reduced with the given "
        f"reduce op {op}: it is one value, not one per replica, so {op.value} across "
        f"{n} replicas is ambiguous. Pass a PerReplica value (for example the result "
        "of strategy.run) or use MEAN."
    )


@final
class _VarRef:
    """One replica's ``var``, as ``extended.update``'s ``merge_fn`` receives it.

    A leaf to ``regroup``, so the ``merge_fn`` gets the very objects the replicas passed:
    a dict or list ``var`` itself would be rebuilt as a new container, never the object
    the replicas passed (and told apart from it by ``is``).
    """

    __slots__ = ("var",)

    def __init__(self, var: Any) -> None:
        self.var = var


def _passed_var(ref: Any, first: int) -> Any:
    """The one ``var`` that every replica passed to ``extended.update`` (see :class:`_VarRef`).

    ``ref``: the regrouped :class:`_VarRef` (a ``PerReplica`` of them, or one with one
    replica); ``first``: the global id of its first component's replica.

    Raises:
        ValueError: The replicas passed different objects.
    """
    refs = ref.values if isinstance(ref, DistributedValues) else (ref,)
    components = [r.var for r in refs]
    if all(c is components[0] for c in components):
        return components[0]
    groups: dict[int, tuple[object, list[int]]] = {}
    for i, component in enumerate(components, first):
        groups.setdefault(id(component), (component, []))[1].append(i)
    passed = "; ".join(
        f"replica{'s' if len(ids) > 1 else ''} {', '.join(map(str, ids))} passed "
        f"{type(obj).__name__} at {id(obj):#x}"
        for obj, ids in groups.values()
    )
    raise ValueError(
        "extended.update in replica context updates one var for every replica (it runs "
        f"fn once per component of it), so every replica must pass the same object, but "
        f"{passed}. Capture one distributed variable and pass it on every replica, or "
        "update each value in cross-replica context (inside a merge_fn or outside "
        "Strategy.run)."
    )


def _destination_count(destinations: object, num_local: int) -> int | None:
    """None for one device (a single result); else how many components."""
    if destinations is None:
        raise ValueError(
            "destinations must be given: a device string or an array (one result), a list "
            "of devices, or a distributed value whose devices receive a Mirrored result"
        )
    count: int | None
    if isinstance(destinations, str):
        parse_device(destinations)
        return None
    if isinstance(destinations, DistributedValues):
        count = len(destinations.values)
    elif isinstance(destinations, list | tuple) and destinations:
        for d in destinations:
            parse_device(d)
        count = len(destinations)
    elif hasattr(destinations, "dtype") and not isinstance(destinations, type):
        # An array names the device it lives on, as a TensorFlow tensor does.
        return None
    else:
        raise TypeError(
            f"destinations must be a device string, an array, a non-empty list of devices "
            f"or a distributed value, got {destinations!r:.80}"
        )
    # One destination is one device: a single result, as TensorFlow's regroup gives.
    return None if count == 1 else count


@final
class StrategyExtended:
    """The extended, cross-replica API of a strategy (``strategy.extended``)."""

    def __init__(self, strategy: ContainerStrategy) -> None:
        self._strategy = strategy

    @property
    def worker_devices(self) -> tuple[str, ...]:
        """The device of each local replica, in replica order."""
        return self._strategy._devices

    @property
    def parameter_devices(self) -> tuple[str, ...]:
        """The devices that hold mirrored values: the same as :attr:`worker_devices`."""
        return self._strategy._devices

    def value_container(self, value: Any) -> Any:
        """Return the distributed variable that holds ``value``: ``value`` itself here.

        asyncreplica has no variables, so every value is its own container, as a
        non-variable value is in TensorFlow.
        """
        return value

    async def _mirror(self, value: object, count: int | None) -> object:
        if count is None:
            return value
        backend = self._strategy.backend
        leaves = [value.values, value.indices] if isinstance(value, IndexedSlices) else [value]
        views = await backend.broadcast(leaves, count)
        where = (
            f"the {backend.name!r} backend's broadcast ({type(backend).__name__}.broadcast), "
            f"copying a value to {count} destinations"
        )
        hold_results(
            backend.describe,
            lambda what: broke(backend, where, what, "value"),
            views,
            count,
            [backend.describe(leaf) for leaf in leaves],
        )
        if isinstance(value, IndexedSlices):
            return Mirrored([IndexedSlices(v[0], v[1], value.dense_shape) for v in views])
        return Mirrored([v[0] for v in views])

    def _bytes_per_pack(self, options: CommunicationOptions | None) -> int:
        if options is not None and not isinstance(options, CommunicationOptions):
            raise TypeError(f"options must be CommunicationOptions or None, got {options!r}")
        merged = self._strategy.communication_options.merge(options)
        return merged.bytes_per_pack

    async def reduce_to(
        self,
        reduce_op: ReduceOp | str,
        value: Any,
        destinations: Any,
        options: CommunicationOptions | None = None,
    ) -> Any:
        """Reduce ``value`` across replicas and place the result on ``destinations``.

        Args:
            reduce_op: A :class:`ReduceOp` or its name.
            value: A ``PerReplica`` (or plain) value, or a nest of them (each leaf is
                reduced; all leaves in one batched reduction). A ``PerReplica`` whose
                components are nests is reduced leaf by leaf, as in
                :meth:`Strategy.reduce`.
            destinations: A device string or an array (it names its device) gives one
                result; a list of devices or a distributed value gives a ``Mirrored``
                result with one read-only view per destination (an all-reduce). One
                destination gives a single result, as in TensorFlow.
            options: ``CommunicationOptions`` (hints).

        Returns:
            The reduced value, single (a new writable array) or ``Mirrored``.

        Raises:
            ReplicaContextError: Called inside a replica.
            ValueError: ``destinations`` is None, or as :meth:`Strategy.reduce`.
        """
        self._strategy._require_cross_replica("extended.reduce_to", "await ctx.all_reduce(...)")
        with self._strategy._crossing("extended.reduce_to"):
            op = ReduceOp(reduce_op)
            return (await self._batch(op, [(value, destinations)], options))[0]

    async def batch_reduce_to(
        self,
        reduce_op: ReduceOp | str,
        value_destination_pairs: Sequence[tuple[Any, Any]],
        options: CommunicationOptions | None = None,
    ) -> list[Any]:
        """Reduce several values, each to its destinations (see :meth:`reduce_to`).

        All the values are reduced in one batch, packed as ``all_reduce`` packs them
        (``bytes_per_pack``); results never depend on packing.

        Args:
            reduce_op: A :class:`ReduceOp` or its name.
            value_destination_pairs: A list of ``(value, destinations)`` tuples.
            options: ``CommunicationOptions`` (hints).

        Returns:
            One result per pair, in order; ``[]`` for no pairs.

        Raises:
            ValueError: An element is not a ``(value, destinations)`` tuple, or as
                :meth:`reduce_to`.
        """
        self._strategy._require_cross_replica(
            "extended.batch_reduce_to", "await ctx.all_reduce(...)"
        )
        with self._strategy._crossing("extended.batch_reduce_to"):
            return await self._batch_reduce_to(reduce_op, value_destination_pairs, options)

    async def _batch_reduce_to(
        self,
        reduce_op: ReduceOp | str,
        value_destination_pairs: Sequence[tuple[Any, Any]],
        options: CommunicationOptions | None,
    ) -> list[Any]:
        op = ReduceOp(reduce_op)
        if not isinstance(value_destination_pairs, list | tuple):
            raise ValueError(
                "value_destination_pairs must be a list of (value, destinations) tuples, got "
                f"{type(value_destination_pairs).__name__}"
            )
        for k, pair in enumerate(value_destination_pairs):
            if not isinstance(pair, tuple) or len(pair) != 2:
                raise ValueError(
                    "Each element of `value_destination_pairs` should be a tuple "
                    f"(value, destinations); element {k} is {type(pair).__name__} {pair!r:.60}"
                )
        return await self._batch(op, value_destination_pairs, options)

    async def _batch(
        self,
        op: ReduceOp,
        pairs: Sequence[tuple[Any, Any]],
        options: CommunicationOptions | None,
    ) -> list[Any]:
        """Reduce every leaf of every pair, the distributed dense ones in one batch."""
        strategy = self._strategy
        group = strategy._group
        if group is None:
            return await self._batch_in(op, pairs, options)
        # Each leaf is its own cross-process reduction (see _batchable); as one batch,
        # they act on a floating-point error (an overflow's warning) once per dtype, as
        # one process's one combine of the batch's values does.
        with group.batch():
            if options is not None and options.timeout_seconds is not None:
                # The per-call timeout bounds the wait for the other processes too.
                with group.call_timeout(options.timeout_seconds):
                    return await self._batch_in(op, pairs, options)
            return await self._batch_in(op, pairs, options)

    async def _batch_in(
        self,
        op: ReduceOp,
        pairs: Sequence[tuple[Any, Any]],
        options: CommunicationOptions | None,
    ) -> list[Any]:
        strategy = self._strategy
        bytes_per_pack = self._bytes_per_pack(options)
        n = strategy._num_local
        plan: list[tuple[list[object], Any, int | None]] = []
        batch: list[DistributedValues[Any]] = []
        for value, destinations in pairs:
            count = _destination_count(destinations, n)
            leaves, treedef = flatten_distributed(
                value, "extended.reduce_to", strategy._replica_offset
            )
            plan.append((leaves, treedef, count))
            for leaf in leaves:
                if self._batchable(leaf) and all(leaf is not b for b in batch):
                    batch.append(leaf)  # type: ignore[arg-type]
        reduced, dues = await self._reduce_batch(op, batch, bytes_per_pack)
        results: list[Any] = []
        for leaves, treedef, count in plan:
            out: list[object] = []
            for leaf in leaves:
                index = next((k for k, b in enumerate(batch) if b is leaf), None)
                if index is None:
                    single = await reduce_leaf(strategy, op, leaf, None)
                    # A value that is not distributed stays one value, as in TensorFlow.
                    plain = not isinstance(leaf, DistributedValues)
                    out.append(single if plain else await self._mirror(single, count))
                elif count is None:
                    # One destination: a new writable array.
                    backend = strategy.backend
                    one = await backend.reduce(ReduceOp.SUM, [reduced[0][index]], None)
                    where = f"the {backend.name!r} backend's reduce ({type(backend).__name__}"
                    where += ".reduce), copying a reduced value to one destination"
                    out.append(hold_result(backend, where, one, dues[index]))
                elif count == n:
                    out.append(Mirrored([reduced[i][index] for i in range(n)]))
                else:
                    out.append(await self._mirror(reduced[0][index], count))
            results.append(unflatten(treedef, out))
        return results

    def _batchable(self, leaf: object) -> bool:
        """Whether ``leaf`` can join the one batched reduction of a local strategy."""
        strategy = self._strategy
        if strategy._group is not None or not isinstance(leaf, DistributedValues):
            return False  # under MPI each leaf is its own agreed cross-process reduction
        return not any(isinstance(c, IndexedSlices) for c in leaf.values)

    async def _reduce_batch(
        self, op: ReduceOp, batch: Sequence[DistributedValues[Any]], bytes_per_pack: int
    ) -> tuple[Sequence[Sequence[object]], list[LeafSpec]]:
        """The batch's reduced leaves, one list per replica, and what each is due to be."""
        if not batch:
            return [], []
        strategy = self._strategy
        n = strategy._num_local
        per_replica = [[strategy._component(i, leaf) for leaf in batch] for i in range(n)]
        backend = strategy.backend
        describe = backend.describe
        dues = []
        for j in range(len(batch)):
            held, specs = held_components(strategy, [per_replica[i][j] for i in range(n)])
            for i in range(n):
                per_replica[i][j] = held[i]  # what the batch combines (converted once)
            check_components("extended.reduce_to", CollectiveKind.ALL_REDUCE, op, specs)
            shapes = [tuple(s.shape) for s in specs]
            if len(set(shapes)) > 1:
                raise ValueError(
                    f"extended.reduce_to combines the replicas' values element-wise, so they "
                    f"need one shape, but {by_shape(shapes)} (value {j} of the batch)."
                )
            dues.append(reduced_spec(op, specs[0], None))
        reduced = await backend.all_reduce(op, per_replica, bytes_per_pack=bytes_per_pack)
        where = _all_reduce_text(backend, op) + f" of a batch of {len(batch)} values"
        hold_results(describe, lambda what: broke(backend, where, what), reduced, n, dues)
        return reduced, dues

    async def broadcast_to(self, value: Any, destinations: Any) -> Any:
        """Copy ``value`` to ``destinations``.

        Several destinations give a ``Mirrored`` of read-only views; one device gives
        a single new array, as in TensorFlow. Python numbers and distributed values
        (``PerReplica``, ``Mirrored``) are returned unchanged, as TensorFlow returns them.

        Args:
            value: The value to copy, or a nest of values (each leaf is copied, and the
                nest comes back with the same structure).
            destinations: A device string, a list of devices or a distributed value.
                Unlike ``reduce_to``, an array is refused, as in TensorFlow.

        Raises:
            ValueError: ``destinations`` is None or an array.
        """
        strategy = self._strategy
        strategy._require_cross_replica("extended.broadcast_to", "await ctx.broadcast(...)")
        if not isinstance(destinations, str | list | tuple | DistributedValues) and hasattr(
            destinations, "dtype"
        ):
            raise ValueError(
                "broadcast_to: destinations must be a device string, a list of devices or a "
                f"distributed value, got an array {destinations!r:.60} (as in TensorFlow, "
                "only reduce_to takes an array, for the device it names): pass its "
                "device, e.g. 'CPU:0'"
            )
        count = _destination_count(destinations, strategy._num_local)
        if is_nest(value):  # leaf by leaf, as reduce_to takes a nest
            leaves, treedef = flatten(value)
            return unflatten(treedef, [await self._broadcast(v, count) for v in leaves])
        return await self._broadcast(value, count)

    async def _broadcast(self, value: object, count: int | None) -> object:
        strategy = self._strategy
        if _is_number(value) or isinstance(value, DistributedValues):
            return value
        value = held_value(strategy, value)  # converted once, now (_held's rule)
        spec = strategy.backend.describe(value)
        if count is None:
            # A copy on this process (under MPI, the wrapped backend's would sum it
            # across processes).
            local = strategy._local_backend
            copy = await local.reduce(ReduceOp.SUM, [value], None)
            where = f"the {local.name!r} backend's reduce ({type(local).__name__}.reduce), "
            return hold_result(local, where + "copying a value to one destination", copy, spec)
        return await self._mirror(value, count)

    async def update(
        self,
        var: Any,
        fn: Callable[..., Any],
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        group: bool = True,
    ) -> Any:
        """Call ``fn(component_i, *args_i, **kwargs_i)`` on each component of ``var``.

        TensorFlow's ``extended.update``. In cross-replica context ``fn`` runs once per
        local component of ``var`` (a ``Mirrored`` or ``PerReplica`` value; a plain value
        with one replica), with the ``i``-th component of each distributed argument.
        In replica context the call goes through ``merge_call`` (so every replica must
        call it, and it is a collective); ``var`` must then be the same object on every
        replica (captured, not a per-replica argument), and ``fn`` the same code and
        ``group`` the same value (compared as ``merge_call`` compares ``merge_fn``: never
        replica 0's ``fn`` run for all). ``fn`` may be ``async``.

        Args:
            var: The distributed value to update.
            fn: ``fn(component, *args, **kwargs)``; its result is collected.
            args: Positional arguments (a list or tuple); distributed leaves are split.
            kwargs: Keyword arguments; distributed leaves are split.
            group: True regroups the results as ``Mirrored`` (one replica: the plain
                result); False returns a tuple of the per-component results.

        Returns:
            The regrouped results.

        Raises:
            TypeError: ``fn`` is not callable, or ``var`` is not distributed on several
                replicas.
            ValueError: ``args`` is not a list or tuple, or a component count is wrong,
                or (in replica context) the replicas passed different ``var`` objects.
            CollectiveMismatchError: In replica context, the replicas passed different
                ``fn`` code or ``group``, or issued another collective at this position.

        Example:
            >>> import asyncio
            >>> import asyncreplica as ar
            >>> strategy = ar.MirroredStrategy(["CPU:0", "CPU:1"])
            >>> weights = ar.Mirrored([1.0, 1.0])
            >>> step = ar.PerReplica([0.5, 0.25])
            >>> asyncio.run(strategy.extended.update(weights, lambda w, d: w - d, args=(step,)))
            Mirrored:{
              0: 0.5,
              1: 0.75
            }
        """
        if not callable(fn):
            raise TypeError(f"fn must be callable as fn(component, *args, **kwargs), got {fn!r}")
        args, kwargs = _check_args(args, kwargs, "extended.update")
        if not isinstance(group, bool):
            raise TypeError(f"group must be True or False, got {group!r}")
        mode = current_mode()
        replica = mode.replica
        if replica is not None and not isinstance(replica, DefaultReplicaContext):
            if replica.strategy is not self._strategy:
                raise ReplicaContextError(
                    f"extended.update of {self._strategy!r} was called in a replica of "
                    f"{replica.strategy!r}: mixing strategies is not supported."
                )

            run = replica._require_current("extended.update")

            def merge_fn(strategy: ContainerStrategy, ref: Any, *a: Any, **k: Any) -> Any:
                # Replica 0's closure runs, as in TensorFlow: the replicas agreed on fn's
                # code and on group (the key below), and on var here.
                var = _passed_var(ref, strategy._replica_offset)
                return strategy.extended._update(var, fn, a, k, group)

            # What the replicas must agree on is the user's fn (by code, as merge_call's
            # merge_fn) and group, not this closure, which is the same on every replica.
            key = ("extended.update", merge_fn_key(fn), group)
            name = f"extended.update({merge_fn_name(fn)}{'' if group else ', group=False'})"
            return await replica._merge_call(
                run, merge_fn, (_VarRef(var), *args), kwargs, key, name
            )
        return await self._update(var, fn, args, kwargs, group)

    async def _update(
        self,
        var: Any,
        fn: Callable[..., Any],
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
        group: bool,
    ) -> Any:
        strategy = self._strategy
        n = strategy._num_local
        if isinstance(var, DistributedValues):
            components = [strategy._component(i, var) for i in range(n)]
        elif n == 1:
            components = [var]
        else:
            raise TypeError(
                f"extended.update needs a distributed value (a Mirrored or PerReplica with one "
                f"component per replica) to update on {n} replicas, got {type(var).__name__}"
            )
        results = []
        for i, component in enumerate(components):
            a = cast("tuple[Any, ...]", select_replica(i, tuple(args), strategy._component))
            k = cast("dict[str, Any]", select_replica(i, dict(kwargs), strategy._component))
            result = fn(component, *a, **k)
            if inspect.isawaitable(result):
                result = await result
            results.append(result)
        regrouped = regroup(results, Mirrored, strategy._replica_offset)
        if group:
            return regrouped
        return map_structure(
            lambda leaf: leaf.values if isinstance(leaf, DistributedValues) else (leaf,),
            regrouped,
        )

    async def call_for_each_replica(
        self,
        fn: Callable[..., Any],
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> Any:
        """Run ``fn`` once per replica and regroup the results (``Strategy.run``'s engine).

        As in TensorFlow it skips ``run``'s check that ``args`` is a list or tuple
        (any sequence is taken) and may be called inside a ``merge_fn``, where its
        result becomes the ``merge_call`` result.

        Raises:
            ReplicaContextError: Called inside a replica.

        Example:
            >>> import asyncio
            >>> import asyncreplica as ar
            >>> strategy = ar.MirroredStrategy(["CPU:0", "CPU:1"])
            >>> def fn(x):
            ...     return x + ar.get_replica_context().replica_id_in_sync_group
            >>> asyncio.run(strategy.extended.call_for_each_replica(fn, args=[10]))
            PerReplica:{
              0: 10,
              1: 11
            }
        """
        strategy = self._strategy
        strategy._require_cross_replica(
            "extended.call_for_each_replica", "call the function directly"
        )
        if not callable(fn):
            raise TypeError(f"call_for_each_replica expects a function, got {fn!r}")
        return await strategy._run(fn, tuple(args), dict(kwargs or {}))
