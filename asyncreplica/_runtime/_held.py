"""What a collective reads of a replica's value: the one rule, in one place.

A leaf that is already an array the backend holds (numpy's ``ndarray``, a number, a
foreign array it accepts) is read when the last replica arrives, and a change of its
shape or dtype in flight is refused (``_context._check_unchanged``, the numpy backend's
``_check_described``). Anything else the backend *converts* (an object with only
``__array__``, a ``memoryview``, ...) is converted exactly once, here, when the replica
issues the collective (or calls the cross-replica API): the signature describes the
converted array and the backend combines that array. A second conversion could return
another dtype, another shape or raise, and the paths that read the value again disagreed
about it (docs/concepts.md, "When inputs are read").

Every path calls :func:`held_leaves`: a collective's leaves (``ReplicaContext._held``,
the compiled all_reduce of ``_issuing``) and a cross-replica API's components
(``_extended.held_components``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["held_leaves"]

# Types a strategy's backend returned as they are: not converted again (a cache per
# strategy, not a rule; see Backend.convert). Bounded, as the runtime's other type caches.
_AS_IS_LIMIT = 256


def held_leaves(
    backend: Any,
    as_is: set[type],
    leaves: list[object],
    refused: Callable[[Exception, int], BaseException],
) -> list[object]:
    """``leaves`` as the backend reads them: each converted once, now.

    ``backend.convert`` (``Backend.convert``) gives each leaf the backend converts as
    the array it reads; a leaf it returns as it is is read as it is, and its type is
    remembered in ``as_is`` (the strategy's), so that the next leaf of that type costs
    one set look-up. Returns ``leaves`` itself when no leaf converts, else a new list.

    Raises:
        BaseException: ``refused(error, j)``, from the ``error`` that converting leaf
            ``j`` raised (the error itself where ``refused`` returns it); a
            BaseException that is not an Exception (``KeyboardInterrupt``) as it is.
    """
    if as_is.issuperset(map(type, leaves)):
        return leaves
    convert = getattr(backend, "convert", None)
    out = leaves
    done: dict[int, object] = {}  # one object passed twice is converted once
    for j, leaf in enumerate(leaves):
        kind = type(leaf)
        if kind in as_is:
            continue
        if id(leaf) in done:
            now = done[id(leaf)]
        elif convert is None:
            now = leaf  # a backend without the method reads every value as it is
        else:
            try:
                now = convert(leaf)
            except Exception as exc:
                error = refused(exc, j)
                if error is exc:
                    raise
                raise error from exc
            done[id(leaf)] = now
        if now is leaf:
            if len(as_is) >= _AS_IS_LIMIT:
                as_is.clear()
            as_is.add(kind)
            continue
        if out is leaves:
            out = list(leaves)
        out[j] = now
    return out
