"""The backend contract, for people who write backends.

A backend holds replicas' values and combines them. The runtime hands it *all local
replicas' values of one collective at once*, already checked by the ledger: same
structure, shapes, dtypes and arguments on every replica. A backend therefore never
synchronises replicas and never validates agreement; it only computes.

Backends are found through the entry-point group ``asyncreplica.backends``, the same
way for the built-in ``numpy`` backend and for third-party plugins::

    [project.entry-points."asyncreplica.backends"]
    mybackend = "mypackage:MyBackend"

:func:`register_backend` registers one at run time (for tests and embedding). Every
backend should pass :class:`asyncreplica.testing.BackendConformanceTests`.

Values are passed as ``values[r][j]``: leaf ``j`` of replica ``r``, in replica order.
Results come back in the same layout. Rules every backend follows:

* never modify an input;
* combine in replica-id order, so every replica's result is bitwise identical
  whatever order replicas arrived in;
* a result shared by several replicas is read-only, and each replica gets its own
  result object (a view), so that ``Strategy.run`` regroups them into ``PerReplica``;
  the runtime refuses (``BackendError``, never a copy) a writable result whose object or
  memory (``.base``) it also got for another replica or leaf, and a result leaf that is
  not one of the backend's arrays (a list, an object with only ``shape`` and ``dtype``,
  anything :meth:`Backend.describe` refuses, such as a masked array);
* raise ``TypeError`` for a leaf it cannot hold, ``BackendError`` for a failure of
  the native library (keeping the native error as ``__cause__``);
* take every result dtype from :func:`reduced_dtype` (which dtypes reduce:
  :func:`is_reducible`; a Python number's dtype in ``Backend.reduce``:
  :func:`number_dtype`): the library's one copy of the dtype rules, which the
  reference semantics (``asyncreplica.testing._reference``) uses too.
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Awaitable, Callable, Hashable, Mapping, Sequence
from typing import ClassVar, NoReturn, TypeVar

from ._core._components import check_reduced
from ._core._dtypes import (
    EXACT_MEAN_COUNT,
    is_reducible,
    is_refusal,
    native_order,
    not_reducible_message,
    number_dtype,
    reduced_dtype,
    sparse_op_message,
)
from ._core._ledger import Report
from ._core._match import RULES as MATCH_RULES
from ._core._match import differing_fields as signature_differences
from ._core._nest import TreeDef, structure_message, treedef_key, treedef_str
from ._core._report import error_text, key_text, value_text
from ._core._signature import (
    CallSite,
    CollectiveKind,
    LeafSpec,
    MergeFnKey,
    ReduceOp,
    Signature,
)
from ._registry import available_backends, register_backend

__all__ = [
    "Backend",
    "CallSite",
    "CollectiveKind",
    "EXACT_MEAN_COUNT",
    "LeafSpec",
    "MATCH_RULES",
    "MergeFnKey",
    "ProcessGroup",
    "ReduceOp",
    "Signature",
    "available_backends",
    "check_reduced",
    "error_text",
    "is_reducible",
    "is_refusal",
    "key_text",
    "not_reducible_message",
    "number_dtype",
    "native_order",
    "reduced_dtype",
    "register_backend",
    "signature_differences",
    "sparse_op_message",
    "structure_message",
    "treedef_key",
    "treedef_str",
    "value_text",
]

_T = TypeVar("_T")

Leaves = Sequence[Sequence[object]]


class Backend(abc.ABC):
    """The contract between the runtime and a place that holds values.

    Args:
        devices: The canonical device of each local replica (``"CPU:0"``, ...), in
            replica order.

    Raises:
        ValueError: The backend cannot hold values on one of ``devices``.
    """

    #: The name users pass as ``backend=``; set by each subclass.
    name: ClassVar[str] = ""

    #: True when the backend accepts *foreign* arrays: leaves of another array library
    #: than its own that implement the array API standard or DLPack (JAX,
    #: ``array_api_strict``, ...). Such a backend describes a foreign leaf with a
    #: :class:`LeafSpec` whose ``array_type`` names its type (so replicas that pass
    #: different types get a ``CollectiveMismatchError``) and gives each replica its
    #: results in its own input's array type. ``BackendConformanceTests`` checks this
    #: when it is True and skips those tests otherwise. The default is False; the
    #: numpy backend sets it.
    accepts_foreign_arrays: ClassVar[bool] = False

    def __init__(self, devices: Sequence[str]) -> None:
        self.devices = tuple(devices)

    @classmethod
    def check_available(cls) -> None:
        """Raise ``BackendError`` saying why this backend cannot run here, if it cannot.

        The default does nothing: the backend is always available.
        """
        return

    @classmethod
    def default_devices(cls) -> list[str]:
        """The devices a strategy uses when none are given. The default is ``["CPU:0"]``."""
        return ["CPU:0"]

    @abc.abstractmethod
    def describe(self, value: object) -> LeafSpec:
        """Describe one leaf: its shape and dtype.

        Args:
            value: A leaf a replica passed to a collective.

        Returns:
            Its :class:`LeafSpec`.

        Raises:
            TypeError: The backend cannot hold this value (a string, ``None``, an
                object array, ...). The message says what is accepted.
        """

    def describe_leaves(self, values: Sequence[object]) -> tuple[LeafSpec, ...]:
        """Describe several leaves: ``tuple(map(self.describe, values))``.

        The runtime describes a collective's leaves with this; a backend may override
        it to describe a batch in one pass (the numpy backend does). The result must
        equal describing each leaf (the conformance suite checks it).

        Raises:
            TypeError: As :meth:`describe`, for the first leaf it cannot hold.
        """
        return tuple(map(self.describe, values))

    def convert(self, value: object) -> object:
        """The leaf a collective reads for ``value``, converted once, when it is issued.

        The runtime calls this when a replica issues a collective (or calls a
        cross-replica API such as ``Strategy.reduce``), before :meth:`describe`, and from
        then on reads what it returns: the signature describes it, the backend combines
        it. A value the backend holds as it is (its own arrays, numbers, the foreign
        arrays it accepts) is returned as it is; it is read when the last replica
        arrives, and a change of its shape or dtype in flight is refused. A value the
        backend would convert to read it (the numpy backend: an object with only
        ``__array__``, a ``memoryview``) is converted here, once, so that a second
        conversion that returns something else (another dtype or shape, an error)
        cannot change what is combined.

        Return ``value`` itself only where every value of its type is read as it is: the
        runtime then remembers the type and does not call this for it again. The
        default returns ``value`` (every value is read as it is).

        Raises:
            TypeError: As :meth:`describe`, for a value the backend cannot hold (the
                error of the conversion, if it raised one, as ``__cause__``).
        """
        return value

    @abc.abstractmethod
    async def all_reduce(
        self, op: ReduceOp, values: Leaves, *, bytes_per_pack: int = 0
    ) -> list[list[object]]:
        """Combine each leaf across replicas with ``op``; every replica gets the result.

        ``MEAN`` divides by ``len(values)``; the mean of integers is float64.
        ``IndexedSlices`` leaves are concatenated (``MEAN`` also scales their values).

        Args:
            op: How to combine.
            values: ``values[r][j]``: leaf ``j`` of replica ``r``.
            bytes_per_pack: A hint from ``CommunicationOptions.bytes_per_pack`` (the
                merged per-call and strategy options): a backend may reduce several
                leaves together in packs of about this many bytes (TensorFlow's
                ``group_by_size`` rule; 0 means one pack). Results must not depend on
                it. The keyword is optional for backends: the runtime passes it only
                when the method accepts it (decided once per backend class), so a
                backend written without it keeps working.

        Returns:
            ``results[r][j]``: replica ``r``'s result for leaf ``j``.
        """

    @abc.abstractmethod
    async def all_gather(self, values: Leaves, axis: int) -> list[list[object]]:
        """Concatenate each leaf along ``axis`` (``0 <= axis < rank``) in replica order."""

    @abc.abstractmethod
    async def reduce_scatter(self, op: ReduceOp, values: Leaves, axis: int) -> list[list[object]]:
        """Combine each leaf with ``op``, then scatter it in equal chunks.

        Replica ``r`` gets the ``r``-th of ``len(values)`` equal chunks along ``axis``
        (the runtime has checked that the dimension divides); the chunks are read-only
        views of one buffer.
        """

    @abc.abstractmethod
    async def broadcast(self, values: Sequence[object], num_replicas: int) -> list[list[object]]:
        """Give each of ``num_replicas`` replicas a copy of the source's leaves ``values``.

        The copy is made once; replicas get read-only views of it.
        """

    @abc.abstractmethod
    async def reduce(
        self, op: ReduceOp, components: Sequence[object], axis: tuple[int, ...] | None
    ) -> object:
        """Reduce one value held as one component per replica to one result.

        With ``axis=None`` components are combined element-wise. With an axis tuple
        each component is first reduced along those axes; ``MEAN`` divides the global
        sum by the global element count, so uneven components are weighted correctly.
        The result belongs to the caller (it is writable).
        """

    @abc.abstractmethod
    async def gather(self, components: Sequence[object], axis: int) -> object:
        """Concatenate the components along ``axis`` (``0 <= axis < rank``) into one new value."""

    async def aclose(self) -> None:
        """Release what the backend holds. The default does nothing."""
        return


class ProcessGroup(abc.ABC):
    """The processes one strategy spans, for strategies that scale out (MPI).

    Within one process the ledger decides agreement; across processes a group does.
    The runtime calls :meth:`collective` once per collective position, from the
    process's last replica to arrive, after the local replicas agreed. The group makes
    the processes agree on the position (a mismatch, a finished or a failed process
    raises a ``CollectiveError`` on every process), then runs ``local``: the backend
    operation, which moves the data between processes itself.
    """

    #: This process's rank and the number of processes.
    rank: int
    size: int
    #: The global id of this process's first replica, and the global replica count.
    offset: int
    num_replicas: int
    #: How many replicas each process runs, in rank order.
    replica_counts: tuple[int, ...]

    def wrap(self, local: Backend) -> Backend:
        """The backend that combines ``local``'s values across this group's processes.

        The strategy holds its values on ``local`` (this process's replicas) and
        dispatches every collective to the backend returned here.
        """
        raise NotImplementedError(f"{type(self).__name__} does not wrap a local backend")

    async def refuse(
        self,
        error: Exception,
        *,
        components: tuple[ReduceOp, tuple[int, ...] | None, Sequence[LeafSpec]] | None = None,
    ) -> NoReturn:
        """Refuse a cross-replica operation that the other processes may be making.

        This process found ``error`` before it could take part (a ``SUM`` of a plain
        value that stands for several replicas, say). It still takes part in the
        agreement, so that every process raises ``error``'s class with the same
        message, instead of the others waiting for it. The default raises ``error``.

        ``components``: for ``Strategy.reduce`` whose components this process's
        replicas hold differ, its op, axes and one spec per local replica: the group
        can then check every process's components as one process would
        (:func:`check_reduced`) and raise that error everywhere.
        """
        raise error

    async def agree(  # noqa: B027 -- optional
        self, op: ReduceOp, axis: tuple[int, ...] | None, spec: LeafSpec
    ) -> None:
        """Agree with the other processes on a ``Strategy.reduce`` of a plain value.

        Where every process has several replicas, a plain value is reduced on its own
        process (nothing crosses processes), yet one process raises where the replicas'
        calls differ (``op``, ``axis``, its shape or dtype): the group compares this
        process's call with the others' (no data moves) and raises the same
        ``CollectiveMismatchError`` on every process where they differ. The default
        compares nothing.
        """

    async def agree_structure(  # noqa: B027 -- optional
        self, api: str, structure: TreeDef
    ) -> None:
        """Agree with the other processes on the nest a cross-replica call was given.

        ``Strategy.reduce`` and ``gather`` of a nest reduce it leaf by leaf; a leaf is
        agreed on alone, so nests whose keys or containers differ between processes
        (``{"x": a}`` here, ``{"y": a}`` there) would pair leaf by leaf silently. The
        group compares ``structure`` (a treedef, not None) and raises the same
        ``CollectiveMismatchError`` on every process where it differs. The default
        compares nothing.
        """

    def call_timeout(self, seconds: float | None) -> contextlib.AbstractContextManager[None]:
        """Bound each cross-replica operation made inside by ``seconds`` (None: the group's).

        ``extended.reduce_to(..., options=CommunicationOptions(timeout_seconds=...))``
        enters it around its reductions, so that a per-call timeout bounds the wait for
        the other processes as it bounds a collective's. The default bounds nothing.
        """
        return contextlib.nullcontext()

    def batch(self) -> contextlib.AbstractContextManager[None]:
        """Make the cross-replica operations made inside one batch (``batch_reduce_to``).

        One process reduces a batch's values of one dtype in one combine, which acts on a
        floating-point error (warns, under ``np.seterr``) once however many of the values
        meet it; a group that reduces the values one by one acts on each kind once per
        dtype in the batch too. The default changes nothing.
        """
        return contextlib.nullcontext()

    def call_begins(self, name: str) -> object:
        """The strategy enters ``name``, a call that may cross processes; a token.

        ``run`` or a cross-replica operation, entered before it checks its arguments;
        the token is for :meth:`call_ends`. A group counts these calls so that processes
        whose calls fall out of step (one raised, alone, before its part of a call) are
        told so instead of pairing different calls. The default counts nothing.
        """
        return None

    def call_ends(self, token: object, *, raised: bool) -> None:  # noqa: B027 -- optional
        """The call :meth:`call_begins` returned ``token`` for returned (or ``raised``)."""

    @abc.abstractmethod
    def begin_run(self) -> None:
        """A ``Strategy.run`` starts on this process."""

    #: How often a run that spans several processes calls :meth:`watch_peers`, in
    #: seconds; None (the default): never.
    peer_watch_seconds: float | None = None

    def local_waits(  # noqa: B027 -- optional
        self, waits: Mapping[Hashable, tuple[Signature, tuple[int, ...]]]
    ) -> None:
        """Where this process's replicas wait now: before each :meth:`watch_peers`.

        ``waits``: for each collective some local replica waits at (its key), the
        signature and the replicas (global ids) that arrived, earliest first; a
        collective every local replica reached is in :meth:`collective` instead. So the
        group can tell the other processes which replicas arrived while another replica
        of this process keeps the collective from crossing, and name them when the run
        stops. The default keeps nothing.
        """

    def watch_peers(self) -> None:  # noqa: B027 -- optional
        """Raise what must end this process's run now: another process's failure.

        Called every :attr:`peer_watch_seconds` for the whole of a ``Strategy.run``, on
        its event loop, between the replicas' steps (never inside a backend call).
        Whatever it raises (an ``Exception``) fails the run as a replica's error does:
        the replicas are cancelled and the run raises it. So a process whose replicas
        are at no collective (each awaits something else: its event loop is idle)
        learns of a peer's failure (a timeout, an error, an exit) all the same. It must
        not wait, nor take part in any exchange itself. The default raises nothing.
        """

    @abc.abstractmethod
    async def end_run(
        self,
        error: BaseException | None,
        *,
        report: Report | None = None,
        structures: Sequence[TreeDef] = (),
    ) -> None:
        """This process's run ended, with ``error`` or without: tell the other processes.

        ``report``: this process's ledger when the run failed (what each replica was
        waiting at), so that the group can tell the other processes the collective its
        replicas issued before one of them refused its own (see ``is_refusal``).

        ``structures``: when the run finished, the nest (treedef) of each local
        replica's return value. Processes compare them (``treedef_key``) with global
        replica 0's, as one process's ``regroup`` compares its replicas' values, and
        raise that ``ValueError`` (``structure_message``, naming the first replica
        that differs) on every process where they differ.

        Raises:
            CollectiveError: This process finished, but another failed or issued more
                collectives.
            ValueError: The processes' replicas returned values of different structure.
        """

    @abc.abstractmethod
    async def collective(
        self,
        signature: Signature,
        position: Hashable,
        local: Callable[[], Awaitable[_T]],
        *,
        timeout: float | None = None,  # noqa: ASYNC109 -- a limit the group applies itself
    ) -> _T:
        """Agree with the other processes on ``signature`` at ``position``, then run ``local``.

        Args:
            signature: What the local replicas called (they agreed on it).
            position: The ledger's key of the position: an index, or ``(name, k)``.
            local: The backend operation, awaited once the processes agreed.
            timeout: This collective's ``timeout_seconds`` (its options merged with the
                strategy's); None: the group's own.

        Returns:
            What ``local`` returned.

        Raises:
            CollectiveError: The processes disagree, or one of them finished or failed.
        """
