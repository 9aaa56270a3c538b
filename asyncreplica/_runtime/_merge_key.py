"""What identifies a merge function across replicas: its code and its plain bound values.

``merge_fn`` runs once, for every replica, as replica 0 passed it (TensorFlow's
semantics). Comparing only its code let a value bound into it on each replica (a
``functools.partial`` argument, a bound method's instance attribute, a closure cell, a
default) differ silently: every replica got a result computed with replica 0's value.
The key (:class:`~asyncreplica._core._signature.MergeFnKey`) therefore also holds the
bound values that can be compared exactly and cheaply: numbers, strings, bytes,
``None`` and tuples of them. Other bound objects (arrays, dicts, the replica's context)
are not compared; the docs say that replica 0's are used.
"""

from __future__ import annotations

import functools
import numbers
from collections.abc import Callable
from typing import Any

from .._core._signature import MergeFnKey

__all__ = ["merge_fn_key", "merge_fn_name"]

#: How deep tuples of plain values are compared.
_DEPTH = 3


def _is_plain(value: object, depth: int = 0) -> bool:
    """Whether ``value``'s repr is an exact, cheap key (and it is not mutable)."""
    if value is None or isinstance(value, (bool, int, float, complex, str, bytes)):
        return True  # repr is exact for these (a float's round-trips)
    if isinstance(value, numbers.Number) and type(value).__module__ == "numpy":
        return True  # numpy scalars: their repr names their type
    if type(value) is tuple and depth < _DEPTH:
        return all(_is_plain(item, depth + 1) for item in value)
    return False


def _attributes(label: str, obj: object) -> list[tuple[str, object]]:
    """``obj`` when it is plain, else the values its ``__dict__`` holds."""
    if _is_plain(obj):
        return [(label, obj)]
    try:
        attributes = vars(obj)
    except TypeError:  # no __dict__ (slots, builtins)
        return []
    return [(f"{label}.{name}", attributes[name]) for name in sorted(attributes)]


def _unwrap(merge_fn: Callable[..., Any]) -> tuple[Any, list[tuple[str, object]]]:
    """The function whose code identifies ``merge_fn``, and the values bound into it."""
    fn: Any = merge_fn
    bound: list[tuple[str, object]] = []
    while isinstance(fn, functools.partial):
        bound += [(f"partial arg {i}", arg) for i, arg in enumerate(fn.args)]
        bound += [(name, fn.keywords[name]) for name in sorted(fn.keywords)]
        fn = fn.func
    if getattr(fn, "__self__", None) is not None and hasattr(fn, "__func__"):
        bound += _attributes("self", fn.__self__)  # a bound method
        fn = fn.__func__
    return fn, bound


def _function_values(fn: Any, code: Any) -> list[tuple[str, object]]:
    """A function's closure cells and defaults, by variable name."""
    bound: list[tuple[str, object]] = []
    for name, cell in zip(code.co_freevars, getattr(fn, "__closure__", None) or (), strict=False):
        try:
            bound.append((name, cell.cell_contents))
        except ValueError:  # an empty cell (a variable not assigned yet)
            continue
    defaults = getattr(fn, "__defaults__", None) or ()
    if defaults:
        names = code.co_varnames[code.co_argcount - len(defaults) : code.co_argcount]
        bound += list(zip(names, defaults, strict=True))
    kwdefaults = getattr(fn, "__kwdefaults__", None) or {}
    bound += [(name, kwdefaults[name]) for name in sorted(kwdefaults)]
    return bound


def merge_fn_key(merge_fn: Callable[..., Any]) -> MergeFnKey:
    """What replicas must agree on: the code, and every plain value bound into it."""
    fn, bound = _unwrap(merge_fn)
    code = getattr(fn, "__code__", None)
    if code is not None:
        bound += _function_values(fn, code)
    else:  # a callable object: its class's __call__, and its attributes
        call = getattr(type(fn), "__call__", None)  # noqa: B004 -- we want its code
        code = getattr(call, "__code__", None)
        if code is None:
            return MergeFnKey(fn)
        bound += _attributes("self", fn)
    return MergeFnKey(
        code, tuple((label, repr(value)) for label, value in bound if _is_plain(value))
    )


def merge_fn_name(merge_fn: Callable[..., Any]) -> str:
    """The merge function's qualified name for reports (a partial's function's)."""
    fn = _unwrap(merge_fn)[0]
    return str(getattr(fn, "__qualname__", type(fn).__qualname__))
