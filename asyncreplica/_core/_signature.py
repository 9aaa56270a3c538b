"""What one collective call is, as plain data: the signature.

Signatures, leaf specs and call sites are named tuples: cheap to build on every
collective, compared and hashed at C speed.

A collective call becomes a :class:`Signature` before any data moves. The ledger
compares the signatures of all replicas at one position (see :mod:`._match`); the
report builders print them. Nothing here touches an array: leaves are described by a
:class:`LeafSpec` (shape and dtype as plain data) that a backend produced.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import NamedTuple

from ._nest import TreeDef, treedef_str

__all__ = [
    "CallSite",
    "CollectiveKind",
    "LeafSpec",
    "MergeFnKey",
    "ReduceOp",
    "Signature",
    "ordinal",
]


class ReduceOp(enum.Enum):
    """How values are combined across replicas.

    ``SUM`` and ``MEAN`` are TensorFlow's; ``MIN``, ``MAX`` and ``PROD`` are ours. Every
    API that takes a reduce op also accepts its name as a string, in any case
    (``"sum"``, ``"Mean"``), as TensorFlow does.

    ``MEAN`` divides the sum by the number of replicas in sync; the mean of integers
    is float64, exact (``_core._dtypes`` holds these rules, once).
    """

    SUM = "SUM"
    MEAN = "MEAN"
    MIN = "MIN"
    MAX = "MAX"
    PROD = "PROD"

    @classmethod
    def parse(cls, value: ReduceOp | str) -> ReduceOp:
        """Return ``value`` as a ReduceOp (fast for members and common spellings)."""
        if type(value) is cls:
            return value
        found = _REDUCE_OPS.get(value) if isinstance(value, str) else None
        return found if found is not None else cls(value)

    @classmethod
    def _missing_(cls, value: object) -> ReduceOp:
        if isinstance(value, str):
            upper = value.upper()
            for member in cls:
                if member.value == upper:
                    return member
        names = ", ".join(m.value for m in cls)
        raise ValueError(
            f"{value!r} is not a valid ReduceOp: use one of {names} "
            "(a ReduceOp member or its name as a string, in any case)"
        )


_REDUCE_OPS: dict[str, ReduceOp] = {
    spelling: op for op in ReduceOp for spelling in (op.value, op.value.lower(), op.value.title())
}


class CollectiveKind(enum.Enum):
    """The collectives a replica can issue."""

    ALL_REDUCE = "all_reduce"
    ALL_GATHER = "all_gather"
    BROADCAST = "broadcast"
    REDUCE_SCATTER = "reduce_scatter"
    BARRIER = "barrier"
    MERGE_CALL = "merge_call"


class LeafSpec(NamedTuple):
    """Shape and dtype of one leaf, as a backend described it.

    Attributes:
        shape: The leaf's shape; ``()`` for a scalar. For a sparse leaf, the dense shape.
        dtype: The dtype's name in the array API standard's terms, e.g. ``"float32"``.
        sparse: True for an ``IndexedSlices`` leaf.
        array_type: The array type of a leaf of another library than the backend's
            own (``"jax.Array"``, ``"torch.Tensor"``, ``"array_api_strict.Array"``);
            None for the backend's own arrays and for Python numbers. Replicas must
            agree on it: results come back in each replica's own array type.
    """

    shape: tuple[int, ...]
    dtype: str
    sparse: bool = False
    array_type: str | None = None

    def __str__(self) -> str:
        dense = f"{self.dtype}[{','.join(map(str, self.shape))}]"
        if self.sparse:
            dense = f"IndexedSlices({dense})"
        return dense if self.array_type is None else f"{self.array_type}({dense})"


class CallSite(NamedTuple):
    """One frame of a collective's call path.

    Attributes:
        filename: The frame's source file.
        lineno: The line of the call (or ``await``) the frame is at.
        function: The frame's function.
        column: The 1-based column of that call on its line, or None if unknown. Two
            calls on one line (``a, b = await f(x), await f(y)``) differ by it.
    """

    filename: str
    lineno: int
    function: str
    column: int | None = None

    def __str__(self) -> str:
        return f"{_short_path(self.filename)}:{self.lineno}"

    def describe(self, *, column: bool = False) -> str:
        """``dir/file.py:88``, or ``dir/file.py:88:17`` with ``column`` (when known)."""
        text = f"{_short_path(self.filename)}:{self.lineno}"
        return f"{text}:{self.column}" if column and self.column is not None else text


def _short_path(filename: str) -> str:
    # Keep the last two path components: enough to find the file, short enough to read.
    parts = filename.replace("\\", "/").rsplit("/", 2)
    return "/".join(parts[-2:]) if len(parts) > 2 else filename


class MergeFnKey(NamedTuple):
    """What identifies a merge function across replicas.

    ``merge_fn`` runs once, as replica 0 passed it, so besides its code the replicas
    must agree on every value bound into it that can be compared exactly (numbers,
    strings, tuples of them, functions, ...: ``_runtime/_merge_key.py`` builds the key
    and lists them). Other bound objects are not compared.

    Two keys are equal when their code, digest and the values a ``functools.partial``
    passed agree, and either the rest of the bound values agree or both functions read
    them from one object (``holder``: one shared instance or function, whose values are
    the same for every replica because they are the same object's).

    Attributes:
        code: The function's code object (or the callable itself, without one).
        bound: ``(label, text)`` of each plain bound value, in a fixed order: first the
            ``passed`` ones a partial bound, then those the function holds.
        digest: A checksum of the code's body (its bytecode and constants), the same in
            every process: two functions of one name and line (two lambdas) differ in
            it across processes, where the code objects cannot be compared.
        holder: Weak references to the objects the held values are read from (a bound
            method's instance and function; None where one takes none); only live
            referents count, so an address reused by a later object never makes two
            keys equal. Never sent to another process.
        passed: How many entries of ``bound`` a ``functools.partial`` passed.
    """

    code: object
    bound: tuple[tuple[str, str], ...] = ()
    digest: str = ""
    holder: tuple[Callable[[], object], ...] | None = None
    passed: int = 0

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, MergeFnKey):
            return NotImplemented
        if self.code != other.code or self.digest != other.digest:
            return False
        if self.bound[: self.passed] != other.bound[: other.passed]:
            return False
        if self.bound == other.bound:
            return True
        if self.holder is None or other.holder is None or len(self.holder) != len(other.holder):
            return False
        for a, b in zip(self.holder, other.holder, strict=True):
            held = a()
            if held is None or held is not b():
                return False
        return True

    def __ne__(self, other: object) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    def __hash__(self) -> int:
        return hash((self.code, self.digest))

    def bound_text(self) -> str:
        """``lr=0.1, self.scale=2``: the bound values, for messages."""
        return ", ".join(f"{label}={text}" for label, text in self.bound)


class Signature(NamedTuple):
    """Everything that must agree across replicas at one position.

    Attributes:
        kind: Which collective.
        op: The reduce op (all_reduce, reduce_scatter).
        axis: The axis (all_gather, reduce_scatter).
        source: The source replica (broadcast).
        merge_fn: What identifies the merge function (merge_call): a
            :class:`MergeFnKey`, its code and plain bound values (a library API built
            on merge_call passes a tuple holding one); None for other kinds.
        merge_fn_name: The merge function's qualified name, for reports.
        name: The user's ``name=`` for the collective, if any.
        structure: The treedef of the value (None for barrier and merge_call).
        leaves: One :class:`LeafSpec` per leaf of the value.
        call_path: The frames from the collective call down to the step function,
            innermost first, all of them (no depth limit). ``call_path[0]`` is the
            call site.
    """

    kind: CollectiveKind
    op: ReduceOp | None = None
    axis: int | None = None
    source: int | None = None
    merge_fn: object = None
    merge_fn_name: str | None = None
    name: str | None = None
    structure: TreeDef = None
    leaves: tuple[LeafSpec, ...] = ()
    call_path: tuple[CallSite, ...] = ()

    @property
    def call_site(self) -> CallSite | None:
        """The innermost frame outside asyncreplica, or None if unknown."""
        return self.call_path[0] if self.call_path else None

    def describe(self) -> str:
        """One short phrase: ``all_reduce(SUM) on float32[1024]``."""
        args: list[str] = []
        if self.op is not None:
            args.append(self.op.value)
        if self.axis is not None:
            args.append(f"axis={self.axis}")
        if self.source is not None:
            args.append(f"source={self.source}")
        if self.merge_fn_name is not None:
            args.append(self.merge_fn_name)
        if self.name is not None:
            args.append(f"name={self.name!r}")
        text = f"{self.kind.value}({', '.join(args)})"
        if self.kind in (CollectiveKind.BARRIER, CollectiveKind.MERGE_CALL):
            return text
        return f"{text} on {self.value_str()}"

    def value_str(self) -> str:
        """The value's structure with each leaf's spec: ``[float32[], float32[]]``."""
        if self.structure is None:
            return str(self.leaves[0]) if len(self.leaves) == 1 else "no value"
        return treedef_str(self.structure, (str(spec) for spec in self.leaves))


def ordinal(n: int) -> str:
    """Return ``1st``, ``2nd``, ``3rd``, ``4th``, ... ``11th``, ``21st`` for ``n``."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


# The public module to import them from (asyncreplica.abc): tracebacks, repr and help()
# name it, and pickle finds them there. ReduceOp's is ``asyncreplica``, set there.
for _cls in (CallSite, CollectiveKind, LeafSpec, MergeFnKey, Signature):
    _cls.__module__ = "asyncreplica.abc"
del _cls
