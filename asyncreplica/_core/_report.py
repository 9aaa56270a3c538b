"""Builders of every collective error message, as pure functions of plain data.

Every message has the same shape, so that people learn to read it once:

1. one first line with the fact and the position ("... at their 3rd collective
   (position 2)"), stable enough to grep and to anchor tests on;
2. a blank line, then one bullet per distinct behaviour, identical replicas grouped,
   each with what they did and where (``file:line``);
3. the rule that was broken, in one sentence;
4. the usual cause and the fix;
5. the command that explains it (``asyncreplica explain AR102``, see :mod:`._codes`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence

from ._codes import see_also
from ._nest import self_unequal_hint, treedef_str
from ._signature import CallSite, CollectiveKind, MergeFnKey, Signature, ordinal

__all__ = [
    "ALIKE_MARK",
    "DOCS",
    "deadlock_message",
    "ended_message",
    "merge_fn_stall_message",
    "merge_fn_timeout_message",
    "combine_timeout_message",
    "key_text",
    "mark_alike",
    "told_once",
    "resumed_message",
    "value_text",
    "error_text",
    "stall_message",
    "exited_message",
    "format_replicas",
    "in_flight_message",
    "internal_message",
    "mismatch_message",
    "replica_cancelled_message",
    "see_also",
    "timeout_message",
]

DOCS = "docs/errors.md"  # the page that explains each error, on the documentation site


def value_text(value: object, limit: int | None = None) -> str:
    """``repr(value)`` (at most ``limit`` characters), for an error message about ``value``.

    A user's object whose ``__repr__`` raises (or returns no ``str``) is named by its type
    instead: the message about the user's mistake must not become that ``__repr__``'s error.
    """
    try:
        text = repr(value)
    except Exception:
        text = None
    if type(text) is not str:
        return f"<{type(value).__qualname__} object whose __repr__ failed>"
    return text if limit is None else text[:limit]


def error_text(error: BaseException) -> str:
    """``Type: first line of its message`` for ``error``; never raises.

    A user's exception may have a ``__str__`` that raises (or returns no ``str``): the
    run's own messages must still be built, and the user's exception still re-raised.
    One process's run and the scale-out backends describe a failure with this alike.
    """
    name = type(error).__name__
    try:
        text = str(error)
    except Exception:
        text = None
    if type(text) is not str:
        return f"{name} (its message could not be read: its __str__ raised)"
    first = text.splitlines()[0] if text else ""
    return f"{name}: {first}" if first else name


def key_text(key: int | tuple[str, int]) -> str:
    """``"3rd collective (position 2)"`` or ``"collective named 'grads' (2nd use)"``."""
    if isinstance(key, int):
        return f"{ordinal(key + 1)} collective (position {key})"
    return f"collective named {key[0]!r} ({ordinal(key[1] + 1)} use)"


def format_replicas(ids: Iterable[int]) -> str:
    """``"replica 2"``, ``"replicas 0, 1, 3"``, ``"replicas 0-99, 101-4095"``."""
    ordered = sorted(ids)
    if len(ordered) == 1:
        return f"replica {ordered[0]}"
    spans: list[str] = []
    start = prev = ordered[0]
    for i in [*ordered[1:], None]:
        if i is not None and i == prev + 1:
            prev = i
            continue
        if prev - start >= 2:
            spans.append(f"{start}-{prev}")
        else:
            spans.extend(str(x) for x in range(start, prev + 1))
        if i is not None:
            start = prev = i
    return "replicas " + ", ".join(spans)


# The frames of one call path a message shows: the call site, then the frames from
# the first one where the replicas' paths differ (the frames in between are elided).
_SHOWN = 8

_Place = tuple[str, int]
_NONE: frozenset[_Place] = frozenset()


#: The attribute of an error a replica raises in its own name ("Replica 3 issued ..."):
#: what follows the subject. Every replica that runs the same code raises it alike, and
#: the run reports it once (:func:`told_once`), as a refusal of ``_dtypes`` is.
ALIKE_MARK = "_asyncreplica_alike"


def mark_alike(error: BaseException, rest: str) -> None:
    """Mark ``error``, whose message is ``"Replica k" + rest``, as raised alike."""
    setattr(error, ALIKE_MARK, rest)


def told_once(errors: Sequence[tuple[int, BaseException]]) -> BaseException | None:
    """One error for one refusal that several replicas raised alike; else None.

    Args:
        errors: ``(global replica id, error)`` of each failed replica, in replica order.

    Returns:
        The first error, its message now naming every replica ("Each of replicas 0-2
        issued ..."), when every error is of one class and marked with the same text by
        :func:`mark_alike`; None otherwise.
    """
    if len(errors) < 2:
        return None
    first = errors[0][1]
    rest = getattr(first, ALIKE_MARK, None)
    if not isinstance(rest, str):
        return None
    for _, error in errors:
        if type(error) is not type(first) or getattr(error, ALIKE_MARK, None) != rest:
            return None
    first.args = (f"Each of {format_replicas([r for r, _ in errors])}{rest}",)
    return first


def _site_text(site: CallSite, ambiguous: frozenset[_Place]) -> str:
    return site.describe(column=(site.filename, site.lineno) in ambiguous)


def _path_text(
    path: Sequence[CallSite], start: int, ambiguous: frozenset[_Place], *, bound: bool
) -> str:
    """``a.py:9 <- ... (40 frames in common) <- b.py:16``: the frames around ``start``."""
    if not bound or len(path) <= _SHOWN:
        return " <- ".join(_site_text(site, ambiguous) for site in path)
    first = start if start > 2 else 1
    parts = [_site_text(path[0], ambiguous)]
    if first > 1:
        parts.append(f"... ({first - 1} frames in common)")
    window = path[first : first + _SHOWN - 1]
    parts += [_site_text(site, ambiguous) for site in window]
    rest = len(path) - first - len(window)
    if rest:
        parts.append(f"... ({rest} more frame{'' if rest == 1 else 's'})")
    return " <- ".join(parts)


def _where(
    sig: Signature,
    *,
    full_path: bool,
    start: int = 0,
    ambiguous: frozenset[_Place] = _NONE,
    bound: bool = True,
) -> str:
    if not sig.call_path:
        return ""
    if full_path and len(sig.call_path) > 1:
        return " at " + _path_text(sig.call_path, start, ambiguous, bound=bound)
    return f" at {_site_text(sig.call_path[0], ambiguous)}"


def _arguments(sig: Signature) -> str:
    """`` with args (*, [*, *]) and kwargs {'scale': *}``: a merge_call's argument structure."""
    if sig.kind is not CollectiveKind.MERGE_CALL or sig.structure is None:
        return ""
    args, kwargs = sig.structure[2]
    text = f" with args {treedef_str(args)}"
    if kwargs is not None and kwargs[2]:
        text += f" and kwargs {treedef_str(kwargs)}"
    return text


def _first_difference(paths: Iterable[tuple[CallSite, ...]]) -> int:
    """The index of the first frame at which the distinct ``paths`` differ (0 if alike)."""
    distinct = list(dict.fromkeys(paths))
    if len(distinct) < 2:
        return 0
    first, others = distinct[0], distinct[1:]
    shortest = min(len(p) for p in distinct)
    for i in range(shortest):
        if any(p[i] != first[i] for p in others):
            return i
    return shortest


def _ambiguous(paths: Iterable[tuple[CallSite, ...]]) -> frozenset[_Place]:
    """The (file, line) places where calls at different columns meet: shown with columns."""
    columns: dict[_Place, set[int | None]] = {}
    for path in paths:
        for site in path:
            columns.setdefault((site.filename, site.lineno), set()).add(site.column)
    return frozenset(place for place, seen in columns.items() if len(seen) > 1)


def _group(
    signatures: Mapping[int, Signature],
    *,
    full_path: bool,
    start: int = 0,
    ambiguous: frozenset[_Place] = _NONE,
    arguments: bool = False,
) -> list[tuple[list[int], str]]:
    def texts(bound: bool) -> dict[int, str]:
        return {
            rid: sig.describe()
            + (_arguments(sig) if arguments else "")
            + _where(sig, full_path=full_path, start=start, ambiguous=ambiguous, bound=bound)
            for rid, sig in sorted(signatures.items())
        }

    text_of = texts(True)
    if full_path:
        # Different paths must never read alike: if eliding frames made them so, show
        # every frame.
        paths: dict[str, set[tuple[CallSite, ...]]] = {}
        for rid, text in text_of.items():
            paths.setdefault(text, set()).add(signatures[rid].call_path)
        if any(len(seen) > 1 for seen in paths.values()):
            text_of = texts(False)
    groups: dict[str, list[int]] = {}
    for rid, text in text_of.items():
        groups.setdefault(text, []).append(rid)
    # The largest group first: the majority is usually right, the outliers follow.
    return sorted(((ids, text) for text, ids in groups.items()), key=lambda g: (-len(g[0]), g[0]))


def _verb(ids: Sequence[int], singular: str, plural: str) -> str:
    return singular if len(ids) == 1 else plural


def _see(kind: str) -> str:
    """The message's last line: the ``asyncreplica explain`` command of error ``kind``."""
    return see_also(kind)


def mismatch_message(
    position: int,
    signatures: Mapping[int, Signature],
    fields: Sequence[str],
    num_replicas: int,
    name: str | None = None,
    first_replica: int = 0,
    source: SourceLines | None = None,
) -> str:
    """The message of ``CollectiveMismatchError``.

    Args:
        position: The 0-based position at which replicas disagree (the occurrence of
            ``name`` for a named collective).
        signatures: The signature of every replica that has arrived there.
        fields: The fields that differ (see ``_match.RULES``).
        num_replicas: The number of replicas in sync.
        name: The name of the collective, for a named one.
        first_replica: The id of the first of the ``num_replicas`` replicas (under
            MPI, this process's first global id).
        source: Reads line ``lineno`` of file ``filename`` (``""`` when unknown), as
            ``linecache.getline`` does: with it, a swapped pair of calls is told as one.

    Returns:
        The full message.
    """
    full_path = "call site" in fields
    where = key_text(position if name is None else (name, position))
    merge_args = "structure" in fields and all(
        s.kind is CollectiveKind.MERGE_CALL for s in signatures.values()
    )
    named = ["merge_call arguments" if f == "structure" and merge_args else f for f in fields]
    paths = [sig.call_path for sig in signatures.values()]
    start = _first_difference(paths)
    ambiguous = _ambiguous(paths if full_path else [p[:1] for p in paths])
    lines = [
        (
            f"Replicas disagree about their {where}: "
            f"{', '.join(named)} differ{'s' if len(fields) == 1 and not merge_args else ''}."
        ),
        "",
    ]
    groups = _group(
        signatures, full_path=full_path, start=start, ambiguous=ambiguous, arguments=merge_args
    )
    for ids, text in groups:
        lines.append(f"  * {format_replicas(ids)} called {text}")
    pending = [r for r in range(first_replica, first_replica + num_replicas) if r not in signatures]
    if pending:
        lines.append(
            f"  * {format_replicas(pending)} {_verb(pending, 'has', 'have')} not arrived yet"
        )
    hint = _extra_or_missed(groups, signatures, start, source)
    if hint:
        lines += ["", hint]
    if "structure" in fields:
        keys = self_unequal_hint(s.structure for s in signatures.values())
        if keys:
            lines += ["", keys]
    lines += [
        "",
        "Every replica must issue the same collectives, with the same arguments, in the same order.",
    ]
    if merge_args:
        lines.append(
            "merge_call regroups the replicas' args and kwargs leaf by leaf into per-replica "
            "values, so they must have the same structure on every replica (the same "
            "containers, lengths and keys); only the leaves may differ. The usual cause is an "
            "argument passed by some replicas only, or a list whose length depends on the "
            "replica: pass the same structure everywhere (None where a replica has nothing)."
        )
    elif "array type" in fields:
        lines.append(_array_types_hint(signatures))
    elif "merge_fn" in fields and _bound_hint(signatures):
        lines += _bound_hint(signatures)
    elif fields == ("call site",):
        lines.append(
            "The calls look alike but come from different places in the code: usually one "
            "replica skipped a "
            "collective (or took another branch) and is now pairing a later call with its peers' "
            "earlier one. Make every replica take the same path to its collectives; if the calls "
            "really are the same collective, give them the same name= or create the strategy "
            "with check_call_sites=False."
        )
    else:
        lines.append(
            "The usual cause is a collective inside a branch on the replica id or on per-replica "
            "data (`if ctx.replica_id_in_sync_group == 0:`), or values whose shape or dtype "
            "depends on the replica. Move the collective out of the branch, or make every "
            "replica pass values of the same structure, shape and dtype."
        )
    lines.append(_see("CollectiveMismatchError"))
    return "\n".join(lines)


def _merge_fn_key(signature: Signature) -> MergeFnKey | None:
    """The :class:`MergeFnKey` in a signature (a library API's key holds one)."""
    key = signature.merge_fn
    parts = key if type(key) is tuple else (key,)
    return next((part for part in parts if isinstance(part, MergeFnKey)), None)


def _bound_hint(signatures: Mapping[int, Signature]) -> list[str]:
    """Lines naming the bound values that differ, when the merge functions' code agrees."""
    keys = {rid: _merge_fn_key(sig) for rid, sig in sorted(signatures.items())}
    found = [key for key in keys.values() if key is not None]
    if len(found) != len(keys) or len({key.code for key in found}) != 1:
        return []
    values = {rid: dict(key.bound) for rid, key in keys.items() if key is not None}
    labels = list(dict.fromkeys(label for key in found for label, _ in key.bound))
    differing = [label for label in labels if len({v.get(label) for v in values.values()}) > 1]
    if not differing:
        return []
    rows: dict[str, list[int]] = {}
    for rid, bound in values.items():
        text = ", ".join(
            f"{label}={bound.get(label, '(not a plain value)')}" for label in differing
        )
        rows.setdefault(text, []).append(rid)
    lines = [
        (
            "The replicas passed the same merge function with different values bound into "
            "it. merge_fn runs once, as replica 0 passed it, so the other replicas' values "
            "would be silently replaced by replica 0's:"
        )
    ]
    lines += [f"  * {format_replicas(ids)}: {text}" for text, ids in rows.items()]
    lines.append(
        "Pass per-replica values through merge_call's args= or kwargs= (merge_fn receives "
        "them as PerReplica values), not through a functools.partial, a bound method's "
        "instance, a closure or a default."
    )
    return lines


def _array_types_hint(signatures: Mapping[int, Signature]) -> str:
    """Name the array type each replica passed, at the first leaf where they differ."""
    specs = {r: sig.leaves for r, sig in signatures.items()}
    width = min(map(len, specs.values()), default=0)
    for j in range(width):
        types: dict[str, list[int]] = {}
        for r, leaves in specs.items():
            name = leaves[j].array_type or "the backend's own arrays or numbers (numpy.ndarray)"
            types.setdefault(name, []).append(r)
        if len(types) > 1:
            passed = "; ".join(
                f"{format_replicas(ids)} passed {name}" for name, ids in types.items()
            )
            return (
                f"Replicas passed different array types as leaf {j} of the value: {passed}. "
                "Results come back in each replica's own array type, so every replica must pass "
                "the same one: convert with the library's asarray (np.asarray, jnp.asarray, "
                "...) before the collective."
            )
    return "Replicas passed different array types: every replica must pass the same one."


SourceLines = Callable[[str, int], str]
"""``(filename, lineno) -> text`` of that line, ``""`` when unknown (``linecache.getline``)."""

# How far below a call site the swap check looks for the other group's call.
_SWAP_WINDOW = 40
_COMMENT = re.compile(r"\s*#[^'\"]*$")


def _code(source: SourceLines, site: CallSite) -> tuple[str, int]:
    """The code of ``site``'s line without its comment, and the line's indentation."""
    line = source(site.filename, site.lineno)
    return _COMMENT.sub("", line).strip(), len(line) - len(line.lstrip())


def _later(source: SourceLines, site: CallSite, code: str) -> int | None:
    """The line after ``site``, in its block, whose code is ``code``, if any."""
    _, indent = _code(source, site)
    for lineno in range(site.lineno + 1, site.lineno + 1 + _SWAP_WINDOW):
        line = source(site.filename, lineno)
        if not line.strip() or line.lstrip().startswith("#"):
            if not line:  # the end of the file
                return None
            continue
        if len(line) - len(line.lstrip()) < indent:  # the block ended
            return None
        if _COMMENT.sub("", line).strip() == code:
            return lineno
    return None


def _swapped(
    major: Sequence[int], minor: Sequence[int], a: CallSite, b: CallSite, source: SourceLines
) -> str | None:
    """Tell a swap: each group makes the other's call next, in its own block.

    ``a`` (the others') and ``b`` (the outliers') are the first frames at which the two
    groups' call paths differ, in one function. The calls are swapped when the block of
    ``b`` goes on with the same code as ``a``'s line, and the block of ``a`` with the
    same code as ``b``'s. One direction alone is no swap: a skipped call whose code
    follows in the enclosing block reads so.
    """
    code_a, _ = _code(source, a)
    code_b, _ = _code(source, b)
    if not code_a or not code_b or code_a == code_b:
        return None
    theirs_later = _later(source, b, code_a)
    mine_later = _later(source, a, code_b)
    if theirs_later is None or mine_later is None:
        return None
    outliers, others = format_replicas(minor), format_replicas(major)
    their_call = a._replace(lineno=theirs_later, column=None)
    my_call = a._replace(lineno=mine_later, column=None)
    return (
        f"{outliers} {_verb(minor, 'issues', 'issue')} the same collectives as {others} in a "
        f"different order: {outliers} {_verb(minor, 'calls', 'call')} {b} then {their_call} "
        f"(the same call as {a}); {others} {_verb(major, 'calls', 'call')} {a} then {my_call} "
        f"(the same call as {b})."
    )


def _diverging_calls(
    path_a: Sequence[CallSite], path_b: Sequence[CallSite], start: int
) -> tuple[CallSite, CallSite] | None:
    """The two calls, in one function, at which two call paths part ways, if any.

    First the frames at ``start`` (the call sites, or the call of a helper both paths
    share). When those are in different functions (two helpers that each make a
    collective), the paths are compared from their outermost frame instead: the first
    frames at which they differ there are the two calls, in one function, that led to
    the helpers (``await grads(...)`` and ``await loss(...)`` swapped in the step).
    """
    a, b = path_a[start], path_b[start]
    if (a.filename, a.function) != (b.filename, b.function):
        common = min(len(path_a), len(path_b))
        outer_a, outer_b = path_a[::-1], path_b[::-1]
        k = next((i for i in range(common) if outer_a[i] != outer_b[i]), common)
        if k == common:
            return None
        a, b = outer_a[k], outer_b[k]
        if (a.filename, a.function) != (b.filename, b.function):
            return None
    if a.lineno == b.lineno:
        return None
    return a, b


def _extra_or_missed(
    groups: Sequence[tuple[list[int], str]],
    signatures: Mapping[int, Signature],
    start: int,
    source: SourceLines | None = None,
) -> str | None:
    """Say whether the outliers swapped two collectives, made an extra one or skipped one.

    The call paths tell when there are two behaviours whose first differing frames
    (index ``start``: the call site, or the call of a helper they share) are in the
    same function of the same file. When the source tells that each group's block
    goes on with the other's call, the groups issue the calls in different orders;
    otherwise the earlier line is the collective that the others do not (yet) make.
    """
    if len(groups) != 2:
        return None
    (major, _), (minor, _) = groups
    path_a, path_b = signatures[major[0]].call_path, signatures[minor[0]].call_path
    if start >= len(path_a) or start >= len(path_b):
        return None
    pair = _diverging_calls(path_a, path_b, start)
    if pair is None:
        return None
    a, b = pair
    if source is not None:
        swap = _swapped(major, minor, a, b, source)
        if swap is not None:
            return swap
    outliers, others = format_replicas(minor), format_replicas(major)
    if len(major) == len(minor):
        first, second = (minor, major) if b.lineno < a.lineno else (major, minor)
        early, late = (b, a) if first is minor else (a, b)
        return (
            f"{format_replicas(first)} {_verb(first, 'is', 'are')} at an earlier line ({early}) "
            f"than {format_replicas(second)} ({late}): either {format_replicas(first)} made an "
            f"extra collective at {early}, or {format_replicas(second)} skipped it."
        )
    if b.lineno < a.lineno:
        return (
            f"{outliers} made an extra collective at {b}: the others are already at a later line "
            f"of {b.function}() ({a})."
        )
    return (
        f"{outliers} skipped the collective at {a} that {others} made: "
        f"{_verb(minor, 'it is', 'they are')} already at a later line of {a.function}() ({b})."
    )


def exited_message(
    exited: int,
    exited_count: int,
    exited_last: Signature | None,
    position: int,
    waiting: Mapping[int, Signature],
    name: str | None = None,
) -> str:
    """The message of ``ReplicaExitedError``.

    Args:
        exited: The replica that finished.
        exited_count: How many collectives it made before finishing.
        exited_last: Its last collective, if any.
        position: The position the others wait at (or arrived at).
        waiting: The signatures of the replicas waiting there.
        name: The name of the collective they wait at, for a named one.

    Returns:
        The full message.
    """
    wait_ids = sorted(waiting)
    lines = [
        (
            f"Replica {exited} finished after {exited_count} collective"
            f"{'' if exited_count == 1 else 's'}, but {format_replicas(wait_ids)} "
            f"{_verb(wait_ids, 'is', 'are')} waiting at {_verb(wait_ids, 'its', 'their')} "
            f"{key_text(position if name is None else (name, position))}."
        ),
        "",
    ]
    for ids, text in _group(waiting, full_path=False):
        lines.append(f"  * {format_replicas(ids)} called {text}")
    if exited_last is None:
        last = "without making any collective"
    else:
        last = f"after {exited_last.describe()}{_where(exited_last, full_path=False)}"
    lines += [
        f"  * replica {exited} returned {last}",
        "",
        "Every replica must make the same number of collectives in one run.",
        (
            f"Either replica {exited} skipped a collective (a collective inside `if` on the replica "
            "id or on per-replica data, or a loop whose trip count differs per replica, such as an "
            f"uneven last batch), or {format_replicas(wait_ids)} made an extra one. Make every "
            "replica issue the same sequence of collectives."
        ),
        _see("ReplicaExitedError"),
    ]
    return "\n".join(lines)


def timeout_message(
    position: int,
    timeout: float,
    arrived: Mapping[int, Signature],
    missing: Mapping[int, str],
    where: str | None = None,
) -> str:
    """The message of ``CollectiveTimeoutError``.

    Args:
        position: The position of the rendezvous that timed out.
        timeout: The timeout in seconds.
        arrived: The signatures of the replicas that arrived.
        missing: For each missing replica, where it is now (free text).
        where: How to name the collective (default: from ``position``).

    Returns:
        The full message.
    """
    miss_ids = sorted(missing)
    lines = [
        (
            f"Timed out after {timeout:g} s waiting for {format_replicas(miss_ids)} at the "
            f"{where or key_text(position)}."
        ),
        "",
        *_roll_call(arrived, missing, "and waited"),
    ]
    lines += [
        "",
        (
            "A collective completes only when every replica reaches it; the missing replicas are "
            "alive but busy elsewhere."
        ),
        (
            "Find what they wait for (I/O, a lock, a long computation) or raise timeout_seconds in "
            "CommunicationOptions."
        ),
        _see("CollectiveTimeoutError"),
    ]
    return "\n".join(lines)


def _roll_call(
    arrived: Mapping[int, Signature], missing: Mapping[int, str], verb: str
) -> list[str]:
    lines = [
        f"  * {format_replicas(ids)} called {text} {verb}"
        for ids, text in _group(arrived, full_path=False)
    ]
    by_place: dict[str, list[int]] = {}
    for rid in sorted(missing):
        by_place.setdefault(missing[rid], []).append(rid)
    lines += [
        f"  * {format_replicas(ids)} did not arrive: {place}" for place, ids in by_place.items()
    ]
    return lines


# The last line of every stall warning.
_STALL_NOTE = (
    "This is a warning, not an error: the run goes on, and a message follows if the "
    "collective completes. Set CommunicationOptions(timeout_seconds=...) to fail instead."
)


def stall_message(
    where: str, waited: float, arrived: Mapping[int, Signature], missing: Mapping[int, str]
) -> str:
    """The text of the stall warning: who waits, for whom, and where the missing are."""
    return "\n".join(
        [
            (
                f"Collective stalled: {format_replicas(arrived) if arrived else 'no replica'} "
                f"{_verb(list(arrived), 'has', 'have')} waited {waited:.1f} s at the {where} for "
                f"{format_replicas(missing)}."
            ),
            "",
            *_roll_call(arrived, missing, "and waits"),
            "",
            _STALL_NOTE,
        ]
    )


def merge_fn_stall_message(
    where: str, waited: float, merge_fn: str, caller: int, whereabouts: str, num_replicas: int
) -> str:
    """The stall warning for a merge_call whose ``merge_fn`` has not returned.

    Args:
        where: The collective, as :func:`key_text` names it.
        waited: Seconds since the first replica arrived.
        merge_fn: The merge function's qualified name.
        caller: The replica in whose task ``merge_fn`` runs (the last to arrive).
        whereabouts: Where ``merge_fn`` awaits now (free text).
        num_replicas: The number of replicas in sync.

    Returns:
        The text of the warning.
    """
    everyone = format_replicas(range(num_replicas))
    return "\n".join(
        [
            (
                f"Collective stalled: {everyone} {_verb(list(range(num_replicas)), 'has', 'have')} "
                f"waited {waited:.1f} s at the {where} for merge_fn {merge_fn} to return."
            ),
            "",
            f"  * {everyone} called merge_call({merge_fn}) and {_verb([0] * num_replicas, 'waits', 'wait')}",
            f"  * merge_fn {merge_fn} runs in replica {caller}'s task, {whereabouts}",
            "",
            _STALL_NOTE,
        ]
    )


def merge_fn_timeout_message(
    where: str, timeout: float, merge_fn: str, caller: int, whereabouts: str, num_replicas: int
) -> str:
    """The message of the ``CollectiveTimeoutError`` for a ``merge_fn`` that did not return.

    Args:
        where: The collective, as :func:`key_text` names it.
        timeout: The timeout in seconds (counted from when ``merge_fn`` started).
        merge_fn: The merge function's qualified name.
        caller: The replica in whose task ``merge_fn`` ran (the last to arrive).
        whereabouts: Where ``merge_fn`` was awaiting when the time ran out (free text).
        num_replicas: The number of replicas in sync.

    Returns:
        The full message.
    """
    everyone = format_replicas(range(num_replicas))
    return "\n".join(
        [
            (
                f"Timed out after {timeout:g} s waiting for merge_fn {merge_fn} to return at the "
                f"{where}."
            ),
            "",
            f"  * {everyone} called merge_call({merge_fn}) and waited",
            f"  * merge_fn {merge_fn} ran in replica {caller}'s task, {whereabouts}",
            "",
            (
                "Every replica arrived; merge_fn runs once for all of them, and they resume only "
                "when it returns."
            ),
            (
                "Find what merge_fn waits for (an event, I/O, a lock) or raise timeout_seconds in "
                "CommunicationOptions."
            ),
            _see("CollectiveTimeoutError"),
        ]
    )


def combine_timeout_message(
    where: str, timeout: float, combine: str, caller: int, whereabouts: str, num_replicas: int
) -> str:
    """The message of the ``CollectiveTimeoutError`` for a backend combine that did not return.

    Args:
        where: The collective, as :func:`key_text` names it.
        timeout: The timeout in seconds (counted from when the combine started).
        combine: The backend's method, as ``the 'numpy' backend's all_reduce (B.all_reduce)``.
        caller: The replica in whose task the combine ran (the last to arrive).
        whereabouts: Where the combine was awaiting when the time ran out (free text).
        num_replicas: The number of replicas in sync.

    Returns:
        The full message.
    """
    everyone = format_replicas(range(num_replicas))
    return "\n".join(
        [
            f"Timed out after {timeout:g} s waiting for {combine} to return at the {where}.",
            "",
            f"  * {everyone} arrived and waited for the combined values",
            f"  * the combine ran in replica {caller}'s task, {whereabouts}",
            "",
            (
                "Every replica arrived; the backend combines their values once for all of "
                "them, and they resume only when it returns."
            ),
            (
                "Find what the backend waits for (a peer, a device, a lock) or raise "
                "timeout_seconds in CommunicationOptions."
            ),
            _see("CollectiveTimeoutError"),
        ]
    )


def ended_message(
    where: str | None,
    what: str | None,
    how: str,
    cause: str | None,
    missing: Sequence[int],
    strategy: str,
) -> str:
    """The error for a collective that can never complete because its run is over.

    Args:
        where: The collective, as :func:`key_text` names it, if it was issued.
        what: The collective as its signature describes it, if it was not.
        how: How the run ended: ``"failed"``, ``"was cancelled"`` or ``"ended"``.
        cause: The run's root cause (``"Type: first line"``), if it failed.
        missing: The replicas that never arrived at the collective.
        strategy: The strategy's class name.

    Returns:
        The full message.
    """
    subject = f"The {where}" if where else f"The collective {what or ''}".rstrip()
    lines = [
        (
            f"{subject} can never complete: the {strategy}.run it belongs to {how}"
            + (f" ({cause})." if cause else ".")
        ),
        "",
    ]
    if missing:
        lines.append(f"  * {format_replicas(missing)} never arrived at it")
    lines += [
        (
            "  * it was awaited by a task that outlived its replica (asyncio.ensure_future or "
            "create_task in the step function, never awaited there)"
        ),
        "",
        (
            "No replica will arrive any more; the run's own error says what went wrong. Await "
            "helper tasks inside the step function (asyncio.gather or a task group), so that they "
            "end with their replica."
        ),
        _see("CollectiveError"),
    ]
    return "\n".join(lines)


def resumed_message(where: str, waited: float) -> str:
    """The text logged when a stalled collective completes after all."""
    return (
        f"Collective resumed: the {where} completed after {waited:.1f} s; the stall warning "
        "above was not a hang."
    )


def deadlock_message(
    edges: Sequence[tuple[int, str, Signature, Sequence[int]]],
) -> str:
    """The message of ``CollectiveDeadlockError``.

    Args:
        edges: For each replica of the cycle: its id, the collective it waits at (as
            text), that collective's signature, and the replicas it waits for.

    Returns:
        The full message.
    """
    named = [e[0] for e in edges if e[2].name is not None]
    unnamed = [e[0] for e in edges if e[2].name is None]
    if named and unnamed:
        return _mixed_names_message(edges, named, unnamed)
    lines = [
        (
            f"{format_replicas(e[0] for e in edges).capitalize()} wait for each other in a cycle: "
            "none of their collectives can ever complete."
        ),
        "",
    ]
    for rid, where, sig, needs in edges:
        lines.append(
            f"  * replica {rid} waits at its {where}: {sig.describe()}{_where(sig, full_path=False)}, "
            f"which {format_replicas(needs)} {_verb(list(needs), 'has', 'have')} not issued"
        )
    lines += [
        "",
        (
            "Named collectives match by name, so each replica must eventually issue every name its "
            "peers wait at; here each waits for a name that another issues only after its own wait."
        ),
        (
            "Await named collectives in the same order on every replica, or start them concurrently "
            "(asyncio.gather or a task group) so that none blocks the others."
        ),
        _see("CollectiveDeadlockError"),
    ]
    return "\n".join(lines)


def _mixed_names_message(
    edges: Sequence[tuple[int, str, Signature, Sequence[int]]],
    named: Sequence[int],
    unnamed: Sequence[int],
) -> str:
    """The deadlock message when some replicas wait at a named collective, others at unnamed."""
    lines = [
        (
            f"{format_replicas(named).capitalize()} {_verb(named, 'waits', 'wait')} at a named "
            f"collective while {format_replicas(unnamed)} {_verb(unnamed, 'waits', 'wait')} at an "
            "unnamed one: they can never pair up."
        ),
        "",
    ]
    for rid, where, sig, needs in edges:
        lines.append(
            f"  * replica {rid} waits at its {where}: {sig.describe()}{_where(sig, full_path=False)}"
            f", which {format_replicas(needs)} {_verb(list(needs), 'has', 'have')} not issued"
        )
    lines += [
        "",
        (
            "Named collectives match only by name, unnamed ones only by their order, so a "
            "collective named on some replicas and unnamed on others never completes. The usual "
            "cause is a name= given on some replicas only (or None on some): pass the same name= "
            "on every replica, or none."
        ),
        _see("CollectiveDeadlockError"),
    ]
    return "\n".join(lines)


def in_flight_message(replica: int, new: Signature, pending: Signature, where: str) -> str:
    """The message for an unnamed collective issued while the replica has one in flight."""
    return "\n".join(
        [
            f"Replica {replica} issued a collective while its {where} is still in flight.",
            "",
            f"  * in flight: {pending.describe()}{_where(pending, full_path=False)}",
            f"  * new: {new.describe()}{_where(new, full_path=False)}",
            "",
            (
                "Unnamed collectives match by their order, so one replica issues them one at a "
                "time: await each collective before issuing the next, or give each concurrent "
                "collective a name (name='grads') so that they match by name."
            ),
            _see("CollectiveError"),
        ]
    )


def replica_cancelled_message(
    replica: int,
    how: str,
    where: str | None,
    num_replicas: int,
    strategy: str,
    called: bool = False,
) -> str:
    """The error for a replica whose task was cancelled (or closed) by something not its run.

    Args:
        replica: The replica (global id).
        how: ``"cancelled"`` or ``"closed"`` (``GeneratorExit``).
        where: Where it ended (``file:line in function()``), or None when its task was
            cancelled before it ran any of the replica's code.
        num_replicas: The number of replicas in sync.
        strategy: The strategy's class name.
        called: Whether its step function was called (with ``where`` None: it returned
            an awaitable, and awaiting that ended the replica).

    Returns:
        The full message.
    """
    if how == "closed":
        fact = f"Replica {replica} of {num_replicas} ended with GeneratorExit"
        cause = (
            "GeneratorExit is what the interpreter raises to close a coroutine or generator; "
            "raised in a step function or a merge_fn (or let out of a generator it drives), "
            "it ends the replica without a result."
        )
    else:
        fact = f"Replica {replica} of {num_replicas} was cancelled from outside its {strategy}.run"
        cause = (
            "Its task was cancelled (task.cancel() on it, for instance by a shutdown routine "
            "that cancels every task but the main one), or a library inside the step function "
            "or a merge_fn raised CancelledError. A replica cancelled on its own gives no "
            "result, so the run cannot return one."
        )
    if where:
        place = f" at {where}"
    elif called:
        place = " while it awaited what its step function returned (no line of it was running)"
    else:
        place = " before it ran any of its step function"
    return "\n".join(
        [
            f"{fact}{place}.",
            "",
            cause,
            "",
            (
                f"To stop the run, cancel the code that awaits {strategy}.run (a cancel scope "
                "or a timeout around it), which cancels every replica together; to bound a "
                "collective, use CommunicationOptions(timeout_seconds=...)."
            ),
            _see("ReplicaCancelledError"),
        ]
    )


def internal_message(message: str) -> str:
    """The text of an ``InternalError``: the broken invariant, then how to report it."""
    return (
        f"{message}\n\n"
        "This is a bug in asyncreplica, not in your program: please report it to "
        "asyncreplica's issue tracker, with the full traceback (run with "
        "ASYNCREPLICA_FULL_TRACEBACK=1); the exception that revealed it, if any, is chained "
        "above."
    )
