"""Strategies: ``MirroredStrategy``, its ``extended`` and the default strategy."""

from __future__ import annotations

import contextlib
import inspect
import random
import sys
import threading
from collections.abc import (
    AsyncIterable,
    Callable,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from typing import TYPE_CHECKING, Any, SupportsFloat, cast, final

from .._core._devices import device_type, parse_device
from .._core._nest import flatten, is_nest, regroup, select_replica, unflatten
from .._core._report import format_replicas
from .._core._signature import CollectiveKind, LeafSpec, ReduceOp
from .._exceptions import (
    AsyncReplicaError,
    BackendError,
    BackendNotFoundError,
    CollectiveError,
    CollectiveMismatchError,
    ReplicaContextError,
)
from .._launch import launched_by_mpiexec
from .._options import CommunicationOptions, seconds_option
from .._registry import (
    available_process_groups,
    load_backend_class,
    load_process_group_class,
)
from .._values import DistributedValues, PerReplica, ValueContext
from ._context import (
    DefaultReplicaContext,
    ReplicaContext,
    _check_args,
    broke,
    hold_results,
)
from ._ending import generator_step, generator_step_error, refuse_generator_result
from ._extended import (
    StrategyExtended,
    axis_tuple,
    check_components,
    held_components,
    normalize_axes,
    plain_gathered,
    reduce_leaf,
)
from ._gc import scaled_gc
from ._input import DistributedDataset, DistributedDatasetsFromFunction, InputContext
from ._mode import MODE, Mode, current_mode, set_default_mode
from ._preload import preload_async_backends
from ._run import Run
from ._traceback import hide_library_frames
from ._values import component, flatten_distributed, regroup_always_wrap

if TYPE_CHECKING:
    from os import PathLike

    from .._tracing import ChromeTracer
    from ..abc import Backend, ProcessGroup
    from ._trace import Tracer

__all__ = [
    "DefaultStrategy",
    "DistributedDataset",
    "DistributedDatasetsFromFunction",
    "InputContext",
    "MirroredStrategy",
    "Strategy",
    "StrategyExtended",
    "default_strategy",
]


def _coroutine_error(fn: object) -> TypeError:
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", "step")
    return TypeError(
        "Strategy.run expects a function to call once per replica, but got a coroutine "
        f"object {fn!r}.\n\n"
        "Probably you wrote:\n\n"
        f"    await strategy.run({name}(x))             # incorrect!\n\n"
        "Instead pass the function and its arguments (notice: no call parentheses):\n\n"
        f"    await strategy.run({name}, args=(x,))     # correct"
    )


class _Crossing:
    """``ProcessGroup.call_begins``/``call_ends`` around one call.

    A class, not ``contextlib.contextmanager``: that one re-raises an exception through
    a generator and sets its ``__traceback__``, which an exception class may refuse
    (the user's exception would become an ``AttributeError``), and it adds frames.
    """

    __slots__ = ("group", "name", "token")

    def __init__(self, group: ProcessGroup, name: str) -> None:
        self.group = group
        self.name = name
        self.token: object = None

    def __enter__(self) -> None:
        self.token = self.group.call_begins(self.name)

    def __exit__(self, kind: object, error: object, traceback: object) -> None:
        self.group.call_ends(self.token, raised=kind is not None)


#: Outside MultiWorkerMirroredStrategy no call is counted.
_NOT_CROSSING: contextlib.AbstractContextManager[None] = contextlib.nullcontext()


class Strategy:
    """The base of every strategy: run a function on replicas and combine their values.

    Use :class:`MirroredStrategy`; outside any strategy, :func:`get_strategy` returns
    the default strategy, which runs one replica and whose reductions are the identity.
    """

    def __init__(
        self,
        devices: Sequence[str],
        backend: Backend,
        communication_options: CommunicationOptions,
        check_call_sites: bool,
        stall_warning_seconds: float | None = 30.0,
        schedule: str = "fifo",
        seed: int | None = None,
    ) -> None:
        # Not inside the first run, where the import would block the event loop.
        preload_async_backends()
        self._devices = tuple(devices)
        self._schedule = schedule
        self._seed = seed
        self._runs = 0  # runs started, so that each run of a seeded strategy differs
        self._stall_warning_seconds = stall_warning_seconds
        # The tracer of the runs to come (set by strategy.trace()); None when off.
        self._tracer: Tracer | None = None
        self._backend = backend
        # The backend of this process's replicas alone (under MPI, the wrapped one).
        self._local_backend = backend
        # The leaf types the backend reads as they are (Backend.convert; see _held).
        self._as_is: set[type] = set()
        self._communication_options = communication_options
        self._check_call_sites = check_call_sites
        self._extended = StrategyExtended(self)
        # The processes the strategy spans (MultiWorkerMirroredStrategy), else None.
        self._group: ProcessGroup | None = None
        # The global id of this process's first replica (MultiWorkerMirroredStrategy).
        self._replica_offset = 0
        # With one replica per process, the plain values run and merge_call handed out:
        # they stand for this process's replica in a cross-replica call (_extended.py).

    # -- look-ups ---------------------------------------------------------------------

    @property
    def num_replicas_in_sync(self) -> int:
        """How many replicas run in sync."""
        return len(self._devices)

    @property
    def _num_local(self) -> int:
        """How many replicas this process runs (all of them, but under MPI)."""
        return len(self._devices)

    @property
    def extended(self) -> StrategyExtended:
        """The extended API: ``reduce_to``, ``batch_reduce_to``, ``broadcast_to``, devices."""
        return self._extended

    @property
    def backend(self) -> Backend:
        """The backend that holds this strategy's values."""
        return self._backend

    @property
    def communication_options(self) -> CommunicationOptions:
        """The strategy-wide collective options (per-call options are merged over them)."""
        return self._communication_options

    # -- context ----------------------------------------------------------------------

    @contextlib.contextmanager
    def scope(self) -> Iterator[Strategy]:
        """Make this strategy current, in cross-replica context.

        Re-entering the same strategy's scope is allowed.

        Yields:
            This strategy.

        Raises:
            ReplicaContextError: Called inside a replica, or inside another strategy's
                scope.
        """
        mode = current_mode()
        if mode.replica is not None and not isinstance(mode.replica, DefaultReplicaContext):
            raise ReplicaContextError(
                "Method requires being in cross-replica context, use "
                "get_replica_context().merge_call(): strategy.scope() cannot be entered "
                "inside a replica."
            )
        if mode.strategy is not self and not isinstance(mode.strategy, DefaultStrategy):
            raise ReplicaContextError(
                f"Mixing different strategies: {self!r} is not {mode.strategy!r}. Leave the "
                "other strategy's scope first."
            )
        token = MODE.set(Mode(self, True, None))
        try:
            yield self
        finally:
            MODE.reset(token)

    @contextlib.contextmanager
    def trace(
        self, path: str | PathLike[str], *, max_events: int = 1_000_000
    ) -> Iterator[ChromeTracer]:
        """Record the runs in the block as a timeline that opens in ui.perfetto.dev.

        Writes Chrome trace-event JSON to ``path`` when the block exits, also when it
        raises: one track per replica with one slice per collective (arrival to
        resumption; kind, op, position, bytes, dtype, call site and time waited in its
        args), a backend track with each reduction and an arrow from the replica that
        arrived last, and, for a failed run, every replica's recent collectives.
        ``asyncreplica trace summarize FILE`` and ``asyncreplica trace plot FILE``
        read it. The environment variable ``ASYNCREPLICA_TRACE=FILE`` does the same
        for every run of a program.

        Args:
            path: The trace file; a name ending in ``.gz`` is gzip-compressed.
            max_events: How many events to keep: older collectives are dropped and
                the trace says how many.

        Yields:
            The tracer.

        Raises:
            FileNotFoundError: ``path``'s folder does not exist.
            ValueError: ``max_events`` is not a positive integer, or ``path`` is already
                being traced to in this process, by another open ``trace()`` block (of
                any strategy) or by ``ASYNCREPLICA_TRACE``: the file written last would
                overwrite the other.
        """
        from .._tracing import traced

        with traced(self, path, max_events=max_events) as tracer:
            yield tracer

    def _require_cross_replica(self, api: str, instead: str) -> None:
        mode = current_mode()
        if mode.replica is not None and not isinstance(mode.replica, DefaultReplicaContext):
            raise ReplicaContextError(
                f"{api} requires cross-replica context, but it was called inside a replica. "
                f"In a replica use {instead} instead, or call it from a merge_fn "
                "(get_replica_context().merge_call)."
            )
        if mode.strategy is not self and not isinstance(mode.strategy, DefaultStrategy):
            raise ReplicaContextError(
                f"{api} of {self!r} was called in the scope of another strategy "
                f"({mode.strategy!r}): mixing strategies is not supported."
            )

    # -- running ----------------------------------------------------------------------

    async def run(
        self,
        fn: Callable[..., Any],
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> Any:
        """Run ``fn`` once per replica and regroup the results.

        Each replica ``i`` gets ``args`` and ``kwargs`` with every ``PerReplica`` or
        ``Mirrored`` leaf replaced by its ``i``-th component (other leaves are passed
        as they are, the same object to every replica). ``fn`` is usually an ``async``
        function; a plain function is called per replica too. Results are merged as
        TensorFlow's ``regroup`` does: containers are rebuilt, a leaf that is the same
        object on every replica is returned as it is, other leaves become
        ``PerReplica``.

        Args:
            fn: The step function.
            args: Positional arguments (a list or tuple).
            kwargs: Keyword arguments.

        Returns:
            The regrouped results.

        Raises:
            TypeError: ``fn`` is a coroutine object, a generator or async generator
                function (a ``@types.coroutine`` one is a coroutine function), or not
                callable; or calling it returned a generator or an async generator (a
                callable object, a lambda or a wrapper around one).
            ValueError: ``args`` is not a list or tuple, or a ``PerReplica`` argument
                has the wrong number of components.
            ReplicaContextError: Called inside a replica (nested run) or inside another
                strategy's scope.
            CollectiveError: Replicas disagreed about their collectives.
            Exception: Whatever a replica raised, re-raised as the same object with a
                note naming the replica (several as an ``ExceptionGroup``). The other
                replicas are cancelled. The strategy can run again afterwards.
        """
        # The counting is in this frame, not a wrapper's: an error whose library frames
        # were hidden leaves run with a bare raise, and a wrapper would add its frame.
        with self._crossing("Strategy.run"):
            if inspect.iscoroutine(fn):
                fn.close()
                raise _coroutine_error(fn)
            if not callable(fn):
                raise TypeError(f"Strategy.run expects a function, got {fn!r}")
            if generator_step(fn):
                raise generator_step_error(fn)
            args, kwargs = _check_args(args, kwargs, "Strategy.run")
            mode = current_mode()
            if mode.replica is not None and not isinstance(mode.replica, DefaultReplicaContext):
                raise ReplicaContextError(
                    "Strategy.run was called inside a replica (a nested run). Method requires "
                    "being in cross-replica context: call it outside the step function, or from "
                    "a merge_fn (get_replica_context().merge_call)."
                )
            if mode.strategy is not self and not isinstance(mode.strategy, DefaultStrategy):
                raise ReplicaContextError(
                    f"Mixing different strategies: {self!r} is not {mode.strategy!r}."
                )
            try:
                with scaled_gc(self._num_local):  # fewer collections while many replicas wait
                    return await self._run(fn, args, kwargs)
            except AsyncReplicaError as error:
                hide_library_frames(error)  # the user's frames only (see _traceback)
                raise  # ASYNCREPLICA_FULL_TRACEBACK=1 shows asyncreplica's frames too

    async def _run(
        self, fn: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any] | Any
    ) -> Any:
        n = self._num_local
        pick = self._component
        per_args = [select_replica(i, tuple(args), pick) for i in range(n)]
        per_kwargs = [select_replica(i, dict(kwargs), pick) for i in range(n)]
        run = Run(
            self,
            self._backend,
            check_call_sites=self._check_call_sites,
            stall_warning_seconds=self._stall_warning_seconds,
            tracer=self._tracer,
            shuffle=self._next_shuffle(),
        )
        modes = [Mode(self, False, ReplicaContext(self, i, run=run)) for i in range(n)]
        group = self._group
        if group is None:
            results = await run.execute(modes, fn, per_args, per_kwargs)  # type: ignore[arg-type]
            return regroup(results, PerReplica, self._replica_offset)
        group.begin_run()
        try:
            results = await run.execute(modes, fn, per_args, per_kwargs)  # type: ignore[arg-type]
        except BaseException as exc:
            # Tell the other processes, so that none of them waits for this one.
            await group.end_run(exc, report=run.ledger.report())
            if isinstance(exc, CollectiveError) and exc.report is not None:
                # Found by this process's ledger (its messages use global replica ids).
                last = self._replica_offset + self._num_local - 1
                exc.add_note(
                    f"(found on process {group.rank} of {group.size}, which runs "
                    f"{format_replicas(range(self._replica_offset, last + 1))})"
                )
            elif isinstance(exc, CollectiveError):
                # Found between processes: it reports this process's replicas.
                exc.report = run.ledger.report()
            raise
        try:
            # (the processes compare their replicas' structures, as regroup compares
            # one process's replicas', before any of them regroups its own)
            await group.end_run(None, structures=[flatten(r)[1] for r in results])
        except CollectiveError as exc:
            if exc.report is None:
                exc.report = run.ledger.report()
            raise
        result = regroup(results, PerReplica, self._replica_offset)
        return result

    def _is_process_value(self, leaf: object) -> bool:
        """Whether plain ``leaf`` stands for this process's one replica's value.

        With one replica per process, ``run`` returns that replica's value unwrapped and a
        ``merge_fn`` gets it as its argument (TensorFlow's one-replica rule), where one
        process holds a ``PerReplica``: every plain value there is this process's
        replica's value, as TensorFlow's multi-worker strategy counts each worker's host
        tensor as one contribution. Told by the layout, never by the object: a value
        derived from a run's result (``loss * 2``) means the same as the result.
        """
        del leaf  # the layout decides, the same way for every value
        return self._group is not None and self._num_local == 1

    def _next_shuffle(self) -> random.Random | None:
        self._runs += 1
        if self._schedule != "random":
            return None
        return random.Random(f"{self._seed}:{self._runs}")

    @property
    def schedule(self) -> tuple[str, int | None]:
        """``(schedule, seed)``: how replicas are interleaved between collectives."""
        return self._schedule, self._seed

    def _component(self, replica_id: int, leaf: object) -> object:
        return component(replica_id, leaf, num_replicas=self._num_local)

    # -- cross-replica APIs -------------------------------------------------------------

    async def reduce(self, reduce_op: ReduceOp | str, value: Any, axis: Any = None) -> Any:
        """Reduce ``value`` across replicas to one result (cross-replica context).

        Args:
            reduce_op: A :class:`ReduceOp` or its name.
            value: A ``PerReplica``/``Mirrored`` value, a plain value, or a nest of them
                (every leaf is reduced). A distributed value whose components are nests
                (``PerReplica([{"a": x0}, {"a": x1}])``) is the nest of distributed
                values ``{"a": PerReplica([x0, x1])}``: reduced leaf by leaf, as
                ``all_reduce`` reduces a nest, with the same structure back.
            axis: ``None`` reduces across replicas only, element-wise. An int, tuple or
                list also reduces each replica's value along those axes first;
                ``MEAN`` then divides the global sum by the global element count, so
                uneven batches are weighted correctly.

        The result dtypes are ``all_reduce``'s (one rule, ``_core._dtypes``): ``SUM``
        keeps the input dtype; the ``MEAN`` of integers is float64, the true mean
        rounded once. ``IndexedSlices``
        components are concatenated (MEAN scales the values), as in TensorFlow. A
        plain Python number comes back as a numpy scalar of TensorFlow's dtype for it
        (``2.5`` as float32, ``2`` as int32).

        Returns:
            The result, with the structure of ``value`` (new, writable arrays; a plain
            value comes back as a copy, never as the caller's own array).

        Raises:
            ReplicaContextError: Called inside a replica (use ``ctx.all_reduce``).
            CollectiveMismatchError: The components of a leaf differ in dtype (or are
                sparse on some replicas only), as ``all_reduce``'s values may not.
            TypeError: ``axis`` has the wrong type, or a leaf is not numeric.
            ValueError: Bad op or axis; components of one distributed value that are
                nests of different structures; replicas whose values differ in shape
                (``axis=None``), in rank, or in the dimensions left after reducing
                ``axis``; or ``SUM`` with ``axis=None`` (or ``PROD``) of a value
                that is not distributed on several replicas (it would be counted once
                per replica; ``SUM`` along an ``axis`` counts it N times, as in TF).
        """
        self._require_cross_replica("Strategy.reduce", "await ctx.all_reduce(...)")
        with self._crossing("Strategy.reduce"):
            op = ReduceOp(reduce_op)
            axes = axis_tuple(axis)
            leaves, treedef = flatten_distributed(value, "Strategy.reduce", self._replica_offset)
            if self._group is not None and treedef is not None:
                await self._group.agree_structure("Strategy.reduce", treedef)
            out = [await reduce_leaf(self, op, leaf, axes) for leaf in leaves]
            return unflatten(treedef, out)

    def _crossing(self, name: str) -> contextlib.AbstractContextManager[None]:
        """Count a call that may cross processes (``ProcessGroup.call_begins``).

        Entered before the call checks its arguments: a process that refuses them alone
        then stays counted, and its next call cannot pair with the others' part of this
        one (every process raises that it is out of step instead).
        """
        group = self._group
        return _NOT_CROSSING if group is None else _Crossing(group, name)

    async def gather(self, value: Any, axis: int) -> Any:
        """Concatenate each replica's component along ``axis`` (cross-replica context).

        Args:
            value: A ``PerReplica`` value or a nest of them; plain leaves come back
                unchanged (as in TensorFlow), an array as a new one of the same value. Under ``MultiWorkerMirroredStrategy``
                where some process has one replica, a plain leaf is this process's
                value on each of its replicas, gathered across processes.
            axis: The axis to concatenate along; negative counts from the end.

        Returns:
            The gathered value (new arrays), with the structure of ``value``.

        Raises:
            ReplicaContextError: Called inside a replica (use ``ctx.all_gather``).
            CollectiveMismatchError: The components differ in dtype (or are sparse on
                some replicas only), as ``all_gather``'s values may not.
            ValueError: A component is a scalar or ``axis`` is out of range.

        ``IndexedSlices`` components are densified and concatenated, as in TensorFlow.
        """
        self._require_cross_replica(
            "tf.distribute.Strategy.gather method", "get_replica_context().all_gather()"
        )
        with self._crossing("Strategy.gather"):
            return await self._gather(value, axis)

    async def _gather(self, value: Any, axis: int) -> Any:
        if isinstance(axis, bool) or not isinstance(axis, int):
            raise TypeError(f"gather: axis must be an int, got {axis!r}")
        leaves, treedef = flatten_distributed(value, "Strategy.gather", self._replica_offset)
        if self._group is not None and treedef is not None:
            await self._group.agree_structure("Strategy.gather", treedef)
        out: list[object] = []
        for leaf in leaves:
            group = self._group
            if isinstance(leaf, DistributedValues):
                components = [self._component(i, leaf) for i in range(self._num_local)]
            elif group is not None and min(group.replica_counts) == 1:
                # A process with one replica holds plain values (run unwraps them): a
                # plain value stands for this process's value on each of its replicas
                # and is gathered across processes (docs/scale-out.md, "Plain values").
                components = [leaf] * self._num_local
            else:
                # One value, as in one process: a copy of it, never the caller's array.
                out.append(await plain_gathered(self, leaf))
                continue
            try:
                components, specs = held_components(self, components)
                rank = len(specs[0].shape)
                # all_gather's shape row needs the axis itself (a negative one counts
                # from the end of the first component's rank; out of range: below).
                along = axis % rank if rank and -rank <= axis < rank else None
                check_components(
                    "Strategy.gather",
                    CollectiveKind.ALL_GATHER,
                    None,
                    specs,
                    along,
                    0 if group is None else group.offset,
                )
                axes = set()
                for spec in specs:
                    shape = spec.shape
                    if not shape:
                        raise ValueError(
                            "gather needs values of rank >= 1; reshape scalars to (1,)"
                        )
                    axes.add(normalize_axes((axis,), shape)[0])
                if len(axes) > 1:
                    raise ValueError(
                        f"gather: axis {axis} means different axes for components of different rank"
                    )
            except (CollectiveMismatchError, TypeError, ValueError) as error:
                if group is None:
                    raise
                # Found by this process alone (a value it cannot describe, a scalar, a
                # dtype that differs between its replicas): every process raises it in
                # the agreement the others make for this gather, none waits.
                await group.refuse(error)
            along = axes.pop()
            gathered = await self._backend.gather(components, along)
            self._check_gathered(gathered, specs, along)
            out.append(gathered)
        return unflatten(treedef, out)

    def _check_gathered(self, gathered: object, specs: list[LeafSpec], axis: int) -> None:
        """Refuse a backend's ``gather`` result that is not the components' concatenation.

        The rule the collectives' results are held to (``result_fits``): a backend that
        answers otherwise would give a silently wrong value. Across processes this one
        holds only its own components' sizes along ``axis``.
        """
        first = specs[0]
        size = sum(spec.shape[axis] for spec in specs)
        # IndexedSlices are densified, as TensorFlow's gather does.
        shape = (*first.shape[:axis], size, *first.shape[axis + 1 :])
        due = first._replace(shape=shape, sparse=False)
        backend = self._backend
        hold_results(
            backend.describe,
            lambda what: broke(
                backend,
                f"the {backend.name!r} backend's gather ({type(backend).__name__}.gather), "
                f"for {type(self).__name__}.gather along axis {axis}",
                what,
            ),
            [[gathered]],
            1,
            [due],
            None if self._group is None else axis,
            single=True,
        )

    def experimental_local_results(self, value: Any) -> tuple[Any, ...]:
        """Return the local components of ``value``, one per local replica.

        A ``PerReplica``/``Mirrored`` gives its components. A nest (list, tuple, dict,
        namedtuple) gives one nest per local replica, with each distributed leaf
        replaced by that replica's component and other leaves kept, even when no leaf
        is distributed (``()`` gives ``((), ())`` on two replicas), as in TensorFlow.
        Any other value gives ``(value,)``.
        """
        if isinstance(value, DistributedValues):
            return value.values
        if is_nest(value):
            return tuple(select_replica(i, value, self._component) for i in range(self._num_local))
        return (value,)

    def experimental_distribute_values_from_function(
        self, value_fn: Callable[[ValueContext], Any]
    ) -> Any:
        """Call ``value_fn(ValueContext(i, n))`` for each local replica ``i``; regroup.

        The results are regrouped as ``run``'s are, but every leaf is wrapped (TF's
        ``always_wrap``): a single value gives a ``PerReplica`` (also when every
        replica returned the same object, and with one replica), a dict of values
        gives a dict of ``PerReplica``, and so on.

        Raises:
            TypeError: ``value_fn`` is not callable or is ``async``.
            ValueError: Replicas returned values of different structure.
        """
        if not callable(value_fn):
            raise TypeError(f"value_fn must be callable, got {value_fn!r}")
        n = self.num_replicas_in_sync
        first = self._replica_offset
        values = []
        for i in range(first, first + self._num_local):
            value = value_fn(ValueContext(i, n))
            if inspect.isawaitable(value):
                if inspect.iscoroutine(value):
                    value.close()
                raise TypeError("value_fn must be a plain function, not an async one")
            values.append(value)
        return regroup_always_wrap(values, first)

    def experimental_distribute_dataset(
        self, dataset: Iterable[Any] | AsyncIterable[Any], options: object = None
    ) -> DistributedDataset:
        """Split each global batch of ``dataset`` across the replicas.

        Each batch (an array, a list of numbers, or a nest of arrays of one length) is
        split along its first axis into contiguous slices of ``ceil(len / n)``
        elements, filled in replica order, as TensorFlow 2.21 does: a batch of 6 over
        4 replicas gives 2, 2, 2 and 0 elements. Each element becomes a
        ``PerReplica`` (in a nest, each leaf does). With one replica each element is
        passed on as it is, batched or not, as in TensorFlow.

        Args:
            dataset: An iterable or async iterable of global batches. A re-iterable
                input (a list, or an object whose ``__iter__`` starts over) gives one
                pass per epoch; a one-shot iterator (a generator) can be iterated
                once, and a second pass raises ``RuntimeError``.
            options: Accepted for TensorFlow compatibility; must be None.

        Returns:
            A re-iterable (and, for an async input, async-iterable) dataset.

        Raises:
            UnbatchedElementError: With several replicas, an element has no batch axis
                to split (an ``IndexError``, as TensorFlow's, and a ``TypeError``).
        """
        if options is not None:
            raise ValueError("experimental_distribute_dataset takes no options here; pass None")
        if not isinstance(dataset, Iterable | AsyncIterable):
            raise TypeError(f"dataset must be an iterable of batches, got {type(dataset).__name__}")
        return DistributedDataset(
            dataset,
            self.num_replicas_in_sync,
            range(self._replica_offset, self._replica_offset + self._num_local),
            self._backend.describe,
        )

    def distribute_datasets_from_function(
        self, dataset_fn: Callable[[InputContext], Any], options: object = None
    ) -> DistributedDatasetsFromFunction:
        """Build this process's input pipeline with ``dataset_fn``; split it per replica.

        ``dataset_fn(InputContext(...))`` is called once, now, for this process's input
        pipeline (one per process: ``MirroredStrategy`` has one, a
        ``MultiWorkerMirroredStrategy`` one per MPI process) and returns an iterable of
        **per-replica** batches; use ``ctx.get_per_replica_batch_size(global_batch)``
        to size them and ``ctx.input_pipeline_id`` to shard. No rebatching is done:
        each step, each local replica takes the next batch, in replica order, as in
        TensorFlow. If the input runs out in the middle of a step, TensorFlow's rule
        for static and dynamic batch sizes applies: when every batch had the same
        length (``drop_remainder=True``) or the elements are unbatched scalars, the
        epoch ends there; when the lengths varied (a shorter remainder batch), the
        remaining replicas get empty batches (length 0, same rank).

        Args:
            dataset_fn: ``dataset_fn(input_context)`` returns an iterable (or async
                iterable) of per-replica batches.
            options: Accepted for TensorFlow compatibility; must be None.

        Returns:
            A dataset to iterate with ``for`` or ``async for``; each element is a
            ``PerReplica`` (in a nest, each leaf is), or the plain batch with one
            local replica.

        Raises:
            TypeError: ``dataset_fn`` is not callable or returns something that is not
                iterable.
            ValueError: ``options`` is not None, or as ``dataset_fn`` raises (for
                example ``get_per_replica_batch_size`` of an indivisible batch).

        Example:
            >>> import asyncreplica as ar
            >>> import numpy as np
            >>> strategy = ar.MirroredStrategy(["CPU:0", "CPU:1"])
            >>> def dataset_fn(ctx):
            ...     batch = ctx.get_per_replica_batch_size(4)
            ...     data = np.arange(8.0)
            ...     return [data[i : i + batch] for i in range(0, len(data), batch)]
            >>> for x in strategy.distribute_datasets_from_function(dataset_fn):
            ...     print(strategy.experimental_local_results(x))
            (array([0., 1.]), array([2., 3.]))
            (array([4., 5.]), array([6., 7.]))
        """
        if options is not None:
            raise ValueError("distribute_datasets_from_function takes no options here; pass None")
        if not callable(dataset_fn):
            raise TypeError(f"dataset_fn must be callable, got {dataset_fn!r}")
        group = self._group
        context = InputContext(
            num_input_pipelines=1 if group is None else group.size,
            input_pipeline_id=0 if group is None else group.rank,
            num_replicas_in_sync=self.num_replicas_in_sync,
        )
        dataset = dataset_fn(context)
        if not isinstance(dataset, Iterable | AsyncIterable):
            raise TypeError(
                f"dataset_fn must return an iterable of per-replica batches, got "
                f"{type(dataset).__name__}"
            )
        return DistributedDatasetsFromFunction(dataset, self._num_local, self._backend.describe)

    def experimental_distribute_datasets_from_function(
        self, dataset_fn: Callable[[InputContext], Any], options: object = None
    ) -> DistributedDatasetsFromFunction:
        """Deprecated alias of :meth:`distribute_datasets_from_function` (as in TensorFlow)."""
        return self.distribute_datasets_from_function(dataset_fn, options)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} of {self.num_replicas_in_sync} replicas on {list(self._devices)}>"

    def __copy__(self) -> Strategy:
        raise TypeError(f"{type(self).__name__} objects cannot be copied; share the one you have")

    def __deepcopy__(self, memo: object) -> Strategy:
        raise TypeError(f"{type(self).__name__} objects cannot be copied; share the one you have")


def _load_backend(name: str, devices: Sequence[str]) -> Backend:
    cls = load_backend_class(name)
    cls.check_available()
    return cls(devices)


@final
class MirroredStrategy(Strategy):
    """Run replicas as coroutines on one event loop, one per device.

    Args:
        devices: The replicas' devices, e.g. ``["CPU:0", "CPU:1"]`` (TensorFlow
            spellings accepted). Default: every GPU if a GPU backend sees any, else
            ``["CPU:0"]``.
        backend: A backend name (``"numpy"``) or a :class:`~asyncreplica.abc.Backend`
            instance. Default: ``"numpy"`` for CPU devices.
        communication_options: Default ``CommunicationOptions`` for every collective.
        check_call_sites: Whether replicas' unnamed collectives at one position must
            come from the same call path (it catches skipped collectives whose
            neighbours look alike). Turn it off only when replicas legitimately reach
            the same collective through different code.
        stall_warning_seconds: When a collective has waited this long for missing
            replicas, log a warning on the ``asyncreplica`` logger saying where each
            missing replica is awaiting (and log again if it completes after all).
            None disables it. It never fails the run; ``timeout_seconds`` does. Any
            positive real number (numpy scalars too) or ``math.inf``; NaN, 0, negative
            numbers and bools are refused.
        schedule: ``"fifo"`` (the default) runs replicas in a fixed order.
            ``"random"`` varies, reproducibly from ``seed``, the order in which
            replicas start and resume after each collective, so that tests find
            order-dependent bugs in user code and replay them from the seed (exactly
            on asyncio and uvloop; trio also shuffles its run queue on its own).
        seed: The seed of ``schedule="random"`` (default: a fresh random seed,
            readable from :attr:`schedule`).

    Raises:
        TypeError: An argument has the wrong type.
        ValueError: No devices, a duplicate or unknown device, a device the backend
            cannot hold values on, or ``stall_warning_seconds`` NaN, 0 or negative.
        BackendNotFoundError: ``backend`` names no installed backend.
        BackendError: The backend is installed but cannot run here.
    """

    #: TensorFlow's ``strategy.cluster_resolver``: None for a one-process strategy.
    cluster_resolver: None = None

    def __init__(
        self,
        devices: Sequence[str] | None = None,
        *,
        backend: str | Backend | None = None,
        communication_options: CommunicationOptions | None = None,
        check_call_sites: bool = True,
        stall_warning_seconds: SupportsFloat | None = 30.0,
        schedule: str = "fifo",
        seed: int | None = None,
    ) -> None:
        parsed, instance, communication_options, stall = _setup(
            devices, backend, communication_options, check_call_sites, stall_warning_seconds
        )
        if schedule not in ("fifo", "random"):
            raise ValueError(f"schedule must be 'fifo' or 'random', got {schedule!r}")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise TypeError(f"seed must be an int or None, got {seed!r}")
        if schedule == "random" and seed is None:
            seed = random.SystemRandom().randrange(2**32)
        super().__init__(
            parsed,
            instance,
            communication_options,
            check_call_sites,
            stall,
            schedule,
            seed,
        )
        from .._tracing import trace_from_environment  # ASYNCREPLICA_TRACE=FILE

        trace_from_environment(self)


@final
class MultiWorkerMirroredStrategy(Strategy):
    """The same program in several processes (MPI): every replica of every process in sync.

    Launch the program with ``mpiexec -n P python train.py``; each process creates
    the strategy with its own local ``devices`` (processes may run different
    numbers of replicas). Replicas are numbered globally in rank order:
    ``replica_id_in_sync_group`` and ``num_replicas_in_sync`` are global, while
    ``run`` returns, and ``experimental_local_results`` gives, this process's
    replicas' values only (as in TensorFlow's multi-worker strategy).

    Every collective is hierarchical: the local replicas meet and reduce, then one
    non-blocking MPI collective per process combines the processes' partial results
    (polled from the event loop, which stays responsive), then each local replica
    gets a read-only view. Before data moves, the processes agree on the collective
    (a fingerprint of its signature and call site), so a skipped, extra or
    mismatched collective on one process raises on every process instead of hanging;
    a process whose run ended (returned or raised) tells the others at once.
    ``merge_call`` runs ``merge_fn`` once per process over its local replicas; its
    ``strategy.reduce`` reduces across every process.

    Creating the strategy is collective: every process of ``communicator`` must
    create it, in the same order.

    Args:
        devices: This process's replicas' devices (default ``["CPU:0"]``).
        communicator: An mpi4py intracommunicator; default ``MPI.COMM_WORLD``. It is
            duplicated: the strategy never sends on the communicator it is given.
        backend: The local backend (default ``"numpy"``).
        communication_options: Default options; ``timeout_seconds`` also bounds the
            wait for the other processes (after which the job cannot continue).
        check_call_sites: Whether call sites must agree, across processes too.
        stall_warning_seconds: As for :class:`MirroredStrategy`.

    Raises:
        BackendNotFoundError: mpi4py (the ``[mpi]`` extra) is not installed.
        TypeError, ValueError: As for :class:`MirroredStrategy`.
    """

    def __init__(
        self,
        devices: Sequence[str] | None = None,
        *,
        communicator: object = None,
        backend: str | Backend | None = None,
        communication_options: CommunicationOptions | None = None,
        check_call_sites: bool = True,
        stall_warning_seconds: SupportsFloat | None = 30.0,
    ) -> None:
        if devices is None and backend is None:
            devices = ["CPU:0"]
        # Every argument is checked here, before any MPI call. A refusal of this
        # process's own arguments is then told to the others, which wait in their
        # constructors for this one (see _tell_refusal: only where an MPI launcher
        # started this process or MPI is in use; one process never starts MPI for a
        # refusal). GPU devices are the exception: refused before any MPI call and
        # never told (scale-out.md, Limits).
        try:
            gpus = (
                [d for d in _parse_devices(devices) if device_type(d) == "GPU"]
                if devices is not None
                else []
            )
        except (TypeError, ValueError) as exc:
            _tell_refusal(communicator, exc, communication_options, stall_warning_seconds)
            raise
        if gpus:
            raise ValueError(
                f"MultiWorkerMirroredStrategy moves values between processes through host "
                f"memory (numpy); GPU devices ({', '.join(gpus)}) are not supported across "
                "processes yet. Use CPU devices, or MirroredStrategy for GPUs in one process."
            )
        try:
            parsed, local, communication_options, stall = _setup(
                devices, backend, communication_options, check_call_sites, stall_warning_seconds
            )
        except (TypeError, ValueError) as exc:
            _tell_refusal(communicator, exc, communication_options, stall_warning_seconds)
            raise
        # The "mpi" process group, from its entry point (asyncreplica.process_groups).
        group_cls = cast("Callable[..., ProcessGroup]", load_process_group_class("mpi"))
        try:
            group = group_cls(
                communicator,
                len(parsed),
                check_call_sites=check_call_sites,
                timeout=communication_options.timeout_seconds,
                stall_warning_seconds=stall,
                options=_agreed_options(local, check_call_sites),
            )
        except ImportError as exc:  # mpi4py, or its MPI library, is missing
            raise BackendNotFoundError("mpi", available_process_groups(), exc) from exc
        super().__init__(
            parsed,
            group.wrap(local),
            communication_options,
            check_call_sites,
            stall,
        )
        self._group = group
        self._local_backend = local
        self._replica_offset = group.offset
        self._num_global = int(group.num_replicas)
        self.cluster_resolver = _ClusterResolver(group.rank, group.size)
        from .._tracing import trace_from_environment  # ASYNCREPLICA_TRACE=FILE

        trace_from_environment(self, rank=group.rank)  # one file per process

    @property
    def num_replicas_in_sync(self) -> int:
        """How many replicas run in sync, over all processes."""
        return self._num_global

    @property
    def process_rank(self) -> int:
        """This process's rank in the communicator (0 .. ``process_count - 1``)."""
        return self.cluster_resolver.task_id

    @property
    def process_count(self) -> int:
        """The number of processes."""
        return self.cluster_resolver.num_tasks

    def __repr__(self) -> str:
        return (
            f"<MultiWorkerMirroredStrategy process {self.process_rank} of "
            f"{self.process_count}: replicas {self._replica_offset}-"
            f"{self._replica_offset + self._num_local - 1} of {self._num_global} on "
            f"{list(self._devices)}>"
        )


def _tell_refusal(
    communicator: object,
    error: BaseException,
    communication_options: object,
    stall_warning_seconds: object,
) -> None:
    """Tell the other processes that this one refused its own arguments (``error``).

    Creating the strategy is collective: without this, a process that catches the error
    and goes on (or exits normally) leaves the others waiting in their constructors for
    ever. The others raise the same class, naming this process and its error. Best
    effort: whatever stops the telling (mpi4py missing, a timeout) leaves ``error`` to
    be raised; an interruption (Ctrl-C) is raised.

    Nothing is told, and MPI is never started, in a process that no MPI launcher
    started and that has not imported ``mpi4py.MPI``: nobody waits for it (a test
    suite's process, a script run plainly).
    """
    if "mpi4py.MPI" not in sys.modules and not launched_by_mpiexec():
        return
    try:
        group_cls = load_process_group_class("mpi")
    except Exception:
        return
    tell = getattr(group_cls, "tell_refusal", None)
    if tell is None:
        return
    timeout = (
        communication_options.timeout_seconds
        if isinstance(communication_options, CommunicationOptions)
        else None
    )
    try:  # the one rule for seconds; a refused value warns at the default
        stall = seconds_option(stall_warning_seconds, "stall_warning_seconds", zero_allowed=False)
    except (TypeError, ValueError):
        stall = 30.0
    with contextlib.suppress(Exception):
        tell(communicator, error, timeout=timeout, stall_warning_seconds=stall)


def _agreed_options(local: Backend, check_call_sites: bool) -> dict[str, object]:
    """The options every process of a ``MultiWorkerMirroredStrategy`` must give alike.

    ``check_call_sites`` decides what the processes compare at each collective, and the
    local backend's rules combine each process's replicas. The others may differ: the
    devices (each process's replica count), ``stall_warning_seconds`` (this process's
    warnings), ``bytes_per_pack`` and ``implementation`` (hints that never change a
    result) and ``timeout_seconds`` (each process's bound on its own waits: the first
    that passes ends the exchange on every process, which raise alike).
    """
    return {"check_call_sites": check_call_sites, "backend": local.name or type(local).__name__}


@final
class _ClusterResolver:
    """TensorFlow's ``strategy.cluster_resolver``: this task's id and the task count."""

    task_type = "worker"

    def __init__(self, task_id: int, num_tasks: int) -> None:
        self.task_id = task_id
        self.num_tasks = num_tasks

    def __repr__(self) -> str:
        return f"<cluster_resolver worker {self.task_id} of {self.num_tasks}>"


def _setup(
    devices: Sequence[str] | None,
    backend: str | Backend | None,
    communication_options: CommunicationOptions | None,
    check_call_sites: object,
    stall_warning_seconds: object,
) -> tuple[list[str], Backend, CommunicationOptions, float | None]:
    """Validate a mirrored strategy's arguments; load its backend.

    Returns the devices, the backend, the options and ``stall_warning_seconds`` as
    a float (or None).
    """
    from ..abc import Backend

    if communication_options is None:
        communication_options = CommunicationOptions()
    if not isinstance(communication_options, CommunicationOptions):
        raise TypeError(
            f"communication_options must be CommunicationOptions or None, got "
            f"{communication_options!r}"
        )
    if not isinstance(check_call_sites, bool):
        raise TypeError(f"check_call_sites must be True or False, got {check_call_sites!r}")
    stall = seconds_option(stall_warning_seconds, "stall_warning_seconds", zero_allowed=False)
    if backend is not None and not isinstance(backend, str | Backend):
        raise TypeError(f"backend must be a backend name or a Backend instance, got {backend!r}")
    parsed = _parse_devices(devices) if devices is not None else None
    if isinstance(backend, Backend):
        instance = backend
        if parsed is None:
            parsed = list(instance.devices) or ["CPU:0"]
    else:
        if parsed is None:
            parsed = _default_devices(backend)
        if backend is None:
            backend = "numpy" if all(device_type(d) == "CPU" for d in parsed) else "cupy"
        instance = _load_backend(backend, parsed)
    return parsed, instance, communication_options, stall


def _parse_devices(devices: object) -> list[str]:
    if isinstance(devices, str) or not isinstance(devices, Sequence):
        raise TypeError(
            f"devices must be a list of device names such as ['CPU:0', 'CPU:1'], got {devices!r}"
        )
    parsed = [parse_device(d) for d in devices]
    if not parsed:
        raise ValueError("devices must name at least one device, e.g. ['CPU:0']")
    seen: set[str] = set()
    for spec, d in zip(devices, parsed, strict=True):
        # Several replicas may share one GPU (they are reduced on its stream); CPU
        # replicas are virtual, so each needs its own name, as in TensorFlow.
        if d in seen and device_type(d) != "GPU":
            raise ValueError(
                f"device {spec!r} ({d}) is listed twice: each replica needs its own device "
                "name (for N CPU replicas use 'CPU:0' .. 'CPU:N-1')"
            )
        seen.add(d)
    return parsed


def _default_devices(backend: str | None) -> list[str]:
    if backend is not None:
        return load_backend_class(backend).default_devices()
    try:
        gpu = load_backend_class("cupy")
        gpu.check_available()
        return gpu.default_devices()
    except (BackendNotFoundError, BackendError):
        return ["CPU:0"]


@final
class DefaultStrategy(Strategy):
    """The strategy in effect outside any other: one replica, reductions are the identity."""

    #: TensorFlow's ``strategy.cluster_resolver``: None (one process).
    cluster_resolver: None = None

    def __init__(self) -> None:
        devices = ["CPU:0"]
        lazy = cast("Backend", _LazyBackend(devices))
        super().__init__(devices, lazy, CommunicationOptions(), True)
        self.default_replica_context = DefaultReplicaContext(self, 0)

    @contextlib.contextmanager
    def scope(self) -> Iterator[Strategy]:
        """Enter the default strategy's scope (no change of context).

        Raises:
            ReplicaContextError: Another strategy's scope is active.
        """
        mode = current_mode()
        if mode.strategy is not self:
            raise ReplicaContextError("Must not nest strategy scopes: leave the other scope first.")
        yield self

    async def _run(
        self, fn: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any] | Any
    ) -> Any:
        token = MODE.set(Mode(self, False, self.default_replica_context))
        try:
            result = fn(*args, **kwargs)
            refuse_generator_result(fn, result)
            if inspect.isawaitable(result):
                result = await result
        finally:
            MODE.reset(token)
        return result

    def experimental_distribute_values_from_function(
        self, value_fn: Callable[[ValueContext], Any]
    ) -> Any:
        """Return ``value_fn(ValueContext())`` unwrapped (one replica)."""
        if not callable(value_fn):
            raise TypeError(f"value_fn must be callable, got {value_fn!r}")
        return value_fn(ValueContext())


class _LazyBackend:
    """The default strategy's backend, loaded on first use (numpy is not imported before)."""

    def __init__(self, devices: Sequence[str]) -> None:
        self.devices = tuple(devices)
        self._backend: Backend | None = None

    def __getattr__(self, attr: str) -> Any:
        if self._backend is None:
            self._backend = _load_backend("numpy", self.devices)
        return getattr(self._backend, attr)


_default: DefaultStrategy | None = None
_default_lock = threading.Lock()


def default_strategy() -> DefaultStrategy:
    """Return the default strategy (created once)."""
    global _default
    if _default is None:
        with _default_lock:
            if _default is None:
                _default = DefaultStrategy()
    return _default


def _default_mode() -> Mode:
    """The mode outside any strategy: the default strategy and its replica context."""
    strategy = default_strategy()
    return Mode(strategy, False, strategy.default_replica_context)


set_default_mode(_default_mode)
