"""What identifies a merge function across replicas: its code and its plain bound values.

``merge_fn`` runs once, for every replica, as replica 0 passed it (TensorFlow's
semantics). Comparing only its code let a value bound into it on each replica (a
``functools.partial`` argument, a bound method's instance attribute, a closure cell, a
default) differ silently: every replica got a result computed with replica 0's value.
The key (:class:`~asyncreplica._core._signature.MergeFnKey`) therefore also holds, as
exact text, every bound value whose equality can be decided exactly and cheaply:

* ``None``, bools, ints, floats, complex numbers, strings and bytes (their own types'
  ``__repr__``, never a subclass's; an int too long for ``str`` in hex), numpy scalars
  (their type and exact value), ``Fraction``, ``Decimal``, enum members, classes, and
  tuples (named or not) of these;
* functions (a closure cell holding a ``functools.partial``, a decorator's or an
  ``lru_cache``'s wrapped function): their code's place, qualified name and body
  checksum (:func:`code_digest`) and, recursively, their own bound values;
* the instance of a bound method or a callable object (also one in a closure cell): its
  type, and each attribute (``__dict__`` and ``__slots__``) that is one of the above;
  a class, with the plain values it holds itself.

Other bound objects (arrays, lists, dicts, a replica's context) are not compared; the
docs say that replica 0's are used. The text is the same in every process, so a process
group can send the key to other processes as it is.
"""

from __future__ import annotations

import contextlib
import decimal
import enum
import fractions
import functools
import types
import zlib
from collections.abc import Callable
from typing import Any

from .._core._signature import MergeFnKey

__all__ = ["code_digest", "merge_fn_key", "merge_fn_name"]

#: How deep values (tuples in tuples, functions in cells) are followed.
_DEPTH = 16
#: Ints with more bits than this are written in hex (``str`` refuses long ones).
_DECIMAL_BITS = 4096

_Bound = list[tuple[str, object]]


def _type_name(cls: type) -> str:
    module = cls.__module__
    return cls.__qualname__ if module == "builtins" else f"{module}.{cls.__qualname__}"


def _int_text(value: int) -> str:
    if value.bit_length() <= _DECIMAL_BITS:
        return int.__repr__(value)
    return f"0x{value:x}" if value >= 0 else f"-0x{-value:x}"


def _wrapped(cls: type, text: str, base: type) -> str:
    """``text`` as is for the base type itself, else in its subclass's name."""
    return text if cls is base else f"{_type_name(cls)}({text})"


def _text(value: object, depth: int = 0, seen: frozenset[int] = frozenset()) -> str | None:
    """An exact text of ``value`` when it can be compared exactly and cheaply, else None."""
    if depth > _DEPTH or id(value) in seen:
        return None
    cls = type(value)
    if value is None or cls is bool:
        return repr(value)
    if isinstance(value, enum.Enum):
        return f"{_type_name(cls)}.{value.name}"
    if isinstance(value, type):
        return _class_text(value, depth, seen)
    if isinstance(value, int):
        return _wrapped(cls, _int_text(value), int)
    if isinstance(value, float):
        return _wrapped(cls, float.__repr__(value), float)
    if isinstance(value, complex):
        return _wrapped(cls, complex.__repr__(value), complex)
    if isinstance(value, str):
        return _wrapped(cls, str.__repr__(value), str)
    if isinstance(value, bytes):
        return _wrapped(cls, bytes.__repr__(value), bytes)
    if isinstance(value, fractions.Fraction):
        text = f"{_int_text(value.numerator)}, {_int_text(value.denominator)}"
        return f"{_type_name(cls)}({text})"
    if isinstance(value, decimal.Decimal):
        return f"{_type_name(cls)}({decimal.Decimal.__str__(value)!r})"
    if cls.__module__ == "numpy" and getattr(value, "shape", None) == ():
        return _numpy_scalar(value)
    if isinstance(value, tuple):
        inner = seen | {id(value)}
        items = [_text(item, depth + 1, inner) for item in value]
        if any(item is None for item in items):
            return None
        body = ", ".join(item for item in items if item is not None)
        return (
            f"({body}{',' if len(items) == 1 else ''})"
            if cls is tuple
            else f"{_type_name(cls)}({body})"
        )
    if callable(value):
        if _is_function_like(value) or hasattr(value, "__wrapped__"):
            return _function_text(value, depth + 1, seen | {id(value)})
        # A callable object (in a closure cell, say): its type and its plain attributes;
        # one with none (a numpy ufunc) is not compared.
        values = _bound_texts(_attributes("self", value), depth + 1, seen | {id(value)})
        if len(values) < 2:
            return None
        return f"{_type_name(cls)} object with {_joined(values)}"
    return None


def _class_text(cls: type, depth: int, seen: frozenset[int]) -> str:
    """A class's name and the plain values it holds itself (a class made per replica)."""
    own = [
        (name, value)
        for name, value in vars(cls).items()
        if not name.startswith("__") and not callable(value) and not isinstance(value, type)
    ]
    values = _bound_texts(sorted(own), depth + 1, seen | {id(cls)})
    text = f"class {_type_name(cls)}"
    return text if not values else f"{text} with {', '.join(f'{k}={v}' for k, v in values)}"


def code_digest(code: Any, depth: int = 0) -> str:
    """A checksum of a code object's body: bytecode and constants, nested code included.

    The same in every process (no address, no ``id``): ``lambda: 1.0`` and
    ``lambda: 2.0`` have one bytecode and differ in their constants.
    """
    parts = [code.co_code.hex(), code.co_qualname]
    for const in code.co_consts:
        if hasattr(const, "co_code") and depth < _DEPTH:
            parts.append(code_digest(const, depth + 1))
        else:
            text = _text(const, _DEPTH) if not isinstance(const, frozenset) else None
            parts.append(text if text is not None else type(const).__name__)
    return f"{zlib.crc32(chr(0).join(parts).encode()):08x}"


def _numpy_scalar(value: Any) -> str | None:
    """A numpy scalar's type and exact value (its Python value, or its bytes)."""
    try:
        item = value.item()
        if type(item) in (bool, int, float, complex):
            return f"{type(value).__name__}({_text(item)})"
        return f"{type(value).__name__}(0x{value.tobytes().hex()})"
    except Exception:  # a numpy scalar that cannot be read: not compared
        return None


def _is_function_like(value: object) -> bool:
    return isinstance(
        value, types.FunctionType | types.MethodType | functools.partial | types.BuiltinFunctionType
    )


def _function_text(fn: object, depth: int, seen: frozenset[int]) -> str | None:
    """A function's place and name, and its plain bound values, recursively."""
    target, bound = _unwrap(fn)
    code = getattr(target, "__code__", None)
    if code is None:
        name = getattr(target, "__qualname__", None)
        module = getattr(target, "__module__", None)
        place = None if name is None else f"{module}.{name}"
        values = _bound_texts(bound, depth, seen)
        if place is None or values:
            return None if place is None else f"{place} with {_joined(values)}"
        return place
    bound += _function_values(target, code)
    values = _bound_texts(bound, depth, seen)
    # The body's checksum tells apart two lambdas on one line.
    place = f"{code.co_qualname} ({code.co_filename}:{code.co_firstlineno} #{code_digest(code)})"
    return place if not values else f"{place} with {_joined(values)}"


def _joined(values: list[tuple[str, str]]) -> str:
    return ", ".join(f"{k}={v}" for k, v in values)


def _attributes(label: str, obj: object) -> _Bound:
    """``obj``'s type and the attributes it holds (``__dict__`` and ``__slots__``)."""
    if not callable(obj) and _text(obj) is not None:  # a plain value (not a callable)
        return [(label, obj)]
    bound: _Bound = [(f"type({label})", type(obj))]
    names: dict[str, None] = {}
    for cls in type(obj).__mro__:
        slots = cls.__dict__.get("__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if name not in ("__dict__", "__weakref__"):
                names[name] = None
    with contextlib.suppress(TypeError):  # no __dict__
        names.update(dict.fromkeys(vars(obj)))
    for name in sorted(names):
        try:
            bound.append((f"{label}.{name}", getattr(obj, name)))
        except Exception:  # an empty slot, a property that raises: not compared
            continue
    return bound


def _unwrap(merge_fn: object) -> tuple[Any, _Bound]:
    """The function whose code identifies ``merge_fn``, and the values bound into it."""
    fn: Any = merge_fn
    bound: _Bound = []
    while isinstance(fn, functools.partial):
        bound += [(f"partial arg {i}", arg) for i, arg in enumerate(fn.args)]
        bound += [(name, fn.keywords[name]) for name in sorted(fn.keywords)]
        fn = fn.func
    if isinstance(fn, types.MethodType):
        bound += _attributes("self", fn.__self__)
        fn = fn.__func__
    # A wrapper that says what it wraps (functools.wraps, lru_cache): the wrapped one.
    for _ in range(_DEPTH):
        wrapped = getattr(fn, "__wrapped__", None) if not hasattr(fn, "__code__") else None
        if wrapped is None or not callable(wrapped):
            break
        fn, more = _unwrap(wrapped)
        bound += more
    return fn, bound


def _function_values(fn: Any, code: Any) -> _Bound:
    """A function's closure cells and defaults, by variable name."""
    bound: _Bound = []
    cells = getattr(fn, "__closure__", None) or ()
    for name, cell in zip(code.co_freevars, cells, strict=False):
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


def _bound_texts(bound: _Bound, depth: int, seen: frozenset[int]) -> list[tuple[str, str]]:
    texts = []
    for label, value in bound:
        try:
            text = _text(value, depth, seen)
        except Exception:  # a value that cannot be read exactly: not compared
            text = None
        if text is not None:
            texts.append((label, text))
    return texts


def merge_fn_key(merge_fn: Callable[..., Any]) -> MergeFnKey:
    """What replicas must agree on: the code, and every plain value bound into it."""
    fn, bound = _unwrap(merge_fn)
    code = getattr(fn, "__code__", None)
    if code is not None:
        bound += _function_values(fn, code)
    else:  # a callable object: its class's __call__, and the object itself
        call = getattr(type(fn), "__call__", None)  # noqa: B004 -- we want its code
        code = getattr(call, "__code__", None)
        if code is None:  # a C callable: itself, with what a partial bound into it
            return MergeFnKey(fn, tuple(_bound_texts(bound, 0, frozenset({id(merge_fn)}))))
        bound += _attributes("self", fn)
    texts = tuple(_bound_texts(bound, 0, frozenset({id(merge_fn)})))
    return MergeFnKey(code, texts, code_digest(code))


def merge_fn_name(merge_fn: Callable[..., Any]) -> str:
    """The merge function's qualified name for reports (a partial's function's)."""
    fn = _unwrap(merge_fn)[0]
    return str(getattr(fn, "__qualname__", type(fn).__qualname__))
