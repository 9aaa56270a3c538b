"""The input pipeline: distributed datasets and ``InputContext``.

``Strategy.experimental_distribute_dataset`` splits global batches across replicas
(:class:`DistributedDataset`); ``Strategy.distribute_datasets_from_function`` calls a
function once per input pipeline (one per process) with an :class:`InputContext`, and
each replica takes the next per-replica batch (:class:`DistributedDatasetsFromFunction`).
"""

from __future__ import annotations

import inspect
import math
import operator
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Iterator, Sized
from typing import Any, SupportsIndex, final

from .._core._nest import MAX_NEST_DEPTH, TreeDef, flatten, is_nest, map_structure, unflatten
from .._core._signature import LeafSpec
from .._values import PerReplica

__all__ = [
    "UNKNOWN_CARDINALITY",
    "DistributedDataset",
    "DistributedDatasetsFromFunction",
    "DistributedIterator",
    "DistributedOptional",
    "InputContext",
    "UnbatchedElementError",
]


@final
class InputContext:
    """What ``distribute_datasets_from_function`` passes to ``dataset_fn``, as in TensorFlow.

    There is one input pipeline per process: ``MirroredStrategy`` has one, a
    ``MultiWorkerMirroredStrategy`` has one per MPI process (``input_pipeline_id`` is
    the process rank). Use it to shard the input and to size per-replica batches.

    Args:
        num_input_pipelines: How many input pipelines (processes) there are.
        input_pipeline_id: This pipeline's id, ``0 .. num_input_pipelines - 1``.
        num_replicas_in_sync: How many replicas consume the input in sync.

    Example:
        >>> import asyncreplica as ar
        >>> ctx = ar.InputContext(num_input_pipelines=1, input_pipeline_id=0,
        ...                       num_replicas_in_sync=4)
        >>> ctx.get_per_replica_batch_size(64)
        16
        >>> ctx.get_per_replica_batch_size(10)
        Traceback (most recent call last):
        ...
        ValueError: The `global_batch_size` 10 is not divisible by `num_replicas_in_sync` 4...
    """

    __slots__ = ("_id", "_num_pipelines", "_num_replicas")

    def __init__(
        self,
        num_input_pipelines: int = 1,
        input_pipeline_id: int = 0,
        num_replicas_in_sync: int = 1,
    ) -> None:
        self._num_pipelines = num_input_pipelines
        self._id = input_pipeline_id
        self._num_replicas = num_replicas_in_sync

    @property
    def num_input_pipelines(self) -> int:
        """How many input pipelines (processes) there are."""
        return self._num_pipelines

    @property
    def input_pipeline_id(self) -> int:
        """This pipeline's id (the process rank), ``0 .. num_input_pipelines - 1``."""
        return self._id

    @property
    def num_replicas_in_sync(self) -> int:
        """How many replicas consume the input in sync (over all processes)."""
        return self._num_replicas

    def get_per_replica_batch_size(self, global_batch_size: int) -> int:
        """Return ``global_batch_size // num_replicas_in_sync``.

        Raises:
            ValueError: ``global_batch_size`` is not divisible by the number of replicas.
        """
        if global_batch_size % self._num_replicas != 0:
            raise ValueError(
                f"The `global_batch_size` {global_batch_size!r} is not divisible by "
                f"`num_replicas_in_sync` {self._num_replicas!r}: every replica must get the "
                "same batch size; choose a global batch size that is a multiple of the number "
                "of replicas."
            )
        return global_batch_size // self._num_replicas

    def __repr__(self) -> str:
        return (
            f"InputContext(num_input_pipelines={self._num_pipelines}, "
            f"input_pipeline_id={self._id}, num_replicas_in_sync={self._num_replicas})"
        )


def _one_shot(dataset: object) -> bool:
    """Whether iterating ``dataset`` consumes it (an iterator or a generator)."""
    if isinstance(dataset, AsyncIterable) and not isinstance(dataset, Iterable):
        return dataset.__aiter__() is dataset  # an async iterator returns itself
    return isinstance(dataset, Iterator)


class _Source:
    """An input that may be iterated once per epoch; a one-shot input only once."""

    def __init__(self, dataset: Iterable[Any] | AsyncIterable[Any], api: str) -> None:
        self._dataset = dataset
        self._api = api
        self.one_shot = _one_shot(dataset)
        self._started = False

    def _start(self) -> None:
        if self.one_shot and self._started:
            raise RuntimeError(
                f"this dataset ({self._api}) was built from a one-shot iterator "
                f"({type(self._dataset).__name__}), which the first pass consumed: a second "
                "epoch would silently see no batches. Pass a re-iterable input instead: a "
                "list, a tuple, or an object whose __iter__ starts over (for a generator, "
                "wrap the generator function in a class with __iter__)."
            )
        self._started = True

    def sync(self) -> Iterator[Any]:
        if not isinstance(self._dataset, Iterable):
            raise TypeError("this dataset is async: iterate it with `async for`")
        self._start()
        return iter(self._dataset)

    async def asynchronous(self) -> AsyncIterator[Any]:
        self._start()
        if isinstance(self._dataset, AsyncIterable):
            async for batch in self._dataset:
                yield batch
        else:
            for batch in self._dataset:
                yield batch

    def cardinality(self) -> int:
        """``len`` of a sized input, else :data:`UNKNOWN_CARDINALITY`."""
        dataset = self._dataset
        return len(dataset) if isinstance(dataset, Sized) else UNKNOWN_CARDINALITY


#: ``cardinality`` of an input whose length is not known ahead (``tf.data.UNKNOWN_CARDINALITY``).
UNKNOWN_CARDINALITY = -2


class UnbatchedElementError(IndexError, TypeError):
    """An element of ``experimental_distribute_dataset`` has no batch axis to split.

    TensorFlow raises ``IndexError`` for an unbatched dataset on several replicas; this
    error is an ``IndexError`` as TF's is, and a ``TypeError`` as asyncreplica's was.
    """


def _wrap(components: list[Any]) -> Any:
    """One replica's value as is (TensorFlow's one-replica rule), else a ``PerReplica``."""
    return components[0] if len(components) == 1 else PerReplica(components)


Describe = Callable[[object], LeafSpec]


def _spec(element: Any, describe: Describe) -> Any:
    """The element's structure with a ``LeafSpec`` per leaf (a ``PerReplica`` of them)."""
    leaves, treedef = flatten(element)
    specs = [
        PerReplica([describe(c) for c in leaf.values])
        if isinstance(leaf, PerReplica)
        else describe(leaf)
        for leaf in leaves
    ]
    return unflatten(treedef, specs)


_END: Any = object()


@final
class _Tail:
    """The padded partial step at the end of a pass with static batches.

    TensorFlow ends ``for`` loops (and ``next``, ``get_next``) before it, but
    ``get_next_as_optional`` and ``dataset.reduce`` still see it: the replicas left
    without data get an empty batch (a scalar element: zero).
    """

    __slots__ = ("step",)

    def __init__(self, step: Any) -> None:
        self.step = step


def _unwrap(element: Any) -> Any:
    return element.step if isinstance(element, _Tail) else element


@final
class DistributedOptional:
    """What ``get_next_as_optional`` returns: an element, or none at the end of the data.

    TensorFlow's ``tf.experimental.Optional``: ``has_value()`` is a Python ``bool``
    here (TF: a bool tensor) and ``get_value()`` of an empty optional raises
    ``ValueError`` (TF: ``InvalidArgumentError``).
    """

    __slots__ = ("_describe", "_value")

    def __init__(self, value: Any, describe: Describe) -> None:
        self._value = value
        self._describe = describe

    def has_value(self) -> bool:
        """Whether there is an element."""
        return self._value is not _END

    def get_value(self) -> Any:
        """The element.

        Raises:
            ValueError: The optional is empty (the iterator was at its end).
        """
        if self._value is _END:
            raise ValueError("the optional does not have a value: the iterator was at its end")
        return self._value

    @property
    def element_spec(self) -> Any:
        """The element's spec (see ``DistributedIterator.element_spec``).

        Raises:
            ValueError: The optional is empty.
        """
        return _spec(self.get_value(), self._describe)

    def __repr__(self) -> str:
        return f"DistributedOptional({'empty' if self._value is _END else self._value!r})"


@final
class DistributedIterator:
    """An iterator over a distributed dataset (``iter(dataset)``), as TensorFlow's.

    Besides ``next()`` it has TensorFlow's ``get_next()``, ``get_next_as_optional()``
    and ``element_spec``. The end of the data raises ``StopIteration`` from both
    ``next()`` and ``get_next()`` (TF's ``get_next`` raises ``OutOfRangeError``).
    As in TF, when ``distribute_datasets_from_function``'s data runs out in the middle
    of a step with static batches, ``next()`` ends, but ``get_next_as_optional()``
    still returns that last step, padded with empty batches.
    """

    __slots__ = ("_describe", "_elements", "_head", "_spec")

    def __init__(self, elements: Iterator[Any], describe: Describe) -> None:
        self._elements = elements
        self._describe = describe
        self._head: Any = None  # a peeked element, or _END; None when none is peeked
        self._spec: Any = None

    def __iter__(self) -> DistributedIterator:
        return self

    def __next__(self) -> Any:
        element = self._take()
        if element is _END or isinstance(element, _Tail):
            self._head = _END  # stays at its end
            raise StopIteration
        return element

    def raw(self) -> Iterator[Any]:
        """The remaining elements, the padded partial step included (as a ``_Tail``)."""
        while (element := self._take()) is not _END:
            yield element
        self._head = _END

    def _take(self) -> Any:
        head, self._head = self._head, None
        element = head if head is not None else next(self._elements, _END)
        if element is not _END and self._spec is None:
            self._spec = self._describe_first(_unwrap(element))
        return element

    def _describe_first(self, element: Any) -> Any:
        try:
            return _spec(element, self._describe)
        except TypeError as exc:  # a leaf no backend holds: raised if element_spec is read
            return exc

    def get_next(self) -> Any:
        """The next element.

        Raises:
            StopIteration: The data ran out (TF: ``tf.errors.OutOfRangeError``).
        """
        return next(self)

    def get_next_as_optional(self) -> DistributedOptional:
        """The next element in a :class:`DistributedOptional`, empty at the end."""
        element = self._take()
        if element is _END:
            self._head = _END
        return DistributedOptional(_unwrap(element), self._describe)

    @property
    def element_spec(self) -> Any:
        """The structure of an element with an ``asyncreplica.abc.LeafSpec`` per leaf.

        A distributed leaf gives a ``PerReplica`` of specs, one per local replica (TF's
        ``PerReplicaSpec``); with one replica each leaf's spec is plain, as TF's
        ``TensorSpec``. The shapes are those of the first element (TF writes ``None``
        for a batch dimension it cannot know ahead). Reading it before the first
        ``next()`` looks at the first element without consuming it.

        Raises:
            ValueError: The dataset has no elements.
        """
        if self._spec is None:
            if self._head is None:
                self._head = next(self._elements, _END)
            if self._head is _END:
                raise ValueError("element_spec: the dataset has no elements to describe")
            self._spec = self._describe_first(_unwrap(self._head))
        if isinstance(self._spec, TypeError):
            raise TypeError(f"element_spec: {self._spec}")
        return self._spec


class _Distributed:
    """What both distributed datasets share: iteration, ``element_spec``, ``reduce``."""

    _source: _Source
    _describe: Describe

    def _pass(self) -> Iterator[Any]:
        raise NotImplementedError  # pragma: no cover - each dataset defines its pass

    def _apass(self) -> AsyncIterator[Any]:
        raise NotImplementedError  # pragma: no cover

    def __iter__(self) -> DistributedIterator:
        head = self._peeked
        if head is not None:  # element_spec peeked at a one-shot input: continue that pass
            self._peeked = None
            return head
        return DistributedIterator(self._pass(), self._describe)

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._elements(tail=False)

    async def _elements(self, *, tail: bool) -> AsyncIterator[Any]:
        """One asynchronous pass; with ``tail``, the padded partial step too."""
        head = self._peeked
        if head is not None:  # element_spec peeked at a one-shot input: continue that pass
            self._peeked = None
            for element in head.raw():
                if tail or not isinstance(element, _Tail):
                    yield _unwrap(element)
            return
        async for element in self._apass():
            if tail or not isinstance(element, _Tail):
                yield _unwrap(element)

    _peeked: DistributedIterator | None = None

    @property
    def element_spec(self) -> Any:
        """The structure of an element with an ``asyncreplica.abc.LeafSpec`` per leaf.

        As :attr:`DistributedIterator.element_spec`: a distributed leaf gives a
        ``PerReplica`` of specs (one replica: the plain spec); shapes are the first
        element's. A re-iterable input is read up to its first element; for a
        one-shot input the element is kept for the pass that follows.

        Raises:
            ValueError: The dataset has no elements.
            TypeError: The input is async only: its first element cannot be read
                synchronously.
        """
        if self._source.one_shot:
            if self._peeked is None:
                self._peeked = DistributedIterator(self._pass(), self._describe)
            return self._peeked.element_spec
        return DistributedIterator(self._pass(), self._describe).element_spec

    @property
    def cardinality(self) -> int:
        """How many elements the input holds, as TensorFlow's ``cardinality``.

        The length of a sized input (a list: its number of batches, as TF counts the
        input dataset's elements, not the steps); :data:`UNKNOWN_CARDINALITY` (-2)
        for an iterator or generator.
        """
        return self._source.cardinality()

    async def reduce(self, initial_state: Any, reduce_func: Callable[[Any, Any], Any]) -> Any:
        """Fold the elements: ``state = reduce_func(state, element)`` for each one.

        TensorFlow's ``DistributedDataset.reduce``. ``reduce_func`` may be ``async``
        (or return an awaitable), so that it can ``await strategy.reduce(...)``. As in
        TensorFlow it also sees the padded partial step that ends a
        ``distribute_datasets_from_function`` pass with static batches.

        Returns:
            The final state (``initial_state`` for an empty dataset).
        """
        state = initial_state
        async for element in self._elements(tail=True):
            state = reduce_func(state, element)
            if inspect.isawaitable(state):
                state = await state
        return state


@final
class DistributedDataset(_Distributed):
    """Global batches split across replicas (see ``experimental_distribute_dataset``).

    Iterate it with ``for`` (or ``async for``) once per epoch; each element is a
    ``PerReplica`` (in a nest, each leaf is), or the element itself, unsplit, when
    there is one replica, as in TensorFlow. ``iter(dataset)`` is a
    :class:`DistributedIterator`; ``element_spec``, ``cardinality`` and ``reduce`` are
    TensorFlow's.
    """

    def __init__(
        self,
        dataset: Iterable[Any] | AsyncIterable[Any],
        num_replicas: int,
        local: range | None = None,
        describe: Describe | None = None,
    ) -> None:
        self._source = _Source(dataset, "experimental_distribute_dataset")
        self._num_replicas = num_replicas
        # The global ids of this process's replicas: it keeps only their slices.
        self._local = range(num_replicas) if local is None else local
        self._describe = _describe_default if describe is None else describe

    def _split(self, batch: Any) -> Any:
        n = self._num_replicas
        if n == 1:
            # TF's one replica: the element as it is (batched or not), its arrays as
            # read-only views (a step that writes into one must not rewrite the dataset).
            return map_structure(_whole_view, batch)
        # Tuples, namedtuples and mappings are structure, whatever their leaves: a
        # (feature, label) tuple of scalars is one unbatched sample, refused below, never
        # split across the tuple (see _flatten_batch and _batch_length).
        leaves, treedef = _flatten_batch(batch)
        lengths = set()
        for leaf in leaves:
            lengths.add(_batch_length(leaf))
        if len(lengths) > 1:
            raise ValueError(f"the leaves of one batch have different lengths: {sorted(lengths)}")
        size = lengths.pop() if lengths else 0
        per = math.ceil(size / n)
        bounds = [(min(i * per, size), min((i + 1) * per, size)) for i in self._local]
        split = [_wrap([_read_only(_rows(leaf, a, b)) for a, b in bounds]) for leaf in leaves]
        return unflatten(treedef, split)

    def _pass(self) -> Iterator[Any]:
        for batch in self._source.sync():
            yield self._split(batch)

    async def _apass(self) -> AsyncIterator[Any]:
        async for batch in self._source.asynchronous():
            yield self._split(batch)


def _read_only(piece: Any) -> Any:
    """``piece``, made read-only when it is a view that numpy can mark so.

    A replica's slice of a global batch is a view of the dataset's array: written into
    (``x[...] = ...``), it would rewrite the dataset for every later epoch. TensorFlow's
    tensors are immutable; numpy views are marked read-only (writing raises). Other
    libraries' slices are given as they come (PyTorch has no read-only tensors; JAX
    arrays are immutable). The runtime imports no array library: this is duck-typed.
    """
    setflags = getattr(piece, "setflags", None)
    if setflags is not None and getattr(piece, "base", None) is not None:
        setflags(write=False)
    return piece


def _whole_view(leaf: Any) -> Any:
    """A read-only view of the whole of a numpy array (see :func:`_read_only`), else ``leaf``."""
    ndim: object = getattr(leaf, "ndim", 0)
    if getattr(leaf, "setflags", None) is not None and ndim:
        return _read_only(leaf[:])
    return leaf


def _is_list_batch(value: object) -> bool:
    """Whether ``value`` is a list that is one batch of a dataset element, as tf.data reads it.

    tf.data converts a Python list to a tensor (its items along the first axis) and
    keeps tuples and dicts as structure. So does the split, for a list whose items
    are numbers (or lists or tuples of numbers, the rows of a 2-D batch):
    ``([1., 2.], [10., 20.])`` is a (features, labels) pair of two batches, split
    along each, as the same data as arrays is. A list that holds an array or a dict
    stays a structure, split leaf by leaf (``[x, y]`` of arrays).
    """
    if not isinstance(value, list):
        return False
    stack: list[tuple[object, int]] = [(item, 1) for item in value]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, list | tuple):
            if depth >= MAX_NEST_DEPTH:
                return False  # flatten refuses it, by the one limit on nests
            stack.extend((child, depth + 1) for child in item)
        elif is_nest(item) or _is_array_item(item):
            return False
    return True


def _is_array_item(item: object) -> bool:
    """Whether a list's item is an array (the list is then structure), not a number.

    An item with a length (a numpy, JAX or PyTorch array) or with an axis (an array-API
    array, which need not have ``__len__``) is an array; a number, a numpy scalar or a
    string is not.
    """
    if isinstance(item, str | bytes):
        return False
    return hasattr(item, "__len__") or len(_shape(item) or ()) >= 1


def _shape(leaf: object) -> tuple[object, ...] | None:
    """``leaf.shape`` as a tuple when it has one (an array of any library), else None."""
    shape = getattr(leaf, "shape", None)
    if shape is None or isinstance(leaf, type):
        return None
    try:
        return tuple(shape)
    except TypeError:  # a shape that is not a sequence of sizes: not an array's
        return None


def _flatten_batch(batch: Any) -> tuple[list[Any], TreeDef]:
    """A dataset element's leaves and treedef, a list of numbers being one leaf.

    The one reading of a batch's structure for every split and pad (see
    :func:`_is_list_batch`).
    """
    return flatten(batch, _is_list_batch, "a dataset element")


def _batch_axis(leaf: object) -> int | str:
    """The length of ``leaf``'s batch axis, or why it has none (a description of it).

    The one rule for every leaf of every element, whatever container holds it (a tuple,
    a namedtuple, a mapping or a list that is structure), and whatever library made it:

    - a leaf with a ``shape`` (a numpy, JAX, PyTorch or array-API array) is batched
      when it has at least one axis: its batch is ``shape[0]`` long, sliced with
      standard indexing (``x[a:b]``). A 0-d array, or a numpy scalar, is an unbatched
      sample. The array API standard has no ``__len__`` (array_api_strict leaves it
      out), so the shape is read, never ``len``;
    - any other leaf is batched when it has a length and can be sliced (a list of
      numbers); a Python number is an unbatched sample.
    """
    shape = _shape(leaf)
    if shape is not None:
        if not shape:
            return f"a 0-d array {leaf!r:.60}"
        if not hasattr(leaf, "__getitem__"):
            return f"{type(leaf).__name__} {leaf!r:.60} (it cannot be sliced)"
        first = shape[0]
        if isinstance(first, SupportsIndex) and not isinstance(first, bool):
            return operator.index(first)  # an int (numpy's, too)
        if hasattr(leaf, "__len__"):  # an axis of unknown size (None): its length
            return len(leaf)
        return f"an array whose first axis has unknown size {first!r}: {leaf!r:.60}"
    if not hasattr(leaf, "__len__") or not hasattr(leaf, "__getitem__"):
        return f"{type(leaf).__name__} {leaf!r:.60}"
    return len(leaf)


def _rows(leaf: Any, start: int, stop: int) -> Any:
    """Rows ``start:stop`` of a batched leaf, along its first axis.

    An array-API array is indexed as the standard specifies, ``x[a:b, ...]`` (a lone
    slice on an array of several axes is not standard, and array_api_strict refuses
    it); numpy and JAX give the same view either way. Anything else (a list, a PyTorch
    tensor) is sliced with ``x[a:b]``.
    """
    if hasattr(leaf, "__array_namespace__"):
        return leaf[slice(start, stop), ...]
    return leaf[start:stop]


def _unbatched(leaf: object) -> str | None:
    """Why ``leaf`` has no batch axis to split, or None when it has one (see :func:`_batch_axis`)."""
    axis = _batch_axis(leaf)
    return axis if isinstance(axis, str) else None


def _batch_length(leaf: object) -> int:
    """The length of ``leaf``'s batch axis; raises UnbatchedElementError when it has none."""
    axis = _batch_axis(leaf)
    if isinstance(axis, str):
        raise UnbatchedElementError(
            f"a distributed dataset's element has a leaf without a batch axis, {axis}: with "
            "several replicas each element must be a batch (a global batch: an array or a "
            "list of numbers, or a tuple, namedtuple or dict of them) that can be split along "
            "its first axis. Tuples, namedtuples and dicts are structure, so a "
            "(feature, label) tuple of scalars is one unbatched sample, not a batch of two: "
            "batch the dataset first (with several replicas an element is a global batch), "
            "e.g. np.stack(samples), or pass [np.array([3.0])] rather than [np.array(3.0)]"
        )
    return axis


def _lengths(batch: Any) -> tuple[int, ...] | None:
    """The first-axis length of each leaf; None if a leaf has no first axis (unbatched)."""
    out = []
    for leaf in _flatten_batch(batch)[0]:
        axis = _batch_axis(leaf)
        if isinstance(axis, str):
            return None
        out.append(axis)
    return tuple(out)


def _empty(leaf: Any) -> Any:
    """An empty batch like ``leaf``: its first zero rows (same rank, same dtype).

    An element without a batch axis (a scalar) gives zero, as TensorFlow pads it.

    Raises:
        TypeError: ``leaf`` is neither sliceable nor a number.
    """
    if _unbatched(leaf) is not None:
        return leaf * 0
    return _rows(leaf, 0, 0)


class _Epoch:
    """One pass of ``distribute_datasets_from_function``: the batches, step by step.

    The end of the data in the middle of a step follows TensorFlow, which decides by
    whether the per-replica batch size is static. Here the data says it:

    - every batch of the pass had the same length (``batch(b, drop_remainder=True)``)
      or the elements have no batch axis (unbatched scalars): the batch size is
      static, and ``for`` loops end before the partial step, as TF's do (it stays
      visible to ``get_next_as_optional`` and ``dataset.reduce``, as a ``_Tail``);
    - the batches' lengths varied (a shorter remainder batch: ``batch(b)``): the
      batch size is dynamic, and the replicas left without a batch get an empty one
      (its first zero rows, same rank), as in TF.
    """

    def __init__(self, num_local: int) -> None:
        self.num_local = num_local
        self.batches: list[Any] = []
        self.shapes: set[tuple[int, ...] | None] = set()

    def add(self, batch: Any) -> bool:
        """Take one batch; True when a step is complete."""
        self.batches.append(batch)
        self.shapes.add(_lengths(batch))
        return len(self.batches) == self.num_local

    def take(self) -> list[Any]:
        batches, self.batches = self.batches, []
        return batches

    def last(self) -> tuple[list[Any], bool] | None:
        """The padded partial step at the end of the data, if any, and whether it is a tail.

        A tail (static batches) is what ``for`` loops end before; a dynamic one is an
        ordinary last step. None when there is no partial step, or when its missing
        batches cannot be made (a leaf that is neither a batch nor a number).
        """
        batches = self.take()
        if not batches:
            return None
        leaves, treedef = _flatten_batch(batches[-1])
        try:
            empty = unflatten(treedef, [_empty(leaf) for leaf in leaves])
        except TypeError:
            return None
        dynamic = None not in self.shapes and len(self.shapes) > 1
        return batches + [empty] * (self.num_local - len(batches)), not dynamic


@final
class DistributedDatasetsFromFunction(_Distributed):
    """Per-replica batches from ``dataset_fn`` (see ``distribute_datasets_from_function``).

    ``dataset_fn`` was called once for this process's input pipeline; each step,
    every local replica takes the next batch in replica order. When the input runs
    out in the middle of a step, TensorFlow's rule applies (see :class:`_Epoch`): a
    static batch size (batches of one length, or unbatched elements) ends the epoch,
    a dynamic one gives the remaining replicas empty batches. ``iter(dataset)`` is a
    :class:`DistributedIterator`; ``element_spec``, ``cardinality`` and ``reduce``
    are TensorFlow's.
    """

    def __init__(
        self,
        dataset: Iterable[Any] | AsyncIterable[Any],
        num_local: int,
        describe: Describe | None = None,
    ) -> None:
        self._source = _Source(dataset, "distribute_datasets_from_function")
        self._num_local = num_local
        self._describe = _describe_default if describe is None else describe

    def _step(self, batches: list[Any]) -> Any:
        flat = [_flatten_batch(b) for b in batches]
        treedef = flat[0][1]
        for i, (_, t) in enumerate(flat):
            if t != treedef:
                raise ValueError(
                    f"dataset_fn's dataset gave batches of different structure: batch 0 of "
                    f"this step has {treedef!r} but batch {i} has {t!r}"
                )
        leaves = [_wrap([f[0][j] for f in flat]) for j in range(len(flat[0][0]))]
        return unflatten(treedef, leaves)

    def _pass(self) -> Iterator[Any]:
        epoch = _Epoch(self._num_local)
        for batch in self._source.sync():
            if epoch.add(batch):
                yield self._step(epoch.take())
        last = epoch.last()
        if last is not None:
            batches, tail = last
            yield _Tail(self._step(batches)) if tail else self._step(batches)

    async def _apass(self) -> AsyncIterator[Any]:
        epoch = _Epoch(self._num_local)
        async for batch in self._source.asynchronous():
            if epoch.add(batch):
                yield self._step(epoch.take())
        last = epoch.last()
        if last is not None:
            batches, tail = last
            yield _Tail(self._step(batches)) if tail else self._step(batches)


def _describe_default(value: object) -> LeafSpec:
    """Describe a leaf without a backend: its ``shape`` and ``dtype`` attributes."""
    shape = tuple(int(d) for d in getattr(value, "shape", ()))
    dtype = getattr(value, "dtype", None)
    name = getattr(dtype, "name", None) or type(value).__name__
    return LeafSpec(shape, str(name))
