"""The cross-process agreement protocol, as pure functions of plain data.

Every process of a group takes part in the same sequence of *exchanges* on its
control communicator. An exchange is one allgather of a fixed-size row per process: a
header (:data:`HEADER_WORDS` int64 words: a status, the fingerprint of what the process
is about to do, the number of the strategy call it belongs to, and the exchange's
number), then room for a small payload. When every
header is identical, the processes agree and go on (a collective moves its data on a
second communicator, or travelled as the payload). When they differ, a second round
gathers one JSON *detail* per process (what it called, where, or how it failed), and
every process builds the same error from them. No pickled object is ever received.

Statuses:

* ``COLLECTIVE``: the process's replicas reached a collective (or the process issued a
  cross-replica reduction); the fingerprint says which.
* ``FINISHED``: the process's replicas all returned from ``Strategy.run``.
* ``FAILED``: the process's run raised (the detail names the exception).
* ``EXITED``: the process is exiting (sent from an ``atexit`` hook).

Any status other than ``COLLECTIVE`` ends the run on every process: such an exchange
is the run's last.
"""

from __future__ import annotations

import enum
import hashlib
import json
import struct
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from asyncreplica import CollectiveMismatchError, CollectiveTimeoutError, ReplicaExitedError
from asyncreplica.abc import (
    MATCH_RULES,
    CallSite,
    CollectiveKind,
    LeafSpec,
    MergeFnKey,
    ReduceOp,
    Signature,
    check_reduced,
    error_text,
    is_refusal,
    signature_differences,
    treedef_key,
)
from asyncreplica.abc import key_text as _key_text

__all__ = [
    "HEADER",
    "HEADER_BYTES",
    "HEADER_WORDS",
    "MAGIC",
    "Status",
    "at_position",
    "cross_fields",
    "describe_exception",
    "from_wire",
    "to_wire",
    "fingerprint",
    "header",
    "outcome_message",
    "position_code",
    "signature_fields",
]

MAGIC = 0x61724D5049  # "arMPI": a header from something else is caught at once
HEADER_WORDS = 5  # magic, status, fingerprint, call number, exchange number
#: The header's layout (native int64 words, as :func:`header` lists them).
HEADER = struct.Struct(f"={HEADER_WORDS}q")
HEADER_BYTES = HEADER.size


class Status(enum.IntEnum):
    """What a process says in an exchange."""

    COLLECTIVE = 1
    FINISHED = 2
    FAILED = 3
    EXITED = 4


def to_wire(text: str) -> np.ndarray[Any, np.dtype[np.uint8]]:
    """``text`` as the bytes sent to other processes (every note and detail); never raises.

    A user's text may hold what UTF-8 cannot encode: a lone surrogate, as
    ``os.fsdecode`` and ``os.listdir`` give for a file name that is not UTF-8. It is
    sent backslash-escaped (a backslash, then ``udcff``), so that telling the peers never fails.
    """
    return np.frombuffer(text.encode("utf-8", "backslashreplace"), np.uint8)


def from_wire(data: Any) -> str:
    """The text another process sent (:func:`to_wire`); never raises."""
    return bytes(data).decode("utf-8", "replace")


def header(status: Status, fp: int, call: int, number: int) -> list[int]:
    """The int64 words a process contributes to an exchange.

    ``call``: the number of the strategy's calls that cross processes (``run``, the
    cross-replica operations) this process had entered when it made the exchange, so
    that processes whose calls are out of step (one raised before its part of a call
    the others made) differ here instead of pairing different calls' exchanges.
    """
    return [MAGIC, int(status), fp, call, number]


_MASK = (1 << 64) - 1
_ODD = 0x9E3779B97F4A7C15  # odd: multiplying by it is a bijection modulo 2**64


def position_code(position: object) -> int:
    """A 64-bit number for a collective's position (stable across processes and runs).

    An index is its own code; any other key (``(name, k)``) is hashed from its text.
    """
    if type(position) is int:
        return position
    digest = hashlib.blake2b(to_wire(key_text(position)).tobytes(), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


def at_position(base: int, code: int) -> int:
    """The fingerprint of a collective whose fields fingerprint to ``base`` at ``code``.

    For one ``base``, distinct codes (modulo 2**64) give distinct fingerprints; for
    distinct bases, a collision is as unlikely as between two fingerprints.
    """
    value = (base + code * _ODD) & _MASK
    return value - (1 << 64) if value >> 63 else value


def key_text(key: object) -> str:
    """``"3rd collective (position 2)"`` or ``"collective named 'grads' (2nd use)"``.

    The text one process's reports use (``asyncreplica.abc.key_text``).
    """
    if isinstance(key, int):
        return _key_text(key)
    if isinstance(key, tuple) and len(key) == 2:
        return _key_text((str(key[0]), int(key[1])))
    return str(key)


def _site_text(site: CallSite | None) -> str | None:
    if site is None:
        return None
    column = "" if site.column is None else f":{site.column}"
    return f"{site.filename}:{site.lineno}{column} in {site.function}"


#: The frames of a call path sent as they are; a longer path's other frames are sent
#: as their count and a digest, so the fingerprint still covers every frame.
PATH_FRAMES = 16


def _frame(site: CallSite) -> list[Any]:
    return [site.filename, site.lineno, site.column, site.function]


def call_path_field(path: Sequence[CallSite]) -> dict[str, Any]:
    """The whole call path as plain data: its first frames, then a digest of the rest."""
    rest = [_frame(site) for site in path[PATH_FRAMES:]]
    digest = None
    if rest:
        text = json.dumps(rest, separators=(",", ":"))
        digest = hashlib.blake2b(to_wire(text).tobytes(), digest_size=16).hexdigest()
    return {
        "frames": [_frame(site) for site in path[:PATH_FRAMES]],
        "more": len(rest),
        "digest": digest,
    }


def signature_fields(
    signature: Signature, position: object, *, check_call_sites: bool
) -> dict[str, Any]:
    """The plain, JSON-able fields of a collective that every process must agree on.

    Shapes along the gathered axis of ``all_gather`` may differ across processes
    (uneven batches), so that dimension is left out of the comparison.
    """
    gathered = signature.axis if signature.kind is CollectiveKind.ALL_GATHER else None
    leaves = []
    for spec in signature.leaves:
        shape = list(spec.shape)
        if gathered is not None and gathered < len(shape):
            shape[gathered] = -1
        leaves.append([shape, spec.dtype, spec.sparse, spec.array_type])
    merge_fn = signature.merge_fn
    # merge_call's key is a MergeFnKey (its merge_fn's code and plain bound values); a
    # library API's (extended.update) is a tuple holding the user's fn's, whose name
    # tells the rest. The text compared across processes holds all of them.
    parts = merge_fn if type(merge_fn) is tuple else (merge_fn,)
    key = next((p for p in parts if isinstance(p, MergeFnKey)), None)
    code: Any = None if key is None else key.code
    if key is not None and getattr(code, "co_filename", None) is not None:
        merge_fn = f"{signature.merge_fn_name} ({code.co_filename}:{code.co_firstlineno}"
        merge_fn += f" #{key.digest})" if key.digest else ")"
        if key.bound:
            merge_fn += f" with {key.bound_text()}"
    elif merge_fn is not None:
        merge_fn = signature.merge_fn_name
    site = signature.call_site
    return {
        "kind": signature.kind.value,
        "op": None if signature.op is None else signature.op.value,
        "axis": signature.axis,
        "source": signature.source,
        "merge_fn": merge_fn,
        "name": signature.name,
        "value": signature.value_str() if gathered is None else _masked(signature, leaves),
        "structure": _structure(signature),
        "leaves": leaves,
        "position": key_text(position),
        "call site": (_site_text(site) if check_call_sites and signature.name is None else None),
        "call path": (
            call_path_field(signature.call_path)
            if check_call_sites and signature.name is None
            else None
        ),
    }


def _structure(signature: Signature) -> Any:
    """The value's nest (its treedef) as plain data; None without a nest.

    Equal for two processes exactly when their treedefs are equal, what the local
    matcher compares (``asyncreplica.abc.treedef_key``).
    """
    return treedef_key(signature.structure)


def _masked(signature: Signature, leaves: list[list[Any]]) -> str:
    specs = [f"{d}[{','.join('*' if s < 0 else str(s) for s in shape)}]" for shape, d, *_ in leaves]
    return specs[0] if len(specs) == 1 else "[" + ", ".join(specs) + "]"


def cross_fields(
    what: str, op: ReduceOp | None, axis: object, specs: Sequence[LeafSpec]
) -> dict[str, Any]:
    """The fields of a cross-replica operation (``Strategy.reduce``, ``gather``)."""
    leaves: list[list[Any]] = [[list(s.shape), s.dtype, s.sparse, s.array_type] for s in specs]
    # Sizes along the gathered or reduced axes may differ (uneven batches).
    masked = (axis,) if isinstance(axis, int) else axis if isinstance(axis, tuple) else ()
    for shape, *_ in leaves:
        for a in masked:
            if isinstance(a, int) and a < len(shape):
                shape[a] = -1
    return {
        "kind": what,
        "op": None if op is None else op.value,
        "axis": list(axis) if isinstance(axis, tuple) else axis,
        "source": None,
        "merge_fn": None,
        "name": None,
        "value": ", ".join(
            f"{d}[{','.join('*' if n < 0 else str(n) for n in s)}]" for s, d, *_ in leaves
        ),
        "leaves": leaves,
        "position": f"cross-replica {what}",
        "call site": None,
    }


def fingerprint(fields: Mapping[str, Any]) -> int:
    """A signed 64-bit fingerprint of ``fields`` (stable across processes and runs)."""
    text = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    digest = hashlib.blake2b(to_wire(text).tobytes(), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


def describe_exception(error: BaseException) -> str:
    """``ValueError: the first line of its message``.

    An exception group (several replicas of a process failed) is described by its
    leaf exceptions: ``ValueError: bad (and 1 more: ValueError)``. Never raises: an
    exception whose ``__str__`` raises is named as one process's run names it
    (:func:`asyncreplica.abc.error_text`), so the failure is still told to the peers.
    """
    if isinstance(error, BaseExceptionGroup):
        leaves = _leaf_exceptions(error)
        if leaves:
            first = describe_exception(leaves[0])
            rest = [type(e).__name__ for e in leaves[1:]]
            if not rest:
                return first
            return f"{first} (and {len(rest)} more: {', '.join(dict.fromkeys(rest))})"
    return error_text(error)


def _leaf_exceptions(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    leaves: list[BaseException] = []
    for error in group.exceptions:
        if isinstance(error, BaseExceptionGroup):
            leaves += _leaf_exceptions(error)
        else:
            leaves.append(error)
    return leaves


def collective_error(error: BaseException) -> BaseException | None:
    """The ``CollectiveError`` a failed run raised (alone, or as every leaf of a group)."""
    if isinstance(error, CollectiveMismatchError | ReplicaExitedError):
        return error
    if isinstance(error, BaseExceptionGroup):
        leaves = _leaf_exceptions(error)
        if leaves and all(
            isinstance(e, CollectiveMismatchError | ReplicaExitedError) for e in leaves
        ):
            return leaves[0]
    return None


def timeout_fields(error: BaseException) -> dict[str, Any] | None:
    """A run's own ``CollectiveTimeoutError`` (alone, or every leaf of a group) as data.

    A process times out on its own replicas (one of them never reached a collective
    that its others wait at): every process raises it, completed by the replicas of
    the processes that waited there (see ``Failures._timeout_everywhere``).
    """
    found: BaseException | None = error
    if isinstance(error, BaseExceptionGroup):
        leaves = _leaf_exceptions(error)
        found = leaves[0] if leaves and all(type(e) is type(leaves[0]) for e in leaves) else None
    if not isinstance(found, CollectiveTimeoutError):
        return None
    return {
        "position": found.position,
        "timeout": found.timeout,
        "arrived": sorted(found.arrived),
        "missing": sorted(found.missing),
        "message": str(found),
    }


def error_fields(error: BaseException, *, check_call_sites: bool) -> dict[str, Any] | None:
    """A process's own collective error as plain data, so that every process raises it.

    Its attributes use global replica ids already; signatures travel as their fields
    (see :func:`signature_fields`) with their call site.
    """
    found = collective_error(error)
    if isinstance(found, CollectiveMismatchError):
        return {
            "class": "CollectiveMismatchError",
            "headline": str(found).split("\n", 1)[0],  # the finder's first line
            "position": found.position,
            "name": found.name,
            "fields": list(found.fields),
            "signatures": {
                str(replica): [
                    signature_fields(sig, found.position, check_call_sites=check_call_sites),
                    _site_text(sig.call_site),
                ]
                for replica, sig in found.signatures.items()
            },
        }
    if isinstance(found, ReplicaExitedError):
        return {
            "class": "ReplicaExitedError",
            "replica_id": found.replica_id,
            "position": found.position,
            "name": found.name,
            "waiting": sorted(found.waiting),
        }
    return None


def components_error(details: Sequence[Mapping[str, Any]]) -> Exception | None:
    """What one process raises for these processes' ``Strategy.reduce`` calls, or None.

    Each process checked its own replicas' components (they agree); when the processes'
    reduces differ in their components (a shape, a rank, a dtype), one process with
    every replica would have raised the runtime's own check of the components
    (``asyncreplica.abc.check_reduced``: ``ValueError`` for shapes, or
    ``CollectiveMismatchError``), so that check is made here of every process's
    components, in global replica order: the same class, fields, replica ids and
    message. A process whose own replicas' components differ refuses with them
    (``components`` in its detail: see ``MPIProcessGroup.refuse``). None when the
    processes differ in anything else (the op, the axis, another refusal).
    """
    # Each process's components: those of a refusal (its replicas differ), or its
    # reduce's one leaf for each of its replicas (they agree).
    parts: list[tuple[int, Mapping[str, Any], list[Any]]] = []
    for d in details:
        sent = d.get("components")
        fields = d.get("fields")
        first_replica, count = (int(v) for v in d["replicas"])
        if sent:
            parts.append((first_replica, sent, list(sent["leaves"])))
        elif (
            Status(d["status"]) is Status.COLLECTIVE
            and fields
            and fields.get("kind") == "reduce"
            and len(fields.get("leaves", ())) == 1
        ):
            parts.append((first_replica, fields, list(fields["leaves"]) * count))
        else:
            return None
    first = parts[0][1]
    if any((f["op"], f["axis"]) != (first["op"], first["axis"]) for _, f, _ in parts):
        return None
    specs: list[LeafSpec] = []
    for _, _, leaves in sorted(parts, key=lambda part: part[0]):
        for shape, dtype, sparse, *rest in leaves:
            specs.append(LeafSpec(tuple(shape), dtype, bool(sparse), *rest))
    axis = first["axis"]
    try:
        check_reduced(ReduceOp(first["op"]), specs, None if axis is None else tuple(axis), 0)
    except (CollectiveMismatchError, ValueError) as error:
        return error
    return None


def issued_refusal(error: BaseException | None) -> Exception | None:
    """The refusal of a collective that ended a process's run, or None.

    A replica refuses the collective it issues (a dtype no op reduces, a value its
    backend cannot hold) before any wait, so that error is the run's error (alone, or
    every leaf of a group); see ``asyncreplica.abc.is_refusal``.
    """
    if error is None:
        return None
    if isinstance(error, BaseExceptionGroup):
        leaves = _leaf_exceptions(error)
        if leaves and all(is_refusal(e) for e in leaves) and isinstance(leaves[0], Exception):
            return leaves[0]
        return None
    return error if isinstance(error, Exception) and is_refusal(error) else None


def refused_detail(error: Exception, what: str) -> list[Any]:
    """A refusal as it travels in an exchange's detail (``"refused"``; see REFUSALS).

    ``what``: what was refused, for the other processes' message ("collective",
    "cross-replica operation").
    """
    return [type(error).__name__, str(error), list(getattr(error, "fields", [])), what]


def refusal_fields(error: Exception) -> dict[str, Any]:
    """The fields a process agrees on when it refuses a cross-replica operation."""
    return {
        "kind": "refused",
        "op": None,
        "axis": None,
        "source": None,
        "merge_fn": None,
        "name": None,
        "value": describe_exception(error),
        "leaves": [],
        "position": "cross-replica operation",
        "call site": None,
    }


#: The classes a refusal may carry between processes (anything else: ValueError), in
#: the order one process checks: the runtime's checks of the arguments (ValueError)
#: before the backend's of the values (its dtypes: TypeError).
REFUSALS: dict[str, type[Exception]] = {
    # A distributed value's components differ in a field of the match table (the
    # runtime's check_components): rebuilt with its fields (see MPIProcessGroup).
    "CollectiveMismatchError": CollectiveMismatchError,
    "ValueError": ValueError,
    "NotImplementedError": NotImplementedError,
    "TypeError": TypeError,
    # One process's own combine under np.errstate(all="raise") (an inf - inf of its
    # replicas): one process raises FloatingPointError, so does every process.
    "FloatingPointError": FloatingPointError,
}


def first_refusal(details: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The refusal every process raises: the one one process would find first.

    When processes refuse for different reasons (one has several replicas of a plain
    value, another a dtype its backend refuses), the earlier check wins, then the
    lower rank.
    """
    refused = [d for d in details if d.get("refused")]
    order = list(REFUSALS)

    def rank(detail: Mapping[str, Any]) -> tuple[int, int]:
        name = detail["refused"][0]
        return (order.index(name) if name in order else 0, int(detail["rank"]))

    return min(refused, key=rank) if refused else None


def refusal_wins(details: Sequence[Mapping[str, Any]], refused: Mapping[str, Any]) -> bool:
    """Whether one process with every replica would raise ``refused`` (see first_refusal).

    One process finds errors in replica order: a replica refuses the collective it
    issues, and its ledger finds a mismatch when a replica issues a collective that
    differs from an earlier replica's. Replicas of a lower rank come first, so an error
    that a lower rank's ledger found, or a difference among the collectives of ranks
    below the refusing one, is found before the refusal: that error wins, on every
    process alike (a refusal on process 1 no longer hides process 0's mismatch).
    """
    rank = int(refused["rank"])
    earlier = sorted((d for d in details if int(d["rank"]) < rank), key=lambda d: int(d["rank"]))
    if any(d.get("collective_error") for d in earlier):
        return False
    issued = issued_before(details, refused)
    return len(issued) < 2 or not differing_fields(issued)


def issued_before(
    details: Sequence[Mapping[str, Any]], refused: Mapping[str, Any]
) -> list[Mapping[str, Any]]:
    """The collectives issued before ``refused`` (a refusal's detail), in replica order.

    Those of the lower ranks, then the one the refusing process's own replicas
    issued before its refusing replica (``"issued"``, sent with the refusal), as
    COLLECTIVE details: where they differ, one process finds that mismatch first.
    """
    rank = int(refused["rank"])
    earlier = sorted((d for d in details if int(d["rank"]) < rank), key=lambda d: int(d["rank"]))
    issued: list[Mapping[str, Any]] = [
        d for d in earlier if d.get("fields") and not d.get("refused")
    ]
    own = refused.get("issued")
    if own:
        issued.append({**own, "rank": rank, "status": int(Status.COLLECTIVE)})
    return issued


def _path_texts(details: Sequence[Mapping[str, Any]]) -> dict[int, str]:
    """Each process's call path as text (by rank): the frames around the first difference.

    Frames show ``file:line in function``, with the column where calls on one line
    differ by it; the frames every process shares between the call site and the first
    difference are elided.
    """
    paths = {
        d["rank"]: [tuple(f) for f in d["fields"]["call path"]["frames"]]
        for d in details
        if d.get("fields") and d["fields"].get("call path")
    }
    distinct = list({tuple(p) for p in paths.values()})
    start = 0
    if len(distinct) > 1:
        shortest = min(len(p) for p in distinct)
        start = next((i for i in range(shortest) if len({p[i] for p in distinct}) > 1), shortest)
    columns: dict[tuple[str, int], set[Any]] = {}
    for frames in paths.values():
        for filename, lineno, column, _ in frames:
            columns.setdefault((filename, lineno), set()).add(column)

    def text(frame: tuple[Any, ...]) -> str:
        filename, lineno, column, function = frame
        at = f":{column}" if len(columns[(filename, lineno)]) > 1 else ""
        return f"{filename}:{lineno}{at} in {function}"

    texts = {}
    for d in details:
        path = paths.get(d["rank"])
        if not path:
            continue
        parts = [text(path[0])]
        first = start if start > 2 else 1
        if first > 1:
            parts.append(f"... ({first - 1} frames in common)")
        parts += [text(frame) for frame in path[first:]]
        sent = d["fields"]["call path"]
        if sent["more"]:
            parts.append(f"... ({sent['more']} more frames, digest {sent['digest'][:12]})")
        texts[d["rank"]] = " <- ".join(parts)
    return texts


def _what(detail: Mapping[str, Any], positions: bool, path: str | None = None) -> str:
    status = Status(detail["status"])
    if status is Status.FINISHED:
        return "finished their step function (no more collectives)"
    if status is Status.FAILED and detail.get("stopped"):
        at = detail.get("at")
        if at:  # some of its replicas waited at a collective that had not crossed
            replicas = [int(r) for r in at["replicas"]]
            where = f" at {at['site']}" if at.get("site") else ""
            return (
                f"had replica{'' if len(replicas) == 1 else 's'} "
                f"{', '.join(map(str, replicas))} at {at['describe']}{where} "
                f"(the {at['fields']['position']}) and another replica elsewhere: it was told, "
                "and cancelled its replicas"
            )
        return "had no replica at a collective: it was told, and cancelled its replicas"
    if status is Status.FAILED:
        return f"failed: {detail.get('error') or 'an exception'}"
    if status is Status.EXITED:
        error = detail.get("error")
        if detail.get("finalized") and not error:
            return "finalized MPI (MPI.Finalize())"
        return "exited" + (f" after an uncaught {error}" if error else "")
    fields = detail["fields"]
    text = f"called {detail['describe']}"
    if path or detail.get("site"):
        text += f" at {path or detail['site']}"
    return f"{text} ({fields['position']})" if positions else text


def _replicas(detail: Mapping[str, Any]) -> str:
    first, count = detail["replicas"]
    if count <= 2:
        ids = ", ".join(str(i) for i in range(first, first + count)) or "no"
    else:
        ids = f"{first}-{first + count - 1}"
    ids = f"replica{'' if count == 1 else 's'} {ids}"
    return f"process {detail['rank']} ({ids})"


def _tupled(value: Any) -> Any:
    """JSON lists back as tuples (hashable, comparable as the local signature's parts)."""
    return tuple(_tupled(v) for v in value) if isinstance(value, list) else value


def comparable_signature(fields: Mapping[str, Any]) -> Signature:
    """A :class:`Signature` to compare with the local matcher's rules.

    It matches another exactly when their processes' collectives match by
    ``asyncreplica.abc.MATCH_RULES``.

    Built from a process's plain fields: each part stands for what the matcher compares
    (the merge function by its code's place, the structure by its plain form, the
    call path by its frames and the digest of the rest). Only for comparing.
    """
    try:
        kind: Any = CollectiveKind(fields["kind"])
    except ValueError:
        kind = fields["kind"]  # a cross-replica operation (reduce, gather, refused)
    sent = fields.get("call path")
    call_path: tuple[CallSite, ...] = ()
    if sent:
        call_path = tuple(CallSite(f, int(n), fn, c) for f, n, c, fn in sent["frames"])
        if sent["more"]:
            call_path += (CallSite(str(sent["digest"]), int(sent["more"]), ""),)
    return Signature(
        kind,
        op=fields.get("op"),
        # A Signature's axis is one int (all_gather's); a reduce's axes (a list) are
        # compared by differing_fields itself.
        axis=fields.get("axis") if isinstance(fields.get("axis"), int) else None,
        source=fields.get("source"),
        merge_fn=fields.get("merge_fn"),
        name=fields.get("name"),
        structure=_tupled(fields.get("structure")),
        leaves=tuple(
            LeafSpec(tuple(shape), dtype, bool(sparse), *rest)
            for shape, dtype, sparse, *rest in fields.get("leaves", [])
        ),
        call_path=call_path,
    )


#: The fields in the order the local matcher lists them.
_FIELD_ORDER = [name for name, _ in MATCH_RULES] + ["call site"]


def differing_fields(details: Sequence[Mapping[str, Any]]) -> list[str]:
    """The names of the fields on which the processes' collectives differ.

    By the local matcher's own code (``asyncreplica.abc.signature_differences``): the
    same fields, the same names, the same order as inside one process. Whether call
    sites count was decided when each process sent its fields (no call path with
    ``check_call_sites=False`` or a name).
    """
    signatures = [comparable_signature(d["fields"]) for d in details]
    names: set[str] = set()
    for other in signatures[1:]:
        names.update(signature_differences(signatures[0], other, check_call_sites=True))
    if any(d["fields"].get("axis") != details[0]["fields"].get("axis") for d in details):
        names.add("axis")  # a reduce's axes, which a Signature cannot hold
    ordered = sorted(names, key=_FIELD_ORDER.index)
    if not ordered and any(
        d["fields"].get("position") != details[0]["fields"].get("position") for d in details
    ):
        ordered = ["position"]  # the same collective, at another position
    return ordered


def outcome_message(details: Sequence[Mapping[str, Any]]) -> tuple[str, str]:
    """Classify a non-unanimous exchange and build its message.

    Args:
        details: One detail per process, in rank order.

    Returns:
        ``(kind, message)`` where kind is ``"mismatch"`` (every process reached a
        collective, but different ones), ``"exited"`` (some process finished, exited
        or failed while others wait), or ``"failed"`` (a process failed and nobody
        waits).
    """
    statuses = [Status(d["status"]) for d in details]
    lines: list[str] = []
    paths: dict[int, str] = {}
    merge_fns: list[str] = []
    if all(s is Status.COLLECTIVE for s in statuses):
        fields = differing_fields(details)
        if any(
            d["fields"].get("call path") != details[0]["fields"].get("call path") for d in details
        ):
            paths = _path_texts(details)
        position = details[0]["fields"]["position"]
        lines.append(
            f"Processes disagree about their {position}: "
            f"{', '.join(fields)} differ{'s' if len(fields) == 1 else ''}."
        )
        kind = "mismatch"
        rule = (
            "Every replica of every process must issue the same collectives, with the same "
            "arguments, in the same order."
        )
        fix = (
            "The usual cause is a collective inside a branch or loop that depends on the "
            "process (rank, local data): move it out of the branch, or make every process "
            "take the same path."
        )
        if fields == ["merge_fn"]:
            # The same text as one process's: the function, its place, its bound values.
            merge_fns = [f"  * process {d['rank']}: {d['fields'].get('merge_fn')}" for d in details]
            fix = (
                "merge_fn runs once, as the first replica passed it, so every replica must "
                "pass the same function with the same plain values (numbers, strings, "
                "bytes, None, tuples of them) bound into it. Pass per-replica values "
                "through merge_call's args= or kwargs= (merge_fn receives them as "
                "PerReplica values), not through a functools.partial, a bound method's "
                "instance, a closure or a default."
            )
    else:
        waiting = [d for d in details if Status(d["status"]) is Status.COLLECTIVE]
        # Those whose run's watch stopped it, told of another's end (see _stop_run): they
        # are no culprits.
        stopped = [d for d in details if d.get("stopped")]
        gone = [
            d
            for d in details
            if Status(d["status"]) is not Status.COLLECTIVE and not d.get("stopped")
        ]
        failed = [
            d
            for d in gone
            if Status(d["status"]) is Status.FAILED
            or (Status(d["status"]) is Status.EXITED and d.get("error"))
        ]
        if failed:
            culprit = ", ".join(f"process {d['rank']}" for d in failed)
            lines.append(
                f"{culprit[0].upper()}{culprit[1:]} failed, so this run cannot complete "
                "on any process."
            )
        elif waiting and gone:
            culprit = ", ".join(f"process {d['rank']}" for d in gone)
            lines.append(
                f"Replicas of {culprit} stopped issuing collectives while other processes "
                f"wait at their {waiting[0]['fields']['position']}."
            )
        elif stopped and gone:
            culprit = ", ".join(f"process {d['rank']}" for d in gone)
            verb = (
                "ended"
                if any(Status(d["status"]) is not Status.EXITED for d in gone)
                else "finalized MPI"
                if all(d.get("finalized") for d in gone)
                else "exited"
            )
            lines.append(
                f"{culprit[0].upper()}{culprit[1:]} {verb} while this run was in progress, "
                "so it cannot complete on any process."
            )
        else:
            lines.append("The processes ended the run differently.")
        kind = "exited" if waiting or not failed else "failed"
        rule = (
            "Every replica of every process must issue the same number of collectives; a "
            "process that fails ends the run on every process."
        )
        fix = (
            "Look at the failing process's own error (it is raised there), or at the "
            "condition that makes one process skip or add a collective."
        )
    lines.append("")
    positions = {d["fields"].get("position") for d in details if d.get("fields")}
    for d in details:
        lines.append(f"  * {_replicas(d)} {_what(d, len(positions) > 1, paths.get(d['rank']))}")
    if merge_fns:
        lines += ["", "Their merge functions:", *merge_fns]
    # The exception adds its last line, the `asyncreplica explain` command of its kind.
    lines += ["", rule, fix]
    return kind, "\n".join(lines)


def rebuild_signature(fields: Mapping[str, Any], site: str | None) -> Signature:
    """A :class:`Signature` rebuilt from another process's plain fields (for reports)."""
    try:
        kind = CollectiveKind(fields["kind"])
    except ValueError:
        kind = CollectiveKind.ALL_REDUCE
    call_path: tuple[CallSite, ...] = ()
    sent = fields.get("call path")
    if sent and sent.get("frames"):
        call_path = tuple(CallSite(f, int(n), fn, c) for f, n, c, fn in sent["frames"])
    elif site:
        path, _, function = site.partition(" in ")
        filename, _, line = path.rpartition(":")
        if line.isdigit():
            call_path = (CallSite(filename, int(line), function),)
    return Signature(
        kind,
        op=None if fields.get("op") is None else ReduceOp(fields["op"]),
        axis=fields.get("axis") if isinstance(fields.get("axis"), int) else None,
        source=fields.get("source"),
        merge_fn=fields.get("merge_fn"),
        merge_fn_name=fields.get("merge_fn"),
        name=fields.get("name"),
        leaves=tuple(
            LeafSpec(tuple(s), d, bool(sp), *rest) for s, d, sp, *rest in fields.get("leaves", [])
        ),
        call_path=call_path,
    )
