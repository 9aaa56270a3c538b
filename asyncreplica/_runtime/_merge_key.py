"""What identifies a merge function across replicas: its code and its plain bound values.

``merge_fn`` runs once, for every replica, as replica 0 passed it (TensorFlow's
semantics). Comparing only its code let a value bound into it on each replica (a
``functools.partial`` argument, a bound method's instance attribute, a closure cell, a
default) differ silently: every replica got a result computed with replica 0's value.
The key (:class:`~asyncreplica._core._signature.MergeFnKey`) therefore also holds, as
exact text, every bound value whose equality can be decided exactly and cheaply:

* ``None``, bools, ints, floats, complex numbers, strings and bytes (their own types'
  ``__repr__``, never a subclass's; an int too long for ``str`` in hex), numpy scalars
  (their type and exact value), ``Fraction``, ``Decimal``, enum members, and tuples
  (named or not) of these;
* functions (a closure cell holding a ``functools.partial``, a decorator's or an
  ``lru_cache``'s wrapped function, a ``staticmethod``): their code's place, qualified
  name and body checksum (:func:`code_digest`) and, recursively, their own bound values;
* objects that are called (the instance of a bound method, a callable object, also one
  in a closure cell): their type, and each attribute (``__dict__`` and ``__slots__``)
  that is one of the above; ``operator``'s getters by their exact ``repr``;
* classes: their name, and the plain values and functions they hold themselves (a class
  made per replica).

Other bound objects (arrays, lists, dicts, a replica's context) are not compared; the
docs say that replica 0's are used. A value whose text would pass :data:`_BUDGET`
characters (a tuple of a million floats, a deep graph of shared tuples) is not compared
either: building the key must stay cheap. The text is the same in every process, so a
process group can send the key to other processes as it is.

Where every replica passes the very same function or instance (``opt.apply`` of one
shared optimizer), what it holds is not compared: there is nothing of replica 0's to
replace another replica's with, and a shared counter that each replica bumped before
``merge_call`` is not a mismatch (``MergeFnKey.holder``).
"""

from __future__ import annotations

import contextlib
import decimal
import enum
import fractions
import functools
import types
import weakref
import zlib
from collections.abc import Callable
from typing import Any

from .._core._signature import MergeFnKey

__all__ = ["code_digest", "merge_fn_key", "merge_fn_name"]

#: How deep values (tuples in tuples, functions in cells) are followed.
_DEPTH = 16
#: Ints with more bits than this are written in hex (``str`` refuses long ones).
_DECIMAL_BITS = 4096
#: The longest text one bound value may have; a longer one is not compared.
_BUDGET = 1 << 16
#: Code objects whose digest is remembered (bounded, as the runtime's other caches).
_DIGESTS_LIMIT = 4096
_DIGESTS: dict[Any, str] = {}

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


def _joined(values: list[tuple[str, str]]) -> str:
    return ", ".join(f"{k}={v}" for k, v in values)


def _is_function_like(value: object) -> bool:
    return isinstance(
        value,
        types.FunctionType
        | types.MethodType
        | functools.partial
        | types.BuiltinFunctionType
        | staticmethod
        | classmethod,
    )


def code_digest(code: Any, depth: int = 0) -> str:
    """A checksum of a code object's body: bytecode, names and constants, nested code too.

    The same in every process (no address, no ``id``): ``lambda: 1.0`` and
    ``lambda: 2.0`` have one bytecode and differ in their constants, ``lambda: f()`` and
    ``lambda: g()`` in their names.
    """
    found = _DIGESTS.get(code)
    if found is not None:
        return found
    parts = [code.co_code.hex(), code.co_qualname, " ".join(code.co_names)]
    for const in code.co_consts:
        if hasattr(const, "co_code") and depth < _DEPTH:
            parts.append(code_digest(const, depth + 1))
        elif const is None or isinstance(const, bool | int | float | complex | str | bytes):
            parts.append(f"{type(const).__name__}:{const!r}"[:_BUDGET])
        else:
            parts.append(type(const).__name__)
    digest = f"{zlib.crc32(chr(0).join(parts).encode()):08x}"
    if len(_DIGESTS) >= _DIGESTS_LIMIT:
        _DIGESTS.clear()
    _DIGESTS[code] = digest
    return digest


class _Texts:
    """One key's build: each object's text once (shared objects are not walked again)."""

    def __init__(self) -> None:
        self.memo: dict[int, str | None] = {}
        self.keep: list[object] = []  # the memo's objects stay alive (their ids stay theirs)
        self.active: set[int] = set()  # objects being written: a cycle is not compared

    def text(self, value: object, depth: int = 0) -> str | None:
        """An exact text of ``value`` when it can be compared exactly and cheaply, else None."""
        if depth > _DEPTH:
            return None
        key = id(value)
        if key in self.memo:
            return self.memo[key]
        if key in self.active:
            return None
        self.active.add(key)
        try:
            found = self._text(value, depth)
        except Exception:  # a value that cannot be read exactly: not compared
            found = None
        finally:
            self.active.discard(key)
        if found is not None and len(found) > _BUDGET:
            found = None
        self.memo[key] = found
        self.keep.append(value)
        return found

    def _text(self, value: object, depth: int) -> str | None:
        cls = type(value)
        if value is None or cls is bool:
            return repr(value)
        if isinstance(value, enum.Enum):
            return f"{_type_name(cls)}.{value.name}"
        if isinstance(value, type):
            return self._class(value, depth)
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
            return self._numpy_scalar(value)
        if isinstance(value, tuple):
            if len(value) > _BUDGET // 4:
                return None
            items: list[str] = []
            for item in value:
                found = self.text(item, depth + 1)
                if found is None:
                    return None
                items.append(found)
            body = ", ".join(items)
            if cls is tuple:
                return f"({body}{',' if len(items) == 1 else ''})"
            return f"{_type_name(cls)}({body})"
        if callable(value):
            if _is_function_like(value) or hasattr(value, "__wrapped__"):
                return self.function(value, depth + 1)
            if cls.__module__ == "operator":  # itemgetter(0): its repr is its value
                return repr(value)
            # An object that is called: its type and its plain attributes.
            return self._object(value, depth + 1)
        return None

    def _numpy_scalar(self, value: Any) -> str | None:
        """A numpy scalar's type and exact value (its Python value, or its bytes)."""
        item = value.item()
        if type(item) in (bool, int, float, complex):
            return f"{type(value).__name__}({self.text(item)})"
        return f"{type(value).__name__}(0x{value.tobytes().hex()})"

    def _class(self, cls: type, depth: int) -> str:
        """A class's name and what it and its bases hold: plain values and functions."""
        own = [
            (f"{base.__qualname__}.{name}", value)
            for base in cls.__mro__
            if base.__module__ != "builtins"
            for name, value in vars(base).items()
            if not (name.startswith("__") and name.endswith("__"))
        ]
        values = self.texts(sorted(own, key=lambda item: item[0]), depth + 1)
        text = f"class {_type_name(cls)}"
        return text if not values else f"{text} with {_joined(values)}"

    def _object(self, obj: object, depth: int) -> str:
        values = self.texts(attributes("self", obj), depth)
        return f"{_type_name(type(obj))} object" + (f" with {_joined(values)}" if values else "")

    def function(self, fn: object, depth: int) -> str | None:
        """A function's place, name and body, and its plain bound values, recursively."""
        target, bound = unwrap(fn)
        code = getattr(target, "__code__", None)
        if code is None:
            name = getattr(target, "__qualname__", None)
            if name is None:
                return None
            place = f"{getattr(target, '__module__', None)}.{name}"
            owner = getattr(target, "__self__", None)
            if owner is not None and not isinstance(owner, types.ModuleType):
                bound.append(("self", owner))  # a builtin method: what it is bound to
        else:
            bound += function_values(target, code)
            place = f"{code.co_qualname} ({code.co_filename}:{code.co_firstlineno}"
            place += f" #{code_digest(code)})"
        values = self.texts(bound, depth)
        return place if not values else f"{place} with {_joined(values)}"

    def texts(self, bound: _Bound, depth: int) -> list[tuple[str, str]]:
        out = []
        for label, value in bound:
            text = self.text(value, depth)
            if text is not None:
                out.append((label, text))
        return out


def attributes(label: str, obj: object) -> _Bound:
    """``obj`` itself when it is a plain value, else its type and attributes.

    Its attributes: those its ``__dict__`` and ``__slots__`` hold.
    """
    if not callable(obj) and _Texts().text(obj) is not None:
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


def unwrap(merge_fn: object) -> tuple[Any, _Bound]:
    """The function whose code identifies ``merge_fn``, and the values bound into it."""
    fn: Any = merge_fn
    bound: _Bound = []
    while isinstance(fn, functools.partial):
        bound += [(f"partial arg {i}", arg) for i, arg in enumerate(fn.args)]
        bound += [(name, fn.keywords[name]) for name in sorted(fn.keywords)]
        fn = fn.func
    if isinstance(fn, types.MethodType):
        bound += attributes("self", fn.__self__)
        fn = fn.__func__
    # A wrapper that says what it wraps (lru_cache, staticmethod): the wrapped one.
    for _ in range(_DEPTH):
        wrapped = getattr(fn, "__wrapped__", None) if not hasattr(fn, "__code__") else None
        if wrapped is None or not callable(wrapped):
            break
        fn, more = unwrap(wrapped)
        bound += more
    return fn, bound


def function_values(fn: Any, code: Any) -> _Bound:
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


def _holders(merge_fn: object) -> tuple[Callable[[], object], ...] | None:
    """Weak references to what holds the values a merge function reads, or None.

    Past any ``functools.partial`` (whose own values are always compared): a bound
    method's instance and function (``MethodType(f, shared)`` of another ``f`` per
    replica is no shared holder), or the function or callable object itself.
    """
    fn: Any = merge_fn
    while isinstance(fn, functools.partial):
        fn = fn.func
    objects = (fn.__self__, fn.__func__) if isinstance(fn, types.MethodType) else (fn,)
    try:
        return tuple(weakref.ref(obj) for obj in objects)
    except TypeError:  # an object that takes no weak reference: no identity rule
        return None


def merge_fn_key(merge_fn: Callable[..., Any]) -> MergeFnKey:
    """What replicas must agree on: the code, and every plain value bound into it."""
    builder = _Texts()
    fn, bound = unwrap(merge_fn)
    # A partial's own values are compared even for one shared instance (they differ).
    partial = 0
    inner: Any = merge_fn
    while isinstance(inner, functools.partial):
        partial += len(inner.args) + len(inner.keywords)
        inner = inner.func
    code = getattr(fn, "__code__", None)
    digest = ""
    if code is not None:
        bound += function_values(fn, code)
        digest = code_digest(code)
    else:  # a callable object: its class's __call__, and the object itself
        call = getattr(type(fn), "__call__", None)  # noqa: B004 -- we want its code
        code = getattr(call, "__code__", None)
        if code is None:  # a C callable: itself, with what a partial bound into it
            code = fn
        else:
            bound += attributes("self", fn)
            bound += function_values(call, code)  # __call__'s closure and defaults
            digest = code_digest(code)
    builder.active.add(id(merge_fn))
    passed = tuple(builder.texts(bound[:partial], 0))
    held = tuple(builder.texts(bound[partial:], 0))
    return MergeFnKey(code, passed + held, digest, _holders(merge_fn), len(passed))


def merge_fn_name(merge_fn: Callable[..., Any]) -> str:
    """The merge function's qualified name for reports (a partial's function's)."""
    fn = unwrap(merge_fn)[0]
    return str(getattr(fn, "__qualname__", type(fn).__qualname__))
