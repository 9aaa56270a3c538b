"""Issuing an all_reduce: the body of ``ReplicaContext.all_reduce``, compiled.

``ReplicaContext.all_reduce`` (public, documented: it stays interpreted, since mypyc drops
docstrings) passes its fields here. This module is on the compiled hot path (see
pyproject.toml): every replica runs it once per collective. It checks that the call is
made inside the replica, parses the op and options, flattens and describes the value,
captures the call path and builds (or finds, for one leaf) the collective's signature,
then issues the :class:`~._collective.Collective`. Every check and message is the
context's: what fails calls back into the context to raise it. The context, run and
strategy are handed in as the small protocols of ``_protocols`` (``IssuingContext``,
``IssuingRun``, ``IssuingStrategy``): this module names no class above it, not even for
types.

It also holds the caches that building relies on: the types seen to be leaves, the
treedefs of flat batches and the interned signatures of one-leaf all_reduces.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Final

from .._core._dtypes import reduce_refusal
from .._core._nest import TreeDef, flatten
from .._core._signature import CollectiveKind, LeafSpec, ReduceOp, Signature
from ._collective import Collective
from ._inspect import DEPENDENT_CACHES, call_path
from ._mode import MODE

if TYPE_CHECKING:
    from .._options import CommunicationOptions
    from ._protocols import Describer, IssuingContext, IssuingRun, IssuingStrategy

__all__ = ["all_reduce", "flatten_value", "reducible", "reducible_leaves"]

# Types seen to be leaves: a value of one of these skips flattening (a cache, not a rule).
_LEAF_TYPES: Final[set[type]] = set()

# Treedefs of flat lists and tuples of leaves, by (container type, length): the same
# object for the same structure, so replicas' structures compare by identity.
_FLAT_TREEDEFS: Final[dict[tuple[type, int], TreeDef]] = {}

# Signatures of single-leaf all_reduces, by id(leaf spec) ^ id(call path) (an int hashes
# for free; a tuple of two does not). Two pairs may share a key: an entry is used only
# when its spec and path are the very objects (see all_reduce).
_SIGNATURES: Final[dict[int, Signature]] = {}
_MAX_SIGNATURES: Final = 4096
DEPENDENT_CACHES.append(_SIGNATURES)  # cleared with the call paths (code made per step)

_ALL_REDUCE: Final = CollectiveKind.ALL_REDUCE
_new_signature: Final = tuple.__new__
# Imported names bound once (compiled, a Final name is a static, not a look-up in the
# module's namespace on every call).
_MODE: Final = MODE
_ReduceOp: Final = ReduceOp
_Collective: Final = Collective


def flatten_value(value: object) -> tuple[list[object], TreeDef]:
    """``flatten(value)``, with known leaf types and flat batches of them found at once."""
    kind = type(value)
    if kind in _LEAF_TYPES:
        return [value], None
    if kind is list or kind is tuple:
        items: Sequence[object] = value  # type: ignore[assignment]
        if _LEAF_TYPES.issuperset(map(type, items)):
            # A flat batch of known leaf types (the common batched case): no recursion.
            size = len(items)
            treedef = _FLAT_TREEDEFS.get((kind, size))
            if treedef is None:
                if len(_FLAT_TREEDEFS) > 1024:
                    _FLAT_TREEDEFS.clear()
                treedef = _FLAT_TREEDEFS[(kind, size)] = flatten(value)[1]
            return list(items), treedef
    leaves, treedef = flatten(value)
    if treedef is None:
        _LEAF_TYPES.add(kind)
    elif len(_LEAF_TYPES) < 256:
        _LEAF_TYPES.update(map(type, leaves))
    return leaves, treedef


def reducible(
    ctx: Describer, op: ReduceOp, value: object
) -> tuple[list[object], TreeDef, tuple[LeafSpec, ...]]:
    """``value``'s leaves, treedef and specs, when ``op`` may reduce it; else its error.

    The rule for the value of a reduction issued in a replica context, in one place:
    each leaf is converted once, now, if the backend converts it (``ctx._held``), is
    one the backend holds (``ctx._describe``) and ``op`` reduces
    (:func:`reduce_refusal`). ``all_reduce`` and ``reduce_scatter`` check their value
    with it, and so does the default replica context, whose collectives return the
    value itself: a call refused in a replica is refused there too.
    """
    leaves, treedef = flatten_value(value)
    return reducible_leaves(ctx, op, leaves, treedef)


def reducible_leaves(
    ctx: Describer, op: ReduceOp, leaves: list[object], treedef: TreeDef
) -> tuple[list[object], TreeDef, tuple[LeafSpec, ...]]:
    """:func:`reducible` of a value already flattened to ``leaves`` and ``treedef``.

    The leaves it returns are ``leaves`` itself when none converts (``_held``).
    """
    leaves = ctx._held(leaves, treedef)  # converted once, now (_held's rule)
    specs: tuple[LeafSpec, ...] = ctx._describe(leaves, treedef)
    refusal = reduce_refusal(op, specs)
    if refusal is not None:
        raise refusal
    return leaves, treedef, specs


def all_reduce(
    ctx: IssuingContext,
    run: IssuingRun | None,
    strategy: IssuingStrategy,
    replica: int,
    reduce_op: ReduceOp | str,
    value: object,
    options: CommunicationOptions | None,
    name: str | None,
    dispatch: Callable[..., Any],
) -> Collective:
    """Issue ``ctx.all_reduce(reduce_op, value, options, name=name)`` (see there).

    ``run``, ``strategy`` and ``replica`` are the context's fields; ``dispatch`` is the
    all_reduce's dispatch function.
    """
    mode = _MODE.get()
    if mode is None or mode.replica is not ctx or run is None or run.closed:
        run = ctx._require_current("all_reduce")
    op = reduce_op if type(reduce_op) is _ReduceOp else _ReduceOp.parse(reduce_op)
    if options is None:
        defaults = strategy._communication_options
        timeout = defaults.timeout_seconds
        bytes_per_pack = defaults.bytes_per_pack
    else:
        merged = ctx._merged(options)
        timeout = merged.timeout_seconds
        bytes_per_pack = merged.bytes_per_pack
    leaves: list[object]
    treedef: TreeDef = None
    signature: Signature | None
    kind = type(value)
    if kind in _LEAF_TYPES:
        # One leaf (the common case): the signature is interned by the leaf's spec
        # and call path (both interned themselves), so every replica at this call
        # shares one signature object: the ledger compares them by identity, and
        # no new signature is kept alive per collective.
        leaves = [value]
        if kind not in strategy._as_is:
            # A value the backend converts is converted once, now (_held's rule).
            leaves = ctx._held(leaves)
            value = leaves[0]
        try:
            spec = run.describe(value)
        except TypeError as exc:
            raise ctx._leaf_error(exc, leaves, None, 0) from exc
        if name is not None:
            name = ctx._check_name(name)
        path = call_path()
        cache_key = id(spec) ^ id(path)
        signature = _SIGNATURES.get(cache_key)
        if (
            signature is None
            or signature[9] is not path
            or signature[8][0] is not spec
            or signature[1] is not op
            or signature[6] != name
        ):
            # Refused here, by every replica, before any waits (checked once per new
            # signature: a refused one is never cached).
            refusal = reduce_refusal(op, (spec,))
            if refusal is not None:
                raise refusal
            signature = Signature(_ALL_REDUCE, op, name=name, leaves=(spec,), call_path=path)
            if len(_SIGNATURES) >= _MAX_SIGNATURES:
                _SIGNATURES.clear()
            # The signature holds spec and path: their ids stay theirs while cached.
            _SIGNATURES[cache_key] = signature
    else:
        leaves, treedef, specs = reducible(ctx, op, value)
        if name is not None:
            name = ctx._check_name(name)
        # A plain tuple build: the named tuple's keyword constructor costs more
        # than everything else the checks do on this path.
        signature = _new_signature(
            Signature,
            (_ALL_REDUCE, op, None, None, None, None, name, treedef, specs, call_path()),
        )
    return Collective(run, replica, signature, leaves, dispatch, bytes_per_pack, timeout, treedef)
